//! The node's CPUs, NUMA nodes and memory, read from /sys and /proc, and the
//! `NodeInventory` an agent registers with: those plus its GPUs.
//!
//! What is reserved for the system (`reserved_cpus`, `reserved_memory_mb`) is
//! taken out here, once, so everything above sees only what jobs may use.
//! Reserved CPUs come one at a time from each NUMA node in turn, lowest ids
//! first: the system's own daemons and interrupts favour low CPUs, and taking
//! them evenly keeps the NUMA nodes (and so the GPUs beside them) balanced.
//!
//! NUMA nodes without online CPUs (memory-only nodes such as CXL memory) are
//! left out: nothing can be pinned to them. A machine without
//! /sys/devices/system/node looks like one NUMA node holding everything.

use std::io;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::gpu::{GpuBackend, GpuError};
use crate::model::{NodeInventory, NumaNode};

/// Host settings of an agent.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct HostConfig {
    /// CPUs kept for the system and the agent; jobs never get them.
    pub reserved_cpus: u32,
    /// Memory in MiB kept for the system and the agent.
    pub reserved_memory_mb: u64,
    /// The node's place in the network, e.g. `spine1/leaf3` (empty: unknown).
    pub topology: String,
    /// Features jobs can ask for with `--constraint`, e.g. `["ib", "nvme"]`.
    pub features: Vec<String>,
}

/// CPUs, NUMA nodes and memory of a host.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HostResources {
    /// Online logical CPU ids, ascending.
    pub cpus: Vec<u32>,
    /// NUMA nodes with their online CPUs and memory, by id.
    pub numa: Vec<NumaNode>,
    /// Total memory in MiB.
    pub memory_mb: u64,
}

/// Why the host could not be described.
#[derive(Debug, thiserror::Error)]
pub enum HostError {
    #[error("cannot read {}: {source}", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("cannot understand {}: {reason}", path.display())]
    Parse { path: PathBuf, reason: String },
    #[error(
        "reserved_cpus = {reserved} leaves no CPU for jobs: this node has {online} online; \
         lower it"
    )]
    ReservedCpus { reserved: u32, online: usize },
    #[error(
        "reserved_memory_mb = {reserved} leaves no memory for jobs: this node has {total} MiB; \
         lower it"
    )]
    ReservedMemory { reserved: u64, total: u64 },
}

