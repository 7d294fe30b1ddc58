//! The scheduler: a pure function from a read-only [`ClusterView`] and `now`
//! to a [`Plan`] (what to start where, and why the rest waits). No I/O, no
//! clocks, nothing async: the leader builds the view from the replicated state,
//! calls [`plan`], and proposes the result as one `Command::Schedule`; apply
//! re-checks every allocation with [`check_allocation`] against the state as it
//! is then, since the state may have moved while the pass ran (Nomad's
//! optimistic plan applier).
//!
//! The policy: queue order with backfill, gang placement and best fit:
//! - Queue order: multifactor priority ([`priority`]: age, fair-share from
//!   [`fairshare`], job size, QoS, partition, minus nice; with the view's
//!   default all-zero weights, plain FIFO), a restarting gang first among
//!   equals, then submit time, then id.
//! - A job in a down partition waits (`PartitionDown`), one over an account
//!   cap or a QoS's per-user cap waits (`QuotaExceeded`, `quota`); neither
//!   blocks the jobs behind it. A job is placed only on its partition's nodes.
//! - The first job that cannot start now waits for `Resources` (or, under
//!   `--topology`, for `Topology`) and the jobs behind it for `Priority`,
//!   except those backfill lets start because they delay no reservation of
//!   the top blocked jobs ([`backfill`] says how; its reservations give
//!   those jobs an expected start), so a big job is never starved by small
//!   ones. Holds, dependencies, `--begin` and array throttles keep a job
//!   back without blocking anyone. Unless it may preempt (`preempt`): then
//!   the fewest victims that make it fit (outside the reservations) go in
//!   [`Plan::preemptions`], it waits as `Preempting` with what it will take
//!   reserved, and the queue goes on.
//! - A job no set of up nodes could hold even empty is `Unsatisfiable` and
//!   does not block the queue. A `--gpus N` job gets its shape here, from what
//!   the up nodes could hold (see `check::resolve_total`).
//! - Only nodes its placement allows (`--gpu-type`, `--constraint`,
//!   `--nodelist`, `--exclude`) are candidates for a job.
//! - A job gets `nodes` distinct up nodes, each with its per-node share free,
//!   or nothing (gang). One node: the fullest that fits (fewest free GPUs left
//!   after it, then CPUs, then memory), which keeps whole nodes free for
//!   whole-node jobs; of nodes that tie, the one busy longest (the latest
//!   expected end of what runs there, [`RunningJob::expected_end`]), so a node
//!   about to drain is left to become whole; then the name. Several: the
//!   fewest topology domains at the lowest level, best fit among domains and
//!   then among nodes, in the same order ([`topology`]).
//!   Ranks go in topology-path then name order, so neighbours in a leaf
//!   are neighbouring ranks.
//! - A restarting job (requeued, [`PendingJob::previous`]) goes first among
//!   jobs of its priority and keeps the previous nodes that can take it, at
//!   their ranks, replacing only the lost ones ([`restart`]).
//! - Rank 0 must have a MASTER_PORT free ([`ClusterView::master_ports`]).
//! - Inside a node, the closest GPUs that break the fewest free groups
//!   ([`pick_gpus`]), and CPUs of their NUMA nodes ([`pick_cpus`]).
//!
//! Where it grows: new reasons ([`PendingReason`]) come with gates next to
//! `backfill::gate` and `quota::Quotas::gate`, and fields of [`Plan`].

mod backfill;
mod check;
mod constraints;
mod cpus;
pub mod fairshare;
mod gpus;
mod plan;
mod policy;
mod preempt;
pub mod priority;
mod quota;
mod restart;
mod topology;
mod view;

#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, BTreeSet};

use crate::model::{Allocation, Millis, NodeAllocation, Placement};

