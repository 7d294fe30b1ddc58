//! In-place gang restart (Slurm's requeue onto the same nodes, TorchElastic's
//! restart of the surviving workers): a job requeued after losing a node or a
//! GPU keeps the nodes of its last attempt that can still take it, at the
//! ranks they had, and only the lost ranks go to replacements. A 64-node job
//! then restarts as soon as one node is free, in the domain it already spans,
//! instead of being placed from scratch.
//!
//! A kept node is one of the previous nodes that is up, allowed and has the
//! job's per-node share free now (its old ranks have stopped: apply requeues
//! a job only once every rank has ended). A replacement is the free node
//! closest in topology to the kept ones (the lowest level at which it shares
//! a domain with one of them), then the best fit, then by name. Under
//! `--topology`, kept nodes and replacements must lie in one domain of that
//! level, or the job is placed from scratch as any other.

use std::collections::{BTreeMap, BTreeSet};

use crate::model::NodeAllocation;

use super::topology::{depth, domain, Domain, Fit, Level};

/// Positions into `fits`, in rank order, for a restart of a job whose last
/// attempt ran on `previous` (rank order): the previous nodes found in
/// `fits` keep their ranks, the others are replaced. `None` when the job
/// had no previous attempt of this size, none of its nodes can be kept, too
/// few replacements are free, or `strict` (levels up, from `--topology`)
/// cannot be kept; the caller then places the job from scratch.
pub(super) fn keep_healthy(
    previous: &[NodeAllocation],
    fits: &[Fit],
    want: usize,
    strict: Option<usize>,
) -> Option<Vec<usize>> {
    if previous.len() != want || want == 0 {
        return None;
    }
    let by_name: BTreeMap<&str, usize> =
        fits.iter().enumerate().map(|(i, f)| (f.name, i)).collect();
    let mut ranks: Vec<Option<usize>> = previous
        .iter()
        .map(|p| by_name.get(p.node.as_str()).copied())
        .collect();
    let kept: Vec<usize> = ranks.iter().flatten().copied().collect();
    if kept.is_empty() {
        return None;
    }
    let max_depth = fits.iter().map(|f| depth(f.topology)).max().unwrap_or(0);
    // The kept nodes' domains at each level, leaf first.
    let kept_domains: Vec<BTreeSet<Domain>> = (0..=max_depth)
        .map(|up| {
            kept.iter()
                .map(|&k| domain(fits[k].topology, fits[k].name, Level::Up(up)))
                .collect()
        })
        .collect();
    // Under `--topology`, the one domain of that level the kept nodes share.
    let within = match strict {
        Some(up) => {
            let mut doms = kept
                .iter()
                .map(|&k| domain(fits[k].topology, fits[k].name, Level::Up(up)));
            let first = doms.next()?;
            if !first.is_shared() || doms.any(|d| d != first) {
                return None;
            }
            Some((first, up))
        }
        None => None,
    };
    let taken: BTreeSet<usize> = kept.iter().copied().collect();
    // Closeness to the kept nodes: the lowest level sharing a domain.
    let closeness = |f: &Fit| {
        (0..=max_depth)
            .find(|&up| {
                let d = domain(f.topology, f.name, Level::Up(up));
                d.is_shared() && kept_domains[up].contains(&d)
            })
            .unwrap_or(max_depth + 1)
    };
    // (closeness, left free, name, position): the order replacements are taken in.
    type Spare<'a> = (usize, (u64, u64, u64), &'a str, usize);
    let mut spares: Vec<Spare> = (0..fits.len())
        .filter(|i| !taken.contains(i))
        .filter(|&i| {
            within.is_none_or(|(d, up)| domain(fits[i].topology, fits[i].name, Level::Up(up)) == d)
        })
        .map(|i| (closeness(&fits[i]), fits[i].left, fits[i].name, i))
        .collect();
    let lost = ranks.iter().filter(|r| r.is_none()).count();
    if spares.len() < lost {
        return None;
    }
    spares.sort_unstable();
    let mut spares = spares.into_iter().map(|s| s.3);
    for r in ranks.iter_mut().filter(|r| r.is_none()) {
        *r = spares.next();
    }
    ranks.into_iter().collect()
}

/// The GPUs a kept node had in the last attempt, when they are all free
/// again and the job asks for as many: a restart on the same devices (the
/// same `CUDA_VISIBLE_DEVICES`, and the CPUs of their NUMA nodes again).
pub(super) fn same_gpus(
    previous: &NodeAllocation,
    free: &BTreeSet<u32>,
    gpus: u32,
) -> Option<Vec<u32>> {
    (previous.gpus.len() == gpus as usize && previous.gpus.iter().all(|g| free.contains(g)))
        .then(|| previous.gpus.clone())
}
