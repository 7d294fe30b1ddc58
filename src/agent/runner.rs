//! Task runners: what the compute agent's ledger asks of whatever runs its
//! tasks (`TaskRunner`: start, stop, scan, forget, all by `TaskKey`), and the
//! real one, `ExecRunner`. It turns a `DesiredTask` from the leader into a
//! shim's `TaskSpec` (the torchrun env contract, output paths, this rank's
//! share of the node's GPUs, CPUs and memory) and reports the shim's
//! outcomes as `TaskEnd`s. The simulator's runner (`sim::runner`) implements the same
//! trait in memory.
//!
//! A runner reports a task as `Observed`: running, or ended the way the
//! leader records it. That is coarser than what the executor sees of a task
//! directory (`exec::TaskObserved`: the shim's pids, or a shim gone without a
//! status), which `ExecRunner::scan` folds into it: a task nobody will ever
//! report on counts as lost.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use super::exec::env::{gpus_for_local_rank, output_paths, task_env, PatternVars, TaskContext};
use super::exec::{Executor, StopReason, TaskObserved, TaskSpec};
use crate::model::{TaskEnd, TaskKey};
use crate::net::agent_proto::{DesiredTask, StdioRequest};

/// What the runner sees of a task.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Observed {
    Running,
    Ended(TaskEnd),
}

/// Runs tasks on this node: real processes under shims, or simulated ones.
pub trait TaskRunner: Send + Sync + 'static {
    /// Starts a task; an error is a launch failure reported for the rank.
    fn start(&self, task: &DesiredTask) -> Result<(), String>;
    /// Asks a running task to stop (signal, grace, kill).
    fn stop(&self, key: TaskKey);
    /// Asks a running task of a preempted job to stop: its `--signal`
    /// signal and the grace to checkpoint come first.
    fn stop_preempted(&self, key: TaskKey) {
        self.stop(key);
    }
    /// Sends `signal` to a running task's processes (`scancel --signal`).
    fn signal(&self, _key: TaskKey, _signal: i32) {}
    /// Gives a running task a new time limit (seconds from its start;
    /// `None`: none), as `scontrol update TimeLimit=` changed it. A runner
    /// that cannot keeps the one the task started with (the simulated one:
    /// a task's fate is fixed at its start), and the leader still ends a
    /// job past a lowered limit itself.
    fn set_time_limit(&self, _key: TaskKey, _secs: Option<u64>) {}
    /// Every task the runner knows of, running or ended, including tasks
    /// started by an earlier agent process (re-adoption).
    fn scan(&self) -> Vec<(TaskKey, Observed)>;
    /// Drops an ended task whose end was committed.
    fn forget(&self, key: TaskKey);
    /// How many starts may run at once in one reconcile step. Real tasks
    /// start in parallel, so the ranks of a gang on one node start together
    /// rather than one after another (each start writes files and waits for
    /// its shim to detach); in-memory runners gain nothing from threads.
    fn parallel_starts(&self) -> usize {
        1
    }
    /// Where the task's stdout goes, for `gpuq logs`.
    fn output_path(&self, _key: TaskKey) -> Option<std::path::PathBuf> {
        None
    }
    /// Where step tasks without an output file write (see `spool`).
    fn spool_root(&self) -> PathBuf {
        PathBuf::from("spool")
    }
    /// For an interactive stream (`gpuq attach`, `gpuq exec`): the
    /// directory whose `io.sock` the task's shim listens on, once it has
    /// started; for an exec, after starting it beside its task. Blocking.
    fn stdio_dir(&self, _req: &StdioRequest) -> Result<PathBuf, String> {
        Err("this node runs no real processes: nothing to attach to".into())
    }
}

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
    /// What this node has for tasks in container images.
    pub containers: super::exec::container::ContainerHost,
}