pub use backfill::BackfillConfig;
pub use check::{check_allocation, feasible};
pub use cpus::pick_cpus;
pub use gpus::pick_gpus;
pub use plan::{PendingReason, Plan, Preemption, Reservation};
pub use policy::{ActiveJob, PolicyView};
pub use view::{
    cpu_layout, ArrayThrottle, Capacity, ClusterView, NodeState, NodeView, PendingJob, RunningJob,
    Shape, Usage, DEFAULT_MEM_PER_CPU_MB,
};

use check::{Candidate, Resolved};

/// How a pass chooses among the nodes a job fits on.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Packing {
    /// The policy: topology domains, then the fullest node first.
    #[default]
    BestFit,
    /// The first nodes by name, topology ignored unless `--topology`
    /// requires it: the naive baseline best fit is measured against.
    FirstFit,
}

/// One scheduling pass: places pending jobs in queue order on the free
/// resources of up nodes, counting what earlier jobs of the same pass took.
///
/// `now` is the leader's clock, stamped into the pass: begin times,
/// backfill's timeline, age, fair-share usage of running jobs and the
/// GPU-hours a victim would lose are measured from it.
///
/// Cost: O(nodes) per job tried; behind the first blocked job at most
/// `BackfillConfig::max_job_test` jobs are tried and a failed request is not
/// tried twice, so the rest of a long queue costs O(1) per job (plus one
/// cached satisfiability check per distinct request).
pub fn plan(view: &ClusterView, now: Millis) -> Plan {
    plan_with(view, now, Packing::BestFit)
}

/// [`plan`] with a choice of [`Packing`].
pub fn plan_with(view: &ClusterView, now: Millis, packing: Packing) -> Plan {
    plan_ref(&view.by_ref(), now, packing)
}

/// A pass's input with its nodes and pending jobs borrowed rather than owned:
/// the leader keeps both between passes in its state (`state::view`) and
/// hands them over by reference, so a pass over 100,000 pending jobs copies
/// none of them. `rest` gives everything else (running jobs, backfill's
/// knobs, ports, policy); its own `nodes` and `pending` are not read.
pub struct ViewRef<'v> {
    /// Every known node, whatever its state. Names are unique.
    pub nodes: Vec<&'v NodeView>,
    /// Jobs waiting to start. Ids are unique; order does not matter.
    pub pending: Vec<&'v PendingJob>,
    pub rest: &'v ClusterView,
}

impl ClusterView {
    /// The view as a [`ViewRef`] of its own nodes and pending jobs.
    pub fn by_ref(&self) -> ViewRef<'_> {
        ViewRef {
            nodes: self.nodes.iter().collect(),
            pending: self.pending.iter().collect(),
            rest: self,
        }
    }
}

/// [`plan_with`] over a [`ViewRef`]: the same pure function of its input.
pub fn plan_ref(view: &ViewRef, now: Millis, packing: Packing) -> Plan {
    let up = up_nodes(&view.nodes);
    let cands: Vec<Candidate> = up
        .iter()
        .map(|n| Candidate {
            name: &n.name,
            inventory: &n.inventory,
            cap: n.capacity(),
        })
        .collect();
    let pool = Pool::new(&up, view.rest.master_ports, &view.rest.running);
    let queue: Vec<&PendingJob> = priority::order_ref(view, now)
        .into_iter()
        .map(|(j, _)| j)
        .collect();
    backfill::run(view.rest, &queue, &cands, pool, now, packing)
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
    quotas: &quota::Quotas,
    tries: &mut u32,
) -> Option<(Option<Preemption>, Allocation)> {
    let stopping: Vec<&ActiveJob> = view
        .policy
        .running
        .iter()
        .filter(|r| r.preempted_for == Some(job.id))
        .collect();
    if !stopping.is_empty() {
        let mut freed = pool.clone();
        for r in &stopping {
            freed.release(&r.allocation);
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
        }),
        at,
    ))
}

/// Which up nodes each partition holds, and which partition a job is in.
struct Partitions {
    /// Partition names in order; `members[i]` is a flag per up node.
    names: Vec<String>,
    members: Vec<Vec<bool>>,
    up: Vec<bool>,
    default: String,
}

