//! A simulated fleet: N compute agents in one process, each a real agent to
//! the servers. Each has its own identity (joined with a token; the CSR is
//! made here and only it leaves), its own QUIC endpoint and connection to the
//! leader, its heartbeats, a fake 8-GPU DGX-like inventory with a topology
//! label, and a [`SimRunner`] in place of processes. Only the runner and
//! the missing local socket tell it from `gpuq agent`.
//!
//! Costs and limits, per agent: one UDP socket (one fd and one ephemeral
//! port), one QUIC connection with TLS state, two tokio tasks and a few timers
//! (reconcile tick, 1 s heartbeat, 2 s QUIC keep-alive). The process raises
//! its open-file limit to the hard limit and refuses a count it cannot hold;
//! the host's ephemeral UDP port range (`net.ipv4.ip_local_port_range`, about
//! 28,000 by default) bounds all agents on one host together. Joins run
//! concurrently with a bound ([`FleetOptions::join_concurrency`]): each is a
//! handshake, a signature and a committed log entry on the server.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use futures::StreamExt;
use tokio::sync::watch;

use super::runner::SimRunner;
use crate::agent::compute::ComputeAgent;
use crate::agent::gpu::fake::FakeGpus;
use crate::agent::host::{self, HostConfig, HostResources};
use crate::agent::runner::TaskRunner;
use crate::config::FakeGpuConfig;
use crate::model::{NodeInventory, NumaNode, Role};
use crate::net::endpoint::{unspecified_for, Endpoint};
use crate::net::{JoinError, JoinToken, NodeIdentity};

/// Logical CPUs a simulated node declares (a DGX H100: 2 x 56 cores, SMT).
pub const SIM_CPUS: u32 = 224;
/// Memory a simulated node declares, MiB (a DGX H100: 2 TiB).
pub const SIM_MEMORY_MB: u64 = 2 * 1024 * 1024;
/// How long a join is retried while the server cannot be reached.
const JOIN_PATIENCE: Duration = Duration::from_secs(300);
/// Open files the process needs besides one per agent.
const FD_HEADROOM: u64 = 256;

/// What `gpuq sim agents` starts.
#[derive(Clone, Debug)]
pub struct FleetOptions {
    /// How many agents.
    pub count: u32,
    /// The server to join through and connect to.
    pub join: SocketAddr,
    /// An agent join token (`gpuq token create --role agent`).
    pub token: String,
    pub gpus_per_node: u32,
    /// Nodes under one leaf switch (16 or 32 are typical).
    pub nodes_per_leaf: u32,
    /// Leaf switches under one spine.
    pub leaves_per_spine: u32,
    /// Tasks run their declared duration divided by this.
    pub compression: f64,
    /// Node names are the prefix and a zero-padded number.
    pub name_prefix: String,
    /// The number of the first node (to run several sim processes side by side).
    pub first_index: u32,
    /// Where identities are kept (`DIR/NAME/tls`) so a restart needs no new
    /// join; `None` keeps them in memory only.
    pub data_dir: Option<PathBuf>,
    /// Joins in flight at once.
    pub join_concurrency: usize,
    /// How often each agent re-examines its tasks.
    pub reconcile_every: Duration,
}

impl Default for FleetOptions {
    fn default() -> Self {
        FleetOptions {
            count: 1,
            join: SocketAddr::from(([127, 0, 0, 1], 7420)),
            token: String::new(),
            gpus_per_node: 8,
            nodes_per_leaf: 32,
            leaves_per_spine: 8,
            compression: 1.0,
            name_prefix: "sim".into(),
            first_index: 1,
            data_dir: None,
            join_concurrency: 32,
            reconcile_every: Duration::from_millis(200),
        }
    }
}

