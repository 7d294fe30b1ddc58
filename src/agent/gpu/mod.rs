//! GPU inventory and health behind one trait, `GpuBackend`, so the agent does
//! not care whether its GPUs are real (NVML), simulated (`fake`) or absent.
//!
//! Why a trait and not a cfg: the same binary runs on GPU nodes, login nodes
//! and laptops (`gpuq dev`), so the choice is made at run time from the
//! agent's `gpus` setting. NVML is loaded with `dlopen` when the backend
//! opens, never linked, so a machine without the driver still runs `gpuq`.
//!
//! Health is event-shaped: `poll_events` hands the agent what happened since
//! the last call, and a backend marks a GPU unhealthy (`GpuInfo::healthy`,
//! `GpuInfo::fault`) once `poll_events` has reported a critical event for it.
//! `is_critical` is the one place that decides which events those are.

pub mod fake;
pub mod mig;
pub mod nvml;
mod nvml_mig;

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Mutex;

use serde::{Deserialize, Serialize};

use crate::model::{GpuInfo, GpuLink};

pub use crate::config::gpus::{FakeGpuConfig, FakeNvLink, GpuConfig};
pub use fake::FakeGpus;
pub use nvml::NvmlBackend;

/// Where an agent's GPUs come from.
pub trait GpuBackend: Send + Sync {
    /// A short name for logs and `gpuq nodes`: `nvml`, `fake` or `none`.
    fn kind(&self) -> &'static str;
    /// The GPUs in index order (`CUDA_DEVICE_ORDER=PCI_BUS_ID`), with health.
    fn gpus(&self) -> Result<Vec<GpuInfo>, GpuError>;
    /// `links()[i][j]`: how GPU i reaches GPU j; square, `SelfLink` on the diagonal.
    fn links(&self) -> Result<Vec<Vec<GpuLink>>, GpuError>;
    /// Health events since the last call. Never blocks.
    fn poll_events(&self) -> Vec<GpuEvent>;
    /// Each GPU's utilisation, memory, temperature, power and error counts
    /// now, in index order; empty where the backend cannot tell.
    fn telemetry(&self) -> Vec<GpuTelemetry> {
        Vec::new()
    }
    /// Simulated GPUs only: the utilisation (percent) each GPU shows from
    /// now on, by index; the others show idle. Real GPUs ignore it.
    fn simulate_load(&self, _load: &BTreeMap<u32, u8>) {}
    /// Partitions every GPU into MIG `layout` (`None`: MIG off, whole GPUs);
    /// `gpus()` then reports the new instances. Only while nothing runs.
    fn set_mig(&self, _layout: Option<&crate::model::MigLayout>) -> Result<(), GpuError> {
        Err(GpuError::Mig(format!(
            "the {} GPU backend cannot repartition GPUs; use nvidia-smi mig on the node",
            self.kind()
        )))
    }
}

/// One GPU's readings at one moment (what `nvidia-smi` shows).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct GpuTelemetry {
    pub index: u32,
    /// Percent of the last sample period a kernel ran.
    pub utilization_pct: f64,
    pub memory_used_mb: u64,
    pub memory_total_mb: u64,
    pub temperature_c: Option<f64>,
    pub power_w: Option<f64>,
    /// XID errors and uncorrectable ECC errors seen since the agent started.
    pub xid_errors: u64,
    pub ecc_uncorrectable_errors: u64,
}

/// A health event on one GPU (by index).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum GpuEvent {
    /// The driver logged an XID error (see `xid_description`).
    Xid { gpu: u32, xid: u64 },
    /// Uncorrectable (double-bit) ECC errors; `count` is the volatile total
    /// when the driver tells it, else 1.
    EccDoubleBit { gpu: u32, count: u64 },
    /// Memory pages wait to be retired; they take effect at the next GPU reset.
    PendingPageRetirement { gpu: u32 },
    /// The GPU stopped answering on PCIe.
    FellOffBus { gpu: u32 },
}

impl GpuEvent {
    /// The index of the GPU the event is about.
    pub fn gpu(&self) -> u32 {
        match *self {
            GpuEvent::Xid { gpu, .. }
            | GpuEvent::EccDoubleBit { gpu, .. }
            | GpuEvent::PendingPageRetirement { gpu }
            | GpuEvent::FellOffBus { gpu } => gpu,
        }
    }
}

