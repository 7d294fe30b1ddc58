//! The pass loop: one walk over the queue (`queue`: the pending jobs in
//! priority order), deciding for each job whether it starts now, preempts,
//! gets a reservation or waits, and why.
//!
//! - Jobs start in queue order while they fit the free resources; behind
//!   the first that cannot, backfill's rule (`backfill`) says which may.
//! - Jobs held back by the state (holds, dependencies), by `--begin`, by an
//!   array throttle or a running singleton (`queue::gate`), by a down
//!   partition or by a quota wait with that reason and block nobody. A job
//!   is placed (now or on the timeline) only on its partition's nodes.
//! - A job that cannot start now may preempt ([`preempt_for`]) where
//!   what it would take once the victims stopped leaves room for the
//!   reservations it would overlap: the victims go in the plan, what it
//!   will take is charged so nobody behind it takes it (and is on the
//!   timeline as started now, the victims' expected ends not), and it waits
//!   as `Preempting`, blocking nobody. Not where the pass has fallen back
//!   to strict priority.
//! - When a blocked job's start cannot be worked out (resources held by jobs
//!   the timeline does not know, or `max_times` candidate times tried), the
//!   pass falls back to strict priority behind it: nothing lower starts.
//!
//! Cost: like Slurm's `bf_max_job_test`, at most `max_job_test` jobs behind
//! the first blocked one are tried per pass; the rest wait for `Priority`.
//! A request that failed to start (same shape, placement and time limit)
//! is not tried again in the pass, since free resources only shrink and
//! reservations only grow within it.

use std::collections::{BTreeMap, BTreeSet};

use crate::model::{Allocation, JobId, Millis, NodeAllocation, Placement};

use super::backfill::{
    clear_of_holds, end_of, place_during, Ahead, HeldFor, Hold, Releases, Timeline,
};
use super::check::{self, Candidate, Resolved, Scope};
use super::elastic;
use super::plan::Reservation;
use super::preempt;
use super::queue::{gate, Queue};
use super::quota::Quotas;
use super::view::{ClusterView, PendingJob};
use super::{ActiveJob, BackfillOrder, Packing, Partitions, PendingReason, Plan, Pool, Preemption};

