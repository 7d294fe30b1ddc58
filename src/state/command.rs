//! The log entry type and what applying it answers.

use serde::{Deserialize, Serialize};

use crate::model::{
    Allocation, GpuUse, JobId, JobSpec, JobState, Millis, NodeInventory, PortRange, TaskEvent,
    TokenRecord,
};

/// One entry of the replicated log. Every variant carries the leader's `now`
/// where time matters, so apply stays deterministic.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Command {
    /// Creates the cluster identity. Applied once; a second one is rejected.
    InitCluster {
        name: String,
        ca_cert_pem: String,
        ca_key_pem: String,
        /// The cluster's MASTER_PORT range, from the bootstrapping server's
        /// `master_port_range`.
        #[serde(default)]
        master_ports: PortRange,
        now: Millis,
    },
    /// Queues a job for `user` (already vouched for by a daemon).
    Submit {
        user: String,
        /// Boxed: a spec is far larger than every other command.
        spec: Box<JobSpec>,
        now: Millis,
    },
    /// Cancels jobs: all or none. `admin` callers may cancel anyone's job.
    Cancel {
        by: String,
        admin: bool,
        ids: Vec<JobId>,
        now: Millis,
    },
    /// Holds (`hold: true`) or releases pending jobs, all or none. Owners
    /// may act on their own jobs, `admin` callers on all.
    Hold {
        by: String,
        admin: bool,
        ids: Vec<JobId>,
        hold: bool,
    },
    /// Records a new join token (its secret's hash only).
    CreateToken { record: TokenRecord },
    /// Revokes a token so it admits nobody from now on.
    RevokeToken { id: String, now: Millis },
    /// Counts a successful join with a token.
    TokenUsed { id: String, now: Millis },
    /// An agent (re)registered its node and inventory; `addr` is where its
    /// tasks reach each other (MASTER_ADDR) and where logs are served.
    RegisterNode {
        inventory: NodeInventory,
        addr: String,
        /// A new node starts drained until its health check passes.
        #[serde(default)]
        preflight: bool,
        now: Millis,
        /// SHA-256 of the agent's certificate (see `NodeRecord::cert_sha256`).
        #[serde(default)]
        cert_sha256: String,
    },
    /// A scheduling pass's decisions. Apply re-checks each allocation against
    /// the current state and starts only those that still fit; a gang job is
    /// one allocation, so it starts whole or not at all.
    Schedule {
        allocations: Vec<Allocation>,
        now: Millis,
    },
    /// The leader has not heard from a node within its TTL: the node is down
    /// and its tasks are lost (their jobs requeue or end NODE_FAIL).
    NodeDown {
        node: String,
        reason: String,
        now: Millis,
    },
    /// Drain (`drain: Some(reason)`) or resume (`None`) a node.
    SetDrain {
        node: String,
        drain: Option<String>,
        by: crate::state::DrainSource,
        /// The admin draining it (`by: Admin`).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        user: Option<String>,
        /// Also requeue the node's jobs now (`gpuq node drain --now`).
        requeue_now: bool,
        now: Millis,
    },
    /// An agent's GPUs with their health.
    GpuHealth {
        node: String,
        gpus: Vec<crate::model::GpuInfo>,
        now: Millis,
    },
    /// Several commands proposed together as one log entry (group commit:
    /// one fsync for a burst of concurrent writes). Each is applied in order
    /// and answered on its own; a batch inside a batch is rejected.
    Batch(Vec<Command>),
    /// Moves finished jobs that ended at or before `before` from the active
    /// set to the history archive. The leader proposes it with `before = now
    /// - retention`, so apply needs no clock.
    Archive { before: Millis },
    /// An admin's change of accounts, QoS, partitions or priority weights.
    /// Validated whole: a refused change changes nothing.
    Policy {
        change: crate::model::policy_change::PolicyChange,
        by: String,
        now: Millis,
    },
    /// A scheduling pass's preemptions: victims to stop so that pending jobs fit.
    Preempt {
        preemptions: Vec<crate::sched::Preemption>,
        now: Millis,
    },
    /// Task starts and ends reported by a node's agent. Idempotent: keyed by
    /// (job, attempt, rank), a repeat changes nothing.
    TaskEvents {
        node: String,
        events: Vec<TaskEvent>,
        now: Millis,
        /// The node's last GPU use report for the jobs whose ranks end in
        /// `events` (kept in their runs for accounting).
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        gpu_use: Vec<(JobId, GpuUse)>,
    },
    /// Queues many jobs for `user` as one log entry, all or none: one spec
    /// apply refuses refuses the whole batch, naming its index.
    SubmitMany {
        user: String,
        specs: Vec<JobSpec>,
        now: Millis,
    },
    /// An admin lets a new machine take a registered node's name (`gpuq
    /// node replace`): its next join and registration are admitted.
    AllowReplace { node: String, now: Millis },
    /// Starts a job step in a running job's allocation (`srun`); the job's
    /// owner or an admin.
    StepStart {
        by: String,
        admin: bool,
        job: JobId,
        spec: Box<crate::model::StepSpec>,
        now: Millis,
    },
    /// Stops a step's tasks (`srun` interrupted).
    StepCancel {
        by: String,
        admin: bool,
        job: JobId,
        step: u32,
        now: Millis,
    },
    /// Sends running jobs back to the queue with the same id (`scontrol
    /// requeue`); with `hold`, also holds them (pending ones too).
    Requeue {
        by: String,
        admin: bool,
        ids: Vec<JobId>,
        hold: bool,
        now: Millis,
    },
    /// Changes queued or running jobs' settings (`scontrol update`), all
    /// or none.
    Update {
        by: String,
        admin: bool,
        ids: Vec<JobId>,
        change: crate::model::JobUpdate,
    },
    /// Ends the jobs among `jobs` whose time limit has passed at `now`
    /// (TIMEOUT) and that no shim watches (allocations, lowered limits).
    Expire { jobs: Vec<JobId>, now: Millis },
    /// Ends an allocation job (`salloc` left, `srun` done): it completes
    /// once its steps have stopped.
    Release {
        by: String,
        admin: bool,
        job: JobId,
        now: Millis,
    },
    /// The client of an allocation (`salloc`, `srun`, `gpuq run`) still
    /// holds it at `now`; an allocation whose renewals stop is released
    /// (`ReleaseInactive`).
    Keepalive {
        by: String,
        admin: bool,
        job: JobId,
        now: Millis,
    },
    /// Ends, as TIMEOUT, the allocations among `jobs` whose client has not
    /// renewed them for `limit_secs` at `now` (the leader's
    /// `inactive_limit_secs`, carried so every server decides alike).
    ReleaseInactive {
        jobs: Vec<JobId>,
        now: Millis,
        limit_secs: u64,
    },
    /// Records a new API token (its secret's hash only). `RevokeToken`
    /// revokes one as it does a join token.
    CreateApiToken {
        record: crate::model::ApiTokenRecord,
    },
    /// Creates service `name` owned by `user` (`gpuq service create`):
    /// `spec` is admitted as a submit's, and a job is queued per replica.
    ServiceCreate {
        user: String,
        name: String,
        spec: Box<JobSpec>,
        settings: crate::model::ServiceSettings,
        now: Millis,
    },
    /// Sets a service's replica count: missing indexes get a job, the
    /// replicas at indexes beyond the count are cancelled.
    ServiceScale {
        by: String,
        admin: bool,
        name: String,
        replicas: u32,
        now: Millis,
    },
    /// Deletes a service and cancels its replicas.
    ServiceDelete {
        by: String,
        admin: bool,
        name: String,
        now: Millis,
    },
    /// Rolls service `name` to a new version with `spec`, or back to the
    /// version before (`None`), one replica at a time.
    ServiceUpdate {
        by: String,
        admin: bool,
        name: String,
        spec: Option<Box<JobSpec>>,
        now: Millis,
    },
    /// The leader saw a rolling update's new replica `job` of index `index`
    /// pass its health check: it takes the index's place.
    ServiceReplicaReady {
        name: String,
        index: u32,
        job: JobId,
        now: Millis,
    },
    /// `gpuq service apply`: creates the service as given, or changes it to
    /// be so (update, scale, settings), or changes nothing.
    ServiceApply {
        by: String,
        admin: bool,
        name: String,
        spec: Box<JobSpec>,
        settings: crate::model::ServiceSettings,
        now: Millis,
    },
    /// The leader asked node groups for nodes, gave up on some, or is
    /// stopping idle ones (`server::autoscale`).
    Power {
        changes: Vec<crate::model::PowerChange>,
        now: Millis,
    },
    /// `gpuq node mig set`: drain `node` and repartition every GPU of it
    /// into `layout` (`none`: whole GPUs) once its jobs ended (at once with
    /// `requeue_now`: they are requeued). See `state::mig`.
    SetMig {
        node: String,
        layout: String,
        #[serde(default)]
        user: Option<String>,
        #[serde(default)]
        requeue_now: bool,
        now: Millis,
    },
    /// The node's agent could not apply its MIG target: the node stays
    /// drained with `error` as the reason.
    MigFailed {
        node: String,
        error: String,
        now: Millis,
    },
    /// `gpuq node share`: share every whole GPU of `node` into `slots`
    /// time-sliced slots (`None`: stop sharing). See `state::share`.
    SetShare {
        node: String,
        slots: Option<u8>,
        now: Millis,
    },
    /// A pass's growths of running elastic jobs (`sched::elastic`).
    Resize {
        growths: Vec<crate::sched::Growth>,
        now: Millis,
    },
}