/// Why a node inventory could not be assembled.
#[derive(Debug, thiserror::Error)]
pub enum InventoryError {
    #[error(transparent)]
    Host(#[from] HostError),
    #[error("listing GPUs: {0}")]
    Gpu(#[from] GpuError),
    #[error("the {kind} GPU backend gave links that are not {gpus}x{gpus} (a bug in the backend)")]
    LinkShape { kind: &'static str, gpus: usize },
}

/// This node's inventory: its GPUs from `backend`, its host from /sys and
/// /proc less what `host` reserves, and the topology and features `host` names.
pub fn inventory(
    name: &str,
    backend: &dyn GpuBackend,
    host: &HostConfig,
) -> Result<NodeInventory, InventoryError> {
    let resources = HostResources::read()?;
    assemble(name, backend, host, resources)
}

/// `inventory` with the host already read (tests, simulation).
pub fn assemble(
    name: &str,
    backend: &dyn GpuBackend,
    host: &HostConfig,
    resources: HostResources,
) -> Result<NodeInventory, InventoryError> {
    let gpus = backend.gpus()?;
    let gpu_links = backend.links()?;
    // Links are between physical GPUs: a partitioned GPU's MIG instances
    // are entries of their own but share their GPU's row.
    let physical = if gpus.iter().any(|g| g.mig.is_some()) {
        let mut p: Vec<u32> = gpus.iter().map(|g| g.physical_index()).collect();
        p.sort_unstable();
        p.dedup();
        p.len()
    } else {
        gpus.len()
    };
    if gpu_links.len() != physical || gpu_links.iter().any(|row| row.len() != physical) {
        return Err(InventoryError::LinkShape {
            kind: backend.kind(),
            gpus: physical,
        });
    }
    let usable = resources.reserve(host.reserved_cpus, host.reserved_memory_mb)?;
    Ok(NodeInventory {
        name: name.to_string(),
        gpus,
        gpu_links,
        cpus: usable.cpus.len() as u32,
        memory_mb: usable.memory_mb,
        numa: usable.numa,
        topology: host.topology.clone(),
        features: host.features.clone(),
    })
}

impl HostResources {
    /// Reads this machine.
    pub fn read() -> Result<Self, HostError> {
        Self::read_from(Path::new("/"))
    }

    /// Reads the machine whose /sys and /proc lie under `root`.
    pub fn read_from(root: &Path) -> Result<Self, HostError> {
        let online_path = root.join("sys/devices/system/cpu/online");
        let cpus = match read_optional(&online_path)? {
            Some(text) => parse_cpulist(&text).map_err(|reason| parse_err(&online_path, reason))?,
            // No sysfs (some containers): count what the process may use.
            None => {
                let n = std::thread::available_parallelism().map_or(1, |n| n.get());
                (0..n as u32).collect()
            }
        };
        if cpus.is_empty() {
            return Err(parse_err(&online_path, "no CPU is online".to_string()));
        }
        let meminfo_path = root.join("proc/meminfo");
        let meminfo = read(&meminfo_path)?;
        let memory_mb = meminfo_total_kb(&meminfo, "MemTotal:")
            .ok_or_else(|| parse_err(&meminfo_path, "no MemTotal line".to_string()))?
            / 1024;
        let mut numa = read_numa(&root.join("sys/devices/system/node"), &cpus)?;
        if numa.is_empty() {
            numa.push(NumaNode {
                id: 0,
                cpus: cpus.clone(),
                memory_mb,
            });
        }
        Ok(HostResources {
            cpus,
            numa,
            memory_mb,
        })
    }

    /// What is left for jobs after reserving `cpus` CPUs and `memory_mb` MiB.
    /// NUMA nodes keep their physical memory; the reservation applies to the total.
    pub fn reserve(mut self, cpus: u32, memory_mb: u64) -> Result<Self, HostError> {
        // Count what the NUMA nodes hold: a CPU must be in one to be given out.
        let online: usize = self.numa.iter().map(|n| n.cpus.len()).sum();
        if cpus as usize >= online {
            return Err(HostError::ReservedCpus {
                reserved: cpus,
                online,
            });
        }
        if memory_mb >= self.memory_mb {
            return Err(HostError::ReservedMemory {
                reserved: memory_mb,
                total: self.memory_mb,
            });
        }
        let mut taken = 0;
        let nodes = self.numa.len();
        let mut node = 0;
        while taken < cpus {
            // Some node still has a CPU, since fewer are reserved than online.
            let numa = &mut self.numa[node % nodes];
            if !numa.cpus.is_empty() {
                numa.cpus.remove(0);
                taken += 1;
            }
            node += 1;
        }
        let mut left: Vec<u32> = self
            .numa
            .iter()
            .flat_map(|n| n.cpus.iter().copied())
            .collect();
        left.sort_unstable();
        self.cpus = left;
        self.memory_mb -= memory_mb;
        Ok(self)
    }
}

/// The NUMA nodes under `dir` (`node0`, `node1`, ...) with CPUs in `online`.
fn read_numa(dir: &Path, online: &[u32]) -> Result<Vec<NumaNode>, HostError> {
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(source) => {
            return Err(HostError::Read {
                path: dir.to_path_buf(),
                source,
            })
        }
    };
    let mut numa = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|source| HostError::Read {
            path: dir.to_path_buf(),
            source,
        })?;
        let name = entry.file_name();
        let Some(id) = name
            .to_str()
            .and_then(|n| n.strip_prefix("node"))
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        let cpulist_path = entry.path().join("cpulist");
        let mut cpus = parse_cpulist(&read(&cpulist_path)?)
            .map_err(|reason| parse_err(&cpulist_path, reason))?;
        cpus.retain(|c| online.binary_search(c).is_ok());
        if cpus.is_empty() {
            continue;
        }
        let meminfo_path = entry.path().join("meminfo");
        let memory_mb = meminfo_total_kb(&read(&meminfo_path)?, "MemTotal:")
            .ok_or_else(|| parse_err(&meminfo_path, "no MemTotal line".to_string()))?
            / 1024;
        numa.push(NumaNode {
            id,
            cpus,
            memory_mb,
        });
    }
    numa.sort_by_key(|n| n.id);
    Ok(numa)
}

