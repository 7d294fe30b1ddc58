//! Forming a cluster of N servers started at once, with no hand-made order:
//! `gpuq server --bootstrap-expect 3 --peers A,B,C` and a shared secret on
//! every one of them.
//!
//! The lowest peer address (the seed) bootstraps as `--bootstrap` would; the
//! others join it through the ordinary join protocol with a secret derived
//! from the shared one, then ask to become voters. Nobody knows the CA in
//! advance, so the pinning a token gives is replaced by proofs of the shared
//! secret bound to the CA:
//!
//! 1. The joiner dials the seed and reads its CA fingerprint F from the TLS
//!    handshake (a dial pinned to no CA fails naming the CA it found).
//! 2. It sends, as the join secret, HMAC(secret, "join" ‖ F): only a server
//!    whose CA is F accepts it, so a man in the middle with its own CA learns
//!    nothing it could replay to the real seed.
//! 3. The seed answers with the certificate and HMAC(secret, "seed" ‖ F ‖
//!    cert): the joiner trusts F only if that proof checks out, and from then
//!    on it pins F like any token would.
//!
//! The seed admits such joins only while the membership has fewer than N
//! voters; after that, servers join with server tokens.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use sha2::{Digest, Sha256};

use crate::model::Role;
use crate::net::endpoint::{unspecified_for, Endpoint, ALPN_JOIN};
use crate::net::error::EndpointError;
use crate::net::join::JoinError;
use crate::net::pki::NodeIdentity;
use crate::net::token::{hashes_equal, JoinToken};

/// The token id a bootstrap join uses (no token record has it: ids are random).
pub const BOOT_TOKEN_ID: &str = "boot00";

/// Shorter secrets are refused: the secret is all that keeps strangers out.
pub const MIN_SECRET_LEN: usize = 16;

/// How this server takes part in forming the cluster.
#[derive(Clone, Debug)]
pub struct BootstrapPlan {
    /// The number of voters to form.
    pub expect: usize,
    /// Every server's advertised address, this one's included.
    pub peers: Vec<SocketAddr>,
    /// The shared secret.
    pub secret: String,
}

impl BootstrapPlan {
    /// Checks the plan against this server's advertised address.
    pub fn check(&self, me: SocketAddr) -> anyhow::Result<()> {
        if self.expect == 0 {
            bail!("--bootstrap-expect must be at least 1");
        }
        if self.peers.len() != self.expect {
            bail!(
                "--bootstrap-expect {} but --peers lists {} address(es) ({}): list every server \
                 that forms the cluster, this one included",
                self.expect,
                self.peers.len(),
                list(&self.peers)
            );
        }
        if !self.peers.contains(&me) {
            bail!(
                "--peers ({}) does not contain this server's address {me}: list the address \
                 each server advertises (set --advertise to the one the others dial)",
                list(&self.peers)
            );
        }
        if self.secret.trim().len() < MIN_SECRET_LEN {
            bail!(
                "the bootstrap secret has {} character(s); use at least {MIN_SECRET_LEN} \
                 (e.g. the output of `openssl rand -hex 16`), the same on every server",
                self.secret.trim().len()
            );
        }
        Ok(())
    }

    /// The server that creates the cluster: the lowest address.
    pub fn seed(&self) -> SocketAddr {
        *self
            .peers
            .iter()
            .min()
            .expect("checked: peers is not empty")
    }
}

fn list(peers: &[SocketAddr]) -> String {
    peers
        .iter()
        .map(|p| p.to_string())
        .collect::<Vec<_>>()
        .join(",")
}

/// HMAC-SHA256 (RFC 2104).
pub fn hmac_sha256(key: &[u8], msg: &[u8]) -> [u8; 32] {
    let mut block = [0u8; 64];
    if key.len() > 64 {
        block[..32].copy_from_slice(&Sha256::digest(key));
    } else {
        block[..key.len()].copy_from_slice(key);
    }
    let mut inner = Sha256::new();
    inner.update(block.map(|b| b ^ 0x36));
    inner.update(msg);
    let mut outer = Sha256::new();
    outer.update(block.map(|b| b ^ 0x5c));
    outer.update(inner.finalize());
    outer.finalize().into()
}

/// The join secret for a seed whose CA has fingerprint `ca_fp`.
pub fn join_secret(secret: &str, ca_fp: &str) -> String {
    hex::encode(hmac_sha256(
        secret.trim().as_bytes(),
        format!("gpuq-boot join {ca_fp}").as_bytes(),
    ))
}

