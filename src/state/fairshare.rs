//! Fair-share usage in the replicated state: an attempt's GPU time is
//! charged to its account and user when it stops holding its GPUs, from the
//! times the leader stamped into the commands, and decayed by the policy's
//! half-life from those same times (never a clock). The scheduler reads it
//! (`sched::fairshare`) through the policy view.

use super::{Dirty, State};
use crate::model::policy::DEFAULT_ACCOUNT;
use crate::model::{JobId, Millis, UsageCell};

impl State {
    /// Charges an attempt's GPU time to its account and user, when the job
    /// stops holding its resources.
    pub(super) fn charge_usage(&mut self, id: JobId, now: Millis, dirty: &mut Dirty) {
        let Some(job) = self.jobs.get(&id) else {
            return;
        };
        let (Some(start), Some(run)) = (job.start_time, job.run.as_ref()) else {
            return;
        };
        let gpus: u64 = run.allocation.gpus();
        // A MIG slice is charged as its share of a GPU (compute slices / 7).
        let (part, whole) = crate::model::mig::share(job.spec.placement.gpu_slice.as_deref());
        // An elastic job is charged each of its sizes over its own span.
        let held_ms = crate::model::elastic::gpu_ms(start, now, gpus, &job.resizes);
        let mut gpu_ms = u64::try_from(held_ms)
            .unwrap_or(u64::MAX)
            .saturating_mul(part)
            / whole;
        // A slot of a time-shared GPU is charged 1 / its slots.
        if let Some(milli) = run.charged_milli_gpus {
            gpu_ms = now.saturating_sub(start).saturating_mul(milli) / 1000;
        }
        let account = job
            .spec
            .account
            .clone()
            .unwrap_or_else(|| DEFAULT_ACCOUNT.to_string());
        let user = job.user.clone();
        let half_life = self.policy.half_life_secs;
        self.usage
            .entry(account)
            .or_default()
            .entry(user)
            .or_insert(UsageCell {
                gpu_ms: 0,
                at: now,
                total_gpu_ms: 0,
            })
            .charge(gpu_ms, now, half_life);
        dirty.meta = true;
    }
}
