//! What each node's agent is told to run, built from committed state only:
//! the job's own tasks (every rank, or a batch script on the first node, or
//! none for an allocation; see `Launch`), the tasks of its live steps, and
//! beside them the tasks that are to stop but never reported an end.

use crate::model::{Job, JobRun, JobState, Launch, NodeAllocation, Step, TaskKey};
use crate::net::agent_proto::{DesiredTask, TaskFacts};
use crate::state::State;

/// The tasks on `node` that are to stop and have not reported an end: all
/// of its ending (COMPLETING) jobs' tasks there, and those of cancelled
/// steps. An agent that never had one of them reports it ended.
pub fn stopping_tasks(state: &State, node: &str) -> Vec<TaskKey> {
    let mut out = Vec::new();
    for job in state.jobs_on(node) {
        if !job.state.is_active() {
            continue;
        }
        let Some(run) = &job.run else { continue };
        let Some(node_rank) = run.allocation.nodes.iter().position(|n| n.node == node) else {
            continue;
        };
        let node_rank = node_rank as u32;
        // Ending, or stopping every rank for an elastic resize.
        let ending = job.state == JobState::Completing || run.resize.is_some();
        // A node an elastic job is growing into has none of its ranks yet.
        if ending && node_rank < job.spec.nodes {
            let per_node = job.spec.ntasks_per_node.max(1);
            for local_rank in job.spec.launch.local_ranks(node_rank, per_node) {
                let rank = node_rank * per_node + local_rank;
                if !run.ended.contains_key(&rank) {
                    out.push(TaskKey::of_job(job.id, run.attempt, rank));
                }
            }
        }
        for step in &run.steps {
            if step.is_over() || !(ending || step.cancelled) {
                continue;
            }
            for rank in step_ranks_on(step, node_rank) {
                if !step.ended.contains_key(&rank) {
                    out.push(step_key(job, run, step, rank));
                }
            }
        }
    }
    out.sort();
    out
}

/// The jobs on `node` being preempted (COMPLETING for another job).
pub fn preempted_jobs(state: &State, node: &str) -> Vec<crate::model::JobId> {
    let mut out: Vec<_> = state
        .jobs_on(node)
        .filter(|j| j.state == JobState::Completing)
        .filter(|j| j.run.as_ref().is_some_and(|r| r.preempted_for.is_some()))
        .map(|j| j.id)
        .collect();
    out.sort();
    out
}

