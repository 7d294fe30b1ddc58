//! Elastic jobs (`--nodes MIN-MAX`): a gang that starts on as many nodes
//! of its range as are free, grows toward MAX into nodes nobody waits for,
//! and gives nodes back down to MIN instead of being preempted whole.
//!
//! A size change is an in-place restart, as torchrun's elastic agent does
//! on a membership change: every rank of the attempt is stopped, then the
//! next attempt starts on the new node set with the new world size, the
//! job RUNNING throughout and never requeued. While its ranks stop the run
//! holds both sets of nodes (`JobRun::allocation` is their union), so
//! nothing else is placed where they still run.

use std::fmt;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::{Allocation, JobId, Millis};

/// How many nodes an elastic job may run on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct NodeRange {
    pub min: u32,
    pub max: u32,
}

impl NodeRange {
    /// `2-4` (gpuq, Slurm) or `2:4` (torchrun's `--nnodes`); a single
    /// number is no range (`None` inside `Ok`).
    pub fn parse(text: &str) -> Result<Option<NodeRange>, String> {
        let t = text.trim();
        let Some((lo, hi)) = t.split_once(['-', ':']) else {
            return Ok(None);
        };
        let num = |s: &str| {
            s.trim().parse::<u32>().map_err(|_| {
                format!("--nodes {text}: expected a node count or a range MIN-MAX such as 2-4")
            })
        };
        let (min, max) = (num(lo)?, num(hi)?);
        if min == 0 {
            return Err(format!(
                "--nodes {text}: an elastic job needs at least 1 node (e.g. 1-{max})"
            ));
        }
        if min > max {
            return Err(format!(
                "--nodes {text}: the minimum {min} is more than the maximum {max}; write MIN-MAX, \
                 e.g. {max}-{min}"
            ));
        }
        Ok(Some(NodeRange { min, max }))
    }

    /// Exactly `n` nodes (`--nodes N`).
    pub fn fixed(n: u32) -> NodeRange {
        NodeRange { min: n, max: n }
    }

    /// Whether `n` nodes lie in the range.
    pub fn holds(&self, n: u32) -> bool {
        (self.min..=self.max).contains(&n)
    }
}

impl fmt::Display for NodeRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}-{}", self.min, self.max)
    }
}

/// A size change under way: the ranks of the attempt are stopping, and the
/// next attempt starts on `to` once they all have.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Resize {
    /// The next attempt's nodes, in rank order (the kept ones first, at
    /// their ranks).
    pub to: Arc<Allocation>,
    /// The job it shrinks for (a preemptor that takes the nodes given back).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub for_job: Option<JobId>,
    pub why: String,
}

/// One size change of an elastic job, for `gpuq show` and accounting.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ResizeRecord {
    /// When the new size started running.
    pub at: Millis,
    /// The attempt that started with it.
    pub attempt: u32,
    pub from_nodes: u32,
    pub to_nodes: u32,
    pub from_gpus: u64,
    pub to_gpus: u64,
    pub why: String,
}

/// GPU-milliseconds of a run from `start` to `end` that held `gpus` at the
/// end, changing size at each of `resizes` (oldest first; those before
/// `start` belong to an earlier run and are skipped).
pub fn gpu_ms(start: Millis, end: Millis, gpus: u64, resizes: &[ResizeRecord]) -> u128 {
    let mut total = 0u128;
    let mut from = start;
    for r in resizes.iter().filter(|r| r.at >= start && r.at <= end) {
        total += u128::from(r.from_gpus) * u128::from(r.at.saturating_sub(from));
        from = r.at;
    }
    total + u128::from(gpus) * u128::from(end.saturating_sub(from))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_parse_in_both_spellings_and_bad_ones_name_the_fix() {
        assert_eq!(NodeRange::parse("4").unwrap(), None);
        let r = NodeRange { min: 2, max: 4 };
        assert_eq!(NodeRange::parse("2-4").unwrap(), Some(r));
        assert_eq!(NodeRange::parse("2:4").unwrap(), Some(r));
        assert_eq!(r.to_string(), "2-4");
        assert!(r.holds(3) && !r.holds(5) && !r.holds(1));
        let e = NodeRange::parse("4-2").unwrap_err();
        assert!(
            e.contains("more than the maximum") && e.contains("2-4"),
            "{e}"
        );
        assert!(NodeRange::parse("0-3").unwrap_err().contains("at least 1"));
        assert!(NodeRange::parse("a-3").unwrap_err().contains("MIN-MAX"));
    }

    #[test]
    fn gpu_time_adds_each_size_over_its_span() {
        let rec = |at, from_gpus, to_gpus| ResizeRecord {
            at,
            attempt: 1,
            from_nodes: 0,
            to_nodes: 0,
            from_gpus,
            to_gpus,
            why: String::new(),
        };
        // 16 GPUs for 10 s, 32 for 5 s, 16 for the last 5 s.
        let resizes = [rec(10_000, 16, 32), rec(15_000, 32, 16)];
        assert_eq!(
            gpu_ms(0, 20_000, 16, &resizes),
            16 * 10_000 + 32 * 5_000 + 16 * 5_000
        );
        // A resize of an earlier run is not this run's.
        assert_eq!(
            gpu_ms(12_000, 20_000, 16, &resizes),
            32 * 3_000 + 16 * 5_000
        );
    }
}
