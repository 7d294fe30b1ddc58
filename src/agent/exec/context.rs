//! Where a task sits in its job: what the environment contract (`env`,
//! `slurm_env`) is computed from.

use crate::model::JobId;

/// Where a task sits in its job, for the environment contract.
#[derive(Clone, Copy, Debug)]
pub struct TaskContext<'a> {
    pub job: JobId,
    pub job_name: &'a str,
    /// The job's restart count.
    pub restart_count: u32,
    /// The directory `gpuq submit` ran in.
    pub submit_dir: &'a str,
    /// The job's nodes in node-rank order.
    pub nodes: &'a [String],
    pub node_rank: u32,
    pub ntasks_per_node: u32,
    pub local_rank: u32,
    /// The GPU indices this task sees (see `gpus_for_local_rank`).
    pub gpus: &'a [u32],
    /// Address of the rank-0 node, as the other nodes reach it.
    pub master_addr: &'a str,
    /// A port unique among the jobs on the rank-0 node.
    pub master_port: u16,
    /// The array job id and task index, for an array task.
    pub array: Option<(JobId, u32)>,
    /// The job's facts for the Slurm variables and the rank numbering of a
    /// step (absent from older leaders: no `SLURM_*`).
    pub facts: Option<&'a crate::net::agent_proto::TaskFacts>,
    /// Every GPU the job holds on this node (`SLURM_JOB_GPUS`).
    pub node_gpus: &'a [u32],
    /// The step, for a step's task.
    pub step: Option<u32>,
}