/// The tasks `node` should run, as sent to its agent. Tasks that already
/// ended are left out, so a task is never started twice in one attempt.
pub fn desired_tasks(state: &State, node: &str) -> Vec<DesiredTask> {
    let cluster = state
        .cluster
        .as_ref()
        .map(|c| c.name.clone())
        .unwrap_or_default();
    let mut out = Vec::new();
    for (job, node_rank) in state.desired_on(node) {
        let Some(run) = &job.run else { continue };
        let Some(na) = run.allocation.nodes.get(node_rank as usize) else {
            continue;
        };
        let per_node = job.spec.ntasks_per_node.max(1);
        let job_nodes = run.node_names();
        let devices = gpu_devices(state, node, na);
        let shared = shared_slots(state, node, na);
        let facts = TaskFacts {
            ntasks: job.spec.total_tasks() as u32,
            first_rank: node_rank * per_node,
            tasks_per_node: vec![per_node; job_nodes.len()],
            job_nodelist: job_nodes.clone(),
            cpus_per_task: job.spec.cpus_per_task,
            all_gpus: job.spec.launch != Launch::Ranks,
            gpus_per_task: None,
            partition: job.spec.partition.clone().unwrap_or_default(),
            account: job.spec.account.clone().unwrap_or_default(),
            qos: job.spec.qos.clone().unwrap_or_default(),
            cluster: cluster.clone(),
            submit_host: job.spec.submit_host.clone().unwrap_or_default(),
            array_span: job.array.and_then(|a| a.span),
            io: Default::default(),
            elastic: job.spec.placement.elastic,
        };
        for local_rank in job.spec.launch.local_ranks(node_rank, per_node) {
            let rank = node_rank * per_node + local_rank;
            if run.ended.contains_key(&rank) {
                continue;
            }
            let mut task = base_task(job, run, na, TaskKey::of_job(job.id, run.attempt, rank));
            task.gpu_devices = devices.clone();
            push_shared(&mut task.env, shared);
            task.node_rank = node_rank;
            task.local_rank = local_rank;
            task.ntasks_per_node = per_node;
            if job.spec.launch == Launch::Batch {
                // The batch script is one task with the node to itself; of
                // `--signal`, it gets only a `B:` one, as Slurm's.
                task.ntasks_per_node = 1;
                task.signal = job.spec.signal.filter(|s| s.batch_only);
            }
            task.nodelist = job_nodes.clone();
            task.num_nodes = job.spec.nodes;
            task.facts = Some(Box::new(facts.clone()));
            if rank == 0 {
                task.health = job
                    .replica_of
                    .as_ref()
                    .and_then(|r| state.services.get(&r.service)?.health.clone());
            }
            out.push(task);
        }
        for step in run.steps.iter().filter(|s| !s.cancelled && !s.is_over()) {
            let Some(i) = step.spec.nodes.iter().position(|&n| n == node_rank) else {
                continue;
            };
            let step_nodes: Vec<String> = step
                .spec
                .nodes
                .iter()
                .filter_map(|&n| job_nodes.get(n as usize).cloned())
                .collect();
            let first = step.spec.first_rank(i);
            for rank in step_ranks_on(step, node_rank) {
                if step.ended.contains_key(&rank) {
                    continue;
                }
                let mut task = base_task(job, run, na, step_key(job, run, step, rank));
                task.gpu_devices = devices.clone();
                task.node_rank = i as u32;
                task.local_rank = rank - first;
                task.ntasks_per_node = step.spec.tasks[i];
                task.nodelist = step_nodes.clone();
                task.num_nodes = step_nodes.len() as u32;
                task.program = step.spec.program.clone();
                task.workdir = step.spec.workdir.clone();
                task.env = step.spec.env.clone();
                push_shared(&mut task.env, shared);
                task.output = step.spec.output.clone();
                task.error = step.spec.error.clone();
                task.time_limit_secs = step.time_limit_secs;
                if step.spec.container.is_some() {
                    task.container = step.spec.container.clone();
                }
                // The batch script alone gets `--signal B:`; steps get the
                // rest, as Slurm's.
                task.signal = job.spec.signal.filter(|s| !s.batch_only);
                if let Some(first_node) = step_nodes.first() {
                    if let Some(rec) = state.nodes.get(first_node) {
                        task.master_addr = crate::state::host_of(&rec.addr);
                    }
                }
                task.facts = Some(Box::new(TaskFacts {
                    ntasks: step.spec.ntasks(),
                    first_rank: first,
                    tasks_per_node: step.spec.tasks.clone(),
                    cpus_per_task: step.spec.cpus_per_task,
                    all_gpus: true,
                    gpus_per_task: step.spec.gpus_per_task,
                    io: step.spec.io,
                    ..facts.clone()
                }));
                out.push(task);
            }
        }
    }
    out
}

/// The ranks of `step` on the job's node `node_rank`.
fn step_ranks_on(step: &Step, node_rank: u32) -> std::ops::Range<u32> {
    step.spec.ranks_on(node_rank)
}

fn step_key(job: &Job, run: &JobRun, step: &Step, rank: u32) -> TaskKey {
    TaskKey {
        job: job.id,
        attempt: run.attempt,
        rank,
        step: Some(step.id),
    }
}

/// A task of `job` on the node of `na`, with the job's own program and
/// placement; the caller sets where it sits.
fn base_task(job: &Job, run: &JobRun, na: &NodeAllocation, key: TaskKey) -> DesiredTask {
    DesiredTask {
        key,
        node_rank: 0,
        local_rank: 0,
        ntasks_per_node: 1,
        num_nodes: job.spec.nodes,
        nodelist: Vec::new(),
        user: job.user.clone(),
        job_name: job.spec.name.clone(),
        program: job.spec.program.clone(),
        workdir: job.spec.workdir.clone(),
        env: replica_env(job, run),
        output: job.spec.output.clone(),
        error: job.spec.error.clone(),
        gpus: na.gpus.clone(),
        cpus: na.cpus.clone(),
        cpu_count: na.cpu_count,
        memory_mb: na.memory_mb,
        time_limit_secs: time_left(job),
        master_addr: run.master_addr.clone(),
        master_port: run.master_port,
        signal: job.spec.signal,
        array: job.array,
        kill_grace_secs: run.kill_grace_secs,
        facts: None,
        health: None,
        container: job.spec.container.clone(),
        gpu_devices: Vec::new(),
    }
}

