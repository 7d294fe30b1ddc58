//! Real GPUs through NVML (`libnvidia-ml.so.1`, loaded when the backend
//! opens, so the binary needs no driver to start).
//!
//! What a GPU is (UUID, name, memory, PCI id, NUMA node) and how GPUs connect
//! does not change while the agent runs, so it is read once in `open`; health
//! is what `poll_events` watches:
//! - XID and double-bit ECC errors through one NVML event set per GPU, waited
//!   on with timeout 0. Per GPU so that one GPU refusing registration does not
//!   cost the others theirs (NVML frees a set whose registration failed).
//! - pending page retirement, which has no NVML event, by asking each GPU;
//! - a GPU that fell off the bus, seen as `GpuLost` from any of those calls.
//!
//! NVML's handles borrow the library handle, so the process keeps one `Nvml`
//! for its whole life (`shared_nvml`); it is never shut down, which the driver
//! tolerates: process exit releases it.
//!
//! NVLink counts: a link whose far end is another of our GPUs counts for that
//! pair; a link whose far end is anything else is an NVSwitch link, and two
//! GPUs that both have switch links reach each other over the fabric with the
//! smaller of their link counts (a DGX H100 reads NV18 everywhere, as
//! `nvidia-smi topo -m` shows). Without NVLink the PCIe relation comes from
//! `topology_common_ancestor`.

use std::path::Path;
use std::sync::Mutex;

use nvml_wrapper::bitmasks::event::EventTypes;
use nvml_wrapper::enum_wrappers::device::{EccCounter, MemoryError, TopologyLevel};
use nvml_wrapper::enums::event::XidError;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::{Device, EventSet, Nvml};

use super::{FaultLedger, GpuBackend, GpuError, GpuEvent, GpuTelemetry};
use crate::model::{GpuInfo, GpuLink};

/// NVML's NVLINK_MAX_LINKS: links per GPU to probe.
const MAX_NVLINKS: u32 = 18;
/// The XID NVML reports when it cannot tell which one it was.
const UNKNOWN_XID: u64 = 999;

/// GPUs found through NVML.
pub struct NvmlBackend {
    nvml: &'static Nvml,
    gpus: Vec<GpuInfo>,
    links: Vec<Vec<GpuLink>>,
    watch: Mutex<Watch>,
    ledger: FaultLedger,
    /// The MIG instances of each GPU with MIG on (`None`: a whole GPU), in
    /// `gpus` order; `gpus()` reports them in place of their GPU.
    mig: Vec<Option<Vec<GpuInfo>>>,
}

/// What `poll_events` keeps between calls.
struct Watch {
    /// (GPU index, its event set) for the GPUs that accepted registration.
    sets: Vec<(u32, EventSet<'static>)>,
    gpus: Vec<GpuWatch>,
}

#[derive(Clone, Copy, Default)]
struct GpuWatch {
    lost: bool,
    retirement_reported: bool,
    /// False once the GPU said it cannot tell about page retirement.
    retirement_supported: bool,
}

impl NvmlBackend {
    /// Loads NVML and reads the node's GPUs and their topology.
    pub fn open() -> Result<Self, GpuError> {
        let nvml = shared_nvml()?;
        let count = nvml.device_count().map_err(nvml_err("count GPUs", None))?;
        let mut devices = Vec::with_capacity(count as usize);
        let mut gpus = Vec::with_capacity(count as usize);
        for index in 0..count {
            let device = nvml
                .device_by_index(index)
                .map_err(nvml_err("open the GPU", Some(index)))?;
            gpus.push(read_gpu(&device, index)?);
            devices.push(device);
        }
        let mut next = count;
        let mut mig = Vec::with_capacity(devices.len());
        for (device, gpu) in devices.iter().zip(&gpus) {
            mig.push(super::nvml_mig::instances(nvml, device, gpu, &mut next)?);
        }
        let links = links(&devices, &gpus);
        let sets = register_events(nvml, &devices);
        let watch = Watch {
            sets,
            gpus: vec![
                GpuWatch {
                    retirement_supported: true,
                    ..GpuWatch::default()
                };
                gpus.len()
            ],
        };
        Ok(NvmlBackend {
            nvml,
            gpus,
            links,
            watch: Mutex::new(watch),
            ledger: FaultLedger::default(),
            mig,
        })
    }
}

impl GpuBackend for NvmlBackend {
    fn kind(&self) -> &'static str {
        "nvml"
    }

