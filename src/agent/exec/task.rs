//! What the agent hands the shim (`TaskSpec`, written as `task.json`) and what
//! the shim leaves behind (`pid`, `shim.pid`, `status.json`). These files are
//! the whole interface between the agent and a running task, which is what lets
//! an agent restart and re-adopt its tasks: everything it needs is on disk.
//! So the types written here (`TaskSpec` with its `Identity`, `TaskStatus`,
//! `TaskPid`) must stay readable by the next agent and shim binaries: a field
//! may be added with a default, never renamed. The task's `TaskKey` is
//! flattened into `task.json` as the `job`, `attempt` and `rank` it always had.
//!
//! `TaskOutcome` is the shim's own record of how the task ended, with what
//! only the node knows (the failure's words, which stop it was); the leader
//! is told the coarser `TaskEnd` of it (`TaskOutcome::end`).

use std::ffi::CString;
use std::fs;
use std::io::{self, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::model::{Millis, Program, TaskEnd, TaskIo, TaskKey};

/// The spec the agent writes for the shim.
pub const TASK_FILE: &str = "task.json";
/// The shim's own pid and start time (written by the agent and by the shim).
pub const SHIM_PID_FILE: &str = "shim.pid";
/// The user's process: pid, start time, cgroup (written by the shim).
pub const PID_FILE: &str = "pid";
/// A stop request and its reason (written by the agent).
pub const STOP_FILE: &str = "stop";
/// A time limit changed since the task started (`scontrol update
/// TimeLimit=`): seconds from the task's start, or `none`. The shim reads
/// it every tick; absent, the task's spec says.
pub const LIMIT_FILE: &str = "limit";
/// How the task ended (written once, atomically, by the shim).
pub const STATUS_FILE: &str = "status.json";
/// A script job's content, run directly so its `#!` line applies.
pub const SCRIPT_FILE: &str = "script";
/// The shim's own log (its stdout and stderr).
pub const SHIM_LOG_FILE: &str = "shim.log";
/// Where an interactive task's shim listens for clients (the agent).
pub const SOCKET_FILE: &str = "io.sock";

/// A signal sent some time before the time limit (`--signal USR1@60`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LimitSignal {
    /// Signal number (e.g. 10 for SIGUSR1 on Linux).
    pub signal: i32,
    /// How many seconds before the limit it is sent.
    pub secs_before: u64,
    /// Only to the main process (`--signal B:...`), not the whole task.
    #[serde(default)]
    pub batch_only: bool,
}

/// Everything the shim needs to run one task, fully resolved by the agent:
/// paths are expanded and the environment is final.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TaskSpec {
    /// Which task: `job`, `attempt` and `rank` in the file, as before the
    /// key was a type, so a task started by an older agent is re-adopted.
    #[serde(flatten)]
    pub key: TaskKey,
    pub node_rank: u32,
    pub local_rank: u32,
    /// The user, resolved by name on this node.
    pub user: String,
    /// Whether the task may run as uid 0 (off unless the config allows it).
    #[serde(default)]
    pub allow_root: bool,
    pub program: Program,
    /// Absolute working directory.
    pub workdir: PathBuf,
    /// The full environment of the task; nothing else is inherited.
    pub env: Vec<(String, String)>,
    /// Absolute stdout path (opened for append, created by the user).
    pub stdout: PathBuf,
    /// Absolute stderr path; equal to `stdout` when the two are joined.
    pub stderr: PathBuf,
    /// Logical CPUs to pin the task to; empty means `cpu_count` CPUs anywhere.
    #[serde(default)]
    pub cpus: Vec<u32>,
    pub cpu_count: u32,
    /// Memory limit in MiB.
    #[serde(default)]
    pub memory_mb: Option<u64>,
    /// Limit on the number of processes and threads.
    #[serde(default)]
    pub pids_max: Option<u64>,
    #[serde(default)]
    pub time_limit_secs: Option<u64>,
    /// Seconds between SIGTERM and SIGKILL when the task is stopped.
    pub kill_grace_secs: u64,
    #[serde(default)]
    pub signal_before_limit: Option<LimitSignal>,
    /// The user's ids and groups, looked up by the agent: one lookup in a
    /// long-lived process instead of the node's user database (NSS modules
    /// and all) loaded into every shim, as Slurm sends the groups with a
    /// launch. `None`: the shim looks the user up itself.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub identity: Option<Identity>,
    /// How the task's standard streams are connected: with pipes or a
    /// terminal, the shim relays them to clients that attach through
    /// `io.sock` and keeps the output in `stdout`/`stderr` too.
    #[serde(default, skip_serializing_if = "TaskIo::is_files")]
    pub io: TaskIo,
    /// The terminal's first size, rows and columns.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size: Option<(u16, u16)>,
    /// A process started beside a running task (`gpuq exec`): it runs in
    /// that task's cgroup and is stopped when that task ends.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub beside: Option<Beside>,
    /// The image the task runs in, and how (`--container-image`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub container: Option<TaskContainer>,
}

