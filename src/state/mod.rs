//! The replicated state machine. `Command` is the Raft log entry type and
//! `State::apply` is the deterministic function every server runs over the log:
//! no clock reads (the leader stamps `now` into each command), no randomness, no
//! I/O. Apply reports which records it touched (`Dirty`) so `store` can persist
//! exactly those in the same redb transaction that records the applied index.

mod apply;
mod autoscale;
pub mod codec;
mod command;
mod deps;
mod elastic;
mod fairshare;
pub mod history;
mod index;
pub mod mig;
mod nodes;
mod policy;
mod power;
mod preempt;
mod queue;
mod requeue;
mod reservations;
mod runs;
mod service_roll;
mod services;
mod share;
mod steps;
pub mod store;
mod store_error;
mod update;
mod view;

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

pub use crate::model::policy_change::{
    AccountPatch, Limit, Op, PartitionPatch, PolicyChange, PriorityPatch, QosPatch,
};
pub use autoscale::{power_decisions, PowerDecisions};
pub use command::{Command, CommandResult, Rejection};
pub use deps::DepStatus;
pub use index::ActiveIndex;
pub use runs::host_of;
pub use steps::past_inactive_limit;
pub use update::past_limit_unwatched;
pub use view::SchedInput;

use crate::model::{
    ApiTokenRecord, Job, JobId, JobState, Millis, NodeInventory, PortRange, TokenRecord,
};

/// The cluster's identity, created once by `Command::InitCluster`. The CA key
/// lives here so any server can sign certificates for joining daemons; agents
/// never see it (only servers hold the replicated state).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClusterRecord {
    pub name: String,
    pub ca_cert_pem: String,
    pub ca_key_pem: String,
    pub created_at: Millis,
    /// Where MASTER_PORT is chosen from (`server.master_port_range` of the
    /// server that created the cluster). A cluster setting, not each
    /// server's: apply picks ports, and every server must pick the same.
    #[serde(default)]
    pub master_ports: PortRange,
}

/// Counters from which apply assigns ids.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Counters {
    /// The id the next submitted job gets.
    pub next_job_id: u64,
}

impl Default for Counters {
    fn default() -> Self {
        Counters { next_job_id: 1 }
    }
}

/// Whether a node takes work.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum NodeStatus {
    Up,
    /// Finishes its work, takes no new work.
    Drained {
        reason: String,
        #[serde(default)]
        by: DrainSource,
        /// The admin who drained it (`by: Admin`; none for older records).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        user: Option<String>,
        /// When it was drained (0: before this was kept).
        #[serde(default, skip_serializing_if = "is_zero")]
        since: Millis,
    },
    /// Not heard from; its tasks are lost.
    Down {
        reason: String,
        /// When it went down (0: before this was kept).
        #[serde(default, skip_serializing_if = "is_zero")]
        since: Millis,
    },
}

fn is_zero(ms: &Millis) -> bool {
    *ms == 0
}

impl NodeStatus {
    /// Why it takes no work, who said so (an admin's name) and since when
    /// (0: unknown); `None` while up.
    pub fn reason(&self) -> Option<(&str, Option<&str>, Millis)> {
        match self {
            NodeStatus::Up => None,
            NodeStatus::Drained {
                reason,
                user,
                since,
                ..
            } => Some((reason, user.as_deref(), *since)),
            NodeStatus::Down { reason, since } => Some((reason, None, *since)),
        }
    }

    pub fn word(&self) -> &'static str {
        match self {
            NodeStatus::Up => "up",
            NodeStatus::Drained { .. } => "drained",
            NodeStatus::Down { .. } => "down",
        }
    }
}

/// Who drained a node: a health check may undo only its own drain.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DrainSource {
    #[default]
    Admin,
    HealthCheck,
    Gpu,
    /// A MIG repartition (`gpuq node mig set`; see `mig`).
    Mig,
    /// Its node group suspended it (lifted when it registers again).
    Power,
}

/// A compute node as the cluster records it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeRecord {
    pub inventory: NodeInventory,
    /// The agent's address (MASTER_ADDR for ranks there, log serving).
    pub addr: String,
    pub status: NodeStatus,
    pub registered_at: Millis,
    /// SHA-256 of the certificate the node's agent registered with: another
    /// certificate for the same name is refused unless an admin allowed a
    /// replacement (`gpuq node replace`). Empty for nodes registered before
    /// this was kept (the next registration records it).
    #[serde(default)]
    pub cert_sha256: String,
    /// An admin allowed a new machine to take this name (`gpuq node
    /// replace`): the next join for the name is admitted, and the next
    /// registration records its certificate.
    #[serde(default)]
    pub replace_allowed: bool,
    /// The MIG layout an admin asked for and the node does not have yet
    /// (`gpuq node mig set`; see `mig`); the node stays drained meanwhile.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mig_target: Option<String>,
    /// The slots an admin shares each whole GPU of the node into (`gpuq
    /// node share`; see `share`): the inventory holds the slots, and every
    /// report of the node's GPUs is shared the same way.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_shared: Option<u8>,
}