impl fmt::Display for GpuEvent {
    /// What happened, as it appears in a GPU's `fault` and in a drain reason.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            GpuEvent::Xid { xid, .. } => match xid_description(xid) {
                Some(what) => write!(f, "XID {xid} ({what})"),
                None => write!(f, "XID {xid}"),
            },
            GpuEvent::EccDoubleBit { count, .. } => {
                write!(f, "{count} uncorrectable (double-bit) ECC error(s)")
            }
            GpuEvent::PendingPageRetirement { .. } => {
                write!(f, "memory pages pending retirement (GPU reset needed)")
            }
            GpuEvent::FellOffBus { .. } => write!(f, "GPU fell off the bus"),
        }
    }
}

/// XIDs a faulty user program causes (illegal access, page fault, stopped or
/// preempted work, video decoder exception, context switch timeout). They end
/// with the process and say nothing about the hardware. This is the list
/// NVIDIA's Kubernetes device plugin skips.
pub const APPLICATION_XIDS: [u64; 6] = [13, 31, 43, 45, 68, 109];

/// Whether an event makes its GPU unhealthy (no new work, node drained).
///
/// The rule: every event is critical except an XID in `APPLICATION_XIDS`.
/// Unknown XIDs count as critical on purpose: a new driver's new XID is far
/// more often hardware or driver trouble than a user bug, and draining a node
/// by mistake costs an admin a `gpuq node resume`, while scheduling onto a bad
/// GPU costs every job that lands there. Double-bit ECC errors, pending page
/// retirement (which needs a GPU reset to take effect) and a GPU that fell off
/// the bus are always critical.
pub fn is_critical(event: &GpuEvent) -> bool {
    match *event {
        GpuEvent::Xid { xid, .. } => !APPLICATION_XIDS.contains(&xid),
        GpuEvent::EccDoubleBit { .. }
        | GpuEvent::PendingPageRetirement { .. }
        | GpuEvent::FellOffBus { .. } => true,
    }
}

/// A few words on what an XID means, for the ones operators meet most.
pub fn xid_description(xid: u64) -> Option<&'static str> {
    Some(match xid {
        13 => "graphics engine exception",
        31 => "GPU memory page fault",
        43 => "GPU stopped processing",
        45 => "preemptive cleanup",
        48 => "double-bit ECC error",
        61 => "internal micro-controller breakpoint",
        62 => "internal micro-controller halt",
        63 => "ECC page retirement or row remapping event",
        64 => "ECC page retirement or row remapping failure",
        68 => "video processor exception",
        69 => "graphics engine class error",
        74 => "NVLink error",
        79 => "GPU fell off the bus",
        92 => "high single-bit ECC error rate",
        94 => "contained ECC error",
        95 => "uncontained ECC error",
        109 => "context switch timeout",
        119 => "GSP RPC timeout",
        120 => "GSP error",
        _ => return None,
    })
}

/// Why GPUs could not be listed.
#[derive(Debug, thiserror::Error)]
pub enum GpuError {
    #[error(
        "could not load NVIDIA's management library (NVML): {cause}; install the NVIDIA \
         driver, or set gpus = \"none\" (or \"auto\") in the agent config"
    )]
    NvmlUnavailable { cause: String },
    #[error("NVML could not {what}{}: {source}", gpu.map(|g| format!(" for GPU {g}")).unwrap_or_default())]
    Nvml {
        what: &'static str,
        gpu: Option<u32>,
        #[source]
        source: ::nvml_wrapper::error::NvmlError,
    },
    #[error("invalid gpus.fake setting: {0}")]
    InvalidFake(String),
    #[error("there is no GPU {gpu} on this node (it has {count})")]
    NoSuchGpu { gpu: u32, count: u32 },
    #[error("{0}")]
    Mig(String),
}

/// A node without GPUs (`gpus = "none"`, or `"auto"` without a driver).
#[derive(Debug, Default)]
pub struct NoGpus;

impl GpuBackend for NoGpus {
    fn kind(&self) -> &'static str {
        "none"
    }
    fn gpus(&self) -> Result<Vec<GpuInfo>, GpuError> {
        Ok(Vec::new())
    }
    fn links(&self) -> Result<Vec<Vec<GpuLink>>, GpuError> {
        Ok(Vec::new())
    }
    fn poll_events(&self) -> Vec<GpuEvent> {
        Vec::new()
    }
}

