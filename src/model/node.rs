//! Nodes and their hardware: what an agent reports (`NodeInventory`) and what
//! a job is given on a node (`NodeAllocation`).

use serde::{Deserialize, Serialize};

use super::{JobId, NodeName};

/// How two GPUs of a node are connected, closest first (nvidia-smi topo's
/// words: NV#, PIX, PXB, PHB, NODE, SYS).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum GpuLink {
    /// The same GPU.
    SelfLink,
    /// NVLink with this many links.
    NvLink(u8),
    /// Through at most one PCIe switch.
    PcieSwitch,
    /// Through several PCIe switches, not the host bridge.
    PcieMultiSwitch,
    /// Through a PCIe host bridge (same CPU socket).
    HostBridge,
    /// Across PCIe host bridges within one NUMA node.
    SameNuma,
    /// Across NUMA nodes (the SMP interconnect).
    CrossNuma,
}

impl GpuLink {
    /// A closeness rank: lower is closer. More NVLinks are closer.
    pub fn distance(self) -> u32 {
        match self {
            GpuLink::SelfLink => 0,
            GpuLink::NvLink(n) => 20 - u32::from(n.min(18)),
            GpuLink::PcieSwitch => 30,
            GpuLink::PcieMultiSwitch => 40,
            GpuLink::HostBridge => 50,
            GpuLink::SameNuma => 60,
            GpuLink::CrossNuma => 70,
        }
    }
}

/// The link matrix of `n` GPUs all wired through NVSwitch, as on a DGX
/// H100: `SelfLink` on the diagonal, NV18 everywhere else.
pub fn nvswitch_links(n: usize) -> Vec<Vec<GpuLink>> {
    (0..n)
        .map(|i| {
            (0..n)
                .map(|j| {
                    if i == j {
                        GpuLink::SelfLink
                    } else {
                        GpuLink::NvLink(18)
                    }
                })
                .collect()
        })
        .collect()
}

/// One GPU as the inventory backend found it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuInfo {
    /// The index CUDA uses with `CUDA_DEVICE_ORDER=PCI_BUS_ID`.
    pub index: u32,
    pub uuid: String,
    /// Marketing name, e.g. `NVIDIA H100 80GB HBM3`.
    pub model: String,
    pub memory_mb: u64,
    /// PCI bus id, e.g. `00000000:18:00.0`.
    pub pci_bus_id: String,
    /// The NUMA node the GPU hangs off, when known.
    pub numa_node: Option<u32>,
    /// False once a critical fault was seen; no new work goes there.
    #[serde(default = "yes")]
    pub healthy: bool,
    /// Why the GPU is unhealthy.
    #[serde(default)]
    pub fault: Option<String>,
    /// A MIG instance of a partitioned GPU (see [`super::mig`]); `None`: a
    /// whole GPU.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mig: Option<super::MigSlice>,
}

impl GpuInfo {
    /// The MIG profile of this entry, `None` for a whole GPU.
    pub fn slice_profile(&self) -> Option<&str> {
        self.mig.as_ref().map(|m| m.profile.as_str())
    }

    /// Whether a job asking for `slice` (a MIG profile, or `None` for whole
    /// GPUs) may have this entry: a whole-GPU job never gets a slice.
    pub fn is_kind(&self, slice: Option<&str>) -> bool {
        match (self.slice_profile(), slice) {
            (None, None) => true,
            (Some(have), Some(want)) => have.eq_ignore_ascii_case(want),
            _ => false,
        }
    }

    /// The physical GPU this entry is or is part of.
    pub fn physical_index(&self) -> u32 {
        self.mig.as_ref().map_or(self.index, |m| m.parent)
    }
}

fn yes() -> bool {
    true
}

/// A NUMA node: its CPUs and memory.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NumaNode {
    pub id: u32,
    /// Logical CPU ids.
    pub cpus: Vec<u32>,
    pub memory_mb: u64,
}

