//! `gpuq dev`: a whole cluster in one process. One server and N compute
//! agents on fake GPUs, each with its own identity (joined with a token like a
//! real agent), its own QUIC endpoint on loopback and its own task directory;
//! tasks are real processes under real shims. State lives in one local
//! directory; the CLI finds the socket with no flags.

mod burst;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use tokio::sync::watch;

use crate::agent::runner::{tasks_root, ExecRunner};
use crate::config::{AgentConfig, AgentRole, ServerConfig};
use crate::config::{FakeGpuConfig, GpuConfig};
use crate::model::Role;
use crate::net::proto::{ApiRequest, ApiResponse, Caller};
use crate::socket_path::{dev_dir, socket_in};

/// Options of `gpuq dev`.
#[derive(Clone, Debug)]
pub struct DevOptions {
    pub nodes: u32,
    pub gpus_per_node: u32,
    pub dir: PathBuf,
    /// Remove the directory's previous state first.
    pub fresh: bool,
    /// Use this machine's real GPUs through NVML (one node) instead of fakes.
    pub nvml: bool,
    /// `--mig LAYOUT`: every fake GPU partitioned into these MIG slices.
    pub mig: Option<crate::model::MigLayout>,
    /// `--shared N`: every fake GPU time-shared into N slots.
    pub shared: Option<u32>,
    /// Names of links to this binary to make in `dir/bin` (the Slurm
    /// commands, which the binary speaks when started under those names).
    pub links: Vec<String>,
    /// The server's HTTP port (`--http`, loopback only).
    pub http: std::net::SocketAddr,
    /// `--burst N`: a node group of up to N more simulated nodes, started
    /// when jobs wait for capacity and stopped when idle (`burst`).
    pub burst: u32,
}

fn current_user() -> anyhow::Result<(String, bool)> {
    let uid = nix::unistd::Uid::effective();
    let user =
        nix::unistd::User::from_uid(uid)?.with_context(|| format!("uid {uid} has no user name"))?;
    Ok((user.name, uid.is_root()))
}

/// A running dev cluster.
pub struct DevCluster {
    pub socket: PathBuf,
    pub server: crate::server::RunningServer,
    pub agents: Vec<crate::agent::RunningAgent>,
}