/// Opens the backend `cfg` names. `node_name` seeds the fake's UUIDs and PCI ids.
pub fn open_backend(cfg: &GpuConfig, node_name: &str) -> Result<Box<dyn GpuBackend>, GpuError> {
    match cfg {
        GpuConfig::None => Ok(Box::new(NoGpus)),
        GpuConfig::Nvml => Ok(Box::new(NvmlBackend::open()?)),
        GpuConfig::Auto => match NvmlBackend::open() {
            Ok(backend) => Ok(Box::new(backend)),
            Err(GpuError::NvmlUnavailable { cause }) => {
                tracing::info!("no NVIDIA driver found ({cause}); starting with no GPUs");
                Ok(Box::new(NoGpus))
            }
            // The driver is there but a GPU query failed: that is a broken
            // node, not a GPU-less one, so say so instead of hiding its GPUs.
            Err(e) => Err(e),
        },
        GpuConfig::Fake(fake) => Ok(Box::new(FakeGpus::new(node_name, fake)?)),
    }
}

/// The first critical fault seen per GPU, shared by the backends so both mark
/// GPUs unhealthy by the same rule. The first fault is kept: it is the cause,
/// what follows (a GPU that fell off the bus after XID 79) is its echo.
#[derive(Debug, Default)]
struct FaultLedger {
    faults: Mutex<BTreeMap<u32, String>>,
    /// Per GPU: XID events and uncorrectable ECC errors seen (critical or not).
    counts: Mutex<BTreeMap<u32, (u64, u64)>>,
}

impl FaultLedger {
    /// Counts `event`, and records it as the GPU's fault if it is critical.
    fn observe(&self, event: &GpuEvent) {
        {
            let mut counts = self.counts.lock().unwrap_or_else(|e| e.into_inner());
            let c = counts.entry(event.gpu()).or_default();
            match *event {
                GpuEvent::Xid { .. } => c.0 += 1,
                GpuEvent::EccDoubleBit { count, .. } => c.1 += count.max(1),
                _ => {}
            }
        }
        if is_critical(event) {
            self.lock()
                .entry(event.gpu())
                .or_insert_with(|| event.to_string());
        }
    }

    /// Marks the GPUs with a recorded fault unhealthy.
    fn apply(&self, gpus: &mut [GpuInfo]) {
        let faults = self.lock();
        for gpu in gpus {
            if let Some(fault) = faults.get(&gpu.index) {
                gpu.healthy = false;
                gpu.fault = Some(fault.clone());
            }
        }
    }

