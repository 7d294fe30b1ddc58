//! QUIC endpoints: one UDP socket per daemon that accepts authenticated peers
//! and dials other daemons, reusing live connections.
//!
//! Every protocol has its own ALPN and its own rule for who may open it
//! ([`Service`]): raft is for servers, agent sync for agents, the API for any
//! member, join for anyone (it is how a daemon gets a certificate at all). TLS
//! verifies any certificate a client presents against the cluster CA; the
//! endpoint then closes, with an application error code and a reason, every
//! connection whose protocol needs a certificate it did not present or a role
//! it does not have. Such connections never reach [`Endpoint::accept`].
//!
//! Before a connection is handed to the caller, both sides check they speak
//! the same protocol version (see `hello`).

use std::collections::HashMap;
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use quinn::crypto::rustls::{HandshakeData, QuicClientConfig, QuicServerConfig};
use quinn::{IdleTimeout, TransportConfig, VarInt};
use rustls::pki_types::CertificateDer;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use super::error::{close, code, connection_failed, EndpointError};
use super::hello::{self, PROTOCOL_VERSION};
use super::pki::{self, NodeIdentity};
use super::tls::{self, PeerCheck, TlsIdentity};
use crate::model::Role;

/// Raft traffic between servers.
pub const ALPN_RAFT: &[u8] = b"gpuq-raft/1";
/// The long-lived sync between an agent and the leader.
pub const ALPN_AGENT: &[u8] = b"gpuq-agent/1";
/// Requests from members (CLI requests forwarded by a daemon, server forwarding).
pub const ALPN_API: &[u8] = b"gpuq-api/1";
/// Joining the cluster; the only protocol open to a client without a certificate.
pub const ALPN_JOIN: &[u8] = b"gpuq-join/1";

/// The name put in the TLS SNI. Members are dialled by address and verified by
/// CA and role, so the name is never checked; it only has to be a valid DNS name.
const SERVER_NAME: &str = "gpuq";

/// Who may open a protocol on a server endpoint.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Admit {
    /// Clients with a cluster certificate of one of these roles.
    Members(Vec<Role>),
    /// Anyone, with or without a certificate (a presented one must still be valid).
    Anyone,
}

/// One protocol a server endpoint serves, and who may open it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Service {
    /// The ALPN that selects the protocol.
    pub alpn: Vec<u8>,
    /// Who may open it.
    pub admit: Admit,
}

impl Service {
    /// Raft: servers only.
    pub fn raft() -> Service {
        Service {
            alpn: ALPN_RAFT.to_vec(),
            admit: Admit::Members(vec![Role::Server]),
        }
    }

    /// Agent sync: compute and login agents.
    pub fn agent() -> Service {
        Service {
            alpn: ALPN_AGENT.to_vec(),
            admit: Admit::Members(vec![Role::Agent, Role::Login]),
        }
    }

    /// The API: any member.
    pub fn api() -> Service {
        Service {
            alpn: ALPN_API.to_vec(),
            admit: Admit::Members(vec![Role::Server, Role::Agent, Role::Login]),
        }
    }

    /// Join: anyone.
    pub fn join() -> Service {
        Service {
            alpn: ALPN_JOIN.to_vec(),
            admit: Admit::Anyone,
        }
    }
}

/// An authenticated connection, as the accepting or the dialling side sees it.
#[derive(Clone, Debug)]
pub struct Peer {
    /// The QUIC connection (cheap to clone).
    pub conn: quinn::Connection,
    /// The negotiated ALPN.
    pub alpn: Vec<u8>,
    /// The role and name in the peer's certificate; `None` only for a client
    /// without a certificate on the join protocol.
    pub identity: Option<(Role, String)>,
    /// The peer's address.
    pub remote: SocketAddr,
}

impl Peer {
    /// The peer's role, if it presented a certificate.
    pub fn role(&self) -> Option<Role> {
        self.identity.as_ref().map(|(r, _)| *r)
    }

