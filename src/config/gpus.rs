//! The agent's `gpus` key: which GPU backend it uses, and the shape of
//! simulated GPUs for `gpuq dev`, tests and `gpuq sim`. The backends
//! themselves live in `agent::gpu`; this is only what a config file says.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// The agent's `gpus` setting.
///
/// ```toml
/// gpus = "auto"      # NVML when the driver loads, else no GPUs (default)
/// gpus = "nvml"      # NVML; failing to load it is an error
/// gpus = "none"      # no GPUs (login nodes, CPU-only nodes)
/// gpus = { fake = { count = 8, model = "NVIDIA H100 80GB HBM3", memory_mb = 81559,
///                   numa_nodes = 2, nvlink = "nvswitch", fault_file = "/tmp/faults" } }
/// gpus = { fake = { count = 8, mig = "1g.10gb:7" } }           # every GPU in 7 slices
/// gpus = { fake = { count = 2, mig_per_gpu = ["3g.40gb:2", ""] } } # GPU 0 only
/// gpus = { fake = { count = 1, shared = 4 } }      # one GPU, 4 time-shared slots
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum GpuConfig {
    #[default]
    Auto,
    Nvml,
    None,
    Fake(FakeGpuConfig),
}

/// Simulated GPUs (`gpus = { fake = { ... } }`); every key is optional and the
/// defaults describe a DGX H100.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct FakeGpuConfig {
    /// How many GPUs (0 to 64).
    pub count: u32,
    /// The model name every GPU reports.
    pub model: String,
    /// Memory per GPU in MiB.
    pub memory_mb: u64,
    /// NUMA nodes the GPUs are spread over in index order (1 to 64).
    pub numa_nodes: u32,
    /// How the GPUs are wired.
    pub nvlink: FakeNvLink,
    /// When set, each `poll_events` reads fault lines from this file and
    /// removes it (see `fake`), so a test or a shell can inject faults.
    pub fault_file: Option<PathBuf>,
    /// A MIG layout every GPU is partitioned into (`1g.10gb:7`,
    /// `3g.40gb,2g.20gb,1g.10gb:2`); see `model::mig` for the profiles.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mig: Option<crate::model::MigLayout>,
    /// A MIG layout per GPU by index (`""`: the GPU stays whole; GPUs past
    /// the list too). Not together with `mig`.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub mig_per_gpu: Vec<String>,
    /// Every whole GPU time-shared into this many slots (1 to 64; see
    /// `model::share`), as `gpuq node share --slots` would.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub shared: Option<u8>,
}

impl FakeGpuConfig {
    /// The layout of each GPU (`None`: whole), from `mig` or `mig_per_gpu`;
    /// an error names the bad entry.
    pub fn mig_layouts(&self) -> Result<Vec<Option<crate::model::MigLayout>>, String> {
        use crate::model::MigLayout;
        if self.mig.is_some() && !self.mig_per_gpu.is_empty() {
            return Err("mig and mig_per_gpu are both set; use one".into());
        }
        if self.mig_per_gpu.len() > self.count as usize {
            return Err(format!(
                "mig_per_gpu lists {} layouts for {} GPUs",
                self.mig_per_gpu.len(),
                self.count
            ));
        }
        (0..self.count as usize)
            .map(|i| match (&self.mig, self.mig_per_gpu.get(i)) {
                (Some(all), _) => Ok(Some(all.clone())),
                (None, Some(text)) if !text.trim().is_empty() => MigLayout::parse(text)
                    .map(Some)
                    .map_err(|e| format!("mig_per_gpu[{i}]: {e}")),
                _ => Ok(None),
            })
            .collect()
    }
}

impl Default for FakeGpuConfig {
    fn default() -> Self {
        FakeGpuConfig {
            count: 8,
            model: "NVIDIA H100 80GB HBM3".to_string(),
            memory_mb: 81559,
            numa_nodes: 2,
            nvlink: FakeNvLink::NvSwitch,
            fault_file: None,
            mig: None,
            mig_per_gpu: Vec::new(),
            shared: None,
        }
    }
}

/// The NVLink wiring of fake GPUs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FakeNvLink {
    /// Every pair through NVSwitch with 18 links (DGX/HGX H100).
    #[default]
    NvSwitch,
    /// NVLink bridges on pairs 0-1, 2-3, ...; PCIe otherwise (H100 NVL, A100 PCIe).
    Pairs,
    /// PCIe only.
    None,
}
