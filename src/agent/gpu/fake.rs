//! Simulated GPUs for `gpuq dev`, tests and simulation.
//!
//! They look like the real thing to everything above the backend: UUIDs in
//! NVML's shape and PCI bus ids in ascending index order (CUDA's
//! `PCI_BUS_ID` order), both derived from a SHA-256 of (node name, index) so
//! a node keeps its identities across restarts and two nodes never share them;
//! GPUs spread over NUMA nodes in index order (8 GPUs on 2 nodes: 0-3, 4-7);
//! and one of three wirings (`FakeNvLink`).
//!
//! Faults come in two ways: `FakeGpus::inject` from code, and the fault file
//! from outside the process. When the file exists, `poll_events` takes it
//! (renames it away first, so lines written meanwhile land in a new file),
//! reads one event per line and deletes it:
//!
//! ```text
//! xid 3 79      # XID 79 on GPU 3
//! ecc 2 1       # one double-bit ECC error on GPU 2
//! retire 1      # pages pending retirement on GPU 1
//! offbus 5      # GPU 5 fell off the bus
//! ```
//!
//! Blank lines and `#` comments are skipped; a bad line is logged and skipped.

use std::path::{Path, PathBuf};
use std::sync::Mutex;

use sha2::{Digest, Sha256};

use super::{FakeGpuConfig, FakeNvLink, FaultLedger, GpuBackend, GpuError, GpuEvent, GpuTelemetry};
use crate::model::{GpuInfo, GpuLink};

/// The most fake GPUs one node may have (PCI bus ids need room to stay ordered).
const MAX_GPUS: u32 = 64;
/// NVLinks between an NVLink-bridged pair (what H100 NVL reports: NV12).
const PAIR_LINKS: u8 = 12;
/// NVLinks per GPU through NVSwitch on a DGX H100 (NV18).
const NVSWITCH_LINKS: u8 = 18;

/// Simulated GPUs with injectable faults.
#[derive(Debug)]
pub struct FakeGpus {
    gpus: Vec<GpuInfo>,
    links: Vec<Vec<GpuLink>>,
    injected: Mutex<Vec<GpuEvent>>,
    fault_file: Option<PathBuf>,
    ledger: FaultLedger,
    /// Utilisation per GPU index (`simulate_load`); absent: idle.
    load: Mutex<std::collections::BTreeMap<u32, u8>>,
    /// The MIG layout of each GPU (`None`: whole), from the config or
    /// `set_mig`.
    mig: Mutex<Vec<Option<crate::model::MigLayout>>>,
    /// Slots every whole GPU is time-shared into (`shared` in the config).
    shared: Option<u8>,
}

impl FakeGpus {
    /// Builds the GPUs `cfg` describes for the node `node_name`.
    pub fn new(node_name: &str, cfg: &FakeGpuConfig) -> Result<Self, GpuError> {
        validate(cfg)?;
        let mig = cfg.mig_layouts().map_err(GpuError::InvalidFake)?;
        let gpus: Vec<GpuInfo> = (0..cfg.count)
            .map(|index| fake_gpu(node_name, index, cfg))
            .collect();
        let links = links(&gpus, cfg.nvlink);
        Ok(FakeGpus {
            gpus,
            links,
            injected: Mutex::new(Vec::new()),
            fault_file: cfg.fault_file.clone(),
            ledger: FaultLedger::default(),
            load: Mutex::default(),
            mig: Mutex::new(mig),
            shared: cfg.shared,
        })
    }

    /// Queues `event` for the next `poll_events`, which also applies it.
    pub fn inject(&self, event: GpuEvent) -> Result<(), GpuError> {
        self.check_gpu(event.gpu())?;
        self.injected
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(event);
        Ok(())
    }

    fn check_gpu(&self, gpu: u32) -> Result<(), GpuError> {
        let count = self.gpus.len() as u32;
        if gpu < count {
            Ok(())
        } else {
            Err(GpuError::NoSuchGpu { gpu, count })
        }
    }