    /// The peer's node name, if it presented a certificate.
    pub fn name(&self) -> Option<&str> {
        self.identity.as_ref().map(|(_, n)| n.as_str())
    }

    /// Hex SHA-256 of the peer's certificate (DER); empty without one. Tells
    /// two certificates for the same name apart.
    pub fn cert_sha256(&self) -> String {
        use sha2::Digest;
        peer_certificate(&self.conn)
            .map(|der| hex::encode(sha2::Sha256::digest(der.as_ref())))
            .unwrap_or_default()
    }

    /// A short description for logs: `name (role) at addr` or `addr`.
    pub fn describe(&self) -> String {
        match &self.identity {
            Some((role, name)) => format!("{name} ({role}) at {}", self.remote),
            None => format!("anonymous client at {}", self.remote),
        }
    }
}

/// The transport settings every gpuq connection uses.
fn transport_config() -> Arc<TransportConfig> {
    let mut t = TransportConfig::default();
    t.keep_alive_interval(Some(Duration::from_secs(2)));
    t.max_idle_timeout(Some(IdleTimeout::from(VarInt::from_u32(10_000))));
    t.max_concurrent_bidi_streams(VarInt::from_u32(1024));
    t.max_concurrent_uni_streams(VarInt::from_u32(64));
    Arc::new(t)
}

/// [`transport_config`] with keep-alives every third of `idle` and `idle`
/// as the idle timeout.
fn idle_transport(idle: Duration) -> Arc<TransportConfig> {
    let mut t = TransportConfig::default();
    t.keep_alive_interval(Some(idle / 3));
    t.max_idle_timeout(IdleTimeout::try_from(idle).ok());
    t.max_concurrent_bidi_streams(VarInt::from_u32(1024));
    t.max_concurrent_uni_streams(VarInt::from_u32(64));
    Arc::new(t)
}

type Slot = Arc<tokio::sync::Mutex<Option<Peer>>>;

/// A QUIC endpoint: accepts authenticated peers (when built with
/// [`Endpoint::server`]) and dials others, caching one connection per
/// (address, ALPN).
pub struct Endpoint {
    quic: quinn::Endpoint,
    identity: Option<TlsIdentity>,
    transport: Arc<TransportConfig>,
    accepted: Option<tokio::sync::Mutex<mpsc::Receiver<Peer>>>,
    accept_task: Option<JoinHandle<()>>,
    pool: Mutex<HashMap<(SocketAddr, Vec<u8>), Slot>>,
    /// Transport settings for connections this endpoint dials on some ALPNs
    /// ([`Endpoint::with_dial_idle_timeout`]); `transport` for the others.
    dial_transports: Vec<(Vec<u8>, Arc<TransportConfig>)>,
    protocol: u32,
}

impl std::fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Endpoint")
            .field("local_addr", &self.quic.local_addr().ok())
            .field("serving", &self.accepted.is_some())
            .finish_non_exhaustive()
    }
}

impl Endpoint {
    /// Binds `addr` and serves `services`; the same endpoint also dials.
    ///
    /// Must be called inside a Tokio runtime.
    pub fn server(
        addr: SocketAddr,
        identity: &NodeIdentity,
        services: Vec<Service>,
    ) -> Result<Endpoint, EndpointError> {
        let tls_identity = TlsIdentity::from_node(identity)?;
        let alpns: Vec<Vec<u8>> = services.iter().map(|s| s.alpn.clone()).collect();
        let tls = tls::server_config(&tls_identity, &alpns)?;
        let crypto =
            QuicServerConfig::try_from(tls).map_err(|e| EndpointError::Config(e.to_string()))?;
        let transport = transport_config();
        let mut config = quinn::ServerConfig::with_crypto(Arc::new(crypto));
        config.transport_config(transport.clone());
        let quic = quinn::Endpoint::server(config, addr)
            .map_err(|source| EndpointError::Bind { addr, source })?;

        let (tx, rx) = mpsc::channel(64);
        let accept_task = tokio::spawn(accept_loop(quic.clone(), Arc::new(services), tx));
        Ok(Endpoint {
            quic,
            identity: Some(tls_identity),
            transport,
            accepted: Some(tokio::sync::Mutex::new(rx)),
            accept_task: Some(accept_task),
            pool: Mutex::default(),
            dial_transports: Vec::new(),
            protocol: PROTOCOL_VERSION,
        })
    }