    fn gpus(&self) -> Result<Vec<GpuInfo>, GpuError> {
        let mut gpus = self.gpus.clone();
        self.ledger.apply(&mut gpus);
        if self.mig.iter().any(Option::is_some) {
            // A MIG-enabled GPU is its instances, with its health.
            let mut whole = Vec::with_capacity(gpus.len());
            let mut slices = Vec::new();
            for (g, mig) in gpus.into_iter().zip(&self.mig) {
                match mig {
                    None => whole.push(g),
                    Some(instances) => slices.extend(instances.iter().map(|s| GpuInfo {
                        healthy: g.healthy,
                        fault: g.fault.clone(),
                        ..s.clone()
                    })),
                }
            }
            whole.extend(slices);
            return Ok(whole);
        }
        Ok(gpus)
    }

    fn links(&self) -> Result<Vec<Vec<GpuLink>>, GpuError> {
        Ok(self.links.clone())
    }

    /// What NVML answers now; a reading a GPU refuses is left out (or 0).
    fn telemetry(&self) -> Vec<GpuTelemetry> {
        use nvml_wrapper::enum_wrappers::device::TemperatureSensor;
        let mut out = Vec::with_capacity(self.gpus.len());
        for g in &self.gpus {
            let Ok(device) = self.nvml.device_by_index(g.index) else {
                continue;
            };
            let memory = device.memory_info().ok();
            out.push(GpuTelemetry {
                index: g.index,
                utilization_pct: device.utilization_rates().map_or(0.0, |u| f64::from(u.gpu)),
                memory_used_mb: memory.as_ref().map_or(0, |m| m.used >> 20),
                memory_total_mb: memory.as_ref().map_or(g.memory_mb, |m| m.total >> 20),
                temperature_c: device
                    .temperature(TemperatureSensor::Gpu)
                    .ok()
                    .map(f64::from),
                power_w: device.power_usage().ok().map(|mw| f64::from(mw) / 1000.0),
                ..Default::default()
            });
        }
        self.ledger.count_into(&mut out);
        out
    }

    fn poll_events(&self) -> Vec<GpuEvent> {
        let mut watch = self.watch.lock().unwrap_or_else(|e| e.into_inner());
        let mut events = Vec::new();
        for (gpu, set) in &watch.sets {
            // Drain what is queued; Timeout means nothing more, GpuLost is
            // caught per GPU below.
            while let Ok(data) = set.wait(0) {
                if data.event_type.contains(EventTypes::CRITICAL_XID_ERROR) {
                    let xid = match data.event_data {
                        Some(XidError::Value(xid)) => xid,
                        Some(XidError::Unknown) | None => UNKNOWN_XID,
                    };
                    events.push(GpuEvent::Xid { gpu: *gpu, xid });
                }
                if data.event_type.contains(EventTypes::DOUBLE_BIT_ECC_ERROR) {
                    let count = data
                        .device
                        .total_ecc_errors(MemoryError::Uncorrected, EccCounter::Volatile)
                        .unwrap_or(1)
                        .max(1);
                    events.push(GpuEvent::EccDoubleBit { gpu: *gpu, count });
                }
            }
        }
        for (index, state) in watch.gpus.iter_mut().enumerate() {
            let gpu = index as u32;
            if !state.lost {
                if let Some(event) = check_gpu(self.nvml, gpu, state) {
                    events.push(event);
                }
            }
        }
        for event in &events {
            self.ledger.observe(event);
        }
        events
    }
}

