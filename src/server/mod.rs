//! The server role: a Raft member. Wires the redb-backed Raft node, the QUIC
//! endpoint (raft, api and join protocols), the local unix socket, and the
//! leader's duties. Only the leader writes; followers forward client requests.
//!
//! Failover, and why it takes what it takes. openraft 0.9 sets the timing: a
//! follower stands for election its leader's lease (election_timeout_max_ms)
//! plus its own election timeout (drawn once per process from [min, max))
//! after the last heartbeat; a voter refuses votes for the lease after it
//! last heard a leader; a candidate refused by a voter with a longer log
//! waits 2 x max more at its next election. So a failover takes about max +
//! [min, max), longer when the survivor that could win had lost an election
//! while lagging. openraft keeps a partitioned leader in office until it
//! hears a higher term, so `Api::leader_elsewhere` also counts a leader that
//! no majority acknowledged for an election timeout as not leading: it stops
//! scheduling and liveness, closes its agent sessions with a redirect, and
//! refuses writes with "not leader". A write waits at most 10 s for its
//! commit and is then answered "outcome unknown"; the proposer drops writes
//! whose caller gave up. Servers cache one QUIC connection per Raft peer and
//! count a peer silent for 2 x max as gone (`Endpoint::with_dial_idle_timeout`):
//! a peer SIGKILLed and restarted is a new process whose stateless resets do
//! not match the old connection, and with QUIC's 10 s default that connection
//! swallowed votes for 10 s. Forwarded requests use the same idle timeout,
//! and a follower ends a forward as soon as it sees another leader or none.
//! When the Raft core stops on a storage error (a full disk), the process
//! exits with it: openraft never resumes a stopped core, and systemd's
//! `Restart=on-failure` brings back a member that catches up.

mod acct;
mod agents;
mod api;
mod archive;
mod autoscale;
mod backup;
mod boot;
mod datadir;
mod desired;
mod join;
mod liveness;
mod members;
mod metrics;
mod policy_api;
mod propose;
mod scheduler;
mod show;
mod site;
mod transport;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use tokio::sync::watch;

use crate::clock::now_ms;
use crate::config::ServerConfig;
use crate::net::endpoint::{Endpoint, Service, ALPN_AGENT, ALPN_API, ALPN_JOIN, ALPN_RAFT};
use crate::net::DEFAULT_MAX_FRAME;
use crate::net::{local, rpc};
use crate::raft::{self, RaftNode, ServerNode};
use crate::state::Command;

pub use api::Api;
pub use backup::restore;
pub use boot::BootstrapPlan;
pub use datadir::DataDir;

/// How this server process joins the control plane.
#[derive(Clone, Debug, Default)]
pub struct ServerOptions {
    /// Create the cluster (CA, first voter) if the data dir is empty.
    pub bootstrap: bool,
    /// Join the cluster through this server with this (server) token if the
    /// data dir is empty; ignored once it holds a cluster.
    pub join: Option<(SocketAddr, String)>,
    /// Form a cluster with these peers, all started at once.
    pub bootstrap_plan: Option<BootstrapPlan>,
}

/// A running server, for in-process use (`gpuq dev`, tests).
pub struct RunningServer {
    pub api: Arc<Api>,
    pub raft: RaftNode,
    pub quic_addr: SocketAddr,
    pub ca_fingerprint: String,
    /// The HTTP port's base URL (`http://127.0.0.1:7480`).
    pub http_url: String,
}

fn raft_config(cfg: &ServerConfig) -> anyhow::Result<openraft::Config> {
    let c = openraft::Config {
        cluster_name: cfg.cluster_name.clone(),
        heartbeat_interval: cfg.raft.heartbeat_ms,
        election_timeout_min: cfg.raft.election_timeout_min_ms,
        election_timeout_max: cfg.raft.election_timeout_max_ms,
        max_payload_entries: cfg.raft.max_payload_entries,
        // Snapshots go in chunks of openraft's 3 MiB (well inside the 16 MiB
        // frame cap); the last chunk's answer waits until the receiver has
        // installed the whole state, which takes seconds at 100,000 jobs.
        // openraft's 200 ms would resend the snapshot again and again.
        install_snapshot_timeout: 30_000,
        snapshot_policy: openraft::SnapshotPolicy::LogsSinceLast(cfg.raft.snapshot_after_logs),
        max_in_snapshot_log_to_keep: cfg.raft.logs_kept_after_snapshot,
        // Purge in batches small against the snapshot interval, so the log
        // on disk stays near snapshot_after_logs + logs_kept_after_snapshot.
        purge_batch_size: (cfg.raft.snapshot_after_logs / 4).clamp(1, 256),
        ..Default::default()
    };
    Ok(c.validate()?)
}

