//! Job runs in the replicated state: applying a scheduling pass (each
//! allocation checked again against the nodes as they are now, and given a
//! MASTER_PORT), the task starts and ends agents report, and how a job
//! ends. A job whose rank fails (or that is cancelled) goes COMPLETING while
//! its other ranks are stopped, and reaches its final state once every rank
//! has ended, so its GPUs are never handed out while a rank may still hold
//! them.

use std::collections::hash_map::Entry;
use std::collections::{BTreeMap, HashMap};

use super::{CommandResult, Dirty, State};
use crate::model::{
    Allocation, GpuUse, JobId, JobRun, JobState, Millis, RequeuePolicy, TaskEnd, TaskEvent,
    TaskEventKind,
};
use crate::sched::NodeView;

/// The host part of `host:port` (IPv6 brackets removed).
pub fn host_of(addr: &str) -> String {
    match addr.rsplit_once(':') {
        Some((h, _)) => h.trim_start_matches('[').trim_end_matches(']').to_string(),
        None => addr.to_string(),
    }
}

impl State {
    /// Ports used as MASTER_PORT by active jobs whose rank 0 is on `node`.
    fn master_ports_in_use(&self, node: &str) -> std::collections::BTreeSet<u16> {
        self.jobs_on(node)
            .filter(|j| j.state.is_active())
            .filter_map(|j| j.run.as_ref())
            .filter(|r| r.allocation.nodes.first().is_some_and(|n| n.node == node))
            .flat_map(|r| std::iter::once(r.master_port).chain(r.named_ports.values().copied()))
            .collect()
    }

