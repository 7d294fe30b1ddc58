//! Which GPUs of a node a job gets: the closest set (NVLink before PCIe before
//! crossing NUMA, and on one NUMA node when it can), so collectives inside the
//! node run on the fastest links; among sets equally close, the one that
//! leaves the most free groups whole (NVLink pairs, NUMA quads, the whole
//! node) for larger jobs, as a buddy allocator does.

use std::cmp::Reverse;
use std::collections::BTreeSet;

use crate::model::{GpuLink, NodeInventory};

/// Up to this many candidate sets are compared exhaustively (C(8,4) = 70,
/// C(12,6) = 924); larger nodes fall back to a greedy grow from every seed.
const EXHAUSTIVE_LIMIT: u64 = 1024;

/// Picks `n` GPUs out of `free` (indices of the node's free healthy GPUs),
/// comparing sets by, in order:
/// 1. the farthest pair by [`GpuLink::distance`] (lower is closer);
/// 2. how many NUMA nodes the set spans (links may not say: NVSwitch makes
///    every pair equal, while the CPUs and memory are per NUMA node);
/// 3. the total distance over all pairs;
/// 4. the free groups the set leaves whole, largest groups first (see
///    [`groups`]): a 1-GPU job takes a GPU of an already broken pair;
/// 5. the lowest indices.
///
/// Sorted; `None` when fewer than `n` are free.
pub fn pick_gpus(inventory: &NodeInventory, free: &BTreeSet<u32>, n: u32) -> Option<Vec<u32>> {
    let n = n as usize;
    if free.len() < n {
        return None;
    }
    let free: Vec<u32> = free.iter().copied().collect();
    if n == 0 || n == free.len() {
        return Some(free[..n].to_vec());
    }
    let ctx = Ctx {
        inventory,
        groups: groups(inventory),
        free: &free,
    };
    let best = if combinations(free.len() as u64, n as u64) <= EXHAUSTIVE_LIMIT {
        exhaustive(&ctx, n)
    } else {
        greedy(&ctx, n)
    };
    Some(best)
}

/// The GPU groups worth keeping whole, largest first: the connected sets of
/// the link graph at each distance (NVLink pairs, PCIe switches, host
/// bridges), the GPUs of each NUMA node, and the whole node. Single GPUs
/// are no group.
fn groups(inventory: &NodeInventory) -> Vec<Vec<u32>> {
    let ids: Vec<u32> = inventory.gpus.iter().map(|g| g.index).collect();
    let mut out: BTreeSet<(Reverse<usize>, Vec<u32>)> = BTreeSet::new();
    let mut add = |mut g: Vec<u32>| {
        g.sort_unstable();
        if g.len() > 1 {
            out.insert((Reverse(g.len()), g));
        }
    };
    add(ids.clone());
    let mut numas: Vec<u32> = inventory.gpus.iter().filter_map(|g| g.numa_node).collect();
    numas.sort_unstable();
    numas.dedup();
    for numa in numas {
        add(inventory
            .gpus
            .iter()
            .filter(|g| g.numa_node == Some(numa))
            .map(|g| g.index)
            .collect());
    }
    let mut distances: Vec<u32> = Vec::new();
    for (i, &a) in ids.iter().enumerate() {
        for &b in &ids[i + 1..] {
            distances.push(distance(inventory, a, b));
        }
    }
    distances.sort_unstable();
    distances.dedup();
    for t in distances {
        // Components of the graph with the links no farther than `t`.
        let mut comp: Vec<usize> = (0..ids.len()).collect();
        for i in 0..ids.len() {
            for j in i + 1..ids.len() {
                if distance(inventory, ids[i], ids[j]) <= t {
                    let (ri, rj) = (root(&mut comp, i), root(&mut comp, j));
                    comp[ri.max(rj)] = ri.min(rj);
                }
            }
        }
        let mut by_root: std::collections::BTreeMap<usize, Vec<u32>> = Default::default();
        for (i, &id) in ids.iter().enumerate() {
            let r = root(&mut comp, i);
            by_root.entry(r).or_default().push(id);
        }
        for g in by_root.into_values() {
            add(g);
        }
    }
    out.into_iter().map(|(_, g)| g).collect()
}

/// The root of `i` in the union-find forest `comp`, halving paths on the way.
fn root(comp: &mut [usize], mut i: usize) -> usize {
    while comp[i] != i {
        comp[i] = comp[comp[i]];
        i = comp[i];
    }
    i
}

struct Ctx<'a> {
    inventory: &'a NodeInventory,
    /// From [`groups`], largest first.
    groups: Vec<Vec<u32>>,
    free: &'a [u32],
}

/// Lower is better; see [`pick_gpus`] for the order.
type SetKey = (u32, usize, u32, Reverse<Vec<usize>>, Vec<u32>);

