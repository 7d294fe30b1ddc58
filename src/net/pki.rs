//! The cluster PKI: one CA per cluster, one key pair and certificate per daemon.
//!
//! The first server creates the [`ClusterCa`]; its key lives in the replicated
//! state so any server can sign. A daemon's key pair is generated where it will
//! be used and never travels: a joining daemon sends only a CSR, and the server
//! copies nothing from it but the public key. The identity (role and node name)
//! in the certificate is what the *server* decided, written into the SAN as the
//! URI `gpuq://<role>/<name>` plus a DNS name `<name>`; [`peer_identity`] reads
//! it back on the other end of a connection.
//!
//! All keys are ECDSA P-256, signed with the `ring` backend of rcgen.

use std::fs;
use std::io::{self, Write};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rcgen::{
    BasicConstraints, CertificateParams, CertificateSigningRequestParams, DistinguishedName,
    DnType, ExtendedKeyUsagePurpose, Ia5String, IsCa, KeyPair, KeyUsagePurpose, SanType,
    SerialNumber, PKCS_ECDSA_P256_SHA256,
};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::CertificateDer;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use x509_parser::extensions::GeneralName;

use crate::model::Role;

/// How long a node certificate is valid unless the caller says otherwise.
pub const DEFAULT_CERT_DAYS: u32 = 365;
/// How long the cluster CA is valid.
pub const CA_VALIDITY_DAYS: u32 = 3650;
/// The longest validity `sign_csr` accepts.
pub const MAX_CERT_DAYS: u32 = 36500;

/// File names of a daemon's identity inside its data directory.
pub const KEY_FILE: &str = "node.key";
/// See [`KEY_FILE`].
pub const CERT_FILE: &str = "node.crt";
/// See [`KEY_FILE`].
pub const CA_FILE: &str = "ca.crt";

const URI_PREFIX: &str = "gpuq://";

/// Why a key, certificate or CSR could not be made, read or trusted.
#[derive(Debug, thiserror::Error)]
pub enum PkiError {
    /// rcgen refused to build a key, certificate or CSR.
    #[error("could not create a {what}: {source}")]
    Generate {
        /// What was being made ("CA certificate", "node key", ...).
        what: &'static str,
        /// The underlying error.
        #[source]
        source: rcgen::Error,
    },
    /// A PEM document did not contain what it should.
    #[error("the {what} is not valid PEM: {reason}")]
    BadPem {
        /// Which document ("CA certificate", "node key", ...).
        what: &'static str,
        /// What was wrong.
        reason: String,
    },
    /// A DER certificate could not be parsed.
    #[error("the {what} is not a valid X.509 certificate: {reason}")]
    BadCert {
        /// Which certificate.
        what: &'static str,
        /// What was wrong.
        reason: String,
    },
    /// The CSR could not be parsed or its self-signature does not verify.
    #[error(
        "the certificate signing request is invalid ({reason}); generate a new one with gpuq itself"
    )]
    BadCsr {
        /// What was wrong.
        reason: String,
    },
    /// A node name that cannot appear in a certificate.
    #[error("node name {name:?} is not usable: {reason}")]
    BadNodeName {
        /// The name given.
        name: String,
        /// Why not.
        reason: &'static str,
    },
    /// A validity outside 1..=MAX_CERT_DAYS.
    #[error("a certificate validity of {days} days is not allowed; use 1 to {MAX_CERT_DAYS} days")]
    BadValidity {
        /// The validity asked for.
        days: u32,
    },
    /// The certificate carries no `gpuq://<role>/<name>` URI.
    #[error(
        "the certificate names no gpuq identity (no gpuq://<role>/<name> URI in its SAN); \
         it was not issued by a gpuq cluster CA"
    )]
    NoIdentity,
    /// The certificate's gpuq URI does not parse.
    #[error("the certificate's identity URI {uri:?} is malformed: {reason}")]
    BadIdentity {
        /// The URI found.
        uri: String,
        /// Why it does not parse.
        reason: &'static str,
    },
    /// The node certificate does not belong with the key or the CA next to it.
    #[error("the node identity is inconsistent: {0}; delete it and join the cluster again")]
    Mismatch(&'static str),
    /// A file of the identity could not be read or written.
    #[error("could not {action} {}: {source}", path.display())]
    Io {
        /// "read" or "write".
        action: &'static str,
        /// The file concerned.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: io::Error,
    },
    /// The private key file can be read by other users.
    #[error(
        "{} is readable by other users (mode {mode:o}); run `chmod 600 {}`",
        path.display(),
        path.display()
    )]
    KeyTooOpen {
        /// The key file.
        path: PathBuf,
        /// Its permission bits.
        mode: u32,
    },
}

