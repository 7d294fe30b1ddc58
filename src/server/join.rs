//! Admission of joining daemons (`gpuq-join/1`): the token is checked against
//! the replicated token records (hash, expiry, revocation, role), then the
//! daemon's CSR is signed with the cluster CA for the identity the server
//! decides, never the one the CSR claims.

use crate::clock::now_ms;
use crate::model::Role;
use std::net::SocketAddr;
use std::sync::Arc;

use crate::net::join::{JoinAuthority, JoinRequest};
use crate::net::pki::ClusterCa;
use crate::state::Command;

use super::Api;

/// How long an issued node certificate is valid.
const CERT_VALIDITY_DAYS: u32 = 3650;

fn valid_node_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 63
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_' || c == '.')
}

/// Checks a join request and, when it is admissible, returns the certificate.
pub fn check(
    api: &Api,
    boot: Option<&BootWindow>,
    req: &JoinRequest,
    now: u64,
) -> Result<String, String> {
    if !valid_node_name(&req.name) {
        return Err(format!(
            "node name {:?} is not valid: use 1-63 letters, digits, '-', '_' or '.'",
            req.name
        ));
    }
    let state = api.state();
    let cluster = state
        .cluster
        .as_ref()
        .ok_or("the cluster is still initialising: retry in a moment")?;
    match boot {
        Some(window) if req.token_id == super::boot::BOOT_TOKEN_ID => check_boot(api, window, req)?,
        _ => check_token(&state, req, now)?,
    }
    if req.role == Role::Server {
        if let Some(why) = super::members::name_taken(api, &req.name, None) {
            return Err(why);
        }
    }
    // A compute node's name is its identity: a second machine joining
    // under a registered name would take over its tasks at the first
    // agent's next restart. Only an admin's `gpuq node replace` lets it.
    if req.role == Role::Agent {
        if let Some(node) = state.nodes.get(&req.name) {
            if !node.replace_allowed {
                return Err(format!(
                    "node {} is registered already: if this machine replaces it, an admin runs \
                     `gpuq node replace {}` on a server first; otherwise pick another --node-name",
                    req.name, req.name
                ));
            }
        }
    }
    let ca = ClusterCa {
        cert_pem: cluster.ca_cert_pem.clone(),
        key_pem: cluster.ca_key_pem.clone(),
    };
    ca.sign_csr(&req.csr_pem, req.role, &req.name, CERT_VALIDITY_DAYS)
        .map_err(|e| format!("the certificate request was refused: {e}"))
}

/// A token's checks: known, secret, not revoked or expired, the right role.
fn check_token(state: &crate::state::State, req: &JoinRequest, now: u64) -> Result<(), String> {
    let token = state.tokens.get(&req.token_id).ok_or_else(|| {
        format!(
            "token {} is not known to this cluster: create one with `gpuq token create`",
            req.token_id
        )
    })?;
    let offered = crate::net::token::secret_sha256(&req.secret);
    if !crate::net::token::hashes_equal(&offered, &token.secret_sha256) {
        return Err(format!("token {}: the secret does not match", token.id));
    }
    if token.revoked {
        return Err(format!("token {} was revoked", token.id));
    }
    if token.used_up() {
        return Err(format!(
            "token {} has been used as many times as it allows ({}): create a new one",
            token.id, token.uses
        ));
    }
    if now >= token.expires_at {
        return Err(format!(
            "token {} expired {} s ago: create a new one with `gpuq token create`",
            token.id,
            (now - token.expires_at) / 1000
        ));
    }
    let admitted = match token.role {
        Role::Server => req.role == Role::Server,
        Role::Agent | Role::Login => matches!(req.role, Role::Agent | Role::Login),
    };
    if !admitted {
        return Err(format!(
            "token {} is for {} daemons; {} cannot join with it",
            token.id, token.role, req.role
        ));
    }
    Ok(())
}

/// While a `--bootstrap-expect` cluster forms, the seed admits servers that
/// prove the shared secret (see `server::boot`).
pub struct BootWindow {
    pub secret: String,
    pub expect: usize,
}

fn check_boot(api: &Api, window: &BootWindow, req: &JoinRequest) -> Result<(), String> {
    let voters = api
        .metrics()
        .borrow()
        .membership_config
        .membership()
        .voter_ids()
        .count();
    if voters >= window.expect {
        return Err(format!(
            "the cluster has formed ({voters} voters): join it with a server token \
             (`gpuq token create --role server`)"
        ));
    }
    if req.role != Role::Server {
        return Err("the bootstrap secret admits servers only".into());
    }
    let ca_fp = crate::net::pki::cert_fingerprint(&api.ca_cert_pem()).map_err(|e| e.to_string())?;
    if !super::boot::admits(&window.secret, &ca_fp, &req.secret) {
        return Err(
            "the bootstrap secret does not match the seed's: give every server the same one".into(),
        );
    }
    Ok(())
}

/// The server's join authority.
pub struct Admission {
    pub api: Arc<Api>,
    pub boot: Option<Arc<BootWindow>>,
}

#[async_trait::async_trait]
impl JoinAuthority for Admission {
    async fn admit(&self, req: &JoinRequest, from: SocketAddr) -> Result<String, String> {
        admit(&self.api, self.boot.as_deref(), req, from).await
    }

    fn proof(&self, req: &JoinRequest, cert_pem: &str) -> Option<String> {
        let window = self.boot.as_ref()?;
        if req.token_id != super::boot::BOOT_TOKEN_ID {
            return None;
        }
        let ca_fp = crate::net::pki::cert_fingerprint(&self.api.ca_cert_pem()).ok()?;
        Some(super::boot::seed_proof(&window.secret, &ca_fp, cert_pem))
    }
}

/// Answers a join request.
async fn admit(
    api: &Api,
    boot: Option<&BootWindow>,
    req: &JoinRequest,
    from: SocketAddr,
) -> Result<String, String> {
    let now = now_ms();
    let limited = api
        .state()
        .tokens
        .get(&req.token_id)
        .is_some_and(|t| t.max_uses.is_some());
    let checked = check(api, boot, req, now);
    let admitted = match checked {
        // A token that allows so many uses gives its certificate only once
        // the use is committed (on the leader, in log order).
        Ok(cert_pem) if limited => api.take_token_use(&req.token_id).await.map(|()| cert_pem),
        Ok(cert_pem) => {
            // Counting an unlimited token's uses is bookkeeping; a follower
            // cannot write, which is fine.
            let _ = api
                .write(Command::TokenUsed {
                    id: req.token_id.clone(),
                    now,
                })
                .await;
            Ok(cert_pem)
        }
        Err(reason) => Err(reason),
    };
    match admitted {
        Ok(cert_pem) => Ok(cert_pem),
        Err(reason) => {
            tracing::warn!(node = %req.name, token = %req.token_id, %from, %reason, "refused a joining daemon");
            Err(reason)
        }
    }
}
