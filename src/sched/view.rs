//! The read-only input of a pass: nodes with what is in use on them, and the
//! pending jobs. The server builds it from the replicated state; the scheduler
//! only reads it.

use std::collections::BTreeSet;
use std::fmt;

use compact_str::CompactString;
use serde::{Deserialize, Serialize};

use crate::model::{
    Job, JobId, JobSpec, Millis, NodeAllocation, NodeInventory, NodeName, Placement,
};

/// Memory a job gets per CPU on each node when it gives no `--mem` (Slurm's
/// `DefMemPerCPU`). Per CPU rather than per task so a 1-task job with 16 CPUs
/// gets 16 GiB, not 1. It is reserved like any other request: the scheduler never
/// oversubscribes memory, so a default is a real claim on the node. A partition
/// default from the config replaces this constant once partitions exist.
pub const DEFAULT_MEM_PER_CPU_MB: u64 = 1024;

/// Everything a pass looks at.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClusterView {
    /// Every known node, whatever its state. Names are unique.
    pub nodes: Vec<NodeView>,
    /// Jobs waiting to start. Ids are unique; order does not matter.
    pub pending: Vec<PendingJob>,
    /// Jobs holding resources now (already charged to `nodes`' usage), with
    /// when they are expected to release them: backfill's timeline.
    #[serde(default)]
    pub running: Vec<RunningJob>,
    /// Backfill's knobs.
    #[serde(default)]
    pub backfill: super::BackfillConfig,
    /// How many ports the cluster's MASTER_PORT range has: a node is rank 0
    /// of at most this many running jobs. `None`: no limit.
    #[serde(default)]
    pub master_ports: Option<u32>,
    /// Accounts, QoS, partitions, weights, usage and running jobs (priority,
    /// quotas, preemption). The default is FIFO with no limits.
    #[serde(default)]
    pub policy: super::PolicyView,
}

/// A running (or completing) job as backfill sees it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunningJob {
    pub id: JobId,
    pub allocation: std::sync::Arc<crate::model::Allocation>,
    /// Start plus time limit (or the planning default for a job without one);
    /// `None`: never known to end. A time already past means "any moment".
    pub expected_end: Option<Millis>,
}

/// An array's throttle (`--array 0-99%8`): how many more of its tasks may
/// start now.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ArrayThrottle {
    /// The array job id (`12` of `12_3`).
    pub array: JobId,
    /// The throttle minus the tasks running now (0: none may start).
    pub slots: u32,
}

/// Whether a node takes new work.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum NodeState {
    /// Heartbeating and accepting work.
    Up,
    /// Alive but taking no new work (admin drain or a health fault).
    Drained,
    /// Silent past its TTL; its tasks are lost.
    Down,
}

impl fmt::Display for NodeState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            NodeState::Up => "up",
            NodeState::Drained => "drained",
            NodeState::Down => "down",
        })
    }
}

/// What the active jobs on a node hold.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Usage {
    /// GPU indices held by some job.
    pub gpus: BTreeSet<u32>,
    /// CPUs held, counted (with or without a cpuset).
    pub cpus: u32,
    /// CPU ids in the cpusets of the jobs that have one; a job given only a
    /// count holds CPUs no set names.
    #[serde(default)]
    pub cpu_ids: BTreeSet<u32>,
    pub memory_mb: u64,
    /// Running jobs whose rank 0 is here, each holding one MASTER_PORT.
    #[serde(default)]
    pub master_ports: u32,
}

impl Usage {
    /// Adds what `alloc` holds on this node.
    pub fn charge(&mut self, alloc: &NodeAllocation) {
        self.gpus.extend(alloc.gpus.iter().copied());
        self.cpus = self.cpus.saturating_add(alloc.cpu_count);
        self.cpu_ids.extend(alloc.cpus.iter().copied());
        self.memory_mb = self.memory_mb.saturating_add(alloc.memory_mb);
    }

    /// Removes what `alloc` held on this node (when its job ends).
    pub fn release(&mut self, alloc: &NodeAllocation) {
        for g in &alloc.gpus {
            self.gpus.remove(g);
        }
        for c in &alloc.cpus {
            self.cpu_ids.remove(c);
        }
        self.cpus = self.cpus.saturating_sub(alloc.cpu_count);
        self.memory_mb = self.memory_mb.saturating_sub(alloc.memory_mb);
    }
}

/// One node as a pass sees it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeView {
    /// The node's name; the scheduler uses this one, not `inventory.name`.
    pub name: NodeName,
    /// Capacity: the healthy GPUs, `cpus` and `memory_mb` of the inventory.
    pub inventory: NodeInventory,
    pub state: NodeState,
    pub used: Usage,
}

impl NodeView {
    /// A node with nothing in use.
    pub fn new(inventory: NodeInventory, state: NodeState) -> NodeView {
        NodeView {
            name: inventory.name.clone(),
            inventory,
            state,
            used: Usage::default(),
        }
    }

