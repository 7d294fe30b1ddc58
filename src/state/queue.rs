//! Queue control in apply: submitting jobs and arrays, holds and releases,
//! and resolving the names users give jobs (`12`, `12_3`).
//!
//! An array (`--array 0-99%8`) is one `Submit` command and one log entry; apply
//! expands it into one task job per index, with consecutive ids from the job
//! counter. The first task's id is the array job id (Slurm's `ArrayJobId`), so
//! `12` names the whole array and `12_3` the task with index 3. Each task is
//! an ordinary job for the scheduler, dispatch and requeue; its `array` field
//! says which array and index it is, and the `%N` throttle travels in it.

use super::{Dirty, Rejection, State};
use crate::model::{ArrayTask, Job, JobId, JobRef, JobSpec, JobState, Millis};

impl State {
    /// Queues `spec` for `user`: one job, or one per array index. Returns the
    /// job id (the array job id for an array).
    pub(super) fn submit(
        &mut self,
        user: &str,
        spec: &JobSpec,
        now: Millis,
        dirty: &mut Dirty,
    ) -> Result<JobId, Rejection> {
        let spec = self.admit(user, spec)?;
        Ok(self.queue_admitted(user, &spec, now, dirty))
    }

    /// Queues many jobs for `user`, all or none: every spec is checked
    /// before any is queued, and the first refused one refuses the batch,
    /// naming its index. Returns the job ids in order (array job ids for
    /// arrays).
    pub(super) fn submit_many(
        &mut self,
        user: &str,
        specs: &[JobSpec],
        now: Millis,
        dirty: &mut Dirty,
    ) -> Result<Vec<JobId>, Rejection> {
        if specs.is_empty() {
            return Err(Rejection::EmptyBatch);
        }
        let admitted = specs
            .iter()
            .enumerate()
            .map(|(index, spec)| {
                self.admit(user, spec).map_err(|why| Rejection::InBatch {
                    index,
                    why: Box::new(why),
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(admitted
            .iter()
            .map(|spec| self.queue_admitted(user, spec, now, dirty))
            .collect())
    }

    /// Everything that may refuse a submission, changing nothing: the spec's
    /// invariants, its dependencies and the policy. Returns the spec with the
    /// policy's defaults (account, QoS, partition) filled in.
    pub(super) fn admit(&self, user: &str, spec: &JobSpec) -> Result<JobSpec, Rejection> {
        spec.check_invariants().map_err(Rejection::InvalidSpec)?;
        self.check_dependencies(&spec.queue.dependency)
            .map_err(Rejection::UnknownDependency)?;
        if spec
            .queue
            .array
            .as_ref()
            .is_some_and(|a| a.indices.is_empty())
        {
            return Err(Rejection::InvalidSpec("the array has no indices".into()));
        }
        let mut spec = spec.clone();
        self.policy
            .resolve(user, &mut spec)
            .map_err(Rejection::Policy)?;
        Ok(spec)
    }

    /// Queues an admitted spec: one job, or one per array index. Cannot fail,
    /// so a batch that was admitted whole is queued whole.
    pub(super) fn queue_admitted(
        &mut self,
        user: &str,
        spec: &JobSpec,
        now: Millis,
        dirty: &mut Dirty,
    ) -> JobId {
        let base = JobId(self.counters.next_job_id);
        let new_job = |id: JobId, spec: JobSpec, array: Option<ArrayTask>| Job {
            array,
            ..Job::pending(id, user, spec, now)
        };
        match &spec.queue.array {
            None => {
                self.jobs.insert(base, new_job(base, spec.clone(), None));
                dirty.jobs.insert(base);
                self.counters.next_job_id += 1;
            }
            Some(array) => {
                // Each task carries its index, not the whole list.
                let mut task_spec = spec.clone();
                task_spec.queue.array = None;
                for (i, &index) in array.indices.iter().enumerate() {
                    let id = JobId(base.0 + i as u64);
                    let task = ArrayTask {
                        array_job: base,
                        index,
                        throttle: array.throttle,
                        span: Some((
                            array.indices.len() as u32,
                            array.indices.first().copied().unwrap_or(0),
                            array.indices.last().copied().unwrap_or(0),
                        )),
                    };
                    self.jobs
                        .insert(id, new_job(id, task_spec.clone(), Some(task)));
                    dirty.jobs.insert(id);
                }
                self.counters.next_job_id += array.indices.len() as u64;
            }
        }
        dirty.meta = true;
        base
    }

    /// The job ids `r` names: `12_3` the task with index 3 of array 12; `12`
    /// every task of array 12 for which `keep` holds, or job 12.
    pub fn resolve(&self, r: JobRef, keep: impl Fn(&Job) -> bool) -> Result<Vec<JobId>, String> {
        let head = self.jobs.get(&r.id);
        let is_array = head.is_some_and(|j| j.array.is_some_and(|a| a.array_job == r.id));
        match r.task {
            Some(index) => {
                if !is_array {
                    return Err(format!("job {} is not an array; name it as {}", r.id, r.id));
                }
                self.jobs_named(r.id)
                    .into_iter()
                    .find(|j| j.array.is_some_and(|a| a.index == index))
                    .map(|j| vec![j.id])
                    .ok_or_else(|| format!("array {} has no task {index}", r.id))
            }
            None if is_array => {
                let ids: Vec<JobId> = self
                    .jobs_named(r.id)
                    .into_iter()
                    .filter(|j| keep(j))
                    .map(|j| j.id)
                    .collect();
                // None left to act on: name the head, whose state says why.
                Ok(if ids.is_empty() { vec![r.id] } else { ids })
            }
            None => Ok(vec![r.id]),
        }
    }

    /// Holds (`hold: true`) or releases pending jobs: all or none. Owners
    /// may act on their own jobs, admins on all.
    pub(super) fn set_held(
        &mut self,
        by: &str,
        admin: bool,
        ids: &[JobId],
        hold: bool,
        dirty: &mut Dirty,
    ) -> Result<Vec<JobId>, Rejection> {
        if ids.is_empty() {
            return Err(Rejection::Empty);
        }
        for id in ids {
            let job = self.jobs.get(id).ok_or(Rejection::NoSuchJob(*id))?;
            if !admin && job.user != by {
                return Err(Rejection::NotOwner {
                    id: *id,
                    owner: job.user.clone(),
                });
            }
            if job.state != JobState::Pending {
                return Err(Rejection::NotPending {
                    id: *id,
                    state: job.state,
                });
            }
            if !hold && !job.held {
                return Err(Rejection::NotHeld(*id));
            }
        }
        for id in ids {
            if let Some(job) = self.jobs.get_mut(id) {
                job.held = hold;
                dirty.jobs.insert(*id);
            }
        }
        Ok(ids.to_vec())
    }
}
