//! Backfill (Slurm's backfill: EASY for jobs past the reservation depth,
//! conservative for the top `depth` blocked ones): the reservations the pass
//! loop (`pass`) gives blocked jobs, and the rule by which a lower job may
//! start ahead of them.
//!
//! - The first `depth` jobs of each partition that cannot start get a
//!   [`Reservation`] (per partition, as Slurm's `bf_max_job_part`): the
//!   earliest time `T` their placement (the same gang-, topology- and
//!   constraint-aware placement as a start now) fits on a timeline of free
//!   capacity, built from running jobs' expected ends (start + time limit)
//!   and the jobs this pass started, minus the earlier reservations that
//!   overlap `[T, T + limit)`. `T` is the job's expected start.
//! - A lower job starts now only if it fits the free resources minus every
//!   reservation it would overlap: a reservation starting after the job's own
//!   end (now + its time limit) is not in its way; any other is. A job with
//!   no time limit overlaps them all. So no start delays a reservation.
//! - A preemptor goes only where what it would take once the victims stopped
//!   leaves room for the reservations it would overlap ([`clear_of_holds`]).
//!
//! Cost: each reservation walks at most `max_times` candidate start times,
//! and places only at those where enough GPUs are free; an O(reserved GPUs)
//! count rules out the others.
//!
//! Counts (CPUs, memory) of a reservation are subtracted from what is free
//! now in full, even where part of them would be released by running jobs
//! first: conservative, so a backfilled job may be turned away needlessly,
//! never let in wrongly. GPUs are exact (indices).

use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};

use crate::model::{Allocation, JobId, Millis};

use super::check::Resolved;
use super::pool::Part;
use super::view::{PendingJob, RunningJob};
use super::{Packing, PendingReason, Pool};

/// Backfill's knobs (Slurm's `bf_*` parameters).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct BackfillConfig {
    /// How many blocked jobs of each partition get a reservation (and an
    /// expected start). 0: strict priority order, nothing overtakes a
    /// blocked job.
    pub depth: usize,
    /// Jobs tried per pass behind the first blocked one (`bf_max_job_test`).
    pub max_job_test: usize,
    /// Candidate start times one reservation looks at before giving up.
    pub max_times: usize,
    /// A running job without a time limit is expected to end this long after
    /// its start (a guess for the timeline only: it is not enforced, and a
    /// job without a limit is never backfilled ahead of a reservation).
    pub default_time_limit_secs: u64,
    /// The order jobs are tried in once every partition with jobs left has
    /// its `depth` reservations.
    pub order: BackfillOrder,
    /// Blocked jobs of each partition past its reservations that get an
    /// expected start anyway (`gpuq queue --start`), worked out after the
    /// pass's decisions: shown, never held. 0: none (replays, which show
    /// nothing, skip the cost).
    pub estimates: usize,
    /// A running elastic job grows only after this long at its size (since
    /// it started or last changed size), so nodes freed one after another
    /// restart its ranks once, not once per node.
    pub elastic_settle_secs: u64,
}

/// The order backfill tries the jobs in once the pass has made its `depth`
/// reservations in every partition with jobs left (before that, and for the reservations themselves, it is
/// queue order). Nothing tried after the reservations can delay them, and a
/// job reaches the head of the queue as its priority grows: neither order
/// starves a job.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum BackfillOrder {
    /// Queue (priority) order, as Slurm's backfill.
    Priority,
    /// Shortest time limit first, then queue order (a job without a limit
    /// last): short jobs fill the holes before the reservations first, so
    /// more of them fit and fewer long ones are left waiting behind holes
    /// they could not use (Tsafrir et al.'s SJBF).
    #[default]
    Shortest,
}

/// EASY backfill with the shortest jobs tried first (Tsafrir et al.'s
/// EASY-SJBF): one reservation per partition, the rest shortest limit
/// first. On the ITP trace's largest cluster at load 0.9 (`gpuq sim replay`,
/// docs/replay.md) it cut the mean wait by 35% against ten reservations in
/// priority order, at the same utilisation, with large jobs waiting about
/// as long and the longest wait no longer.
impl Default for BackfillConfig {
    fn default() -> Self {
        BackfillConfig {
            depth: 1,
            max_job_test: 500,
            max_times: 1000,
            default_time_limit_secs: 24 * 3600,
            order: BackfillOrder::default(),
            estimates: 10,
            elastic_settle_secs: 10,
        }
    }
}

/// Resources set aside over `[start, end)`: for a blocked job, or the
/// nodes of an advance reservation (`resv`).
pub(super) struct Hold {
    pub start: Millis,
    pub end: Option<Millis>,
    pub alloc: Allocation,
    /// The advance reservation it is, whose own jobs it does not bind.
    pub resv: Option<HeldFor>,
}

/// The advance reservation a [`Hold`] is.
pub(super) struct HeldFor {
    pub name: String,
    pub maint: bool,
}

impl Hold {
    /// Whether it keeps `job` off what it holds: every hold does, but an
    /// advance reservation's for the jobs that run in it.
    pub fn binds(&self, job: &PendingJob) -> bool {
        self.resv
            .as_ref()
            .is_none_or(|r| job.placement.reservation.as_deref() != Some(r.name.as_str()))
    }

