//! A job's attempt on its nodes: what it was given, which of its tasks
//! started and ended, and how its GPUs were used.

use serde::{Deserialize, Serialize};

use super::{JobId, JobState, TaskEnd};

/// One attempt of a running (or last run) job.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobRun {
    /// The job's `restart_count` when this attempt started.
    pub attempt: u32,
    /// Shared with the scheduler's views of the running job (a pass reads
    /// every running job's allocation; a copy each pass was 18% of it at
    /// 10,000 nodes). Serialized as the allocation itself.
    pub allocation: std::sync::Arc<super::Allocation>,
    /// Rank 0's node address and a port unique among jobs on that node.
    pub master_addr: String,
    pub master_port: u16,
    /// Ranks whose start was reported.
    #[serde(default)]
    pub started: std::collections::BTreeSet<u32>,
    /// Ranks whose end was reported, and how.
    #[serde(default)]
    pub ended: std::collections::BTreeMap<u32, TaskEnd>,
    /// Set when the job is COMPLETING: the state it ends in once every rank
    /// has stopped.
    #[serde(default)]
    pub final_state: Option<JobState>,
    /// Set when the job is COMPLETING: it goes back to the queue instead.
    #[serde(default)]
    pub requeue: bool,
    /// SIGTERM-to-SIGKILL grace of its ranks (its QoS's); `None`: the
    /// agent's `kill_grace_secs`.
    #[serde(default)]
    pub kill_grace_secs: Option<u64>,
    /// Set when the job is COMPLETING because it was preempted for this job.
    #[serde(default)]
    pub preempted_for: Option<JobId>,
    /// The job steps this attempt started (`srun` in the allocation).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub steps: Vec<super::Step>,
    /// Its time limit was changed after its tasks started (`scontrol
    /// update`): their shims keep the old one, so the leader ends it at the
    /// new one.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub limit_changed: bool,
    /// When the client holding this allocation (`salloc`, `srun`, `gpuq
    /// run`) last renewed it; the leader releases it once that (or its
    /// start) is `inactive_limit_secs` ago.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub renewed_at: Option<super::Millis>,
    /// Each node's GPU use in this attempt, as its agent last reported it
    /// before ranks ended there (the leader adds its latest report to the
    /// command carrying the ends): what `gpuq acct` and `gpuq show` report
    /// once the job is over.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub gpu_use: std::collections::BTreeMap<String, super::GpuUse>,
    /// A service replica's named ports (`--port NAME`), each unique among
    /// the jobs on rank 0's node as `master_port` is: its `PORT_<NAME>`.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub named_ports: std::collections::BTreeMap<String, u16>,
    /// An elastic job's size change under way: its ranks are stopping, and
    /// `allocation` holds the nodes of both sizes until they have.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resize: Option<super::Resize>,
    /// What the run's GPUs count as in accounting and fair share, in
    /// thousandths of a GPU, where that is not its GPU count: a slot of a
    /// GPU time-shared N ways is 1/N of one (`model::share`). Fixed when
    /// the run starts, so a later `gpuq node share` does not rewrite it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub charged_milli_gpus: Option<u64>,
}

impl JobRun {
    /// The attempt's GPU use over all its nodes, once reported.
    pub fn gpu_use(&self) -> Option<super::GpuUse> {
        super::GpuUse::merge(self.gpu_use.values().copied())
    }

    /// The node a global rank runs on.
    pub fn node_of_rank(&self, rank: u32, ntasks_per_node: u32) -> Option<&str> {
        self.allocation
            .nodes
            .get((rank / ntasks_per_node.max(1)) as usize)
            .map(|n| n.node.as_str())
    }

    /// The allocation's nodes in node-rank order.
    pub fn node_names(&self) -> Vec<String> {
        self.allocation
            .nodes
            .iter()
            .map(|n| n.node.clone())
            .collect()
    }

    /// The node a task of this attempt runs on: a rank of the job, or of
    /// one of its steps.
    pub fn node_of_task(&self, key: &super::TaskKey, ntasks_per_node: u32) -> Option<&str> {
        let Some(step) = key.step else {
            return self.node_of_rank(key.rank, ntasks_per_node);
        };
        let step = self.steps.get(step as usize)?;
        let (i, _) = step.spec.place(key.rank)?;
        let node_rank = *step.spec.nodes.get(i)?;
        self.allocation
            .nodes
            .get(node_rank as usize)
            .map(|n| n.node.as_str())
    }

    /// Every task of the attempt has ended: the `launched` tasks of the job
    /// itself and those of every step.
    pub fn all_ended(&self, launched: u64) -> bool {
        self.ended.len() as u64 >= launched && self.steps.iter().all(super::Step::all_ended)
    }
}