    pub(super) fn apply_schedule(
        &mut self,
        allocations: &[Allocation],
        now: Millis,
        dirty: &mut Dirty,
    ) -> CommandResult {
        let mut started = Vec::new();
        let mut skipped = Vec::new();
        // The nodes as this command's allocations find them: the index's
        // views (in step with the state before the command), and a copy of
        // each node an accepted allocation charged. Building every view
        // afresh and scanning them by name cost about 90 ms a pass's plan on
        // 10,000 nodes, on every server.
        let mut charged: HashMap<String, NodeView> = HashMap::new();
        // Ports given out by this command (the index catches up after it).
        let mut ports_given: Vec<(String, u16)> = Vec::new();
        for alloc in allocations {
            let Some(job) = self.jobs.get(&alloc.job) else {
                skipped.push((alloc.job, "no such job".to_string()));
                continue;
            };
            if job.state != JobState::Pending {
                skipped.push((alloc.job, format!("job is {}", job.state)));
                continue;
            }
            let pending = crate::sched::PendingJob::from(job);
            let view_of = |name: &str| {
                charged
                    .get(name)
                    .or_else(|| self.index.node_views.get(name))
            };
            if let Err(why) = crate::sched::check_allocation_by(view_of, alloc, &pending) {
                skipped.push((alloc.job, why));
                continue;
            }
            let Some(first) = alloc.nodes.first() else {
                skipped.push((alloc.job, "empty allocation".to_string()));
                continue;
            };
            let master_addr = self
                .nodes
                .get(&first.node)
                .map(|n| host_of(&n.addr))
                .unwrap_or_default();
            let mut used = self.master_ports_in_use(&first.node);
            used.extend(
                ports_given
                    .iter()
                    .filter(|(n, _)| *n == first.node)
                    .map(|(_, p)| *p),
            );
            let kill_grace_secs = self
                .policy
                .qos(
                    job.spec
                        .qos
                        .as_deref()
                        .unwrap_or(crate::model::policy::DEFAULT_QOS),
                )
                .and_then(|q| q.grace_secs);
            let range = self.master_ports();
            let Some(master_port) = range.ports().find(|p| !used.contains(p)) else {
                skipped.push((
                    alloc.job,
                    format!(
                        "no free MASTER_PORT on {}: all {} ports of the cluster's range {range} \
                         are taken by running jobs whose rank 0 is there",
                        first.node,
                        range.len()
                    ),
                ));
                continue;
            };
            ports_given.push((first.node.clone(), master_port));
            // A service replica's named ports, chosen the same way.
            let names = job
                .replica_of
                .as_ref()
                .and_then(|r| self.services.get(&r.service))
                .map_or(&[][..], |s| &s.ports[..]);
            let mut named_ports = BTreeMap::new();
            for name in names {
                used.insert(master_port);
                used.extend(named_ports.values().copied());
                let Some(port) = range.ports().find(|p| !used.contains(p)) else {
                    break;
                };
                named_ports.insert(name.clone(), port);
            }
            if named_ports.len() < names.len() {
                ports_given.pop();
                skipped.push((
                    alloc.job,
                    format!(
                        "no free ports on {} for the {} named ports of its service: the \
                         cluster's range {range} is taken by running jobs there",
                        first.node,
                        names.len()
                    ),
                ));
                continue;
            }
            ports_given.extend(named_ports.values().map(|p| (first.node.clone(), *p)));
            let port_count = 1 + named_ports.len() as u32;
            for (rank, na) in alloc.nodes.iter().enumerate() {
                let view = match charged.entry(na.node.clone()) {
                    Entry::Occupied(e) => e.into_mut(),
                    Entry::Vacant(e) => match self.index.node_views.get(&na.node) {
                        Some(v) => e.insert(v.clone()),
                        None => continue,
                    },
                };
                view.used.charge(na);
                // Rank 0 holds one of the node's MASTER_PORTs (and a
                // replica's named ports).
                if rank == 0 {
                    view.used.master_ports += port_count;
                }
            }
            if let Some(job) = self.jobs.get_mut(&alloc.job) {
                // A `--gpus N` job runs in the shape the pass chose (checked
                // above: equal GPUs per node, N in all); the rest of the state,
                // the agents and the CLI read it from the spec. A requeue
                // re-chooses, since `total_gpus` stays the request.
                if job.spec.total_gpus.is_some() {
                    job.spec.nodes = alloc.nodes.len() as u32;
                    job.spec.gpus_per_node = first.gpus.len() as u32;
                }
                // So does an elastic job, at the size the pass started it.
                if job.spec.placement.elastic.is_some() {
                    job.spec.nodes = alloc.nodes.len() as u32;
                }
                let charged_milli_gpus = job
                    .spec
                    .placement
                    .gpu_slice
                    .as_deref()
                    .is_some_and(crate::model::share::is_shared)
                    .then(|| super::share::milli_gpus(&self.nodes, alloc));
                job.run = Some(JobRun {
                    // Every attempt has its own number: requeues and
                    // elastic resizes both start one.
                    attempt: job.restart_count + job.resizes.len() as u32,
                    allocation: alloc.clone().into(),
                    master_addr,
                    master_port,
                    started: Default::default(),
                    ended: BTreeMap::new(),
                    final_state: None,
                    requeue: false,
                    kill_grace_secs,
                    preempted_for: None,
                    limit_changed: false,
                    renewed_at: None,
                    gpu_use: BTreeMap::new(),
                    named_ports,
                    resize: None,
                    charged_milli_gpus,
                    // An allocation asked for with its first step (`srun`
                    // outside one) starts that step with the job.
                    steps: job
                        .spec
                        .first_step
                        .as_ref()
                        .map(|spec| crate::model::Step {
                            id: 0,
                            spec: (**spec).clone(),
                            start_time: now,
                            end_time: None,
                            time_limit_secs: job.spec.time_limit_secs,
                            started: Default::default(),
                            ended: Default::default(),
                            cancelled: false,
                        })
                        .into_iter()
                        .collect(),
                });
                job.reason = None;
                job.exit_code = None;
            }
            self.transition(alloc.job, JobState::Running, now, dirty);
            started.push(alloc.job);
        }
        CommandResult::Scheduled { started, skipped }
    }

    /// Starts ending a job: a pending one ends now; a running one goes
    /// COMPLETING until its ranks have stopped, then ends in `final_state`,
    /// or goes back to the queue when its requeue policy says so for this
    /// cause. Returns whether it changed.
    pub(super) fn begin_ending(
        &mut self,
        id: JobId,
        final_state: JobState,
        reason: String,
        now: Millis,
        dirty: &mut Dirty,
    ) -> bool {
        let Some(job) = self.jobs.get_mut(&id) else {
            return false;
        };
        let requeue = job.restart_count < job.spec.max_restarts
            && match job.spec.requeue {
                RequeuePolicy::Never => false,
                RequeuePolicy::OnNodeFailure => final_state == JobState::NodeFail,
                RequeuePolicy::Always => {
                    matches!(final_state, JobState::NodeFail | JobState::Failed)
                }
            };
        match job.state {
            JobState::Pending => {
                job.reason = Some(reason);
                self.transition(id, final_state, now, dirty)
            }
            JobState::Running => {
                job.reason = Some(reason);
                if let Some(run) = job.run.as_mut() {
                    run.final_state = Some(final_state);
                    run.requeue = requeue;
                }
                self.transition(id, JobState::Completing, now, dirty);
                self.finish_if_all_ended(id, now, dirty);
                true
            }
            _ => false,
        }
    }

