//! Fair-share, Slurm's classic formula: an account's factor is
//! `2^(-U / S)`, where `S` is its normalised share (its shares over its
//! siblings', times its parent's normalised share, down from the root) and
//! `U` its normalised usage (the decayed GPU-seconds of its subtree over the
//! whole cluster's). An account that used exactly its share gets 0.5, one
//! that used nothing 1, one that used twice its share 0.25. Usage is what
//! apply accumulated from finished attempts (decayed by the half-life) plus
//! what running jobs have used so far.
//!
//! Classic rather than fair tree: it is one pass over the accounts, and it
//! converges to the configured shares when every account has work (the
//! factors are equal exactly when `U / S` is, which is `U` proportional to
//! `S`); the simulated run in `sched/tests/policy_sim.rs` checks that.

use std::collections::BTreeMap;

use super::policy::{account_of, PolicyView};
use crate::model::policy::DEFAULT_ACCOUNT;
use crate::model::{Account, Millis, ShareRow};

/// Fair-share for every account.
#[derive(Clone, Debug, Default)]
pub struct FairShare {
    /// By account name.
    pub factor: BTreeMap<String, f64>,
    pub rows: Vec<ShareRow>,
}

impl FairShare {
    /// The factor of the account a job is charged to (1 if unknown).
    pub fn of(&self, account: &str) -> f64 {
        self.factor.get(account_of(account)).copied().unwrap_or(1.0)
    }
}

/// Computes shares, usage and factors at `now`.
pub fn compute(view: &PolicyView, now: Millis) -> FairShare {
    let policy = &view.policy;
    // Borrowed, not cloned (`Policy::all_accounts`): this runs every pass.
    let builtin = Account::new(DEFAULT_ACCOUNT);
    let mut accounts: BTreeMap<&str, &Account> = policy
        .accounts
        .iter()
        .map(|(name, a)| (name.as_str(), a))
        .collect();
    accounts.entry(DEFAULT_ACCOUNT).or_insert(&builtin);
    // Usage per (account, user) in GPU-seconds at `now`.
    let mut user_usage: BTreeMap<(&str, &str), f64> = BTreeMap::new();
    for (account, users) in &view.usage {
        for (user, cell) in users {
            *user_usage.entry((account, user)).or_default() +=
                cell.at_time(now, policy.half_life_secs) / 1000.0;
        }
    }
    for r in &view.running {
        let secs = now.saturating_sub(r.start_time) as f64 / 1000.0;
        *user_usage
            .entry((account_of(&r.account), &r.user))
            .or_default() += r.gpus as f64 * secs;
    }
    let mut direct: BTreeMap<&str, f64> = BTreeMap::new();
    for ((a, _), u) in &user_usage {
        *direct.entry(a).or_default() += u;
    }
    // Parents first: depth order. An account whose parent is unknown (it
    // cannot be: apply refuses it) counts as top-level.
    let parent_of = |a: &Account| -> Option<String> {
        a.parent
            .clone()
            .filter(|p| accounts.contains_key(p.as_str()))
    };
    let depth = |name: &str| {
        let mut d = 0;
        let mut cur = accounts.get(name).and_then(|a| parent_of(a));
        while let Some(p) = cur {
            d += 1;
            if d > accounts.len() {
                break;
            }
            cur = accounts.get(p.as_str()).and_then(|a| parent_of(a));
        }
        d
    };
    let mut order: Vec<&Account> = accounts.values().copied().collect();
    order.sort_by_key(|a| (depth(&a.name), a.name.clone()));

    let mut sibling_shares: BTreeMap<Option<String>, u64> = BTreeMap::new();
    for a in accounts.values() {
        *sibling_shares.entry(parent_of(a)).or_default() += u64::from(a.shares.max(1));
    }
    let mut norm_shares: BTreeMap<String, f64> = BTreeMap::new();
    for a in &order {
        let parent = parent_of(a);
        let above = parent
            .as_ref()
            .and_then(|p| norm_shares.get(p).copied())
            .unwrap_or(1.0);
        let total = sibling_shares.get(&parent).copied().unwrap_or(1).max(1) as f64;
        norm_shares.insert(a.name.clone(), above * f64::from(a.shares.max(1)) / total);
    }
    // Subtree usage: children into parents, deepest first.
    let mut subtree: BTreeMap<String, f64> = accounts
        .keys()
        .map(|&n| (n.to_string(), direct.get(n).copied().unwrap_or(0.0)))
        .collect();
    for a in order.iter().rev() {
        if let Some(p) = parent_of(a) {
            let u = subtree[&a.name];
            *subtree.entry(p).or_default() += u;
        }
    }
    // Usage of accounts that no longer exist still counts in the total.
    let total: f64 = user_usage.values().sum();
    let norm = |u: f64| if total > 0.0 { u / total } else { 0.0 };
    let factor_of = |u: f64, s: f64| {
        if s <= 0.0 {
            0.0
        } else {
            (-norm(u) / s).exp2()
        }
    };
    let mut out = FairShare::default();
    for a in &order {
        let s = norm_shares[&a.name];
        let u = subtree[&a.name];
        let f = factor_of(u, s);
        out.factor.insert(a.name.clone(), f);
        out.rows.push(ShareRow {
            account: a.name.clone(),
            user: None,
            parent: parent_of(a),
            shares: a.shares,
            norm_shares: s,
            usage_gpu_secs: u,
            norm_usage: norm(u),
            factor: f,
        });
        for ((acc, user), u) in user_usage.range((a.name.as_str(), "")..) {
            if *acc != a.name {
                break;
            }
            out.rows.push(ShareRow {
                account: a.name.clone(),
                user: Some(user.to_string()),
                parent: Some(a.name.clone()),
                shares: a.shares,
                norm_shares: s,
                usage_gpu_secs: *u,
                norm_usage: norm(*u),
                factor: f,
            });
        }
    }
    out
}
