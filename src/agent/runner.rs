//! The real task runner: turns a `DesiredTask` from the leader into a shim's
//! `TaskSpec` (the torchrun env contract, output paths, this rank's share of
//! the node's GPUs, CPUs and memory) and maps shim outcomes to `TaskEnd`.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use super::compute::{Observed, TaskKey, TaskRunner};
use super::exec::env::{gpus_for_local_rank, output_paths, task_env, PatternVars, TaskContext};
use super::exec::{Executor, StopReason, TaskObserved, TaskOutcome, TaskSpec};
use crate::model::{JobId, TaskEnd};
use crate::net::agent_proto::DesiredTask;

/// Runs tasks as real processes under `gpuq shim`.
pub struct ExecRunner {
    pub executor: Executor,
    pub allow_root: bool,
    pub kill_grace_secs: u64,
    /// Run every task as this user instead of the submitter (`gpuq dev`
    /// started by an unprivileged user, who cannot switch users).
    pub run_as: Option<String>,
    /// Ends already read from a task's `status.json` (an end never changes),
    /// so each reconcile reads only the directories of running tasks.
    pub ended: Mutex<HashMap<TaskKey, TaskEnd>>,
}

fn exec_key(key: TaskKey) -> super::exec::TaskKey {
    super::exec::TaskKey {
        job: JobId(key.0),
        attempt: key.1,
        rank: key.2,
    }
}

/// Maps the shim's outcome to the replicated state's words.
pub fn task_end(outcome: &TaskOutcome) -> TaskEnd {
    match outcome {
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

/// Builds the shim's spec for one desired task.
pub fn task_spec(t: &DesiredTask, allow_root: bool, kill_grace_secs: u64) -> TaskSpec {
    let per_node = t.ntasks_per_node.max(1);
    let gpus = gpus_for_local_rank(&t.gpus, per_node, t.local_rank);
    let workdir = PathBuf::from(&t.workdir);
    let vars = PatternVars {
        job: t.job,
        job_name: &t.job_name,
        rank: t.rank,
        node_rank: t.node_rank,
        user: &t.user,
        workdir: &workdir,
    };
    let (stdout, stderr) = output_paths(t.output.as_deref(), t.error.as_deref(), &vars);
    let ctx = TaskContext {
        job: t.job,
        job_name: &t.job_name,
        restart_count: t.attempt,
        submit_dir: &t.workdir,
        nodes: &t.nodelist,
        node_rank: t.node_rank,
        ntasks_per_node: per_node,
        local_rank: t.local_rank,
        gpus: &gpus,
        master_addr: &t.master_addr,
        master_port: t.master_port,
        array: t.array.map(|a| (a.array_job, a.index)),
    };
    let env = task_env(&t.env, &ctx);
    let share = |n: u64| (n / u64::from(per_node)).max(1);
    TaskSpec {
        job: t.job,
        attempt: t.attempt,
        rank: t.rank,
        node_rank: t.node_rank,
        local_rank: t.local_rank,
        user: t.user.clone(),
        allow_root,
        program: t.program.clone(),
        workdir,
        env,
        stdout,
        stderr,
        cpus: t.cpus.clone(),
        cpu_count: share(u64::from(t.cpu_count)) as u32,
        memory_mb: (t.memory_mb > 0).then(|| share(t.memory_mb)),
        pids_max: None,
        time_limit_secs: t.time_limit_secs,
        kill_grace_secs: t.kill_grace_secs.unwrap_or(kill_grace_secs),
        signal_before_limit: t.signal.map(|s| crate::agent::exec::LimitSignal {
            signal: s.signal,
            secs_before: s.secs_before,
            batch_only: s.batch_only,
        }),
        identity: None,
    }
}

impl TaskRunner for ExecRunner {
    fn start(&self, task: &DesiredTask) -> Result<(), String> {
        let mut spec = task_spec(task, self.allow_root, self.kill_grace_secs);
        if let Some(user) = &self.run_as {
            spec.user = user.clone();
        }
        self.executor.start(&spec).map_err(|e| e.to_string())
    }

    fn stop(&self, key: TaskKey) {
        if let Err(e) = self.executor.stop(exec_key(key), StopReason::Cancel) {
            tracing::debug!(job = key.0, rank = key.2, "stop: {e}");
        }
    }

    fn scan(&self) -> Vec<(TaskKey, Observed)> {
        let mut ended = self.ended.lock().unwrap_or_else(|e| e.into_inner());
        let keys = self.executor.task_keys();
        // A directory removed behind our back leaves nothing cached.
        let listed: HashSet<TaskKey> = keys.iter().map(|k| (k.job.0, k.attempt, k.rank)).collect();
        ended.retain(|key, _| listed.contains(key));
        keys.into_iter()
            .map(|k| {
                let key = (k.job.0, k.attempt, k.rank);
                if let Some(end) = ended.get(&key) {
                    return (key, Observed::Ended(end.clone()));
                }
                let observed = match self.executor.observe(k) {
                    TaskObserved::Running { .. } => Observed::Running,
                    TaskObserved::Ended(status) => Observed::Ended(task_end(&status.outcome)),
                    // The shim is gone without a status (killed, or its
                    // directory damaged): nothing will ever report this
                    // task, so it counts as lost and its job moves on.
                    TaskObserved::Unknown { reason } => {
                        tracing::warn!(task = %k, %reason, "task lost");
                        Observed::Ended(TaskEnd::Lost { reason })
                    }
                };
                if let Observed::Ended(end) = &observed {
                    ended.insert(key, end.clone());
                }
                (key, observed)
            })
            .collect()
    }

    fn parallel_starts(&self) -> usize {
        8
    }

    fn forget(&self, key: TaskKey) {
        match self.executor.forget(exec_key(key)) {
            Ok(()) => {
                self.ended
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .remove(&key);
            }
            Err(e) => tracing::debug!(job = key.0, rank = key.2, "forget: {e}"),
        }
    }

    fn output_path(&self, key: TaskKey) -> Option<PathBuf> {
        let dir = self.executor.task_dir(exec_key(key));
        let spec: TaskSpec = super::exec::task::read_json(&dir.join(super::exec::task::TASK_FILE))
            .ok()
            .flatten()?;
        Some(spec.stdout)
    }
}

/// The task directory root under an agent's data dir.
pub fn tasks_root(data_dir: &Path) -> PathBuf {
    data_dir.join("tasks")
}