fn gen_err(what: &'static str) -> impl FnOnce(rcgen::Error) -> PkiError {
    move |source| PkiError::Generate { what, source }
}

/// The cluster certificate authority. Lives in the replicated state (servers only).
#[derive(Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct ClusterCa {
    /// The self-signed CA certificate, PEM.
    pub cert_pem: String,
    /// The CA's private key, PKCS#8 PEM. Never leaves the servers.
    pub key_pem: String,
}

impl std::fmt::Debug for ClusterCa {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClusterCa")
            .field("cert_pem", &self.cert_pem)
            .finish_non_exhaustive()
    }
}

impl ClusterCa {
    /// Creates a new CA for the cluster called `cluster_name`.
    pub fn generate(cluster_name: &str) -> Result<ClusterCa, PkiError> {
        let key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256).map_err(gen_err("CA key"))?;
        let mut params = CertificateParams::default();
        let mut dn = DistinguishedName::new();
        dn.push(
            DnType::CommonName,
            format!("gpuq cluster CA {cluster_name}"),
        );
        dn.push(DnType::OrganizationName, "gpuq");
        params.distinguished_name = dn;
        params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        params.serial_number = Some(random_serial());
        set_validity(&mut params, CA_VALIDITY_DAYS);
        let cert = params
            .self_signed(&key)
            .map_err(gen_err("CA certificate"))?;
        Ok(ClusterCa {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        })
    }

    /// Hex SHA-256 of the CA certificate's DER: what join tokens pin.
    pub fn fingerprint(&self) -> Result<String, PkiError> {
        cert_fingerprint(&self.cert_pem)
    }

    /// Generates a key pair here and certifies it: for the bootstrap server itself
    /// (and for tests). Joining daemons use [`generate_csr`] + [`ClusterCa::sign_csr`].
    pub fn issue(&self, role: Role, name: &str) -> Result<NodeIdentity, PkiError> {
        validate_node_name(name)?;
        let key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256).map_err(gen_err("node key"))?;
        let cert_pem = self.certify(&key, role, name, DEFAULT_CERT_DAYS)?;
        Ok(NodeIdentity {
            key_pem: key.serialize_pem(),
            cert_pem,
            ca_cert_pem: self.cert_pem.clone(),
        })
    }

    /// Signs a joining daemon's CSR as `role`/`name`, valid for `validity_days`.
    ///
    /// Only the CSR's public key is used (after checking the CSR's
    /// self-signature, which proves the requester holds the private key); its
    /// subject and SANs are ignored, so the identity is the one the server chose.
    pub fn sign_csr(
        &self,
        csr_pem: &str,
        role: Role,
        name: &str,
        validity_days: u32,
    ) -> Result<String, PkiError> {
        validate_node_name(name)?;
        // from_pem verifies the CSR's signature with its own public key.
        let csr =
            CertificateSigningRequestParams::from_pem(csr_pem).map_err(|e| PkiError::BadCsr {
                reason: e.to_string(),
            })?;
        self.certify(&csr.public_key, role, name, validity_days)
    }

    fn certify(
        &self,
        public_key: &impl rcgen::PublicKeyData,
        role: Role,
        name: &str,
        validity_days: u32,
    ) -> Result<String, PkiError> {
        if validity_days == 0 || validity_days > MAX_CERT_DAYS {
            return Err(PkiError::BadValidity {
                days: validity_days,
            });
        }
        let ca_key = KeyPair::from_pem(&self.key_pem).map_err(|e| PkiError::BadPem {
            what: "CA key",
            reason: e.to_string(),
        })?;
        // rcgen signs with a `Certificate`; rebuilding it from the stored PEM keeps
        // the issuer name and key identifier byte-for-byte those of the real CA.
        let ca_params =
            CertificateParams::from_ca_cert_pem(&self.cert_pem).map_err(|e| PkiError::BadCert {
                what: "CA certificate",
                reason: e.to_string(),
            })?;
        let ca_cert = ca_params
            .self_signed(&ca_key)
            .map_err(gen_err("CA signer"))?;

        let mut params = node_params(role, name)?;
        params.serial_number = Some(random_serial());
        params.use_authority_key_identifier_extension = true;
        set_validity(&mut params, validity_days);
        let cert = params
            .signed_by(public_key, &ca_cert, &ca_key)
            .map_err(gen_err("node certificate"))?;
        Ok(cert.pem())
    }
}

