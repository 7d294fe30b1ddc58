//! A partitioned GPU as the inventory reports it: its MIG instances, each an
//! entry of its own (see `model::mig`). The fake backend lays out instances
//! from its config here; NVML reads the real ones and numbers them the same
//! way ([`slice_entry`]).

use sha2::{Digest, Sha256};

use crate::model::{GpuInfo, MigLayout, MigSlice};

/// The inventory of `gpus` (the physical GPUs, in index order) with each GPU
/// that has a layout in `layouts` (by position; `None` or missing: whole)
/// replaced by its instances. Whole GPUs keep their indices; instances are
/// numbered from `gpus.len()` on, GPU by GPU, so whole GPUs come first.
pub fn expand(gpus: &[GpuInfo], layouts: &[Option<MigLayout>]) -> Vec<GpuInfo> {
    let mut whole = Vec::with_capacity(gpus.len());
    let mut slices = Vec::new();
    let mut next = gpus.len() as u32;
    for (i, g) in gpus.iter().enumerate() {
        match layouts.get(i).and_then(Option::as_ref) {
            None => whole.push(g.clone()),
            Some(layout) => {
                for (n, (profile, at)) in layout.placed().into_iter().enumerate() {
                    let mig = MigSlice {
                        profile: profile.name.to_string(),
                        parent: g.index,
                        compute_slices: profile.compute_slices,
                        placement: at,
                        slots: 0,
                    };
                    slices.push(slice_entry(
                        g,
                        next,
                        fake_mig_uuid(&g.uuid, n as u32),
                        profile.memory_mb,
                        mig,
                    ));
                    next += 1;
                }
            }
        }
    }
    whole.extend(slices);
    whole
}

/// The inventory entry of one instance of `parent`.
pub fn slice_entry(
    parent: &GpuInfo,
    index: u32,
    uuid: String,
    memory_mb: u64,
    mig: MigSlice,
) -> GpuInfo {
    GpuInfo {
        index,
        uuid,
        model: parent.model.clone(),
        memory_mb,
        pci_bus_id: parent.pci_bus_id.clone(),
        numa_node: parent.numa_node,
        healthy: parent.healthy,
        fault: parent.fault.clone(),
        mig: Some(mig),
    }
}

/// A `MIG-` UUID in NVML's shape, stable for (parent UUID, instance).
fn fake_mig_uuid(parent: &str, n: u32) -> String {
    let mut h = Sha256::new();
    h.update(b"gpuq fake mig\0");
    h.update(parent.as_bytes());
    h.update(n.to_le_bytes());
    let hex = hex::encode(&h.finalize()[..16]);
    format!(
        "MIG-{}-{}-{}-{}-{}",
        &hex[0..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..32]
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent::gpu::{FakeGpuConfig, FakeGpus, GpuBackend};

    fn fake(cfg: FakeGpuConfig) -> Vec<GpuInfo> {
        FakeGpus::new("node01", &cfg).unwrap().gpus().unwrap()
    }

    #[test]
    fn a_partitioned_gpu_is_its_instances_and_never_whole() {
        let gpus = fake(FakeGpuConfig {
            count: 2,
            mig_per_gpu: vec!["1g.10gb:7".into()],
            ..Default::default()
        });
        // GPU 1 stays whole at its index; GPU 0 is 7 slices numbered from 2.
        assert_eq!(gpus.len(), 8);
        assert_eq!((gpus[0].index, gpus[0].mig.is_none()), (1, true));
        let slices = &gpus[1..];
        assert_eq!(
            slices.iter().map(|g| g.index).collect::<Vec<_>>(),
            (2..9).collect::<Vec<_>>()
        );
        let mut uuids: Vec<&str> = slices.iter().map(|g| g.uuid.as_str()).collect();
        assert!(uuids.iter().all(|u| u.starts_with("MIG-") && u.len() == 40));
        uuids.dedup();
        assert_eq!(uuids.len(), 7);
        for (n, s) in slices.iter().enumerate() {
            let m = s.mig.as_ref().unwrap();
            assert_eq!(
                (m.profile.as_str(), m.parent, m.placement),
                ("1g.10gb", 0, n as u8)
            );
        }
        // The same node and config give the same identities again.
        let again = fake(FakeGpuConfig {
            count: 2,
            mig_per_gpu: vec!["1g.10gb:7".into()],
            ..Default::default()
        });
        assert_eq!(gpus, again);
    }

    #[test]
    fn every_gpu_takes_the_one_layout_and_bad_layouts_are_refused() {
        let gpus = fake(FakeGpuConfig {
            count: 8,
            mig: Some(MigLayout::parse("3g.40gb,2g.20gb,1g.10gb:2").unwrap()),
            ..Default::default()
        });
        assert_eq!(gpus.len(), 32);
        assert!(gpus.iter().all(|g| g.mig.is_some() && g.index >= 8));
        let err = FakeGpus::new(
            "n",
            &FakeGpuConfig {
                count: 2,
                mig_per_gpu: vec!["".into(), "4g.40gb:2".into()],
                ..Default::default()
            },
        )
        .unwrap_err()
        .to_string();
        assert!(
            err.contains("mig_per_gpu[1]") && err.contains("does not fit"),
            "{err}"
        );
        let toml_err = toml::from_str::<FakeGpuConfig>("mig = \"2g.20gb:4\"")
            .unwrap_err()
            .to_string();
        assert!(toml_err.contains("does not fit one GPU"), "{toml_err}");
    }

    #[test]
    fn a_fault_on_a_partitioned_gpu_marks_its_instances() {
        let b = FakeGpus::new(
            "n",
            &FakeGpuConfig {
                count: 2,
                mig: Some(MigLayout::parse("3g.40gb:2").unwrap()),
                ..Default::default()
            },
        )
        .unwrap();
        b.inject(crate::agent::gpu::GpuEvent::Xid { gpu: 1, xid: 79 })
            .unwrap();
        b.poll_events();
        let gpus = b.gpus().unwrap();
        let sick: Vec<u32> = gpus
            .iter()
            .filter(|g| !g.healthy)
            .map(|g| g.index)
            .collect();
        assert_eq!(sick, [4, 5]);
    }
}