/// What the agent hands the shim about a task's container (in `task.json`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TaskContainer {
    /// The job's (or step's) `--container-*` flags.
    pub spec: crate::model::ContainerSpec,
    /// The OCI runtime the agent found.
    #[serde(default)]
    pub runtime: PathBuf,
    /// The node's image cache (`data_dir/images`).
    #[serde(default)]
    pub cache: PathBuf,
    /// `[agent.containers] cache_max_mb`: the cache's cap; 0: none.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub cache_max_mb: u64,
    /// The task's GPUs by index, whose device nodes go into the container;
    /// empty with simulated GPUs.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub gpus: Vec<u32>,
    /// The task's GPUs as CUDA names them, for finding them in CDI specs:
    /// a MIG instance's `MIG-` UUID, a whole GPU's index; kept with
    /// simulated GPUs too.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub devices: Vec<String>,
    /// `[agent.containers] cdi_spec_dirs`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub cdi_dirs: Vec<PathBuf>,
    /// How the node pulls registry images.
    #[serde(default)]
    pub pull: Pull,
    /// Whether the runtime runs as the task's user in a user namespace
    /// (`[agent.containers] rootless`, where the kernel allows it).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub rootless: bool,
}

/// How a node pulls registry images (`[agent.containers]`), as the agent
/// found it; handed to each container task's shim (`image_tools::pull`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Pull {
    /// The pull tool (skopeo); `None`: this node pulls nothing.
    #[serde(default)]
    pub tool: Option<PathBuf>,
    /// Registries reached over plain HTTP or unverified TLS.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub insecure: Vec<String>,
    /// The credentials file; `None`: the tool's own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auth_file: Option<PathBuf>,
}

/// The running task an exec'd process joins.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Beside {
    /// Its task directory: its `status.json` appearing ends the exec.
    pub dir: PathBuf,
    /// Its cgroup, where it has one.
    #[serde(default)]
    pub cgroup: Option<PathBuf>,
}

/// Who the task runs as.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Identity {
    pub name: String,
    pub uid: u32,
    pub gid: u32,
    /// Supplementary groups, from the node's group database.
    pub groups: Vec<u32>,
}

impl Identity {
    /// Looks `user` up in this node's user and group databases (NSS). Errors
    /// are sentences for the user.
    pub fn lookup(user: &str) -> Result<Identity, String> {
        let found = match nix::unistd::User::from_name(user) {
            Ok(Some(found)) => found,
            Ok(None) => return Err(format!("user {user} not found on node {}", hostname())),
            Err(e) => {
                return Err(format!(
                    "cannot look up user {user} on node {}: {e}",
                    hostname()
                ))
            }
        };
        let name = CString::new(user.as_bytes())
            .map_err(|_| format!("user name {user:?} contains a NUL byte"))?;
        let groups = nix::unistd::getgrouplist(&name, found.gid).map_err(|e| {
            format!(
                "cannot read the groups of user {user} on node {}: {e}",
                hostname()
            )
        })?;
        Ok(Identity {
            name: user.to_string(),
            uid: found.uid.as_raw(),
            gid: found.gid.as_raw(),
            groups: groups.into_iter().map(|g| g.as_raw()).collect(),
        })
    }

