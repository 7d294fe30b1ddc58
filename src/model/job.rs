//! Jobs: what a user asks for (`JobSpec`), what the cluster records (`Job`) and
//! the Slurm-worded states a job moves through.

use std::fmt;

use serde::{Deserialize, Serialize};

use super::{JobRun, Millis, NodeName};

/// A job id: assigned in apply from a counter, monotonic, never reused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct JobId(pub u64);

impl fmt::Display for JobId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// What the job runs: a script whose content is stored at submit, or a command.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Program {
    /// A batch script; `path` is where it was read from (for display only);
    /// `args` are its arguments (`sbatch job.sh a b`: `$1 $2`).
    Script {
        path: String,
        content: String,
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        args: Vec<String>,
    },
    /// A command with its arguments, run directly (no shell).
    Command { argv: Vec<String> },
}

/// How the submitter's environment travels with the job (`--export`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, Default)]
pub enum ExportMode {
    /// The submitter's whole environment (Slurm's `ALL`, the default).
    #[default]
    All,
    /// Only the listed variables (`--export NONE` is an empty list).
    Listed,
}

/// Everything a user asks for when submitting a job. Validated by `spec` before
/// it reaches the cluster; apply re-checks the invariants it relies on.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobSpec {
    /// Job name (`--job-name`); defaults to the script or command name.
    pub name: String,
    /// Number of nodes (`--nodes`), at least 1.
    pub nodes: u32,
    /// Tasks (processes) per node (`--ntasks-per-node`), at least 1.
    pub ntasks_per_node: u32,
    /// GPUs per node (`--gpus-per-node`); 0 for a CPU-only job.
    pub gpus_per_node: u32,
    /// CPUs per task (`--cpus-per-task`), at least 1.
    pub cpus_per_task: u32,
    /// Memory per node in MiB (`--mem`); `None` means the partition default.
    pub mem_per_node_mb: Option<u64>,
    /// Wall-clock limit in seconds (`--time`); `None` means the partition default.
    pub time_limit_secs: Option<u64>,
    /// Account charged for the job (`--account`); `None` means the user's default.
    pub account: Option<String>,
    /// Partition (`--partition`); `None` means the default partition.
    pub partition: Option<String>,
    /// Pattern for the stdout file (`--output`), e.g. `gpuq-%j.out`.
    pub output: Option<String>,
    /// Pattern for the stderr file (`--error`); `None` joins it with stdout.
    pub error: Option<String>,
    /// Absolute working directory on the compute nodes (`--chdir`).
    pub workdir: String,
    /// Environment passed to the job (after `--export` was applied).
    pub env: Vec<(String, String)>,
    /// How `env` was chosen.
    #[serde(default)]
    pub export: ExportMode,
    /// What to run.
    pub program: Program,
    /// When the job goes back to the queue (same id, `restart_count + 1`).
    #[serde(default)]
    pub requeue: RequeuePolicy,
    /// How many times it may be requeued before it ends for good.
    #[serde(default = "default_max_restarts")]
    pub max_restarts: u32,
    /// Total GPUs (`--gpus N`) with the shape left to the scheduler: a pass
    /// chooses nodes × GPUs per node, and the job's start records that shape
    /// in `nodes` and `gpus_per_node` (1 × N until then). `None`: the shape is
    /// `nodes` × `gpus_per_node` as given.
    #[serde(default)]
    pub total_gpus: Option<u32>,
    /// Where the job may run (GPU type, features, node lists, topology).
    #[serde(default)]
    pub placement: Placement,
    /// When it may start: dependencies, `--begin`, a hold at submit, arrays.
    #[serde(default)]
    pub queue: super::QueueSpec,
    /// `--signal [B:]SIG@SECS`: a warning signal before the time limit; also
    /// the signal preemption sends.
    #[serde(default)]
    pub signal: Option<super::SignalSpec>,
    /// Quality of service (`--qos`); `None` means `normal`. Apply fills in
    /// the resolved account, QoS and partition at submit.
    #[serde(default)]
    pub qos: Option<String>,
    /// `--nice N`: subtracted from the job's priority (negative: admins only).
    #[serde(default)]
    pub nice: i32,
    /// What runs by itself: every rank (the default), a batch script on
    /// the first node (`sbatch`), or nothing until a step (`salloc`).
    #[serde(default, skip_serializing_if = "super::Launch::is_ranks")]
    pub launch: super::Launch,
    /// The host it was submitted from (`SLURM_SUBMIT_HOST`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub submit_host: Option<String>,
    /// An allocation's first step, started with the job itself (`srun`
    /// outside an allocation: no second round trip before the tasks run).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first_step: Option<Box<super::StepSpec>>,
    /// `--exclusive`: its nodes run nothing else; it holds them whole (all
    /// their GPUs, CPUs and memory).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub exclusive: bool,
    /// `--container-image` and its companions: the tasks run in an image.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub container: Option<super::ContainerSpec>,
}

