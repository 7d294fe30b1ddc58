//! The typed client API: what the CLI sends to its local daemon over the unix
//! socket, and what a daemon forwards to the leader over QUIC (`gpuq-api/1`)
//! with the caller it vouches for.

use serde::{Deserialize, Serialize};

use crate::model::{
    BatchEntryError, Job, JobId, JobRef, JobSpec, JobState, Millis, NodeInventory, Role,
};

mod service;
pub use service::{ReplicaInfo, ServiceInfo};

/// A request from the CLI. The caller's identity is not in it: the daemon
/// learns it from the socket (SO_PEERCRED), never from the client.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum ApiRequest {
    /// Queue a job; answered with `Submitted` only after the job is committed.
    Submit { spec: Box<JobSpec> },
    /// Cancel jobs, all or none. An array job id cancels its unfinished
    /// tasks; `tasks` names single array tasks (`12_3`).
    Cancel {
        ids: Vec<JobId>,
        #[serde(default)]
        tasks: Vec<JobRef>,
    },
    /// Hold (`hold: true`) or release pending jobs, all or none.
    Hold { jobs: Vec<JobRef>, hold: bool },
    /// List jobs. Without `all`, finished jobs are left out. With `after`,
    /// one page: jobs with higher ids, as many as fit [`PAGE_BYTES`], and
    /// `next` in the answer when more follow (without it, every job at once,
    /// as servers before pages answered).
    Queue {
        all: bool,
        #[serde(default)]
        user: Option<String>,
        #[serde(default)]
        states: Vec<JobState>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        after: Option<JobId>,
    },
    /// One job in full (`task`: the array task `id_task`).
    Show {
        id: JobId,
        #[serde(default)]
        task: Option<u32>,
    },
    /// Control-plane members and Raft progress.
    Cluster,
    /// Compute nodes: state, hardware, what is in use.
    Nodes,
    /// Drain a node (admins): it finishes its work and takes no new work;
    /// with `now`, its jobs are requeued at once.
    NodeDrain {
        node: String,
        reason: String,
        now: bool,
    },
    /// Resume a drained node (admins).
    NodeResume { node: String },
    /// Part of a rank's output, read from its node (owner or admin).
    Logs { id: JobId, rank: u32, offset: u64 },
    /// Create a join token (admins only); `uses` caps how many daemons may
    /// join with it (`None`: any number until it expires).
    TokenCreate {
        role: Role,
        ttl_secs: u64,
        #[serde(default)]
        uses: Option<u64>,
    },
    /// List join tokens (admins only); secrets are never shown.
    TokenList,
    /// Revoke a join token (admins only).
    TokenRevoke { id: String },
    /// Finished jobs, active and archived (`gpuq acct`); with `summary`,
    /// totals per account and user instead. A read: any server answers.
    Acct {
        filter: crate::model::acct::AcctFilter,
        #[serde(default)]
        summary: bool,
    },
    /// Add a server to the Raft membership: as a learner until it has caught
    /// up, then as a voter. Sent over QUIC by the joining server itself (its
    /// certificate must name it), or forwarded to the leader by a member.
    AddServer {
        /// The joining server's Raft node id.
        id: u64,
        /// Its node name (as in its certificate).
        name: String,
        /// The `host:port` the other servers dial.
        addr: String,
    },
    /// Remove a server from the Raft membership (admins only).
    RemoveServer { name: String },
    /// Write the answering server's applied state to `path` on its host
    /// (admins, local socket only).
    SnapshotSave { path: std::path::PathBuf },
    /// Change accounts, QoS, partitions or priority weights (admins only).
    Admin {
        change: crate::model::policy_change::PolicyChange,
    },
    /// The policy in force, built-ins included.
    PolicyShow,
    /// Fair-share per account and user (`gpuq share`).
    Share,
    /// Priority factors of pending jobs (all when `ids` is empty).
    Priorities {
        #[serde(default)]
        ids: Vec<JobId>,
    },
    /// Queue many jobs in one call and one log entry, all or none: the
    /// first spec that would be refused refuses the batch, and the error
    /// names its index (see [`BatchEntryError`]). Answered with
    /// `SubmittedMany` after commit. At most [`MAX_SUBMIT_MANY`] specs.
    SubmitMany { specs: Vec<JobSpec> },
    /// Let a new machine take a registered node's name (admins): its next
    /// join and registration are admitted, and the old certificate is
    /// refused from then on.
    NodeReplace { node: String },
    /// Take one use of a join token for a daemon being admitted, committed
    /// before its certificate is handed out. Servers only: a follower that
    /// admits a join forwards it to the leader.
    UseToken { id: String },
    /// Start a job step in a running job's allocation (`srun`): the job's
    /// owner or an admin. Answered with `StepStarted` after commit.
    StepStart {
        job: JobId,
        spec: Box<crate::model::StepSpec>,
    },
    /// Stop a step's tasks (`srun` interrupted).
    StepCancel { job: JobId, step: u32 },
    /// End an allocation job (`salloc` left, `srun` done): it completes once
    /// its steps have stopped.
    Release { job: JobId },
    /// Part of a step task's output (`srun` streaming it): its stdout, or
    /// with `stderr` its stderr. Answered with `Logs`.
    StepLogs {
        job: JobId,
        step: u32,
        rank: u32,
        stderr: bool,
        offset: u64,
    },
    /// Send a signal to running jobs' tasks (`scancel --signal`), all or
    /// none: owners their own, admins any.
    Signal {
        jobs: Vec<JobRef>,
        signal: i32,
        #[serde(default)]
        scope: SignalScope,
        /// Only this step's tasks (`srun` passing on a signal it got).
        #[serde(default)]
        step: Option<u32>,
    },
    /// Send running jobs back to the queue with the same id (`scontrol
    /// requeue`), all or none; with `hold`, hold them too. An array id
    /// names every unfinished task.
    Requeue { jobs: Vec<JobRef>, hold: bool },
    /// Change jobs' settings (`scontrol update JobId=12 TimeLimit=...`),
    /// all or none; an array id names every unfinished task.
    Update {
        jobs: Vec<JobRef>,
        change: crate::model::JobUpdate,
    },
    /// Start a process beside rank `rank` of a running job, on its node, in
    /// its cgroup, with its GPUs and environment, as its user (`gpuq
    /// exec`): its owner or an admin. Answered with `Attached`; the stream
    /// then carries `stdio::StdioMsg` frames both ways until it exits.
    Exec {
        job: JobId,
        rank: u32,
        exec: crate::net::stdio::ExecSpec,
    },
    /// The interactive client holding allocation `job` is still there
    /// (`salloc`, `srun`, `gpuq run` send it every third of the answer's
    /// limit): its owner or an admin. Answered with `KeptAlive`.
    Keepalive { job: JobId },
    /// Connect to the standard streams of rank `rank` of a running job, or
    /// of its step `step` (`srun --pty`, `gpuq attach`): its owner or an
    /// admin. Output the client has `seen` is not sent again. Answered with
    /// `Attached`, then as `Exec`.
    Attach {
        job: JobId,
        rank: u32,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        step: Option<u32>,
        #[serde(default)]
        seen: crate::net::stdio::OutputSeen,
    },
    /// Create a bearer token for the HTTP API acting as `user` (the caller
    /// when `None`; another user's only for admins), valid `ttl_secs`;
    /// with `read_only`, for reads only. Answered with `ApiToken`.
    ApiTokenCreate {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        user: Option<String>,
        ttl_secs: u64,
        #[serde(default)]
        read_only: bool,
    },
    /// GPUs allocated over the last `hours`, as `buckets` means (the web
    /// page's chart), within [`UTILISATION_HOURS`] and
    /// [`UTILISATION_BUCKETS`]. A read: any server answers.
    Utilisation { hours: u32, buckets: u32 },
    /// Create service `name` (`gpuq service create`): a job per replica is
    /// queued at once, and another whenever one ends.
    ServiceCreate {
        name: String,
        spec: Box<JobSpec>,
        settings: crate::model::ServiceSettings,
    },
    /// Set a service's replica count.
    ServiceScale { name: String, replicas: u32 },
    /// Delete a service, cancelling its replicas.
    ServiceDelete { name: String },
    /// Roll a service to a new spec, or back to the one before (`None`).
    ServiceUpdate {
        name: String,
        spec: Option<Box<JobSpec>>,
    },
    /// Make service `name` be as given: create, change or leave it.
    ServiceApply {
        name: String,
        spec: Box<JobSpec>,
        settings: crate::model::ServiceSettings,
    },
    /// Every service, or the one named, with its replicas (a read).
    Services { name: Option<String> },
    /// Repartition every GPU of `node` into MIG `layout` (`none`: whole
    /// GPUs), admins only: the node drains, its jobs end (or are requeued
    /// with `now`), the agent applies the layout and the node resumes.
    NodeMig {
        node: String,
        layout: String,
        #[serde(default)]
        now: bool,
    },
    /// Share every whole GPU of `node` into `slots` time-sliced slots
    /// (`None`: stop sharing), admins only; refused while jobs hold GPUs
    /// there.
    NodeShare { node: String, slots: Option<u32> },
}