/// Builds the shim's spec for one desired task; a step task without an
/// output pattern writes into `spool` for `srun` to stream.
pub fn task_spec(
    t: &DesiredTask,
    allow_root: bool,
    kill_grace_secs: u64,
    spool: &Path,
) -> TaskSpec {
    let per_node = t.ntasks_per_node.max(1);
    let gpus = match t.facts.as_deref() {
        Some(f) => match f.gpus_per_task {
            Some(n) => {
                let start = (t.local_rank as usize).saturating_mul(n as usize);
                t.gpus
                    .get(start..start.saturating_add(n as usize))
                    .map(<[u32]>::to_vec)
                    .unwrap_or_default()
            }
            None if f.all_gpus => t.gpus.clone(),
            None => gpus_for_local_rank(&t.gpus, per_node, t.local_rank),
        },
        None => gpus_for_local_rank(&t.gpus, per_node, t.local_rank),
    };
    let workdir = PathBuf::from(&t.workdir);
    let vars = PatternVars {
        job: t.key.job,
        job_name: &t.job_name,
        rank: t.key.rank,
        node_rank: t.node_rank,
        user: &t.user,
        workdir: &workdir,
        array: t.array.map(|a| (a.array_job, a.index)),
        node: t
            .nodelist
            .get(t.node_rank as usize)
            .map_or("", String::as_str),
        step: t.key.step,
    };
    let (stdout, stderr) = if t.key.step.is_some() && t.output.is_none() {
        (
            super::spool::path(spool, t.key, false),
            super::spool::path(spool, t.key, true),
        )
    } else {
        output_paths(t.output.as_deref(), t.error.as_deref(), &vars)
    };
    let ctx = TaskContext {
        job: t.key.job,
        job_name: &t.job_name,
        restart_count: t.key.attempt,
        submit_dir: &t.workdir,
        nodes: &t.nodelist,
        node_rank: t.node_rank,
        ntasks_per_node: per_node,
        local_rank: t.local_rank,
        gpus: &gpus,
        master_addr: &t.master_addr,
        master_port: t.master_port,
        array: t.array.map(|a| (a.array_job, a.index)),
        facts: t.facts.as_deref(),
        node_gpus: &t.gpus,
        step: t.key.step,
    };
    let mut env = task_env(&t.env, &ctx);
    if !t.gpu_devices.is_empty() {
        mig_visible_devices(&mut env, t, &gpus);
    }
    let share = |n: u64| (n / u64::from(per_node)).max(1);
    TaskSpec {
        key: t.key,
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
        io: t.facts.as_deref().map(|f| f.io).unwrap_or_default(),
        size: None,
        beside: None,
        container: t
            .container
            .clone()
            .map(|spec| super::exec::task::TaskContainer {
                spec,
                runtime: PathBuf::new(),
                cache: PathBuf::new(),
                cache_max_mb: 0,
                gpus: gpus.clone(),
                devices: gpus
                    .iter()
                    .map(|g| {
                        let at = t.gpus.iter().position(|x| x == g);
                        at.and_then(|at| t.gpu_devices.get(at))
                            .cloned()
                            .unwrap_or_else(|| g.to_string())
                    })
                    .collect(),
                cdi_dirs: Vec::new(),
                pull: Default::default(),
                rootless: false,
            }),
    }
}

/// Points `CUDA_VISIBLE_DEVICES` at the task's MIG instances: CUDA selects
/// an instance only by its `MIG-` UUID, never by an index.
fn mig_visible_devices(env: &mut [(String, String)], t: &DesiredTask, gpus: &[u32]) {
    let mut names: Vec<&str> = Vec::new();
    for name in gpus.iter().filter_map(|g| {
        let at = t.gpus.iter().position(|x| x == g)?;
        t.gpu_devices.get(at).map(String::as_str)
    }) {
        // Two slots of one time-shared GPU name the GPU once.
        if !names.contains(&name) {
            names.push(name);
        }
    }
    for (k, v) in env.iter_mut() {
        if k == "CUDA_VISIBLE_DEVICES" {
            *v = names.join(",");
        }
    }
}

impl TaskRunner for ExecRunner {
    fn start(&self, task: &DesiredTask) -> Result<(), String> {
        let spool = self.spool_root();
        let mut spec = task_spec(task, self.allow_root, self.kill_grace_secs, &spool);
        if let Some(user) = &self.run_as {
            spec.user = user.clone();
        }
        if let Some(c) = spec.container.as_mut() {
            let as_root = self.run_as.is_none() && nix::unistd::geteuid().is_root();
            self.containers.complete(c, as_root)?;
        }
        if task.key.step.is_some() && task.output.is_none() {
            let owner = nix::unistd::User::from_name(&spec.user)
                .ok()
                .flatten()
                .filter(|_| nix::unistd::Uid::effective().is_root())
                .map(|u| (u.uid.as_raw(), u.gid.as_raw()));
            super::spool::prepare(&spool, task.key.job, owner).map_err(|e| {
                format!(
                    "cannot make the step's spool under {}: {e}",
                    spool.display()
                )
            })?;
        }
        self.executor.start(&spec).map_err(|e| e.to_string())
    }

    fn stop(&self, key: TaskKey) {
        if let Err(e) = self.executor.stop(key, StopReason::Cancel) {
            tracing::debug!(job = key.job.0, rank = key.rank, "stop: {e}");
        }
    }

    fn stop_preempted(&self, key: TaskKey) {
        if let Err(e) = self.executor.stop(key, StopReason::Preempt) {
            tracing::debug!(task = %key, "stop: {e}");
        }
    }

    fn set_time_limit(&self, key: TaskKey, secs: Option<u64>) {
        if let Err(e) = self.executor.set_time_limit(key, secs) {
            tracing::debug!(task = %key, ?secs, "time limit: {e}");
        }
    }

    fn signal(&self, key: TaskKey, signal: i32) {
        if let Err(e) = self.executor.signal(key, signal) {
            tracing::debug!(task = %key, signal, "signal: {e}");
        }
    }

