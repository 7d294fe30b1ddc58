//! The agent's `[agent.health_check]` table: the command that decides whether
//! a node is healthy, and how often and how long it may run. Running it is
//! `agent::health`'s job.

use serde::{Deserialize, Serialize};

/// `[agent.health_check]`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct HealthCheck {
    /// Run with `/bin/sh -c`; exit 0 means healthy.
    pub command: String,
    pub interval_secs: u64,
    pub timeout_secs: u64,
}

impl Default for HealthCheck {
    fn default() -> Self {
        HealthCheck {
            command: String::new(),
            interval_secs: 60,
            timeout_secs: 30,
        }
    }
}
