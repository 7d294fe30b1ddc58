//! Starting a compute agent: identity (join once), inventory (GPU backend and
//! host), the task runner, the leader connection, and the local socket.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use tokio::sync::watch;

use super::compute::ComputeAgent;
use super::exec::Executor;
use super::host::HostConfig;
use super::login::{serve_local, Forwarder};
use super::runner::TaskRunner;
use super::runner::{tasks_root, ExecRunner};
use crate::config::AgentConfig;
use crate::model::Role;

/// A started compute agent.
pub struct RunningAgent {
    pub agent: Arc<ComputeAgent>,
    pub task: tokio::task::JoinHandle<anyhow::Result<()>>,
    /// The HTTP port's base URL (`http://127.0.0.1:7481`).
    pub http_url: String,
}

/// A compute agent's data dir (0711: the tasks' users pass through it to
/// their own task's script, and list nothing) and its task directories.
pub fn data_dirs(data_dir: &std::path::Path) -> anyhow::Result<()> {
    use crate::owner_only::{ensure_dir, DirMode};
    ensure_dir(data_dir, DirMode::Traverse).context("the agent's data dir is not usable")?;
    ensure_dir(&tasks_root(data_dir), DirMode::Traverse)?;
    Ok(())
}

/// The task runner a real agent uses: shims started from this binary.
pub fn exec_runner(cfg: &AgentConfig) -> anyhow::Result<Arc<dyn TaskRunner>> {
    let shim = std::env::current_exe().context("cannot find the gpuq binary to run shims")?;
    let root = tasks_root(&cfg.data_dir);
    data_dirs(&cfg.data_dir)?;
    Ok(Arc::new(ExecRunner {
        executor: Executor::new(root, shim),
        allow_root: cfg.allow_root,
        kill_grace_secs: cfg.kill_grace_secs,
        run_as: None,
        ended: Default::default(),
        containers: super::exec::container::ContainerHost::new(
            &cfg.containers,
            &cfg.data_dir,
            &cfg.gpus,
        ),
    }))
}