impl Partitions {
    fn new(policy: &crate::model::Policy, nodes: &[&NodeView]) -> Partitions {
        let all = policy.all_partitions();
        let mut p = Partitions {
            names: Vec::new(),
            members: Vec::new(),
            up: Vec::new(),
            default: policy.default_partition(),
        };
        for (name, part) in all {
            let set = part.node_set();
            p.names.push(name);
            p.members.push(
                nodes
                    .iter()
                    .map(|n| set.as_ref().is_none_or(|s| s.contains(&n.name)))
                    .collect(),
            );
            p.up.push(part.state == crate::model::PartitionState::Up);
        }
        p
    }

    /// The index of the job's partition, or `None` when it is down. A
    /// partition removed since the job was queued counts as the default.
    fn of(&self, job: &PendingJob) -> Option<usize> {
        let find = |n: &str| self.names.iter().position(|x| x == n);
        let i = find(&job.partition).or_else(|| find(&self.default))?;
        self.up[i].then_some(i)
    }
}

/// Up nodes, sorted by name (a repeated name keeps its first entry).
fn up_nodes<'v>(views: &[&'v NodeView]) -> Vec<&'v NodeView> {
    let mut up: Vec<&NodeView> = views
        .iter()
        .copied()
        .filter(|n| n.state == NodeState::Up)
        .collect();
    up.sort_by(|a, b| a.name.cmp(&b.name));
    up.dedup_by(|later, first| later.name == first.name);
    up
}

/// The free resources of the up nodes during a pass.
#[derive(Clone)]
struct Pool<'v> {
    /// Up nodes, sorted by name.
    nodes: Vec<FreeNode<'v>>,
    /// Sum of free GPUs over `nodes`, to turn a job away without a scan.
    free_gpus: u64,
    /// Node position by name, for charging an allocation.
    by_name: BTreeMap<&'v str, usize>,
}