    /// Takes the fault file if it exists and returns its valid events.
    fn take_fault_file(&self, path: &Path) -> Vec<GpuEvent> {
        let mut taken = path.as_os_str().to_owned();
        taken.push(".taken");
        let taken = PathBuf::from(taken);
        match std::fs::rename(path, &taken) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Vec::new(),
            Err(e) => {
                tracing::warn!("cannot take fault file {}: {e}", path.display());
                return Vec::new();
            }
        }
        let text = std::fs::read_to_string(&taken);
        if let Err(e) = std::fs::remove_file(&taken) {
            tracing::warn!("cannot remove fault file {}: {e}", taken.display());
        }
        let text = match text {
            Ok(text) => text,
            Err(e) => {
                tracing::warn!("cannot read fault file {}: {e}", path.display());
                return Vec::new();
            }
        };
        let mut events = Vec::new();
        for (n, line) in text.lines().enumerate() {
            let parsed = parse_fault_line(line).and_then(|event| match event {
                Some(ev) => self
                    .check_gpu(ev.gpu())
                    .map(|()| Some(ev))
                    .map_err(|e| e.to_string()),
                None => Ok(None),
            });
            match parsed {
                Ok(Some(event)) => events.push(event),
                Ok(None) => {}
                Err(why) => tracing::warn!(
                    "fault file {} line {}: {why}; skipped",
                    path.display(),
                    n + 1
                ),
            }
        }
        events
    }
}

impl GpuBackend for FakeGpus {
    fn kind(&self) -> &'static str {
        "fake"
    }

    fn gpus(&self) -> Result<Vec<GpuInfo>, GpuError> {
        let mut gpus = self.gpus.clone();
        self.ledger.apply(&mut gpus);
        let mig = self.mig.lock().unwrap_or_else(|e| e.into_inner());
        let gpus = if mig.iter().any(Option::is_some) {
            super::mig::expand(&gpus, &mig)
        } else {
            gpus
        };
        Ok(match self.shared {
            Some(n) => crate::model::share::expand(&gpus, n),
            None => gpus,
        })
    }

    fn links(&self) -> Result<Vec<Vec<GpuLink>>, GpuError> {
        Ok(self.links.clone())
    }

    fn poll_events(&self) -> Vec<GpuEvent> {
        let mut events =
            std::mem::take(&mut *self.injected.lock().unwrap_or_else(|e| e.into_inner()));
        if let Some(path) = &self.fault_file {
            events.extend(self.take_fault_file(path));
        }
        for event in &events {
            self.ledger.observe(event);
        }
        events
    }

    /// Readings that follow the simulated load as an H100's would: memory
    /// filled to 90% of the load's share, 32 C idle to 77 C busy, 70 W idle
    /// to 700 W busy. A GPU that fell off the bus reads nothing.
    fn telemetry(&self) -> Vec<GpuTelemetry> {
        let load = self.load.lock().unwrap_or_else(|e| e.into_inner());
        let mut out: Vec<GpuTelemetry> = self
            .gpus()
            .unwrap_or_default()
            .iter()
            .map(|g| {
                let pct = f64::from(load.get(&g.index).copied().unwrap_or(0).min(100));
                GpuTelemetry {
                    index: g.index,
                    utilization_pct: pct,
                    memory_used_mb: (g.memory_mb as f64 * 0.9 * pct / 100.0) as u64,
                    memory_total_mb: g.memory_mb,
                    temperature_c: Some(32.0 + 0.45 * pct),
                    power_w: Some(70.0 + 6.3 * pct),
                    ..Default::default()
                }
            })
            .collect();
        self.ledger.count_into(&mut out);
        out
    }

    fn simulate_load(&self, load: &std::collections::BTreeMap<u32, u8>) {
        *self.load.lock().unwrap_or_else(|e| e.into_inner()) = load.clone();
    }

    /// Sets every GPU's layout; fails, changing nothing, while a file
    /// `mig-fail` lies beside the fault file (a test's simulated NVML error).
    fn set_mig(&self, layout: Option<&crate::model::MigLayout>) -> Result<(), GpuError> {
        if let Some(dir) = self.fault_file.as_deref().and_then(Path::parent) {
            if dir.join("mig-fail").exists() {
                return Err(GpuError::Mig(
                    "simulated NVML failure (mig-fail file present)".into(),
                ));
            }
        }
        let mut mig = self.mig.lock().unwrap_or_else(|e| e.into_inner());
        *mig = vec![layout.cloned(); self.gpus.len()];
        Ok(())
    }
}

