//! MIG slices in a pass: which of a node's GPU entries a job may have (its
//! profile's instances, or whole GPUs only) and which free instances it
//! gets. Slices are inventory entries (see `model::mig`), so the pool's GPU
//! sets hold them as they hold GPUs; only the kind a job may take differs.
//!
//! Best fit for slices: a job takes instances on the GPU with the fewest
//! free instances left (the one already most in use) before breaking into a
//! fresh GPU, so partitioned GPUs fill up one by one and whole ones stay
//! whole for larger profiles.

use std::collections::BTreeSet;

use crate::model::NodeInventory;

use super::gpuset::GpuSet;

/// The entries of a node with partitioned GPUs, by kind.
#[derive(Debug, Default)]
pub(super) struct Kinds {
    /// Whole GPUs.
    whole: GpuSet,
    /// Instances by profile.
    profiles: Vec<(String, GpuSet)>,
    /// `(entry, physical GPU)` of every instance.
    parent: Vec<(u32, u32)>,
}

impl Kinds {
    /// The kinds of `inventory`'s entries; `None` when no GPU is partitioned
    /// (every entry is a whole GPU, the common case, which costs nothing).
    pub fn of(inventory: &NodeInventory) -> Option<Kinds> {
        if !inventory.has_slices() {
            return None;
        }
        let mut k = Kinds::default();
        for g in &inventory.gpus {
            match &g.mig {
                None => {
                    k.whole.insert(g.index);
                }
                Some(m) => {
                    k.parent.push((g.index, m.parent));
                    match k.profiles.iter_mut().find(|(p, _)| *p == m.profile) {
                        Some((_, set)) => {
                            set.insert(g.index);
                        }
                        None => k
                            .profiles
                            .push((m.profile.clone(), [g.index].into_iter().collect())),
                    }
                }
            }
        }
        Some(k)
    }

    /// The entries a job asking for `slice` may have.
    pub fn mask(&self, slice: Option<&str>) -> Option<&GpuSet> {
        match slice {
            None => Some(&self.whole),
            Some(want) => self
                .profiles
                .iter()
                .find(|(p, _)| p.eq_ignore_ascii_case(want))
                .map(|(_, s)| s),
        }
    }

    /// How many of `free` a job asking for `slice` may have.
    pub fn count(&self, free: &GpuSet, slice: Option<&str>) -> u32 {
        self.mask(slice).map_or(0, |m| free.count_in(m) as u32)
    }

    /// `n` instances out of `eligible` (free, of the job's profile): those
    /// on the physical GPUs with the fewest free instances (of any profile,
    /// in `free`) first, then by index. Sorted; `None` when too few.
    pub fn pick(&self, free: &GpuSet, eligible: &BTreeSet<u32>, n: u32) -> Option<Vec<u32>> {
        if eligible.len() < n as usize {
            return None;
        }
        // Free instances per physical GPU, in one read of the instances.
        let mut free_on: Vec<(u32, usize)> = Vec::new();
        for &(e, p) in &self.parent {
            let n = usize::from(free.contains(e));
            match free_on.iter_mut().find(|(q, _)| *q == p) {
                Some((_, c)) => *c += n,
                None => free_on.push((p, n)),
            }
        }
        let mut ranked: Vec<(usize, u32, u32)> = self
            .parent
            .iter()
            .filter(|(e, _)| eligible.contains(e))
            .map(|&(e, p)| {
                let n = free_on.iter().find(|(q, _)| *q == p).map_or(0, |(_, c)| *c);
                (n, p, e)
            })
            .collect();
        ranked.sort_unstable();
        let mut out: Vec<u32> = ranked
            .into_iter()
            .take(n as usize)
            .map(|(_, _, g)| g)
            .collect();
        out.sort_unstable();
        Some(out)
    }
}
