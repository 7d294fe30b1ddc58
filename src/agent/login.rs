//! Vouching for local users: every agent (login or compute) serves the local
//! socket and forwards each request, with the kernel-attested caller, to a
//! server over QUIC (`gpuq-api/1`). Servers are tried in order; a follower
//! forwards writes to its leader. A login agent does only this.

use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::Context;
use tokio::sync::watch;

use crate::config::AgentConfig;
use crate::model::Role;
use crate::net::endpoint::{Endpoint, ALPN_API};
use crate::net::local;
use crate::net::proto::{ApiRequest, ApiResponse, Caller, ErrorKind, Vouched};
use crate::net::{rpc, DEFAULT_MAX_FRAME};

/// Forwards local users' requests to the control plane.
pub struct Forwarder {
    pub endpoint: Arc<Endpoint>,
    pub servers: Vec<SocketAddr>,
}

impl Forwarder {
    /// Forwards one request for `caller` to the first server that answers.
    pub async fn forward(&self, caller: Caller, request: ApiRequest) -> ApiResponse {
        let v = Vouched { caller, request };
        let mut last = String::from("no servers are configured (set servers in [agent])");
        for addr in &self.servers {
            let attempt = async {
                let peer = self
                    .endpoint
                    .dial(*addr, ALPN_API, &[Role::Server])
                    .await
                    .map_err(|e| e.to_string())?;
                rpc::call::<Vouched, ApiResponse>(&peer.conn, &v, DEFAULT_MAX_FRAME)
                    .await
                    .map_err(|e| e.to_string())
            };
            match attempt.await {
                Ok(resp) => return resp,
                Err(e) => last = format!("server {addr}: {e}"),
            }
        }
        ApiResponse::error(
            ErrorKind::Unavailable,
            format!("no server answered; last error: {last}"),
        )
    }
}

/// The servers an agent talks to: the configured list, with the join address first.
pub fn resolve_servers(
    cfg: &AgentConfig,
    join_addr: Option<SocketAddr>,
) -> anyhow::Result<Vec<SocketAddr>> {
    use std::net::ToSocketAddrs;
    let mut out = Vec::new();
    if let Some(a) = join_addr {
        out.push(a);
    }
    for s in &cfg.servers {
        let addrs = s
            .to_socket_addrs()
            .with_context(|| format!("server address {s:?} in servers is not HOST:PORT"))?;
        for a in addrs {
            if !out.contains(&a) {
                out.push(a);
            }
        }
    }
    if out.is_empty() {
        anyhow::bail!("no server to talk to: give --join HOST:PORT, or servers in [agent]");
    }
    Ok(out)
}

impl Forwarder {
    /// Joins if needed (as `role`) and opens the agent's QUIC endpoint towards
    /// its servers.
    pub async fn connect(
        cfg: &AgentConfig,
        role: Role,
        join_addr: Option<SocketAddr>,
        token: Option<&str>,
    ) -> anyhow::Result<Forwarder> {
        std::fs::create_dir_all(&cfg.data_dir)
            .with_context(|| format!("cannot create data dir {}", cfg.data_dir.display()))?;
        let identity =
            super::ensure_identity(&cfg.data_dir, role, &cfg.node_name, join_addr, token).await?;
        let servers = resolve_servers(cfg, join_addr)?;
        let bind = crate::net::endpoint::unspecified_for(servers[0]);
        let endpoint =
            Endpoint::client(&identity, bind).context("cannot open a QUIC client endpoint")?;
        Ok(Forwarder {
            endpoint: Arc::new(endpoint),
            servers,
        })
    }
}

/// Serves the local socket, forwarding through `forwarder`, until `shutdown`.
pub fn serve_local(
    cfg: &AgentConfig,
    forwarder: Arc<Forwarder>,
    shutdown: watch::Receiver<bool>,
) -> anyhow::Result<()> {
    let listener = local::bind(&cfg.socket)
        .with_context(|| format!("cannot serve the local socket {}", cfg.socket.display()))?;
    let admin_group = cfg.admin_group.clone();
    tokio::spawn(local::serve(
        listener,
        Arc::new(move |cred, req| {
            let forwarder = forwarder.clone();
            let admin_group = admin_group.clone();
            async move {
                match local::resolve_caller(cred, admin_group.as_deref()) {
                    Ok(caller) => forwarder.forward(caller, req).await,
                    Err(why) => ApiResponse::error(ErrorKind::Forbidden, why),
                }
            }
        }),
        shutdown,
    ));
    Ok(())
}

/// Joins if needed, then serves the local socket until `shutdown`.
pub async fn start_login(
    cfg: AgentConfig,
    join_addr: Option<SocketAddr>,
    token: Option<String>,
    shutdown: watch::Receiver<bool>,
) -> anyhow::Result<Arc<Forwarder>> {
    let forwarder =
        Arc::new(Forwarder::connect(&cfg, Role::Login, join_addr, token.as_deref()).await?);
    serve_local(&cfg, forwarder.clone(), shutdown)?;
    tracing::info!(node = %cfg.node_name, socket = %cfg.socket.display(), "login agent ready");
    Ok(forwarder)
}

/// Runs a login agent until SIGINT/SIGTERM.
pub async fn run_login(
    cfg: AgentConfig,
    join_addr: Option<SocketAddr>,
    token: Option<String>,
) -> anyhow::Result<()> {
    let (tx, rx) = watch::channel(false);
    let _agent = start_login(cfg, join_addr, token, rx).await?;
    crate::shutdown_signal().await;
    let _ = tx.send(true);
    Ok(())
}