/// Starts the cluster and returns once every agent is registered.
pub async fn start(
    opts: &DevOptions,
    shutdown: watch::Receiver<bool>,
) -> anyhow::Result<DevCluster> {
    if opts.nodes == 0 || opts.nodes > 256 {
        anyhow::bail!("--nodes {} is out of range: use 1 to 256", opts.nodes);
    }
    if opts.nvml && opts.mig.is_some() {
        anyhow::bail!(
            "--mig partitions simulated GPUs; with --gpus nvml, partition the real ones with nvidia-smi"
        );
    }
    let shared = opts
        .shared
        .map(crate::model::share::check_slots)
        .transpose()
        .map_err(|e| anyhow::anyhow!(e.replace("--slots", "--shared")))?;
    if shared.is_some() && (opts.nvml || opts.mig.is_some()) {
        anyhow::bail!(
            "--shared shares simulated whole GPUs: not with --mig or --gpus nvml (share real GPUs \
             with `gpuq node share NODE --slots N`)"
        );
    }
    if opts.nvml && opts.nodes != 1 {
        anyhow::bail!("--gpus nvml runs one node (the real GPUs cannot be shared): add --nodes 1");
    }
    if opts.gpus_per_node > 64 {
        anyhow::bail!(
            "--gpus-per-node {} is out of range: use 0 to 64",
            opts.gpus_per_node
        );
    }
    if !opts.http.ip().is_loopback() {
        anyhow::bail!(
            "--http {} is beyond loopback: gpuq dev serves its page on this host only; \
             use e.g. 127.0.0.1:7480",
            opts.http
        );
    }
    if opts.fresh && opts.dir.exists() {
        std::fs::remove_dir_all(&opts.dir)
            .with_context(|| format!("cannot remove {}", opts.dir.display()))?;
    }
    // Traversable, not listable: other local users reach the socket in it,
    // tasks their scripts; the server's and agents' secrets sit in 0700
    // directories below.
    crate::owner_only::ensure_dir(&opts.dir, crate::owner_only::DirMode::Traverse)
        .context("the dev cluster's directory is not usable")?;
    crate::owner_only::ensure_dir(
        &opts.dir.join("agents"),
        crate::owner_only::DirMode::Traverse,
    )?;
    let (me, root) = current_user()?;
    let socket = socket_in(&opts.dir);

    let server_cfg = ServerConfig {
        cluster_name: "dev".into(),
        node_name: "dev-server".into(),
        data_dir: opts.dir.join("server"),
        listen: "127.0.0.1:0".parse().expect("literal address"),
        advertise: None,
        socket: socket.clone(),
        http_listen: opts.http,
        admin_group: None,
        admin_users: Vec::new(),
        private_jobs: false,
        max_token_ttl_secs: 7 * 24 * 3600,
        node_ttl_secs: 10,
        history_retention_secs: 300,
        inactive_limit_secs: ServerConfig::default().inactive_limit_secs,
        idle_gpu_secs: 1800,
        master_port_range: Default::default(),
        raft: Default::default(),
        bootstrap: Default::default(),
    };
    let server = crate::server::start(
        server_cfg,
        crate::server::ServerOptions {
            bootstrap: true,
            ..Default::default()
        },
        shutdown.clone(),
    )
    .await?;
    let admin = Caller {
        user: me.clone(),
        uid: nix::unistd::Uid::effective().as_raw(),
        admin: true,
    };
    // Wait until the cluster identity is committed, then make a join token.
    let token = {
        let mut waited = Duration::ZERO;
        loop {
            match server
                .api
                .handle(
                    admin.clone(),
                    ApiRequest::TokenCreate {
                        role: Role::Agent,
                        ttl_secs: 600,
                        uses: None,
                    },
                )
                .await
            {
                ApiResponse::Token { token, .. } => break token,
                other if waited > Duration::from_secs(20) => {
                    anyhow::bail!("the dev server did not become ready: {other:?}")
                }
                _ => {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    waited += Duration::from_millis(50);
                }
            }
        }
    };

    let mut agents = Vec::new();
    for i in 1..=opts.nodes {
        let name = format!("node{i:02}");
        let data_dir = opts.dir.join("agents").join(&name);
        let cfg = AgentConfig {
            node_name: name.clone(),
            data_dir: data_dir.clone(),
            socket: socket_in(&data_dir),
            // Any free loopback port: N agents share this host.
            http_listen: "127.0.0.1:0".parse().expect("literal address"),
            servers: vec![server.quic_addr.to_string()],
            role: AgentRole::Compute,
            gpus: if opts.nvml {
                GpuConfig::Nvml
            } else {
                GpuConfig::Fake(FakeGpuConfig {
                    count: opts.gpus_per_node,
                    fault_file: Some(data_dir.join("faults")),
                    mig: opts.mig.clone(),
                    shared,
                    ..Default::default()
                })
            },
            // A DGX-like node, whatever this machine has.
            cpus: Some(64),
            memory_mb: Some(512 * 1024),
            allow_root: true,
            kill_grace_secs: 2,
            ..Default::default()
        };
        crate::agent::data_dirs(&data_dir)?;
        let runner = Arc::new(ExecRunner {
            executor: crate::agent::exec::Executor::new(
                tasks_root(&data_dir),
                std::env::current_exe().context("cannot find the gpuq binary for shims")?,
            ),
            allow_root: true,
            kill_grace_secs: 2,
            // Without root the tasks can only run as the user who started dev.
            run_as: (!root).then(|| me.clone()),
            ended: Default::default(),
            containers: crate::agent::exec::container::ContainerHost::new(
                &cfg.containers,
                &data_dir,
                &cfg.gpus,
            ),
        });
        let agent = crate::agent::start_compute(
            cfg,
            Some(server.quic_addr),
            Some(token.clone()),
            runner,
            shutdown.clone(),
        )
        .await
        .with_context(|| format!("cannot start dev agent {name}"))?;
        agents.push(agent);
    }
    // Ready when every node is registered.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while server.api.state().nodes.len() < opts.nodes as usize {
        if std::time::Instant::now() > deadline {
            anyhow::bail!("the dev agents did not register within 30 s");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    if opts.burst > 0 {
        burst::declare(
            &server.api,
            admin.clone(),
            &opts.dir,
            server.quic_addr,
            opts.gpus_per_node,
            opts.burst,
        )
        .await?;
    }
    Ok(DevCluster {
        socket,
        server,
        agents,
    })
}

/// Makes `bin/NAME` a link to this binary for each name (replacing an old
/// link, leaving any other file alone) and returns `bin`.
fn make_links(bin: &std::path::Path, names: &[String]) -> anyhow::Result<PathBuf> {
    let exe = std::env::current_exe().context("cannot find this binary's path")?;
    std::fs::create_dir_all(bin).with_context(|| format!("cannot create {}", bin.display()))?;
    for name in names {
        let link = bin.join(name);
        if let Ok(meta) = std::fs::symlink_metadata(&link) {
            if !meta.file_type().is_symlink() {
                anyhow::bail!(
                    "{} exists and is not a link; remove it to get the link",
                    link.display()
                );
            }
            std::fs::remove_file(&link)
                .with_context(|| format!("cannot replace {}", link.display()))?;
        }
        std::os::unix::fs::symlink(&exe, &link)
            .with_context(|| format!("cannot link {} to {}", link.display(), exe.display()))?;
    }
    Ok(bin.to_path_buf())
}

/// Runs `gpuq dev` until Ctrl-C.
pub async fn run(opts: DevOptions) -> anyhow::Result<()> {
    let (tx, rx) = watch::channel(false);
    let cluster = start(&opts, rx).await?;
    let default = socket_in(&dev_dir());
    println!(
        "gpuq dev: 1 server, {} nodes x {} fake GPUs{}; state in {}",
        opts.nodes,
        opts.gpus_per_node,
        opts.mig
            .as_ref()
            .map(|l| format!(" (MIG {})", l.to_text()))
            .or(opts
                .shared
                .map(|n| format!(" (each shared into {n} slots)")))
            .unwrap_or_default(),
        opts.dir.display()
    );
    println!("socket: {}", cluster.socket.display());
    println!(
        "web page: {0}/  metrics: {0}/metrics  API: {0}/api/v1/",
        cluster.server.http_url
    );
    if cluster.socket != default {
        println!("  export GPUQ_SOCKET={}", cluster.socket.display());
    } else {
        println!("  the CLI finds it with no flags: try `gpuq nodes`, `gpuq submit -- hostname`");
    }
    if !opts.links.is_empty() {
        match make_links(&opts.dir.join("bin"), &opts.links) {
            Ok(bin) => println!(
                "Slurm commands ({}): export PATH={}:$PATH",
                opts.links.join(", "),
                bin.display()
            ),
            Err(e) => eprintln!("gpuq dev: no Slurm command links: {e:#}"),
        }
    }
    if opts.burst > 0 {
        println!(
            "node group {}: up to {} more nodes start when jobs wait for capacity and stop \
             after 60 s idle (`gpuq admin nodegroup list`, `gpuq nodes`)",
            burst::GROUP,
            opts.burst
        );
    }
    println!("Ctrl-C stops everything.");
    crate::shutdown_signal().await;
    println!("gpuq dev: stopping");
    burst::stop_all(&opts.dir);
    let _ = tx.send(true);
    for a in cluster.agents {
        let _ = tokio::time::timeout(Duration::from_secs(5), a.task).await;
    }
    let _ = cluster.server.raft.raft.shutdown().await;
    Ok(())
}