    /// Fills in the error counts of `t`.
    fn count_into(&self, t: &mut [GpuTelemetry]) {
        let counts = self.counts.lock().unwrap_or_else(|e| e.into_inner());
        for g in t {
            if let Some((xid, ecc)) = counts.get(&g.index) {
                g.xid_errors = *xid;
                g.ecc_uncorrectable_errors = *ecc;
            }
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<u32, String>> {
        // A panic elsewhere while holding the lock leaves a map that is still
        // consistent (single inserts), so keep using it.
        self.faults.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Deserialize)]
    #[serde(deny_unknown_fields)]
    struct AgentToml {
        #[serde(default)]
        gpus: GpuConfig,
    }

    fn parse(toml_text: &str) -> Result<GpuConfig, toml::de::Error> {
        toml::from_str::<AgentToml>(toml_text).map(|a| a.gpus)
    }

    #[test]
    fn critical_table() {
        for xid in APPLICATION_XIDS {
            assert!(!is_critical(&GpuEvent::Xid { gpu: 0, xid }), "XID {xid}");
        }
        for xid in [48, 63, 64, 74, 79, 92, 94, 95, 119, 120, 9999] {
            assert!(is_critical(&GpuEvent::Xid { gpu: 0, xid }), "XID {xid}");
        }
        assert!(is_critical(&GpuEvent::EccDoubleBit { gpu: 1, count: 1 }));
        assert!(is_critical(&GpuEvent::PendingPageRetirement { gpu: 1 }));
        assert!(is_critical(&GpuEvent::FellOffBus { gpu: 1 }));
    }

    #[test]
    fn event_descriptions_name_the_fault() {
        assert_eq!(
            GpuEvent::Xid { gpu: 3, xid: 79 }.to_string(),
            "XID 79 (GPU fell off the bus)"
        );
        assert_eq!(GpuEvent::Xid { gpu: 3, xid: 4242 }.to_string(), "XID 4242");
        assert_eq!(GpuEvent::FellOffBus { gpu: 5 }.gpu(), 5);
    }

    #[test]
    fn config_shapes() {
        assert_eq!(parse("").unwrap(), GpuConfig::Auto);
        assert_eq!(parse(r#"gpus = "auto""#).unwrap(), GpuConfig::Auto);
        assert_eq!(parse(r#"gpus = "nvml""#).unwrap(), GpuConfig::Nvml);
        assert_eq!(parse(r#"gpus = "none""#).unwrap(), GpuConfig::None);
        assert_eq!(
            parse("gpus = { fake = {} }").unwrap(),
            GpuConfig::Fake(FakeGpuConfig::default())
        );
        let full = parse(
            r#"
            [gpus.fake]
            count = 4
            model = "NVIDIA A100-SXM4-40GB"
            memory_mb = 40960
            numa_nodes = 1
            nvlink = "pairs"
            fault_file = "/tmp/gpuq-faults"
            "#,
        )
        .unwrap();
        assert_eq!(
            full,
            GpuConfig::Fake(FakeGpuConfig {
                count: 4,
                model: "NVIDIA A100-SXM4-40GB".into(),
                memory_mb: 40960,
                numa_nodes: 1,
                nvlink: FakeNvLink::Pairs,
                fault_file: Some("/tmp/gpuq-faults".into()),
                ..Default::default()
            })
        );
        let none = parse(r#"gpus = { fake = { nvlink = "none" } }"#).unwrap();
        assert!(matches!(none, GpuConfig::Fake(f) if f.nvlink == FakeNvLink::None));
    }

    #[test]
    fn config_mistakes_are_named() {
        let err = parse("gpus = { fake = { cuont = 8 } }").unwrap_err();
        assert!(err.to_string().contains("cuont"), "{err}");
        let err = parse(r#"gpus = "nvidia""#).unwrap_err();
        assert!(err.to_string().contains("nvidia"), "{err}");
        let err = parse(r#"gpus = { fake = { nvlink = "mesh" } }"#).unwrap_err();
        assert!(err.to_string().contains("mesh"), "{err}");
    }

    #[test]
    fn none_backend_is_empty() {
        let b = open_backend(&GpuConfig::None, "n1").unwrap();
        assert_eq!(b.kind(), "none");
        assert!(b.gpus().unwrap().is_empty());
        assert!(b.links().unwrap().is_empty());
        assert!(b.poll_events().is_empty());
    }

    #[test]
    fn auto_falls_back_to_no_gpus_without_a_driver() {
        let b =
            open_backend(&GpuConfig::Auto, "n1").expect("auto never fails for lack of a driver");
        match NvmlBackend::open() {
            Err(GpuError::NvmlUnavailable { .. }) => {
                assert_eq!(b.kind(), "none");
                assert!(b.gpus().unwrap().is_empty());
            }
            _ => assert_eq!(b.kind(), "nvml"),
        }
    }

    #[test]
    fn ledger_keeps_the_first_critical_fault() {
        let ledger = FaultLedger::default();
        ledger.observe(&GpuEvent::Xid { gpu: 0, xid: 13 });
        ledger.observe(&GpuEvent::Xid { gpu: 1, xid: 79 });
        ledger.observe(&GpuEvent::FellOffBus { gpu: 1 });
        let mut gpus: Vec<GpuInfo> = (0..2)
            .map(|index| GpuInfo {
                index,
                uuid: format!("GPU-{index}"),
                model: "m".into(),
                memory_mb: 1,
                pci_bus_id: String::new(),
                numa_node: None,
                healthy: true,
                fault: None,
                mig: None,
            })
            .collect();
        ledger.apply(&mut gpus);
        assert!(gpus[0].healthy && gpus[0].fault.is_none());
        assert!(!gpus[1].healthy);
        assert_eq!(
            gpus[1].fault.as_deref(),
            Some("XID 79 (GPU fell off the bus)")
        );
    }
}
