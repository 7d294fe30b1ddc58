//! Changing a job's settings by command (`scontrol update`): all or none
//! over the jobs named. Its owner may lower a time limit, rename it and
//! raise its nice; admins may do anything. Partition, QoS and account
//! change only while it is pending, checked by the policy as at submit.
//! A running job's new time limit goes to its tasks with the desired set
//! (the agents pass it to the shims); the leader also ends the job at a
//! changed limit itself, for agents from before they passed it on.

use super::{CommandResult, Dirty, Rejection, State};
use crate::model::{JobId, JobState, JobUpdate, Launch, Millis};

impl State {
    pub(super) fn update(
        &mut self,
        by: &str,
        admin: bool,
        ids: &[JobId],
        change: &JobUpdate,
        dirty: &mut Dirty,
    ) -> Result<CommandResult, Rejection> {
        if ids.is_empty() {
            return Err(Rejection::Empty);
        }
        if change.is_empty() {
            return Err(Rejection::InvalidSpec(
                "nothing to change: give a field, e.g. TimeLimit=1:00:00".into(),
            ));
        }
        let refuse = |id: JobId, why: String| Rejection::NotUpdatable { id, why };
        let mut specs = Vec::with_capacity(ids.len());
        for &id in ids {
            let job = self.jobs.get(&id).ok_or(Rejection::NoSuchJob(id))?;
            if !admin && job.user != by {
                return Err(Rejection::NotOwner {
                    id,
                    owner: job.user.clone(),
                });
            }
            match job.state {
                JobState::Pending | JobState::Running => {}
                JobState::Completing => return Err(refuse(id, "it is ending".into())),
                state => return Err(Rejection::AlreadyEnded { id, state }),
            }
            if change.needs_pending() && job.state != JobState::Pending {
                return Err(refuse(
                    id,
                    "its partition, QoS and account change only while it is pending".into(),
                ));
            }
            let mut spec = job.spec.clone();
            let wanted = match (change.time_limit_secs, change.time_limit_change_secs) {
                (Some(limit), _) => Some(limit),
                (None, Some(delta)) => match spec.time_limit_secs {
                    None => {
                        return Err(refuse(
                            id,
                            "it has no time limit to add to or take from; give one, e.g. \
                             TimeLimit=2:00:00"
                                .into(),
                        ))
                    }
                    Some(old) if delta >= 0 => Some(Some(old.saturating_add(delta as u64))),
                    Some(old) => Some(Some(old.saturating_sub(delta.unsigned_abs()))),
                },
                (None, None) => None,
            };
            if let Some(limit) = wanted {
                let longer = match (limit, spec.time_limit_secs) {
                    (None, Some(_)) => true,
                    (Some(new), Some(old)) => new > old,
                    (_, None) => false,
                };
                if longer && !admin {
                    return Err(refuse(
                        id,
                        "only an admin may raise a time limit; a lower one is yours to set".into(),
                    ));
                }
                if limit == Some(0) {
                    return Err(Rejection::InvalidSpec(
                        "a time limit of 0 is no time at all; give e.g. TimeLimit=10:00".into(),
                    ));
                }
                spec.time_limit_secs = limit;
            }
            if let Some(name) = &change.name {
                spec.name = name.clone();
            }
            if let Some(nice) = change.nice {
                if nice < spec.nice.min(0) && !admin {
                    return Err(refuse(
                        id,
                        "only an admin may lower a job's nice below 0 (raise its priority)".into(),
                    ));
                }
                spec.nice = nice;
            }
            if change.needs_pending() {
                if let Some(p) = &change.partition {
                    spec.partition = Some(p.clone());
                }
                if let Some(q) = &change.qos {
                    spec.qos = Some(q.clone());
                }
                if let Some(a) = &change.account {
                    spec.account = Some(a.clone());
                }
                self.policy
                    .resolve(&job.user, &mut spec)
                    .map_err(Rejection::Policy)?;
            }
            spec.check_invariants().map_err(Rejection::InvalidSpec)?;
            specs.push(spec);
        }
        for (&id, spec) in ids.iter().zip(specs) {
            let Some(job) = self.jobs.get_mut(&id) else {
                continue;
            };
            let changed = spec.time_limit_secs != job.spec.time_limit_secs;
            job.spec = spec;
            let started = job.start_time.unwrap_or(0);
            if let Some(run) = job.run.as_mut().filter(|_| job.state == JobState::Running) {
                // The agents pass the new limit to the shims; the leader
                // keeps it too, for agents from before that did not.
                run.limit_changed |= changed;
                if changed {
                    // A step's limit is what was left of the job's at its start.
                    for step in run.steps.iter_mut().filter(|s| s.end_time.is_none()) {
                        let used = step.start_time.saturating_sub(started) / 1000;
                        step.time_limit_secs = job
                            .spec
                            .time_limit_secs
                            .map(|limit| limit.saturating_sub(used).max(1));
                    }
                }
            }
            dirty.jobs.insert(id);
        }
        Ok(CommandResult::Updated { ids: ids.to_vec() })
    }
}

/// Whether the leader ends `job` at `now` for its time limit: no shim
/// surely keeps it (an allocation runs none; a changed limit may be newer
/// than an older agent's shims), and it has passed.
pub fn past_limit_unwatched(job: &crate::model::Job, now: Millis) -> bool {
    let unwatched =
        job.spec.launch == Launch::Allocation || job.run.as_ref().is_some_and(|r| r.limit_changed);
    job.state == JobState::Running
        && unwatched
        && match (job.spec.time_limit_secs, job.start_time) {
            (Some(limit), Some(start)) => now >= start.saturating_add(limit.saturating_mul(1000)),
            _ => false,
        }
}