/// Starts a compute agent with `runner`; it serves until `shutdown`.
pub async fn start_compute(
    cfg: AgentConfig,
    join_addr: Option<SocketAddr>,
    token: Option<String>,
    runner: Arc<dyn TaskRunner>,
    shutdown: watch::Receiver<bool>,
) -> anyhow::Result<RunningAgent> {
    data_dirs(&cfg.data_dir)?;
    // First, so that a port in use stops the start before anything else.
    let http = crate::http::Listener::bind(cfg.http_listen, "agent.http_listen", None)?;
    let backend = super::gpu::open_backend(&cfg.gpus, &cfg.node_name)
        .context("cannot read this node's GPUs")?;
    let host = HostConfig {
        reserved_cpus: cfg.reserved_cpus,
        reserved_memory_mb: cfg.reserved_memory_mb,
        topology: cfg.topology.clone(),
        features: cfg.features.clone(),
    };
    let mut inventory = super::host::inventory(&cfg.node_name, backend.as_ref(), &host)
        .context("cannot read this node's inventory")?;
    // Jobs with a container image go only to nodes that can run it.
    let path = std::env::var("PATH").unwrap_or_default();
    let runtime = super::exec::container::find_runtime(cfg.containers.runtime.as_deref(), &path)
        .and_then(|runtime| {
            // An agent that is not root runs containers rootless or not at all.
            let root = nix::unistd::geteuid().is_root();
            match (root, cfg.containers.rootless) {
                (true, _) => Ok(runtime),
                (false, false) => Err("the agent is not root and [agent.containers] rootless is \
                                       false"
                    .to_string()),
                (false, true) => super::exec::container::rootless_here(&runtime)
                    .map(|()| runtime)
                    .map_err(|why| format!("the agent is not root, and {why}")),
            }
        });
    match runtime {
        Ok(runtime) => {
            tracing::info!(runtime = %runtime.display(), "OCI runtime found: container jobs may run here");
            let oci = crate::model::OCI_FEATURE.to_string();
            let named = crate::model::runtime_feature(&runtime);
            for f in std::iter::once(oci).chain(named) {
                if !inventory.features.contains(&f) {
                    inventory.features.push(f);
                }
            }
            // The runtime runs as the job's user where the kernel allows.
            if cfg.containers.rootless {
                match super::exec::container::rootless_here(&runtime) {
                    Ok(()) => {
                        let f = crate::model::OCI_ROOTLESS_FEATURE.to_string();
                        if !inventory.features.contains(&f) {
                            inventory.features.push(f);
                        }
                    }
                    Err(why) => tracing::warn!("containers are not rootless here: {why}"),
                }
            }
            // GPUs go in through CDI where the node has specs.
            let specs = super::exec::cdi::spec_files(&cfg.containers.cdi_spec_dirs);
            let cdi = crate::model::OCI_CDI_FEATURE.to_string();
            match specs.is_empty() {
                true => tracing::info!(
                    dirs = ?cfg.containers.cdi_spec_dirs,
                    "no CDI spec files: GPUs in containers get their device nodes only \
                     (no driver libraries)"
                ),
                false => {
                    tracing::info!(specs = ?specs, "CDI specs found: GPUs in containers get their edits");
                    if !inventory.features.contains(&cdi) {
                        inventory.features.push(cdi);
                    }
                }
            }
            // Registry references need a pull tool as well.
            let pull = crate::model::OCI_PULL_FEATURE.to_string();
            match super::exec::container::Pull::new(&cfg.containers, &path).tool {
                Some(tool) if !inventory.features.contains(&pull) => {
                    tracing::info!(tool = %tool.display(), "images may be pulled here");
                    inventory.features.push(pull);
                }
                Some(_) => {}
                None => tracing::info!(
                    "no pull tool ([agent.containers] pull_tool): docker:// images are not \
                     pulled here"
                ),
            }
        }
        Err(why) => tracing::info!("no container jobs here: {why}"),
    }
    if let Some(cpus) = cfg.cpus {
        inventory.cpus = cpus;
    }
    if let Some(mb) = cfg.memory_mb {
        inventory.memory_mb = mb;
    }
    let forwarder =
        Arc::new(Forwarder::connect(&cfg, Role::Agent, join_addr, token.as_deref()).await?);
    let (endpoint, servers) = (forwarder.endpoint.clone(), forwarder.servers.clone());
    serve_local(&cfg, forwarder, shutdown.clone())?;
    tracing::info!(
        node = %cfg.node_name,
        gpus = inventory.gpus.len(),
        backend = backend.kind(),
        cpus = inventory.cpus,
        memory_mb = inventory.memory_mb,
        http = %http.url(),
        "compute agent ready"
    );
    let health = cfg
        .health_check
        .clone()
        .map(|check| super::health::spawn(check, shutdown.clone()));
    if cfg.preflight && health.is_none() {
        anyhow::bail!("preflight = true needs a [agent.health_check] command to pass");
    }
    let gpus: Arc<dyn super::gpu::GpuBackend> = Arc::from(backend);
    let holders = Arc::new(super::telemetry::GpuHolders::with_dcgm_dir(
        cfg.dcgm_job_map_dir.clone(),
    ));
    tokio::spawn(super::telemetry::sample_loop(
        gpus.clone(),
        holders.clone(),
        shutdown.clone(),
    ));
    let http_url = http.url();
    http.serve(
        Arc::new(super::telemetry::AgentSite {
            node: cfg.node_name.clone(),
            gpus: Some(gpus.clone()),
            holders: holders.clone(),
        }),
        shutdown.clone(),
    );
    let agent = Arc::new(ComputeAgent {
        endpoint,
        servers,
        inventory,
        advertise: None,
        runner,
        reconcile_every: Duration::from_millis(100),
        gpus: Some(gpus),
        health,
        preflight: cfg.preflight,
        holders,
    });
    let task = tokio::spawn(agent.clone().run(shutdown));
    Ok(RunningAgent {
        agent,
        task,
        http_url,
    })
}

/// Runs a compute agent until SIGINT/SIGTERM. Its tasks keep running under
/// their shims when it stops; the next agent re-adopts them.
pub async fn run_compute(
    cfg: AgentConfig,
    join_addr: Option<SocketAddr>,
    token: Option<String>,
) -> anyhow::Result<()> {
    let (tx, rx) = watch::channel(false);
    let runner = exec_runner(&cfg)?;
    let running = start_compute(cfg, join_addr, token, runner, rx).await?;
    crate::shutdown_signal().await;
    let _ = tx.send(true);
    let _ = running.task.await;
    Ok(())
}