/// The parameters that make a node certificate (or CSR) say `role`/`name`.
fn node_params(role: Role, name: &str) -> Result<CertificateParams, PkiError> {
    let uri = Ia5String::try_from(identity_uri(role, name)).map_err(gen_err("identity URI"))?;
    let dns = Ia5String::try_from(name).map_err(gen_err("DNS name"))?;
    let mut params = CertificateParams::default();
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, name);
    dn.push(DnType::OrganizationalUnitName, role.as_str());
    params.distinguished_name = dn;
    params.subject_alt_names = vec![SanType::URI(uri), SanType::DnsName(dns)];
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    // Every daemon both dials and accepts connections.
    params.extended_key_usages = vec![
        ExtendedKeyUsagePurpose::ServerAuth,
        ExtendedKeyUsagePurpose::ClientAuth,
    ];
    Ok(params)
}

/// The SAN URI that names a daemon: `gpuq://<role>/<name>`.
pub fn identity_uri(role: Role, name: &str) -> String {
    format!("{URI_PREFIX}{role}/{name}")
}

/// Generates a key pair and a CSR for `role`/`name`: what a joining daemon sends.
///
/// Returns `(key_pem, csr_pem)`. The key stays on this machine.
pub fn generate_csr(role: Role, name: &str) -> Result<(String, String), PkiError> {
    validate_node_name(name)?;
    let key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256).map_err(gen_err("node key"))?;
    let csr = node_params(role, name)?
        .serialize_request(&key)
        .map_err(gen_err("certificate signing request"))?;
    let csr_pem = csr.pem().map_err(gen_err("certificate signing request"))?;
    Ok((key.serialize_pem(), csr_pem))
}

/// Checks that `name` can be a node name in certificates, URIs and tables.
pub fn validate_node_name(name: &str) -> Result<(), PkiError> {
    let bad = |reason| {
        Err(PkiError::BadNodeName {
            name: name.to_string(),
            reason,
        })
    };
    if name.is_empty() || name.len() > 253 {
        return bad("it must have 1 to 253 characters");
    }
    if !name
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.')
    {
        return bad("it may contain only letters, digits, '-' and '.' (a host name)");
    }
    let first_last_ok = |b: Option<u8>| b.is_some_and(|b| b.is_ascii_alphanumeric());
    if !first_last_ok(name.bytes().next()) || !first_last_ok(name.bytes().last()) {
        return bad("it must start and end with a letter or digit");
    }
    Ok(())
}