impl FleetOptions {
    /// Checks the options before anything starts; each error names the flag.
    pub fn validate(&self) -> anyhow::Result<()> {
        if self.count == 0 {
            bail!("--count must be at least 1");
        }
        if self.gpus_per_node > 64 {
            bail!(
                "--gpus-per-node {} is out of range: use 0 to 64",
                self.gpus_per_node
            );
        }
        if self.nodes_per_leaf == 0 || self.leaves_per_spine == 0 {
            bail!("--topology-leaves and --leaves-per-spine must be at least 1");
        }
        if !(self.compression.is_finite() && self.compression > 0.0) {
            bail!(
                "--compression {} must be a positive number (1 = real time)",
                self.compression
            );
        }
        if self.join_concurrency == 0 {
            bail!("--join-concurrency must be at least 1");
        }
        if self.reconcile_every.is_zero() {
            bail!("--reconcile-ms must be at least 1");
        }
        let last = u64::from(self.first_index) + u64::from(self.count) - 1;
        let name = self.node_name(u32::try_from(last).context("--first plus --count overflows")?);
        crate::net::pki::validate_node_name(&name)
            .with_context(|| format!("--name-prefix {:?} makes bad names", self.name_prefix))?;
        Ok(())
    }

    /// Digits of node numbers: enough for the last, at least 4.
    fn width(&self) -> usize {
        let last = u64::from(self.first_index) + u64::from(self.count.max(1)) - 1;
        last.to_string().len().max(4)
    }

    /// The name of node number `n` (`sim0001`).
    pub fn node_name(&self, n: u32) -> String {
        format!("{}{n:0w$}", self.name_prefix, w = self.width())
    }

    /// The topology label of node number `n`: `spine{s}/leaf{l}`, leaves
    /// numbered across the fleet, both from 1.
    pub fn topology(&self, n: u32) -> String {
        let i = n.saturating_sub(1);
        let leaf = i / self.nodes_per_leaf;
        let spine = leaf / self.leaves_per_spine;
        format!("spine{}/leaf{}", spine + 1, leaf + 1)
    }
}

/// A DGX-like node: `gpus` fake H100s on NVSwitch, 224 CPUs on 2 NUMA nodes,
/// 2 TiB, whatever this machine has.
pub fn sim_inventory(name: &str, gpus: u32, topology: &str) -> anyhow::Result<NodeInventory> {
    let fake = FakeGpus::new(
        name,
        &FakeGpuConfig {
            count: gpus,
            ..FakeGpuConfig::default()
        },
    )?;
    let half = SIM_CPUS / 2;
    let resources = HostResources {
        cpus: (0..SIM_CPUS).collect(),
        numa: (0..2)
            .map(|id| NumaNode {
                id,
                cpus: (id * half..(id + 1) * half).collect(),
                memory_mb: SIM_MEMORY_MB / 2,
            })
            .collect(),
        memory_mb: SIM_MEMORY_MB,
    };
    let cfg = HostConfig {
        topology: topology.to_string(),
        ..HostConfig::default()
    };
    Ok(host::assemble(name, &fake, &cfg, resources)?)
}

/// A started fleet.
pub struct Fleet {
    pub agents: Vec<Arc<ComputeAgent>>,
    pub runners: Vec<Arc<SimRunner>>,
    pub tasks: Vec<tokio::task::JoinHandle<anyhow::Result<()>>>,
    /// How long joining every agent took.
    pub joined_in: Duration,
}

/// Makes large allocations come from `mmap`, always. Each quinn endpoint
/// allocates a zeroed 3 MiB receive buffer (1472 B x 64 GRO segments x 32
/// datagrams) of which a busy agent touches a few pages. glibc's adaptive
/// threshold soon serves such blocks from the heap, where calloc must write
/// every byte: measured, 1,000 agents held 1.9 GB resident that way. Fresh
/// `mmap` pages stay untouched, and so unresident, until used.
fn keep_big_buffers_lazy() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // SAFETY: mallopt only sets allocator parameters; it is called
        // before the agents allocate their endpoints.
        let ok = unsafe { libc::mallopt(libc::M_MMAP_THRESHOLD, 256 << 10) };
        if ok != 1 {
            tracing::debug!("mallopt(M_MMAP_THRESHOLD) refused");
        }
    }
}