    /// Whether it overlaps `[from, to)` (`to: None`: forever).
    fn overlaps(&self, from: Millis, to: Option<Millis>) -> bool {
        let starts_before_end = to.is_none_or(|to| self.start < to);
        let ends_after_start = self.end.is_none_or(|e| e > from);
        starts_before_end && ends_after_start
    }
}

/// Whether `at` (where a preemptor goes once `victims` stopped) leaves room
/// for every reservation overlapping `[from, to)`.
pub(super) fn clear_of_holds(
    pool: &Pool,
    victims: &[&Allocation],
    holds: &[Hold],
    job: &PendingJob,
    from: Millis,
    to: Option<Millis>,
    at: &Allocation,
) -> bool {
    let mut p = pool.clone();
    for v in victims {
        p.release(v);
    }
    for h in holds
        .iter()
        .filter(|h| h.overlaps(from, to) && h.binds(job))
    {
        p.charge(&h.alloc);
    }
    at.nodes.iter().all(|na| {
        p.position(&na.node).is_some_and(|i| {
            let n = &p.nodes[i];
            na.gpus.iter().all(|&g| n.gpus.contains(g))
                && n.cpus >= u64::from(na.cpu_count)
                && n.memory_mb >= na.memory_mb
        })
    })
}

/// `secs` after `start`.
pub(super) fn end_of(start: Millis, secs: u64) -> Millis {
    start.saturating_add(secs.saturating_mul(1000))
}

/// Where `job` would go on `pool` less the reservations overlapping
/// `during` (`[from, to)`), and whether any does. The reservations are
/// charged to the nodes they name and those nodes put back after: `pool`
/// is as it was, and no copy of it is made.
pub(super) fn place_during(
    pool: &mut Pool,
    holds: &[Hold],
    (from, to): (Millis, Option<Millis>),
    job: &PendingJob,
    resolved: Resolved,
    allowed: &[bool],
    packing: Packing,
) -> (Result<Allocation, PendingReason>, bool) {
    let over: Vec<&Hold> = holds
        .iter()
        .filter(|h| h.overlaps(from, to) && h.binds(job))
        .collect();
    if over.is_empty() {
        return (pool.place(job, resolved, allowed, packing), false);
    }
    let saved = pool.save(over.iter().map(|h| &h.alloc));
    for h in &over {
        pool.charge(&h.alloc);
    }
    let placed = pool.place(job, resolved, allowed, packing);
    pool.restore(saved);
    (placed, true)
}

/// Running jobs' releases for backfill's timeline, sorted once per pass:
/// each with its expected end (a past one counts as "any moment", now + 1)
/// and its parts resolved to node positions in the pass's pool (parts on
/// nodes that are not up are dropped: they free nothing the pass uses).
/// Jobs never known to end are not in it. The parts of all jobs are one
/// vector: a release is a range of it, not an allocation of its own.
pub(super) struct Releases<'v> {
    ends: Vec<Release>,
    parts: Vec<Part<'v>>,
}

/// When a running job ends, which, and its parts (a range of
/// [`Releases::parts`]).
struct Release {
    at: Millis,
    job: JobId,
    parts: std::ops::Range<usize>,
}

impl<'v> Releases<'v> {
    pub fn new(pool: &Pool, running: &'v [RunningJob], now: Millis) -> Releases<'v> {
        let mut parts = Vec::with_capacity(running.len());
        let mut ends: Vec<Release> = running
            .iter()
            .filter_map(|r| {
                let at = r.expected_end?.max(now + 1);
                let from = parts.len();
                parts.extend(
                    r.allocation
                        .nodes
                        .iter()
                        .filter_map(|na| Some(Part::new(pool.position(&na.node)?, na))),
                );
                Some(Release {
                    at,
                    job: r.id,
                    parts: from..parts.len(),
                })
            })
            .collect();
        // Stable: releases at one time keep the view's order (their order
        // does not change what is free after them anyway).
        ends.sort_by_key(|e| e.at);
        Releases { ends, parts }
    }
}

/// The pool as it will be at a time `t` of the timeline: what is free now
/// plus every release up to `t`. Built by the pass's first reservation and
/// carried to the next ones, which mostly look at the same or later times
/// (a busy fleet's blocked jobs wait for the same releases): a copy of the
/// pool and the releases into it cost O(nodes + running jobs), and were most
/// of a 10,000-node pass when each reservation made its own.
///
/// It moves forward only. A reservation that looks at an earlier time gets
/// a new one made from the pool. The pass's starts since it was made are
/// charged to it before it is used (a start takes GPUs free now, which no
/// release gives back, so charging it before or after the releases comes
/// to the same), and released again at their ends. Anything else the pass
/// does to its pool (a preemptor's charge, a new victim whose release no
/// longer counts) makes it stale, and the pass drops it.
pub(super) struct Ahead<'v> {
    at: Pool<'v>,
    /// Every release with an end up to `t` is in `at`.
    t: Millis,
    /// Running jobs' releases applied: a prefix of [`Releases::ends`].
    next_run: usize,
    /// This pass's starts charged to `at`: a prefix of the pass's list.
    charged: usize,
    /// Those of them still to be released, by end.
    ending: std::collections::BinaryHeap<std::cmp::Reverse<(Millis, usize)>>,
}