/// The kB figure of the line whose key is `key`, in /proc/meminfo
/// (`MemTotal: 123 kB`) or a node's meminfo (`Node 0 MemTotal: 123 kB`).
fn meminfo_total_kb(text: &str, key: &str) -> Option<u64> {
    text.lines().find_map(|line| {
        let mut words = line.split_whitespace().skip_while(|w| *w != key);
        words.next()?;
        words.next()?.parse().ok()
    })
}

/// Parses the kernel's cpulist syntax (`0-3,8,10-11`; empty for none) into
/// ascending, distinct CPU ids.
pub fn parse_cpulist(text: &str) -> Result<Vec<u32>, String> {
    /// Larger ids are a misread file, not a CPU (Linux's NR_CPUS tops out at 8192).
    const MAX_CPU: u32 = 65_535;
    let mut cpus = Vec::new();
    let text = text.trim();
    if text.is_empty() {
        return Ok(cpus);
    }
    let id = |s: &str| -> Result<u32, String> {
        let n: u32 = s
            .trim()
            .parse()
            .map_err(|_| format!("`{s}` is not a CPU id (expected a list like 0-3,8,10-11)"))?;
        if n > MAX_CPU {
            return Err(format!("CPU id {n} is larger than {MAX_CPU}"));
        }
        Ok(n)
    };
    for part in text.split(',') {
        match part.split_once('-') {
            Some((lo, hi)) => {
                let (lo, hi) = (id(lo)?, id(hi)?);
                if lo > hi {
                    return Err(format!("range `{}` runs backwards", part.trim()));
                }
                cpus.extend(lo..=hi);
            }
            None => cpus.push(id(part)?),
        }
    }
    cpus.sort_unstable();
    cpus.dedup();
    Ok(cpus)
}

pub use crate::model::format_cpulist;

fn read(path: &Path) -> Result<String, HostError> {
    std::fs::read_to_string(path).map_err(|source| HostError::Read {
        path: path.to_path_buf(),
        source,
    })
}

fn read_optional(path: &Path) -> Result<Option<String>, HostError> {
    match std::fs::read_to_string(path) {
        Ok(text) => Ok(Some(text)),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(HostError::Read {
            path: path.to_path_buf(),
            source,
        }),
    }
}