/// Tells glibc's allocator to keep what one scheduling pass frees for the
/// next. A pass at 10,000 nodes and 100,000 pending jobs allocates and frees
/// tens of MiB of short-lived vectors. By default glibc maps blocks above an
/// adaptive threshold afresh and trims the heap's free top above twice that,
/// so each pass took its memory back from the kernel page by page: 15% of
/// the pass in page faults (`perf`, `benches/scale.rs`). Blocks below 32 MiB
/// now come from the heap, and up to 128 MiB of free heap stays mapped.
/// Called as a server starts, and by the scale bench, which measures the
/// leader's pass.
pub fn keep_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // SAFETY: mallopt only sets allocator parameters (under the
        // allocator's own lock); no memory is touched.
        let ok = unsafe {
            libc::mallopt(libc::M_MMAP_THRESHOLD, 32 << 20) == 1
                && libc::mallopt(libc::M_TRIM_THRESHOLD, 128 << 20) == 1
        };
        if !ok {
            tracing::warn!(
                "mallopt refused the server's allocator settings: scheduling passes \
                 will spend more time in page faults"
            );
        }
    }
}

/// `cfg` with the address it advertises settled: configured, or the host's
/// one address (said in the log) when nothing names one.
fn with_advertise(mut cfg: ServerConfig) -> anyhow::Result<ServerConfig> {
    let (addr, picked) = cfg.advertise_among(&host_addresses())?;
    if picked {
        tracing::info!(
            "advertising {addr}: the host's one non-loopback address (set server.advertise \
             or --advertise to choose another)"
        );
    }
    cfg.advertise = Some(addr);
    Ok(cfg)
}

/// The host's addresses other servers and agents could dial: up
/// interfaces' addresses that are not loopback, link-local or unspecified.
fn host_addresses() -> Vec<std::net::IpAddr> {
    let Ok(addrs) = nix::ifaddrs::getifaddrs() else {
        return Vec::new();
    };
    let mut ips: Vec<std::net::IpAddr> = addrs
        .filter(|a| a.flags.contains(nix::net::if_::InterfaceFlags::IFF_UP))
        .filter_map(|a| {
            let sa = a.address?;
            if let Some(v4) = sa.as_sockaddr_in() {
                Some(std::net::IpAddr::V4(v4.ip()))
            } else {
                sa.as_sockaddr_in6().map(|v6| std::net::IpAddr::V6(v6.ip()))
            }
        })
        .filter(|ip| match ip {
            std::net::IpAddr::V4(v4) => {
                !v4.is_loopback() && !v4.is_link_local() && !v4.is_unspecified()
            }
            std::net::IpAddr::V6(v6) => {
                !v6.is_loopback() && !v6.is_unspecified() && (v6.segments()[0] & 0xffc0) != 0xfe80
            }
        })
        .collect();
    ips.sort();
    ips.dedup();
    ips
}

