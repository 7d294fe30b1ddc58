//! What a replay is judged under: the scheduler's policy as the replicated
//! state holds it (priority weights, accounts, QoS, partitions), backfill's
//! knobs, packing, and the replay's own assumptions (how far users over-ask
//! their time limits, how often the leader's periodic pass runs).
//!
//! `--policy NAME|FILE`: a built-in by name ([`BUILT_IN`]) or a TOML file:
//!
//! ```toml
//! name = "deep-backfill"        # optional: the file's stem otherwise
//! base = "multifactor"          # optional: the built-in it starts from
//! packing = "best-fit"          # or "first-fit"
//! limit_factor = 1.0            # time limit = duration x this (trace limits win)
//! tick_secs = 60                # the periodic pass, virtual seconds
//! [backfill]                    # sched::BackfillConfig, keys as named there
//! depth = 10
//! [policy]                      # model::Policy: weights, accounts, qos, partitions
//! weights = { age = 1000, fairshare = 0, job_size = 0, qos = 0, partition = 0, max_age_secs = 604800 }
//! ```

use std::path::Path;

use serde::Deserialize;

use crate::model::{Policy, PriorityWeights};
use crate::sched::{BackfillConfig, BackfillOrder, Packing};

/// Built-in policies `--policy` takes by name.
pub const BUILT_IN: &[&str] = &["multifactor", "fifo", "slurm-like"];

/// A replay's policy: the scheduler's and the replay's assumptions.
#[derive(Clone, Debug, PartialEq)]
pub struct ReplayPolicy {
    pub name: String,
    pub policy: Policy,
    pub backfill: BackfillConfig,
    pub packing: Packing,
    /// A job's time limit is its duration times this, rounded up to a
    /// second, when the trace gives none (users over-ask; 1.0: exact).
    pub limit_factor: f64,
    /// The leader's periodic pass, virtual ms (passes on state changes
    /// run at once, as the leader's do).
    pub tick_ms: u64,
}

/// Why a policy could not be used.
#[derive(Debug, thiserror::Error)]
pub enum PolicyError {
    #[error(
        "no built-in policy is called {0:?} and no such file exists: name one of {built_in} \
         or a TOML policy file",
        built_in = BUILT_IN.join(", ")
    )]
    Unknown(String),
    #[error("cannot read the policy file {path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
    #[error("the policy file {path} is not valid: {reason}")]
    Bad { path: String, reason: String },
}

impl ReplayPolicy {
    /// The built-in called `name`, if there is one.
    pub fn built_in(name: &str) -> Option<ReplayPolicy> {
        let base = ReplayPolicy {
            name: name.to_string(),
            policy: Policy::default(),
            // The server's backfill, less the expected starts nobody reads.
            backfill: BackfillConfig {
                estimates: 0,
                ..BackfillConfig::default()
            },
            packing: Packing::BestFit,
            limit_factor: 1.0,
            tick_ms: 60_000,
        };
        // Submit order (every weight zero; ties go to the older job):
        // Slurm's priority/basic.
        let fifo = Policy {
            weights: PriorityWeights {
                age: 0,
                fairshare: 0,
                job_size: 0,
                qos: 0,
                partition: 0,
                ..PriorityWeights::default()
            },
            ..Policy::default()
        };
        match name {
            // What a server runs when an admin has set nothing.
            "multifactor" => Some(base),
            // Submit order with the server's backfill.
            "fifo" => Some(ReplayPolicy {
                policy: fifo,
                ..base
            }),
            // Submit order with backfill as Slurm's: every blocked job it
            // looks at gets a reservation (ten here; fifty moved the ITP
            // study's mean wait by 2%), and the rest are tried in priority
            // order. The scheduler made to behave as Slurm's, for
            // comparisons: not Slurm.
            "slurm-like" => Some(ReplayPolicy {
                policy: fifo,
                backfill: BackfillConfig {
                    depth: 10,
                    order: BackfillOrder::Priority,
                    ..base.backfill
                },
                ..base
            }),
            _ => None,
        }
    }