/// How far back a `Utilisation` request may look, in hours (30 days).
pub const UTILISATION_HOURS: std::ops::RangeInclusive<u32> = 1..=720;
/// How many buckets a `Utilisation` answer may have.
pub const UTILISATION_BUCKETS: std::ops::RangeInclusive<u32> = 1..=1000;

impl ApiRequest {
    /// Whether the request opens an interactive stream (answered, then
    /// relayed; see `stdio`).
    pub fn opens_stream(&self) -> bool {
        matches!(self, ApiRequest::Exec { .. } | ApiRequest::Attach { .. })
    }
}

/// Which of a job's tasks a signal reaches, as `scancel`'s flags say.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SignalScope {
    /// Its steps (and a `gpuq submit` job's ranks, which are its step):
    /// Slurm's default.
    #[default]
    Steps,
    /// Only the batch script (`-b`).
    Batch,
    /// The batch script and every step (`-f`).
    Full,
}

/// Who a daemon vouches the request comes from.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Caller {
    /// The user name, resolved from the uid on the daemon's host.
    pub user: String,
    pub uid: u32,
    /// Root, or a member of the daemon's `admin_group`. A server takes this
    /// from another host only for the users its `admin_users` names.
    pub admin: bool,
}

/// A request forwarded by a daemon to the leader (`gpuq-api/1`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Vouched {
    pub caller: Caller,
    pub request: ApiRequest,
}

