//! Preemption: which running jobs to stop so that a pending one fits.
//!
//! Candidates are the running jobs whose QoS the pending job's QoS lists in
//! `preempts`, and, when the pending job's account is within its guarantee
//! (`guaranteed_gpus`, counting the job), the jobs of other accounts that
//! hold more than their own guarantee (they borrow: reclaim, as Kueue's
//! cohorts). A job already stopping is no candidate.
//!
//! Victims are whole jobs (a gang frees every node it holds). The choice is
//! simulated on the pass's free pool: for each node, the fewest victims that
//! would make it hold one node's share of the job (one victim if one suffices, the
//! cheapest; else the largest there first,
//! then fewest GPU-hours lost, then youngest); the cheapest nodes by (victims,
//! GPU-hours lost, youngest) are taken; the real placement is run on the
//! pool with those victims' resources freed; then every victim whose
//! release the placement does not need is dropped again. So a preemption
//! happens only when it makes the job fit, and its victims are a set of
//! which none can be spared.

use std::cmp::Reverse;
use std::collections::BTreeSet;

use super::check::Resolved;
use super::policy::{account_of, qos_of, ActiveJob, PolicyView};
use super::view::PendingJob;
use super::{Packing, Pool};
use crate::model::{Allocation, JobId, Millis};

/// The running jobs `job` may preempt. `account_gpus` is what an account
/// holds now; `gpus` what the job asks for.
pub(super) fn candidates<'v>(
    view: &'v PolicyView,
    job: &PendingJob,
    gpus: u64,
    account_gpus: &dyn Fn(&str) -> u64,
) -> Vec<&'v ActiveJob> {
    let policy = &view.policy;
    // Borrowed from the maps, not cloned (this runs for every blocked job
    // tried): the built-in QoS preempts nothing, the built-in account is
    // guaranteed nothing.
    let preempts = policy
        .qos
        .get(qos_of(&job.qos))
        .map(|q| &q.preempts)
        .filter(|p| !p.is_empty());
    let mine = account_of(&job.account);
    let guarantee = |a: &str| {
        policy
            .accounts
            .get(a)
            .map_or(0, |a| u64::from(a.guaranteed_gpus))
    };
    let reclaim = guarantee(mine) > 0 && account_gpus(mine) + gpus <= guarantee(mine);
    if preempts.is_none() && !reclaim {
        return Vec::new();
    }
    view.running
        .iter()
        .filter(|r| !r.completing && r.preempted_for.is_none() && r.id != job.id)
        .filter(|r| {
            preempts.is_some_and(|p| p.contains(qos_of(&r.qos))) || {
                let theirs = account_of(&r.account);
                reclaim && theirs != mine && account_gpus(theirs) > guarantee(theirs)
            }
        })
        .collect()
}

/// Why a victim was chosen, for its record.
pub(super) fn why(view: &PolicyView, job: &PendingJob, victim: &ActiveJob) -> String {
    let preempts = view
        .policy
        .qos(qos_of(&job.qos))
        .map(|q| q.preempts)
        .unwrap_or_default();
    if preempts.contains(qos_of(&victim.qos)) {
        format!(
            "QoS {} preempts QoS {}",
            qos_of(&job.qos),
            qos_of(&victim.qos)
        )
    } else {
        format!(
            "account {} reclaims its guarantee from {}",
            account_of(&job.account),
            account_of(&victim.account)
        )
    }
}

fn lost(r: &ActiveJob, now: Millis) -> u64 {
    r.gpus.saturating_mul(now.saturating_sub(r.start_time))
}

/// Preference among victim sets: fewer, then less lost, then younger.
fn cost(set: &[&ActiveJob], now: Millis) -> (usize, u64, Reverse<Millis>) {
    (
        set.len(),
        set.iter().map(|r| lost(r, now)).sum(),
        Reverse(set.iter().map(|r| r.start_time).min().unwrap_or(0)),
    )
}

/// `pool` with every listed job's resources freed, everywhere it holds them.
fn freed<'v>(pool: &Pool<'v>, victims: &[&ActiveJob]) -> Pool<'v> {
    let mut p = pool.clone();
    for v in victims {
        p.release(&v.allocation);
    }
    p
}

/// The victims that make `job` fit, and where it would then go; `None`
/// when no set of candidates does.
pub(super) fn find(
    pool: &Pool,
    job: &PendingJob,
    resolved: Resolved,
    allowed: &[bool],
    packing: Packing,
    cands: &[&ActiveJob],
    now: Millis,
) -> Option<(Vec<JobId>, Allocation)> {
    let shape = resolved.per_node;
    // Per node: the cheapest victims that make it hold one share.
    let mut per_node: Vec<(usize, Vec<&ActiveJob>)> = Vec::new();
    for (i, n) in pool.nodes.iter().enumerate() {
        if !allowed[i] {
            continue;
        }
        let held_here = |r: &ActiveJob| {
            r.allocation
                .nodes
                .iter()
                .find(|a| a.node == n.view.name)
                .map(|a| a.gpus.len())
        };
        let mut on: Vec<&ActiveJob> = cands
            .iter()
            .copied()
            .filter(|r| held_here(r).is_some())
            .collect();
        let mut single = Pool::single(n);
        if single.nodes[0].free().holds(&shape) {
            per_node.push((i, Vec::new()));
            continue;
        }
        // One victim that suffices, the cheapest; else the largest here
        // first until it holds (pruned below, with the other nodes').
        let alone = on
            .iter()
            .copied()
            .filter(|r| {
                let mut p = single.clone();
                p.release(&r.allocation);
                p.nodes[0].free().holds(&shape)
            })
            .min_by_key(|r| (lost(r, now), Reverse(r.start_time), r.id));
        if let Some(r) = alone {
            per_node.push((i, vec![r]));
            continue;
        }
        on.sort_by_key(|r| {
            let held = held_here(r).unwrap_or(0);
            (Reverse(held), lost(r, now), Reverse(r.start_time), r.id)
        });
        let mut chosen = Vec::new();
        for r in on {
            single.release(&r.allocation);
            chosen.push(r);
            if single.nodes[0].free().holds(&shape) {
                break;
            }
        }
        if !single.nodes[0].free().holds(&shape) {
            continue;
        }
        per_node.push((i, chosen));
    }
    if per_node.len() < resolved.nodes as usize {
        return None;
    }
    per_node.sort_by_key(|(i, set)| (cost(set, now), *i));
    let mut victims: Vec<&ActiveJob> = Vec::new();
    let mut seen = BTreeSet::new();
    for (_, set) in per_node.iter().take(resolved.nodes as usize) {
        for r in set {
            if seen.insert(r.id) {
                victims.push(r);
            }
        }
    }
    if victims.is_empty() {
        return None;
    }
    let mut alloc = freed(pool, &victims)
        .place(job, resolved, allowed, packing)
        .ok()?;
    // Drop every victim the placement can do without, most costly first.
    victims.sort_by_key(|r| (Reverse(lost(r, now)), r.start_time, r.id));
    let mut i = 0;
    while i < victims.len() {
        let mut without = victims.clone();
        without.remove(i);
        if without.is_empty() {
            i += 1;
            continue;
        }
        match freed(pool, &without).place(job, resolved, allowed, packing) {
            Ok(a) => {
                victims = without;
                alloc = a;
            }
            Err(_) => i += 1,
        }
    }
    let mut ids: Vec<JobId> = victims.iter().map(|r| r.id).collect();
    ids.sort();
    Some((ids, alloc))
}
