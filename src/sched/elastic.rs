//! Elastic jobs in a pass (`--nodes MIN-MAX`, see `model::elastic`).
//!
//! - **Start**: a pending elastic job that fits at MIN nodes is tried at
//!   MAX, then one fewer, down to MIN; the first size that starts now wins. Blocked, it waits
//!   (and is reserved for) at MIN.
//! - **Growth** is the lowest priority there is: after every pending job was
//!   tried, a running elastic job below MAX takes nodes still free, clear of
//!   every reservation (advance ones and the blocked jobs') over the rest of
//!   its time limit, so no job is delayed by it. Each growth restarts the
//!   gang, so a job grows by as many nodes as it can at once, and only
//!   after `elastic_settle_secs` at its size (nodes freed one after another
//!   restart it once).
//! - **Shrink**: where a preemptor may stop an elastic job, the job's nodes
//!   above MIN are offered first (`shrinkable`); only if they do not make
//!   room is it preempted whole.

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::backfill::{place_during, Hold};
use super::check::Resolved;
use super::policy::ActiveJob;
use super::view::PendingJob;
use super::{Packing, Partitions, Pool};
use crate::model::{Allocation, JobId, Millis};

/// A running elastic job to grow: the nodes it gains, after its own.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Growth {
    pub job: JobId,
    pub added: Allocation,
}

/// The largest size of `job`'s range above its minimum that starts now, if
/// any (the caller tried the minimum first, as for any job, and asks only
/// when it fits: a blocked elastic job costs a pass no more than another). `fits_quota` says
/// whether that many GPUs pass the job's quotas.
#[allow(clippy::too_many_arguments)]
pub(super) fn place_largest(
    pool: &mut Pool,
    holds: &[Hold],
    window: (Millis, Option<Millis>),
    job: &PendingJob,
    resolved: Resolved,
    allowed: &[bool],
    packing: Packing,
    fits_quota: impl Fn(u64) -> bool,
) -> Option<Allocation> {
    let range = job.placement.elastic?;
    for n in (range.min + 1..=range.max).rev() {
        let gpus = u64::from(resolved.per_node.gpus) * u64::from(n);
        if !fits_quota(gpus) {
            continue;
        }
        let sized = Resolved {
            nodes: n,
            ..resolved
        };
        if let (Ok(alloc), _) = place_during(pool, holds, window, job, sized, allowed, packing) {
            return Some(alloc);
        }
    }
    None
}

/// Growth for the running elastic jobs below their maximum, oldest first,
/// each charged to `pool` as it is decided.
pub(super) fn grow(
    running: &[ActiveJob],
    settle_secs: u64,
    pool: &mut Pool,
    parts: &Partitions,
    holds: &[Hold],
    now: Millis,
    packing: Packing,
) -> Vec<Growth> {
    let mut out = Vec::new();
    let mut order: Vec<&ActiveJob> = running
        .iter()
        .filter(|r| !r.completing && r.preempted_for.is_none())
        .filter(|r| {
            r.elastic.as_ref().is_some_and(|e| {
                e.resizing_to.is_none() && (r.allocation.nodes.len() as u32) < e.range.max
            })
        })
        .collect();
    order.sort_by_key(|r| (r.start_time, r.id));
    for r in order {
        let Some(e) = r.elastic.as_deref() else {
            continue;
        };
        let Some(part) = parts.of(&e.shape) else {
            continue;
        };
        // Grown nodes would have to share its domain under `--topology`:
        // not done yet. A job at its time limit ends any moment.
        let settled = now >= e.since.saturating_add(settle_secs.saturating_mul(1000));
        if !settled || e.shape.placement.topology.is_some() || e.end.is_some_and(|t| t <= now) {
            continue;
        }
        let mut allowed = pool.allowed(&e.shape.placement);
        for (i, (a, n)) in allowed.iter_mut().zip(&pool.nodes).enumerate() {
            let own = r.allocation.nodes.iter().any(|x| x.node == n.view.name);
            *a &= parts.members[part][i] && !own;
        }
        let have = r.allocation.nodes.len() as u32;
        let per_node = e.shape.per_node();
        let end = e.end;
        for k in (1..=e.range.max - have).rev() {
            let job = PendingJob {
                id: r.id,
                nodes: k,
                ..e.shape.clone()
            };
            let sized = Resolved { nodes: k, per_node };
            let (placed, _) = place_during(pool, holds, (now, end), &job, sized, &allowed, packing);
            if let Ok(added) = placed {
                pool.charge(&added);
                out.push(Growth { job: r.id, added });
                break;
            }
        }
    }
    out
}

/// `r` as a candidate that gives back only its nodes above its minimum
/// (its last ranks), or `None` when it cannot shrink.
pub(super) fn shrinkable(r: &ActiveJob) -> Option<ActiveJob> {
    let e = r.elastic.as_deref()?;
    let have = r.allocation.nodes.len();
    if e.resizing_to.is_some() || have <= e.range.min as usize {
        return None;
    }
    let extra = Allocation {
        job: r.id,
        nodes: r.allocation.nodes[e.range.min as usize..].to_vec(),
    };
    Some(ActiveJob {
        gpus: extra.gpus(),
        allocation: Arc::new(extra),
        ..r.clone()
    })
}

/// What `r` keeps when the nodes of `taken` (where its preemptor goes) that
/// it offered are given back: its nodes in rank order, less those.
pub(super) fn kept_after(r: &ActiveJob, taken: &Allocation) -> Allocation {
    let min = r.elastic.as_ref().map_or(0, |e| e.range.min as usize);
    let nodes = (r.allocation.nodes.iter().enumerate())
        .filter(|(i, n)| *i < min || !taken.nodes.iter().any(|t| t.node == n.node))
        .map(|(_, n)| n.clone())
        .collect();
    Allocation { job: r.id, nodes }
}

/// What a job holding `held` frees when it keeps `kept` (`None`: all of it).
pub(super) fn given_back(held: &Allocation, kept: Option<&Allocation>) -> Allocation {
    let Some(kept) = kept else {
        return held.clone();
    };
    let nodes = (held.nodes.iter())
        .filter(|n| !kept.nodes.iter().any(|k| k.node == n.node))
        .cloned()
        .collect();
    Allocation {
        job: held.job,
        nodes,
    }
}