/// Asks one GPU whether it still answers and whether pages wait for retirement.
fn check_gpu(nvml: &Nvml, gpu: u32, state: &mut GpuWatch) -> Option<GpuEvent> {
    let answer = nvml.device_by_index(gpu).and_then(|device| {
        if state.retirement_supported {
            match device.are_pages_pending_retired() {
                Err(NvmlError::NotSupported) => state.retirement_supported = false,
                other => return other,
            }
        }
        // Any query that reaches the GPU tells whether it is still there.
        device.memory_info().map(|_| false)
    });
    match answer {
        Ok(true) if !state.retirement_reported => {
            state.retirement_reported = true;
            Some(GpuEvent::PendingPageRetirement { gpu })
        }
        Ok(_) => None,
        Err(NvmlError::GpuLost) => {
            state.lost = true;
            Some(GpuEvent::FellOffBus { gpu })
        }
        Err(e) => {
            tracing::debug!("NVML health query for GPU {gpu} failed: {e}");
            None
        }
    }
}

/// The process's one NVML handle, loaded on first use.
fn shared_nvml() -> Result<&'static Nvml, GpuError> {
    static NVML: Mutex<Option<&'static Nvml>> = Mutex::new(None);
    let mut slot = NVML.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(nvml) = *slot {
        return Ok(nvml);
    }
    let nvml: &'static Nvml = Box::leak(Box::new(Nvml::init().map_err(init_error)?));
    *slot = Some(nvml);
    Ok(nvml)
}

/// Sorts a failed `nvmlInit` into "there is no driver here" (which `auto`
/// answers with zero GPUs) and "the driver is there but refuses" (an error
/// even for `auto`, since hiding a node's GPUs would be worse).
fn init_error(e: NvmlError) -> GpuError {
    let cause = match &e {
        // libloading's own words name the file and why (`libnvidia-ml.so.1:
        // cannot open shared object file: ...`); the wrapper's prefix adds nothing.
        NvmlError::LibloadingError(inner) => inner.to_string(),
        NvmlError::LibraryNotFound | NvmlError::FailedToLoadSymbol(_) => {
            format!("libnvidia-ml.so.1 is unusable: {e}")
        }
        NvmlError::DriverNotLoaded => {
            "libnvidia-ml.so.1 loaded, but the NVIDIA kernel driver is not running".to_string()
        }
        _ => String::new(),
    };
    match e {
        NvmlError::LibloadingError(_)
        | NvmlError::LibraryNotFound
        | NvmlError::FailedToLoadSymbol(_)
        | NvmlError::DriverNotLoaded => GpuError::NvmlUnavailable { cause },
        other => GpuError::Nvml {
            what: "start (nvmlInit)",
            gpu: None,
            source: other,
        },
    }
}

fn nvml_err(what: &'static str, gpu: Option<u32>) -> impl Fn(NvmlError) -> GpuError {
    move |source| GpuError::Nvml { what, gpu, source }
}

fn read_gpu(device: &Device<'_>, index: u32) -> Result<GpuInfo, GpuError> {
    let gpu = Some(index);
    let pci = device
        .pci_info()
        .map_err(nvml_err("read the PCI id", gpu))?;
    let pci_bus_id = normalize_bus_id(&pci.bus_id);
    let memory = device
        .memory_info()
        .map_err(nvml_err("read the memory size", gpu))?;
    Ok(GpuInfo {
        index,
        uuid: device.uuid().map_err(nvml_err("read the UUID", gpu))?,
        model: device.name().map_err(nvml_err("read the name", gpu))?,
        memory_mb: memory.total / (1024 * 1024),
        numa_node: sysfs_numa_node(Path::new("/sys/bus/pci/devices"), &pci_bus_id),
        pci_bus_id,
        healthy: true,
        fault: None,
        mig: None,
    })
}

/// NVML's bus id form: `DDDDDDDD:BB:DD.F`, upper-case hex, 8-digit domain.
/// (NVML already answers so; normalizing lets ids from different calls, such
/// as an NVLink's far end, compare equal.)
pub fn normalize_bus_id(id: &str) -> String {
    let id = id.trim().trim_end_matches('\0').to_ascii_uppercase();
    match id.split_once(':') {
        Some((domain, rest)) if rest.len() == "BB:DD.F".len() => {
            match u32::from_str_radix(domain, 16) {
                Ok(domain) => format!("{domain:08X}:{rest}"),
                Err(_) => id,
            }
        }
        _ => id,
    }
}