/// Raises the open-file limit as far as allowed and checks `need` fits.
fn ensure_open_files(need: u64) -> anyhow::Result<()> {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE).context("cannot read RLIMIT_NOFILE")?;
    if soft < hard {
        setrlimit(Resource::RLIMIT_NOFILE, hard, hard).context("cannot raise RLIMIT_NOFILE")?;
    }
    if need > hard {
        bail!(
            "{need} agents' sockets need more open files than this process may have ({hard}); \
             raise the hard limit (ulimit -Hn, or LimitNOFILE= under systemd) or lower --count"
        );
    }
    Ok(())
}

/// Joins one agent: loads the identity from the data dir, or joins. A
/// refusal is retried a few times (a just-bootstrapped server refuses joins
/// until its cluster record is committed, yet a bad token must fail within
/// seconds); an unreachable or overloaded server is retried for
/// [`JOIN_PATIENCE`], as a real agent would keep trying; a wrong cluster is
/// final.
async fn identity_for(
    opts: &FleetOptions,
    token: &JoinToken,
    name: &str,
) -> anyhow::Result<NodeIdentity> {
    let tls = opts.data_dir.as_ref().map(|d| d.join(name).join("tls"));
    if let Some(tls) = tls.as_ref().filter(|t| t.join("node.crt").exists()) {
        return NodeIdentity::load(tls)
            .with_context(|| format!("cannot read the identity in {}", tls.display()));
    }
    let identity = join_with_retries(opts, token, name).await?;
    if let Some(tls) = &tls {
        crate::owner_only::ensure_dir(tls, crate::owner_only::DirMode::Private)?;
        identity.save(tls)?;
    }
    Ok(identity)
}

async fn join_with_retries(
    opts: &FleetOptions,
    token: &JoinToken,
    name: &str,
) -> anyhow::Result<NodeIdentity> {
    let started = Instant::now();
    let mut backoff = Duration::from_millis(100);
    let mut refusals = 0;
    loop {
        let err = match crate::net::join(opts.join, token, Role::Agent, name).await {
            Ok(id) => return Ok(id),
            Err(e) => e,
        };
        let give_up = match &err {
            JoinError::WrongCluster { .. } => true,
            JoinError::Refused { .. } => {
                refusals += 1;
                refusals >= 6
            }
            _ => started.elapsed() > JOIN_PATIENCE,
        };
        if give_up {
            return Err(err).with_context(|| {
                format!(
                    "node {name} could not join (for {:.0} s)",
                    started.elapsed().as_secs_f64()
                )
            });
        }
        tracing::debug!(node = name, "join failed, retrying: {err}");
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(Duration::from_secs(5));
    }
}

/// Joins and starts every agent; returns once all are started (connected
/// or still connecting). They stop when `shutdown` turns true.
pub async fn start_fleet(
    opts: &FleetOptions,
    shutdown: watch::Receiver<bool>,
) -> anyhow::Result<Fleet> {
    opts.validate()?;
    keep_big_buffers_lazy();
    ensure_open_files(u64::from(opts.count) + opts.join_concurrency as u64 + FD_HEADROOM)?;
    let token = JoinToken::parse(&opts.token).context("the --token is not usable")?;
    let t0 = Instant::now();
    let numbers = opts.first_index..opts.first_index + opts.count;
    let mut joined = futures::stream::iter(numbers)
        .map(|n| {
            let token = &token;
            async move {
                let name = opts.node_name(n);
                let inventory = sim_inventory(&name, opts.gpus_per_node, &opts.topology(n))?;
                let identity = identity_for(opts, token, &name).await?;
                let endpoint = Endpoint::client(&identity, unspecified_for(opts.join))
                    .with_context(|| format!("node {name}: cannot open a QUIC endpoint"))?;
                anyhow::Ok((inventory, endpoint))
            }
        })
        .buffer_unordered(opts.join_concurrency);

    let mut fleet = Fleet {
        agents: Vec::new(),
        runners: Vec::new(),
        tasks: Vec::new(),
        joined_in: Duration::ZERO,
    };
    let step = (opts.count / 10).max(1);
    while let Some(next) = joined.next().await {
        let (inventory, endpoint) = next?;
        let runner = Arc::new(SimRunner::new(opts.compression).map_err(anyhow::Error::msg)?);
        let agent = Arc::new(ComputeAgent {
            endpoint: Arc::new(endpoint),
            servers: Arc::new(crate::agent::servers::ServerList::fixed(vec![opts.join])),
            inventory,
            advertise: None,
            runner: runner.clone() as Arc<dyn TaskRunner>,
            reconcile_every: opts.reconcile_every,
            gpus: None,
            health: None,
            preflight: false,
            holders: Default::default(),
        });
        fleet
            .tasks
            .push(tokio::spawn(agent.clone().run(shutdown.clone())));
        fleet.agents.push(agent);
        fleet.runners.push(runner);
        let done = fleet.agents.len() as u32;
        if done % step == 0 || done == opts.count {
            tracing::info!(
                joined = done,
                of = opts.count,
                secs = t0.elapsed().as_secs_f64(),
                "simulated agents started"
            );
        }
    }
    fleet.joined_in = t0.elapsed();
    Ok(fleet)
}

