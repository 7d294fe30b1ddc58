//! The network room: QUIC endpoints with mutual TLS, the cluster PKI and join
//! tokens, the one frame codec, and typed request/response on top.
//!
//! Layering, bottom up: [`frame`] (length-prefixed MessagePack, also used on
//! unix sockets) -> [`pki`] (CA, node certificates, identities in the SAN) ->
//! [`tls`] (rustls configs: trust is the cluster CA) -> [`error`] (what a
//! connection can fail with, and the close codes) -> [`endpoint`] (QUIC,
//! per-ALPN admission, connection cache; [`hello`] checks protocol versions)
//! -> [`rpc`] (one stream per request) -> [`mod@join`] (getting a certificate
//! with a [`token::JoinToken`]). [`local`] is the daemon's unix-socket API for
//! the CLI; [`proto`] and [`agent_proto`] are the client API and agent sync messages; [`stdio`] is what interactive streams carry once a request opens one. The message types of each protocol belong to the
//! modules that speak them; this room only carries them.

pub mod agent_proto;
pub mod endpoint;
pub mod error;
pub mod frame;
pub mod hello;
pub mod join;
pub mod local;
pub mod pki;
pub mod proto;
pub mod rpc;
pub mod stdio;
pub mod tls;
pub mod token;

pub use endpoint::{Admit, Endpoint, Peer, Service, ALPN_AGENT, ALPN_API, ALPN_JOIN, ALPN_RAFT};
pub use error::EndpointError;
pub use frame::{read_frame, write_frame, FrameError, DEFAULT_MAX_FRAME};
pub use hello::PROTOCOL_VERSION;
pub use join::{join, serve_join, JoinAuthority, JoinError, JoinRequest, JoinResponse};
pub use pki::{generate_csr, peer_identity, ClusterCa, NodeIdentity, PkiError};
pub use rpc::{call, serve, RpcError};
pub use token::{JoinToken, TokenError};

#[cfg(test)]
mod tests;