/// What applying a command answered. Returned to the proposer after commit.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum CommandResult {
    /// Entries that carry no command (blank, membership) answer this.
    #[default]
    Noop,
    Initialized,
    Submitted {
        id: JobId,
    },
    Cancelled {
        ids: Vec<JobId>,
    },
    /// The jobs a `Hold` held or released.
    Held {
        ids: Vec<JobId>,
        hold: bool,
    },
    TokenCreated,
    ApiTokenCreated,
    TokenRevoked,
    TokenUsed,
    NodeRegistered,
    NodeUpdated,
    /// The jobs a `Schedule` started, and the ones it skipped with why.
    Scheduled {
        started: Vec<JobId>,
        skipped: Vec<(JobId, String)>,
    },
    /// How many task events changed something.
    TaskEventsApplied {
        applied: u32,
    },
    /// How many jobs an `Archive` moved to the history archive.
    Archived {
        count: u64,
    },
    /// A policy change was applied.
    PolicyUpdated {
        what: String,
    },
    /// The victims a `Preempt` stopped, and the preemptors it skipped.
    Preempted {
        stopped: Vec<JobId>,
        skipped: Vec<JobId>,
    },
    /// The answers of a `Batch`, in order.
    Batch(Vec<CommandResult>),
    Rejected(Rejection),
    /// The ids a `SubmitMany` queued, in the order of its specs.
    SubmittedMany {
        ids: Vec<JobId>,
    },
    StepStarted {
        step: u32,
    },
    StepCancelled,
    Released,
    KeptAlive,
    Expired {
        ids: Vec<JobId>,
    },
    Requeued {
        ids: Vec<JobId>,
    },
    Updated {
        ids: Vec<JobId>,
    },
    /// A service was created, scaled or deleted; `queued`: the replica
    /// jobs this queued, `cancelled`: those it stopped.
    ServiceChanged {
        queued: Vec<JobId>,
        cancelled: Vec<JobId>,
    },
    /// `ServiceApply`'s outcome: the changes made, in words (none: it was
    /// as given already), and the replica jobs queued and stopped.
    ServiceApplied {
        changes: Vec<String>,
        queued: Vec<JobId>,
        cancelled: Vec<JobId>,
    },
    /// The group nodes whose power state a `Power` changed.
    PowerChanged {
        nodes: Vec<String>,
    },
    /// The elastic jobs a `Resize` grew, and those it skipped with why.
    Resized {
        grown: Vec<JobId>,
        skipped: Vec<(JobId, String)>,
    },
}

