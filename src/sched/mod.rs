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
//! `queue::gate` and `quota::Quotas::gate`, and fields of [`Plan`].

mod backfill;
mod check;
mod constraints;
mod cpus;
mod elastic;
pub mod fairshare;
mod gpus;
mod gpuset;
mod pass;
mod plan;
mod policy;
mod pool;
mod preempt;
pub mod priority;
mod queue;
mod quota;
mod restart;
mod slices;
mod topology;
mod view;

#[cfg(test)]
mod tests;

use crate::model::Millis;

pub use backfill::{BackfillConfig, BackfillOrder};
pub use check::{check_allocation, check_allocation_by, feasible};
pub use cpus::pick_cpus;
pub use elastic::Growth;
pub use gpus::pick_gpus;
pub use plan::{PendingReason, PendingReasons, Plan, Preemption, Reservation};
pub use policy::{ActiveJob, ElasticRun, PolicyView};
pub use queue::order as queue_order;
pub use view::{
    cpu_layout, ArrayThrottle, Capacity, ClusterView, NodeState, NodeView, PendingJob, RunningJob,
    Shape, Usage, DEFAULT_MEM_PER_CPU_MB,
};

use check::Candidate;
use pool::Pool;

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
    // The capacities come from the pool's one read of each node's GPU records.
    let (pool, capacities) = Pool::new(&up, view.rest.master_ports, &view.rest.running);
    let cands: Vec<Candidate> = up
        .iter()
        .zip(capacities)
        .map(|(n, cap)| Candidate {
            name: &n.name,
            inventory: &n.inventory,
            cap,
        })
        .collect();
    let cluster_gpus = cands.iter().map(|c| c.cap.gpus).sum();
    let parts = Partitions::new(&view.rest.policy.policy, &up);
    let queue = queue::build(view, now, &parts, cluster_gpus);
    pass::run(view.rest, &queue, &parts, &cands, pool, now, packing)
}

/// Which up nodes each partition holds, and which partition a job is in.
struct Partitions {
    /// Partition names in order; `members[i]` is a flag per up node.
    names: Vec<String>,
    members: Vec<Vec<bool>>,
    up: Vec<bool>,
    default: String,
    /// [`Partitions::of`] for a job that names no partition (most do not).
    of_default: Option<usize>,
}

impl Partitions {
    fn new(policy: &crate::model::Policy, nodes: &[&NodeView]) -> Partitions {
        let all = policy.all_partitions();
        let mut p = Partitions {
            names: Vec::new(),
            members: Vec::new(),
            up: Vec::new(),
            default: policy.default_partition(),
            of_default: None,
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
        let d = p.find(&p.default);
        p.of_default = d;
        p
    }

    fn find(&self, name: &str) -> Option<usize> {
        let i = self.names.iter().position(|x| x == name)?;
        self.up[i].then_some(i)
    }

    /// The index of the job's partition, or `None` when it is down. A
    /// partition removed since the job was queued counts as the default.
    fn of(&self, job: &PendingJob) -> Option<usize> {
        // Most jobs name the default (resolved at submit) or none.
        if job.partition == self.default
            || (job.partition.is_empty() && !self.names.iter().any(String::is_empty))
        {
            return self.of_default;
        }
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
