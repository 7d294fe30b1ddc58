//! The free resources of the up nodes during a pass: what [`Pool::place`]
//! places on, what starts are charged to and what backfill's timeline and
//! preemption's simulations give running jobs' resources back to.
//!
//! Backfill's timeline copies the pool and releases every running job into
//! the copy (once a pass when its reservations look at later and later
//! times, again for one that looks earlier), and preemption simulates on
//! copies, so copies and releases are kept cheap:
//! free GPUs are bit sets ([`GpuSet`]), the name map is shared between
//! copies, and the timeline releases [`Part`]s (node position and what is
//! held there), worked out once per pass, not allocations by name. A GPU
//! job's scan for nodes visits only those with a GPU free.

use std::collections::BTreeSet;
use std::rc::Rc;

use rustc_hash::FxHashMap;

use crate::model::{Allocation, Millis, NodeAllocation, Placement};

use super::check::Resolved;
use super::gpuset::GpuSet;
use super::slices::Kinds;
use super::view::{self, Capacity, NodeView, PendingJob};
use super::{constraints, pick_cpus, pick_gpus, restart, topology, Packing, PendingReason};

/// The free resources of the up nodes during a pass.
#[derive(Clone)]
pub(super) struct Pool<'v> {
    /// Up nodes, sorted by name.
    pub nodes: Vec<FreeNode<'v>>,
    /// Free GPUs per node (`nodes[i].gpus.len()`), apart so that a job's
    /// scan for nodes that fit reads 4 bytes a node, not the whole node.
    gpu_count: Vec<u32>,
    /// The nodes with a GPU free, one bit a node: on a busy fleet a GPU
    /// job's scan visits these few, not every node.
    with_gpus: NodeBits,
    /// Sum of free GPUs over `nodes`, to turn a job away without a scan.
    pub free_gpus: u64,
    /// Node position by name, for charging an allocation; shared by copies.
    by_name: Rc<FxHashMap<&'v str, usize>>,
}

#[derive(Clone)]
pub(super) struct FreeNode<'v> {
    pub view: &'v NodeView,
    pub gpus: GpuSet,
    /// The node's healthy GPUs: only those are given back by a release.
    healthy: GpuSet,
    /// Its entries by kind when a GPU is partitioned into MIG slices
    /// (`None`: all whole GPUs); shared by copies.
    kinds: Option<Rc<Kinds>>,
    pub cpus: u64,
    /// CPU ids put in cpusets earlier in this pass. The node's free ids are
    /// worked out only where a job lands, not for every node of every pass.
    cpu_ids_taken: BTreeSet<u32>,
    /// CPU ids of jobs a preemption simulation stopped.
    cpu_ids_freed: BTreeSet<u32>,
    pub memory_mb: u64,
    /// The node's CPUs and memory (its inventory's, here so that a release
    /// reads this node and not its view too).
    cpu_cap: u64,
    memory_cap_mb: u64,
    /// MASTER_PORTs still free for a job with its rank 0 here.
    ports: u32,
    /// The latest expected end of the jobs running here when the pass began
    /// (0: none; `Millis::MAX`: one never known to end). Of nodes a job fits
    /// equally well, it goes to the one busy longest, so the nodes about to
    /// drain get no new work and become whole sooner for whole-node jobs.
    busy_until: Millis,
}

impl FreeNode<'_> {
    /// Nothing on it is in use: every healthy GPU, CPU and MiB is free.
    pub fn is_whole(&self) -> bool {
        self.gpus.len() == self.healthy.len()
            && self.cpus == self.cpu_cap
            && self.memory_mb == self.memory_cap_mb
    }

    pub fn free(&self) -> Capacity {
        Capacity {
            gpus: self.gpus.len() as u64,
            cpus: self.cpus,
            memory_mb: self.memory_mb,
        }
    }
}