/// Reads the gpuq identity (`gpuq://<role>/<name>` SAN URI) out of a DER certificate.
///
/// This does not check who signed the certificate: TLS verification does that
/// before this is called on a peer's certificate.
pub fn peer_identity(cert_der: &[u8]) -> Result<(Role, String), PkiError> {
    let cert = parse_cert("peer certificate", cert_der)?;
    let san = cert
        .subject_alternative_name()
        .map_err(|e| PkiError::BadCert {
            what: "peer certificate",
            reason: e.to_string(),
        })?
        .ok_or(PkiError::NoIdentity)?;
    let mut uris = san.value.general_names.iter().filter_map(|n| match n {
        GeneralName::URI(u) if u.starts_with(URI_PREFIX) => Some(*u),
        _ => None,
    });
    let uri = uris.next().ok_or(PkiError::NoIdentity)?;
    if uris.next().is_some() {
        return Err(PkiError::BadIdentity {
            uri: uri.to_string(),
            reason: "the certificate names more than one gpuq identity",
        });
    }
    parse_identity_uri(uri)
}

pub(super) fn parse_identity_uri(uri: &str) -> Result<(Role, String), PkiError> {
    let bad = |reason| PkiError::BadIdentity {
        uri: uri.to_string(),
        reason,
    };
    let rest = uri
        .strip_prefix(URI_PREFIX)
        .ok_or_else(|| bad("it does not start with gpuq://"))?;
    let (role, name) = rest
        .split_once('/')
        .ok_or_else(|| bad("expected gpuq://<role>/<name>"))?;
    let role = Role::parse(role).ok_or_else(|| bad("unknown role"))?;
    validate_node_name(name).map_err(|_| bad("invalid node name"))?;
    Ok((role, name.to_string()))
}

/// Hex SHA-256 of a DER certificate.
pub fn fingerprint_der(der: &[u8]) -> String {
    hex::encode(Sha256::digest(der))
}

/// Hex SHA-256 of the first certificate in a PEM document.
pub fn cert_fingerprint(cert_pem: &str) -> Result<String, PkiError> {
    Ok(fingerprint_der(&cert_der("certificate", cert_pem)?))
}

/// The DER of the first certificate in `pem`; `what` names it in errors.
pub fn cert_der(what: &'static str, pem: &str) -> Result<CertificateDer<'static>, PkiError> {
    CertificateDer::from_pem_slice(pem.as_bytes()).map_err(|e| PkiError::BadPem {
        what,
        reason: e.to_string(),
    })
}

/// A daemon's credentials: its private key, its certificate and the cluster CA.
#[derive(Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct NodeIdentity {
    /// The daemon's private key, PKCS#8 PEM.
    pub key_pem: String,
    /// The daemon's certificate, PEM, signed by the cluster CA.
    pub cert_pem: String,
    /// The cluster CA certificate, PEM.
    pub ca_cert_pem: String,
}

impl std::fmt::Debug for NodeIdentity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeIdentity")
            .field("cert_pem", &self.cert_pem)
            .field("ca_cert_pem", &self.ca_cert_pem)
            .finish_non_exhaustive()
    }
}

impl NodeIdentity {
    /// The role and node name this identity's certificate carries.
    pub fn identity(&self) -> Result<(Role, String), PkiError> {
        peer_identity(&cert_der("node certificate", &self.cert_pem)?)
    }

    /// Hex SHA-256 of the cluster CA certificate.
    pub fn ca_fingerprint(&self) -> Result<String, PkiError> {
        cert_fingerprint(&self.ca_cert_pem)
    }

    /// Checks that the certificate is for this key and signed by this CA, and
    /// returns the identity it names.
    pub fn verify(&self) -> Result<(Role, String), PkiError> {
        let key = KeyPair::from_pem(&self.key_pem).map_err(|e| PkiError::BadPem {
            what: "node key",
            reason: e.to_string(),
        })?;
        let leaf_der = cert_der("node certificate", &self.cert_pem)?;
        let ca_der = cert_der("CA certificate", &self.ca_cert_pem)?;
        let leaf = parse_cert("node certificate", &leaf_der)?;
        let ca = parse_cert("CA certificate", &ca_der)?;
        if leaf.public_key().raw != key.public_key_der().as_slice() {
            return Err(PkiError::Mismatch(
                "the certificate is not for this private key",
            ));
        }
        leaf.verify_signature(Some(ca.public_key()))
            .map_err(|_| PkiError::Mismatch("the certificate is not signed by the cluster CA"))?;
        peer_identity(&leaf_der)
    }

