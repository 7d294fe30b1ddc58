//! The join protocol (`ALPN_JOIN`): how a daemon without a certificate gets one.
//!
//! The joining daemon generates its key pair locally, dials a server without a
//! client certificate and trusts it only if its chain carries the CA whose
//! fingerprint the join token pins; only then does it send the token's secret
//! and a CSR. The server checks the token and signs through a
//! [`JoinAuthority`], which it implements over its token store; the identity in
//! the certificate is whatever the authority decides, never what the CSR
//! claims. The private key never leaves the joining machine.

use std::net::SocketAddr;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::endpoint::{unspecified_for, Endpoint, Peer, ALPN_JOIN};
use super::error::EndpointError;
use super::pki::{self, NodeIdentity, PkiError};
use super::rpc::{self, RpcError};
use super::token::JoinToken;
use crate::model::Role;

/// Cap on a join request or response frame.
pub const JOIN_MAX_FRAME: usize = 64 << 10;

/// What a joining daemon sends.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JoinRequest {
    /// The token's public id.
    pub token_id: String,
    /// The token's secret (the server compares its hash).
    pub secret: String,
    /// The role the daemon asks to join as.
    pub role: Role,
    /// The node name the daemon asks for.
    pub name: String,
    /// A PEM CSR for the daemon's locally generated key.
    pub csr_pem: String,
}

impl std::fmt::Debug for JoinRequest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JoinRequest")
            .field("token_id", &self.token_id)
            .field("secret", &"<redacted>")
            .field("role", &self.role)
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

/// The server's answer.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum JoinResponse {
    /// Admitted: the signed certificate and the CA that signed it.
    Ok {
        /// The daemon's new certificate, PEM.
        cert_pem: String,
        /// The cluster CA certificate, PEM.
        ca_cert_pem: String,
        /// For a bootstrap join (no token pins the CA): the server's proof
        /// that it knows the shared secret (see `server::boot`).
        #[serde(default)]
        proof: Option<String>,
    },
    /// Not admitted, and why (shown to the operator as is).
    Refused {
        /// The reason.
        reason: String,
    },
}

/// The server's side of admission: checks the token and signs the CSR.
#[async_trait::async_trait]
pub trait JoinAuthority: Send + Sync + 'static {
    /// Returns the signed certificate (PEM) or a reason for the operator.
    async fn admit(&self, req: &JoinRequest, from: SocketAddr) -> Result<String, String>;

    /// A proof to send along with `cert_pem` (bootstrap joins only).
    fn proof(&self, _req: &JoinRequest, _cert_pem: &str) -> Option<String> {
        None
    }
}

/// Why joining failed.
#[derive(Debug, thiserror::Error)]
pub enum JoinError {
    /// The local key or CSR could not be made.
    #[error("could not prepare this node's key: {0}")]
    Pki(#[from] PkiError),
    /// The server could not be reached.
    #[error(
        "could not reach the server at {addr}: {reason}; check the address, that gpuq server \
         runs there and that its UDP port is open"
    )]
    Unreachable {
        /// The server address.
        addr: SocketAddr,
        /// What went wrong.
        reason: String,
    },
    /// The server's CA is not the one the token pins.
    #[error(
        "the server at {addr} belongs to another cluster (wrong cluster): its CA fingerprint \
         is {found}, the token pins {expected}; use a token from the cluster at that address"
    )]
    WrongCluster {
        /// The server address.
        addr: SocketAddr,
        /// The pinned fingerprint.
        expected: String,
        /// The server's fingerprint.
        found: String,
    },
    /// The server refused admission.
    #[error("the server refused to admit this node: {reason}")]
    Refused {
        /// The server's reason.
        reason: String,
    },
    /// Another connection failure.
    #[error(transparent)]
    Endpoint(EndpointError),
    /// The request failed in flight.
    #[error(transparent)]
    Rpc(#[from] RpcError),
    /// The server's answer cannot be used.
    #[error("the server's answer is unusable: {0}")]
    BadResponse(String),
}