/// One pass over `queue` (`view`'s pending jobs, already in priority order).
pub(super) fn run<'v>(
    view: &'v ClusterView,
    queue: &Queue<'v>,
    parts: &Partitions,
    cands: &[Candidate],
    mut pool: Pool<'v>,
    now: Millis,
    packing: Packing,
) -> Plan {
    let cfg = &view.backfill;
    // Jobs stopping for a preemption (earlier passes' and this one's): the
    // timeline does not count on their expected ends, since what they free
    // goes to their preemptor, which is on it as started now instead.
    let mut stopping: BTreeSet<JobId> = view
        .policy
        .running
        .iter()
        .filter(|r| r.preempted_for.is_some())
        .map(|r| r.id)
        .collect();
    let mut quotas = Quotas::new(&view.policy);
    // Jobs some running jobs are stopping for ([`preempt_for`]).
    let preemptors: BTreeSet<JobId> = view
        .policy
        .running
        .iter()
        .filter_map(|r| r.preempted_for)
        .collect();
    // Running jobs' releases, in time order, by node position: worked out
    // once for every reservation of the pass.
    let releases = Releases::new(&pool, &view.running, now);
    // The timeline's pool at a time, carried from one reservation to the next.
    let mut ahead: Option<Ahead> = None;
    // Preemption simulates on copies of the pool: a few per pass.
    let mut preempt_tries = MAX_PREEMPT_TRIES;
    // Each request's satisfiability, worked out for the first job making it.
    let mut verdicts: Vec<Option<Result<Resolved, String>>> = vec![None; queue.requests];
    // Which up nodes each distinct placement allows, in each partition.
    let mut allowed: BTreeMap<(&Placement, usize), Vec<bool>> = BTreeMap::new();
    // Requests (with their time limit) that could not start now.
    let mut failed: BTreeMap<(usize, Option<u64>), PendingReason> = BTreeMap::new();
    // Advance reservations first (`holds[..reserved_nodes]`), then the
    // blocked jobs' reservations as they are made.
    let mut holds: Vec<Hold> = advance_reservations(view, &pool, now);
    let reserved_nodes = holds.len();
    // Reservations made in each partition (`depth` is per partition, so one
    // partition's blocked jobs do not use up another's), and jobs each has
    // left to try.
    let mut held_in = vec![0usize; parts.members.len()];
    let mut left = vec![0usize; parts.members.len()];
    for q in &queue.jobs {
        if let Some(p) = q.part {
            left[p] += 1;
        }
    }
    // What this pass started, with when it ends: part of the timeline.
    let mut started: Vec<(Option<Millis>, Allocation)> = Vec::new();
    let mut slots: BTreeMap<JobId, u32> = BTreeMap::new();
    let mut singletons: BTreeSet<(&str, &str)> = BTreeSet::new();
    let mut blocked = false;
    let mut barrier = false;
    let mut tested = 0usize;
    let mut out = Plan::default();
    // The order the jobs are tried in, made only where it is not the
    // queue's: once `depth` reservations are made, backfill's
    // (`BackfillOrder`).
    let mut order: Option<Vec<usize>> = None;
    // Queue positions of jobs that were tried, could not start and got no
    // reservation: the candidates for an expected start (`estimates`).
    let mut unreserved: Vec<usize> = Vec::new();
    let mut next = 0;

    while next < queue.jobs.len() {
        let k = order.as_ref().map_or(next, |o| o[next]);
        let q = &queue.jobs[k];
        next += 1;
        if let Some(p) = q.part {
            left[p] -= 1;
        }
        // Until it is tried, a job is read from `q` only: see `super::queue`.
        if !q.plain {
            if let Some(reason) = gate(q.job, now, &slots, &singletons) {
                out.pending.push((q.id, reason));
                continue;
            }
        }
        let Some(part) = q.part else {
            out.pending.push((q.id, PendingReason::PartitionDown));
            continue;
        };
        let job = q.job;
        if let Some(name) = &job.placement.reservation {
            if let Some(reason) = reservation_gate(view, name, now) {
                out.pending.push((q.id, reason));
                continue;
            }
        }
        let verdict = verdicts[q.request].get_or_insert_with(|| {
            let in_part: Vec<Candidate> = cands
                .iter()
                .zip(&parts.members[part])
                .filter(|(_, &m)| m)
                .map(|(c, _)| *c)
                .collect();
            check::fits_some(&in_part, job, Scope::Up)
        });
        let resolved = match verdict {
            Ok(r) => *r,
            Err(why) => {
                out.pending
                    .push((q.id, PendingReason::Unsatisfiable(why.clone())));
                continue;
            }
        };
        let gpus = u64::from(resolved.per_node.gpus) * u64::from(resolved.nodes);
        if q.capped {
            if let Err(reason) = quotas.gate(job, gpus) {
                out.pending.push((q.id, reason));
                continue;
            }
        }
        if barrier || (blocked && cfg.depth == 0) {
            out.pending.push((q.id, PendingReason::Priority));
            continue;
        }
        if blocked {
            if tested >= cfg.max_job_test {
                out.pending.push((q.id, PendingReason::Priority));
                continue;
            }
            tested += 1;
        }
        let end = job.time_limit_secs.map(|s| end_of(now, s));
        let allowed = allowed.entry((&job.placement, part)).or_insert_with(|| {
            let mut a = pool.allowed(&job.placement);
            a.iter_mut()
                .zip(&parts.members[part])
                .for_each(|(a, &m)| *a &= m);
            if let Some(r) = (job.placement.reservation.as_ref())
                .and_then(|name| view.policy.policy.reservations.get(name))
            {
                // A job in a reservation runs on its nodes only.
                for (a, n) in a.iter_mut().zip(&pool.nodes) {
                    *a &= r.holds(&n.view.name);
                }
            }
            a
        });
        let key = (q.request, job.time_limit_secs);
        let attempt = match failed.get(&key) {
            Some(r) => Err(r.clone()),
            None => {
                let (placed, held) = place_during(
                    &mut pool,
                    &holds,
                    (now, end),
                    job,
                    resolved,
                    allowed,
                    packing,
                );
                // An elastic job that starts at its minimum starts on as
                // many nodes of its range as it can.
                let placed = match placed {
                    Ok(at_min) if job.placement.elastic.is_some() => Ok(elastic::place_largest(
                        &mut pool,
                        &holds,
                        (now, end),
                        job,
                        resolved,
                        allowed,
                        packing,
                        |g| !q.capped || quotas.gate(job, g).is_ok(),
                    )
                    .unwrap_or(at_min)),
                    other => other,
                };
                placed.map_err(|reason| {
                    // Would it fit but for the reservations?
                    let taken_by_holds =
                        held && pool.place(job, resolved, allowed, packing).is_ok();
                    let r = if taken_by_holds {
                        // By an advance reservation, or by blocked jobs?
                        let resv = &holds[..reserved_nodes];
                        let (alone, _) = place_during(
                            &mut pool,
                            resv,
                            (now, end),
                            job,
                            resolved,
                            allowed,
                            packing,
                        );
                        match alone
                            .err()
                            .and_then(|_| in_the_way(resv, job, (now, end), allowed, &pool))
                        {
                            Some(r) => r,
                            None => PendingReason::ReservedForOthers,
                        }
                    } else {
                        reason
                    };
                    failed.insert(key, r.clone());
                    r
                })
            }
        };
        match attempt {
            Ok(alloc) => {
                pool.charge(&alloc);
                quotas.charge(job, alloc.gpus());
                if let Some(t) = job.array_throttle {
                    if let Some(s) = slots.get_mut(&t.array) {
                        *s = s.saturating_sub(1);
                    } else {
                        slots.insert(t.array, t.slots.saturating_sub(1));
                    }
                }
                if let Some(name) = &job.singleton {
                    singletons.insert((job.user.as_str(), name.as_str()));
                }
                started.push((end, alloc.clone()));
                out.allocations.push(alloc);
            }
            Err(reason) => {
                // May it take what others hold? Only where that leaves room
                // for the reservations it would overlap: it delays none.
                let preempting = preempt_for(
                    view,
                    &pool,
                    job,
                    resolved,
                    allowed,
                    packing,
                    now,
                    gpus,
                    &quotas,
                    &mut preempt_tries,
                    &preemptors,
                )
                .filter(|(p, at)| {
                    // What each victim frees: all it holds, or what a
                    // shrinking elastic job gives back.
                    let freed: Vec<Allocation> = view
                        .policy
                        .running
                        .iter()
                        .filter_map(|r| {
                            let kept = match p {
                                Some(p) if p.victims.contains(&r.id) => None,
                                Some(p) => Some(p.shrinks.iter().find(|k| k.job == r.id)?),
                                None if r.preempted_for == Some(job.id) => {
                                    r.elastic.as_ref().and_then(|e| e.resizing_to.as_deref())
                                }
                                None => return None,
                            };
                            Some(elastic::given_back(&r.allocation, kept))
                        })
                        .collect();
                    let victims: Vec<&Allocation> = freed.iter().collect();
                    clear_of_holds(&pool, &victims, &holds, job, now, end, at)
                });
                if let Some((preemption, reserved)) = preempting {
                    // What it will take once the victims stopped is not for
                    // the jobs behind it.
                    pool.charge(&reserved);
                    started.push((end, reserved));
                    // It may charge what victims still hold, and they are not
                    // released any more: the timeline's pool is stale.
                    ahead = None;
                    if let Some(p) = preemption {
                        stopping.extend(p.victims.iter().copied());
                        out.preemptions.push(p);
                    }
                    out.pending.push((job.id, PendingReason::Preempting));
                    continue;
                }
                let first = !blocked;
                blocked = true;
                let mut reserved = false;
                if held_in[part] < cfg.depth {
                    let timeline = Timeline {
                        pool: &pool,
                        running: &releases,
                        stopping: &stopping,
                        started: &started,
                        holds: &holds,
                        now,
                        max_times: cfg.max_times,
                    };
                    if let Some((start, alloc)) =
                        timeline.earliest(&mut ahead, job, resolved, allowed, packing)
                    {
                        let end = job.time_limit_secs.map(|s| end_of(start, s));
                        out.reservations.push(Reservation {
                            job: job.id,
                            start,
                            end,
                            allocation: alloc.clone(),
                        });
                        holds.push(Hold {
                            start,
                            end,
                            alloc,
                            resv: None,
                        });
                        held_in[part] += 1;
                        reserved = true;
                        let all_made =
                            || (left.iter().zip(&held_in)).all(|(&l, &h)| l == 0 || h >= cfg.depth);
                        if cfg.order == BackfillOrder::Shortest && order.is_none() && all_made() {
                            // Every partition with jobs left has its
                            // reservations: the rest is backfill, tried in
                            // its own order.
                            let jobs = &queue.jobs;
                            order.insert((0..jobs.len()).collect())[next..]
                                .sort_unstable_by_key(|&k| (jobs[k].limit.unwrap_or(u64::MAX), k));
                        }
                    }
                }
                if !reserved && held_in[part] < cfg.depth {
                    // Its start is unknown: protect it the strict way.
                    barrier = true;
                }
                if !reserved && cfg.estimates > 0 {
                    unreserved.push(k);
                }
                let reason = match reason {
                    r if first => r,
                    PendingReason::ReservedForOthers => PendingReason::ReservedForOthers,
                    r @ PendingReason::ReservedNodes { .. } => r,
                    _ => PendingReason::Priority,
                };
                out.pending.push((job.id, reason));
            }
        }
    }
    // Expected starts for blocked jobs past the reservations (what `gpuq
    // queue --start` shows), up to `estimates` a partition: worked out on
    // the timeline as reservations would be, in queue order, once every
    // decision of the pass is made, so they change none.
    if cfg.estimates > 0 {
        // In queue order (backfill's own order may have tried them in
        // another).
        unreserved.sort_unstable();
        let mut estimated = vec![0usize; parts.members.len()];
        ahead = None;
        for &k in &unreserved {
            let q = &queue.jobs[k];
            let Some(part) = q.part else { continue };
            if estimated[part] >= cfg.estimates {
                continue;
            }
            let Some(Ok(resolved)) = &verdicts[q.request] else {
                continue;
            };
            let Some(allowed) = allowed.get(&(&q.job.placement, part)) else {
                continue;
            };
            estimated[part] += 1;
            let timeline = Timeline {
                pool: &pool,
                running: &releases,
                stopping: &stopping,
                started: &started,
                holds: &holds,
                now,
                max_times: cfg.max_times,
            };
            if let Some((start, alloc)) =
                timeline.earliest(&mut ahead, q.job, *resolved, allowed, packing)
            {
                let end = q.job.time_limit_secs.map(|s| end_of(start, s));
                out.reservations.push(Reservation {
                    job: q.id,
                    start,
                    end,
                    allocation: alloc.clone(),
                });
                holds.push(Hold {
                    start,
                    end,
                    alloc,
                    resv: None,
                });
            }
        }
    }
    // Last, below every pending job: elastic jobs grow into what is left,
    // clear of every reservation, unless the pass fell back to strict
    // priority (a blocked job's start is unknown).
    if !barrier {
        let settle = cfg.elastic_settle_secs;
        out.growths = elastic::grow(
            &view.policy.running,
            settle,
            &mut pool,
            parts,
            &holds,
            now,
            packing,
        );
    }
    out
}

