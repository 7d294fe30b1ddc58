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