/// `gpuq sim agents`: runs the fleet until SIGINT/SIGTERM.
pub async fn run_agents(opts: FleetOptions) -> anyhow::Result<()> {
    let (tx, rx) = watch::channel(false);
    let fleet = tokio::select! {
        f = start_fleet(&opts, rx) => f?,
        _ = crate::shutdown_signal() => return Ok(()),
    };
    println!(
        "gpuq sim: {} agents ({}..{}) x {} fake GPUs started in {:.1} s, compression {}",
        opts.count,
        opts.node_name(opts.first_index),
        opts.node_name(opts.first_index + opts.count - 1),
        opts.gpus_per_node,
        fleet.joined_in.as_secs_f64(),
        opts.compression
    );
    crate::shutdown_signal().await;
    let _ = tx.send(true);
    let stop = futures::future::join_all(fleet.tasks);
    let _ = tokio::time::timeout(Duration::from_secs(5), stop).await;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_padded_and_topology_groups_leaves_under_spines() {
        let opts = FleetOptions {
            count: 1000,
            nodes_per_leaf: 32,
            leaves_per_spine: 4,
            ..FleetOptions::default()
        };
        assert_eq!(opts.node_name(1), "sim0001");
        assert_eq!(opts.node_name(1000), "sim1000");
        assert_eq!(opts.topology(1), "spine1/leaf1");
        assert_eq!(opts.topology(32), "spine1/leaf1");
        assert_eq!(opts.topology(33), "spine1/leaf2");
        assert_eq!(opts.topology(128), "spine1/leaf4");
        assert_eq!(opts.topology(129), "spine2/leaf5");
        let wide = FleetOptions {
            count: 10_000,
            first_index: 5,
            ..FleetOptions::default()
        };
        assert_eq!(wide.node_name(5), "sim00005");
        opts.validate().unwrap();
    }

    #[test]
    fn bad_options_name_the_flag() {
        let bad = |o: FleetOptions| o.validate().unwrap_err().to_string();
        let base = FleetOptions::default();
        assert!(bad(FleetOptions {
            count: 0,
            ..base.clone()
        })
        .contains("--count"));
        assert!(bad(FleetOptions {
            compression: 0.0,
            ..base.clone()
        })
        .contains("--compression"));
        assert!(bad(FleetOptions {
            gpus_per_node: 65,
            ..base.clone()
        })
        .contains("--gpus-per-node"));
        assert!(bad(FleetOptions {
            name_prefix: "bad name/".into(),
            ..base
        })
        .contains("--name-prefix"));
    }

    #[test]
    fn a_sim_node_looks_like_a_dgx() {
        let inv = sim_inventory("sim0001", 8, "spine1/leaf1").unwrap();
        assert_eq!(inv.gpus.len(), 8);
        assert_eq!(inv.gpu_links.len(), 8);
        assert_eq!(inv.cpus, SIM_CPUS);
        assert_eq!(inv.memory_mb, SIM_MEMORY_MB);
        assert_eq!(inv.numa.len(), 2);
        assert_eq!(inv.topology, "spine1/leaf1");
        let other = sim_inventory("sim0002", 8, "spine1/leaf1").unwrap();
        assert_ne!(inv.gpus[0].uuid, other.gpus[0].uuid);
        assert!(sim_inventory("cpu1", 0, "").unwrap().gpus.is_empty());
    }
}
