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
use crate::net::rpc::Reply;
use crate::net::stdio::{quic_stream, MAX_STDIO_FRAME};
use crate::net::{rpc, DEFAULT_MAX_FRAME};

use super::compute::DIAL_TIMEOUT;
use super::servers::ServerList;

/// An agent's connections to servers count a server silent this long as
/// gone, so a dead leader is noticed within seconds (well inside the node
/// TTL the next leader grants).
pub const AGENT_IDLE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(3);

/// Forwards local users' requests to the control plane.
pub struct Forwarder {
    pub endpoint: Arc<Endpoint>,
    /// The known servers: configured, then learned from the cluster.
    pub servers: Arc<ServerList>,
}

/// Whether a request may be sent again to another server after the first
/// one took it but gave no answer: only if it changes nothing. A write whose
/// outcome is unknown is reported as such, never repeated (a repeated submit
/// could make two jobs).
fn safe_to_repeat(request: &ApiRequest) -> bool {
    matches!(
        request,
        ApiRequest::Queue { .. }
            | ApiRequest::Show { .. }
            | ApiRequest::Cluster
            | ApiRequest::Nodes
            | ApiRequest::Logs { .. }
            | ApiRequest::TokenList
    )
}

/// An answer that means "not here, try another server": the server has no
/// leader to forward to, or is a leader that lost its majority.
fn try_elsewhere(resp: &ApiResponse) -> bool {
    match resp {
        ApiResponse::Error { kind, message, .. } => {
            *kind == ErrorKind::Unavailable
                && (message.starts_with("not leader") || message.starts_with("no leader"))
        }
        _ => false,
    }
}

impl Forwarder {
    /// Forwards one request for `caller`, failing over between the known
    /// servers (the one that answered last first). A server that cannot be
    /// reached, or answers that it knows no leader, is skipped; a write
    /// already delivered is not repeated elsewhere.
    pub async fn forward(&self, caller: Caller, request: ApiRequest) -> ApiResponse {
        let repeatable = safe_to_repeat(&request);
        let v = Vouched { caller, request };
        let mut last = String::from("no servers are configured (set servers in [agent])");
        let mut refusal = None;
        for addr in self.servers.in_order() {
            let dial = self.endpoint.dial(addr, ALPN_API, &[Role::Server]);
            let peer = match tokio::time::timeout(DIAL_TIMEOUT, dial).await {
                Ok(Ok(p)) => p,
                Ok(Err(e)) => {
                    last = format!("server {addr}: {e}");
                    continue;
                }
                Err(_) => {
                    last = format!("server {addr}: no answer within {DIAL_TIMEOUT:?}");
                    continue;
                }
            };
            match rpc::call::<Vouched, ApiResponse>(&peer.conn, &v, DEFAULT_MAX_FRAME).await {
                Ok(resp) if try_elsewhere(&resp) => refusal = Some(resp),
                Ok(resp) => {
                    self.servers.answered(addr);
                    if let ApiResponse::Cluster { status } = &resp {
                        let addrs: Vec<String> =
                            status.members.iter().map(|m| m.addr.clone()).collect();
                        self.servers.learn(&addrs);
                    }
                    return resp;
                }
                Err(e) if repeatable => last = format!("server {addr}: {e}"),
                Err(e) => {
                    return ApiResponse::error(
                        ErrorKind::Unavailable,
                        format!(
                            "server {addr} took the request but gave no answer ({e}); it may \
                             still take effect: check before retrying"
                        ),
                    )
                }
            }
        }
        refusal.unwrap_or_else(|| {
            ApiResponse::error(
                ErrorKind::Unavailable,
                format!("no server answered; last error: {last}"),
            )
        })
    }

    /// Forwards a request that opens an interactive stream: the answer,
    /// and on `Attached` the server's stream to splice the caller's to.
    /// Trying the next server is always safe: an attach changes nothing,
    /// and an exec whose stream never reached its node never runs (its
    /// shim waits for the stream before it starts the command).
    pub async fn forward_stream(&self, caller: Caller, request: ApiRequest) -> Reply<ApiResponse> {
        let v = Vouched { caller, request };
        let mut last = String::from("no servers are configured (set servers in [agent])");
        let mut refusal = None;
        for addr in self.servers.in_order() {
            let dial = self.endpoint.dial(addr, ALPN_API, &[Role::Server]);
            let peer = match tokio::time::timeout(DIAL_TIMEOUT, dial).await {
                Ok(Ok(p)) => p,
                Ok(Err(e)) => {
                    last = format!("server {addr}: {e}");
                    continue;
                }
                Err(_) => {
                    last = format!("server {addr}: no answer within {DIAL_TIMEOUT:?}");
                    continue;
                }
            };
            match rpc::call_keeping::<Vouched, ApiResponse>(&peer.conn, &v, MAX_STDIO_FRAME).await {
                Ok((resp, _, _)) if try_elsewhere(&resp) => refusal = Some(resp),
                Ok((resp @ ApiResponse::Attached { .. }, send, recv)) => {
                    self.servers.answered(addr);
                    return Reply::Relay(resp, quic_stream(send, recv));
                }
                Ok((resp, _, _)) => return resp.into(),
                Err(e) => last = format!("server {addr}: {e}"),
            }
        }
        refusal
            .unwrap_or_else(|| {
                ApiResponse::error(
                    ErrorKind::Unavailable,
                    format!("no server answered; last error: {last}"),
                )
            })
            .into()
    }

    /// Refreshes the known servers from the cluster's membership now and then,
    /// until `shutdown`, so a login agent whose configured servers were
    /// replaced still reaches the control plane.
    pub async fn refresh(self: Arc<Self>, mut shutdown: watch::Receiver<bool>) {
        let caller = Caller {
            user: "gpuq-agent".into(),
            uid: 65534,
            admin: false,
        };
        loop {
            let _ = self.forward(caller.clone(), ApiRequest::Cluster).await;
            tokio::select! {
                _ = tokio::time::sleep(REFRESH_EVERY) => {}
                _ = shutdown.changed() => return,
            }
        }
    }
}

/// How often a forwarder asks the cluster for its members.
const REFRESH_EVERY: std::time::Duration = std::time::Duration::from_secs(30);

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
        crate::owner_only::ensure_dir(&cfg.data_dir, crate::owner_only::DirMode::Private)
            .context("the login agent's data dir is not usable")?;
        let identity =
            super::ensure_identity(&cfg.data_dir, role, &cfg.node_name, join_addr, token).await?;
        let configured = resolve_servers(cfg, join_addr)?;
        let bind = crate::net::endpoint::unspecified_for(configured[0]);
        let endpoint = Endpoint::client(&identity, bind)
            .context("cannot open a QUIC client endpoint")?
            .with_idle_timeout(AGENT_IDLE_TIMEOUT);
        Ok(Forwarder {
            endpoint: Arc::new(endpoint),
            servers: Arc::new(ServerList::load(configured, &cfg.data_dir)),
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
        Arc::new(move |cred, req: ApiRequest| {
            let forwarder = forwarder.clone();
            let admin_group = admin_group.clone();
            async move {
                match local::resolve_caller(cred, admin_group.as_deref()) {
                    Ok(caller) if req.opens_stream() => forwarder.forward_stream(caller, req).await,
                    Ok(caller) => forwarder.forward(caller, req).await.into(),
                    Err(why) => ApiResponse::error(ErrorKind::Forbidden, why).into(),
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
    serve_local(&cfg, forwarder.clone(), shutdown.clone())?;
    tokio::spawn(forwarder.clone().refresh(shutdown));
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
