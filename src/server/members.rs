//! Changing the control plane's membership: a joining server asks to be added
//! (learner, caught up — by snapshot when the log it needs was purged — then
//! voter), and an admin removes a server by name. Both run on the leader; a
//! follower forwards them.
//!
//! Names are the identity operators use, so a name belongs to one Raft node id
//! at a time: a server whose data dir was wiped gets a new node id and must
//! wait until the old one is removed (`gpuq cluster remove NAME`), else two
//! ids would answer to one name and the old one would count as a voter that
//! never answers.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::time::Duration;

use anyhow::{bail, Context};
use openraft::ChangeMembers;

use crate::model::Role;
use crate::net::endpoint::{Endpoint, ALPN_API};
use crate::net::proto::{ApiRequest, ApiResponse, Caller, ErrorKind, Vouched};
use crate::net::{rpc, DEFAULT_MAX_FRAME};
use crate::raft::ServerNode;

use super::Api;

/// Why a server may not take `name`: another node id already holds it.
pub fn name_taken(api: &Api, name: &str, id: Option<u64>) -> Option<String> {
    let m = api.metrics().borrow().clone();
    let membership = m.membership_config.membership();
    let (other, node) = membership
        .nodes()
        .find(|(nid, n)| n.name == name && Some(**nid) != id)?;
    Some(format!(
        "a server named {name} is already a member (id {other}, {}); if that server's data dir \
         was wiped, run `gpuq cluster remove {name}` first, or join under another --node-name",
        node.addr
    ))
}

impl Api {
    /// Adds server `id` as a learner, waits until it has caught up, then
    /// makes it a voter. Idempotent: a voter already is one.
    pub(super) async fn add_server(&self, id: u64, name: String, addr: String) -> ApiResponse {
        if let Some(why) = name_taken(self, &name, Some(id)) {
            return ApiResponse::error(ErrorKind::BadInput, why);
        }
        if addr.parse::<SocketAddr>().is_err() {
            return ApiResponse::error(
                ErrorKind::BadInput,
                format!("server {name} advertises {addr:?}, which is not IP:PORT"),
            );
        }
        let raft = &self.raft_node().raft;
        let is_voter = {
            let m = raft.metrics().borrow().clone();
            let voters: BTreeSet<u64> = m.membership_config.membership().voter_ids().collect();
            voters.contains(&id)
        };
        if !is_voter {
            tracing::info!(%name, id, %addr, "adding a server as a learner");
            let node = ServerNode {
                name: name.clone(),
                addr,
            };
            if let Err(e) = raft.add_learner(id, node, true).await {
                return ApiResponse::error(
                    ErrorKind::Unavailable,
                    format!("could not add {name} as a learner: {e}"),
                );
            }
            tracing::info!(%name, id, "learner caught up; promoting it to voter");
            let add = ChangeMembers::AddVoterIds(BTreeSet::from([id]));
            if let Err(e) = raft.change_membership(add, false).await {
                return ApiResponse::error(
                    ErrorKind::Unavailable,
                    format!("could not make {name} a voter: {e}"),
                );
            }
        }
        ApiResponse::ServerAdded { name }
    }

    /// Removes the server called `name` from the membership (voter, then node).
    pub(super) async fn remove_server(&self, caller: &Caller, name: String) -> ApiResponse {
        if !caller.admin {
            return ApiResponse::error(
                ErrorKind::Forbidden,
                "removing a server needs an admin (root, or a member of admin_group)",
            );
        }
        let raft = &self.raft_node().raft;
        let m = raft.metrics().borrow().clone();
        let membership = m.membership_config.membership();
        let Some(id) = membership
            .nodes()
            .find(|(_, n)| n.name == name)
            .map(|(id, _)| *id)
        else {
            let names: Vec<&str> = membership.nodes().map(|(_, n)| n.name.as_str()).collect();
            return ApiResponse::error(
                ErrorKind::NotFound,
                format!(
                    "no server named {name} in the cluster; its members are {}",
                    names.join(", ")
                ),
            );
        };
        let voters: BTreeSet<u64> = membership.voter_ids().collect();
        if voters.contains(&id) {
            if voters.len() == 1 {
                return ApiResponse::error(
                    ErrorKind::BadInput,
                    format!(
                        "{name} is the cluster's last voter and cannot be removed; add another \
                         server first (gpuq server --join), or restore a backup elsewhere"
                    ),
                );
            }
            let demote = ChangeMembers::RemoveVoters(BTreeSet::from([id]));
            if let Err(e) = raft.change_membership(demote, false).await {
                return ApiResponse::error(
                    ErrorKind::Unavailable,
                    format!("could not remove {name} from the voters: {e}"),
                );
            }
        }
        let drop = ChangeMembers::RemoveNodes(BTreeSet::from([id]));
        if let Err(e) = raft.change_membership(drop, false).await {
            // A leader that removed itself steps down once the change commits;
            // the answer may be lost, the change is not.
            return ApiResponse::error(
                ErrorKind::Unavailable,
                format!("could not remove {name} from the members: {e}"),
            );
        }
        tracing::info!(%name, id, by = %caller.user, "removed a server");
        ApiResponse::ServerRemoved { name }
    }
}

/// The joining server's side: asks the server at `via` (the leader, or a
/// member that forwards) to add this server, retrying while no leader answers.
pub async fn request_membership(
    endpoint: &Endpoint,
    via: SocketAddr,
    id: u64,
    name: &str,
    advertise: SocketAddr,
) -> anyhow::Result<()> {
    let v = Vouched {
        caller: Caller {
            user: format!("server:{name}"),
            uid: 0,
            admin: false,
        },
        request: ApiRequest::AddServer {
            id,
            name: name.to_string(),
            addr: advertise.to_string(),
        },
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(600);
    loop {
        let answer = async {
            let peer = endpoint
                .dial(via, ALPN_API, &[Role::Server])
                .await
                .map_err(|e| e.to_string())?;
            rpc::call::<Vouched, ApiResponse>(&peer.conn, &v, DEFAULT_MAX_FRAME)
                .await
                .map_err(|e| e.to_string())
        }
        .await;
        let why = match answer {
            Ok(ApiResponse::ServerAdded { .. }) => return Ok(()),
            Ok(ApiResponse::Error {
                kind: ErrorKind::Unavailable,
                message,
                ..
            }) => message,
            Ok(ApiResponse::Error { message, .. }) => {
                bail!("the cluster refused to add this server: {message}")
            }
            Ok(other) => bail!("unexpected answer to the membership request: {other:?}"),
            Err(e) => e,
        };
        if std::time::Instant::now() > deadline {
            return Err(anyhow::anyhow!(why))
                .with_context(|| format!("could not become a member through {via} in 10 min"));
        }
        tracing::info!(server = %via, reason = %why, "membership request not answered; retrying");
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}