impl From<EndpointError> for JoinError {
    fn from(err: EndpointError) -> JoinError {
        match err {
            EndpointError::WrongCluster {
                addr,
                expected,
                found,
            } => JoinError::WrongCluster {
                addr,
                expected,
                found,
            },
            EndpointError::Unreachable { addr, reason } => JoinError::Unreachable { addr, reason },
            other => JoinError::Endpoint(other),
        }
    }
}

/// Joins the cluster at `addr` as `role`/`name` with `token`, and returns the
/// new identity (not yet saved).
pub async fn join(
    addr: SocketAddr,
    token: &JoinToken,
    role: Role,
    name: &str,
) -> Result<NodeIdentity, JoinError> {
    join_with_proof(addr, token, role, name)
        .await
        .map(|(identity, _)| identity)
}

/// Like [`join`], and returns the server's proof, if it sent one.
pub async fn join_with_proof(
    addr: SocketAddr,
    token: &JoinToken,
    role: Role,
    name: &str,
) -> Result<(NodeIdentity, Option<String>), JoinError> {
    let (key_pem, csr_pem) = pki::generate_csr(role, name)?;
    let endpoint = Endpoint::anonymous(unspecified_for(addr))?;
    let peer = endpoint
        .dial_pinned(addr, ALPN_JOIN, &token.ca_fingerprint, &[Role::Server])
        .await?;
    let req = JoinRequest {
        token_id: token.id.clone(),
        secret: token.secret.clone(),
        role,
        name: name.to_string(),
        csr_pem,
    };
    let resp: JoinResponse = rpc::call(&peer.conn, &req, JOIN_MAX_FRAME).await?;
    peer.conn.close(0u32.into(), b"joined");
    let (cert_pem, ca_cert_pem, proof) = match resp {
        JoinResponse::Ok {
            cert_pem,
            ca_cert_pem,
            proof,
        } => (cert_pem, ca_cert_pem, proof),
        JoinResponse::Refused { reason } => return Err(JoinError::Refused { reason }),
    };
    let ca_fp =
        pki::cert_fingerprint(&ca_cert_pem).map_err(|e| JoinError::BadResponse(e.to_string()))?;
    if ca_fp != token.ca_fingerprint {
        return Err(JoinError::BadResponse(format!(
            "it sent CA {ca_fp}, not the pinned {}",
            token.ca_fingerprint
        )));
    }
    let identity = NodeIdentity {
        key_pem,
        cert_pem,
        ca_cert_pem,
    };
    identity
        .verify()
        .map_err(|e| JoinError::BadResponse(e.to_string()))?;
    Ok((identity, proof))
}

/// Serves join requests on `peer` until the connection closes, admitting
/// through `authority`; `ca_cert_pem` goes back with every certificate.
pub async fn serve_join(
    peer: Peer,
    authority: Arc<dyn JoinAuthority>,
    ca_cert_pem: String,
) -> quinn::ConnectionError {
    let ca_cert_pem = Arc::new(ca_cert_pem);
    rpc::serve(
        peer,
        move |peer: Arc<Peer>, req: JoinRequest| {
            let authority = authority.clone();
            let ca_cert_pem = ca_cert_pem.clone();
            async move {
                match authority.admit(&req, peer.remote).await {
                    Ok(cert_pem) => {
                        tracing::info!(name = %req.name, role = %req.role, token = %req.token_id, from = %peer.remote, "admitted a node");
                        let proof = authority.proof(&req, &cert_pem);
                        JoinResponse::Ok { cert_pem, ca_cert_pem: ca_cert_pem.as_ref().clone(), proof }
                    }
                    Err(reason) => {
                        tracing::warn!(name = %req.name, role = %req.role, token = %req.token_id, from = %peer.remote, "refused to admit a node: {reason}");
                        JoinResponse::Refused { reason }
                    }
                }
            }
        },
        JOIN_MAX_FRAME,
    )
    .await
}
