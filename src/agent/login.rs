//! The login agent: serves the local socket and forwards each request, with the
//! kernel-attested caller, to a server over QUIC (`gpuq-api/1`). Servers are
//! tried in order; a follower forwards writes to its leader.

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

/// A running login agent.
pub struct LoginAgent {
    endpoint: Endpoint,
    servers: Vec<SocketAddr>,
}

impl LoginAgent {
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

fn resolve_servers(cfg: &AgentConfig) -> anyhow::Result<Vec<SocketAddr>> {
    use std::net::ToSocketAddrs;
    let mut out = Vec::new();
    for s in &cfg.servers {
        let addrs = s
            .to_socket_addrs()
            .with_context(|| format!("server address {s:?} in servers is not HOST:PORT"))?;
        out.extend(addrs);
    }
    Ok(out)
}

/// Joins if needed, then serves the local socket until `shutdown`.
pub async fn start_login(
    cfg: AgentConfig,
    join_addr: Option<SocketAddr>,
    token: Option<String>,
    shutdown: watch::Receiver<bool>,
) -> anyhow::Result<Arc<LoginAgent>> {
    std::fs::create_dir_all(&cfg.data_dir)
        .with_context(|| format!("cannot create data dir {}", cfg.data_dir.display()))?;
    let identity = super::ensure_identity(
        &cfg.data_dir,
        Role::Login,
        &cfg.node_name,
        join_addr,
        token.as_deref(),
    )
    .await?;
    let mut servers = resolve_servers(&cfg)?;
    if let Some(a) = join_addr {
        if !servers.contains(&a) {
            servers.insert(0, a);
        }
    }
    let bind = crate::net::endpoint::unspecified_for(
        *servers
            .first()
            .context("no server to talk to: give --join HOST:PORT or servers in [agent]")?,
    );
    let endpoint =
        Endpoint::client(&identity, bind).context("cannot open a QUIC client endpoint")?;
    let agent = Arc::new(LoginAgent { endpoint, servers });

    let listener = local::bind(&cfg.socket)
        .with_context(|| format!("cannot serve the local socket {}", cfg.socket.display()))?;
    let handler_agent = agent.clone();
    let admin_group = cfg.admin_group.clone();
    tokio::spawn(local::serve(
        listener,
        Arc::new(move |cred, req| {
            let agent = handler_agent.clone();
            let admin_group = admin_group.clone();
            async move {
                match local::resolve_caller(cred, admin_group.as_deref()) {
                    Ok(caller) => agent.forward(caller, req).await,
                    Err(why) => ApiResponse::error(ErrorKind::Forbidden, why),
                }
            }
        }),
        shutdown,
    ));
    tracing::info!(node = %cfg.node_name, socket = %cfg.socket.display(), "login agent ready");
    Ok(agent)
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
