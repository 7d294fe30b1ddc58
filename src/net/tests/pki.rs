//! Tests of the cluster PKI: issuing, CSR signing, identities, files.

use std::fs;
use std::os::unix::fs::PermissionsExt;

use base64::Engine;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::CertificateSigningRequestDer;
use sha2::{Digest, Sha256};

use crate::model::Role;
use crate::net::pki::*;

fn ca() -> ClusterCa {
    ClusterCa::generate("test").expect("CA")
}

#[test]
fn issued_identity_names_its_role_and_node_and_verifies() {
    let ca = ca();
    let id = ca.issue(Role::Agent, "gpu-001.rack1").expect("issue");
    assert_eq!(
        id.verify().expect("verify"),
        (Role::Agent, "gpu-001.rack1".to_string())
    );
    assert_eq!(
        id.ca_fingerprint().expect("fp"),
        ca.fingerprint().expect("fp")
    );
}

#[test]
fn fingerprint_is_hex_sha256_of_the_ca_der() {
    let ca = ca();
    let fp = ca.fingerprint().expect("fp");
    let der = cert_der("CA", &ca.cert_pem).expect("der");
    assert_eq!(fp, hex::encode(Sha256::digest(der.as_ref())));
    assert_eq!(fp.len(), 64);
    assert_ne!(
        fp,
        ClusterCa::generate("test")
            .expect("other")
            .fingerprint()
            .expect("fp")
    );
}

#[test]
fn sign_csr_uses_the_servers_identity_not_the_csrs() {
    let ca = ca();
    // The CSR claims to be a server called "evil".
    let (key_pem, csr_pem) = generate_csr(Role::Server, "evil").expect("csr");
    let cert_pem = ca
        .sign_csr(&csr_pem, Role::Agent, "gpu01", 30)
        .expect("sign");
    let id = NodeIdentity {
        key_pem,
        cert_pem,
        ca_cert_pem: ca.cert_pem.clone(),
    };
    // verify() also proves the certificate carries the CSR's public key.
    assert_eq!(
        id.verify().expect("verify"),
        (Role::Agent, "gpu01".to_string())
    );
    let (_, cert) =
        x509_parser::parse_x509_certificate(cert_der("cert", &id.cert_pem).expect("der").as_ref())
            .map(|(r, c)| (r.to_vec(), c.subject().to_string()))
            .expect("parse");
    assert!(!cert.contains("evil"), "{cert}");
}

#[test]
fn sign_csr_rejects_a_csr_whose_signature_does_not_verify() {
    let ca = ca();
    let (_, csr_pem) = generate_csr(Role::Agent, "a1").expect("csr");
    let mut der = CertificateSigningRequestDer::from_pem_slice(csr_pem.as_bytes())
        .expect("der")
        .as_ref()
        .to_vec();
    // Flip a bit in the last byte of the ECDSA signature: still parses, no longer verifies.
    let last = der.len() - 1;
    der[last] ^= 0x01;
    let b64 = base64::engine::general_purpose::STANDARD.encode(&der);
    let tampered =
        format!("-----BEGIN CERTIFICATE REQUEST-----\n{b64}\n-----END CERTIFICATE REQUEST-----\n");
    let err = ca.sign_csr(&tampered, Role::Agent, "a1", 30).unwrap_err();
    assert!(matches!(err, PkiError::BadCsr { .. }), "{err}");
    let err = ca.sign_csr("not a csr", Role::Agent, "a1", 30).unwrap_err();
    assert!(matches!(err, PkiError::BadCsr { .. }), "{err}");
}

#[test]
fn bad_names_and_validities_are_refused() {
    let ca = ca();
    for name in ["", "-a", "a.", "has space", "a/b", "ünï", &"x".repeat(254)] {
        assert!(
            matches!(
                ca.issue(Role::Agent, name),
                Err(PkiError::BadNodeName { .. })
            ),
            "{name:?}"
        );
    }
    let (_, csr) = generate_csr(Role::Agent, "a1").expect("csr");
    for days in [0, MAX_CERT_DAYS + 1] {
        assert!(matches!(
            ca.sign_csr(&csr, Role::Agent, "a1", days),
            Err(PkiError::BadValidity { .. })
        ));
    }
}

#[test]
fn a_certificate_from_another_ca_does_not_verify() {
    let ours = ca();
    let theirs = ClusterCa::generate("other").expect("other CA");
    let mut id = theirs.issue(Role::Server, "s1").expect("issue");
    id.ca_cert_pem = ours.cert_pem.clone();
    assert!(matches!(id.verify(), Err(PkiError::Mismatch(_))));
    let mut id = ours.issue(Role::Server, "s1").expect("issue");
    id.key_pem = ours.issue(Role::Server, "s1").expect("issue").key_pem;
    assert!(matches!(id.verify(), Err(PkiError::Mismatch(_))));
}

#[test]
fn a_certificate_without_gpuq_uri_has_no_identity() {
    let plain = rcgen::generate_simple_self_signed(vec!["host".to_string()]).expect("cert");
    assert!(matches!(
        peer_identity(plain.cert.der()),
        Err(PkiError::NoIdentity)
    ));
    assert!(matches!(
        peer_identity(b"garbage"),
        Err(PkiError::BadCert { .. })
    ));
}

#[test]
fn identity_uris_parse_strictly() {
    assert_eq!(
        parse_identity_uri("gpuq://login/l1").expect("ok"),
        (Role::Login, "l1".into())
    );
    for bad in [
        "gpuq://admin/x",
        "gpuq://agent",
        "gpuq://agent/",
        "gpuq://agent/a/b",
    ] {
        assert!(
            matches!(parse_identity_uri(bad), Err(PkiError::BadIdentity { .. })),
            "{bad}"
        );
    }
}

#[test]
fn save_and_load_round_trip_with_a_private_key_file() {
    let dir = tempfile::tempdir().expect("tempdir");
    let id = ca().issue(Role::Server, "s1").expect("issue");
    let path = dir.path().join("identity");
    id.save(&path).expect("save");
    let mode = fs::metadata(path.join(KEY_FILE))
        .expect("meta")
        .permissions()
        .mode()
        & 0o777;
    assert_eq!(mode, 0o600);
    assert_eq!(NodeIdentity::load(&path).expect("load"), id);
    // Saving again replaces the files.
    id.save(&path).expect("save again");

    fs::set_permissions(path.join(KEY_FILE), fs::Permissions::from_mode(0o644)).expect("chmod");
    assert!(matches!(
        NodeIdentity::load(&path),
        Err(PkiError::KeyTooOpen { .. })
    ));
    assert!(matches!(
        NodeIdentity::load(&dir.path().join("none")),
        Err(PkiError::Io { .. })
    ));
}