    /// `--policy ARG`: a built-in's name or a TOML file's path.
    pub fn load(arg: &str) -> Result<ReplayPolicy, PolicyError> {
        let path = Path::new(arg);
        if !path.exists() {
            return ReplayPolicy::built_in(arg).ok_or_else(|| PolicyError::Unknown(arg.into()));
        }
        let shown = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|source| PolicyError::Io {
            path: shown.clone(),
            source,
        })?;
        let stem = path
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_else(|| "policy".into());
        ReplayPolicy::from_toml(&text, &stem).map_err(|reason| PolicyError::Bad {
            path: shown,
            reason,
        })
    }

    /// A policy from a TOML file's text; `stem` names it unless it says.
    pub fn from_toml(text: &str, stem: &str) -> Result<ReplayPolicy, String> {
        let file: PolicyFile = toml::from_str(text).map_err(|e| e.to_string())?;
        let base_name = file.base.as_deref().unwrap_or("multifactor");
        let mut p = ReplayPolicy::built_in(base_name).ok_or_else(|| {
            format!(
                "base = {base_name:?} is not a built-in policy: use one of {}",
                BUILT_IN.join(", ")
            )
        })?;
        p.name = file.name.unwrap_or_else(|| stem.to_string());
        if let Some(policy) = file.policy {
            p.policy = policy;
        }
        if let Some(over) = file.backfill {
            // Keys the file names replace the base's; the rest stay.
            let mut table = toml::Table::try_from(p.backfill).map_err(|e| e.to_string())?;
            table.extend(over);
            p.backfill = table.try_into().map_err(|e| format!("[backfill]: {e}"))?;
        }
        match file.packing.as_deref() {
            None | Some("best-fit") => {}
            Some("first-fit") => p.packing = Packing::FirstFit,
            Some(other) => {
                return Err(format!(
                    "packing = {other:?}: use \"best-fit\" or \"first-fit\""
                ))
            }
        }
        if let Some(f) = file.limit_factor {
            if !(f.is_finite() && f >= 1.0) {
                return Err(format!(
                    "limit_factor = {f}: a time limit cannot be shorter than the job; use 1.0 or more"
                ));
            }
            p.limit_factor = f;
        }
        if let Some(t) = file.tick_secs {
            if t == 0 {
                return Err(
                    "tick_secs = 0: the periodic pass needs a period of 1 second or more".into(),
                );
            }
            p.tick_ms = t.saturating_mul(1000);
        }
        Ok(p)
    }

    /// The time limit of a job that runs `duration` ms, in seconds.
    pub fn limit_secs(&self, duration: u64) -> u64 {
        let secs = (duration as f64 * self.limit_factor / 1000.0).ceil();
        (secs as u64).max(1)
    }
}

/// The TOML form of a policy file.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PolicyFile {
    name: Option<String>,
    base: Option<String>,
    packing: Option<String>,
    limit_factor: Option<f64>,
    tick_secs: Option<u64>,
    backfill: Option<toml::Table>,
    policy: Option<Policy>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn built_ins_differ_only_in_weights() {
        let m = ReplayPolicy::built_in("multifactor").unwrap();
        let f = ReplayPolicy::built_in("fifo").unwrap();
        assert_eq!(f.policy.weights.fairshare, 0);
        assert_ne!(m.policy.weights, f.policy.weights);
        assert_eq!(m.backfill, f.backfill);
        let s = ReplayPolicy::built_in("slurm-like").unwrap();
        assert_eq!(s.policy.weights, f.policy.weights);
        assert_eq!(
            (s.backfill.depth, s.backfill.order),
            (10, BackfillOrder::Priority)
        );
        assert!(ReplayPolicy::built_in("nope").is_none());
    }

    #[test]
    fn a_backfill_table_changes_only_the_keys_it_names() {
        let p = ReplayPolicy::from_toml("base = \"slurm-like\"\n[backfill]\ndepth = 50\n", "x")
            .unwrap();
        assert_eq!(
            (p.backfill.depth, p.backfill.order),
            (50, BackfillOrder::Priority)
        );
        let e = ReplayPolicy::from_toml("[backfill]\ndepht = 2\n", "x").unwrap_err();
        assert!(e.contains("depht"), "{e}");
    }

    #[test]
    fn a_file_overrides_its_base() {
        let p = ReplayPolicy::from_toml(
            "base = \"fifo\"\nlimit_factor = 2.0\ntick_secs = 5\n[backfill]\ndepth = 50\n",
            "deep",
        )
        .unwrap();
        assert_eq!(p.name, "deep");
        assert_eq!(p.backfill.depth, 50);
        assert_eq!(
            p.backfill.max_job_test,
            BackfillConfig::default().max_job_test
        );
        assert_eq!(p.policy.weights.fairshare, 0);
        assert_eq!(p.tick_ms, 5000);
        assert_eq!(p.limit_secs(1500), 3);
    }

    #[test]
    fn bad_files_say_what_to_change() {
        for (text, says) in [
            ("colour = 1", "colour"),
            ("base = \"lifo\"", "lifo"),
            ("packing = \"worst\"", "first-fit"),
            ("limit_factor = 0.5", "1.0 or more"),
            ("tick_secs = 0", "1 second"),
        ] {
            let e = ReplayPolicy::from_toml(text, "x").unwrap_err();
            assert!(e.contains(says), "{text}: {e}");
        }
        let e = ReplayPolicy::load("no-such-policy")
            .unwrap_err()
            .to_string();
        assert!(e.contains("multifactor, fifo"), "{e}");
    }
}