/// A control-plane member as `gpuq cluster` shows it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Member {
    pub id: u64,
    pub name: String,
    pub addr: String,
    pub voter: bool,
    pub leader: bool,
    /// The leader's view of the member's last replicated index.
    #[serde(default)]
    pub matched_index: Option<u64>,
    /// Entries the member is behind the leader's log (leader's view only).
    #[serde(default)]
    pub lag: Option<u64>,
    /// Milliseconds since the leader last heard from the member (leader's
    /// view only; 0 for the leader itself).
    #[serde(default)]
    pub last_contact_ms: Option<u64>,
    /// Why the member is unhealthy (unreachable, lagging); None when healthy
    /// or when the answering server is not the leader.
    #[serde(default)]
    pub problem: Option<String>,
}

/// Control-plane status, from the answering server's point of view.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ClusterStatus {
    pub cluster_name: String,
    pub answered_by: String,
    pub leader: Option<String>,
    pub term: u64,
    pub last_log_index: Option<u64>,
    pub applied_index: Option<u64>,
    pub snapshot_index: Option<u64>,
    /// The last log index purged behind a snapshot: a server that needs an
    /// earlier entry is sent the snapshot.
    #[serde(default)]
    pub purged_index: Option<u64>,
    pub members: Vec<Member>,
    /// Jobs per state.
    pub jobs: Vec<(String, u64)>,
    /// Log entries this server wrote since it started.
    #[serde(default)]
    pub log_entries_written: u64,
    /// Log write transactions (fsyncs) those entries took.
    #[serde(default)]
    pub log_write_txns: u64,
    /// Commands this server proposed as leader, and the log entries that
    /// carried them: commands per log write is the group-commit batch.
    #[serde(default)]
    pub proposed_commands: u64,
    #[serde(default)]
    pub proposed_entries: u64,
}

/// A compute node as `gpuq nodes` shows it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeInfo {
    pub name: String,
    /// up, drained or down.
    pub state: String,
    #[serde(default)]
    pub reason: Option<String>,
    /// The admin who drained it, when one did (the reason ends `(by NAME)`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason_user: Option<String>,
    /// When the reason was set, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason_since: Option<Millis>,
    pub addr: String,
    /// Whether its agent is connected to the leader now.
    pub connected: bool,
    pub gpus_used: u32,
    pub cpus_used: u32,
    pub memory_used_mb: u64,
    pub running_jobs: u32,
    pub inventory: NodeInventory,
}

/// What one node rank of a job holds, as `gpuq show` lists it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RankPlacement {
    /// The node rank (`GPUQ_NODE_RANK`); rank 0 hosts MASTER_ADDR.
    pub node_rank: u32,
    /// The global task ranks (`RANK`) on this node, first and last.
    pub first_rank: u32,
    pub last_rank: u32,
    pub node: String,
    pub gpus: Vec<GpuSlot>,
    /// The cpuset in cpulist syntax (`0-15,64-79`); empty when the job
    /// holds a count of CPUs without a set.
    pub cpus: String,
    pub cpu_count: u32,
    pub memory_mb: u64,
    /// The node's topology domain path (empty: none declared).
    pub topology: String,
}