fn default_max_restarts() -> u32 {
    3
}

/// When a job that ended badly is requeued.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum RequeuePolicy {
    /// When its node or a GPU failed, not when the program failed (the default).
    #[default]
    OnNodeFailure,
    /// Also when a rank exited non-zero (`--requeue`).
    Always,
    /// Never (`--no-requeue`).
    Never,
}

/// Where a job may run and how close its nodes must be. The default (all
/// empty) is anywhere.
#[derive(Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Placement {
    /// A GPU type (`--gpu-type h100`): every GPU of a node must have it in its
    /// model name, compared case-insensitively (`NVIDIA H100 80GB HBM3`).
    #[serde(default)]
    pub gpu_type: Option<String>,
    /// Node features, all required (`--constraint ib,nvme`).
    #[serde(default)]
    pub features: Vec<String>,
    /// Only these nodes (`--nodelist`); empty: any node. Unlike Slurm's, the
    /// job need not use every listed node.
    #[serde(default)]
    pub nodelist: Vec<NodeName>,
    /// Never these nodes (`--exclude`).
    #[serde(default)]
    pub exclude: Vec<NodeName>,
    /// Every node of the job in one topology domain of this level (`--topology`).
    #[serde(default)]
    pub topology: Option<TopologyRequirement>,
    /// The advance reservation it runs in (`--reservation`): only on its
    /// nodes, once it has started.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reservation: Option<String>,
    /// A MIG profile (`--gpus-per-node 1g.10gb:2`): the job's GPUs are
    /// instances of this profile, never whole GPUs; `None`: whole GPUs only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_slice: Option<String>,
    /// `--nodes MIN-MAX`: an elastic job, run on any count in the range
    /// (`JobSpec::nodes` is the count of its current or last attempt).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub elastic: Option<super::NodeRange>,
}

impl Placement {
    /// Whether nothing restricts where the job runs.
    pub fn is_anywhere(&self) -> bool {
        *self == Placement::default()
    }

    /// Whether some nodes are ruled out (a GPU type, features, or a node list);
    /// `topology` rules out combinations, not nodes.
    pub fn restricts_nodes(&self) -> bool {
        self.gpu_type.is_some()
            || self.gpu_slice.is_some()
            || !self.features.is_empty()
            || !self.nodelist.is_empty()
            || !self.exclude.is_empty()
    }
}

/// A topology level a multi-node job must fit in, counted from the bottom of
/// a node's domain path (`spine1/leaf3`: the leaf is `spine1/leaf3`, the spine
/// `spine1`). Paths may be deeper; the levels are always the last two.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TopologyRequirement {
    /// One leaf switch: the node's whole path.
    Leaf,
    /// One spine: the path without its last part.
    Spine,
}

impl TopologyRequirement {
    /// Every level, lowest first.
    pub const ALL: [TopologyRequirement; 2] =
        [TopologyRequirement::Leaf, TopologyRequirement::Spine];

    /// How many path parts above a node the level is: 0 for the leaf.
    pub fn levels_up(self) -> usize {
        match self {
            TopologyRequirement::Leaf => 0,
            TopologyRequirement::Spine => 1,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            TopologyRequirement::Leaf => "leaf",
            TopologyRequirement::Spine => "spine",
        }
    }

    /// The level's name for many domains: `leaves`, `spines`.
    pub fn plural(self) -> &'static str {
        match self {
            TopologyRequirement::Leaf => "leaves",
            TopologyRequirement::Spine => "spines",
        }
    }

    /// Parses `leaf` or `spine` (case-insensitive).
    pub fn parse(word: &str) -> Option<TopologyRequirement> {
        let word = word.trim().to_ascii_lowercase();
        TopologyRequirement::ALL
            .into_iter()
            .find(|t| t.as_str() == word)
    }
}