/// The whole replicated state, held in memory and persisted by `store`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct State {
    pub cluster: Option<ClusterRecord>,
    pub counters: Counters,
    pub jobs: BTreeMap<JobId, Job>,
    pub tokens: BTreeMap<String, TokenRecord>,
    #[serde(default)]
    pub nodes: BTreeMap<String, NodeRecord>,
    /// Jobs an `Archive` moved out of `jobs` that the store has not yet
    /// written to the history tables (emptied once it has; see `history`).
    #[serde(skip)]
    pub archiving: Vec<Job>,
    /// Indexes over the active jobs, kept in step by apply (see `index`).
    #[serde(skip)]
    pub index: ActiveIndex,
    /// Accounts, QoS, partitions and priority weights (`gpuq admin`).
    /// Shared with the passes' views (copied on write by a policy change).
    #[serde(default)]
    pub policy: std::sync::Arc<crate::model::Policy>,
    /// Fair-share usage by account, then user.
    #[serde(default)]
    pub usage: BTreeMap<String, BTreeMap<String, crate::model::UsageCell>>,
    /// Bearer tokens of the HTTP API, by id (kept with `meta`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub api_tokens: BTreeMap<String, ApiTokenRecord>,
    /// Services by name (`gpuq service`; kept with `meta`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub services: BTreeMap<String, crate::model::Service>,
    /// Power states of node groups' nodes (`state::power`; kept with `meta`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub power: BTreeMap<String, crate::model::PowerRecord>,
}

/// The records one or more applies touched, for `store::write_dirty`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Dirty {
    pub meta: bool,
    pub jobs: BTreeSet<JobId>,
    pub tokens: BTreeSet<String>,
    pub nodes: BTreeSet<String>,
    /// `State::archiving` holds jobs to write to the history tables.
    pub archived: bool,
}

impl Dirty {
    /// Adds what `other` touched.
    pub fn merge(&mut self, other: Dirty) {
        self.meta |= other.meta;
        self.archived |= other.archived;
        if self.jobs.is_empty() {
            self.jobs = other.jobs;
        } else {
            self.jobs.extend(other.jobs);
        }
        self.tokens.extend(other.tokens);
        self.nodes.extend(other.nodes);
    }

    pub fn is_empty(&self) -> bool {
        !self.meta
            && !self.archived
            && self.jobs.is_empty()
            && self.tokens.is_empty()
            && self.nodes.is_empty()
    }
}

impl State {
    /// Looks a job up by id.
    pub fn job(&self, id: JobId) -> Option<&Job> {
        self.jobs.get(&id)
    }

    /// Jobs that are not in a final state, in id order.
    pub fn active_jobs(&self) -> impl Iterator<Item = &Job> {
        self.jobs.values().filter(|j| !j.state.is_final())
    }

    /// The RUNNING or COMPLETING jobs with ranks on `node`.
    pub fn jobs_on<'a>(&'a self, node: &str) -> impl Iterator<Item = &'a Job> + 'a {
        let ids: Vec<JobId> = self.index.jobs_on(node).collect();
        ids.into_iter().filter_map(|id| self.jobs.get(&id))
    }

    /// Whether some job is PENDING.
    pub fn has_pending(&self) -> bool {
        !self.index.pending.is_empty()
    }

    /// Whether a pass has work: a job is PENDING, or a running elastic job
    /// could grow.
    pub fn has_work(&self) -> bool {
        self.has_pending()
            || self.index.holding().any(|id| {
                self.jobs.get(&id).is_some_and(|j| {
                    let run = j.run.as_ref();
                    j.state == JobState::Running
                        && run.is_some_and(|r| r.resize.is_none() && r.preempted_for.is_none())
                        && j.spec
                            .placement
                            .elastic
                            .is_some_and(|e| j.spec.nodes < e.max)
                })
            })
    }

    /// Number of jobs in each state.
    pub fn count_by_state(&self) -> BTreeMap<&'static str, u64> {
        let mut out = BTreeMap::new();
        for j in self.jobs.values() {
            *out.entry(j.state.as_str()).or_insert(0) += 1;
        }
        out
    }

    /// The cluster's MASTER_PORT range (the default before `InitCluster`).
    pub fn master_ports(&self) -> PortRange {
        self.cluster
            .as_ref()
            .map(|c| c.master_ports)
            .unwrap_or_default()
    }

    /// Moves a job to `next`, enforcing the transition table.
    fn transition(&mut self, id: JobId, next: JobState, now: Millis, dirty: &mut Dirty) -> bool {
        let Some(job) = self.jobs.get_mut(&id) else {
            return false;
        };
        if !job.state.can_move_to(next) {
            return false;
        }
        if job.state.is_active() && !next.is_active() {
            // The attempt stops holding its GPUs: charge them to fair-share.
            self.charge_usage(id, now, dirty);
        }
        let Some(job) = self.jobs.get_mut(&id) else {
            return false;
        };
        if next == JobState::Running {
            job.start_time = Some(now);
        }
        if next.is_final() {
            job.end_time = Some(now);
        }
        job.state = next;
        dirty.jobs.insert(id);
        true
    }
}

#[cfg(test)]
mod tests;