/// The job's time limit for its tasks: an elastic job restarted at a new
/// size has only what was left of it when the resize began (the limit
/// counts from the job's start, not the attempt's).
fn time_left(job: &Job) -> Option<u64> {
    let limit = job.spec.time_limit_secs?;
    let used_ms = match (job.start_time, job.resizes.last()) {
        (Some(start), Some(r)) if r.at >= start => r.at - start,
        _ => 0,
    };
    Some(limit.saturating_sub(used_ms / 1000).max(1))
}

/// [`DesiredTask::gpu_devices`] for `na` on `node`: empty unless some of
/// its GPUs are MIG instances.
fn gpu_devices(state: &State, node: &str, na: &NodeAllocation) -> Vec<String> {
    let Some(inv) = state.nodes.get(node).map(|n| &n.inventory) else {
        return Vec::new();
    };
    let entry = |i: u32| inv.gpus.iter().find(|g| g.index == i);
    if !na
        .gpus
        .iter()
        .any(|&i| entry(i).is_some_and(|g| g.mig.is_some()))
    {
        return Vec::new();
    }
    na.gpus
        .iter()
        .map(|&i| match entry(i) {
            // A time-shared GPU's slot: CUDA sees the GPU itself.
            Some(g) if crate::model::share::slots_of(g).is_some() => g.physical_index().to_string(),
            Some(g) if g.mig.is_some() => g.uuid.clone(),
            _ => i.to_string(),
        })
        .collect()
}

/// The slot count of the time-shared GPUs `na` holds slots of on `node`
/// (the largest, should they differ), `None` when it holds none.
fn shared_slots(state: &State, node: &str, na: &NodeAllocation) -> Option<u8> {
    let inv = &state.nodes.get(node)?.inventory;
    na.gpus
        .iter()
        .filter_map(|&i| inv.gpus.iter().find(|g| g.index == i))
        .filter_map(crate::model::share::slots_of)
        .max()
}

/// Tells a task on a time-shared GPU that it shares (`GPUQ_GPU_SHARED=N`).
fn push_shared(env: &mut Vec<(String, String)>, slots: Option<u8>) {
    if let Some(n) = slots {
        env.push((crate::model::share::SHARED_ENV.to_string(), n.to_string()));
    }
}

/// A task's environment from its spec; a service replica's also says which
/// service and index it serves, and the port it should listen on (`PORT`:
/// its job's port, unique among the jobs on its first node), and its named
/// ports (`PORT_<NAME>`, as unique).
fn replica_env(job: &crate::model::Job, run: &JobRun) -> Vec<(String, String)> {
    let mut env = job.spec.env.clone();
    if let Some(r) = &job.replica_of {
        env.push(("GPUQ_SERVICE".into(), r.service.clone()));
        env.push(("GPUQ_REPLICA".into(), r.index.to_string()));
        env.push(("PORT".into(), run.master_port.to_string()));
        for (name, port) in &run.named_ports {
            env.push((crate::model::port_env(name), port.to_string()));
        }
    }
    env
}

#[cfg(test)]
mod tests {
    use super::time_left;
    use crate::model::{Job, JobId, JobSpec, ResizeRecord};

    #[test]
    fn a_resized_job_gets_what_was_left_of_its_limit() {
        let spec: JobSpec = serde_json::from_value(serde_json::json!({
            "name": "j", "nodes": 2, "ntasks_per_node": 1, "gpus_per_node": 0,
            "cpus_per_task": 1, "mem_per_node_mb": null, "time_limit_secs": 600,
            "account": null, "partition": null, "output": null, "error": null,
            "workdir": "/tmp", "env": [], "program": {"Command": {"argv": ["true"]}}
        }))
        .unwrap();
        let mut job = Job::pending(JobId(1), "alice", spec, 0);
        job.start_time = Some(1_000);
        assert_eq!(time_left(&job), Some(600));
        job.resizes.push(ResizeRecord {
            at: 241_000,
            attempt: 1,
            from_nodes: 2,
            to_nodes: 4,
            from_gpus: 0,
            to_gpus: 0,
            why: String::new(),
        });
        assert_eq!(time_left(&job), Some(360));
        job.spec.time_limit_secs = None;
        assert_eq!(time_left(&job), None);
    }
}