/// One GPU of an allocation: its index on the node and its UUID from the
/// node's inventory (empty when the node is no longer known).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuSlot {
    pub index: u32,
    pub uuid: String,
}

/// A join token as listed: never the secret.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TokenInfo {
    pub id: String,
    pub role: Role,
    pub created_at: Millis,
    pub expires_at: Millis,
    pub created_by: String,
    pub revoked: bool,
    pub uses: u64,
    /// How many uses it allows; `None`: any number until it expires (left
    /// out of the JSON then, as releases before it showed such a token).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_uses: Option<u64>,
}

/// An API token as listed: never the secret.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ApiTokenInfo {
    pub id: String,
    pub user: String,
    pub read_only: bool,
    pub created_at: Millis,
    pub expires_at: Millis,
    pub created_by: String,
    pub revoked: bool,
}

impl From<&crate::model::ApiTokenRecord> for ApiTokenInfo {
    fn from(t: &crate::model::ApiTokenRecord) -> Self {
        ApiTokenInfo {
            id: t.id.clone(),
            user: t.user.clone(),
            read_only: t.read_only,
            created_at: t.created_at,
            expires_at: t.expires_at,
            created_by: t.created_by.clone(),
            revoked: t.revoked,
        }
    }
}

/// The class of an error, which decides the CLI's exit code.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ErrorKind {
    /// The request was wrong (exit 1).
    BadInput,
    /// The thing named does not exist (exit 1).
    NotFound,
    /// The caller may not do this (exit 1).
    Forbidden,
    /// No leader could be reached, or it did not answer (exit 2).
    Unavailable,
    /// A bug or a broken data dir (exit 3).
    Internal,
}

/// The answer to an `ApiRequest`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum ApiResponse {
    Submitted {
        id: JobId,
    },
    Cancelled {
        ids: Vec<JobId>,
    },
    Held {
        ids: Vec<JobId>,
        hold: bool,
    },
    Jobs {
        jobs: Vec<Job>,
        /// Ask again with `after: next` for the rest (paged asks only).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        next: Option<JobId>,
    },
    Job {
        job: Box<Job>,
        /// Where its current (or last) attempt runs, one entry per node rank.
        #[serde(default)]
        placement: Vec<RankPlacement>,
    },
    Cluster {
        status: ClusterStatus,
    },
    Nodes {
        nodes: Vec<NodeInfo>,
    },
    NodeUpdated {
        node: String,
    },
    Logs {
        #[serde(with = "serde_bytes")]
        data: Vec<u8>,
        /// Where the next read starts.
        next_offset: u64,
        /// The job's state when read, so `logs -f` knows when to stop.
        state: JobState,
        /// The output file does not exist yet (the rank has not started).
        missing: bool,
    },
    Token {
        token: String,
        info: TokenInfo,
    },
    Tokens {
        tokens: Vec<TokenInfo>,
        /// API tokens: every one for an admin, a user's own otherwise.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        api_tokens: Vec<ApiTokenInfo>,
    },
    /// A new API token: printed once, never stored.
    ApiToken {
        token: String,
        info: ApiTokenInfo,
    },
    TokenRevoked {
        id: String,
    },
    Acct {
        records: Vec<crate::model::acct::AcctRecord>,
        /// Ask again with the filter's `after: next` for the rest.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        next: Option<JobId>,
    },
    AcctSummary {
        rows: Vec<crate::model::acct::AcctSummary>,
    },
    /// A service command's outcome: replica jobs queued and cancelled.
    ServiceChanged {
        queued: Vec<JobId>,
        cancelled: Vec<JobId>,
    },
    Services {
        services: Vec<ServiceInfo>,
    },
    /// `ServiceApply`'s changes, in words (none: nothing changed).
    ServiceApplied {
        changes: Vec<String>,
    },
    /// `allocated[i]`: the mean GPUs allocated from `from + i * bucket_ms`
    /// for `bucket_ms`, up to now; `total_gpus`: the nodes' GPUs now.
    Utilisation {
        from: Millis,
        bucket_ms: u64,
        allocated: Vec<f64>,
        total_gpus: u64,
    },
    /// The server is a voter now.
    ServerAdded {
        name: String,
    },
    /// The server is no longer a member.
    ServerRemoved {
        name: String,
    },
    SnapshotSaved {
        path: std::path::PathBuf,
        index: u64,
        term: u64,
        jobs: u64,
        bytes: u64,
    },
    PolicyUpdated {
        what: String,
    },
    /// Every account, QoS and partition in force (built-ins included).
    Policy {
        policy: Box<crate::model::Policy>,
        /// The cluster's MASTER_PORT range (`gpuq admin ports show`).
        #[serde(default)]
        master_ports: crate::model::PortRange,
    },
    Share {
        rows: Vec<crate::model::ShareRow>,
        half_life_secs: u64,
    },
    Priorities {
        weights: crate::model::PriorityWeights,
        jobs: Vec<(JobId, crate::model::PriorityFactors)>,
    },
    Error {
        kind: ErrorKind,
        message: String,
        /// Which job of a `SubmitMany` refused the batch, when that is why
        /// (`message` then reads as [`BatchEntryError`]'s text). Absent on
        /// the wire otherwise, and from servers before it existed.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        batch_entry: Option<BatchEntryError>,
    },
    /// The job ids of a `SubmitMany`, in the order of its specs (an array's
    /// id for an array).
    SubmittedMany {
        ids: Vec<JobId>,
    },
    /// Done; nothing more to say (a token's use taken).
    Ok,
    Requeued {
        ids: Vec<JobId>,
    },
    Updated {
        ids: Vec<JobId>,
    },
    Signalled {
        ids: Vec<JobId>,
    },
    StepStarted {
        step: u32,
    },
    StepCancelled,
    Released,
    /// The allocation is held; renew it again within `limit_secs` (0: the
    /// servers release no allocation for its client's silence).
    KeptAlive {
        limit_secs: u64,
    },
    /// An interactive stream is open to the task on `node`: `StdioMsg`
    /// frames follow on the same connection.
    Attached {
        node: String,
    },
}

