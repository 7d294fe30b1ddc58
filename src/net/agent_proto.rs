//! The agent sync protocol (`gpuq-agent/1`): one long-lived bidirectional
//! stream per agent connection to the leader. The agent says who it is and
//! what it runs; the leader answers with the full desired state of the node
//! whenever it changes (level-triggered: the agent reconciles to it), and
//! acknowledges task events once they are committed, so the agent can buffer
//! and replay them across reconnects without loss or duplication.

use serde::{Deserialize, Serialize};

use crate::model::{JobId, NodeInventory, Program, TaskEvent, TaskKey};

/// The first frame an agent sends on its sync stream.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct AgentHello {
    pub inventory: NodeInventory,
    /// Where this node's ranks reach each other (MASTER_ADDR) and its logs
    /// are served, `host:port`.
    pub addr: String,
    /// Random per agent process start: tells a reconnect from a second agent.
    pub boot_id: u64,
    /// A node joining for the first time stays drained until its health
    /// check passes once.
    #[serde(default)]
    pub preflight: bool,
}

/// Agent -> leader, after the hello.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum AgentMsg {
    /// Task starts and ends, numbered so the leader can acknowledge them.
    Events { seq: u64, events: Vec<TaskEvent> },
    /// "Still here." Liveness is kept in the leader's memory, not the log.
    Heartbeat,
    /// The node's GPUs with their health, sent when a GPU event was seen.
    Gpus { gpus: Vec<crate::model::GpuInfo> },
    /// The health-check command's latest result, sent when it changes.
    HealthCheck { ok: bool, output: String },
    /// How each job on the node uses its GPUs so far, with the heartbeat
    /// (leaders before it close the session on it: upgrade servers first).
    GpuUse {
        jobs: Vec<(crate::model::JobId, crate::model::GpuUse)>,
    },
    /// A service replica's health check changed its verdict (the agent of
    /// the replica's first node checks it; see `model::HealthCheck`).
    ReplicaHealth {
        job: crate::model::JobId,
        attempt: u32,
        healthy: bool,
        /// What the last check saw (`GET /healthz: 503`).
        detail: String,
    },
    /// `ServerMsg::Mig` could not be applied; the node's GPUs are as
    /// `Gpus` (sent before this) reports them.
    MigFailed { layout: String, error: String },
}

/// Leader -> agent.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum ServerMsg {
    /// The connection is accepted; desired state follows.
    Welcome {
        node: String,
        /// Every server of the control plane (`host:port`), so the agent can
        /// fail over to any of them; it keeps the last list in its data dir.
        #[serde(default)]
        servers: Vec<String>,
    },
    /// The connection is refused (wrong leader, duplicate node, bad identity).
    Refused {
        reason: String,
        /// Where the leader is, when this server is not it.
        #[serde(default)]
        leader_addr: Option<String>,
    },
    /// Every task this node should be running now (full set), and the ranks
    /// of its ending (COMPLETING) jobs that have not reported an end: an
    /// agent that never had one of those (it was cancelled before a desired
    /// set carried it, e.g. across a leader change) reports it ended, or the
    /// job would wait for it for ever.
    Desired {
        index: u64,
        tasks: Vec<DesiredTask>,
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        stopping: Vec<TaskKey>,
        /// Jobs on this node being preempted: their tasks get their
        /// `--signal` signal and a grace before SIGTERM.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        preempted: Vec<JobId>,
    },
    /// Events up to and including `seq` are committed.
    EventsCommitted { seq: u64 },
    /// Send `signal` to these running tasks (`scancel --signal`); a task
    /// not running here is skipped. Not replicated: a signal is a moment's
    /// act, like Slurm's.
    Signal { tasks: Vec<TaskKey>, signal: i32 },
    /// Partition every GPU into this MIG layout (`none`: whole GPUs), then
    /// report the GPUs (`AgentMsg::Gpus`), or `AgentMsg::MigFailed`. Sent
    /// once nothing runs on the node (`gpuq node mig set`).
    Mig { layout: String },
}

/// The most bytes one log reply carries.
pub const MAX_LOG_CHUNK: u32 = 1 << 20;

/// Leader -> agent, on a new stream of the agent's connection: read part of
/// a task's output file. The agent expands the pattern as its runner did and
/// serves the file only if the job's user owns it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LogRequest {
    pub job: JobId,
    pub job_name: String,
    pub rank: u32,
    pub node_rank: u32,
    pub user: String,
    pub workdir: String,
    pub output: Option<String>,
    pub offset: u64,
    pub max_bytes: u32,
    /// The attempt, for a step task's spooled output.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub attempt: u32,
    /// A step task's output: with no `output` pattern, its spool.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step: Option<u32>,
    /// Its stderr spool rather than its stdout.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub stderr: bool,
    /// For `%A`/`%a` in the pattern: the array job and index.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub array: Option<(JobId, u32)>,
    /// For `%N`: the node's name.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub node: String,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