    /// Writes `node.key`, `node.crt` and `ca.crt` into `dir`, creating it if
    /// needed. Each file is replaced atomically, and each is 0600: the
    /// certificates are public, but a daemon's data dir holds nothing another
    /// user may read, which keeps the rule one that a test can check.
    pub fn save(&self, dir: &Path) -> Result<(), PkiError> {
        fs::create_dir_all(dir).map_err(|source| PkiError::Io {
            action: "create",
            path: dir.to_path_buf(),
            source,
        })?;
        write_atomic(&dir.join(KEY_FILE), self.key_pem.as_bytes(), 0o600)?;
        write_atomic(&dir.join(CERT_FILE), self.cert_pem.as_bytes(), 0o600)?;
        write_atomic(&dir.join(CA_FILE), self.ca_cert_pem.as_bytes(), 0o600)?;
        Ok(())
    }

    /// Reads an identity saved by [`NodeIdentity::save`] and checks it hangs together.
    pub fn load(dir: &Path) -> Result<NodeIdentity, PkiError> {
        let key_path = dir.join(KEY_FILE);
        let meta = fs::metadata(&key_path).map_err(|source| PkiError::Io {
            action: "read",
            path: key_path.clone(),
            source,
        })?;
        let mode = meta.permissions().mode() & 0o777;
        if mode & 0o077 != 0 {
            return Err(PkiError::KeyTooOpen {
                path: key_path,
                mode,
            });
        }
        let read = |path: PathBuf| {
            fs::read_to_string(&path).map_err(|source| PkiError::Io {
                action: "read",
                path,
                source,
            })
        };
        let identity = NodeIdentity {
            key_pem: read(key_path.clone())?,
            cert_pem: read(dir.join(CERT_FILE))?,
            ca_cert_pem: read(dir.join(CA_FILE))?,
        };
        identity.verify()?;
        Ok(identity)
    }
}

fn parse_cert<'a>(
    what: &'static str,
    der: &'a [u8],
) -> Result<x509_parser::certificate::X509Certificate<'a>, PkiError> {
    x509_parser::parse_x509_certificate(der)
        .map(|(_, c)| c)
        .map_err(|e| PkiError::BadCert {
            what,
            reason: e.to_string(),
        })
}

fn write_atomic(path: &Path, contents: &[u8], mode: u32) -> Result<(), PkiError> {
    let io_err = |source| PkiError::Io {
        action: "write",
        path: path.to_path_buf(),
        source,
    };
    let tmp = path.with_extension("tmp");
    let _ = fs::remove_file(&tmp);
    let mut file = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(&tmp)
        .map_err(io_err)?;
    file.write_all(contents).map_err(io_err)?;
    file.sync_all().map_err(io_err)?;
    fs::rename(&tmp, path).map_err(io_err)?;
    Ok(())
}

/// A random positive 16-byte serial number.
fn random_serial() -> SerialNumber {
    use rand::RngCore;
    let mut bytes = [0u8; 16];
    rand::rngs::OsRng.fill_bytes(&mut bytes);
    bytes[0] &= 0x7f;
    SerialNumber::from_slice(&bytes)
}

/// Makes `params` valid for `days` from now, backdated an hour to tolerate
/// clock skew between machines. (Writing the fields in place keeps us from
/// naming rcgen's date type, so gpuq needs no direct `time` dependency.)
fn set_validity(params: &mut CertificateParams, days: u32) {
    let since_epoch = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    let now = rcgen::date_time_ymd(1970, 1, 1) + since_epoch;
    params.not_before = now - Duration::from_secs(3600);
    params.not_after = now + Duration::from_secs(u64::from(days) * 86_400);
}