impl<'v> Pool<'v> {
    /// The pool of the `up` nodes, and what each could hold if it were empty
    /// ([`NodeView::capacity`], in the same order), worked out in the same
    /// read of its GPU records.
    pub fn new(
        up: &[&'v NodeView],
        master_ports: Option<u32>,
        running: &[view::RunningJob],
    ) -> (Pool<'v>, Vec<Capacity>) {
        let by_name: FxHashMap<&str, usize> = up
            .iter()
            .enumerate()
            .map(|(i, n)| (n.name.as_str(), i))
            .collect();
        let mut busy: Vec<Millis> = vec![0; up.len()];
        for r in running {
            let end = r.expected_end.unwrap_or(Millis::MAX);
            for na in r.allocation.nodes.iter().filter(|na| !na.gpus.is_empty()) {
                if let Some(&i) = by_name.get(na.node.as_str()) {
                    busy[i] = busy[i].max(end);
                }
            }
        }
        let mut capacity = Vec::with_capacity(up.len());
        let nodes: Vec<FreeNode> = up
            .iter()
            .zip(busy)
            .map(|(&view, busy_until)| {
                // One read of the inventory's GPU records (cold, about 1 KiB
                // a node); the few GPUs in use come off a copy.
                let mut records = 0;
                let healthy: GpuSet = view
                    .inventory
                    .gpus
                    .iter()
                    .filter(|g| g.healthy)
                    .inspect(|_| records += 1)
                    .map(|g| g.index)
                    .collect();
                capacity.push(Capacity {
                    gpus: records,
                    cpus: u64::from(view.inventory.cpus),
                    memory_mb: view.inventory.memory_mb,
                });
                let mut gpus = healthy.clone();
                for &g in &view.used.gpus {
                    gpus.remove(g);
                }
                FreeNode {
                    view,
                    gpus,
                    healthy,
                    kinds: Kinds::of(&view.inventory).map(Rc::new),
                    cpus: view.free_cpus(),
                    cpu_ids_taken: BTreeSet::new(),
                    cpu_ids_freed: BTreeSet::new(),
                    memory_mb: view.free_memory_mb(),
                    cpu_cap: u64::from(view.inventory.cpus),
                    memory_cap_mb: view.inventory.memory_mb,
                    ports: master_ports
                        .map_or(u32::MAX, |m| m.saturating_sub(view.used.master_ports)),
                    busy_until,
                }
            })
            .collect();
        (Pool::of(nodes, Rc::new(by_name)), capacity)
    }

    fn of(nodes: Vec<FreeNode<'v>>, by_name: Rc<FxHashMap<&'v str, usize>>) -> Pool<'v> {
        let gpu_count: Vec<u32> = nodes.iter().map(|n| n.gpus.len() as u32).collect();
        let free_gpus = gpu_count.iter().map(|&c| u64::from(c)).sum();
        let mut with_gpus = NodeBits::new(nodes.len());
        for (i, _) in gpu_count.iter().enumerate().filter(|(_, &c)| c > 0) {
            with_gpus.set(i, true);
        }
        Pool {
            nodes,
            gpu_count,
            with_gpus,
            free_gpus,
            by_name,
        }
    }

