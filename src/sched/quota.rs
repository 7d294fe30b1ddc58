//! Per-pass limits: an account's hard cap (`max_gpus`), a QoS's GPUs per
//! user. A job over one waits with `QuotaExceeded` and does not block the
//! jobs behind it (they may be of other accounts). Counted from the running
//! jobs, plus what the pass itself starts.

use std::collections::BTreeMap;

use super::policy::{account_of, qos_of, PolicyView};
use super::view::PendingJob;
use super::PendingReason;
use crate::model::Policy;

/// GPUs held per account and per (QoS, user) during a pass.
pub(super) struct Quotas<'v> {
    policy: &'v Policy,
    /// Keys borrowed from the view: nothing is copied per job.
    by_account: BTreeMap<&'v str, u64>,
    /// By QoS, then user.
    by_qos_user: BTreeMap<&'v str, BTreeMap<&'v str, u64>>,
}

impl<'v> Quotas<'v> {
    pub fn new(view: &'v PolicyView) -> Quotas<'v> {
        let mut q = Quotas {
            policy: &view.policy,
            by_account: BTreeMap::new(),
            by_qos_user: BTreeMap::new(),
        };
        for r in &view.running {
            q.add(&r.account, &r.qos, &r.user, r.gpus);
        }
        q
    }

    fn add(&mut self, account: &'v str, qos: &'v str, user: &'v str, gpus: u64) {
        *self.by_account.entry(account_of(account)).or_default() += gpus;
        *self
            .by_qos_user
            .entry(qos_of(qos))
            .or_default()
            .entry(user)
            .or_default() += gpus;
    }

    /// GPUs the account's jobs hold now.
    pub fn account_gpus(&self, account: &str) -> u64 {
        self.by_account
            .get(account_of(account))
            .copied()
            .unwrap_or(0)
    }

    /// Whether `job`, holding `gpus`, may start now as far as quotas go.
    pub fn gate(&self, job: &PendingJob, gpus: u64) -> Result<(), PendingReason> {
        let (account_max, qos_max) = caps(self.policy, job);
        let account = account_of(&job.account);
        if let Some(max) = account_max {
            if self.account_gpus(account) + gpus > u64::from(max) {
                return Err(PendingReason::QuotaExceeded);
            }
        }
        let qos = qos_of(&job.qos);
        if let Some(max) = qos_max {
            let held = self
                .by_qos_user
                .get(qos)
                .and_then(|users| users.get(job.user.as_str()))
                .copied()
                .unwrap_or(0);
            if held + gpus > u64::from(max) {
                return Err(PendingReason::QuotaExceeded);
            }
        }
        Ok(())
    }

    /// Counts a job the pass starts.
    pub fn charge(&mut self, job: &'v PendingJob, gpus: u64) {
        self.add(&job.account, &job.qos, &job.user, gpus);
    }
}

/// The caps on `job`: its account's GPUs, and its QoS's GPUs per user. The
/// built-in account and QoS (absent from the maps) have none. A job with
/// neither is never held by [`Quotas::gate`].
pub(super) fn caps(policy: &Policy, job: &PendingJob) -> (Option<u32>, Option<u32>) {
    let account = policy
        .accounts
        .get(account_of(&job.account))
        .and_then(|a| a.max_gpus);
    let qos = policy
        .qos
        .get(qos_of(&job.qos))
        .and_then(|q| q.max_gpus_per_user);
    (account, qos)
}
