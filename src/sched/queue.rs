//! The pass's queue: the pending jobs in priority order, each with what the
//! pass asks of every job before it tries to place it: its priority, its
//! partition, its request (what it asks for, as a small number), and
//! whether a gate or a quota could hold it back.
//!
//! All of it is worked out in one walk over the pending jobs in the order
//! the state keeps them, and the names a job's factors depend on (account,
//! QoS, partition) once per distinct trio. The trios and requests are found
//! again by hash (Fx): ordered maps compared up to a dozen strings a job.
//! The pass loop (`pass`) then decides the jobs it does not try (most of a long queue: past `max_job_test`, they wait
//! for `Priority`) from these few bytes, without reading their records
//! again: at 100,000 pending jobs, reading each record a second time, out
//! of order, was most of the pass.
//!
//! The gates live here too: [`ungated`] says while the queue is built
//! whether a job could be held back by anything but resources and quotas,
//! and [`gate`] says, as the pass reaches it, whether it is.

use std::collections::{BTreeMap, BTreeSet};

use rustc_hash::FxHashMap;

use crate::model::{JobId, Millis, Placement};

use super::priority::{self, ByName, Ranker};
use super::quota;
use super::view::{ClusterView, PendingJob, Shape};
use super::{Partitions, PendingReason, ViewRef};

/// The pending jobs in queue order, with their priorities: the order of a
/// pass's queue, which this builds.
///
/// Ids are unique, so the order is total and the same as a stable sort of
/// the jobs would give (the view's order breaks a tie of ids).
pub fn order(view: &ClusterView, now: Millis) -> Vec<(&PendingJob, i64)> {
    let v = view.by_ref();
    let up = super::up_nodes(&v.nodes);
    let parts = Partitions::new(&v.rest.policy.policy, &up);
    build(&v, now, &parts, priority::up_gpus(&up))
        .jobs
        .into_iter()
        .map(|q| (q.job, q.priority))
        .collect()
}

/// One job of the queue.
#[derive(Clone, Copy)]
pub(super) struct Queued<'v> {
    pub id: JobId,
    /// Its total priority ([`super::priority`]).
    pub priority: i64,
    pub job: &'v PendingJob,
    /// Its partition's index in [`Partitions`], `None` when that is down.
    pub part: Option<usize>,
    /// Its [`Request`]'s number (unused when `part` is `None`).
    pub request: usize,
    /// Nothing but resources and quotas can hold it back: no hold,
    /// dependency, `--begin` in the future, array throttle or singleton.
    pub plain: bool,
    /// Its account or QoS has a cap (`super::quota`).
    pub capped: bool,
    /// Its time limit, seconds (`None`: none), for backfill's
    /// [`super::BackfillOrder::Shortest`] without reading the record again.
    pub limit: Option<u64>,
}

/// What a job asks for, within its partition (its index): jobs with equal
/// requests fit the same nodes. Placement and satisfiability are worked out
/// once per request per pass.
pub(super) type Request<'j> = (u32, Shape, Option<u32>, &'j Placement, usize);

/// The queue, and how many distinct requests its jobs make.
pub(super) struct Queue<'v> {
    pub jobs: Vec<Queued<'v>>,
    pub requests: usize,
}

/// What jobs with one account, QoS and partition share.
#[derive(Clone, Copy)]
struct Named {
    factors: ByName,
    part: Option<usize>,
    capped: bool,
}

/// How many jobs ahead of the one being read the walk asks for records
/// ([`PendingJob::prefetch`]).
const PREFETCH_AHEAD: usize = 8;

/// The queue of `view`'s pending jobs at `now` (see the module comment);
/// `cluster_gpus` is [`priority::up_gpus`] of its nodes.
pub(super) fn build<'v>(
    view: &ViewRef<'v>,
    now: Millis,
    parts: &Partitions,
    cluster_gpus: u64,
) -> Queue<'v> {
    let policy = &view.rest.policy.policy;
    let ranker = Ranker::new(view, now, cluster_gpus);
    let mut named: FxHashMap<(&str, &str, &str), Named> = FxHashMap::default();
    let mut requests: FxHashMap<Request, usize> = FxHashMap::default();
    let mut keys: Vec<(priority::Key, u32)> = Vec::with_capacity(view.pending.len());
    let queued: Vec<Queued> = view
        .pending
        .iter()
        .enumerate()
        .map(|(i, &job)| {
            if let Some(ahead) = view.pending.get(i + PREFETCH_AHEAD) {
                ahead.prefetch();
            }
            let n = *named
                .entry((&job.account, &job.qos, &job.partition))
                .or_insert_with(|| Named {
                    factors: ranker.by_name(job),
                    part: parts.of(job),
                    capped: quota::caps(policy, job) != (None, None),
                });
            let total = ranker.factors_with(job, now, n.factors).total;
            let request = match n.part {
                Some(part) => {
                    let next = requests.len();
                    *requests.entry(request_of(job, part)).or_insert(next)
                }
                None => 0,
            };
            let plain = ungated(job, now);
            let q = Queued {
                id: job.id,
                priority: total,
                job,
                part: n.part,
                request,
                plain,
                capped: n.capped,
                limit: job.time_limit_secs,
            };
            // The view's order breaks a tie of ids (a hand-built view).
            keys.push((priority::key(job, total), i as u32));
            q
        })
        .collect();
    // Sorted apart from the rows: the sort moves 40 bytes a job, not 100.
    keys.sort_unstable();
    Queue {
        jobs: keys.iter().map(|&(_, i)| queued[i as usize]).collect(),
        requests: requests.len(),
    }
}

/// The [`Request`] of `job` in partition `part`.
pub(super) fn request_of(job: &PendingJob, part: usize) -> Request<'_> {
    (
        job.nodes,
        job.per_node(),
        job.total_gpus,
        &job.placement,
        part,
    )
}

/// Whether nothing but resources and quotas can keep `job` back at `now`:
/// [`gate`] holds no such job, whatever the pass has started.
pub(super) fn ungated(job: &PendingJob, now: Millis) -> bool {
    job.blocked.is_none()
        && job.begin_time.is_none_or(|b| b <= now)
        && job.array_throttle.is_none()
        && job.singleton.is_none()
}

/// Why a job may not even be tried now, if something other than resources
/// keeps it back.
pub(super) fn gate(
    job: &PendingJob,
    now: Millis,
    slots: &BTreeMap<JobId, u32>,
    singletons: &BTreeSet<(&str, &str)>,
) -> Option<PendingReason> {
    if let Some(r) = &job.blocked {
        return Some(r.clone());
    }
    if job.begin_time.is_some_and(|b| b > now) {
        return Some(PendingReason::BeginTime);
    }
    if let Some(t) = job.array_throttle {
        if slots.get(&t.array).copied().unwrap_or(t.slots) == 0 {
            return Some(PendingReason::JobArrayTaskLimit);
        }
    }
    if let Some(name) = &job.singleton {
        if singletons.contains(&(job.user.as_str(), name.as_str())) {
            return Some(PendingReason::Dependency);
        }
    }
    None
}
