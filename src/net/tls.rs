//! rustls configurations for gpuq's QUIC endpoints: TLS 1.3 only, `ring` only.
//!
//! Trust is the cluster CA and nothing else. Members are dialled by address, so
//! the client side ignores the dialled name and instead checks that the server's
//! chain leads to the cluster CA and that its certificate names an expected
//! role. The server side verifies client certificates against the same CA; a
//! client certificate is optional at the TLS layer only so that a daemon that
//! has not joined yet can reach the join protocol: the endpoint closes any
//! other protocol opened without one (see `endpoint`). A joining daemon has no
//! CA yet; it pins the CA by the fingerprint its join token carries.
//!
//! The crypto provider is passed to every builder explicitly; nothing installs a
//! process-wide default that another part of the process could clash with.
//! Session resumption is off: connections are long-lived and cached, and a full
//! handshake on each one keeps every connection's peer certificate checked.

use std::sync::{Arc, Mutex};

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::Resumption;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::server::{NoServerSessionStorage, ParsedCertificate, WebPkiClientVerifier};
use rustls::{
    CertificateError, ClientConfig, DigitallySignedStruct, OtherError, RootCertStore, ServerConfig,
    SignatureScheme,
};
use rustls_pki_types::pem::PemObject;

use super::pki::{self, NodeIdentity, PkiError};
use crate::model::Role;

/// Why a TLS configuration could not be built, or a peer was not trusted.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// The node identity's PEM material is unusable.
    #[error("the node identity cannot be used for TLS: {0}")]
    Identity(#[from] PkiError),
    /// The node key is not a PKCS#8 / SEC1 private key.
    #[error("the node key is not a usable private key: {0}")]
    BadKey(String),
    /// rustls refused the configuration.
    #[error("could not configure TLS: {0}")]
    Rustls(#[from] rustls::Error),
    /// The client-certificate verifier could not be built.
    #[error("could not set up client certificate checks: {0}")]
    Verifier(#[from] rustls::server::VerifierBuilderError),
    /// The join token's CA fingerprint is not 64 hex digits.
    #[error("the pinned CA fingerprint {0:?} is not 64 hex digits; copy the join token again")]
    BadFingerprint(String),
    /// The peer's certificate is valid but names a role this connection does not accept.
    #[error("the peer is {name:?} with role {role}, but only {expected} may serve this protocol")]
    UnexpectedRole {
        /// The role in the peer's certificate.
        role: Role,
        /// The node name in the peer's certificate.
        name: String,
        /// The roles that would have been accepted, comma-separated.
        expected: String,
    },
    /// The server's chain does not contain the pinned CA.
    #[error(
        "the server's CA has fingerprint {found}, not the {expected} of the join token: \
         this address belongs to another cluster (or something is impersonating it)"
    )]
    WrongCa {
        /// The fingerprint the token pins.
        expected: String,
        /// The fingerprint the server presented.
        found: String,
    },
}

/// The one crypto provider gpuq uses.
pub fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// A node identity parsed into what rustls wants: chain `[leaf, ca]`, key, roots.
#[derive(Debug)]
pub struct TlsIdentity {
    chain: Vec<CertificateDer<'static>>,
    key: PrivateKeyDer<'static>,
    roots: Arc<RootCertStore>,
}

impl Clone for TlsIdentity {
    fn clone(&self) -> Self {
        TlsIdentity {
            chain: self.chain.clone(),
            key: self.key.clone_key(),
            roots: self.roots.clone(),
        }
    }
}

impl TlsIdentity {
    /// Parses `identity`'s PEM material.
    pub fn from_node(identity: &NodeIdentity) -> Result<TlsIdentity, TlsError> {
        let leaf = pki::cert_der("node certificate", &identity.cert_pem)?;
        let ca = pki::cert_der("CA certificate", &identity.ca_cert_pem)?;
        let key = PrivateKeyDer::from_pem_slice(identity.key_pem.as_bytes())
            .map_err(|e| TlsError::BadKey(e.to_string()))?;
        let mut roots = RootCertStore::empty();
        roots.add(ca.clone())?;
        Ok(TlsIdentity {
            chain: vec![leaf, ca],
            key,
            roots: Arc::new(roots),
        })
    }
}