fn parse_err(path: &Path, reason: String) -> HostError {
    HostError::Parse {
        path: path.to_path_buf(),
        reason,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent::gpu::{FakeGpuConfig, FakeGpus, FakeNvLink, NoGpus};

    /// A /sys and /proc tree: `nodes` is (cpulist, MemTotal kB) per NUMA node.
    fn fake_root(online: Option<&str>, nodes: &[(&str, u64)], mem_kb: u64) -> tempfile::TempDir {
        let root = tempfile::tempdir().unwrap();
        let put = |rel: &str, text: String| {
            let path = root.path().join(rel);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, text).unwrap();
        };
        if let Some(online) = online {
            put("sys/devices/system/cpu/online", format!("{online}\n"));
        }
        put(
            "proc/meminfo",
            format!("MemTotal:       {mem_kb} kB\nMemFree:        1234 kB\n"),
        );
        for (id, (cpulist, kb)) in nodes.iter().enumerate() {
            put(
                &format!("sys/devices/system/node/node{id}/cpulist"),
                format!("{cpulist}\n"),
            );
            put(
                &format!("sys/devices/system/node/node{id}/meminfo"),
                format!("Node {id} MemTotal:       {kb} kB\nNode {id} MemFree:  1 kB\n"),
            );
        }
        if !nodes.is_empty() {
            put("sys/devices/system/node/online", "0-1\n".to_string());
        }
        root
    }

    #[test]
    fn cpulists() {
        assert_eq!(
            parse_cpulist("0-3,8,10-11\n").unwrap(),
            [0, 1, 2, 3, 8, 10, 11]
        );
        assert_eq!(parse_cpulist("5").unwrap(), [5]);
        assert_eq!(parse_cpulist("").unwrap(), Vec::<u32>::new());
        assert_eq!(parse_cpulist("\n").unwrap(), Vec::<u32>::new());
        assert_eq!(parse_cpulist("4-5,0-1,1").unwrap(), [0, 1, 4, 5]);
        for bad in ["3-1", "a", "0-", "-3", "1,,2", "0-7:2/4", "99999999"] {
            assert!(parse_cpulist(bad).is_err(), "{bad}");
        }
        assert!(parse_cpulist("3-1").unwrap_err().contains("backwards"));
        assert_eq!(format_cpulist(&[11, 0, 1, 2, 3, 8, 10]), "0-3,8,10-11");
        assert_eq!(format_cpulist(&[]), "");
        for text in ["0", "0-63", "0-3,8,10-11", "1,3,5"] {
            assert_eq!(format_cpulist(&parse_cpulist(text).unwrap()), text);
        }
    }

    #[test]
    fn reads_numa_nodes() {
        let root = fake_root(Some("0-7"), &[("0-3", 4 << 20), ("4-7", 4 << 20)], 8 << 20);
        let host = HostResources::read_from(root.path()).unwrap();
        assert_eq!(host.cpus, (0..8).collect::<Vec<_>>());
        assert_eq!(host.memory_mb, 8192);
        assert_eq!(
            host.numa,
            [
                NumaNode {
                    id: 0,
                    cpus: vec![0, 1, 2, 3],
                    memory_mb: 4096
                },
                NumaNode {
                    id: 1,
                    cpus: vec![4, 5, 6, 7],
                    memory_mb: 4096
                },
            ]
        );
    }

    #[test]
    fn offline_cpus_and_cpuless_nodes_are_left_out() {
        let root = fake_root(
            Some("0-2,4-7"),
            &[("0-3", 1 << 20), ("", 1 << 20), ("4-7", 1 << 20)],
            3 << 20,
        );
        let host = HostResources::read_from(root.path()).unwrap();
        assert_eq!(host.cpus, [0, 1, 2, 4, 5, 6, 7]);
        let ids: Vec<u32> = host.numa.iter().map(|n| n.id).collect();
        assert_eq!(ids, [0, 2]);
        assert_eq!(host.numa[0].cpus, [0, 1, 2]);
    }

    #[test]
    fn without_numa_one_node_holds_everything() {
        let root = fake_root(Some("0-3"), &[], 2 << 20);
        let host = HostResources::read_from(root.path()).unwrap();
        assert_eq!(
            host.numa,
            [NumaNode {
                id: 0,
                cpus: vec![0, 1, 2, 3],
                memory_mb: 2048
            }]
        );
        let bare = fake_root(None, &[], 2 << 20);
        let host = HostResources::read_from(bare.path()).unwrap();
        assert!(!host.cpus.is_empty());
        assert_eq!(host.numa[0].cpus, host.cpus);
    }

    #[test]
    fn unreadable_host_names_the_file() {
        let root = fake_root(Some("0-3"), &[], 2 << 20);
        std::fs::write(root.path().join("proc/meminfo"), "Nothing: 1 kB\n").unwrap();
        let err = HostResources::read_from(root.path()).unwrap_err();
        assert!(err.to_string().contains("proc/meminfo"), "{err}");
        let root = fake_root(Some("zero-3"), &[], 2 << 20);
        let err = HostResources::read_from(root.path()).unwrap_err();
        assert!(
            err.to_string().contains("cpu/online") && err.to_string().contains("zero"),
            "{err}"
        );
    }

    #[test]
    fn reservations_come_evenly_from_numa_nodes() {
        let root = fake_root(Some("0-7"), &[("0-3", 4 << 20), ("4-7", 4 << 20)], 8 << 20);
        let host = HostResources::read_from(root.path())
            .unwrap()
            .reserve(3, 1024)
            .unwrap();
        assert_eq!(host.cpus, [2, 3, 5, 6, 7]);
        assert_eq!(host.numa[0].cpus, [2, 3]);
        assert_eq!(host.numa[1].cpus, [5, 6, 7]);
        assert_eq!(host.memory_mb, 7168);
        let host = HostResources::read_from(root.path()).unwrap();
        let err = host.clone().reserve(8, 0).unwrap_err();
        assert!(
            err.to_string()
                .starts_with("reserved_cpus = 8 leaves no CPU"),
            "{err}"
        );
        let err = host.reserve(0, 8192).unwrap_err();
        assert!(
            err.to_string().starts_with("reserved_memory_mb = 8192"),
            "{err}"
        );
        // An uneven machine: the small node runs dry and the rest comes from the big one.
        let uneven = fake_root(Some("0-5"), &[("0", 1 << 20), ("1-5", 1 << 20)], 2 << 20);
        let host = HostResources::read_from(uneven.path())
            .unwrap()
            .reserve(3, 0)
            .unwrap();
        assert_eq!(host.cpus, [3, 4, 5]);
        assert!(host.numa[0].cpus.is_empty());
    }

    #[test]
    fn inventory_of_this_machine() {
        let fake = FakeGpus::new(
            "node001",
            &FakeGpuConfig {
                nvlink: FakeNvLink::Pairs,
                ..Default::default()
            },
        )
        .unwrap();
        let cfg = HostConfig {
            topology: "spine1/leaf3".into(),
            features: vec!["ib".into()],
            ..HostConfig::default()
        };
        let inv = inventory("node001", &fake, &cfg).unwrap();
        assert_eq!(inv.name, "node001");
        assert!(inv.cpus > 0 && inv.memory_mb > 0);
        assert!(!inv.numa.is_empty());
        assert_eq!(
            inv.numa.iter().map(|n| n.cpus.len() as u32).sum::<u32>(),
            inv.cpus
        );
        assert_eq!(inv.gpus.len(), 8);
        assert_eq!(inv.gpu_links.len(), 8);
        assert_eq!(inv.gpu_model(), Some("NVIDIA H100 80GB HBM3"));
        assert_eq!(inv.topology, "spine1/leaf3");
        assert_eq!(inv.features, ["ib"]);

        let bare = inventory("login1", &NoGpus, &HostConfig::default()).unwrap();
        assert!(bare.gpus.is_empty() && bare.gpu_links.is_empty());
        assert_eq!(bare.cpus, inv.cpus);
        let too_much = HostConfig {
            reserved_cpus: 100_000,
            ..HostConfig::default()
        };
        assert!(matches!(
            inventory("n", &NoGpus, &too_much),
            Err(InventoryError::Host(HostError::ReservedCpus { .. }))
        ));
    }

    #[test]
    fn errors_cross_threads() {
        // The binary's edge turns these into anyhow errors, which needs this.
        fn send_sync<T: Send + Sync + 'static>() {}
        send_sync::<InventoryError>();
        send_sync::<GpuError>();
    }

    #[test]
    fn host_config_keys() {
        let cfg: HostConfig = toml::from_str(
            "reserved_cpus = 2\nreserved_memory_mb = 4096\ntopology = \"s1/l2\"\nfeatures = [\"ib\", \"nvme\"]\n",
        )
        .unwrap();
        assert_eq!(cfg.reserved_cpus, 2);
        assert_eq!(cfg.features, ["ib", "nvme"]);
        assert_eq!(
            toml::from_str::<HostConfig>("").unwrap(),
            HostConfig::default()
        );
        let err = toml::from_str::<HostConfig>("reserved_cpu = 2").unwrap_err();
        assert!(err.to_string().contains("reserved_cpu"), "{err}");
    }
}
