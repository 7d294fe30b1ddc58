//! An agent's identity: joined once with a token, then kept in its data dir.

use std::net::SocketAddr;
use std::path::Path;

use anyhow::{bail, Context};

use crate::model::Role;
use crate::net::join;
use crate::net::pki::NodeIdentity;
use crate::net::token::JoinToken;

/// Loads the identity from `dir/tls`, or joins the cluster with `token` to
/// obtain one (the key pair is generated here; only a CSR leaves the host).
pub async fn ensure_identity(
    dir: &Path,
    role: Role,
    name: &str,
    join_addr: Option<SocketAddr>,
    token: Option<&str>,
) -> anyhow::Result<NodeIdentity> {
    let tls = dir.join("tls");
    if tls.join("node.crt").exists() {
        return NodeIdentity::load(&tls)
            .with_context(|| format!("cannot read the node identity in {}", tls.display()));
    }
    let (Some(addr), Some(token)) = (join_addr, token) else {
        bail!(
            "{} holds no identity: join the cluster once with --join HOST:PORT --token TOKEN \
             (an admin prints a token with `gpuq token create --role agent`)",
            dir.display()
        );
    };
    let token = JoinToken::parse(token).context("the --token is not usable")?;
    let identity = join::join(addr, &token, role, name)
        .await
        .with_context(|| format!("joining the cluster at {addr} failed"))?;
    crate::owner_only::ensure_dir(&tls, crate::owner_only::DirMode::Private)?;
    identity.save(&tls)?;
    tracing::info!(node = name, %role, server = %addr, "joined the cluster");
    Ok(identity)
}
