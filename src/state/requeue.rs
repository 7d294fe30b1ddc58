//! Requeue by command (`scontrol requeue`, `requeuehold`): a running job's
//! tasks stop (COMPLETING, as for a node failure) and it goes back to
//! PENDING with the same id and `restart_count + 1`, never passing through a
//! finished state; `hold` also holds it. Its owner may do this from inside
//! the job (submitit checkpoints, then requeues itself). All or none.

use super::{CommandResult, Dirty, Rejection, State};
use crate::model::{JobId, JobState, Millis, RequeuePolicy};

impl State {
    pub(super) fn requeue(
        &mut self,
        by: &str,
        admin: bool,
        ids: &[JobId],
        hold: bool,
        now: Millis,
        dirty: &mut Dirty,
    ) -> Result<CommandResult, Rejection> {
        if ids.is_empty() {
            return Err(Rejection::Empty);
        }
        for &id in ids {
            let job = self.jobs.get(&id).ok_or(Rejection::NoSuchJob(id))?;
            if !admin && job.user != by {
                return Err(Rejection::NotOwner {
                    id,
                    owner: job.user.clone(),
                });
            }
            if job.spec.requeue == RequeuePolicy::Never {
                return Err(Rejection::NotRequeueable {
                    id,
                    why: "it was submitted with --no-requeue".into(),
                });
            }
            match job.state {
                JobState::Running => {}
                JobState::Pending if hold => {}
                JobState::Pending => {
                    return Err(Rejection::NotRequeueable {
                        id,
                        why: "it is pending already (requeuehold holds it)".into(),
                    })
                }
                JobState::Completing => {
                    return Err(Rejection::NotRequeueable {
                        id,
                        why: "it is already ending".into(),
                    })
                }
                state => return Err(Rejection::AlreadyEnded { id, state }),
            }
        }
        for &id in ids {
            let Some(job) = self.jobs.get_mut(&id) else {
                continue;
            };
            if hold {
                job.held = true;
            }
            dirty.jobs.insert(id);
            if job.state != JobState::Running {
                continue;
            }
            job.reason = Some(format!("requeued by {by}"));
            if let Some(run) = job.run.as_mut() {
                run.final_state = Some(JobState::Completed);
                run.requeue = true;
            }
            self.transition(id, JobState::Completing, now, dirty);
            self.finish_if_all_ended(id, now, dirty);
        }
        Ok(CommandResult::Requeued { ids: ids.to_vec() })
    }
}