impl Ctx<'_> {
    fn key(&self, set: &[u32]) -> SetKey {
        let (far, total) = spread(self.inventory, set);
        let mut numas: Vec<u32> = set
            .iter()
            .filter_map(|g| self.inventory.gpus.iter().find(|i| i.index == *g))
            .filter_map(|g| g.numa_node)
            .collect();
        numas.sort_unstable();
        numas.dedup();
        (
            far,
            numas.len(),
            total,
            Reverse(self.whole_left(set)),
            set.to_vec(),
        )
    }

    /// How many groups of each size stay wholly free once `set` is taken,
    /// largest size first.
    fn whole_left(&self, set: &[u32]) -> Vec<usize> {
        let mut counts: Vec<usize> = Vec::new();
        let mut size = usize::MAX;
        for g in &self.groups {
            if g.len() != size {
                size = g.len();
                counts.push(0);
            }
            let whole = g
                .iter()
                .all(|i| self.free.binary_search(i).is_ok() && !set.contains(i));
            if whole {
                if let Some(c) = counts.last_mut() {
                    *c += 1;
                }
            }
        }
        counts
    }
}

/// `(farthest pair, total)`: lower is closer.
fn spread(inventory: &NodeInventory, set: &[u32]) -> (u32, u32) {
    let mut far = 0;
    let mut total = 0;
    for (i, &a) in set.iter().enumerate() {
        for &b in &set[i + 1..] {
            let d = distance(inventory, a, b);
            far = far.max(d);
            total += d;
        }
    }
    (far, total)
}

/// The link distance between GPUs `a` and `b`; a missing entry in `gpu_links`
/// counts as the farthest link, never as a panic.
fn distance(inventory: &NodeInventory, a: u32, b: u32) -> u32 {
    if a == b {
        return 0;
    }
    inventory
        .gpu_links
        .get(a as usize)
        .and_then(|row| row.get(b as usize))
        .copied()
        .unwrap_or(GpuLink::CrossNuma)
        .distance()
}

fn combinations(n: u64, k: u64) -> u64 {
    let k = k.min(n - k);
    let mut c: u64 = 1;
    for i in 0..k {
        // Exact at every step: c * (n - i) is divisible by (i + 1).
        c = c.saturating_mul(n - i) / (i + 1);
        if c > EXHAUSTIVE_LIMIT {
            return c;
        }
    }
    c
}

/// Every `n`-subset of `free` (ascending), in lexicographic order.
fn exhaustive(ctx: &Ctx, n: usize) -> Vec<u32> {
    let free = ctx.free;
    let mut pos: Vec<usize> = (0..n).collect();
    let mut best: Option<SetKey> = None;
    loop {
        let set: Vec<u32> = pos.iter().map(|&p| free[p]).collect();
        let key = ctx.key(&set);
        if best.as_ref().is_none_or(|k| key < *k) {
            best = Some(key);
        }
        // Advance to the next combination.
        let Some(i) = (0..n).rev().find(|&i| pos[i] < free.len() - n + i) else {
            break;
        };
        pos[i] += 1;
        for j in i + 1..n {
            pos[j] = pos[j - 1] + 1;
        }
    }
    best.map(|k| k.4).unwrap_or_default()
}

/// From each seed, add the GPU closest to the set so far; keep the best result.
fn greedy(ctx: &Ctx, n: usize) -> Vec<u32> {
    let (inventory, free) = (ctx.inventory, ctx.free);
    let mut best: Option<SetKey> = None;
    for &seed in free {
        let mut set = vec![seed];
        while set.len() < n {
            let next = free
                .iter()
                .copied()
                .filter(|g| !set.contains(g))
                .min_by_key(|&g| {
                    let far = set.iter().map(|&s| distance(inventory, s, g)).max();
                    let total: u32 = set.iter().map(|&s| distance(inventory, s, g)).sum();
                    (far, total, g)
                });
            match next {
                Some(g) => set.push(g),
                None => break,
            }
        }
        set.sort_unstable();
        let key = ctx.key(&set);
        if best.as_ref().is_none_or(|k| key < *k) {
            best = Some(key);
        }
    }
    best.map(|k| k.4).unwrap_or_default()
}

#[cfg(test)]
pub(super) fn spread_for_tests(inventory: &NodeInventory, set: &[u32]) -> (u32, u32) {
    spread(inventory, set)
}

#[cfg(test)]
pub(super) fn greedy_for_tests(inventory: &NodeInventory, free: &[u32], n: usize) -> Vec<u32> {
    let ctx = Ctx {
        inventory,
        groups: groups(inventory),
        free,
    };
    greedy(&ctx, n)
}
