//! Job steps in the replicated state: starting one in a running job's
//! allocation, stopping one, the task events of its tasks, and releasing an
//! allocation job (`salloc` left, `srun` done). A step's tasks never end the
//! job: a failing step is the batch script's business, as in Slurm. The job
//! waits for its steps' tasks only when it ends, so no GPU is handed out
//! while a step task may still hold it.

use super::{CommandResult, Dirty, Rejection, State};
use crate::model::{
    JobId, JobState, Launch, Millis, Step, StepSpec, TaskEnd, TaskEvent, TaskEventKind, MAX_STEPS,
};

impl State {
    /// The running job `id` that `by` may start steps in or release.
    fn own_running_job(
        &self,
        id: JobId,
        by: &str,
        admin: bool,
    ) -> Result<&crate::model::Job, Rejection> {
        let job = self.jobs.get(&id).ok_or(Rejection::NoSuchJob(id))?;
        if !admin && job.user != by {
            return Err(Rejection::NotOwner {
                id,
                owner: job.user.clone(),
            });
        }
        if job.state != JobState::Running || job.run.is_none() {
            return Err(Rejection::NotRunning {
                id,
                state: job.state,
            });
        }
        Ok(job)
    }

    /// The running allocation `id` that `by` may release or keep alive
    /// (`what`: "is released", "is kept alive by its client").
    fn own_allocation(
        &self,
        id: JobId,
        by: &str,
        admin: bool,
        what: &str,
    ) -> Result<(), Rejection> {
        let job = self.own_running_job(id, by, admin)?;
        if job.spec.launch != Launch::Allocation {
            return Err(Rejection::InvalidSpec(format!(
                "job {id} runs its own program; only an allocation (salloc, srun, gpuq run) \
                 {what} (use scancel to stop it)"
            )));
        }
        Ok(())
    }

    pub(super) fn start_step(
        &mut self,
        by: &str,
        admin: bool,
        id: JobId,
        spec: &StepSpec,
        now: Millis,
        dirty: &mut Dirty,
    ) -> Result<CommandResult, Rejection> {
        let job = self.own_running_job(id, by, admin)?;
        spec.check(job.spec.nodes).map_err(Rejection::InvalidSpec)?;
        let remaining = job.spec.time_limit_secs.map(|limit| {
            let used = now.saturating_sub(job.start_time.unwrap_or(now)) / 1000;
            limit.saturating_sub(used).max(1)
        });
        let Some(run) = self.jobs.get_mut(&id).and_then(|j| j.run.as_mut()) else {
            return Err(Rejection::NoSuchJob(id));
        };
        if run.steps.len() >= MAX_STEPS {
            return Err(Rejection::InvalidSpec(format!(
                "job {id} has started {MAX_STEPS} steps, the most one run may; \
                 submit a new job for more"
            )));
        }
        let step = run.steps.len() as u32;
        run.steps.push(Step {
            id: step,
            spec: spec.clone(),
            start_time: now,
            end_time: None,
            time_limit_secs: remaining,
            started: Default::default(),
            ended: Default::default(),
            cancelled: false,
        });
        dirty.jobs.insert(id);
        Ok(CommandResult::StepStarted { step })
    }

    pub(super) fn cancel_step(
        &mut self,
        by: &str,
        admin: bool,
        id: JobId,
        step: u32,
        dirty: &mut Dirty,
    ) -> Result<CommandResult, Rejection> {
        self.own_running_job(id, by, admin)?;
        let Some(s) = self
            .jobs
            .get_mut(&id)
            .and_then(|j| j.run.as_mut())
            .and_then(|r| r.steps.get_mut(step as usize))
        else {
            return Err(Rejection::NoSuchStep { id, step });
        };
        if !s.is_over() && !s.cancelled {
            s.cancelled = true;
            dirty.jobs.insert(id);
        }
        Ok(CommandResult::StepCancelled)
    }

    /// Ends an allocation: the job completes once its steps have stopped.
    pub(super) fn release(
        &mut self,
        by: &str,
        admin: bool,
        id: JobId,
        now: Millis,
        dirty: &mut Dirty,
    ) -> Result<CommandResult, Rejection> {
        self.own_allocation(id, by, admin, "is released")?;
        self.begin_ending(
            id,
            JobState::Completed,
            "the allocation was released".into(),
            now,
            dirty,
        );
        Ok(CommandResult::Released)
    }

    /// Records that the client holding allocation `id` is still there.
    pub(super) fn keep_alive(
        &mut self,
        by: &str,
        admin: bool,
        id: JobId,
        now: Millis,
        dirty: &mut Dirty,
    ) -> Result<CommandResult, Rejection> {
        self.own_allocation(id, by, admin, "is kept alive by its client")?;
        if let Some(run) = self.jobs.get_mut(&id).and_then(|j| j.run.as_mut()) {
            run.renewed_at = Some(run.renewed_at.map_or(now, |t| t.max(now)));
            dirty.jobs.insert(id);
        }
        Ok(CommandResult::KeptAlive)
    }

