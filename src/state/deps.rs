//! Dependencies (`--dependency`), evaluated from the state alone, so every
//! server reaches the same verdict for the same log.
//!
//! - `after:ID`: ID has started (or ended without starting).
//! - `afterany:ID`: ID has ended, however.
//! - `afterok:ID`: ID ended COMPLETED; any other end can never satisfy it.
//! - `afternotok:ID`: ID ended other than COMPLETED; COMPLETED never will.
//! - `singleton`: no other job of the same user and name is running (a pass
//!   also starts at most one of them).
//!
//! An id naming an array means every task of it. Terms are joined by AND.
//! An id unknown at submit is refused (`Rejection::UnknownDependency`); one
//! no longer in the state later (moved to a history archive) counts as met,
//! as Slurm treats a purged job. A dependency that can never be met leaves the job PENDING with the
//! reason `DependencyNeverSatisfied` (Slurm without `kill_invalid_depend`):
//! the user sees why and cancels it; nothing is cancelled behind their back.

use std::collections::BTreeSet;

use super::State;
use crate::model::{Dependency, DependencyKind, Job, JobId, JobState};
use crate::sched::PendingReason;

/// Where a dependency stands.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DepStatus {
    Met,
    Waiting,
    /// Can never be met, with why.
    Never(String),
}

impl State {
    /// The jobs `id` names: the tasks of the array if it is one's id, else itself.
    pub fn jobs_named(&self, id: JobId) -> Vec<&Job> {
        match self.jobs.get(&id) {
            Some(j) if j.array.is_some_and(|a| a.array_job == id) => self
                .jobs
                .range(id..)
                .map(|(_, j)| j)
                .take_while(|j| j.array.is_some_and(|a| a.array_job == id))
                .collect(),
            Some(j) => vec![j],
            None => Vec::new(),
        }
    }

    /// Checks a new job's dependencies name jobs that exist.
    pub fn check_dependencies(&self, deps: &[Dependency]) -> Result<(), JobId> {
        for d in deps {
            for id in &d.jobs {
                if !self.jobs.contains_key(id) {
                    return Err(*id);
                }
            }
        }
        Ok(())
    }

    /// Where `deps` stand for a job of `user` named `name`. `running` is the
    /// (user, name) pairs of running jobs, for `singleton`.
    pub fn dependency_status(
        &self,
        deps: &[Dependency],
        running: &BTreeSet<(&str, &str)>,
        user: &str,
        name: &str,
    ) -> DepStatus {
        let mut waiting = false;
        for d in deps {
            if d.kind == DependencyKind::Singleton {
                waiting |= running.contains(&(user, name));
                continue;
            }
            for id in &d.jobs {
                for job in self.jobs_named(*id) {
                    match term_status(d.kind, job) {
                        DepStatus::Met => {}
                        DepStatus::Waiting => waiting = true,
                        DepStatus::Never(why) => return DepStatus::Never(why),
                    }
                }
            }
        }
        if waiting {
            DepStatus::Waiting
        } else {
            DepStatus::Met
        }
    }

    /// The reason a pending job may not start for something outside the
    /// scheduler (a hold, dependencies), if any.
    pub fn blocked_reason(
        &self,
        job: &Job,
        running: &BTreeSet<(&str, &str)>,
    ) -> Option<PendingReason> {
        if job.held {
            return Some(PendingReason::Held);
        }
        let deps = &job.spec.queue.dependency;
        if deps.is_empty() {
            return None;
        }
        match self.dependency_status(deps, running, &job.user, &job.spec.name) {
            DepStatus::Met => None,
            DepStatus::Waiting => Some(PendingReason::Dependency),
            DepStatus::Never(why) => Some(PendingReason::DependencyNeverSatisfied(why)),
        }
    }
}

fn term_status(kind: DependencyKind, job: &Job) -> DepStatus {
    let shown = job.display_id();
    match kind {
        DependencyKind::After if job.state != JobState::Pending => DepStatus::Met,
        DependencyKind::AfterAny if job.state.is_final() => DepStatus::Met,
        DependencyKind::AfterOk if job.state == JobState::Completed => DepStatus::Met,
        DependencyKind::AfterOk if job.state.is_final() => DepStatus::Never(format!(
            "afterok:{} but job {shown} ended {}",
            job.id, job.state
        )),
        DependencyKind::AfterNotOk if job.state == JobState::Completed => {
            DepStatus::Never(format!("afternotok:{} but job {shown} COMPLETED", job.id))
        }
        DependencyKind::AfterNotOk if job.state.is_final() => DepStatus::Met,
        _ => DepStatus::Waiting,
    }
}