/// Starts the server and returns once it serves; the tasks it spawned stop
/// when `shutdown` turns true.
///
/// The steps, in order: get a certificate if this server has none yet
/// (bootstrap plan or `--join`), open the QUIC endpoint and the Raft store,
/// put the cluster identity into the log if this server just created the
/// cluster, then serve QUIC, the leader's duties and the local socket, and
/// finally ask to become a voter if this server joined.
pub async fn start(
    cfg: ServerConfig,
    opts: ServerOptions,
    shutdown: watch::Receiver<bool>,
) -> anyhow::Result<RunningServer> {
    let cfg = with_advertise(cfg)?;
    keep_freed_memory();
    let dir = DataDir::open(&cfg.data_dir)?;
    // A member's store must be there: redb would make a new, empty one, and
    // with --bootstrap that would be a new cluster. (A joined server that is
    // not yet a member creates its store on its first start.)
    let member = dir.has_cluster() && dir.joining().is_none();
    let mut opts = opts;
    let boot_window = follow_bootstrap_plan(&cfg, &mut opts, &dir).await?;
    join_if_asked(&cfg, &opts, &dir).await?;
    let boot = dir.prepare(&cfg, opts.bootstrap)?;
    let identity = dir.identity()?;
    let advertise = cfg.advertise_addr()?;

    let http = open_http(&cfg, &identity)?;
    let endpoint = open_endpoint(&cfg, &identity)?;
    let quic_addr = endpoint.local_addr()?;
    let endpoint = Arc::new(endpoint);

    let contacts = Arc::new(transport::PeerContacts::default());
    let network = raft::network::Network::new(Arc::new(transport::QuicRaftNetwork::new(
        endpoint.clone(),
        contacts.clone(),
    )));
    if member {
        raft::expect_store(&dir.db_path())?;
    }
    check_free_space(&cfg.data_dir)?;
    let node = raft::open(
        &dir.private_store()?,
        boot.node_id,
        raft_config(&cfg)?,
        network,
    )
    .await
    .context("cannot open the Raft store")?;

    if opts.bootstrap && !node.raft.is_initialized().await? {
        let me = ServerNode {
            name: cfg.node_name.clone(),
            addr: advertise.to_string(),
        };
        raft::initialize_single(&node.raft, boot.node_id, me)
            .await
            .context("cannot initialise the Raft group")?;
    }

    let api = Arc::new(
        Api::new(
            cfg.clone(),
            node.clone(),
            endpoint.clone(),
            identity.clone(),
        )
        .with_contacts(contacts),
    );

    if let Some(ca) = boot.pending_ca {
        init_cluster(&cfg, &node, &ca).await?;
    }

    serve_quic(
        endpoint.clone(),
        api.clone(),
        node.raft.clone(),
        boot_window,
        shutdown.clone(),
    );
    spawn_leader_duties(&cfg, &api, &shutdown);
    serve_local_socket(&cfg, &api, &shutdown)?;
    let http_url = http.url();
    http.serve(
        Arc::new(site::ServerSite { api: api.clone() }),
        shutdown.clone(),
    );

    // A joined server that is not yet a member asks for it (again after a
    // restart), now that it serves Raft: the leader replicates to it while
    // the request is in flight.
    if let Some(via) = dir.joining() {
        members::request_membership(&endpoint, via, boot.node_id, &cfg.node_name, advertise)
            .await?;
        dir.joined();
        tracing::info!(node = %cfg.node_name, "this server is a voter now");
    }

    let ca_fingerprint = identity.ca_fingerprint()?;
    tracing::info!(
        node = %cfg.node_name,
        quic = %quic_addr,
        socket = %cfg.socket.display(),
        http = %http_url,
        ca = %ca_fingerprint,
        "server ready"
    );
    Ok(RunningServer {
        api,
        raft: node,
        quic_addr,
        ca_fingerprint,
        http_url,
    })
}

/// `--bootstrap-expect`: the seed server bootstraps (and opens the boot
/// window the others join through); any other server joins the seed, once.
async fn follow_bootstrap_plan(
    cfg: &ServerConfig,
    opts: &mut ServerOptions,
    dir: &DataDir,
) -> anyhow::Result<Option<Arc<join::BootWindow>>> {
    let Some(plan) = &opts.bootstrap_plan else {
        return Ok(None);
    };
    if opts.bootstrap || opts.join.is_some() {
        anyhow::bail!("--bootstrap-expect excludes --bootstrap and --join");
    }
    let me = cfg.advertise_addr()?;
    plan.check(me)?;
    if plan.seed() == me {
        let window = Arc::new(join::BootWindow {
            secret: plan.secret.trim().to_string(),
            expect: plan.expect,
        });
        opts.bootstrap = true;
        return Ok(Some(window));
    }
    if !dir.has_cluster() {
        tracing::info!(seed = %plan.seed(), "joining the seed server of the new cluster");
        let identity = boot::join_seed(plan, &cfg.node_name).await?;
        dir.save_join(&identity, plan.seed())?;
    }
    Ok(None)
}

/// `--join VIA --token T`: gets a server certificate through `via`, unless
/// this data dir already belongs to a cluster.
async fn join_if_asked(
    cfg: &ServerConfig,
    opts: &ServerOptions,
    dir: &DataDir,
) -> anyhow::Result<()> {
    let Some((via, token)) = &opts.join else {
        return Ok(());
    };
    if dir.has_cluster() {
        tracing::info!(data_dir = %cfg.data_dir.display(), "this server already belongs to a cluster; --join is ignored");
        return Ok(());
    }
    if opts.bootstrap {
        anyhow::bail!("--bootstrap and --join exclude each other: bootstrap the first server, join the others");
    }
    let token = crate::net::token::JoinToken::parse(token).context("the --token is not usable")?;
    let identity = crate::net::join(*via, &token, crate::model::Role::Server, &cfg.node_name)
        .await
        .with_context(|| format!("joining the cluster at {via} failed"))?;
    dir.save_join(&identity, *via)?;
    tracing::info!(node = %cfg.node_name, server = %via, "got a server certificate; asking to become a member");
    Ok(())
}