/// Parses one fault-file line; `Ok(None)` for blanks and comments.
pub fn parse_fault_line(line: &str) -> Result<Option<GpuEvent>, String> {
    let line = line.split('#').next().unwrap_or("").trim();
    let words: Vec<&str> = line.split_whitespace().collect();
    let Some((&verb, args)) = words.split_first() else {
        return Ok(None);
    };
    let num = |i: usize, what: &str| -> Result<u64, String> {
        let word = args
            .get(i)
            .ok_or_else(|| format!("`{verb}` needs {what}"))?;
        word.parse::<u64>()
            .map_err(|_| format!("`{word}` is not a number ({what})"))
    };
    let gpu = |i: usize| -> Result<u32, String> {
        let n = num(i, "a GPU index")?;
        u32::try_from(n).map_err(|_| format!("GPU index {n} is too large"))
    };
    let arity = match verb {
        "xid" | "ecc" => 2,
        "retire" | "offbus" => 1,
        _ => {
            return Err(format!(
            "unknown fault `{verb}` (expected xid GPU XID, ecc GPU COUNT, retire GPU, offbus GPU)"
        ))
        }
    };
    if args.len() > arity {
        return Err(format!(
            "`{verb}` takes {arity} number(s), got {}",
            args.len()
        ));
    }
    let event = match verb {
        "xid" => GpuEvent::Xid {
            gpu: gpu(0)?,
            xid: num(1, "an XID")?,
        },
        "ecc" => GpuEvent::EccDoubleBit {
            gpu: gpu(0)?,
            count: num(1, "an error count")?,
        },
        "retire" => GpuEvent::PendingPageRetirement { gpu: gpu(0)? },
        _ => GpuEvent::FellOffBus { gpu: gpu(0)? },
    };
    Ok(Some(event))
}

fn validate(cfg: &FakeGpuConfig) -> Result<(), GpuError> {
    let bad = |why: String| Err(GpuError::InvalidFake(why));
    if cfg.count > MAX_GPUS {
        return bad(format!("count = {} is more than {MAX_GPUS}", cfg.count));
    }
    if cfg.numa_nodes == 0 || cfg.numa_nodes > 64 {
        return bad(format!("numa_nodes = {} must be 1 to 64", cfg.numa_nodes));
    }
    if cfg.memory_mb == 0 {
        return bad("memory_mb must be more than 0".to_string());
    }
    if cfg.model.trim().is_empty() {
        return bad("model must not be empty".to_string());
    }
    if let Some(n) = cfg.shared {
        if !(1..=crate::model::share::MAX_SLOTS).contains(&n) {
            return bad(format!(
                "shared = {n} must be 1 to {}",
                crate::model::share::MAX_SLOTS
            ));
        }
        if cfg.mig.is_some() || !cfg.mig_per_gpu.is_empty() {
            return bad(
                "shared and mig are both set: a MIG-partitioned GPU is not time-shared; use one"
                    .into(),
            );
        }
    }
    Ok(())
}

/// The identity seed of GPU `index` on `node`.
fn seed(node: &str, index: u32) -> [u8; 32] {
    let mut h = Sha256::new();
    h.update(b"gpuq fake gpu\0");
    h.update(node.as_bytes());
    h.update(b"\0");
    h.update(index.to_le_bytes());
    h.finalize().into()
}

