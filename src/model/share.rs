//! Time-sliced GPU sharing: a GPU that is not MIG-partitioned shared by up
//! to N jobs at once (`gpuq node share NODE --slots N`, or the fake
//! backend's `shared = N`). Each slot is an inventory entry of its own, as
//! a MIG instance is (see [`super::mig`]): profile [`SHARED`], the GPU as
//! its parent, numbered after the node's physical GPUs. So the scheduler
//! places slots as it places slices (a whole-GPU job never lands on a
//! shared GPU; best fit fills a shared GPU before starting another), and
//! the task is given the physical GPU with `GPUQ_GPU_SHARED=N`.
//!
//! Unlike MIG nothing isolates the jobs: they share the GPU's memory and
//! take turns on its engines, as CUDA time-slicing does.

use super::{GpuInfo, MigSlice};

/// The slice profile of a time-sliced slot, as jobs ask for it
/// (`--gres gpu:shared:1`, `--gpus shared:2`).
pub const SHARED: &str = "shared";

/// The most slots one GPU may be shared into.
pub const MAX_SLOTS: u8 = 64;

/// The variable a task on a shared GPU is told the GPU's slot count in.
pub const SHARED_ENV: &str = "GPUQ_GPU_SHARED";

/// Whether `word` (a GPU request's type) asks for shared slots.
pub fn is_shared(word: &str) -> bool {
    word.trim().eq_ignore_ascii_case(SHARED)
}

/// What messages call the entries of `profile`: `shared GPU slots`,
/// `1g.10gb MIG slices`.
pub fn noun(profile: &str) -> String {
    if is_shared(profile) {
        "shared GPU slots".to_string()
    } else {
        format!("{profile} MIG slices")
    }
}

/// Checks an admin's slot count: 1 to [`MAX_SLOTS`].
pub fn check_slots(slots: u32) -> Result<u8, String> {
    match u8::try_from(slots) {
        Ok(n) if (1..=MAX_SLOTS).contains(&n) => Ok(n),
        _ => Err(format!(
            "--slots {slots}: a GPU is shared into 1 to {MAX_SLOTS} slots; use --off to stop \
             sharing"
        )),
    }
}

/// The slot count of the shared GPU entry `g` (`None`: not a shared slot).
pub fn slots_of(g: &GpuInfo) -> Option<u8> {
    g.mig.as_ref().filter(|m| m.slots > 0).map(|m| m.slots)
}

/// `gpus` (physical GPUs and MIG instances, numbered as `mig` numbers
/// them) with every whole GPU replaced by `slots` slot entries that carry
/// its UUID, model and health; slots are numbered after the node's
/// entries, GPU by GPU. MIG instances are kept as they are.
pub fn expand(gpus: &[GpuInfo], slots: u8) -> Vec<GpuInfo> {
    let mut out: Vec<GpuInfo> = gpus.iter().filter(|g| g.mig.is_some()).cloned().collect();
    let mut next = gpus.iter().map(|g| g.index + 1).max().unwrap_or(0);
    for g in gpus.iter().filter(|g| g.mig.is_none()) {
        for slot in 0..slots {
            let mut entry = g.clone();
            entry.index = next;
            entry.mig = Some(MigSlice {
                profile: SHARED.to_string(),
                parent: g.index,
                compute_slices: 0,
                placement: slot,
                slots,
            });
            out.push(entry);
            next += 1;
        }
    }
    out.sort_by_key(|g| g.index);
    out
}

/// The inverse of [`expand`]: each shared GPU as one whole GPU again (its
/// first slot, renumbered to the GPU's index); other entries unchanged.
pub fn physical(gpus: &[GpuInfo]) -> Vec<GpuInfo> {
    let mut out: Vec<GpuInfo> = Vec::with_capacity(gpus.len());
    for g in gpus {
        match g.mig.as_ref() {
            Some(m) if m.slots > 0 => {
                if m.placement == 0 {
                    let mut whole = g.clone();
                    whole.index = m.parent;
                    whole.mig = None;
                    out.push(whole);
                }
            }
            _ => out.push(g.clone()),
        }
    }
    out.sort_by_key(|g| g.index);
    out
}

/// What tables show for the shared GPUs of `gpus`, e.g. `8x shared/4`
/// (by slot count); empty when none is shared.
pub fn summary(gpus: &[GpuInfo]) -> String {
    let mut counts: Vec<(u8, usize)> = Vec::new();
    for g in gpus {
        if let Some(m) = g.mig.as_ref().filter(|m| m.slots > 0 && m.placement == 0) {
            match counts.iter_mut().find(|(n, _)| *n == m.slots) {
                Some((_, c)) => *c += 1,
                None => counts.push((m.slots, 1)),
            }
        }
    }
    counts
        .iter()
        .map(|(n, c)| format!("{c}x {SHARED}/{n}"))
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gpu(index: u32) -> GpuInfo {
        GpuInfo {
            index,
            uuid: format!("GPU-{index}"),
            model: "NVIDIA L40S".into(),
            memory_mb: 46_068,
            pci_bus_id: String::new(),
            numa_node: Some(0),
            healthy: true,
            fault: None,
            mig: None,
        }
    }

    #[test]
    fn sharing_expands_whole_gpus_into_slots_and_back() {
        let gpus = vec![gpu(0), gpu(1)];
        let shared = expand(&gpus, 4);
        assert_eq!(shared.len(), 8);
        assert_eq!(
            shared.iter().map(|g| g.index).collect::<Vec<_>>(),
            (2..10).collect::<Vec<_>>()
        );
        assert!(shared.iter().all(|g| g.slice_profile() == Some(SHARED)));
        assert_eq!(shared[5].physical_index(), 1);
        assert_eq!(shared[5].uuid, "GPU-1");
        assert_eq!(slots_of(&shared[0]), Some(4));
        assert_eq!(shared[0].mig.as_ref().unwrap().fraction(), 0.25);
        assert_eq!(summary(&shared), "2x shared/4");
        assert_eq!(physical(&shared), gpus);
        assert_eq!(summary(&gpus), "");
        // Re-sharing goes through the physical GPUs.
        assert_eq!(expand(&physical(&shared), 2).len(), 4);
    }

    #[test]
    fn slot_counts_outside_1_to_64_are_refused() {
        assert_eq!(check_slots(4), Ok(4));
        assert_eq!(check_slots(64), Ok(64));
        for bad in [0, 65, 300] {
            let err = check_slots(bad).unwrap_err();
            assert!(
                err.contains("1 to 64 slots") && err.contains("--off"),
                "{err}"
            );
        }
        assert!(is_shared("Shared") && !is_shared("h100"));
    }
}