impl fmt::Display for TopologyRequirement {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl JobSpec {
    /// Total GPUs the job holds while running.
    pub fn total_gpus(&self) -> u64 {
        match self.total_gpus {
            Some(n) => u64::from(n),
            None => u64::from(self.nodes) * u64::from(self.gpus_per_node),
        }
    }

    /// Total tasks (ranks) of the job.
    pub fn total_tasks(&self) -> u64 {
        u64::from(self.nodes) * u64::from(self.ntasks_per_node)
    }

    /// The tasks the job runs by itself (see `Launch`): its end waits for
    /// these.
    pub fn launched_tasks(&self) -> u64 {
        self.launch.launched(self.total_tasks())
    }

    /// Checks the invariants every accepted spec holds, whoever built it. Returns
    /// a sentence naming the field and the fix.
    pub fn check_invariants(&self) -> Result<(), String> {
        if self.nodes == 0 {
            return Err("nodes must be at least 1 (use --nodes 1 or more)".into());
        }
        if let Some(step) = &self.first_step {
            if self.launch != super::Launch::Allocation {
                return Err("only an allocation (srun, salloc) starts with a step".into());
            }
            if self.total_gpus.is_some() {
                return Err(
                    "an allocation with a first step needs its node count: give -N with -G".into(),
                );
            }
            step.check(self.nodes)?;
        }
        if let Some(r) = self.placement.elastic {
            if r.min == 0 || r.min >= r.max || !r.holds(self.nodes) {
                return Err(format!(
                    "--nodes {r} is no elastic range for a job on {} nodes; give MIN-MAX with \
                     1 <= MIN < MAX",
                    self.nodes
                ));
            }
            if matches!(self.launch, super::Launch::Allocation) {
                return Err(format!(
                    "--nodes {r}: an allocation (srun, salloc) keeps the nodes it was given; \
                     elastic node ranges are for batch jobs (gpuq submit, sbatch)"
                ));
            }
        }
        if self.ntasks_per_node == 0 {
            return Err("ntasks-per-node must be at least 1".into());
        }
        if self.cpus_per_task == 0 {
            return Err("cpus-per-task must be at least 1".into());
        }
        if self.time_limit_secs == Some(0) {
            return Err("time limit must be positive (e.g. --time 1:00:00)".into());
        }
        if let Some(n) = self.total_gpus {
            if n == 0 {
                return Err("--gpus must be at least 1".into());
            }
            if u64::from(n) != u64::from(self.nodes) * u64::from(self.gpus_per_node) {
                return Err(format!(
                    "total GPUs ({n}) must equal nodes ({}) × GPUs per node ({})",
                    self.nodes, self.gpus_per_node
                ));
            }
        }
        if self.placement.gpu_type.is_some() && self.gpus_per_node == 0 {
            return Err(
                "a GPU type is set but no GPUs are asked for; add --gpus-per-node N".into(),
            );
        }
        if self.mem_per_node_mb == Some(0) {
            return Err("memory must be positive (e.g. --mem 16G)".into());
        }
        if !self.workdir.starts_with('/') {
            return Err(format!(
                "working directory {:?} must be an absolute path",
                self.workdir
            ));
        }
        match &self.program {
            Program::Command { argv } if argv.is_empty() || argv[0].is_empty() => {
                Err("the command is empty: give a script or a command to run".into())
            }
            Program::Script { content, path, .. } if content.is_empty() => {
                Err(format!("script {path:?} is empty"))
            }
            _ => Ok(()),
        }
    }
}

/// The states of a job, in Slurm's words.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum JobState {
    Pending,
    Running,
    Completing,
    Completed,
    Failed,
    Cancelled,
    Timeout,
    NodeFail,
    Preempted,
    OutOfMemory,
}

impl JobState {
    /// Every state, for tables and exhaustive tests.
    pub const ALL: [JobState; 10] = [
        JobState::Pending,
        JobState::Running,
        JobState::Completing,
        JobState::Completed,
        JobState::Failed,
        JobState::Cancelled,
        JobState::Timeout,
        JobState::NodeFail,
        JobState::Preempted,
        JobState::OutOfMemory,
    ];