/// Preemption attempts (each simulates on copies of the pool) per pass.
const MAX_PREEMPT_TRIES: u32 = 16;

/// For a job that does not fit now: if jobs are already stopping for it,
/// where it will go once they have (no new victims); else new victims that
/// make it fit, if it may preempt any. `None`: it just waits.
#[allow(clippy::too_many_arguments)]
fn preempt_for(
    view: &ClusterView,
    pool: &Pool,
    job: &PendingJob,
    resolved: Resolved,
    allowed: &[bool],
    packing: Packing,
    now: Millis,
    gpus: u64,
    quotas: &Quotas,
    tries: &mut u32,
    preemptors: &BTreeSet<JobId>,
) -> Option<(Option<Preemption>, Allocation)> {
    let stopping: Vec<&ActiveJob> = if preemptors.contains(&job.id) {
        view.policy
            .running
            .iter()
            .filter(|r| r.preempted_for == Some(job.id))
            .collect()
    } else {
        Vec::new()
    };
    if !stopping.is_empty() {
        let mut freed = pool.clone();
        for r in &stopping {
            freed.release(&r.allocation);
            // A shrinking elastic job frees only what it gives back.
            if let Some(kept) = r.elastic.as_ref().and_then(|e| e.resizing_to.as_ref()) {
                freed.charge(kept);
            }
        }
        let at = freed.place(job, resolved, allowed, packing).ok()?;
        return Some((None, at));
    }
    if *tries == 0 {
        return None;
    }
    let cands = preempt::candidates(&view.policy, job, gpus, &|a| quotas.account_gpus(a));
    if cands.is_empty() {
        return None;
    }
    *tries -= 1;
    // Elastic jobs give back their nodes above their minimum first.
    let shrinkable: Vec<ActiveJob> = cands
        .iter()
        .filter_map(|r| elastic::shrinkable(r))
        .collect();
    if !shrinkable.is_empty() {
        let offered: Vec<&ActiveJob> = shrinkable.iter().collect();
        if let Some((ids, at)) = preempt::find(pool, job, resolved, allowed, packing, &offered, now)
        {
            let mut why = Vec::new();
            let mut shrinks = Vec::new();
            for r in cands.iter().filter(|r| ids.contains(&r.id)) {
                shrinks.push(elastic::kept_after(r, &at));
                why.push(preempt::why(&view.policy, job, r));
            }
            let p = Preemption {
                job: job.id,
                victims: Vec::new(),
                why,
                shrinks,
            };
            return Some((Some(p), at));
        }
    }
    let (victims, at) = preempt::find(pool, job, resolved, allowed, packing, &cands, now)?;
    let why = victims
        .iter()
        .filter_map(|id| cands.iter().find(|r| r.id == *id))
        .map(|r| preempt::why(&view.policy, job, r))
        .collect();
    Some((
        Some(Preemption {
            job: job.id,
            victims,
            why,
            shrinks: Vec::new(),
        }),
        at,
    ))
}