    /// Indices of the healthy GPUs no job holds.
    pub fn free_gpus(&self) -> BTreeSet<u32> {
        self.inventory
            .gpus
            .iter()
            .filter(|g| g.healthy && !self.used.gpus.contains(&g.index))
            .map(|g| g.index)
            .collect()
    }

    /// CPUs no job holds.
    pub fn free_cpus(&self) -> u64 {
        u64::from(self.inventory.cpus.saturating_sub(self.used.cpus))
    }

    /// CPU ids no cpuset holds, ascending, or none when the node's NUMA
    /// layout does not name exactly its `cpus` (see [`cpu_layout`]). A sorted
    /// vector: a pass works this out for every node it places a job on.
    pub fn free_cpu_ids(&self) -> Vec<u32> {
        let Some(mut ids) = cpu_layout(&self.inventory) else {
            return Vec::new();
        };
        if !self.used.cpu_ids.is_empty() {
            ids.retain(|c| !self.used.cpu_ids.contains(c));
        }
        ids
    }

    /// Memory no job holds, in MiB.
    pub fn free_memory_mb(&self) -> u64 {
        self.inventory.memory_mb.saturating_sub(self.used.memory_mb)
    }

    /// What the node could hold if it were empty: its healthy GPUs, CPUs, memory.
    pub fn capacity(&self) -> Capacity {
        Capacity {
            gpus: self.inventory.gpus.iter().filter(|g| g.healthy).count() as u64,
            cpus: u64::from(self.inventory.cpus),
            memory_mb: self.inventory.memory_mb,
        }
    }
}

/// The CPU ids jobs on this node may be pinned to: those of its NUMA nodes,
/// when they number exactly its `cpus`. Otherwise (a node whose CPU count was
/// declared in its config, as simulated nodes are) `None`, and jobs there get
/// a CPU count without a cpuset. Ascending, each once.
pub fn cpu_layout(inventory: &NodeInventory) -> Option<Vec<u32>> {
    let mut ids: Vec<u32> = inventory
        .numa
        .iter()
        .flat_map(|n| n.cpus.iter().copied())
        .collect();
    ids.sort_unstable();
    ids.dedup();
    (ids.len() == inventory.cpus as usize && !ids.is_empty()).then_some(ids)
}

/// Amounts of the three resources a node has (or has free).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Capacity {
    pub gpus: u64,
    pub cpus: u64,
    pub memory_mb: u64,
}

impl Capacity {
    /// Whether one node of this capacity holds one node's share of `shape`.
    pub fn holds(&self, shape: &Shape) -> bool {
        self.gpus >= u64::from(shape.gpus)
            && self.cpus >= shape.cpus
            && self.memory_mb >= shape.memory_mb
    }
}

/// What a job needs on each of its nodes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Shape {
    pub gpus: u32,
    /// `ntasks_per_node * cpus_per_task` (u64: the product of two u32 may overflow u32).
    pub cpus: u64,
    /// `--mem`, or [`DEFAULT_MEM_PER_CPU_MB`] times `cpus`.
    pub memory_mb: u64,
}

/// A job waiting to start, with just what scheduling needs.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PendingJob {
    pub id: JobId,
    pub user: CompactString,
    pub nodes: u32,
    pub ntasks_per_node: u32,
    pub gpus_per_node: u32,
    pub cpus_per_task: u32,
    /// `None`: [`DEFAULT_MEM_PER_CPU_MB`] per CPU.
    pub mem_per_node_mb: Option<u64>,
    pub submit_time: Millis,
    /// Higher starts first. 0 until multifactor priority exists.
    pub priority: i64,
    /// `--gpus N`: the shape is chosen by the pass, and `nodes` and
    /// `gpus_per_node` are ignored (see [`crate::model::JobSpec::total_gpus`]).
    #[serde(default)]
    pub total_gpus: Option<u32>,
    /// Where the job may run.
    #[serde(default)]
    pub placement: Placement,
    /// `--time` (or a partition default): backfill starts a job early only if
    /// it ends before the reservations it would overlap. `None`: unlimited.
    #[serde(default)]
    pub time_limit_secs: Option<u64>,
    /// `--begin`: not before this time.
    #[serde(default)]
    pub begin_time: Option<Millis>,
    /// Set by the state when something outside the scheduler keeps the job
    /// back (a hold, unmet dependencies): the job waits with this reason.
    #[serde(default)]
    pub blocked: Option<super::PendingReason>,
    /// The array throttle the job is a task of, if any.
    #[serde(default)]
    pub array_throttle: Option<ArrayThrottle>,
    /// `--dependency singleton`: at most one job of this user and name runs;
    /// a pass starts at most one of them.
    #[serde(default)]
    pub singleton: Option<String>,
    /// When the job restarts after a requeue: where its last attempt ran, in
    /// rank order. The pass keeps those of these nodes that can still take
    /// it, at their ranks (in-place restart), and puts the job at the head of
    /// its priority. Empty for a job that has not run.
    #[serde(default)]
    pub previous: Vec<NodeAllocation>,
    /// The account it is charged to, its QoS and partition (resolved at
    /// submit; empty: the built-ins).
    #[serde(default)]
    pub account: CompactString,
    #[serde(default)]
    pub qos: CompactString,
    #[serde(default)]
    pub partition: CompactString,
    /// `--nice`.
    #[serde(default)]
    pub nice: i32,
    /// `--exclusive`: only on nodes with nothing else, taken whole.
    #[serde(default)]
    pub exclusive: bool,
}