/// The agent's answer to a `LogRequest`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum LogReply {
    /// Bytes from the offset; `size` is the file's size now.
    Chunk {
        #[serde(with = "serde_bytes")]
        data: Vec<u8>,
        size: u64,
    },
    /// The file does not exist (yet).
    Missing { path: String },
    /// It cannot be served, and why.
    Refused { reason: String },
}

/// Leader -> agent, on a new stream of the agent's connection: connect to
/// the standard streams of the running task `task` (attach), or start
/// `exec` beside it and connect to that. The stream then carries
/// `stdio::StdioMsg` frames (the agent's first may be an `Error`). An
/// agent tells it from a `LogRequest` by its fields.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StdioRequest {
    pub task: TaskKey,
    /// The job's user: the task on the node must be theirs.
    pub user: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exec: Option<crate::net::stdio::ExecSpec>,
    #[serde(default)]
    pub seen: crate::net::stdio::OutputSeen,
}

/// One task (rank) a node should run, with everything needed to start it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct DesiredTask {
    /// Which task; flattened, so its `job`, `attempt` and `rank` are fields
    /// of this message as they always were.
    #[serde(flatten)]
    pub key: TaskKey,
    pub node_rank: u32,
    pub local_rank: u32,
    pub ntasks_per_node: u32,
    pub num_nodes: u32,
    /// Node names by node rank.
    pub nodelist: Vec<String>,
    pub user: String,
    pub job_name: String,
    pub program: Program,
    pub workdir: String,
    pub env: Vec<(String, String)>,
    /// Output patterns (`%j` ...), expanded by the agent.
    pub output: Option<String>,
    pub error: Option<String>,
    /// GPU indices on this node for the whole job (the agent splits them
    /// among local ranks).
    pub gpus: Vec<u32>,
    pub cpus: Vec<u32>,
    pub cpu_count: u32,
    pub memory_mb: u64,
    pub time_limit_secs: Option<u64>,
    pub master_addr: String,
    pub master_port: u16,
    /// `--signal`: sent this long before the time limit.
    #[serde(default)]
    pub signal: Option<crate::model::SignalSpec>,
    /// The array and index, for an array task.
    #[serde(default)]
    pub array: Option<crate::model::ArrayTask>,
    /// SIGTERM-to-SIGKILL grace when the task is stopped (its QoS's);
    /// `None`: the agent's `kill_grace_secs`.
    #[serde(default)]
    pub kill_grace_secs: Option<u64>,
    /// What the Slurm environment and the rank numbering need beyond the
    /// fields above; absent from leaders before job steps.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub facts: Option<Box<TaskFacts>>,
    /// The service replica's health check, on its first task only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub health: Option<crate::model::HealthCheck>,
    /// The image the task runs in (`--container-image`), if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub container: Option<crate::model::ContainerSpec>,
    /// When some of `gpus` are MIG instances: what `CUDA_VISIBLE_DEVICES`
    /// names for each of `gpus`, in order (an instance's `MIG-` UUID, a whole
    /// GPU's index); empty: the indices themselves.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub gpu_devices: Vec<String>,
}

/// The job-level facts of a task's environment (`SLURM_*`), and how it
/// numbers and shares: a job step's tasks are spread unevenly over its
/// nodes and see all of their node's GPUs, as Slurm's.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskFacts {
    /// Tasks of the job (or step): WORLD_SIZE, SLURM_NTASKS.
    pub ntasks: u32,
    /// The task's rank's first rank on this node (its RANK is this plus
    /// its local rank).
    pub first_rank: u32,
    /// Tasks on each node of `nodelist`: SLURM_TASKS_PER_NODE.
    pub tasks_per_node: Vec<u32>,
    /// The job's nodes (a step's `nodelist` is its own).
    pub job_nodelist: Vec<String>,
    pub cpus_per_task: u32,
    /// The task sees every GPU of its node's allocation (Slurm's batch
    /// script and steps) rather than its share (gpuq's ranks).
    pub all_gpus: bool,
    /// `--gpus-per-task`: this many each, in local-rank order.
    pub gpus_per_task: Option<u32>,
    pub partition: String,
    pub account: String,
    pub qos: String,
    pub cluster: String,
    pub submit_host: String,
    /// An array task's array: task count, lowest and highest index.
    #[serde(default)]
    pub array_span: Option<(u32, u32, u32)>,
    /// How the task's standard streams are connected (a terminal for `srun
    /// --pty`); absent (files) from leaders before interactive work.
    #[serde(default, skip_serializing_if = "crate::model::TaskIo::is_files")]
    pub io: crate::model::TaskIo,
    /// An elastic job's node range (`--nodes MIN-MAX`): torchrun's
    /// `PET_NNODES=MIN:MAX` and a rendezvous on rank 0.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub elastic: Option<crate::model::NodeRange>,
}