/// Each advance reservation not yet over as a hold on the whole of its
/// nodes (every GPU, CPU and MiB, whatever runs there) over its window.
fn advance_reservations(view: &ClusterView, pool: &Pool, now: Millis) -> Vec<Hold> {
    let reservations = &view.policy.policy.reservations;
    if reservations.is_empty() {
        return Vec::new();
    }
    reservations
        .values()
        .filter(|r| r.end > now)
        .map(|r| Hold {
            start: r.start,
            end: Some(r.end),
            alloc: Allocation {
                job: JobId(0),
                // The pool's nodes: the view's own are not filled in for a
                // pass over borrowed nodes (`ViewRef`).
                nodes: (pool.nodes.iter().map(|n| n.view))
                    .filter(|n| r.holds(&n.name))
                    .map(|n| NodeAllocation {
                        node: n.name.clone(),
                        gpus: n.inventory.gpus.iter().map(|g| g.index).collect(),
                        cpus: super::view::cpu_layout(&n.inventory).unwrap_or_default(),
                        cpu_count: n.inventory.cpus,
                        memory_mb: n.inventory.memory_mb,
                    })
                    .collect(),
            },
            resv: Some(HeldFor {
                name: r.name.clone(),
                maint: r.maint,
            }),
        })
        .collect()
}

