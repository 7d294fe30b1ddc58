//! Running tasks on this node: the agent-side `Executor` and the `gpuq shim`
//! that parents each task.
//!
//! Each task has a directory `<root>/<job>.<attempt>.<rank>/` (see `task` for
//! its files). The agent writes `task.json` and starts a shim, detached in its
//! own session (spawned, then forked by itself: the shim is nobody's zombie
//! and the agent never copies its own memory, see `spawn`); the shim runs
//! the task as the user, in a cgroup where the node has cgroup v2, and writes
//! `status.json` when it is over. Because all state lives in those
//! directories, an agent that restarts calls `scan()` and re-adopts what runs:
//! liveness is the shim's pid *and* its start time, so a reused pid is never
//! taken for a live shim.
//!
//! The root and task directories are 0711: the task (running as its user)
//! must reach its `script`, but nobody lists or reads the others' specs.

mod bundle;
pub mod cdi;
mod cdi_yaml;
mod cgroup;
pub mod container;
mod container_exec;
mod container_host;
mod container_mounts;
pub mod context;
pub mod env;
mod fork;
mod image;
mod image_archive;
mod image_auth;
mod image_cache;
mod image_files;
mod image_sif;
mod image_tools;
mod launch;
mod named;
mod process;
mod shim;
pub mod slurm_env;
mod spawn;
mod stdio;
pub mod task;
mod tree;
mod unpack;

use std::fs;
use std::io;
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};

use nix::sys::signal::{kill, killpg, Signal};
use nix::unistd::Pid;

pub use cgroup::CgroupMode;
pub use shim::shim_main;
pub use spawn::serve as serve_shims;
pub use task::{
    Identity, LimitSignal, ProcessId, StopReason, TaskOutcome, TaskPid, TaskSpec, TaskStatus,
};

use crate::model::TaskKey;
use crate::net::stdio::ExecSpec;
use cgroup::TaskCgroup;
use task::{
    read_json, write_atomic, write_json, Durability, LIMIT_FILE, PID_FILE, SHIM_LOG_FILE,
    SHIM_PID_FILE, STATUS_FILE, STOP_FILE, TASK_FILE,
};

/// The directory under the root that holds exec directories.
const EXEC_DIR: &str = "exec";

/// What the executor can see of a task.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TaskObserved {
    /// The shim runs; `pid` is the user's process once it was started.
    Running { shim_pid: u32, pid: Option<u32> },
    /// The shim wrote the final status.
    Ended(TaskStatus),
    /// No live shim and no status: the shim died (or never started); the
    /// reason says what is known.
    Unknown { reason: String },
}

/// An executor operation failed; each message names the task or the file.
#[derive(Debug, thiserror::Error)]
pub enum ExecError {
    #[error("task {key} was already started on this node ({} exists)", dir.display())]
    AlreadyStarted { key: TaskKey, dir: PathBuf },
    #[error("no task {key} on this node")]
    NoSuchTask { key: TaskKey },
    #[error("task {key} is not running on this node (it has not started, or it has ended)")]
    NotRunning { key: TaskKey },
    #[error("task {key} is still running; stop it before forgetting it")]
    StillRunning { key: TaskKey },
    #[error("cannot {action} {}: {source}", path.display())]
    Io {
        action: &'static str,
        path: PathBuf,
        source: io::Error,
    },
    #[error("cannot start the shim {}: {source}", program.display())]
    SpawnShim { program: PathBuf, source: io::Error },
}

fn io_err(action: &'static str, path: &Path) -> impl FnOnce(io::Error) -> ExecError {
    let path = path.to_path_buf();
    move |source| ExecError::Io {
        action,
        path,
        source,
    }
}

/// Starts, stops and finds tasks under `root`.
#[derive(Clone, Debug)]
pub struct Executor {
    /// Where task directories live, e.g. `/var/lib/gpuq/tasks`.
    pub root: PathBuf,
    /// The binary run as `<shim_program> shim --task-dir DIR` (usually
    /// `std::env::current_exe()`).
    pub shim_program: PathBuf,
    /// Its `shim --serve` process, shared by the executor's clones.
    shims: std::sync::Arc<spawn::Launcher>,
}

impl Executor {
    /// An executor; logs once, at warn level, when tasks will run without
    /// resource limits on this node.
    pub fn new(root: PathBuf, shim_program: PathBuf) -> Executor {
        CgroupMode::detect().warn_if_degraded();
        let shims = std::sync::Arc::new(spawn::Launcher::new(shim_program.clone()));
        Executor {
            root,
            shim_program,
            shims,
        }
    }