fn fake_gpu(node: &str, index: u32, cfg: &FakeGpuConfig) -> GpuInfo {
    let seed = seed(node, index);
    let hex = hex::encode(&seed[..16]);
    let uuid = format!(
        "GPU-{}-{}-{}-{}-{}",
        &hex[0..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..32]
    );
    // Each GPU owns a window of bus numbers, so bus ids ascend with the index
    // as NVML's enumeration order requires; the seed picks a spot inside it.
    let window = 256 / cfg.count.max(1);
    let bus = index * window + 1 + u32::from(seed[16]) % (window - 1);
    GpuInfo {
        index,
        uuid,
        model: cfg.model.clone(),
        memory_mb: cfg.memory_mb,
        pci_bus_id: format!("00000000:{bus:02X}:00.0"),
        numa_node: Some(numa_of(index, cfg.count, cfg.numa_nodes)),
        healthy: true,
        fault: None,
        mig: None,
    }
}

/// GPUs fill NUMA nodes in index order, an equal share each.
fn numa_of(index: u32, count: u32, numa_nodes: u32) -> u32 {
    (u64::from(index) * u64::from(numa_nodes) / u64::from(count.max(1))) as u32
}

fn links(gpus: &[GpuInfo], wiring: FakeNvLink) -> Vec<Vec<GpuLink>> {
    let pcie = |a: &GpuInfo, b: &GpuInfo| {
        if a.numa_node != b.numa_node {
            GpuLink::CrossNuma
        } else if a.index / 2 == b.index / 2 {
            // A pair shares a PCIe switch (where "pairs" puts its bridge).
            GpuLink::PcieSwitch
        } else {
            GpuLink::HostBridge
        }
    };
    gpus.iter()
        .map(|a| {
            gpus.iter()
                .map(|b| {
                    if a.index == b.index {
                        return GpuLink::SelfLink;
                    }
                    match wiring {
                        FakeNvLink::NvSwitch => GpuLink::NvLink(NVSWITCH_LINKS),
                        FakeNvLink::Pairs if a.index / 2 == b.index / 2 => {
                            GpuLink::NvLink(PAIR_LINKS)
                        }
                        FakeNvLink::Pairs | FakeNvLink::None => pcie(a, b),
                    }
                })
                .collect()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent::gpu::is_critical;

    fn fake(node: &str, nvlink: FakeNvLink) -> FakeGpus {
        let cfg = FakeGpuConfig {
            nvlink,
            ..FakeGpuConfig::default()
        };
        FakeGpus::new(node, &cfg).unwrap()
    }

    fn uuids(g: &FakeGpus) -> Vec<String> {
        g.gpus().unwrap().into_iter().map(|g| g.uuid).collect()
    }

    #[test]
    fn identities_are_deterministic_per_node() {
        let a = fake("node001", FakeNvLink::NvSwitch);
        let again = fake("node001", FakeNvLink::Pairs);
        let b = fake("node002", FakeNvLink::NvSwitch);
        assert_eq!(uuids(&a), uuids(&again));
        assert_eq!(a.gpus().unwrap(), again.gpus().unwrap());
        for (x, y) in uuids(&a).iter().zip(uuids(&b)) {
            assert_ne!(*x, y);
        }
        let mut all = uuids(&a);
        all.extend(uuids(&b));
        all.sort();
        all.dedup();
        assert_eq!(all.len(), 16, "UUIDs repeat");
    }

    #[test]
    fn identities_look_like_nvml() {
        let gpus = fake("node001", FakeNvLink::NvSwitch).gpus().unwrap();
        assert_eq!(gpus.len(), 8);
        for g in &gpus {
            let parts: Vec<&str> = g.uuid.strip_prefix("GPU-").unwrap().split('-').collect();
            let lens: Vec<usize> = parts.iter().map(|p| p.len()).collect();
            assert_eq!(lens, [8, 4, 4, 4, 12], "{}", g.uuid);
            assert!(parts
                .iter()
                .all(|p| p.chars().all(|c| c.is_ascii_hexdigit())));
            assert_eq!(
                g.pci_bus_id.len(),
                "00000000:18:00.0".len(),
                "{}",
                g.pci_bus_id
            );
            assert!(g.pci_bus_id.starts_with("00000000:") && g.pci_bus_id.ends_with(":00.0"));
            assert!(g.healthy && g.fault.is_none());
            assert_eq!(g.memory_mb, 81559);
        }
        let buses: Vec<&String> = gpus.iter().map(|g| &g.pci_bus_id).collect();
        let mut sorted = buses.clone();
        sorted.sort();
        sorted.dedup();
        assert_eq!(buses, sorted, "bus ids must ascend with the index");
        let numa: Vec<Option<u32>> = gpus.iter().map(|g| g.numa_node).collect();
        let want: Vec<Option<u32>> = [0, 0, 0, 0, 1, 1, 1, 1].into_iter().map(Some).collect();
        assert_eq!(numa, want);
    }

    #[test]
    fn nvswitch_links_every_pair() {
        let links = fake("n", FakeNvLink::NvSwitch).links().unwrap();
        assert_eq!(links.len(), 8);
        for (i, row) in links.iter().enumerate() {
            assert_eq!(row.len(), 8);
            for (j, link) in row.iter().enumerate() {
                let want = if i == j {
                    GpuLink::SelfLink
                } else {
                    GpuLink::NvLink(18)
                };
                assert_eq!(*link, want, "{i}-{j}");
            }
        }
    }

    #[test]
    fn pairs_and_pcie_shapes() {
        let links = fake("n", FakeNvLink::Pairs).links().unwrap();
        assert_eq!(links[0][1], GpuLink::NvLink(PAIR_LINKS));
        assert_eq!(links[6][7], GpuLink::NvLink(PAIR_LINKS));
        assert_eq!(links[0][2], GpuLink::HostBridge);
        assert_eq!(links[0][4], GpuLink::CrossNuma);
        assert_eq!(links[3][4], GpuLink::CrossNuma);
        assert!(links[0][1].distance() < links[0][2].distance());
        assert!(links[0][2].distance() < links[0][4].distance());
        for (i, row) in links.iter().enumerate() {
            for (j, link) in row.iter().enumerate() {
                assert_eq!(*link, links[j][i], "asymmetric {i}-{j}");
            }
        }
        let pcie = fake("n", FakeNvLink::None).links().unwrap();
        assert_eq!(pcie[0][1], GpuLink::PcieSwitch);
        assert_eq!(pcie[0][2], GpuLink::HostBridge);
        assert_eq!(pcie[0][4], GpuLink::CrossNuma);
        assert!(pcie
            .iter()
            .flatten()
            .all(|l| !matches!(l, GpuLink::NvLink(_))));
    }

    #[test]
    fn odd_shapes_are_valid() {
        let cfg = FakeGpuConfig {
            count: 3,
            numa_nodes: 1,
            nvlink: FakeNvLink::Pairs,
            ..Default::default()
        };
        let g = FakeGpus::new("n", &cfg).unwrap();
        let links = g.links().unwrap();
        assert_eq!(links[2][0], GpuLink::HostBridge);
        assert!(g.gpus().unwrap().iter().all(|g| g.numa_node == Some(0)));
        let none = FakeGpus::new(
            "n",
            &FakeGpuConfig {
                count: 0,
                ..Default::default()
            },
        )
        .unwrap();
        assert!(none.gpus().unwrap().is_empty() && none.links().unwrap().is_empty());
        let max = FakeGpus::new(
            "n",
            &FakeGpuConfig {
                count: MAX_GPUS,
                ..Default::default()
            },
        )
        .unwrap();
        let buses: Vec<String> = max
            .gpus()
            .unwrap()
            .into_iter()
            .map(|g| g.pci_bus_id)
            .collect();
        assert!(buses.windows(2).all(|w| w[0] < w[1]));
    }

    #[test]
    fn bad_fake_config_is_refused() {
        for cfg in [
            FakeGpuConfig {
                count: 65,
                ..Default::default()
            },
            FakeGpuConfig {
                numa_nodes: 0,
                ..Default::default()
            },
            FakeGpuConfig {
                memory_mb: 0,
                ..Default::default()
            },
        ] {
            let err = FakeGpus::new("n", &cfg).unwrap_err();
            assert!(
                err.to_string().starts_with("invalid gpus.fake setting"),
                "{err}"
            );
        }
    }

    #[test]
    fn injected_critical_xid_marks_the_gpu_unhealthy() {
        let g = fake("n", FakeNvLink::NvSwitch);
        g.inject(GpuEvent::Xid { gpu: 3, xid: 79 }).unwrap();
        g.inject(GpuEvent::Xid { gpu: 2, xid: 13 }).unwrap();
        assert!(
            g.gpus().unwrap().iter().all(|g| g.healthy),
            "applied before poll"
        );
        let events = g.poll_events();
        assert_eq!(
            events,
            [
                GpuEvent::Xid { gpu: 3, xid: 79 },
                GpuEvent::Xid { gpu: 2, xid: 13 }
            ]
        );
        assert!(g.poll_events().is_empty(), "events are delivered once");
        let gpus = g.gpus().unwrap();
        assert!(!gpus[3].healthy);
        assert_eq!(
            gpus[3].fault.as_deref(),
            Some("XID 79 (GPU fell off the bus)")
        );
        assert!(
            gpus[2].healthy && gpus[2].fault.is_none(),
            "XID 13 is the application's"
        );
        assert_eq!(gpus.iter().filter(|g| g.healthy).count(), 7);
        let err = g.inject(GpuEvent::FellOffBus { gpu: 8 }).unwrap_err();
        assert_eq!(err.to_string(), "there is no GPU 8 on this node (it has 8)");
    }

    #[test]
    fn fault_file_is_read_once_and_removed() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("faults");
        let cfg = FakeGpuConfig {
            fault_file: Some(path.clone()),
            ..Default::default()
        };
        let g = FakeGpus::new("n", &cfg).unwrap();
        assert!(g.poll_events().is_empty(), "no file, no events");
        std::fs::write(
            &path,
            "xid 3 79\n# a comment\n\nxid 0 13\necc 2 1\nretire 1\noffbus 5\nbogus 1\nxid 9 79\n",
        )
        .unwrap();
        let events = g.poll_events();
        assert_eq!(
            events,
            [
                GpuEvent::Xid { gpu: 3, xid: 79 },
                GpuEvent::Xid { gpu: 0, xid: 13 },
                GpuEvent::EccDoubleBit { gpu: 2, count: 1 },
                GpuEvent::PendingPageRetirement { gpu: 1 },
                GpuEvent::FellOffBus { gpu: 5 },
            ]
        );
        assert!(!path.exists(), "the fault file is consumed");
        assert_eq!(
            std::fs::read_dir(dir.path()).unwrap().count(),
            0,
            "nothing left behind"
        );
        assert!(g.poll_events().is_empty());
        let healthy: Vec<bool> = g.gpus().unwrap().iter().map(|g| g.healthy).collect();
        assert_eq!(
            healthy,
            [true, false, false, false, true, false, true, true]
        );
        assert!(events.iter().filter(|e| e.gpu() != 0).all(is_critical));
    }

    #[test]
    fn fault_lines() {
        assert_eq!(
            parse_fault_line("xid 3 79"),
            Ok(Some(GpuEvent::Xid { gpu: 3, xid: 79 }))
        );
        assert_eq!(
            parse_fault_line("  offbus 5  # gone"),
            Ok(Some(GpuEvent::FellOffBus { gpu: 5 }))
        );
        assert_eq!(parse_fault_line("   "), Ok(None));
        for bad in [
            "xid 3",
            "xid three 79",
            "retire",
            "retire 1 2",
            "melt 0",
            "ecc -1 1",
        ] {
            assert!(parse_fault_line(bad).is_err(), "{bad}");
        }
        assert!(parse_fault_line("melt 0")
            .unwrap_err()
            .contains("unknown fault `melt`"));
    }
}