/// The seed's proof that it knows the secret, over its CA and the issued cert.
pub fn seed_proof(secret: &str, ca_fp: &str, cert_pem: &str) -> String {
    hex::encode(hmac_sha256(
        secret.trim().as_bytes(),
        format!("gpuq-boot seed {ca_fp} {cert_pem}").as_bytes(),
    ))
}

/// The seed's side: whether `offered` is the join secret for our CA.
pub fn admits(secret: &str, ca_fp: &str, offered: &str) -> bool {
    hashes_equal(&join_secret(secret, ca_fp), offered)
}

/// Reads the CA fingerprint the server at `seed` presents.
async fn seed_ca(seed: SocketAddr) -> Result<String, String> {
    let endpoint = Endpoint::anonymous(unspecified_for(seed)).map_err(|e| e.to_string())?;
    let none = "0".repeat(64);
    match endpoint
        .dial_pinned(seed, ALPN_JOIN, &none, &[Role::Server])
        .await
    {
        Err(EndpointError::WrongCluster { found, .. }) => Ok(found),
        Ok(_) => Err("the seed presented no CA".into()),
        Err(e) => Err(e.to_string()),
    }
}

/// The joiner's side: joins the seed, retrying while it is not up yet.
pub async fn join_seed(plan: &BootstrapPlan, name: &str) -> anyhow::Result<NodeIdentity> {
    let seed = plan.seed();
    let deadline = Instant::now() + Duration::from_secs(600);
    loop {
        let why = match seed_ca(seed).await {
            Err(e) => e,
            Ok(ca_fp) => {
                let token = JoinToken {
                    id: BOOT_TOKEN_ID.into(),
                    secret: join_secret(&plan.secret, &ca_fp),
                    ca_fingerprint: ca_fp.clone(),
                };
                match crate::net::join::join_with_proof(seed, &token, Role::Server, name).await {
                    Ok((identity, proof)) => {
                        let expected = seed_proof(&plan.secret, &ca_fp, &identity.cert_pem);
                        if !proof.is_some_and(|p| hashes_equal(&p, &expected)) {
                            bail!(
                                "the seed {seed} signed this server's certificate but could not \
                                 prove it knows the bootstrap secret: it is not the cluster's seed"
                            );
                        }
                        return Ok(identity);
                    }
                    Err(JoinError::Refused { reason }) if !reason.contains("initialising") => {
                        bail!("the seed {seed} refused this server: {reason}")
                    }
                    Err(e) => e.to_string(),
                }
            }
        };
        if Instant::now() > deadline {
            return Err(anyhow::anyhow!(why))
                .with_context(|| format!("the seed {seed} did not admit this server in 10 min"));
        }
        tracing::info!(%seed, reason = %why, "waiting for the seed server to form the cluster");
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hmac_matches_rfc_4231_case_2() {
        let mac = hmac_sha256(b"Jefe", b"what do ya want for nothing?");
        assert_eq!(
            hex::encode(mac),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
    }

    #[test]
    fn plans_that_cannot_form_a_cluster_are_refused() {
        let a: SocketAddr = "10.0.0.1:7420".parse().unwrap();
        let b: SocketAddr = "10.0.0.2:7420".parse().unwrap();
        let plan = |expect, peers: Vec<SocketAddr>, secret: &str| BootstrapPlan {
            expect,
            peers,
            secret: secret.into(),
        };
        let good = "0123456789abcdef";
        assert!(plan(2, vec![b, a], good).check(a).is_ok());
        assert_eq!(plan(2, vec![b, a], good).seed(), a);
        let e = plan(3, vec![a, b], good).check(a).unwrap_err().to_string();
        assert!(
            e.contains("--bootstrap-expect 3 but --peers lists 2"),
            "{e}"
        );
        let c: SocketAddr = "10.0.0.3:7420".parse().unwrap();
        let e = plan(2, vec![a, b], good).check(c).unwrap_err().to_string();
        assert!(e.contains("does not contain this server's address"), "{e}");
        let e = plan(2, vec![a, b], "short")
            .check(a)
            .unwrap_err()
            .to_string();
        assert!(e.contains("at least 16"), "{e}");
    }

    #[test]
    fn a_join_secret_is_bound_to_the_ca() {
        let s = "0123456789abcdef";
        let real = join_secret(s, "aa");
        assert!(admits(s, "aa", &real));
        assert!(!admits(s, "bb", &real));
        assert!(!admits("another-secret-000", "aa", &real));
    }
}