    /// Moves a COMPLETING (or RUNNING) job to its final state once every rank
    /// of its attempt has ended; a job to be requeued goes back to PENDING
    /// with the same id, `restart_count + 1` and its old submit time (so it
    /// is at the head of the queue).
    pub(super) fn finish_if_all_ended(&mut self, id: JobId, now: Millis, dirty: &mut Dirty) {
        let Some(job) = self.jobs.get(&id) else {
            return;
        };
        let Some(run) = job.run.as_ref() else {
            return;
        };
        if !run.all_ended(job.spec.launched_tasks()) {
            return;
        }
        if run.resize.is_some() && job.state == JobState::Running {
            self.finish_resize(id, now, dirty);
            return;
        }
        if run.requeue {
            if self.transition(id, JobState::Pending, now, dirty) {
                if let Some(job) = self.jobs.get_mut(&id) {
                    job.restart_count += 1;
                    job.start_time = None;
                    job.exit_code = None;
                    job.reason = job.reason.take().map(|r| format!("requeued after: {r}"));
                }
            }
            return;
        }
        let next = run.final_state.unwrap_or(JobState::Completed);
        if next == JobState::Completed {
            if let Some(job) = self.jobs.get_mut(&id) {
                job.exit_code = Some(0);
            }
        }
        self.transition(id, next, now, dirty);
    }

    pub(super) fn apply_task_events(
        &mut self,
        node: &str,
        events: &[TaskEvent],
        gpu_use: &[(JobId, GpuUse)],
        now: Millis,
        dirty: &mut Dirty,
    ) -> CommandResult {
        // Before the ends: the last one may archive the job.
        for (id, use_) in gpu_use {
            let Some(run) = self.jobs.get_mut(id).and_then(|j| j.run.as_mut()) else {
                continue;
            };
            if run.allocation.nodes.iter().any(|n| n.node == node) {
                run.gpu_use.insert(node.to_string(), *use_);
                dirty.jobs.insert(*id);
            }
        }
        let mut applied = 0;
        for ev in events {
            if ev.key.step.is_some() {
                applied += u32::from(self.apply_step_event(node, ev, now, dirty));
                continue;
            }
            let Some(job) = self.jobs.get_mut(&ev.key.job) else {
                continue;
            };
            let total = job.spec.launched_tasks();
            let per_node = job.spec.ntasks_per_node;
            let Some(run) = job.run.as_mut() else {
                continue;
            };
            // Reports of an older attempt, an unknown rank, or from a node
            // that does not hold the rank change nothing.
            if !job.state.is_active()
                || run.attempt != ev.key.attempt
                || u64::from(ev.key.rank) >= total
                || run.node_of_rank(ev.key.rank, per_node) != Some(node)
            {
                continue;
            }
            match &ev.kind {
                TaskEventKind::Started => {
                    if run.started.insert(ev.key.rank) {
                        applied += 1;
                        dirty.jobs.insert(ev.key.job);
                    }
                }
                TaskEventKind::Ended(end) => {
                    if run.ended.contains_key(&ev.key.rank) {
                        continue;
                    }
                    run.ended.insert(ev.key.rank, end.clone());
                    applied += 1;
                    dirty.jobs.insert(ev.key.job);
                    let state = job.state;
                    // Ranks stopped for an elastic resize end as asked.
                    let resizing = run.resize.is_some();
                    if resizing {
                        self.finish_if_all_ended(ev.key.job, now, dirty);
                    } else if state == JobState::Running && *end != TaskEnd::Completed {
                        job.exit_code = Some(end.exit_code());
                        let reason =
                            format!("rank {} on node {node} {}", ev.key.rank, end.describe());
                        self.begin_ending(ev.key.job, end.job_state(), reason, now, dirty);
                    } else {
                        self.end_if_own_tasks_done(ev.key.job, now, dirty);
                        self.finish_if_all_ended(ev.key.job, now, dirty);
                    }
                }
            }
        }
        CommandResult::TaskEventsApplied { applied }
    }
}
