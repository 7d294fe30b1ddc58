//! What `gpuq service list|show|endpoints` answers.

use serde::{Deserialize, Serialize};

use crate::model::{JobId, JobState, Millis};

/// A service as `gpuq service list|show` shows it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServiceInfo {
    pub name: String,
    pub user: String,
    /// Replicas wanted.
    pub replicas: u32,
    pub restart_delay_secs: u64,
    pub created: Millis,
    /// GPUs each replica holds.
    pub gpus_per_replica: u64,
    /// What each replica runs, as `gpuq show` prints a job's program.
    pub command: String,
    /// Each replica index, wanted or still stopping.
    pub slots: Vec<ReplicaInfo>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub health: Option<crate::model::HealthCheck>,
    /// The version new replicas run, and how its roll-out stands.
    #[serde(default)]
    pub version: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub roll: Option<String>,
    /// Its named ports (`--port NAME`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ports: Vec<String>,
}

/// One replica of a service.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReplicaInfo {
    pub index: u32,
    /// Its current job, and that job's state.
    pub job: Option<JobId>,
    pub state: Option<JobState>,
    /// Where it runs: its node, and `host:PORT` its clients reach it at.
    pub node: Option<String>,
    pub endpoint: Option<String>,
    /// Its health check's verdict (`None`: no check, or none made yet).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub healthy: Option<bool>,
    /// Jobs the index had after its first, and the current job's reason
    /// (why it waits, or why it was restarted).
    pub restarts: u32,
    pub reason: Option<String>,
    /// The service version its job runs, and a rolling update's new job
    /// starting beside it.
    #[serde(default)]
    pub version: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next: Option<JobId>,
    /// Its named ports' `host:port`, by name, while it is an endpoint.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub ports: std::collections::BTreeMap<String, String>,
}