    /// A pool of one node, `n` (preemption's per-node simulations).
    pub fn single(n: &FreeNode<'v>) -> Pool<'v> {
        let by_name = [(n.view.name.as_str(), 0)].into_iter().collect();
        Pool::of(vec![n.clone()], Rc::new(by_name))
    }

    /// The position of node `name` in `nodes`, if it is up.
    pub fn position(&self, name: &str) -> Option<usize> {
        self.by_name.get(name).copied()
    }

    /// For each node, whether `placement` allows it.
    pub fn allowed(&self, placement: &Placement) -> Vec<bool> {
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
    pub fn place(
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
        let slice = job.placement.gpu_slice.as_deref();
        // Free GPUs of the kind the job takes (whole GPUs, or its profile's slices).
        let eligible = |i: usize| -> u32 {
            match (&self.nodes[i].kinds, slice) {
                (None, None) => self.gpu_count[i],
                (None, Some(_)) => 0,
                (Some(k), _) => k.count(&self.nodes[i].gpus, slice),
            }
        };
        let fits_here = |&i: &usize| {
            self.gpu_count[i] >= shape.gpus
                && (shape.gpus == 0 || eligible(i) >= shape.gpus)
                && allowed[i]
                && self.nodes[i].free().holds(&shape)
                && (!job.exclusive || self.nodes[i].is_whole())
        };
        let fitting: Vec<usize> = if shape.gpus > 0 {
            self.with_gpus.ones().filter(fits_here).collect()
        } else {
            (0..self.nodes.len()).filter(fits_here).collect()
        };
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
                let gpus_free = match shape.gpus {
                    0 => free.gpus,
                    _ => u64::from(eligible(i)),
                };
                topology::Fit {
                    name: &n.view.name,
                    topology: &n.view.inventory.topology,
                    left: (
                        gpus_free - u64::from(shape.gpus),
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
                let free = match &n.kinds {
                    None => n.gpus.to_set(),
                    Some(k) => n.gpus.intersect(k.mask(slice)?).to_set(),
                };
                // An exclusive job takes the node whole (it is, checked above).
                let (want_gpus, cpu_count, memory_mb) = if job.exclusive {
                    let all_cpus = u32::try_from(n.cpus).ok()?;
                    (free.len() as u32, all_cpus, n.memory_mb)
                } else {
                    (shape.gpus, cpu_count, shape.memory_mb)
                };
                let again = job
                    .previous
                    .get(rank)
                    .filter(|p| p.node == n.view.name)
                    .and_then(|p| restart::same_gpus(p, &free, want_gpus));
                let gpus = match again {
                    Some(gpus) => gpus,
                    None => match (&n.kinds, slice) {
                        (Some(k), Some(_)) => k.pick(&n.gpus, &free, want_gpus)?,
                        _ => pick_gpus(&n.view.inventory, &free, want_gpus)?,
                    },
                };
                let gpus_left: BTreeSet<u32> =
                    free.iter().copied().filter(|g| !gpus.contains(g)).collect();
                let mut cpu_ids = n.view.free_cpu_ids();
                if !n.cpu_ids_freed.is_empty() {
                    cpu_ids.extend(n.cpu_ids_freed.iter().copied());
                    cpu_ids.sort_unstable();
                    cpu_ids.dedup();
                }
                if !n.cpu_ids_taken.is_empty() {
                    cpu_ids.retain(|c| !n.cpu_ids_taken.contains(c));
                }
                let cpus = pick_cpus(&n.view.inventory, &gpus, &gpus_left, &cpu_ids, cpu_count);
                Some(NodeAllocation {
                    node: n.view.name.clone(),
                    gpus,
                    cpus,
                    cpu_count,
                    memory_mb,
                })
            })
            .collect::<Option<Vec<_>>>()
            .ok_or(PendingReason::Resources)?;
        Ok(Allocation { job: job.id, nodes })
    }

    /// Gives back what `alloc` holds (a running job's expected end, on
    /// backfill's timeline, or a preemption victim, in a simulation on a copy
    /// of the pool): healthy GPUs only, counts up to capacity.
    pub fn release(&mut self, alloc: &Allocation) {
        for na in &alloc.nodes {
            if let Some(i) = self.position(&na.node) {
                self.release_part(&Part::new(i, na));
            }
        }
    }

    /// [`Pool::release`] of one part of an allocation.
    pub fn release_part(&mut self, p: &Part) {
        let n = &mut self.nodes[p.pos];
        let added = n.gpus.insert_all(&p.gpus, &n.healthy) as u32;
        if added > 0 {
            self.free_gpus += u64::from(added);
            self.gpu_count[p.pos] += added;
            self.with_gpus.set(p.pos, true);
        }
        n.cpu_ids_freed.extend(p.cpu_ids.iter().copied());
        n.cpus = (n.cpus + u64::from(p.cpu_count)).min(n.cpu_cap);
        n.memory_mb = (n.memory_mb + p.memory_mb).min(n.memory_cap_mb);
    }

    /// Whether GPU `gpu` of `node` is free in this pool.
    pub fn is_free_gpu(&self, node: &str, gpu: u32) -> bool {
        self.position(node)
            .is_some_and(|i| self.nodes[i].gpus.contains(gpu))
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
                // Best fit: least left free, then busy longest, then the name
                // (position): a total order.
                let best = (0..fits.len()).min_by_key(|&f| fits[f].best_fit_key(f));
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

    /// The state of the nodes `allocs` name, for [`Pool::restore`] after
    /// charging them: a trial charge that costs what it touches, not a copy
    /// of the whole pool.
    pub fn save<'a>(&self, allocs: impl IntoIterator<Item = &'a Allocation>) -> Saved<'v> {
        let mut at: Vec<usize> = allocs
            .into_iter()
            .flat_map(|a| a.nodes.iter())
            .filter_map(|na| self.position(&na.node))
            .collect();
        at.sort_unstable();
        at.dedup();
        Saved {
            nodes: at
                .into_iter()
                .map(|i| (i, self.nodes[i].clone(), self.gpu_count[i]))
                .collect(),
            free_gpus: self.free_gpus,
        }
    }

    /// Puts back what [`Pool::save`] saved.
    pub fn restore(&mut self, saved: Saved<'v>) {
        for (i, node, count) in saved.nodes {
            self.nodes[i] = node;
            self.gpu_count[i] = count;
            self.with_gpus.set(i, count > 0);
        }
        self.free_gpus = saved.free_gpus;
    }

    /// Takes what `alloc` holds out of the pool.
    pub fn charge(&mut self, alloc: &Allocation) {
        for (rank, na) in alloc.nodes.iter().enumerate() {
            let Some(i) = self.position(&na.node) else {
                continue;
            };
            let n = &mut self.nodes[i];
            if rank == 0 {
                n.ports = n.ports.saturating_sub(1);
            }
            for &g in &na.gpus {
                if n.gpus.remove(g) {
                    self.free_gpus -= 1;
                    self.gpu_count[i] -= 1;
                    if self.gpu_count[i] == 0 {
                        self.with_gpus.set(i, false);
                    }
                }
            }
            n.cpu_ids_taken.extend(na.cpus.iter().copied());
            n.cpus = n.cpus.saturating_sub(u64::from(na.cpu_count));
            n.memory_mb = n.memory_mb.saturating_sub(na.memory_mb);
        }
    }
}

/// Nodes of a pool as they were before a trial charge ([`Pool::save`]).
pub(super) struct Saved<'v> {
    nodes: Vec<(usize, FreeNode<'v>, u32)>,
    free_gpus: u64,
}

/// One part of an allocation, resolved for release: its node's position in
/// the pool and what it holds there, copied out of the allocation so that
/// backfill's timeline, which releases every running job's parts once per
/// reservation, reads these bytes and not the allocations.
pub(super) struct Part<'v> {
    pos: usize,
    gpus: GpuSet,
    cpu_ids: &'v [u32],
    cpu_count: u32,
    memory_mb: u64,
}