/// Server side: presents `[leaf, ca]`, verifies client certificates against the
/// cluster CA, and lets clients without a certificate through the TLS layer
/// (the endpoint admits those to the join protocol only).
pub fn server_config(identity: &TlsIdentity, alpns: &[Vec<u8>]) -> Result<ServerConfig, TlsError> {
    let provider = provider();
    let verifier =
        WebPkiClientVerifier::builder_with_provider(identity.roots.clone(), provider.clone())
            .allow_unauthenticated()
            .build()?;
    let mut config = ServerConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])?
        .with_client_cert_verifier(verifier)
        .with_single_cert(identity.chain.clone(), identity.key.clone_key())?;
    config.alpn_protocols = alpns.to_vec();
    config.session_storage = Arc::new(NoServerSessionStorage {});
    config.send_tls13_tickets = 0;
    Ok(config)
}

/// Client side for members: presents our certificate, trusts a server whose
/// chain leads to the cluster CA and whose certificate names one of `expect`.
/// Use a fresh config per dial: its [`PeerCheck`] explains a refusal.
pub fn member_client_config(
    identity: &TlsIdentity,
    alpn: &[u8],
    expect: &[Role],
) -> Result<(ClientConfig, PeerCheck), TlsError> {
    let provider = provider();
    let check = PeerCheck::default();
    let verifier = Arc::new(ServerVerifier {
        trust: Trust::ClusterCa(identity.roots.clone()),
        provider: provider.clone(),
        expect: expect.to_vec(),
        check: check.clone(),
    });
    let mut config = ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])?
        .dangerous()
        .with_custom_certificate_verifier(verifier)
        .with_client_auth_cert(identity.chain.clone(), identity.key.clone_key())?;
    config.alpn_protocols = vec![alpn.to_vec()];
    config.resumption = Resumption::disabled();
    Ok((config, check))
}

/// What our verifier objected to in a failed handshake, in our own words
/// (rustls only passes on a debug rendering). One per dial.
#[derive(Clone, Debug, Default)]
pub struct PeerCheck(Arc<Mutex<Option<Objection>>>);

#[derive(Clone, Debug)]
struct Objection {
    message: String,
    wrong_ca: Option<String>,
}

impl PeerCheck {
    /// Why the verifier refused the server, if it did.
    pub fn objection(&self) -> Option<String> {
        self.get().map(|o| o.message)
    }

    /// The fingerprint of the CA the server presented, if it was not the pinned one.
    pub fn wrong_ca(&self) -> Option<String> {
        self.get().and_then(|o| o.wrong_ca)
    }

