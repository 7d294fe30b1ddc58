//! The policy part of a pass's input: what the replicated state knows about
//! accounts, QoS, partitions, weights and usage, and the running jobs that
//! quotas count and preemption may pick from.

use std::collections::BTreeMap;

use compact_str::CompactString;
use serde::{Deserialize, Serialize};

use crate::model::{Allocation, JobId, Millis, Policy, UsageCell};

/// Policy, usage and running jobs, as a pass sees them.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PolicyView {
    /// The state's own, shared: a pass copies none of it.
    pub policy: std::sync::Arc<Policy>,
    /// Decayed usage per account, then per user.
    #[serde(default)]
    pub usage: BTreeMap<String, BTreeMap<String, UsageCell>>,
    /// Jobs holding resources (RUNNING or COMPLETING).
    #[serde(default)]
    pub running: Vec<ActiveJob>,
}

impl Default for PolicyView {
    /// No accounts or limits and all weights zero: plain FIFO.
    fn default() -> Self {
        PolicyView {
            policy: std::sync::Arc::new(Policy::fifo()),
            usage: BTreeMap::new(),
            running: Vec::new(),
        }
    }
}

/// A job that holds resources now, as priority, quotas and preemption see it
/// (backfill's timeline has its own [`super::RunningJob`]).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ActiveJob {
    pub id: JobId,
    pub user: CompactString,
    /// Resolved at submit; empty: the built-ins.
    pub account: CompactString,
    pub qos: CompactString,
    pub gpus: u64,
    pub start_time: Millis,
    pub allocation: std::sync::Arc<Allocation>,
    /// COMPLETING: its ranks are stopping; it is no candidate for preemption.
    pub completing: bool,
    /// It is stopping because it was preempted for this job.
    #[serde(default)]
    pub preempted_for: Option<JobId>,
    /// An elastic job's range and shape (`--nodes MIN-MAX`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub elastic: Option<Box<ElasticRun>>,
}

/// A running elastic job as a pass sees it (on its [`ActiveJob`]).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ElasticRun {
    /// Its spec's shape and placement, at MIN nodes.
    pub shape: super::view::PendingJob,
    pub range: crate::model::NodeRange,
    /// When its time limit ends; `None`: unlimited.
    pub end: Option<Millis>,
    /// When it started at its current size (its start, or its last
    /// resize).
    #[serde(default)]
    pub since: Millis,
    /// A size change under way: the nodes it keeps (the rest of its
    /// allocation is freed once its ranks have stopped).
    #[serde(default)]
    pub resizing_to: Option<std::sync::Arc<Allocation>>,
}

/// The account name a job is charged to (empty: the built-in).
pub(super) fn account_of(name: &str) -> &str {
    if name.is_empty() {
        crate::model::policy::DEFAULT_ACCOUNT
    } else {
        name
    }
}

/// The QoS name of a job (empty: the built-in).
pub(super) fn qos_of(name: &str) -> &str {
    if name.is_empty() {
        crate::model::policy::DEFAULT_QOS
    } else {
        name
    }
}