    /// A dial-only endpoint with a cluster identity, bound to `bind`
    /// (usually [`unspecified_for`] the peers' address family).
    pub fn client(identity: &NodeIdentity, bind: SocketAddr) -> Result<Endpoint, EndpointError> {
        let mut endpoint = Endpoint::anonymous(bind)?;
        endpoint.identity = Some(TlsIdentity::from_node(identity)?);
        Ok(endpoint)
    }

    /// A dial-only endpoint without a certificate: it can only [`Endpoint::dial_pinned`].
    pub fn anonymous(bind: SocketAddr) -> Result<Endpoint, EndpointError> {
        let quic = quinn::Endpoint::client(bind)
            .map_err(|source| EndpointError::Bind { addr: bind, source })?;
        Ok(Endpoint {
            quic,
            identity: None,
            transport: transport_config(),
            accepted: None,
            accept_task: None,
            pool: Mutex::default(),
            dial_transports: Vec::new(),
            protocol: PROTOCOL_VERSION,
        })
    }

    /// Connections this endpoint dials count a peer silent for `idle` as gone
    /// (keep-alives every third of it). The idle timeout is the smaller of
    /// both sides', so an agent can notice a dead leader in seconds without
    /// changing how servers talk among themselves.
    pub fn with_idle_timeout(mut self, idle: Duration) -> Endpoint {
        self.transport = idle_transport(idle);
        self
    }

    /// Like [`Endpoint::with_idle_timeout`], for the connections this
    /// endpoint dials on `alpn` only. Servers use it for Raft: a peer's
    /// connection is cached, and a peer that was SIGKILLed and restarted is a
    /// new process that cannot reset the old connection (its stateless-reset
    /// key is new), so without it the old connection would swallow Raft RPCs
    /// for the whole default idle timeout (10 s), and an election that needs
    /// that peer's vote would wait as long.
    pub fn with_dial_idle_timeout(mut self, alpn: &[u8], idle: Duration) -> Endpoint {
        self.dial_transports.retain(|(a, _)| a != alpn);
        self.dial_transports
            .push((alpn.to_vec(), idle_transport(idle)));
        self
    }

    /// Test hook: speak another protocol version when dialling.
    #[cfg(test)]
    pub(crate) fn set_protocol_version(&mut self, protocol: u32) {
        self.protocol = protocol;
    }

    /// The bound UDP address (with the real port when bound to port 0).
    pub fn local_addr(&self) -> Result<SocketAddr, EndpointError> {
        self.quic.local_addr().map_err(|_| EndpointError::Closed)
    }

    /// The next authenticated peer, or `None` once the endpoint is closed (or
    /// if it was not built as a server).
    pub async fn accept(&self) -> Option<Peer> {
        let rx = self.accepted.as_ref()?;
        rx.lock().await.recv().await
    }