    fn get(&self) -> Option<Objection> {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Records `err` and turns it into the error rustls wants.
    fn object(&self, err: TlsError) -> rustls::Error {
        let wrong_ca = match &err {
            TlsError::WrongCa { found, .. } => Some(found.clone()),
            _ => None,
        };
        let objection = Objection {
            message: err.to_string(),
            wrong_ca,
        };
        *self.0.lock().unwrap_or_else(|p| p.into_inner()) = Some(objection);
        rustls::Error::InvalidCertificate(CertificateError::Other(OtherError(Arc::new(err))))
    }

    /// Records a rustls verification error as is.
    fn note(&self, err: rustls::Error) -> rustls::Error {
        let objection = Objection {
            message: format!("the server's certificate is not from this cluster's CA ({err})"),
            wrong_ca: None,
        };
        *self.0.lock().unwrap_or_else(|p| p.into_inner()) = Some(objection);
        err
    }

    /// Reads the leaf's identity and checks its role is expected.
    fn check_role(&self, leaf: &CertificateDer<'_>, expect: &[Role]) -> Result<(), rustls::Error> {
        let (role, name) = pki::peer_identity(leaf).map_err(|e| self.object(e.into()))?;
        if expect.contains(&role) {
            return Ok(());
        }
        let expected = expect
            .iter()
            .map(|r| r.as_str())
            .collect::<Vec<_>>()
            .join(", ");
        Err(self.object(TlsError::UnexpectedRole {
            role,
            name,
            expected,
        }))
    }
}

/// Client side without a certificate (a daemon that has not joined): trusts the
/// server iff its chain carries a CA with SHA-256 `ca_fingerprint` (hex), the
/// leaf verifies against that CA, and names one of `expect`.
/// The [`PeerCheck`] tells a wrong cluster from other failures.
pub fn pinned_client_config(
    ca_fingerprint: &str,
    alpn: &[u8],
    expect: &[Role],
) -> Result<(ClientConfig, PeerCheck), TlsError> {
    let pinned = ca_fingerprint.to_ascii_lowercase();
    if pinned.len() != 64 || !pinned.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(TlsError::BadFingerprint(ca_fingerprint.to_string()));
    }
    let provider = provider();
    let check = PeerCheck::default();
    let verifier = Arc::new(ServerVerifier {
        trust: Trust::Pinned(pinned),
        provider: provider.clone(),
        expect: expect.to_vec(),
        check: check.clone(),
    });
    let mut config = ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])?
        .dangerous()
        .with_custom_certificate_verifier(verifier)
        .with_no_client_auth();
    config.alpn_protocols = vec![alpn.to_vec()];
    config.resumption = Resumption::disabled();
    Ok((config, check))
}

/// Which CA a server's chain must lead to.
#[derive(Debug)]
enum Trust {
    /// The cluster CA this member holds.
    ClusterCa(Arc<RootCertStore>),
    /// A CA pinned by SHA-256 fingerprint (lowercase hex) that the server's
    /// chain must carry: the join handshake, before we hold the CA.
    Pinned(String),
}

/// The client's check of a server: its chain leads to the trusted CA (the
/// dialled name is ignored) and its certificate names an expected role.
#[derive(Debug)]
struct ServerVerifier {
    trust: Trust,
    provider: Arc<CryptoProvider>,
    expect: Vec<Role>,
    check: PeerCheck,
}

impl ServerVerifier {
    /// The root store for a pinned CA: the chain's certificate with the
    /// pinned fingerprint, or [`TlsError::WrongCa`] naming the one it had.
    fn pinned_roots(
        &self,
        pinned: &str,
        intermediates: &[CertificateDer<'_>],
    ) -> Result<RootCertStore, rustls::Error> {
        let Some(ca) = intermediates
            .iter()
            .find(|c| pki::fingerprint_der(c.as_ref()) == pinned)
        else {
            let found = intermediates
                .last()
                .map(|c| pki::fingerprint_der(c.as_ref()))
                .unwrap_or_else(|| "(none: the server sent no CA certificate)".to_string());
            return Err(self.check.object(TlsError::WrongCa {
                expected: pinned.to_string(),
                found,
            }));
        };
        let mut roots = RootCertStore::empty();
        roots.add(ca.clone().into_owned())?;
        Ok(roots)
    }
}

impl ServerCertVerifier for ServerVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        // A pinned CA is the anchor itself, so no intermediates remain.
        let (roots, intermediates) = match &self.trust {
            Trust::ClusterCa(roots) => (roots.clone(), intermediates),
            Trust::Pinned(pinned) => (Arc::new(self.pinned_roots(pinned, intermediates)?), &[][..]),
        };
        let cert = ParsedCertificate::try_from(end_entity).map_err(|e| self.check.note(e))?;
        rustls::client::verify_server_cert_signed_by_trust_anchor(
            &cert,
            &roots,
            intermediates,
            now,
            self.provider.signature_verification_algorithms.all,
        )
        .map_err(|e| self.check.note(e))?;
        self.check.check_role(end_entity, &self.expect)?;
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}