/// Why a job that names reservation `name` may not be tried now: it is
/// gone, over, or not started.
fn reservation_gate(view: &ClusterView, name: &str, now: Millis) -> Option<PendingReason> {
    match view.policy.policy.reservations.get(name) {
        None => Some(PendingReason::Unsatisfiable(format!(
            "its reservation {name} does not exist any more; cancel the job, or submit it \
             again without --reservation"
        ))),
        Some(r) if r.end <= now => Some(PendingReason::Unsatisfiable(format!(
            "its reservation {name} is over; cancel the job, or submit it again without \
             --reservation"
        ))),
        Some(r) if r.start > now => Some(PendingReason::ReservationNotStarted(name.to_string())),
        Some(_) => None,
    }
}

/// The advance reservation (of `resv`) keeping `job` off nodes it could
/// use over `[from, to)`, as its pending reason.
fn in_the_way(
    resv: &[Hold],
    job: &PendingJob,
    (from, to): (Millis, Option<Millis>),
    allowed: &[bool],
    pool: &Pool,
) -> Option<PendingReason> {
    resv.iter()
        .filter(|h| h.binds(job) && h.end.is_none_or(|e| e > from))
        .filter(|h| to.is_none_or(|to| h.start < to))
        .find(|h| {
            h.alloc
                .nodes
                .iter()
                .any(|na| pool.position(&na.node).is_some_and(|i| allowed[i]))
        })
        .and_then(|h| h.resv.as_ref())
        .map(|r| PendingReason::ReservedNodes {
            reservation: r.name.clone(),
            maint: r.maint,
        })
}