/// The HTTP port (`http_listen`), bound before anything else is opened so
/// that a port in use stops the start at once. Beyond loopback it is TLS
/// with this server's certificate (its DNS name is the node name).
fn open_http(
    cfg: &ServerConfig,
    identity: &crate::net::NodeIdentity,
) -> anyhow::Result<crate::http::Listener> {
    let tls = if cfg.http_listen.ip().is_loopback() {
        None
    } else {
        let id = crate::net::tls::TlsIdentity::from_node(identity)
            .context("cannot use this server's certificate for the HTTP port")?;
        let config = crate::net::tls::server_config(&id, &[b"http/1.1".to_vec()])
            .context("cannot make the HTTP port's TLS configuration")?;
        Some(Arc::new(config))
    };
    Ok(crate::http::Listener::bind(
        cfg.http_listen,
        "server.http_listen",
        tls,
    )?)
}

/// The server's QUIC endpoint: raft, api, join and agent sync on one port.
fn open_endpoint(
    cfg: &ServerConfig,
    identity: &crate::net::NodeIdentity,
) -> anyhow::Result<Endpoint> {
    let endpoint = Endpoint::server(
        cfg.listen,
        identity,
        vec![
            Service::raft(),
            Service::api(),
            Service::join(),
            Service::agent(),
        ],
    )
    .with_context(|| format!("cannot listen on {} (UDP)", cfg.listen))?
    // A Raft peer silent for two election timeouts is gone: its cached
    // connection closes and the next RPC dials afresh (a restarted peer
    // answers at once), instead of waiting out QUIC's 10 s idle timeout.
    .with_dial_idle_timeout(
        crate::net::endpoint::ALPN_RAFT,
        std::time::Duration::from_millis(2 * cfg.raft.election_timeout_max_ms),
    )
    // The same for requests a follower forwards to the leader.
    .with_dial_idle_timeout(
        crate::net::endpoint::ALPN_API,
        std::time::Duration::from_millis(2 * cfg.raft.election_timeout_max_ms),
    );
    Ok(endpoint)
}