    /// The pid of the shim launcher (`gpuq shim --serve`), while one runs.
    pub fn shim_launcher(&self) -> Option<u32> {
        self.shims.pid()
    }

    /// The directory of a task: `<root>/<job>.<attempt>.<rank>`, the key's
    /// text, which `task_keys` parses back.
    pub fn task_dir(&self, key: TaskKey) -> PathBuf {
        self.root.join(key.to_string())
    }

    /// Creates the task directory, writes `task.json` and starts the shim
    /// detached. Does not wait for the task. Starting a key twice is refused,
    /// so a repeated desired state never runs a task twice.
    pub fn start(&self, spec: &TaskSpec) -> Result<(), ExecError> {
        let key = spec.key;
        let dir = self.task_dir(key);
        if !self.root.exists() {
            fs::DirBuilder::new()
                .recursive(true)
                .mode(0o711)
                .create(&self.root)
                .map_err(io_err("create the task root", &self.root))?;
        }
        match fs::DirBuilder::new().mode(0o711).create(&dir) {
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                return Err(ExecError::AlreadyStarted { key, dir })
            }
            other => other.map_err(io_err("create the task directory", &dir))?,
        }
        // Nothing half-made stays behind to block a retry.
        self.launch(spec, &dir).inspect_err(|_| {
            let _ = fs::remove_dir_all(&dir);
        })
    }

    fn launch(&self, spec: &TaskSpec, dir: &Path) -> Result<(), ExecError> {
        let key = spec.key;
        // The umask may have narrowed the mode given to mkdir.
        fs::set_permissions(dir, fs::Permissions::from_mode(0o711))
            .map_err(io_err("set the mode of", dir))?;
        // The user is looked up here, once per task in this long-lived
        // process; a user this cannot find is left to the shim, which fails
        // the task with the reason.
        let resolved;
        let mut spec = spec;
        if spec.identity.is_none() {
            if let Ok(identity) = Identity::lookup(&spec.user) {
                resolved = TaskSpec {
                    identity: Some(identity),
                    ..spec.clone()
                };
                spec = &resolved;
            }
        }
        let task_file = dir.join(TASK_FILE);
        write_json(&task_file, spec, Durability::PowerLoss).map_err(io_err("write", &task_file))?;
        let log_path = dir.join(SHIM_LOG_FILE);
        let shim_pid = self
            .shims
            .spawn(dir, &log_path)
            .map_err(|source| ExecError::SpawnShim {
                program: self.shim_program.clone(),
                source,
            })?;
        match process::identify(shim_pid) {
            // The shim writes this too, first thing; whichever comes first
            // lets `scan` tell a starting shim from a dead one.
            Some(shim) => {
                let _ = write_json(&dir.join(SHIM_PID_FILE), &shim, Durability::Crash);
            }
            None => tracing::debug!(task = %key, "the shim exited before its pid was recorded"),
        }
        tracing::info!(task = %key, user = %spec.user, "task handed to the shim");
        Ok(())
    }

    /// Where processes started beside tasks (`gpuq exec`) have their
    /// directories: under the root, in a directory no task key names.
    pub fn exec_root(&self) -> PathBuf {
        self.root.join(EXEC_DIR)
    }

    /// Starts `exec` beside the running task `key`, under a shim of its own
    /// (in the task's cgroup, as its user, with its environment and CPUs;
    /// see `TaskSpec::beside`), and returns the exec's directory, whose
    /// `io.sock` its client connects to. Its output is kept in that
    /// directory, which `sweep_execs` removes once it has ended.
    pub fn start_beside(&self, key: TaskKey, exec: &ExecSpec) -> Result<PathBuf, ExecError> {
        let target_dir = self.task_dir(key);
        let task_file = target_dir.join(TASK_FILE);
        let target: TaskSpec = read_json(&task_file)
            .map_err(io_err("read", &task_file))?
            .ok_or(ExecError::NoSuchTask { key })?;
        let TaskObserved::Running { pid: Some(_), .. } = self.observe(key) else {
            return Err(ExecError::NotRunning { key });
        };
        let cgroup = read_json::<TaskPid>(&target_dir.join(PID_FILE))
            .ok()
            .flatten()
            .and_then(|p| p.cgroup);
        let root = self.exec_root();
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&root)
            .map_err(io_err("create the exec root", &root))?;
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir = root.join(format!(
            "{key}.x{}.{}.{n}",
            task::now_ms(),
            std::process::id()
        ));
        fs::DirBuilder::new()
            .mode(0o700)
            .create(&dir)
            .map_err(io_err("create the exec directory", &dir))?;
        let mut env = target.env.clone();
        if exec.pty {
            env.retain(|(k, _)| k != "TERM");
            env.push(("TERM".into(), exec.term.clone().unwrap_or("xterm".into())));
        }
        let spec = TaskSpec {
            program: crate::model::Program::Command {
                argv: exec.argv.clone(),
            },
            env,
            stdout: dir.join("stdout"),
            stderr: dir.join("stderr"),
            memory_mb: None,
            pids_max: None,
            time_limit_secs: None,
            signal_before_limit: None,
            io: if exec.pty {
                crate::model::TaskIo::Pty
            } else {
                crate::model::TaskIo::Pipes
            },
            size: exec.size,
            beside: Some(task::Beside {
                dir: target_dir,
                cgroup,
            }),
            ..target
        };
        self.launch(&spec, &dir).inspect_err(|_| {
            let _ = fs::remove_dir_all(&dir);
        })?;
        Ok(dir)
    }

    /// Removes the directories of execs that ended a while ago (their
    /// client has had their exit), and kills what is left of any whose
    /// shim died.
    pub fn sweep_execs(&self) {
        let Ok(entries) = fs::read_dir(self.exec_root()) else {
            return;
        };
        let keep = std::time::Duration::from_secs(30);
        for dir in entries.filter_map(|e| Some(e.ok()?.path())) {
            let status = dir.join(STATUS_FILE);
            let gone = match fs::metadata(&status) {
                Ok(m) => m
                    .modified()
                    .is_ok_and(|t| t.elapsed().is_ok_and(|e| e > keep)),
                // A shim that died without a status, or one that never
                // started (no `shim.pid` a while after the directory).
                Err(_) => {
                    live_shim(&dir).is_none()
                        && fs::metadata(&dir)
                            .and_then(|m| m.modified())
                            .is_ok_and(|t| t.elapsed().is_ok_and(|e| e > keep))
                }
            };
            if gone {
                if !status.exists() {
                    kill_orphaned_task(&dir);
                }
                let _ = fs::remove_dir_all(&dir);
            }
        }
    }

    /// Asks a task to stop: the reason goes to the `stop` file and the shim
    /// gets SIGTERM; it signals the task, waits the grace time and kills it.
    /// A task that already ended is left alone. When the shim is gone, what
    /// is left of the task is killed here.
    pub fn stop(&self, key: TaskKey, reason: StopReason) -> Result<(), ExecError> {
        let dir = self.task_dir(key);
        if !dir.is_dir() {
            return Err(ExecError::NoSuchTask { key });
        }
        if dir.join(STATUS_FILE).exists() {
            return Ok(());
        }
        let stop_file = dir.join(STOP_FILE);
        write_atomic(&stop_file, reason.as_str().as_bytes(), Durability::Crash)
            .map_err(io_err("write", &stop_file))?;
        match live_shim(&dir) {
            Some(shim) => {
                let _ = kill(Pid::from_raw(shim.pid as i32), Signal::SIGTERM);
            }
            None => kill_orphaned_task(&dir),
        }
        Ok(())
    }

    /// Sends `signal` to a running task's process group (the task leads
    /// its own session, so this reaches what it started too).
    /// Changes a running task's time limit (seconds from its start; `None`:
    /// none): its shim reads the new one within a tick.
    pub fn set_time_limit(&self, key: TaskKey, secs: Option<u64>) -> Result<(), ExecError> {
        let dir = self.task_dir(key);
        if !dir.is_dir() {
            return Err(ExecError::NoSuchTask { key });
        }
        let text = secs.map_or_else(|| "none".to_string(), |s| s.to_string());
        let file = dir.join(LIMIT_FILE);
        write_atomic(&file, text.as_bytes(), Durability::Crash).map_err(io_err("write", &file))
    }

    pub fn signal(&self, key: TaskKey, signal: i32) -> Result<(), ExecError> {
        let TaskObserved::Running { pid: Some(pid), .. } = self.observe(key) else {
            return Err(ExecError::NoSuchTask { key });
        };
        let signal = Signal::try_from(signal).map_err(|e| ExecError::Io {
            action: "send signal to",
            path: self.task_dir(key),
            source: io::Error::other(e),
        })?;
        let group = Pid::from_raw(-(pid as i32));
        if kill(group, signal).is_err() {
            let _ = kill(Pid::from_raw(pid as i32), signal);
        }
        Ok(())
    }

    /// What is known about one task.
    pub fn observe(&self, key: TaskKey) -> TaskObserved {
        let dir = self.task_dir(key);
        let ended = || match read_json::<TaskStatus>(&dir.join(STATUS_FILE)) {
            Ok(Some(status)) => Some(Ok(status)),
            Ok(None) => None,
            Err(e) => Some(Err(format!(
                "{} is unreadable: {e}",
                dir.join(STATUS_FILE).display()
            ))),
        };
        match ended() {
            Some(Ok(status)) => return TaskObserved::Ended(status),
            Some(Err(reason)) => return TaskObserved::Unknown { reason },
            None => {}
        }
        if let Some(shim) = live_shim(&dir) {
            let pid = read_json::<TaskPid>(&dir.join(PID_FILE))
                .ok()
                .flatten()
                .map(|p| p.process.pid);
            return TaskObserved::Running {
                shim_pid: shim.pid,
                pid,
            };
        }
        // The shim may have written its status and exited just now.
        match ended() {
            Some(Ok(status)) => TaskObserved::Ended(status),
            Some(Err(reason)) => TaskObserved::Unknown { reason },
            None => TaskObserved::Unknown {
                reason: unknown_reason(&dir),
            },
        }
    }

    /// Every task directory under the root and what is known about it; how an
    /// agent that restarted finds its running tasks again.
    pub fn scan(&self) -> Vec<(TaskKey, TaskObserved)> {
        self.task_keys()
            .into_iter()
            .map(|k| (k, self.observe(k)))
            .collect()
    }

    /// The keys of every task directory under the root, sorted.
    pub fn task_keys(&self) -> Vec<TaskKey> {
        let Ok(entries) = fs::read_dir(&self.root) else {
            return Vec::new();
        };
        let mut keys: Vec<TaskKey> = entries
            .filter_map(|e| {
                let e = e.ok()?;
                e.file_type().ok()?.is_dir().then_some(())?;
                e.file_name().to_str()?.parse().ok()
            })
            .collect();
        keys.sort();
        keys
    }

    /// Removes a task's directory once its outcome was reported. A task whose
    /// shim still runs is refused; one whose shim died has its leftovers
    /// killed first.
    pub fn forget(&self, key: TaskKey) -> Result<(), ExecError> {
        let dir = self.task_dir(key);
        if !dir.is_dir() {
            return Ok(());
        }
        if live_shim(&dir).is_some() {
            return Err(ExecError::StillRunning { key });
        }
        if !dir.join(STATUS_FILE).exists() {
            kill_orphaned_task(&dir);
        }
        fs::remove_dir_all(&dir).map_err(io_err("remove", &dir))
    }
}