    fn scan(&self) -> Vec<(TaskKey, Observed)> {
        self.executor.sweep_execs();
        let mut ended = self.ended.lock().unwrap_or_else(|e| e.into_inner());
        let keys = self.executor.task_keys();
        let live: HashSet<crate::model::JobId> = keys.iter().map(|k| k.job).collect();
        super::spool::sweep(&self.spool_root(), &live);
        super::spool::sweep(&self.containers.named_root(), &live);
        // A directory removed behind our back leaves nothing cached.
        let listed: HashSet<TaskKey> = keys.iter().copied().collect();
        ended.retain(|key, _| listed.contains(key));
        keys.into_iter()
            .map(|key| {
                if let Some(end) = ended.get(&key) {
                    return (key, Observed::Ended(end.clone()));
                }
                let observed = match self.executor.observe(key) {
                    TaskObserved::Running { .. } => Observed::Running,
                    TaskObserved::Ended(status) => Observed::Ended(status.outcome.end()),
                    // The shim is gone without a status (killed, or its
                    // directory damaged): nothing will ever report this
                    // task, so it counts as lost and its job moves on.
                    TaskObserved::Unknown { reason } => {
                        tracing::warn!(task = %key, %reason, "task lost");
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
        match self.executor.forget(key) {
            Ok(()) => {
                self.ended
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .remove(&key);
            }
            Err(e) => tracing::debug!(job = key.job.0, rank = key.rank, "forget: {e}"),
        }
    }

    fn spool_root(&self) -> PathBuf {
        super::spool::root_beside(&self.executor.root)
    }

    fn stdio_dir(&self, req: &StdioRequest) -> Result<PathBuf, String> {
        let dir = self.executor.task_dir(req.task);
        let task_file = dir.join(super::exec::task::TASK_FILE);
        // Not there yet: an attach waits for the task to start.
        if let Ok(Some(spec)) = super::exec::task::read_json::<TaskSpec>(&task_file) {
            if self.run_as.is_none() && spec.user != req.user {
                return Err(format!(
                    "task {} on this node runs as {}, not as the job's user {}",
                    req.task, spec.user, req.user
                ));
            }
            if req.exec.is_none() && !spec.io.is_interactive() {
                return Err(format!(
                    "task {} writes its output to files, not to a terminal or pipes",
                    req.task
                ));
            }
        }
        match &req.exec {
            None => Ok(dir),
            Some(exec) => self
                .executor
                .start_beside(req.task, exec)
                .map_err(|e| e.to_string()),
        }
    }

    fn output_path(&self, key: TaskKey) -> Option<PathBuf> {
        let dir = self.executor.task_dir(key);
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

#[cfg(test)]
mod tests {
    use super::task_spec;
    use crate::model::{JobId, Program, TaskKey};
    use crate::net::agent_proto::DesiredTask;

    fn task(local_rank: u32, gpus: &[u32], devices: &[&str]) -> DesiredTask {
        DesiredTask {
            key: TaskKey::of_job(JobId(7), 0, local_rank),
            node_rank: 0,
            local_rank,
            ntasks_per_node: 2,
            num_nodes: 1,
            nodelist: vec!["n1".into()],
            user: "alice".into(),
            job_name: "j".into(),
            program: Program::Command {
                argv: vec!["true".into()],
            },
            workdir: "/tmp".into(),
            env: vec![("CUDA_VISIBLE_DEVICES".into(), "9".into())],
            output: None,
            error: None,
            gpus: gpus.to_vec(),
            cpus: vec![],
            cpu_count: 2,
            memory_mb: 1024,
            time_limit_secs: None,
            master_addr: "127.0.0.1".into(),
            master_port: 29500,
            signal: None,
            array: None,
            kill_grace_secs: None,
            facts: None,
            health: None,
            container: None,
            gpu_devices: devices.iter().map(|d| d.to_string()).collect(),
        }
    }

    fn visible(t: &DesiredTask) -> String {
        let spec = task_spec(t, false, 5, std::path::Path::new("/tmp/spool"));
        let found: Vec<&String> = spec
            .env
            .iter()
            .filter(|(k, _)| k == "CUDA_VISIBLE_DEVICES")
            .map(|(_, v)| v)
            .collect();
        assert_eq!(found.len(), 1, "{:?}", spec.env);
        found[0].clone()
    }

    #[test]
    fn each_rank_sees_its_share_of_mig_instances_by_uuid() {
        let devices = ["MIG-aaa", "MIG-bbb"];
        assert_eq!(visible(&task(0, &[8, 9], &devices)), "MIG-aaa");
        assert_eq!(visible(&task(1, &[8, 9], &devices)), "MIG-bbb");
        // Whole GPUs keep their indices.
        assert_eq!(visible(&task(1, &[2, 3], &[])), "3");
    }
}