    /// Slurm's upper-case word for the state.
    pub fn as_str(self) -> &'static str {
        match self {
            JobState::Pending => "PENDING",
            JobState::Running => "RUNNING",
            JobState::Completing => "COMPLETING",
            JobState::Completed => "COMPLETED",
            JobState::Failed => "FAILED",
            JobState::Cancelled => "CANCELLED",
            JobState::Timeout => "TIMEOUT",
            JobState::NodeFail => "NODE_FAIL",
            JobState::Preempted => "PREEMPTED",
            JobState::OutOfMemory => "OUT_OF_MEMORY",
        }
    }

    /// Parses Slurm's word (case-insensitive), as used by `--state` filters.
    pub fn parse(word: &str) -> Option<JobState> {
        let up = word.to_ascii_uppercase();
        JobState::ALL.into_iter().find(|s| s.as_str() == up)
    }

    /// A job in a final state never changes again.
    pub fn is_final(self) -> bool {
        matches!(
            self,
            JobState::Completed
                | JobState::Failed
                | JobState::Cancelled
                | JobState::Timeout
                | JobState::OutOfMemory
        )
    }

    /// Whether the job holds (or is releasing) resources on nodes.
    pub fn is_active(self) -> bool {
        matches!(self, JobState::Running | JobState::Completing)
    }

    /// The transition table. NODE_FAIL and PREEMPTED are final unless the job is
    /// requeued, which moves it back to PENDING with the same id.
    pub fn can_move_to(self, next: JobState) -> bool {
        use JobState::*;
        match self {
            Pending => matches!(next, Running | Cancelled | Failed),
            Running => matches!(
                next,
                Completing
                    | Completed
                    | Failed
                    | Cancelled
                    | Timeout
                    | NodeFail
                    | Preempted
                    | OutOfMemory
                    | Pending
            ),
            Completing => matches!(
                next,
                Completed | Failed | Cancelled | Timeout | NodeFail | OutOfMemory | Pending
            ),
            NodeFail | Preempted => matches!(next, Pending),
            Completed | Failed | Cancelled | Timeout | OutOfMemory => false,
        }
    }
}

impl fmt::Display for JobState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A job as the cluster records it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Job {
    pub id: JobId,
    /// The submitting user, by name (resolved by name on every node).
    pub user: String,
    pub spec: JobSpec,
    pub state: JobState,
    pub submit_time: Millis,
    #[serde(default)]
    pub start_time: Option<Millis>,
    #[serde(default)]
    pub end_time: Option<Millis>,
    /// How many times the job was requeued (`GPUQ_RESTART_COUNT`).
    #[serde(default)]
    pub restart_count: u32,
    /// Why the job is pending, or why it ended the way it did.
    #[serde(default)]
    pub reason: Option<String>,
    /// Exit code of the first failing rank, or 0.
    #[serde(default)]
    pub exit_code: Option<i32>,
    /// Who cancelled the job, when it was cancelled.
    #[serde(default)]
    pub cancelled_by: Option<String>,
    /// The current (or last) attempt's placement and per-rank progress.
    #[serde(default)]
    pub run: Option<JobRun>,
    /// Every time the job was preempted, oldest first.
    #[serde(default)]
    pub preemptions: Vec<super::PreemptionRecord>,
    /// Held (`gpuq hold`, `--hold`): it does not start until released.
    #[serde(default)]
    pub held: bool,
    /// The array this job is a task of, and its index (`12_3`).
    #[serde(default)]
    pub array: Option<super::ArrayTask>,
    /// The service and replica index this job runs for (`gpuq service`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replica_of: Option<super::ReplicaOf>,
    /// When backfill expects it to start: filled in by the leader from its
    /// last pass when answering, like a pending `reason`; never by apply.
    #[serde(default)]
    pub expected_start: Option<Millis>,
    /// The pending reason's one word (Slurm's: `Resources`, `Priority`,
    /// `Dependency`...), beside the sentence in `reason`; filled in like it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason_code: Option<String>,
    /// How a running job uses its GPUs, from its agents' samples: filled
    /// in by the leader when answering, never by apply.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_use: Option<super::GpuUse>,
    /// An elastic job's size changes, oldest first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub resizes: Vec<super::ResizeRecord>,
}

