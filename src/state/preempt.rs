//! Preemption in the replicated state (`Command::Preempt`): the victims a
//! pass chose (`sched::preempt`) are stopped, all of one preemption's or
//! none, and each is requeued or ends PREEMPTED per its QoS.

use super::{CommandResult, Dirty, State};
use crate::model::policy::DEFAULT_QOS;
use crate::model::{JobState, Millis, PreemptMode, PreemptionRecord};
use crate::sched::Preemption;

impl State {
    /// Stops the victims of each preemption: all of one preemption's or
    /// none (one already ended or stopping voids it, and the next pass
    /// decides again). Each victim goes COMPLETING: its ranks get SIGTERM
    /// and their QoS grace; then it is requeued with the same id or ends
    /// PREEMPTED, per its QoS's `preempt_mode`.
    pub(super) fn apply_preempt(
        &mut self,
        preemptions: &[Preemption],
        now: Millis,
        dirty: &mut Dirty,
    ) -> CommandResult {
        let mut stopped = Vec::new();
        let mut skipped = Vec::new();
        for p in preemptions {
            let ok_for = self
                .jobs
                .get(&p.job)
                .is_some_and(|j| j.state == JobState::Pending);
            let victims_ok = p.victims.iter().all(|v| {
                self.jobs.get(v).is_some_and(|j| {
                    j.state == JobState::Running
                        && j.run.as_ref().is_some_and(|r| r.preempted_for.is_none())
                })
            });
            let shrinks_ok = p.shrinks.iter().all(|kept| self.may_shrink_to(kept));
            if !ok_for
                || !victims_ok
                || !shrinks_ok
                || (p.victims.is_empty() && p.shrinks.is_empty())
            {
                skipped.push(p.job);
                continue;
            }
            for (i, kept) in p.shrinks.iter().enumerate() {
                let why = p.why.get(i).cloned().unwrap_or_default();
                let why = format!("gave nodes back to job {} ({why})", p.job);
                self.begin_resize(kept.job, kept.clone(), Some(p.job), why, now, dirty);
                stopped.push(kept.job);
            }
            let why_of_victims = &p.why[p.shrinks.len().min(p.why.len())..];
            for (i, v) in p.victims.iter().enumerate() {
                let why = why_of_victims.get(i).cloned().unwrap_or_default();
                let mode = self
                    .jobs
                    .get(v)
                    .and_then(|j| {
                        self.policy
                            .qos(j.spec.qos.as_deref().unwrap_or(DEFAULT_QOS))
                    })
                    .map_or(PreemptMode::Requeue, |q| q.preempt_mode);
                let Some(job) = self.jobs.get_mut(v) else {
                    continue;
                };
                let attempt = job.restart_count;
                job.preemptions.push(PreemptionRecord {
                    at: now,
                    attempt,
                    by: p.job,
                    mode,
                    why: why.clone(),
                });
                job.reason = Some(format!("preempted by job {} ({why})", p.job));
                if let Some(run) = job.run.as_mut() {
                    run.final_state = Some(JobState::Preempted);
                    // Preemption is not the job's failure: it requeues
                    // whatever its restart count.
                    run.requeue = mode == PreemptMode::Requeue;
                    run.preempted_for = Some(p.job);
                }
                self.transition(*v, JobState::Completing, now, dirty);
                self.finish_if_all_ended(*v, now, dirty);
                stopped.push(*v);
            }
        }
        CommandResult::Preempted { stopped, skipped }
    }

    /// Whether the elastic job of `kept` may shrink to it: running at a
    /// steady size, and `kept` is some of its nodes, at least its minimum.
    fn may_shrink_to(&self, kept: &crate::model::Allocation) -> bool {
        let Some(job) = self.jobs.get(&kept.job) else {
            return false;
        };
        let (Some(range), Some(run)) = (job.spec.placement.elastic, job.run.as_ref()) else {
            return false;
        };
        job.state == JobState::Running
            && run.resize.is_none()
            && run.preempted_for.is_none()
            && kept.nodes.len() as u32 >= range.min
            && kept.nodes.len() < run.allocation.nodes.len()
            && kept.nodes.iter().all(|k| run.allocation.nodes.contains(k))
    }
}
