//! The scheduler: a pure function from a read-only [`ClusterView`] and `now`
//! to a [`Plan`] (what to start where, and why the rest waits). No I/O, no
//! clocks, nothing async: the leader builds the view from the replicated state,
//! calls [`plan`], and proposes the result as one `Command::Schedule`; apply
//! re-checks every allocation with [`check_allocation`] against the state as it
//! is then, since the state may have moved while the pass ran (Nomad's
//! optimistic plan applier).
//!
//! This first policy is strict FIFO with gang placement and best fit:
//! - Queue order: priority (higher first), then submit time, then id.
//! - The first job that cannot start now waits for `Resources` and every job
//!   behind it for `Priority`, so a big job is never starved by small ones.
//!   Backfill will relax this with reservations.
//! - A job no set of up nodes could hold even empty is `Unsatisfiable` and
//!   does not block the queue.
//! - A job gets `nodes` distinct up nodes, each with its per-node share free,
//!   or nothing (gang). Among the nodes that fit, the fullest first (fewest free
//!   GPUs, then CPUs, then memory, then name), which keeps whole nodes free for
//!   whole-node jobs; inside a node, the closest GPUs ([`pick_gpus`]).
//!
//! Where it grows: multifactor priority replaces `PendingJob::priority`;
//! topology domains join the node order ahead of best fit; fair-share, quotas,
//! backfill and preemption add reasons ([`PendingReason`] already names them)
//! and fields of [`Plan`].

mod check;
mod gpus;
mod plan;
mod view;

#[cfg(test)]
mod tests;

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet};

use crate::model::{Allocation, Millis, NodeAllocation};

pub use check::{check_allocation, feasible};
pub use gpus::pick_gpus;
pub use plan::{PendingReason, Plan};
pub use view::{
    Capacity, ClusterView, NodeState, NodeView, PendingJob, Shape, Usage, DEFAULT_MEM_PER_CPU_MB,
};

use check::Scope;

/// One scheduling pass: places pending jobs in queue order on the free
/// resources of up nodes, counting what earlier jobs of the same pass took.
///
/// `now` is the leader's clock, stamped into the pass; the FIFO policy does not
/// read it yet (age priority and begin times will).
///
/// Cost: O(jobs × nodes) at worst, and O(1) per job (plus one cached
/// satisfiability check per distinct shape) once the queue is blocked. At the
/// design's scale (100k jobs × 10k nodes, with backfill looking past the head)
/// the per-job node scan becomes an index of free capacity by shape.
pub fn plan(view: &ClusterView, now: Millis) -> Plan {
    let _ = now;
    let mut pool = Pool::new(&view.nodes);
    let capacities: Vec<Capacity> = pool.nodes.iter().map(|n| n.view.capacity()).collect();
    // Satisfiability depends only on the shape; queues repeat shapes a lot.
    let mut verdicts: BTreeMap<(u32, Shape), Result<(), String>> = BTreeMap::new();

    let mut queue: Vec<&PendingJob> = view.pending.iter().collect();
    queue.sort_by_key(|j| (Reverse(j.priority), j.submit_time, j.id));

    let mut out = Plan::default();
    let mut blocked = false;
    for job in queue {
        let verdict = verdicts
            .entry((job.nodes, job.per_node()))
            .or_insert_with(|| check::fits_some(&capacities, job, Scope::Up));
        if let Err(why) = verdict {
            out.pending
                .push((job.id, PendingReason::Unsatisfiable(why.clone())));
            continue;
        }
        if blocked {
            out.pending.push((job.id, PendingReason::Priority));
            continue;
        }
        match pool.place(job) {
            Some(alloc) => {
                pool.charge(&alloc);
                out.allocations.push(alloc);
            }
            None => {
                out.pending.push((job.id, PendingReason::Resources));
                blocked = true;
            }
        }
    }
    out
}

/// The free resources of the up nodes during a pass.
struct Pool<'v> {
    /// Up nodes, sorted by name (a repeated name keeps its first entry).
    nodes: Vec<FreeNode<'v>>,
    /// Sum of free GPUs over `nodes`, to turn a job away without a scan.
    free_gpus: u64,
    /// Node position by name, for charging an allocation.
    by_name: BTreeMap<&'v str, usize>,
}

struct FreeNode<'v> {
    view: &'v NodeView,
    gpus: BTreeSet<u32>,
    cpus: u64,
    memory_mb: u64,
}

impl FreeNode<'_> {
    fn free(&self) -> Capacity {
        Capacity {
            gpus: self.gpus.len() as u64,
            cpus: self.cpus,
            memory_mb: self.memory_mb,
        }
    }
}

impl<'v> Pool<'v> {
    fn new(views: &'v [NodeView]) -> Pool<'v> {
        let mut up: Vec<&NodeView> = views.iter().filter(|n| n.state == NodeState::Up).collect();
        up.sort_by(|a, b| a.name.cmp(&b.name));
        up.dedup_by(|later, first| later.name == first.name);
        let nodes: Vec<FreeNode> = up
            .into_iter()
            .map(|view| FreeNode {
                view,
                gpus: view.free_gpus(),
                cpus: view.free_cpus(),
                memory_mb: view.free_memory_mb(),
            })
            .collect();
        let free_gpus = nodes.iter().map(|n| n.gpus.len() as u64).sum();
        let by_name = nodes
            .iter()
            .enumerate()
            .map(|(i, n)| (n.view.name.as_str(), i))
            .collect();
        Pool {
            nodes,
            free_gpus,
            by_name,
        }
    }

    /// Where `job` would go now, whole, or `None`.
    fn place(&self, job: &PendingJob) -> Option<Allocation> {
        let shape = job.per_node();
        let want = job.nodes as usize;
        if self.free_gpus < u64::from(shape.gpus) * u64::from(job.nodes) {
            return None;
        }
        let cpu_count = u32::try_from(shape.cpus).ok()?;
        // Best fit: fullest nodes first; names are unique, so the order is total.
        let mut fits: Vec<(Capacity, &str, usize)> = self
            .nodes
            .iter()
            .enumerate()
            .filter(|(_, n)| n.free().holds(&shape))
            .map(|(i, n)| (n.free(), n.view.name.as_str(), i))
            .collect();
        if fits.len() < want {
            return None;
        }
        if want < fits.len() {
            fits.select_nth_unstable(want - 1);
            fits.truncate(want);
        }
        // Node ranks in name order: rank 0 (MASTER_ADDR) is the first name.
        fits.sort_by_key(|&(_, name, _)| name);
        let nodes = fits
            .into_iter()
            .map(|(_, _, i)| {
                let n = &self.nodes[i];
                Some(NodeAllocation {
                    node: n.view.name.clone(),
                    gpus: pick_gpus(&n.view.inventory, &n.gpus, shape.gpus)?,
                    cpus: Vec::new(),
                    cpu_count,
                    memory_mb: shape.memory_mb,
                })
            })
            .collect::<Option<Vec<_>>>()?;
        Some(Allocation { job: job.id, nodes })
    }

    /// Takes what `alloc` holds out of the pool.
    fn charge(&mut self, alloc: &Allocation) {
        for na in &alloc.nodes {
            let Some(&i) = self.by_name.get(na.node.as_str()) else {
                continue;
            };
            let n = &mut self.nodes[i];
            for g in &na.gpus {
                if n.gpus.remove(g) {
                    self.free_gpus -= 1;
                }
            }
            n.cpus = n.cpus.saturating_sub(u64::from(na.cpu_count));
            n.memory_mb = n.memory_mb.saturating_sub(na.memory_mb);
        }
    }
}
