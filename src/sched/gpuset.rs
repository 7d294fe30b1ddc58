//! A node's free GPUs during a pass, as a bit set. A pass copies its pool
//! of free resources for every reservation backfill looks for (and for
//! preemption's simulations), and gives running jobs' GPUs back to it by the
//! thousand: with a `BTreeSet` per node that was an allocation per node per
//! copy, and most of a 10,000-node pass. Indices below 128 (every real
//! node's) are bits; any above live in an overflow set, so nothing is lost
//! on a node that names larger ones.

use std::collections::BTreeSet;

/// A set of GPU indices (see the module comment).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(super) struct GpuSet {
    low: u128,
    high: Option<BTreeSet<u32>>,
}

impl GpuSet {
    pub fn len(&self) -> usize {
        self.low.count_ones() as usize + self.high.as_ref().map_or(0, |h| h.len())
    }

    pub fn contains(&self, g: u32) -> bool {
        match g {
            0..128 => self.low & (1 << g) != 0,
            _ => self.high.as_ref().is_some_and(|h| h.contains(&g)),
        }
    }

    /// Adds `g`; whether it was not there.
    pub fn insert(&mut self, g: u32) -> bool {
        match g {
            0..128 => {
                let had = self.low & (1 << g) != 0;
                self.low |= 1 << g;
                !had
            }
            _ => self.high.get_or_insert_default().insert(g),
        }
    }

    /// Takes `g` out; whether it was there.
    pub fn remove(&mut self, g: u32) -> bool {
        match g {
            0..128 => {
                let had = self.low & (1 << g) != 0;
                self.low &= !(1 << g);
                had
            }
            _ => self.high.as_mut().is_some_and(|h| h.remove(&g)),
        }
    }

    /// Adds those of `other` that are in `only`; how many were not there.
    pub fn insert_all(&mut self, other: &GpuSet, only: &GpuSet) -> usize {
        let new = other.low & only.low & !self.low;
        self.low |= new;
        let mut added = new.count_ones() as usize;
        for &g in other.high.iter().flatten() {
            if only.contains(g) && self.insert(g) {
                added += 1;
            }
        }
        added
    }

    /// How many of these are in `other`.
    pub fn count_in(&self, other: &GpuSet) -> usize {
        let mut n = (self.low & other.low).count_ones() as usize;
        for &g in self.high.iter().flatten() {
            if other.contains(g) {
                n += 1;
            }
        }
        n
    }

    /// Those of these that are in `other`.
    pub fn intersect(&self, other: &GpuSet) -> GpuSet {
        let mut out = GpuSet {
            low: self.low & other.low,
            high: None,
        };
        for &g in self.high.iter().flatten() {
            if other.contains(g) {
                out.insert(g);
            }
        }
        out
    }

    /// The indices in increasing order, as the GPU and CPU pickers take them.
    pub fn to_set(&self) -> BTreeSet<u32> {
        let mut out: BTreeSet<u32> = (0..128).filter(|&g| self.low & (1 << g) != 0).collect();
        if let Some(h) = &self.high {
            out.extend(h.iter().copied());
        }
        out
    }
}

impl FromIterator<u32> for GpuSet {
    fn from_iter<I: IntoIterator<Item = u32>>(iter: I) -> GpuSet {
        let mut s = GpuSet::default();
        for g in iter {
            s.insert(g);
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::GpuSet;

    #[test]
    fn bits_and_overflow_behave_as_one_set() {
        let mut s: GpuSet = [0, 7, 127, 128, 300].into_iter().collect();
        assert_eq!(s.len(), 5);
        assert!(s.contains(127) && s.contains(300) && !s.contains(1));
        assert!(!s.insert(300) && s.insert(1) && s.remove(128) && !s.remove(128));
        assert_eq!(
            s.to_set().into_iter().collect::<Vec<_>>(),
            [0, 1, 7, 127, 300]
        );
    }

    #[test]
    fn insert_all_adds_only_the_allowed_and_counts_the_new() {
        let mut s: GpuSet = [1, 200].into_iter().collect();
        let other: GpuSet = [0, 1, 2, 200, 201, 202].into_iter().collect();
        let only: GpuSet = [0, 1, 201, 202].into_iter().collect();
        assert_eq!(s.insert_all(&other, &only), 3);
        assert_eq!(
            s.to_set().into_iter().collect::<Vec<_>>(),
            [0, 1, 200, 201, 202]
        );
        assert_eq!(s.insert_all(&other, &only), 0);
    }
}