    /// Returns a live connection to `addr` on `alpn`, dialling if there is none.
    ///
    /// The server must present a certificate from our cluster CA naming one of
    /// `expect`. Concurrent callers for the same (addr, alpn) share one dial.
    pub async fn dial(
        &self,
        addr: SocketAddr,
        alpn: &[u8],
        expect: &[Role],
    ) -> Result<Peer, EndpointError> {
        let slot = {
            let mut pool = self.pool.lock().unwrap_or_else(|p| p.into_inner());
            pool.entry((addr, alpn.to_vec())).or_default().clone()
        };
        let mut cached = slot.lock().await;
        if let Some(peer) = cached.as_ref() {
            if peer.conn.close_reason().is_none() {
                return match &peer.identity {
                    Some((role, _)) if expect.contains(role) => Ok(peer.clone()),
                    Some((role, name)) => Err(EndpointError::UnexpectedRole {
                        addr,
                        role: *role,
                        name: name.clone(),
                    }),
                    None => Err(EndpointError::Closed),
                };
            }
        }
        let identity = self.identity.as_ref().ok_or(EndpointError::NoIdentity)?;
        let (tls, check) = tls::member_client_config(identity, alpn, expect)?;
        let peer = self.connect(tls, check, addr, alpn).await?;
        *cached = Some(peer.clone());
        Ok(peer)
    }

    /// Dials `addr` on `alpn` without a client certificate, trusting the server
    /// only if its chain carries the CA with this fingerprint. Not cached.
    pub async fn dial_pinned(
        &self,
        addr: SocketAddr,
        alpn: &[u8],
        ca_fingerprint: &str,
        expect: &[Role],
    ) -> Result<Peer, EndpointError> {
        let (tls, check) = tls::pinned_client_config(ca_fingerprint, alpn, expect)?;
        self.connect(tls, check.clone(), addr, alpn)
            .await
            .map_err(|err| match check.wrong_ca() {
                Some(found) => EndpointError::WrongCluster {
                    addr,
                    expected: ca_fingerprint.to_ascii_lowercase(),
                    found,
                },
                None => err,
            })
    }

    /// Closes every connection and stops accepting.
    pub fn close(&self) {
        self.quic.close(code(close::NORMAL), b"shutting down");
    }

    /// Waits until every connection is closed and its close has been sent.
    pub async fn wait_idle(&self) {
        self.quic.wait_idle().await;
    }

    fn quinn_client_config(
        &self,
        tls: rustls::ClientConfig,
        alpn: &[u8],
    ) -> Result<quinn::ClientConfig, EndpointError> {
        let crypto =
            QuicClientConfig::try_from(tls).map_err(|e| EndpointError::Config(e.to_string()))?;
        let mut config = quinn::ClientConfig::new(Arc::new(crypto));
        let transport = self
            .dial_transports
            .iter()
            .find(|(a, _)| a == alpn)
            .map_or(&self.transport, |(_, t)| t);
        config.transport_config(transport.clone());
        Ok(config)
    }

    /// Dials, completes the handshake and the Hello. `check` tells in our own
    /// words why our verifier refused the server, if it did.
    async fn connect(
        &self,
        tls: rustls::ClientConfig,
        check: PeerCheck,
        addr: SocketAddr,
        alpn: &[u8],
    ) -> Result<Peer, EndpointError> {
        let config = self.quinn_client_config(tls, alpn)?;
        let connecting = self
            .quic
            .connect_with(config, addr, SERVER_NAME)
            .map_err(|e| EndpointError::Unreachable {
                addr,
                reason: e.to_string(),
            })?;
        let conn = connecting.await.map_err(|e| match check.objection() {
            Some(reason) => EndpointError::Rejected { addr, reason },
            None => connection_failed(addr, e),
        })?;
        hello::client_hello(&conn, addr, self.protocol).await?;
        // The verifier already parsed and checked the server's identity.
        let identity = peer_certificate(&conn).and_then(|der| pki::peer_identity(&der).ok());
        Ok(Peer {
            conn,
            alpn: alpn.to_vec(),
            identity,
            remote: addr,
        })
    }
}

impl Drop for Endpoint {
    fn drop(&mut self) {
        if let Some(task) = self.accept_task.take() {
            task.abort();
        }
        self.quic.close(code(close::NORMAL), b"shutting down");
    }
}

