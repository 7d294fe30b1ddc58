//! Admin changes of the policy as data (`gpuq admin ...` -> API -> the
//! `Command::Policy` log entry): each names what to set; what is left unset
//! stays as it is. Apply validates and applies them (`state::policy`).

use serde::{Deserialize, Serialize};

use super::{PartitionState, PreemptMode};

/// Add, modify or remove.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Op {
    Add,
    Modify,
    Remove,
}

/// A limit to set: a number, or none.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Limit {
    Unlimited,
    Max(u64),
}

impl Limit {
    pub fn get(self) -> Option<u64> {
        match self {
            Limit::Unlimited => None,
            Limit::Max(n) => Some(n),
        }
    }

    pub fn get32(self) -> Option<u32> {
        self.get().map(|n| n.min(u64::from(u32::MAX)) as u32)
    }
}

/// What `gpuq admin account add|modify` sets; unset fields stay as they are
/// (or take their defaults on add).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AccountPatch {
    /// `""`: a top-level account.
    #[serde(default)]
    pub parent: Option<String>,
    #[serde(default)]
    pub shares: Option<u32>,
    #[serde(default)]
    pub add_users: Vec<String>,
    #[serde(default)]
    pub remove_users: Vec<String>,
    #[serde(default)]
    pub max_gpus: Option<Limit>,
    #[serde(default)]
    pub guaranteed_gpus: Option<u32>,
    /// Users whose default account this becomes.
    #[serde(default)]
    pub default_for: Vec<String>,
}

/// What `gpuq admin qos add|modify` sets.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct QosPatch {
    #[serde(default)]
    pub priority: Option<u32>,
    /// Replaces the list.
    #[serde(default)]
    pub preempts: Option<Vec<String>>,
    #[serde(default)]
    pub preempt_mode: Option<PreemptMode>,
    #[serde(default)]
    pub grace_secs: Option<Limit>,
    #[serde(default)]
    pub max_gpus_per_user: Option<Limit>,
    #[serde(default)]
    pub max_gpus_per_job: Option<Limit>,
    /// Replaces the accounts allowed to use it (empty, with no users: all).
    #[serde(default)]
    pub allowed_accounts: Option<Vec<String>>,
    /// Replaces the users allowed to use it whatever their account.
    #[serde(default)]
    pub allowed_users: Option<Vec<String>>,
    /// `none`: the servers' `idle_gpu_secs` again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idle_gpu_secs: Option<Limit>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cancel_idle: Option<bool>,
}

/// What `gpuq admin partition add|modify` sets.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PartitionPatch {
    /// A host list; `""`: every node.
    #[serde(default)]
    pub nodes: Option<String>,
    #[serde(default)]
    pub default_time_secs: Option<Limit>,
    #[serde(default)]
    pub max_time_secs: Option<Limit>,
    #[serde(default)]
    pub priority: Option<u32>,
    #[serde(default)]
    pub default: Option<bool>,
    #[serde(default)]
    pub state: Option<PartitionState>,
}

/// What `gpuq admin priority set` sets.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PriorityPatch {
    #[serde(default)]
    pub age: Option<u32>,
    #[serde(default)]
    pub fairshare: Option<u32>,
    #[serde(default)]
    pub job_size: Option<u32>,
    #[serde(default)]
    pub qos: Option<u32>,
    #[serde(default)]
    pub partition: Option<u32>,
    #[serde(default)]
    pub max_age_secs: Option<u64>,
    #[serde(default)]
    pub half_life_secs: Option<u64>,
}

/// What `gpuq admin reservation create|modify` sets. Times are absolute
/// (the CLI resolves `now+10min`), so apply reads no clock.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReservationPatch {
    /// A host list; replaces the nodes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nodes: Option<String>,
    /// Instead of `nodes`: whole nodes with at least this many GPUs in all,
    /// picked by apply among the nodes free of other reservations.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpus: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start: Option<super::Millis>,
    /// The end, or (`duration_secs`) how long after the start.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub end: Option<super::Millis>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub duration_secs: Option<u64>,
    /// Replaces the users who may use it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub users: Option<Vec<String>>,
    /// Replaces the accounts whose jobs may use it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub accounts: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub maint: Option<bool>,
}

/// What `gpuq admin nodegroup add|modify` sets.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeGroupPatch {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpus: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpus: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_mb: Option<u64>,
    /// Replaces the features.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub features: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resume_command: Option<String>,
    /// `""`: none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub suspend_command: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idle_secs: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resume_timeout_secs: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub demand_secs: Option<u64>,
    /// The group's MIG layout; `""`: none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mig_layout: Option<String>,
}

/// One admin change of the policy.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum PolicyChange {
    Account {
        op: Op,
        name: String,
        patch: AccountPatch,
    },
    Qos {
        op: Op,
        name: String,
        patch: QosPatch,
    },
    Partition {
        op: Op,
        name: String,
        patch: PartitionPatch,
    },
    Priority(PriorityPatch),
    /// `gpuq admin ports set FIRST-LAST`: the cluster's MASTER_PORT range
    /// (`master_port_range`), as the admin typed it; apply parses it, so a
    /// bad one is refused with what a good one looks like.
    MasterPorts {
        range: String,
    },
    /// `gpuq admin reservation create|modify|delete`.
    Reservation {
        op: Op,
        name: String,
        patch: ReservationPatch,
    },
    /// `gpuq admin nodegroup add|modify|remove`.
    NodeGroup {
        op: Op,
        name: String,
        patch: NodeGroupPatch,
    },
}