impl PendingJob {
    /// What the job needs on each node, with the memory default applied. For a
    /// `--gpus N` job, the GPUs are those of its provisional shape; a pass
    /// uses [`PendingJob::with_gpus`] with the shape it chose.
    pub fn per_node(&self) -> Shape {
        self.with_gpus(self.gpus_per_node)
    }

    /// The per-node shape with `gpus` GPUs per node, the rest as asked.
    pub fn with_gpus(&self, gpus: u32) -> Shape {
        let cpus = u64::from(self.ntasks_per_node) * u64::from(self.cpus_per_task);
        Shape {
            gpus,
            cpus,
            memory_mb: self
                .mem_per_node_mb
                .unwrap_or_else(|| DEFAULT_MEM_PER_CPU_MB.saturating_mul(cpus)),
        }
    }

    /// Asks the CPU to start loading this record's cache lines. A pass walks
    /// 100,000 of them, cold, and waiting for each in turn was most of the
    /// cost of building its queue; asked for a few jobs ahead, the loads
    /// overlap.
    #[inline]
    pub(super) fn prefetch(&self) {
        #[cfg(target_arch = "x86_64")]
        {
            use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
            let base = (self as *const PendingJob).cast::<i8>();
            for offset in (0..std::mem::size_of::<PendingJob>()).step_by(64) {
                // SAFETY: a prefetch is a hint: it never faults and loads
                // nothing the program reads; the addresses are in `self`.
                unsafe { _mm_prefetch::<_MM_HINT_T0>(base.add(offset)) };
            }
        }
    }

    /// The invariants `JobSpec::check_invariants` gives every accepted job,
    /// re-checked because a view can be built by hand.
    pub fn check_shape(&self) -> Result<(), String> {
        if self.nodes == 0 {
            return Err("asks for 0 nodes; a job needs at least 1".into());
        }
        if self.ntasks_per_node == 0 {
            return Err("asks for 0 tasks per node; a job needs at least 1".into());
        }
        if self.cpus_per_task == 0 {
            return Err("asks for 0 CPUs per task; a task needs at least 1".into());
        }
        if self.total_gpus == Some(0) {
            return Err("asks for 0 GPUs in total with --gpus; it needs at least 1".into());
        }
        Ok(())
    }
}

impl PendingJob {
    /// What a pass would see of a new job asking for `spec`, before it has
    /// an id, a user or a submit time: all the submit-time feasibility check
    /// needs, and what [`PendingJob::from`] a [`Job`] starts from.
    pub fn of_spec(spec: &JobSpec) -> PendingJob {
        PendingJob {
            id: JobId(0),
            user: CompactString::default(),
            // An elastic job waits (and is reserved for) at its minimum.
            nodes: spec.placement.elastic.map_or(spec.nodes, |r| r.min),
            ntasks_per_node: spec.ntasks_per_node,
            gpus_per_node: spec.gpus_per_node,
            cpus_per_task: spec.cpus_per_task,
            mem_per_node_mb: spec.mem_per_node_mb,
            submit_time: 0,
            priority: 0,
            total_gpus: spec.total_gpus,
            placement: spec.placement.clone(),
            time_limit_secs: spec.time_limit_secs,
            begin_time: spec.queue.begin_time,
            blocked: None,
            array_throttle: None,
            singleton: None,
            previous: Vec::new(),
            account: spec.account.as_deref().unwrap_or_default().into(),
            qos: spec.qos.as_deref().unwrap_or_default().into(),
            partition: spec.partition.as_deref().unwrap_or_default().into(),
            nice: spec.nice,
            exclusive: spec.exclusive,
        }
    }
}

impl From<&Job> for PendingJob {
    fn from(job: &Job) -> PendingJob {
        PendingJob {
            id: job.id,
            user: job.user.as_str().into(),
            submit_time: job.submit_time,
            previous: match (&job.run, job.state) {
                (Some(run), crate::model::JobState::Pending) if job.restart_count > 0 => {
                    run.allocation.nodes.clone()
                }
                _ => Vec::new(),
            },
            ..PendingJob::of_spec(&job.spec)
        }
    }
}