impl<'v> Ahead<'v> {
    fn new(pool: &Pool<'v>, started: &[(Option<Millis>, Allocation)], now: Millis) -> Ahead<'v> {
        // The starts are in `pool` already; they are released at their ends.
        let ending = started
            .iter()
            .enumerate()
            .filter_map(|(i, (e, _))| Some(std::cmp::Reverse(((*e)?.max(now + 1), i))))
            .collect();
        Ahead {
            at: pool.clone(),
            t: now,
            next_run: 0,
            charged: started.len(),
            ending,
        }
    }

    /// Moves to time `t` (not before the current one): charges the pass's
    /// starts made since, then releases what ends up to `t`.
    fn advance(
        &mut self,
        t: Millis,
        running: &Releases<'v>,
        stopping: &BTreeSet<JobId>,
        started: &[(Option<Millis>, Allocation)],
        now: Millis,
    ) {
        debug_assert!(t >= self.t);
        for (i, (end, alloc)) in started.iter().enumerate().skip(self.charged) {
            self.at.charge(alloc);
            if let Some(e) = end {
                self.ending.push(std::cmp::Reverse(((*e).max(now + 1), i)));
            }
        }
        self.charged = started.len();
        self.t = t;
        while let Some(r) = running.ends.get(self.next_run).filter(|r| r.at <= t) {
            if stopping.is_empty() || !stopping.contains(&r.job) {
                for part in &running.parts[r.parts.clone()] {
                    self.at.release_part(part);
                }
            }
            self.next_run += 1;
        }
        while let Some(&std::cmp::Reverse((e, i))) = self.ending.peek() {
            if e > t {
                break;
            }
            self.at.release(&started[i].1);
            self.ending.pop();
        }
    }
}

/// Free capacity over time, for one reservation's search.
pub(super) struct Timeline<'a, 'v> {
    /// Free now, after this pass's starts.
    pub pool: &'a Pool<'v>,
    pub running: &'a Releases<'v>,
    /// Jobs in `running` whose release the timeline ignores.
    pub stopping: &'a BTreeSet<JobId>,
    pub started: &'a [(Option<Millis>, Allocation)],
    pub holds: &'a [Hold],
    pub now: Millis,
    pub max_times: usize,
}

impl<'v> Timeline<'_, 'v> {
    /// The earliest time after now at which `job` fits for its whole time
    /// limit, and where; `None` if the timeline does not know one. `ahead`
    /// is the pool at a time of the timeline, carried between reservations.
    pub fn earliest(
        &self,
        ahead: &mut Option<Ahead<'v>>,
        job: &PendingJob,
        resolved: Resolved,
        allowed: &[bool],
        packing: Packing,
    ) -> Option<(Millis, Allocation)> {
        // Candidate times, in order: the running jobs' ends (sorted once per
        // pass), this pass's starts' and the reservations' ends.
        let mut times: Vec<Millis> =
            Vec::with_capacity(self.running.ends.len() + self.started.len());
        for e in &self.running.ends {
            if times.last() != Some(&e.at)
                && (self.stopping.is_empty() || !self.stopping.contains(&e.job))
            {
                times.push(e.at);
            }
        }
        times.extend(
            self.started
                .iter()
                .filter_map(|(e, _)| Some((*e)?.max(self.now + 1))),
        );
        times.extend(self.holds.iter().filter_map(|h| h.end));
        times.retain(|&t| t > self.now);
        times.sort_unstable();
        times.dedup();

        let need = u64::from(resolved.per_node.gpus) * u64::from(resolved.nodes);
        for (i, &t) in times.iter().enumerate() {
            if i >= self.max_times {
                return None;
            }
            if ahead.as_ref().is_some_and(|a| a.t > t) {
                *ahead = None;
            }
            let at = ahead.get_or_insert_with(|| Ahead::new(self.pool, self.started, self.now));
            at.advance(t, self.running, self.stopping, self.started, self.now);
            let at = &mut at.at;
            let to = job.time_limit_secs.map(|s| end_of(t, s));
            // Free GPUs the overlapping reservations take: an exact count.
            let taken: u64 = self
                .holds
                .iter()
                .filter(|h| h.overlaps(t, to) && h.binds(job))
                .flat_map(|h| h.alloc.nodes.iter())
                .map(|na| {
                    na.gpus
                        .iter()
                        .filter(|g| at.is_free_gpu(&na.node, **g))
                        .count() as u64
                })
                .sum();
            if at.free_gpus.saturating_sub(taken) < need {
                continue;
            }
            let (placed, _) =
                place_during(at, self.holds, (t, to), job, resolved, allowed, packing);
            if let Ok(alloc) = placed {
                return Some((t, alloc));
            }
        }
        None
    }
}
