//! How a running job uses its GPUs, as its agents sample them: what `gpuq
//! show` reports and the idle flag is decided on. Leader memory, never
//! replicated: it is filled into a job when the leader answers.

use serde::{Deserialize, Serialize};

/// A job's use of its GPUs on one node, or (merged) on all of them, since
/// the agent first saw it there.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuUse {
    /// Samples taken (one per GPU per sampling period).
    pub samples: u64,
    /// Mean utilisation over those samples, percent.
    pub mean_util_pct: u32,
    /// Mean share of GPU memory in use, percent.
    pub mean_memory_pct: u32,
    /// Seconds since any of its GPUs was last busy (over 5%), or since it
    /// was first sampled when never.
    pub idle_secs: u64,
    /// Idle longer than the servers' `idle_gpu_secs` (set by the leader).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub idle: bool,
}

impl GpuUse {
    /// The use over several nodes: means weighted by samples, the shortest
    /// idle time (one busy node means the job is not idle).
    pub fn merge(parts: impl IntoIterator<Item = GpuUse>) -> Option<GpuUse> {
        let mut out: Option<GpuUse> = None;
        let (mut util, mut mem) = (0u64, 0u64);
        for p in parts {
            util += u64::from(p.mean_util_pct) * p.samples;
            mem += u64::from(p.mean_memory_pct) * p.samples;
            let o = out.get_or_insert(GpuUse {
                idle_secs: p.idle_secs,
                ..Default::default()
            });
            o.samples += p.samples;
            o.idle_secs = o.idle_secs.min(p.idle_secs);
        }
        let mut o = out?;
        o.mean_util_pct = util.checked_div(o.samples).unwrap_or(0) as u32;
        o.mean_memory_pct = mem.checked_div(o.samples).unwrap_or(0) as u32;
        Some(o)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn merging_weights_by_samples_and_keeps_the_shortest_idle() {
        let a = GpuUse {
            samples: 3,
            mean_util_pct: 90,
            mean_memory_pct: 50,
            idle_secs: 0,
            idle: false,
        };
        let b = GpuUse {
            samples: 1,
            mean_util_pct: 10,
            mean_memory_pct: 10,
            idle_secs: 40,
            idle: false,
        };
        let m = GpuUse::merge([a, b]).unwrap();
        assert_eq!(
            (m.samples, m.mean_util_pct, m.mean_memory_pct, m.idle_secs),
            (4, 70, 40, 0)
        );
        assert_eq!(GpuUse::merge([]), None);
    }
}