/// The cluster identity (CA) enters the replicated state once, through the
/// log, as soon as this server leads. Nothing is served before it is
/// there: a token made earlier could not admit anyone.
async fn init_cluster(
    cfg: &ServerConfig,
    node: &RaftNode,
    ca: &crate::net::ClusterCa,
) -> anyhow::Result<()> {
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        if node
            .state
            .read()
            .map(|s| s.cluster.is_some())
            .unwrap_or(false)
        {
            return Ok(());
        }
        if std::time::Instant::now() > deadline {
            anyhow::bail!("this server did not become leader of its new cluster within 60 s");
        }
        let cmd = Command::InitCluster {
            name: cfg.cluster_name.clone(),
            ca_cert_pem: ca.cert_pem.clone(),
            ca_key_pem: ca.key_pem.clone(),
            master_ports: cfg.master_port_range,
            now: now_ms(),
        };
        match node.raft.client_write(cmd).await {
            Ok(_) => return Ok(()),
            Err(e) => tracing::debug!(error = %e, "cluster init waits for leadership"),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// QUIC: one task per accepted connection, dispatched by protocol.
fn serve_quic(
    endpoint: Arc<Endpoint>,
    api: Arc<Api>,
    raft: raft::GpuqRaft,
    boot_window: Option<Arc<join::BootWindow>>,
    mut shutdown: watch::Receiver<bool>,
) {
    tokio::spawn(async move {
        loop {
            let peer = tokio::select! {
                p = endpoint.accept() => p,
                _ = shutdown.changed() => break,
            };
            let Some(peer) = peer else { break };
            tokio::spawn(serve_peer(
                peer,
                api.clone(),
                raft.clone(),
                boot_window.clone(),
            ));
        }
        endpoint.close();
    });
}

/// Serves one accepted connection by its protocol (ALPN).
async fn serve_peer(
    peer: crate::net::Peer,
    api: Arc<Api>,
    raft: raft::GpuqRaft,
    boot_window: Option<Arc<join::BootWindow>>,
) {
    let alpn = peer.alpn.clone();
    if alpn == ALPN_RAFT {
        rpc::serve(
            peer,
            move |_p, req| {
                let raft = raft.clone();
                async move { raft::network::handle(&raft, req).await }
            },
            DEFAULT_MAX_FRAME,
        )
        .await;
    } else if alpn == ALPN_API {
        rpc::serve::<_, crate::net::proto::ApiResponse, _, _, _>(
            peer,
            move |p, req| {
                let api = api.clone();
                async move { api.handle_vouched(&p, req).await }
            },
            DEFAULT_MAX_FRAME,
        )
        .await;
    } else if alpn == ALPN_AGENT {
        let hub = api.hub.clone();
        agents::serve(api, hub, peer).await;
    } else if alpn == ALPN_JOIN {
        let ca_pem = api.ca_cert_pem();
        let admission = join::Admission {
            api,
            boot: boot_window,
        };
        crate::net::serve_join(peer, Arc::new(admission), ca_pem).await;
    }
}

/// The background loops of the leader's duties: scheduling passes, the
/// history's archive, and node liveness.
fn spawn_leader_duties(cfg: &ServerConfig, api: &Arc<Api>, shutdown: &watch::Receiver<bool>) {
    tokio::spawn(scheduler::run(api.clone(), shutdown.clone()));
    tokio::spawn(metrics::watch_leader(api.clone(), shutdown.clone()));
    tokio::spawn(archive::run(
        api.clone(),
        Duration::from_secs(cfg.history_retention_secs),
        shutdown.clone(),
    ));
    tokio::spawn(liveness::run(
        api.clone(),
        Duration::from_secs(cfg.node_ttl_secs.max(1)),
        shutdown.clone(),
    ));
    tokio::spawn(autoscale::run(api.clone(), shutdown.clone()));
}

/// The local socket for the CLI on this host.
fn serve_local_socket(
    cfg: &ServerConfig,
    api: &Arc<Api>,
    shutdown: &watch::Receiver<bool>,
) -> anyhow::Result<()> {
    let listener = local::bind(&cfg.socket)
        .with_context(|| format!("cannot serve the local socket {}", cfg.socket.display()))?;
    let api = api.clone();
    let admin_group = cfg.admin_group.clone();
    tokio::spawn(local::serve(
        listener,
        Arc::new(move |cred, req| {
            let api = api.clone();
            let admin_group = admin_group.clone();
            async move {
                match local::resolve_caller(cred, admin_group.as_deref()) {
                    Ok(caller) => api.handle_relaying(caller, req).await,
                    Err(why) => crate::net::proto::ApiResponse::error(
                        crate::net::proto::ErrorKind::Forbidden,
                        why,
                    )
                    .into(),
                }
            }
        }),
        shutdown.clone(),
    ));
    Ok(())
}

/// The least free space a server starts with: a full disk would let it open
/// its store and then fail every write, a member that answers but never
/// commits.
const MIN_FREE_BYTES: u64 = 16 << 20;

/// Refuses to start on a (nearly) full disk, naming the data dir.
fn check_free_space(data_dir: &std::path::Path) -> anyhow::Result<()> {
    let st = nix::sys::statvfs::statvfs(data_dir)
        .with_context(|| format!("cannot read the free space of {}", data_dir.display()))?;
    let free = st.blocks_available() as u64 * st.fragment_size() as u64;
    if free < MIN_FREE_BYTES {
        anyhow::bail!(
            "no space left for the data dir {}: {} KiB free, and a server needs {} MiB to \
             write its log; free some space there (nothing was written)",
            data_dir.display(),
            free >> 10,
            MIN_FREE_BYTES >> 20
        );
    }
    Ok(())
}

/// Runs a server until SIGINT/SIGTERM.
/// Runs a server until SIGINT/SIGTERM, or until its Raft core stops on a
/// fatal error (a storage write failed, e.g. on a full disk). Then it exits
/// with that error: openraft never resumes a stopped core, so a process that
/// lived on would stay a member that never votes or applies again, even
/// once the disk has room; exited, the service manager restarts it
/// (`Restart=on-failure`) and it catches up.
pub async fn run(cfg: ServerConfig, opts: ServerOptions) -> anyhow::Result<()> {
    let (tx, rx) = watch::channel(false);
    let server = start(cfg, opts, rx).await?;
    let mut metrics = server.raft.raft.metrics();
    let stopped = async move {
        loop {
            if let Err(fatal) = &metrics.borrow_and_update().running_state {
                return fatal.to_string();
            }
            if metrics.changed().await.is_err() {
                // Gone without a fatal error: only a shutdown does that.
                std::future::pending::<()>().await;
            }
        }
    };
    tokio::select! {
        _ = crate::shutdown_signal() => {}
        fatal = stopped => {
            tracing::error!("the Raft core stopped: {fatal}; exiting so that the server is restarted");
            let _ = tx.send(true);
            anyhow::bail!("the Raft core stopped: {fatal}");
        }
    }
    tracing::info!("shutting down");
    let _ = tx.send(true);
    let _ = server.raft.raft.shutdown().await;
    Ok(())
}
