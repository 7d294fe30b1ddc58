//! Why a QUIC endpoint could not be set up or a connection not made, and the
//! application close codes both sides of a connection agree on.
//!
//! The endpoint and the opening Hello exchange both fail with these errors, so
//! they live apart from either, low in the room: each variant is a sentence a
//! user can act on, and [`connection_failed`] turns quinn's connection errors
//! into one.

use std::net::SocketAddr;

use quinn::{ConnectionError, VarInt};

use super::tls::TlsError;
use crate::model::Role;

/// Application error codes of a closed connection.
pub mod close {
    /// Orderly close.
    pub const NORMAL: u32 = 0;
    /// The protocol needs a client certificate and none was presented.
    pub const CERT_REQUIRED: u32 = 1;
    /// The client's certificate names a role this protocol does not admit.
    pub const ROLE_NOT_ALLOWED: u32 = 2;
    /// The two sides speak different protocol versions.
    pub const PROTOCOL_MISMATCH: u32 = 3;
    /// The client did not open with a valid Hello.
    pub const BAD_HELLO: u32 = 4;
    /// No ALPN, or one this endpoint does not serve.
    pub const UNKNOWN_PROTOCOL: u32 = 5;
}

pub(super) fn code(c: u32) -> VarInt {
    VarInt::from_u32(c)
}

/// Why an endpoint could not be set up, or a connection not made.
#[derive(Debug, thiserror::Error)]
pub enum EndpointError {
    /// The UDP socket could not be bound.
    #[error("could not listen on UDP {addr}: {source}; is another gpuq already using that port?")]
    Bind {
        /// The address asked for.
        addr: SocketAddr,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// TLS material or configuration problem.
    #[error(transparent)]
    Tls(#[from] TlsError),
    /// QUIC refused the TLS configuration.
    #[error("could not configure QUIC: {0}")]
    Config(String),
    /// This endpoint has no certificate, so it can only join.
    #[error("this daemon has no cluster certificate yet; join the cluster first (gpuq join)")]
    NoIdentity,
    /// The peer did not answer (timeout, no route, nothing listening).
    #[error(
        "could not reach {addr}: {reason}; check the address, that gpuq runs there, \
         and that its UDP port is open"
    )]
    Unreachable {
        /// The address dialled.
        addr: SocketAddr,
        /// What went wrong.
        reason: String,
    },
    /// The TLS handshake failed: one side did not trust the other.
    #[error("the secure handshake with {addr} failed: {reason}")]
    Rejected {
        /// The peer's address.
        addr: SocketAddr,
        /// What went wrong (often the peer's own words).
        reason: String,
    },
    /// The peer accepted TLS but closed the connection, saying why.
    #[error("{addr} closed the connection: {reason}")]
    Refused {
        /// The peer's address.
        addr: SocketAddr,
        /// The application close code (see [`close`]).
        code: u64,
        /// The peer's reason.
        reason: String,
    },
    /// The server's CA is not the one the join token pins.
    #[error(
        "{addr} belongs to another cluster: its CA fingerprint is {found} but the join token \
         pins {expected}; check that the token comes from this cluster"
    )]
    WrongCluster {
        /// The server's address.
        addr: SocketAddr,
        /// The fingerprint the token pins.
        expected: String,
        /// The fingerprint the server presented.
        found: String,
    },
    /// The two sides speak different protocol versions.
    #[error(
        "protocol version mismatch with {addr}: this gpuq {ours_build} speaks protocol {ours}, \
         the peer (gpuq {theirs_build}) speaks protocol {theirs}; upgrade the older one"
    )]
    ProtocolMismatch {
        /// The peer's address.
        addr: SocketAddr,
        /// Our protocol version.
        ours: u32,
        /// Our build.
        ours_build: String,
        /// The peer's protocol version.
        theirs: u32,
        /// The peer's build.
        theirs_build: String,
    },
    /// The Hello exchange broke off.
    #[error("the opening handshake with {addr} failed: {reason}")]
    BadHello {
        /// The peer's address.
        addr: SocketAddr,
        /// What went wrong.
        reason: String,
    },
    /// A cached connection leads to a peer of a role the caller does not expect.
    #[error("{addr} is {name:?} with role {role}, which is not what this call expects")]
    UnexpectedRole {
        /// The peer's address.
        addr: SocketAddr,
        /// The peer's role.
        role: Role,
        /// The peer's node name.
        name: String,
    },
    /// The endpoint was closed.
    #[error("the network endpoint is shutting down")]
    Closed,
}

/// Turns a failed connection into the error a user can act on.
pub(super) fn connection_failed(addr: SocketAddr, err: ConnectionError) -> EndpointError {
    match err {
        ConnectionError::ApplicationClosed(ac) => EndpointError::Refused {
            addr,
            code: ac.error_code.into_inner(),
            reason: String::from_utf8_lossy(&ac.reason).into_owned(),
        },
        ConnectionError::ConnectionClosed(cc) => EndpointError::Rejected {
            addr,
            reason: if cc.reason.is_empty() {
                cc.error_code.to_string()
            } else {
                format!("the peer says: {}", String::from_utf8_lossy(&cc.reason))
            },
        },
        ConnectionError::TransportError(te) => EndpointError::Rejected {
            addr,
            reason: te.to_string(),
        },
        ConnectionError::LocallyClosed => EndpointError::Closed,
        other => EndpointError::Unreachable {
            addr,
            reason: other.to_string(),
        },
    }
}