    /// The identity, unless it is root and the cluster does not allow that.
    pub fn allowed(self, allow_root: bool) -> Result<Identity, String> {
        if self.uid == 0 && !allow_root {
            return Err(format!(
                "refusing to run the task as {} (uid 0); root tasks are not allowed on this cluster",
                self.name
            ));
        }
        Ok(self)
    }
}

/// This node's name, for messages.
pub fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_else(|_| "(unknown)".to_string())
}

/// Why a task is being stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StopReason {
    /// The job was cancelled (or the shim got SIGTERM without a reason).
    Cancel,
    /// The job was preempted and will be requeued.
    Preempt,
}

impl StopReason {
    /// The word written to the `stop` file.
    pub fn as_str(self) -> &'static str {
        match self {
            StopReason::Cancel => "cancel",
            StopReason::Preempt => "preempt",
        }
    }

    /// Reads the `stop` file's word; anything else counts as a cancel.
    pub fn parse(word: &str) -> StopReason {
        match word.trim() {
            "preempt" => StopReason::Preempt,
            _ => StopReason::Cancel,
        }
    }
}

/// How a task ended, as the shim records it in `status.json`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum TaskOutcome {
    /// Exited with code 0.
    Completed,
    /// Exited non-zero or was killed by a signal it was not sent by us.
    Failed {
        code: Option<i32>,
        signal: Option<i32>,
        reason: String,
    },
    /// Reached its time limit and was stopped.
    Timeout,
    /// Stopped on request.
    Cancelled { reason: StopReason },
    /// The kernel's OOM killer fired in the task's cgroup.
    OutOfMemory,
    /// The user's program never started; the reason names what to fix.
    LaunchFailed { reason: String },
}

impl TaskOutcome {
    /// What the leader is told of this outcome: the failure's words and
    /// which stop it was stay on the node.
    pub fn end(&self) -> TaskEnd {
        match self {
            TaskOutcome::Completed => TaskEnd::Completed,
            TaskOutcome::Failed { code, signal, .. } => TaskEnd::Failed {
                exit_code: *code,
                signal: *signal,
            },
            TaskOutcome::Timeout => TaskEnd::Timeout,
            TaskOutcome::Cancelled { .. } => TaskEnd::Cancelled,
            TaskOutcome::OutOfMemory => TaskEnd::OutOfMemory,
            TaskOutcome::LaunchFailed { reason } => TaskEnd::LaunchFailed {
                reason: reason.clone(),
            },
        }
    }

    /// The exit code in Slurm's sense: the code, or 128 + the signal; none when
    /// the program never ran.
    pub fn exit_code(&self) -> Option<i32> {
        match self {
            TaskOutcome::Completed => Some(0),
            TaskOutcome::Failed { code, signal, .. } => code.or(signal.map(|s| 128 + s)),
            _ => None,
        }
    }
}

/// The `status.json` the shim writes when the task is over.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskStatus {
    pub outcome: TaskOutcome,
    /// When the user's process was started; `None` if it never was.
    pub start_ms: Option<Millis>,
    pub end_ms: Millis,
}

/// A process identified beyond its pid: the start time (clock ticks after
/// boot, from `/proc/<pid>/stat`) rules out a reused pid.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcessId {
    pub pid: u32,
    pub start_ticks: u64,
}

/// The `pid` file: the user's process and the cgroup it runs in.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskPid {
    pub process: ProcessId,
    /// The task's cgroup directory, when it has one.
    #[serde(default)]
    pub cgroup: Option<PathBuf>,
    pub start_ms: Millis,
}

/// How far a written file must survive.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Durability {
    /// An agent or shim crash: the page cache keeps the file, so no fsync.
    /// What only describes running processes (`shim.pid`, `pid`, `stop`)
    /// means nothing after a reboot, and a `status.json` lost with the power
    /// makes the task lost rather than ended (its job follows its requeue
    /// policy), as a task killed by the outage is.
    Crash,
    /// A power loss too (file and directory fsynced): `task.json`, whose
    /// directory is what tells an agent after a reboot that the task was
    /// already started here, so it is reported lost and never run twice.
    PowerLoss,
}