#[derive(Clone)]
struct FreeNode<'v> {
    view: &'v NodeView,
    gpus: BTreeSet<u32>,
    cpus: u64,
    /// CPU ids put in cpusets earlier in this pass. The node's free ids are
    /// worked out only where a job lands, not for every node of every pass.
    cpu_ids_taken: BTreeSet<u32>,
    /// CPU ids of jobs a preemption simulation stopped.
    cpu_ids_freed: BTreeSet<u32>,
    memory_mb: u64,
    /// MASTER_PORTs still free for a job with its rank 0 here.
    ports: u32,
    /// The latest expected end of the jobs running here when the pass began
    /// (0: none; `Millis::MAX`: one never known to end). Of nodes a job fits
    /// equally well, it goes to the one busy longest, so the nodes about to
    /// drain get no new work and become whole sooner for whole-node jobs.
    busy_until: Millis,
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
    fn new(
        up: &[&'v NodeView],
        master_ports: Option<u32>,
        running: &[view::RunningJob],
    ) -> Pool<'v> {
        let mut busy: BTreeMap<&str, Millis> = BTreeMap::new();
        for r in running {
            let end = r.expected_end.unwrap_or(Millis::MAX);
            for na in r.allocation.nodes.iter().filter(|na| !na.gpus.is_empty()) {
                let b = busy.entry(na.node.as_str()).or_default();
                *b = (*b).max(end);
            }
        }
        let nodes: Vec<FreeNode> = up
            .iter()
            .map(|&view| FreeNode {
                view,
                gpus: view.free_gpus(),
                cpus: view.free_cpus(),
                cpu_ids_taken: BTreeSet::new(),
                cpu_ids_freed: BTreeSet::new(),
                memory_mb: view.free_memory_mb(),
                ports: master_ports.map_or(u32::MAX, |m| m.saturating_sub(view.used.master_ports)),
                busy_until: busy.get(view.name.as_str()).copied().unwrap_or(0),
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

    /// For each node, whether `placement` allows it.
    fn allowed(&self, placement: &Placement) -> Vec<bool> {
        self.nodes
            .iter()
            .map(|n| {
                !placement.restricts_nodes()
                    || constraints::allows(&n.view.name, &n.view.inventory, placement)
            })
            .collect()
    }

    /// Where `job`, in its `resolved` shape, would go now, whole; or why it
    /// waits. `allowed` is [`Pool::allowed`] for its placement.
    fn place(
        &self,
        job: &PendingJob,
        resolved: Resolved,
        allowed: &[bool],
        packing: Packing,
    ) -> Result<Allocation, PendingReason> {
        let shape = resolved.per_node;
        let want = resolved.nodes as usize;
        if self.free_gpus < u64::from(shape.gpus) * u64::from(resolved.nodes) {
            return Err(PendingReason::Resources);
        }
        let cpu_count = u32::try_from(shape.cpus).map_err(|_| PendingReason::Resources)?;
        let fitting: Vec<usize> = (0..self.nodes.len())
            .filter(|&i| allowed[i] && self.nodes[i].free().holds(&shape))
            .collect();
        if fitting.len() < want {
            return Err(PendingReason::Resources);
        }
        // A one-node job is its own rank 0: only nodes with a port free.
        let fitting = match want {
            1 => {
                let with_port: Vec<usize> = fitting
                    .into_iter()
                    .filter(|&i| self.nodes[i].ports > 0)
                    .collect();
                if with_port.is_empty() {
                    return Err(PendingReason::NoMasterPort);
                }
                with_port
            }
            _ => fitting,
        };
        let fits: Vec<topology::Fit> = fitting
            .iter()
            .map(|&i| {
                let n = &self.nodes[i];
                let free = n.free();
                topology::Fit {
                    name: &n.view.name,
                    topology: &n.view.inventory.topology,
                    left: (
                        free.gpus - u64::from(shape.gpus),
                        free.cpus - shape.cpus,
                        free.memory_mb - shape.memory_mb,
                    ),
                    busy_until: n.busy_until,
                }
            })
            .collect();
        let strict = job.placement.topology;
        let levels_up = strict.map(|t| t.levels_up());
        // A restarting gang keeps its healthy nodes at their ranks.
        let kept = restart::keep_healthy(&job.previous, &fits, want, levels_up);
        let mut chosen: Vec<usize> = match kept {
            Some(ranks) => ranks.into_iter().map(|f| fitting[f]).collect(),
            None => self.choose(&fits, &fitting, want, strict, packing)?,
        };
        self.rank0_with_port(&mut chosen)?;
        let nodes = chosen
            .into_iter()
            .enumerate()
            .map(|(rank, i)| {
                let n = &self.nodes[i];
                let again = job
                    .previous
                    .get(rank)
                    .filter(|p| p.node == n.view.name)
                    .and_then(|p| restart::same_gpus(p, &n.gpus, shape.gpus));
                let gpus = match again {
                    Some(gpus) => gpus,
                    None => pick_gpus(&n.view.inventory, &n.gpus, shape.gpus)?,
                };
                let gpus_left: BTreeSet<u32> = n
                    .gpus
                    .iter()
                    .copied()
                    .filter(|g| !gpus.contains(g))
                    .collect();
                let mut cpu_ids = n.view.free_cpu_ids();
                cpu_ids.extend(n.cpu_ids_freed.iter().copied());
                cpu_ids.retain(|c| !n.cpu_ids_taken.contains(c));
                let cpus = pick_cpus(&n.view.inventory, &gpus, &gpus_left, &cpu_ids, cpu_count);
                Some(NodeAllocation {
                    node: n.view.name.clone(),
                    gpus,
                    cpus,
                    cpu_count,
                    memory_mb: shape.memory_mb,
                })
            })
            .collect::<Option<Vec<_>>>()
            .ok_or(PendingReason::Resources)?;
        Ok(Allocation { job: job.id, nodes })
    }

    /// Gives back what `alloc` holds (a running job's expected end, on
    /// backfill's timeline, or a preemption victim, in a simulation on a copy
    /// of the pool): healthy GPUs only, counts up to capacity.
    fn release(&mut self, alloc: &Allocation) {
        for na in &alloc.nodes {
            let Some(&i) = self.by_name.get(na.node.as_str()) else {
                continue;
            };
            let n = &mut self.nodes[i];
            for g in &na.gpus {
                let healthy = n
                    .view
                    .inventory
                    .gpus
                    .iter()
                    .any(|x| x.index == *g && x.healthy);
                if healthy && n.gpus.insert(*g) {
                    self.free_gpus += 1;
                }
            }
            n.cpu_ids_freed.extend(na.cpus.iter().copied());
            n.cpus = (n.cpus + u64::from(na.cpu_count)).min(u64::from(n.view.inventory.cpus));
            n.memory_mb = (n.memory_mb + na.memory_mb).min(n.view.inventory.memory_mb);
        }
    }

    /// Whether GPU `gpu` of `node` is free in this pool.
    fn is_free_gpu(&self, node: &str, gpu: u32) -> bool {
        self.by_name
            .get(node)
            .is_some_and(|&i| self.nodes[i].gpus.contains(&gpu))
    }

    /// The nodes (positions into `self.nodes`, in rank order) a job placed
    /// from scratch goes to: `fits` are the `fitting` nodes with what each
    /// would have left.
    fn choose(
        &self,
        fits: &[topology::Fit],
        fitting: &[usize],
        want: usize,
        strict: Option<crate::model::TopologyRequirement>,
        packing: Packing,
    ) -> Result<Vec<usize>, PendingReason> {
        let chosen: Vec<usize> = match (packing, strict) {
            (_, _) if want == 1 && packing == Packing::FirstFit => vec![0],
            (_, _) if want == 1 => {
                // Best fit: least left free, then busy longest; names are
                // unique, so the order is total.
                let best = (0..fits.len()).min_by_key(|&f| fits[f].best_fit_key());
                best.into_iter().collect()
            }
            (Packing::FirstFit, None) => (0..want).collect(),
            (_, strict) => topology::choose_gang(fits, want, strict.map(|t| t.levels_up())).ok_or(
                match strict {
                    Some(level) => PendingReason::Topology(level),
                    None => PendingReason::Resources,
                },
            )?,
        };
        let mut chosen: Vec<usize> = chosen.into_iter().map(|f| fitting[f]).collect();
        // Node ranks in topology-path, then name, order: rank 0 (MASTER_ADDR)
        // is the first, and a leaf's nodes are neighbouring ranks.
        chosen.sort_by_key(|&i| {
            let v = self.nodes[i].view;
            (v.inventory.topology.as_str(), v.name.as_str())
        });
        Ok(chosen)
    }

    /// Makes rank 0 (the first of `chosen`) a node with a MASTER_PORT free:
    /// the first in rank order that has one moves to the front.
    fn rank0_with_port(&self, chosen: &mut Vec<usize>) -> Result<(), PendingReason> {
        let first = chosen
            .iter()
            .position(|&i| self.nodes[i].ports > 0)
            .ok_or(PendingReason::NoMasterPort)?;
        if first > 0 {
            let node = chosen.remove(first);
            chosen.insert(0, node);
        }
        Ok(())
    }

    /// Takes what `alloc` holds out of the pool.
    fn charge(&mut self, alloc: &Allocation) {
        for (rank, na) in alloc.nodes.iter().enumerate() {
            let Some(&i) = self.by_name.get(na.node.as_str()) else {
                continue;
            };
            let n = &mut self.nodes[i];
            if rank == 0 {
                n.ports = n.ports.saturating_sub(1);
            }
            for g in &na.gpus {
                if n.gpus.remove(g) {
                    self.free_gpus -= 1;
                }
            }
            n.cpu_ids_taken.extend(na.cpus.iter().copied());
            n.cpus = n.cpus.saturating_sub(u64::from(na.cpu_count));
            n.memory_mb = n.memory_mb.saturating_sub(na.memory_mb);
        }
    }
}
