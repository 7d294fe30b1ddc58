//! Node groups: capacity that grows and shrinks (Slurm's power saving, the
//! Kubernetes cluster autoscaler). A group names the shape of its nodes,
//! how many may exist (`min`..=`max`), and the site's commands that start
//! nodes (`resume_command`, e.g. a cloud API call or IPMI power-on that
//! boots a host whose `gpuq agent` joins) and stop them
//! (`suspend_command`). Its nodes are named `GROUP-001`, `GROUP-002`, ...
//! The leader asks for nodes when pending jobs that fit the shape wait, and
//! suspends nodes idle past `idle_secs` down to `min` (`server::autoscale`);
//! each node's power state is replicated ([`PowerRecord`]).

use serde::{Deserialize, Serialize};

use super::Millis;

/// A set of like nodes that are started and stopped on demand.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeGroup {
    pub name: String,
    /// GPUs of one node.
    pub gpus: u32,
    /// CPUs and memory (MiB) of one node available to jobs.
    pub cpus: u32,
    pub memory_mb: u64,
    /// Node features (`--constraint`) its nodes have.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub features: Vec<String>,
    pub min: u32,
    pub max: u32,
    /// Run by the leader through `sh -c` to start nodes, with the host
    /// list appended as its argument; `GPUQ_NODES` the host list too, `GPUQ_NODE_NAMES` the names apart,
    /// `GPUQ_NODE_COUNT`, `GPUQ_NODE_GROUP`.
    pub resume_command: String,
    /// Run the same way to stop idle nodes; none: they are only drained.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub suspend_command: Option<String>,
    /// A node idle this long is suspended (while the group has more than `min`).
    pub idle_secs: u64,
    /// A node asked for that has not joined after this long is given up on,
    /// and its place asked for again.
    pub resume_timeout_secs: u64,
    /// Jobs that fit the shape must have waited this long before nodes are
    /// asked for (a short queue drains by itself).
    pub demand_secs: u64,
    /// The MIG layout its nodes' GPUs must have (`--mig-layout`, as `gpuq
    /// node mig set` takes it, `none` for whole GPUs): a node that joins
    /// with other GPUs is repartitioned by the same path (`state::mig`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mig_layout: Option<String>,
}

/// How many digits a group's node numbers have.
const DIGITS: usize = 3;

impl NodeGroup {
    /// The name of its `i`-th node (from 1): `burst-007`.
    pub fn node_name(&self, i: u32) -> String {
        format!("{}-{i:0DIGITS$}", self.name)
    }

    /// Whether `node` is one of its names.
    pub fn owns(&self, node: &str) -> bool {
        node.strip_prefix(self.name.as_str())
            .and_then(|rest| rest.strip_prefix('-'))
            .and_then(|n| n.parse::<u32>().ok())
            .is_some_and(|i| i >= 1 && i <= self.max && self.node_name(i) == node)
    }

    /// Whether one node of it holds one node's share of a job.
    pub fn holds(&self, gpus: u32, cpus: u64, memory_mb: u64, features: &[String]) -> bool {
        gpus <= self.gpus
            && cpus <= u64::from(self.cpus)
            && memory_mb <= self.memory_mb
            && features.iter().all(|f| self.features.contains(f))
    }
}

/// Where a group's node is in its power cycle.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PowerState {
    /// Asked for; its agent has not registered yet.
    Resuming,
    /// Registered and taking work.
    Up,
    /// Idle past its time: drained, its suspend command running.
    Suspending,
    /// Stopped; the first asked for when the group grows again.
    Suspended,
    /// Asked for and did not come (its resume command failed or it did
    /// not join in time): asked for again only when no other name is left.
    Failed,
}

impl PowerState {
    pub fn as_str(self) -> &'static str {
        match self {
            PowerState::Resuming => "powering_up",
            PowerState::Up => "up",
            PowerState::Suspending => "powering_down",
            PowerState::Suspended => "powered_down",
            PowerState::Failed => "failed",
        }
    }
}

/// A group node's power state, replicated so a new leader knows what was
/// asked for.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PowerRecord {
    pub group: String,
    pub state: PowerState,
    /// When it entered `state`.
    pub since: Millis,
}

/// A change of group nodes' power state (`state::Command::Power`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum PowerChange {
    /// The leader asks the group for these nodes.
    Resume { group: String, nodes: Vec<String> },
    /// These nodes did not come (their resume command failed, or they did
    /// not join in time): their places are asked for again, under other
    /// names first.
    Failed { nodes: Vec<String>, why: String },
    /// Idle past the group's time: drained and being stopped.
    Suspend { nodes: Vec<String> },
    /// Their suspend command finished.
    Suspended { nodes: Vec<String> },
}

#[cfg(test)]
mod tests {
    use super::*;

    fn group() -> NodeGroup {
        NodeGroup {
            name: "burst".into(),
            gpus: 8,
            cpus: 64,
            memory_mb: 512 * 1024,
            features: vec!["ib".into()],
            min: 0,
            max: 12,
            resume_command: "true".into(),
            suspend_command: None,
            idle_secs: 600,
            resume_timeout_secs: 600,
            demand_secs: 30,
            mig_layout: None,
        }
    }

    #[test]
    fn a_group_owns_its_numbered_names_only() {
        let g = group();
        assert_eq!(g.node_name(7), "burst-007");
        assert!(g.owns("burst-001") && g.owns("burst-012"));
        for other in [
            "burst-013",
            "burst-000",
            "burst-1",
            "burst-x",
            "burstx-001",
            "n1",
        ] {
            assert!(!g.owns(other), "{other}");
        }
    }

    #[test]
    fn a_group_holds_jobs_that_fit_its_shape() {
        let g = group();
        assert!(g.holds(8, 64, 1024, &["ib".into()]));
        assert!(!g.holds(9, 1, 0, &[]));
        assert!(!g.holds(1, 65, 0, &[]));
        assert!(!g.holds(1, 1, 0, &["nvme".into()]));
    }
}