/// The task's shim, if it still runs.
fn live_shim(dir: &Path) -> Option<ProcessId> {
    let shim: ProcessId = read_json(&dir.join(SHIM_PID_FILE)).ok().flatten()?;
    process::is_running(&shim).then_some(shim)
}

/// Says what is known of a task whose shim is gone without a status.
fn unknown_reason(dir: &Path) -> String {
    let log = dir.join(SHIM_LOG_FILE).display().to_string();
    let shim: Option<ProcessId> = read_json(&dir.join(SHIM_PID_FILE)).ok().flatten();
    let task: Option<TaskPid> = read_json(&dir.join(PID_FILE)).ok().flatten();
    match (shim, task) {
        (None, _) => format!("the shim never recorded its pid (see {log})"),
        (Some(shim), Some(task)) if process::is_running(&task.process) => format!(
            "the shim (pid {}) is gone without a status while the task (pid {}) still runs \
             (see {log})",
            shim.pid, task.process.pid
        ),
        (Some(shim), _) => format!(
            "the shim (pid {}) is gone without a status (see {log})",
            shim.pid
        ),
    }
}

/// Kills what is left of a task whose shim is gone: its cgroup and, if its
/// pid is still the same process, its process group.
fn kill_orphaned_task(dir: &Path) {
    let Ok(Some(task)) = read_json::<TaskPid>(&dir.join(PID_FILE)) else {
        return;
    };
    if process::is_running(&task.process) {
        let _ = killpg(Pid::from_raw(task.process.pid as i32), Signal::SIGKILL);
    }
    if let Some(path) = task.cgroup {
        let cgroup = TaskCgroup::at(path);
        for _ in 0..100 {
            if cgroup.is_empty() {
                break;
            }
            cgroup.kill_all();
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        let _ = cgroup.remove();
    }
}
