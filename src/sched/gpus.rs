//! Which GPUs of a node a job gets: the closest set (NVLink before PCIe before
//! crossing NUMA), so collectives inside the node run on the fastest links.

use std::collections::BTreeSet;

use crate::model::{GpuLink, NodeInventory};

/// Up to this many candidate sets are compared exhaustively (C(8,4) = 70,
/// C(12,6) = 924); larger nodes fall back to a greedy grow from every seed.
const EXHAUSTIVE_LIMIT: u64 = 1024;

/// Picks `n` GPUs out of `free` (indices of the node's free healthy GPUs):
/// the set whose farthest pair is closest by [`GpuLink::distance`], then the
/// smallest total distance, then the lowest indices. Sorted; `None` when fewer
/// than `n` are free.
pub fn pick_gpus(inventory: &NodeInventory, free: &BTreeSet<u32>, n: u32) -> Option<Vec<u32>> {
    let n = n as usize;
    if free.len() < n {
        return None;
    }
    let free: Vec<u32> = free.iter().copied().collect();
    if n <= 1 || n == free.len() {
        // Every choice is equally close; keep the lowest indices.
        return Some(free[..n].to_vec());
    }
    let best = if combinations(free.len() as u64, n as u64) <= EXHAUSTIVE_LIMIT {
        exhaustive(inventory, &free, n)
    } else {
        greedy(inventory, &free, n)
    };
    Some(best)
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

/// Every `n`-subset of `free` (ascending), in lexicographic order; the first
/// best one wins, so ties go to the lowest indices.
fn exhaustive(inventory: &NodeInventory, free: &[u32], n: usize) -> Vec<u32> {
    let mut pos: Vec<usize> = (0..n).collect();
    let mut best: Option<((u32, u32), Vec<u32>)> = None;
    loop {
        let set: Vec<u32> = pos.iter().map(|&p| free[p]).collect();
        let key = spread(inventory, &set);
        if best.as_ref().is_none_or(|(k, _)| key < *k) {
            best = Some((key, set));
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
    best.map(|(_, set)| set).unwrap_or_default()
}

/// From each seed, add the GPU closest to the set so far; keep the best result.
fn greedy(inventory: &NodeInventory, free: &[u32], n: usize) -> Vec<u32> {
    let mut best: Option<((u32, u32), Vec<u32>)> = None;
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
        let key = spread(inventory, &set);
        if best.as_ref().is_none_or(|(k, s)| (key, &set) < (*k, s)) {
            best = Some((key, set));
        }
    }
    best.map(|(_, set)| set).unwrap_or_default()
}

#[cfg(test)]
pub(super) fn spread_for_tests(inventory: &NodeInventory, set: &[u32]) -> (u32, u32) {
    spread(inventory, set)
}

#[cfg(test)]
pub(super) fn greedy_for_tests(inventory: &NodeInventory, free: &[u32], n: usize) -> Vec<u32> {
    greedy(inventory, free, n)
}