    /// Ends, as TIMEOUT, the allocations among `jobs` whose client stopped
    /// renewing them `limit_secs` before `now`.
    pub(super) fn release_inactive(
        &mut self,
        jobs: &[JobId],
        now: Millis,
        limit_secs: u64,
        dirty: &mut Dirty,
    ) -> CommandResult {
        let mut ids = Vec::new();
        for &id in jobs {
            let inactive = self
                .jobs
                .get(&id)
                .is_some_and(|j| past_inactive_limit(j, now, limit_secs));
            if inactive {
                let why = format!(
                    "its interactive client stopped renewing it ({limit_secs} s without a word: \
                     the client was killed, or lost its network)"
                );
                if self.begin_ending(id, JobState::Timeout, why, now, dirty) {
                    ids.push(id);
                }
            }
        }
        CommandResult::Expired { ids }
    }

    /// Ends, as TIMEOUT, the jobs among `jobs` past a limit no shim keeps
    /// (allocations, and limits lowered while running).
    pub(super) fn expire(
        &mut self,
        jobs: &[JobId],
        now: Millis,
        dirty: &mut Dirty,
    ) -> CommandResult {
        let mut ids = Vec::new();
        for &id in jobs {
            if self
                .jobs
                .get(&id)
                .is_some_and(|j| super::update::past_limit_unwatched(j, now))
            {
                let why = "it reached its time limit".to_string();
                if self.begin_ending(id, JobState::Timeout, why, now, dirty) {
                    ids.push(id);
                }
            }
        }
        CommandResult::Expired { ids }
    }

    /// Applies one task event of a step task (`ev.key.step` is set) from
    /// `node`; returns whether it changed anything.
    pub(super) fn apply_step_event(
        &mut self,
        node: &str,
        ev: &TaskEvent,
        now: Millis,
        dirty: &mut Dirty,
    ) -> bool {
        let Some(step_id) = ev.key.step else {
            return false;
        };
        let Some(job) = self.jobs.get_mut(&ev.key.job) else {
            return false;
        };
        let per_node = job.spec.ntasks_per_node;
        let Some(run) = job.run.as_mut() else {
            return false;
        };
        if !job.state.is_active()
            || run.attempt != ev.key.attempt
            || run.node_of_task(&ev.key, per_node) != Some(node)
        {
            return false;
        }
        let Some(step) = run.steps.get_mut(step_id as usize) else {
            return false;
        };
        match &ev.kind {
            TaskEventKind::Started => {
                if !step.started.insert(ev.key.rank) {
                    return false;
                }
            }
            TaskEventKind::Ended(end) => {
                if step.ended.contains_key(&ev.key.rank) {
                    return false;
                }
                step.ended.insert(ev.key.rank, end.clone());
                let bad = !matches!(end, TaskEnd::Completed | TaskEnd::Cancelled);
                if bad && step.spec.kill_on_bad_exit {
                    step.cancelled = true;
                }
                if step.all_ended() {
                    step.end_time = Some(now);
                    // Only the end matters from now on: the environment
                    // can be large and a job may run many steps.
                    step.spec.env = Vec::new();
                }
            }
        }
        dirty.jobs.insert(ev.key.job);
        if job.state == JobState::Completing {
            self.finish_if_all_ended(ev.key.job, now, dirty);
        }
        true
    }

    /// When a job's own tasks have all ended while steps still run (a batch
    /// script that left `srun`s behind), the job ends as its tasks did:
    /// its steps are stopped first.
    pub(super) fn end_if_own_tasks_done(&mut self, id: JobId, now: Millis, dirty: &mut Dirty) {
        let Some(job) = self.jobs.get(&id) else {
            return;
        };
        let launched = job.spec.launched_tasks();
        let Some(run) = job.run.as_ref() else {
            return;
        };
        if job.state == JobState::Running
            && launched > 0
            && run.ended.len() as u64 >= launched
            && !run.all_ended(launched)
        {
            let reason = match job.spec.launch {
                Launch::Batch => "the batch script ended; its steps are stopped",
                _ => "the job's tasks ended; its steps are stopped",
            };
            self.begin_ending(id, JobState::Completed, reason.into(), now, dirty);
        }
    }

    /// Marks every unended task of `run`'s steps on `node` lost.
    pub(super) fn lose_step_tasks(
        run: &mut crate::model::JobRun,
        node: &str,
        reason: &str,
        now: Millis,
    ) {
        let nodes = run.node_names();
        for step in &mut run.steps {
            for rank in 0..step.spec.ntasks() {
                let on_node = step
                    .spec
                    .place(rank)
                    .and_then(|(i, _)| step.spec.nodes.get(i))
                    .and_then(|&nr| nodes.get(nr as usize))
                    .is_some_and(|n| n == node);
                if on_node && !step.ended.contains_key(&rank) {
                    step.ended.insert(
                        rank,
                        TaskEnd::Lost {
                            reason: reason.to_string(),
                        },
                    );
                }
            }
            if step.end_time.is_none() && step.all_ended() {
                step.end_time = Some(now);
            }
        }
    }
}

/// Whether the leader releases allocation `job` at `now`: its client (an
/// allocation always has one: salloc, srun, gpuq run) has not renewed it
/// for `limit_secs` since it started or last renewed it (0: never).
pub fn past_inactive_limit(job: &crate::model::Job, now: Millis, limit_secs: u64) -> bool {
    let Some(run) = job.run.as_ref() else {
        return false;
    };
    let Some(since) = run.renewed_at.or(job.start_time) else {
        return false;
    };
    job.state == JobState::Running
        && job.spec.launch == Launch::Allocation
        && limit_secs > 0
        && now >= since.saturating_add(limit_secs.saturating_mul(1000))
}