/// Writes `bytes` to `path` (mode 0600) so that readers see the old file or the
/// new one, never a part: a temporary file in the same directory, renamed
/// over the old one (with fsyncs for `Durability::PowerLoss`).
pub fn write_atomic(path: &Path, bytes: &[u8], durability: Durability) -> io::Result<()> {
    let name = path
        .file_name()
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "path has no file name"))?;
    let mut tmp_name = name.to_os_string();
    tmp_name.push(format!(".tmp.{}", std::process::id()));
    let tmp = path.with_file_name(tmp_name);
    let durable = durability == Durability::PowerLoss;
    let result = (|| {
        let mut file = fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&tmp)?;
        file.write_all(bytes)?;
        if durable {
            file.sync_all()?;
        }
        drop(file);
        fs::rename(&tmp, path)?;
        if let Some(dir) = path.parent().filter(|_| durable) {
            fs::File::open(dir)?.sync_all()?;
        }
        Ok(())
    })();
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result
}

/// Reads at most `limit` bytes of a regular file another user may have
/// put there (a rootless runtime's pid file or log): no symlink followed,
/// no FIFO waited on, nothing endless read.
pub fn read_untrusted(path: &Path, limit: u64) -> io::Result<String> {
    use std::io::Read;
    let file = fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(path)?;
    if !file.metadata()?.is_file() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("{} is not a regular file", path.display()),
        ));
    }
    let mut bytes = Vec::new();
    file.take(limit).read_to_end(&mut bytes)?;
    Ok(String::from_utf8_lossy(&bytes).into_owned())
}

/// Serializes `value` as JSON and writes it atomically.
pub fn write_json<T: Serialize>(path: &Path, value: &T, durability: Durability) -> io::Result<()> {
    let bytes = serde_json::to_vec_pretty(value).map_err(io::Error::other)?;
    write_atomic(path, &bytes, durability)
}

/// Reads a JSON file; `Ok(None)` when it does not exist.
pub fn read_json<T: for<'de> Deserialize<'de>>(path: &Path) -> io::Result<Option<T>> {
    match fs::read(path) {
        Ok(bytes) => serde_json::from_slice(&bytes)
            .map(Some)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e)),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

pub use crate::clock::now_ms;

fn is_zero(n: &u64) -> bool {
    *n == 0
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::JobId;

    /// A `task.json` as agents wrote it before the key was a type: a new
    /// agent re-adopting the task must still read it, and unknown fields are
    /// still refused.
    #[test]
    fn a_task_file_of_an_earlier_agent_still_reads() {
        let before = serde_json::json!({
            "job": 7,
            "attempt": 2,
            "rank": 5,
            "node_rank": 1,
            "local_rank": 1,
            "user": "alice",
            "allow_root": false,
            "program": {"Command": {"argv": ["true"]}},
            "workdir": "/tmp",
            "env": [["A", "1"]],
            "stdout": "/tmp/o",
            "stderr": "/tmp/o",
            "cpus": [],
            "cpu_count": 1,
            "memory_mb": null,
            "pids_max": null,
            "time_limit_secs": null,
            "kill_grace_secs": 10,
            "signal_before_limit": null
        });
        let spec: TaskSpec = serde_json::from_value(before.clone()).unwrap();
        assert_eq!(
            spec.key,
            TaskKey {
                job: JobId(7),
                attempt: 2,
                rank: 5,
                step: None,
            }
        );
        assert_eq!(serde_json::to_value(&spec).unwrap(), before);
        let mut unknown = before;
        unknown["surprise"] = serde_json::json!(1);
        assert!(serde_json::from_value::<TaskSpec>(unknown).is_err());
    }

    #[test]
    fn exit_code_follows_slurm() {
        assert_eq!(TaskOutcome::Completed.exit_code(), Some(0));
        let killed = TaskOutcome::Failed {
            code: None,
            signal: Some(9),
            reason: String::new(),
        };
        assert_eq!(killed.exit_code(), Some(137));
        assert_eq!(TaskOutcome::Timeout.exit_code(), None);
    }

    #[test]
    fn write_atomic_replaces_and_leaves_no_temporary() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("status.json");
        write_atomic(&path, b"one", Durability::PowerLoss).unwrap();
        write_atomic(&path, b"two", Durability::Crash).unwrap();
        assert_eq!(fs::read(&path).unwrap(), b"two");
        assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 1);
    }
}