/// Why apply refused a command. Nothing of a rejected command is applied.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
pub enum Rejection {
    #[error("the cluster is already initialised")]
    AlreadyInitialized,
    #[error("job {0} does not exist (see `gpuq queue`)")]
    NoSuchJob(JobId),
    #[error("job {id} belongs to {owner}; only its owner or an admin may change it")]
    NotOwner { id: JobId, owner: String },
    #[error("job {id} already ended ({state})")]
    AlreadyEnded { id: JobId, state: JobState },
    #[error("job {id} is {state}; only a PENDING job can be held or released")]
    NotPending { id: JobId, state: JobState },
    #[error("job {0} is not held; nothing to release")]
    NotHeld(JobId),
    #[error("--dependency names job {0}, which does not exist (see `gpuq queue --all`)")]
    UnknownDependency(JobId),
    #[error("invalid job: {0}")]
    InvalidSpec(String),
    #[error("token {0} does not exist (see `gpuq token list`)")]
    NoSuchToken(String),
    #[error("token {0} already exists")]
    DuplicateToken(String),
    #[error("nothing to do: no job ids given")]
    Empty,
    #[error("a batch may not contain a batch")]
    NestedBatch,
    #[error("node {0} does not exist (see `gpuq nodes`)")]
    NoSuchNode(String),
    #[error("node {0} is down; it comes back up when its agent reconnects")]
    NodeIsDown(String),
    /// A policy change or a submission the policy refuses; the text names
    /// the input and the fix.
    #[error("{0}")]
    Policy(String),
    #[error("nothing to submit: the batch has no jobs")]
    EmptyBatch,
    /// One job of a `SubmitMany` was refused, so none was queued.
    #[error("{}", crate::model::BatchEntryError::message(*index, why))]
    InBatch { index: usize, why: Box<Rejection> },
    #[error(
        "token {0} has been used as many times as it allows: create a new one with \
         `gpuq token create --uses N`"
    )]
    TokenUsedUp(String),
    #[error(
        "node {node} is registered with another certificate: if this machine replaces it, \
         an admin runs `gpuq node replace {node}` on a server first"
    )]
    NodeCertMismatch { node: String },
    #[error("job {id} is {state}; steps run only in a RUNNING job's allocation")]
    NotRunning { id: JobId, state: JobState },
    #[error("job {id} has no step {step} (see `sacct -j {id}`)")]
    NoSuchStep { id: JobId, step: u32 },
    #[error("job {id} cannot be requeued: {why}")]
    NotRequeueable { id: JobId, why: String },
    #[error("job {id} cannot be changed so: {why}")]
    NotUpdatable { id: JobId, why: String },
    #[error("service {0} does not exist (see `gpuq service list`)")]
    NoSuchService(String),
    #[error("service {name} belongs to {owner}; only its owner or an admin may change it")]
    NotServiceOwner { name: String, owner: String },
    /// A service command refused; the text names the input and the fix.
    #[error("{0}")]
    Service(String),
    /// A MIG layout refused (`gpuq node mig set`); the text names the fix.
    #[error("{0}")]
    Mig(String),
}