/// What an agent reports about its node when it registers.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeInventory {
    pub name: NodeName,
    pub gpus: Vec<GpuInfo>,
    /// `gpu_links[i][j]`: how GPU i reaches GPU j (square, `SelfLink` on the
    /// diagonal), between physical GPUs by index: MIG instances have no row.
    pub gpu_links: Vec<Vec<GpuLink>>,
    pub numa: Vec<NumaNode>,
    /// Logical CPUs available to jobs (after `reserved_cpus`).
    pub cpus: u32,
    /// Memory available to jobs in MiB (after `reserved_memory_mb`).
    pub memory_mb: u64,
    /// Topology domain path, e.g. `spine1/leaf3` (empty: unknown).
    #[serde(default)]
    pub topology: String,
    /// Node features for `--constraint` (e.g. `ib`, `nvme`).
    #[serde(default)]
    pub features: Vec<String>,
}

impl NodeInventory {
    /// The GPU model most of the node's GPUs have, for tables.
    pub fn gpu_model(&self) -> Option<&str> {
        self.gpus.first().map(|g| g.model.as_str())
    }

    /// Whether some GPU of the node is partitioned into MIG slices.
    pub fn has_slices(&self) -> bool {
        self.gpus.iter().any(|g| g.mig.is_some())
    }

    /// The entries a job asking for `slice` may have (see [`GpuInfo::is_kind`]).
    pub fn gpus_of<'a>(&'a self, slice: Option<&'a str>) -> impl Iterator<Item = &'a GpuInfo> {
        self.gpus.iter().filter(move |g| g.is_kind(slice))
    }

    /// The node's slices by profile, e.g. `[("1g.10gb", 7)]`, in profile order.
    pub fn slice_counts(&self) -> Vec<(&str, usize)> {
        let mut out: Vec<(&str, usize)> = Vec::new();
        for p in self.gpus.iter().filter_map(GpuInfo::slice_profile) {
            match out.iter_mut().find(|(name, _)| *name == p) {
                Some((_, n)) => *n += 1,
                None => out.push((p, 1)),
            }
        }
        out.sort_by_key(|(name, _)| super::mig::PROFILES.iter().position(|q| q.name == *name));
        out
    }

    /// What a table shows of the node's GPUs' partitioning: `56x 1g.10gb`,
    /// `7x 1g.10gb, 2x 3g.40gb`, shared GPUs as `8x shared/4` (GPUs x
    /// slots); empty when no GPU is partitioned or shared.
    pub fn slice_summary(&self) -> String {
        let shared = super::share::summary(&self.gpus);
        self.slice_counts()
            .iter()
            .filter(|(p, _)| *p != super::share::SHARED)
            .map(|(p, n)| format!("{n}x {p}"))
            .chain((!shared.is_empty()).then_some(shared))
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// What one job holds on one node.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeAllocation {
    pub node: NodeName,
    /// GPU indices on that node.
    pub gpus: Vec<u32>,
    /// Logical CPU ids (a cpuset), or empty with `cpu_count` only.
    #[serde(default)]
    pub cpus: Vec<u32>,
    pub cpu_count: u32,
    pub memory_mb: u64,
}

/// Where a job's ranks run: node rank i is `nodes[i]`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Allocation {
    pub job: JobId,
    pub nodes: Vec<NodeAllocation>,
}

impl Allocation {
    /// GPUs it holds, on all its nodes.
    pub fn gpus(&self) -> u64 {
        self.nodes.iter().map(|n| n.gpus.len() as u64).sum()
    }
}

/// Writes CPU ids in cpulist syntax (`0-3,8,10-11`), as cgroup `cpuset.cpus` takes them.
pub fn format_cpulist(cpus: &[u32]) -> String {
    let mut sorted = cpus.to_vec();
    sorted.sort_unstable();
    sorted.dedup();
    let mut parts = Vec::new();
    let mut i = 0;
    while i < sorted.len() {
        let start = sorted[i];
        let mut end = start;
        while i + 1 < sorted.len() && sorted[i + 1] == end + 1 {
            end += 1;
            i += 1;
        }
        parts.push(if start == end {
            start.to_string()
        } else {
            format!("{start}-{end}")
        });
        i += 1;
    }
    parts.join(",")
}