impl ApiResponse {
    /// Shorthand for an error answer.
    pub fn error(kind: ErrorKind, message: impl Into<String>) -> ApiResponse {
        ApiResponse::Error {
            kind,
            message: message.into(),
            batch_entry: None,
        }
    }

    /// The answer when one job of a `SubmitMany` refuses the batch.
    pub fn batch_entry_error(kind: ErrorKind, entry: BatchEntryError) -> ApiResponse {
        ApiResponse::Error {
            kind,
            message: entry.to_string(),
            batch_entry: Some(entry),
        }
    }
}

/// The most specs one `SubmitMany` may carry.
pub const MAX_SUBMIT_MANY: usize = 10_000;

/// The most bytes (MessagePack) the specs of one `SubmitMany` may take: the
/// batch is one Raft log entry, which must fit a replication frame with room
/// to spare.
pub const MAX_SUBMIT_MANY_BYTES: usize = 4 << 20;

/// Why `specs` are too many bytes for one `SubmitMany`, if they are: the
/// server's check, and the client's before it sends (a batch over a frame's
/// 16 MiB would only break the connection).
pub fn bulk_too_big(specs: &[JobSpec]) -> Option<String> {
    let bytes = encoded_len(&specs);
    (bytes > MAX_SUBMIT_MANY_BYTES).then(|| {
        format!(
            "the {} jobs take {} KiB, more than the {} KiB one bulk submit may carry: \
             split the input, or submit with --export=NONE (an exported environment is \
             copied into every job)",
            specs.len(),
            bytes >> 10,
            MAX_SUBMIT_MANY_BYTES >> 10
        )
    })
}

/// The most bytes (MessagePack) one page of a paged answer (`Queue`, `Acct`)
/// fills: half a frame, so a page with one more large job still fits.
pub const PAGE_BYTES: usize = 8 << 20;

/// How many bytes `v` takes on the wire (MessagePack, named fields).
pub fn encoded_len<T: Serialize>(v: &T) -> usize {
    rmp_serde::to_vec_named(v).map_or(usize::MAX, |b| b.len())
}

/// One page of `items` (in id order): as many as fit [`PAGE_BYTES`], at
/// least one, and the id to ask after for the rest when some did not fit.
/// Lazy: items after the page are never made.
pub fn take_page<T: Serialize>(
    items: impl IntoIterator<Item = T>,
    id: impl Fn(&T) -> JobId,
) -> (Vec<T>, Option<JobId>) {
    let mut page = Vec::new();
    let mut bytes = 0;
    for item in items {
        bytes += encoded_len(&item);
        if bytes > PAGE_BYTES && !page.is_empty() {
            let next = page.last().map(id);
            return (page, next);
        }
        page.push(item);
    }
    (page, None)
}