/// The NUMA node sysfs gives a PCI device (`-1` there means none).
fn sysfs_numa_node(pci_devices: &Path, bus_id: &str) -> Option<u32> {
    let path = pci_devices.join(sysfs_bus_id(bus_id)?).join("numa_node");
    let text = std::fs::read_to_string(path).ok()?;
    text.trim().parse::<u32>().ok()
}

/// sysfs names PCI devices `dddd:bb:dd.f`: lower case, domain of at least 4 digits.
fn sysfs_bus_id(bus_id: &str) -> Option<String> {
    let (domain, rest) = bus_id.split_once(':')?;
    let domain = u32::from_str_radix(domain, 16).ok()?;
    Some(format!("{domain:04x}:{}", rest.to_ascii_lowercase()))
}

fn links(devices: &[Device<'_>], gpus: &[GpuInfo]) -> Vec<Vec<GpuLink>> {
    let n = devices.len();
    let mut direct = vec![vec![0u8; n]; n];
    let mut fabric = vec![0u8; n];
    for (i, device) in devices.iter().enumerate() {
        for link in 0..MAX_NVLINKS {
            let link = device.link_wrapper_for(link);
            if !matches!(link.is_active(), Ok(true)) {
                continue;
            }
            let peer = link.remote_pci_info().ok().and_then(|far| {
                let far = normalize_bus_id(&far.bus_id);
                gpus.iter().position(|g| g.pci_bus_id == far)
            });
            match peer {
                Some(j) if j != i => direct[i][j] = direct[i][j].saturating_add(1),
                _ => fabric[i] = fabric[i].saturating_add(1),
            }
        }
    }
    (0..n)
        .map(|i| {
            (0..n)
                .map(|j| {
                    if i == j {
                        GpuLink::SelfLink
                    } else if direct[i][j] > 0 {
                        GpuLink::NvLink(direct[i][j])
                    } else if fabric[i] > 0 && fabric[j] > 0 {
                        GpuLink::NvLink(fabric[i].min(fabric[j]))
                    } else {
                        pcie_link(&devices[i], &devices[j], &gpus[i], &gpus[j])
                    }
                })
                .collect()
        })
        .collect()
}

fn pcie_link(a: &Device<'_>, b: &Device<'_>, ga: &GpuInfo, gb: &GpuInfo) -> GpuLink {
    // `topology_common_ancestor` takes its second device by value; handles are
    // plain pointers, so fetching it again is cheap and always the same GPU.
    let level = b
        .nvml()
        .device_by_index(gb.index)
        .and_then(|b| a.topology_common_ancestor(b));
    match level {
        Ok(level) => topology_link(level),
        Err(e) => {
            tracing::debug!(
                "NVML topology between GPU {} and {} unknown ({e}); guessing from NUMA",
                ga.index,
                gb.index
            );
            if ga.numa_node.is_some() && ga.numa_node == gb.numa_node {
                GpuLink::SameNuma
            } else {
                GpuLink::CrossNuma
            }
        }
    }
}

fn topology_link(level: TopologyLevel) -> GpuLink {
    match level {
        // Internal: two GPUs on one board (K80-style), closer than any switch.
        TopologyLevel::Internal | TopologyLevel::Single => GpuLink::PcieSwitch,
        TopologyLevel::Multiple => GpuLink::PcieMultiSwitch,
        TopologyLevel::HostBridge => GpuLink::HostBridge,
        TopologyLevel::Node => GpuLink::SameNuma,
        TopologyLevel::System => GpuLink::CrossNuma,
    }
}

/// Registers XID and double-bit ECC events, one set per GPU. GPUs that cannot
/// are named in one warning; the agent runs on without their events.
fn register_events(
    nvml: &'static Nvml,
    devices: &[Device<'static>],
) -> Vec<(u32, EventSet<'static>)> {
    let wanted = EventTypes::CRITICAL_XID_ERROR | EventTypes::DOUBLE_BIT_ECC_ERROR;
    let mut sets = Vec::new();
    let mut refused = Vec::new();
    for (index, device) in devices.iter().enumerate() {
        let index = index as u32;
        let supported = match device.supported_event_types() {
            Ok(types) => types & wanted,
            Err(e) => {
                refused.push(format!("GPU {index}: {e}"));
                continue;
            }
        };
        if supported.is_empty() {
            refused.push(format!("GPU {index}: no XID or ECC events"));
            continue;
        }
        let registered = nvml
            .create_event_set()
            .map_err(|e| e.to_string())
            .and_then(|set| {
                device
                    .register_events(supported, set)
                    .map_err(|e| e.to_string())
            });
        match registered {
            Ok(set) => sets.push((index, set)),
            Err(e) => refused.push(format!("GPU {index}: {e}")),
        }
    }
    if !sets.is_empty() {
        tracing::info!(
            gpus = sets.len(),
            "NVML health events registered (XID, double-bit ECC)"
        );
    }
    if !refused.is_empty() {
        tracing::warn!(
            "NVML health events are not supported ({}); XID and ECC errors there go unseen, \
             lost GPUs and page retirement are still checked",
            refused.join("; ")
        );
    }
    sets
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn opening_without_a_driver_names_the_cause() {
        let explicit = super::super::open_backend(&super::super::GpuConfig::Nvml, "n1");
        match NvmlBackend::open() {
            Err(e @ GpuError::NvmlUnavailable { .. }) => {
                let msg = e.to_string();
                assert!(msg.contains("NVML"), "{msg}");
                assert!(msg.contains("libnvidia-ml"), "the library is named: {msg}");
                assert!(msg.contains("gpus = \"none\""), "the fix is named: {msg}");
                let explicit = explicit
                    .err()
                    .expect("gpus = \"nvml\" without a driver fails");
                assert_eq!(explicit.to_string(), msg);
            }
            Err(e) => panic!("unexpected NVML failure: {e}"),
            // A machine with a driver: the backend must describe its GPUs.
            Ok(b) => {
                assert_eq!(explicit.expect("nvml opens twice").kind(), "nvml");
                let gpus = b.gpus().unwrap();
                let links = b.links().unwrap();
                assert_eq!(links.len(), gpus.len());
                assert!(links.iter().all(|row| row.len() == gpus.len()));
                assert!(gpus.iter().all(|g| g.uuid.starts_with("GPU-")));
                let _ = b.poll_events();
            }
        }
    }

    #[test]
    fn bus_ids_normalize() {
        assert_eq!(normalize_bus_id("00000000:18:00.0"), "00000000:18:00.0");
        assert_eq!(normalize_bus_id("0000:9a:00.0"), "00000000:9A:00.0");
        assert_eq!(normalize_bus_id("00000000:ab:00.0\0"), "00000000:AB:00.0");
        assert_eq!(
            sysfs_bus_id("00000000:AB:00.0").as_deref(),
            Some("0000:ab:00.0")
        );
        assert_eq!(
            sysfs_bus_id("00010000:01:00.0").as_deref(),
            Some("10000:01:00.0")
        );
        assert_eq!(sysfs_bus_id("garbage"), None);
    }

    #[test]
    fn numa_node_from_sysfs() {
        let dir = tempfile::tempdir().unwrap();
        for (dev, numa) in [("0000:18:00.0", "1\n"), ("0000:19:00.0", "-1\n")] {
            std::fs::create_dir_all(dir.path().join(dev)).unwrap();
            std::fs::write(dir.path().join(dev).join("numa_node"), numa).unwrap();
        }
        assert_eq!(sysfs_numa_node(dir.path(), "00000000:18:00.0"), Some(1));
        assert_eq!(sysfs_numa_node(dir.path(), "00000000:19:00.0"), None);
        assert_eq!(sysfs_numa_node(dir.path(), "00000000:20:00.0"), None);
    }

    #[test]
    fn topology_levels_map_closest_first() {
        let levels = [
            TopologyLevel::Single,
            TopologyLevel::Multiple,
            TopologyLevel::HostBridge,
            TopologyLevel::Node,
            TopologyLevel::System,
        ];
        let distances: Vec<u32> = levels
            .iter()
            .map(|l| topology_link(*l).distance())
            .collect();
        assert!(distances.windows(2).all(|w| w[0] < w[1]), "{distances:?}");
    }
}
