//! Which CPUs of a node a job is pinned to (its cpuset): those of the NUMA
//! nodes its GPUs hang off, so host-to-device copies and the data loader stay
//! on the GPUs' memory controller; never a CPU in another job's cpuset.

use std::collections::{BTreeMap, BTreeSet};

use crate::model::NodeInventory;

/// Picks `count` CPU ids out of `free` (the node's CPU ids no cpuset holds,
/// ascending) for a job given `gpus` on the node:
/// - a GPU job takes them from its GPUs' NUMA nodes, shared in proportion to
///   its GPUs on each, then from the other NUMA nodes if those run short;
/// - a CPU-only job takes one NUMA node that holds it whole, preferring the
///   one with the fewest free GPUs (`free_gpus`, after this job), so CPUs
///   beside free GPUs stay for GPU jobs; then the fewest free CPUs.
///
/// Lowest ids first within a NUMA node. Empty when fewer than `count` are
/// free: the job then gets a count without a cpuset (see
/// [`super::view::cpu_layout`]).
pub fn pick_cpus(
    inventory: &NodeInventory,
    gpus: &[u32],
    free_gpus: &BTreeSet<u32>,
    free: &[u32],
    count: u32,
) -> Vec<u32> {
    debug_assert!(
        free.windows(2).all(|w| w[0] < w[1]),
        "free CPU ids ascending"
    );
    let is_free = |c: &u32| free.binary_search(c).is_ok();
    let count = count as usize;
    if count == 0 || free.len() < count {
        return Vec::new();
    }
    // Free CPU ids per NUMA node, in id order; CPUs in no NUMA node last.
    let mut by_numa: BTreeMap<u32, Vec<u32>> = BTreeMap::new();
    for n in &inventory.numa {
        let ids: Vec<u32> = n.cpus.iter().copied().filter(is_free).collect();
        by_numa.entry(n.id).or_default().extend(ids);
    }
    for ids in by_numa.values_mut() {
        ids.sort_unstable();
        ids.dedup();
    }
    let gpu_numa = |g: &u32| {
        inventory
            .gpus
            .iter()
            .find(|i| i.index == *g)
            .and_then(|i| i.numa_node)
    };

    // How many CPUs to take from each NUMA node first, in order.
    let mut quotas: Vec<(u32, usize)> = Vec::new();
    let mut per_numa: BTreeMap<u32, usize> = BTreeMap::new();
    for g in gpus {
        if let Some(n) = gpu_numa(g) {
            *per_numa.entry(n).or_default() += 1;
        }
    }
    if !per_numa.is_empty() {
        let located: usize = per_numa.values().sum();
        let mut order: Vec<(u32, usize)> = per_numa.into_iter().collect();
        order.sort_by_key(|&(id, n)| (std::cmp::Reverse(n), id));
        let mut given = 0;
        for &(id, n) in &order {
            let share = count * n / located;
            quotas.push((id, share));
            given += share;
        }
        // The remainder, one each, to the NUMA nodes with the most GPUs.
        for q in quotas.iter_mut().take(count - given) {
            q.1 += 1;
        }
    } else {
        let on_numa = |id: u32| {
            inventory
                .gpus
                .iter()
                .filter(|g| g.numa_node == Some(id) && free_gpus.contains(&g.index))
                .count()
        };
        if let Some((&id, _)) = by_numa
            .iter()
            .filter(|(_, ids)| ids.len() >= count)
            .min_by_key(|(&id, ids)| (on_numa(id), ids.len(), id))
        {
            quotas.push((id, count));
        }
    }

    let mut picked: BTreeSet<u32> = BTreeSet::new();
    let take = |ids: &[u32], n: usize, picked: &mut BTreeSet<u32>| {
        let new: Vec<u32> = ids
            .iter()
            .copied()
            .filter(|c| !picked.contains(c))
            .take(n)
            .collect();
        picked.extend(new);
    };
    for &(id, q) in &quotas {
        if let Some(ids) = by_numa.get(&id) {
            take(ids, q, &mut picked);
        }
    }
    // Short somewhere: the quota'd NUMA nodes first, then the emptiest others.
    let mut rest: Vec<(u32, usize)> = by_numa
        .iter()
        .filter(|(id, _)| !quotas.iter().any(|q| q.0 == **id))
        .map(|(&id, ids)| (id, ids.len()))
        .collect();
    rest.sort_by_key(|&(id, n)| (std::cmp::Reverse(n), id));
    let spill = quotas
        .iter()
        .map(|q| q.0)
        .chain(rest.into_iter().map(|r| r.0));
    for id in spill {
        if picked.len() >= count {
            break;
        }
        if let Some(ids) = by_numa.get(&id) {
            take(ids, count - picked.len(), &mut picked);
        }
    }
    // CPU ids in no NUMA node (an odd inventory): lowest first.
    if picked.len() < count {
        take(free, count - picked.len(), &mut picked);
    }
    picked.into_iter().collect()
}