/// The unspecified address (port 0) of `peer`'s family: where to bind a
/// dial-only endpoint.
pub fn unspecified_for(peer: SocketAddr) -> SocketAddr {
    match peer {
        SocketAddr::V4(_) => SocketAddr::from((Ipv4Addr::UNSPECIFIED, 0)),
        SocketAddr::V6(_) => SocketAddr::from((Ipv6Addr::UNSPECIFIED, 0)),
    }
}

/// The peer's leaf certificate, if it presented one.
fn peer_certificate(conn: &quinn::Connection) -> Option<CertificateDer<'static>> {
    let any = conn.peer_identity()?;
    let chain = any.downcast::<Vec<CertificateDer<'static>>>().ok()?;
    chain.into_iter().next()
}

async fn accept_loop(quic: quinn::Endpoint, services: Arc<Vec<Service>>, tx: mpsc::Sender<Peer>) {
    while let Some(incoming) = quic.accept().await {
        let services = services.clone();
        let tx = tx.clone();
        tokio::spawn(async move {
            let remote = incoming.remote_address();
            match admit(incoming, &services).await {
                Ok(peer) => {
                    tracing::debug!(peer = %peer.describe(), alpn = %String::from_utf8_lossy(&peer.alpn), "accepted connection");
                    if tx.send(peer).await.is_err() {
                        tracing::debug!(%remote, "endpoint no longer accepting; dropping connection");
                    }
                }
                Err(err) => tracing::warn!(%remote, "refused connection: {err}"),
            }
        });
    }
}

/// Completes the handshake, enforces the service's admission rule and the
/// Hello exchange. On refusal, the connection is closed with a reason.
async fn admit(incoming: quinn::Incoming, services: &[Service]) -> Result<Peer, EndpointError> {
    let remote = incoming.remote_address();
    let conn = incoming
        .accept()
        .map_err(|e| connection_failed(remote, e))?
        .await
        .map_err(|e| connection_failed(remote, e))?;
    let refuse = |c: u32, reason: String| {
        conn.close(code(c), reason.as_bytes());
        EndpointError::Refused {
            addr: remote,
            code: u64::from(c),
            reason,
        }
    };

    let alpn = conn
        .handshake_data()
        .and_then(|d| d.downcast::<HandshakeData>().ok())
        .and_then(|d| d.protocol)
        .unwrap_or_default();
    let Some(service) = services.iter().find(|s| s.alpn == alpn) else {
        return Err(refuse(
            close::UNKNOWN_PROTOCOL,
            "no protocol (ALPN) this endpoint serves".into(),
        ));
    };
    let identity = match peer_certificate(&conn) {
        Some(der) => match pki::peer_identity(&der) {
            Ok(identity) => Some(identity),
            Err(e) => return Err(refuse(close::CERT_REQUIRED, e.to_string())),
        },
        None => None,
    };
    let protocol_name = String::from_utf8_lossy(&alpn).into_owned();
    if let Admit::Members(roles) = &service.admit {
        match &identity {
            None => {
                return Err(refuse(
                    close::CERT_REQUIRED,
                    format!(
                        "{protocol_name} needs a client certificate from this cluster's CA; \
                         join the cluster first"
                    ),
                ))
            }
            Some((role, name)) if !roles.contains(role) => {
                return Err(refuse(
                    close::ROLE_NOT_ALLOWED,
                    format!("{name} has role {role}, which may not use {protocol_name}"),
                ))
            }
            Some(_) => {}
        }
    }

    match tokio::time::timeout(hello::HELLO_TIMEOUT, hello::server_hello(&conn, remote)).await {
        Ok(Ok(())) => {}
        Ok(Err(err)) => return Err(err),
        Err(_) => {
            return Err(refuse(
                close::BAD_HELLO,
                "no protocol greeting within 10 s".to_string(),
            ))
        }
    }
    Ok(Peer {
        conn,
        alpn,
        identity,
        remote,
    })
}