impl<'v> Part<'v> {
    /// `na`, on the node at position `pos` (which it names).
    pub fn new(pos: usize, na: &'v NodeAllocation) -> Part<'v> {
        Part {
            pos,
            gpus: na.gpus.iter().copied().collect(),
            cpu_ids: &na.cpus,
            cpu_count: na.cpu_count,
            memory_mb: na.memory_mb,
        }
    }
}

/// A set of node positions, one bit each, iterated in position order.
#[derive(Clone)]
struct NodeBits(Vec<u64>);

impl NodeBits {
    fn new(len: usize) -> NodeBits {
        NodeBits(vec![0; len.div_ceil(64)])
    }

    fn set(&mut self, i: usize, on: bool) {
        let (word, bit) = (i / 64, 1u64 << (i % 64));
        if on {
            self.0[word] |= bit;
        } else {
            self.0[word] &= !bit;
        }
    }

    /// The positions in the set, ascending.
    fn ones(&self) -> impl Iterator<Item = usize> + '_ {
        self.0.iter().enumerate().flat_map(|(w, &bits)| {
            let mut left = bits;
            std::iter::from_fn(move || {
                (left != 0).then(|| {
                    let b = left.trailing_zeros() as usize;
                    left &= left - 1;
                    w * 64 + b
                })
            })
        })
    }
}

#[cfg(test)]
mod tests {
    use super::{NodeBits, Pool};
    use crate::model::{Allocation, JobId, NodeAllocation};
    use crate::sched::tests::dgx;

    /// What a pass can see of a pool: free GPUs, per-node counts, nodes
    /// with a GPU free, and each node's free GPUs, CPUs, memory and ports.
    type Seen = (u64, Vec<u32>, Vec<usize>, Vec<(u64, u64, u64, u32)>);

    fn seen(p: &Pool) -> Seen {
        let nodes = p
            .nodes
            .iter()
            .map(|n| {
                let f = n.free();
                (f.gpus, f.cpus, f.memory_mb, n.ports)
            })
            .collect();
        (
            p.free_gpus,
            p.gpu_count.clone(),
            p.with_gpus.ones().collect(),
            nodes,
        )
    }

    #[test]
    fn restore_undoes_a_trial_charge_of_the_saved_nodes() {
        let views = [dgx("a").build(), dgx("b").build(), dgx("c").build()];
        let up: Vec<_> = views.iter().collect();
        let (mut pool, _) = Pool::new(&up, Some(4), &[]);
        let part = |node: &str, gpus: Vec<u32>| NodeAllocation {
            node: node.into(),
            gpus,
            cpus: vec![0, 1],
            cpu_count: 2,
            memory_mb: 1024,
        };
        // A start earlier in the pass, kept.
        pool.charge(&Allocation {
            job: JobId(1),
            nodes: vec![part("a", vec![0, 1])],
        });
        let before = seen(&pool);
        let hold = Allocation {
            job: JobId(2),
            nodes: vec![part("b", (0..8).collect()), part("a", vec![2, 3])],
        };
        let saved = pool.save([&hold, &hold]);
        pool.charge(&hold);
        assert_ne!(seen(&pool), before);
        assert_eq!(pool.with_gpus.ones().collect::<Vec<_>>(), vec![0, 2]);
        pool.restore(saved);
        assert_eq!(seen(&pool), before);
    }

    #[test]
    fn node_bits_iterate_the_set_positions_in_order_across_words() {
        let mut b = NodeBits::new(200);
        for i in [0, 63, 64, 65, 127, 128, 199] {
            b.set(i, true);
        }
        b.set(64, false);
        b.set(10, false);
        assert_eq!(b.ones().collect::<Vec<_>>(), vec![0, 63, 65, 127, 128, 199]);
        assert_eq!(NodeBits::new(0).ones().count(), 0);
    }
}