/// What stands in for a script's body that only its owner may read.
pub const REDACTED: &str = "(hidden: only the job's owner and admins see its script)";

impl Job {
    /// Whether it is COMPLETING only on its way back to the queue (a
    /// requeue, preemption or node failure): Slurm shows it REQUEUED.
    pub fn is_requeueing(&self) -> bool {
        self.state == JobState::Completing && self.run.as_ref().is_some_and(|r| r.requeue)
    }

    /// A job just queued: PENDING since `submit_time`, never run, held if
    /// its spec asks (`--hold`). An array task's `array` is the caller's to
    /// set.
    pub fn pending(id: JobId, user: impl Into<String>, spec: JobSpec, submit_time: Millis) -> Job {
        Job {
            id,
            user: user.into(),
            held: spec.queue.hold,
            spec,
            state: JobState::Pending,
            submit_time,
            start_time: None,
            end_time: None,
            restart_count: 0,
            reason: None,
            exit_code: None,
            cancelled_by: None,
            run: None,
            preemptions: Vec::new(),
            array: None,
            replica_of: None,
            expected_start: None,
            reason_code: None,
            gpu_use: None,
            resizes: Vec::new(),
        }
    }

    /// What other users see of this job: everything but its environment
    /// and its script's body, which carry tokens and passwords (as Slurm
    /// shows neither to other users).
    pub fn redact(&mut self) {
        self.spec.env.clear();
        if let Program::Script { content, .. } = &mut self.spec.program {
            *content = REDACTED.to_string();
        }
    }

    /// The id users see: `12` or, for an array task, `12_3`.
    pub fn display_id(&self) -> String {
        match &self.array {
            Some(a) => format!("{}_{}", a.array_job, a.index),
            None => self.id.to_string(),
        }
    }
}

/// How one task (rank) of a job ended, as its shim saw it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum TaskEnd {
    /// Exit code 0.
    Completed,
    /// A non-zero exit code or a signal.
    Failed {
        exit_code: Option<i32>,
        signal: Option<i32>,
    },
    /// Killed at its time limit.
    Timeout,
    /// Stopped on request (cancel, or the job ended elsewhere).
    Cancelled,
    /// Killed by the kernel's OOM killer in its cgroup.
    OutOfMemory,
    /// Never started: no such user, missing working dir, exec failure, ...
    LaunchFailed { reason: String },
    /// Its node was lost.
    Lost { reason: String },
}

impl TaskEnd {
    /// The job state a job gets when this is the first bad end of its ranks.
    pub fn job_state(&self) -> JobState {
        match self {
            TaskEnd::Completed => JobState::Completed,
            TaskEnd::Failed { .. } | TaskEnd::LaunchFailed { .. } => JobState::Failed,
            TaskEnd::Timeout => JobState::Timeout,
            TaskEnd::Cancelled => JobState::Cancelled,
            TaskEnd::OutOfMemory => JobState::OutOfMemory,
            TaskEnd::Lost { .. } => JobState::NodeFail,
        }
    }

    /// The exit code Slurm would show.
    pub fn exit_code(&self) -> i32 {
        match self {
            TaskEnd::Completed => 0,
            TaskEnd::Failed {
                exit_code: Some(c), ..
            } => *c,
            TaskEnd::Failed {
                signal: Some(s), ..
            } => 128 + s,
            _ => 1,
        }
    }

    /// A short sentence for reasons and `gpuq show`.
    pub fn describe(&self) -> String {
        match self {
            TaskEnd::Completed => "exited with code 0".into(),
            TaskEnd::Failed {
                exit_code: Some(c), ..
            } => format!("exited with code {c}"),
            TaskEnd::Failed {
                signal: Some(s), ..
            } => format!("was killed by signal {s}"),
            TaskEnd::Failed { .. } => "failed".into(),
            TaskEnd::Timeout => "reached its time limit".into(),
            TaskEnd::Cancelled => "was stopped".into(),
            TaskEnd::OutOfMemory => "was killed for running out of memory".into(),
            TaskEnd::LaunchFailed { reason } => format!("could not start: {reason}"),
            TaskEnd::Lost { reason } => format!("was lost: {reason}"),
        }
    }
}
