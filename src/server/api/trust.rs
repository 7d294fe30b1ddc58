//! How far the servers trust a member that vouches for a caller: a server
//! for anything, an agent or login node only for its own ordinary users
//! (its word that a caller is an admin counts only for `admin_users`), and a
//! few requests only from servers. Refusals are logged with the peer's
//! certificate name and the request's name, never its content.

use crate::model::Role;
use crate::net::endpoint::Peer;
use crate::net::proto::{ApiRequest, ApiResponse, ErrorKind, Vouched};
use crate::net::rpc::Reply;

use super::Api;

impl Api {
    /// A request forwarded by another daemon. Any cluster member may vouch for
    /// its local users, but an agent or login host is trusted only as far as
    /// one node goes: its word that a caller is an admin (root there, say)
    /// counts only for the users this server's `admin_users` names, so root
    /// on one compute node is not root of the cluster. A server forwarding
    /// for its own callers has applied that rule already.
    pub async fn handle_vouched(&self, peer: &Peer, v: Vouched) -> Reply<ApiResponse> {
        let mut v = v;
        if matches!(peer.role(), Some(Role::Agent | Role::Login)) {
            v.caller.admin = v.caller.admin && self.cfg.admin_users.contains(&v.caller.user);
        }
        let what = request_name(&v.request);
        let user = v.caller.user.clone();
        let reply = self.handle_vouched_as(peer, v).await;
        if let Reply::Answer(ApiResponse::Error {
            kind: ErrorKind::Forbidden,
            message,
            ..
        }) = &reply
        {
            tracing::warn!(peer = %peer.describe(), %user, request = what, "refused: {message}");
        }
        reply
    }

    async fn handle_vouched_as(&self, peer: &Peer, v: Vouched) -> Reply<ApiResponse> {
        match &peer.identity {
            Some((Role::Server | Role::Agent | Role::Login, _)) if v.request.opens_stream() => {
                self.handle_relaying(v.caller, v.request).await
            }
            _ => self.handle_vouched_answer(peer, v).await.into(),
        }
    }

    async fn handle_vouched_answer(&self, peer: &Peer, v: Vouched) -> ApiResponse {
        if let ApiRequest::UseToken { id } = &v.request {
            return match peer.role() {
                Some(Role::Server) => self.use_token(&v.caller, id.clone()).await,
                _ => ApiResponse::error(
                    ErrorKind::Forbidden,
                    "only a server admitting a join may take a token's use",
                ),
            };
        }
        if let ApiRequest::AddServer { id, name, addr } = &v.request {
            // Only servers send this: the joining one (its certificate names
            // it) or a member forwarding to the leader.
            return match &peer.identity {
                Some((Role::Server, _)) => {
                    if let Some(resp) = self.forward_if_follower(&v.caller, &v.request).await {
                        return resp;
                    }
                    if self.leader_elsewhere().is_some() {
                        return ApiResponse::error(
                            ErrorKind::Unavailable,
                            "no leader yet: retry in a moment",
                        );
                    }
                    self.add_server(*id, name.clone(), addr.clone()).await
                }
                _ => ApiResponse::error(
                    ErrorKind::Forbidden,
                    "only a server with a server certificate may ask to join the membership",
                ),
            };
        }
        if let ApiRequest::SnapshotSave { .. } = &v.request {
            return ApiResponse::error(
                ErrorKind::BadInput,
                "run `gpuq cluster snapshot save` on a server: the file is written on the server's host",
            );
        }
        match &peer.identity {
            Some((Role::Server | Role::Agent | Role::Login, _)) => {
                self.handle(v.caller, v.request).await
            }
            None => ApiResponse::error(ErrorKind::Forbidden, "a certificate is required"),
        }
    }
}

/// A request's name for logs (never its content: a spec may hold secrets).
fn request_name(req: &ApiRequest) -> &'static str {
    match req {
        ApiRequest::Submit { .. } => "submit",
        ApiRequest::SubmitMany { .. } => "submit-many",
        ApiRequest::Cancel { .. } => "cancel",
        ApiRequest::Hold { .. } => "hold",
        ApiRequest::Queue { .. } => "queue",
        ApiRequest::Show { .. } => "show",
        ApiRequest::Cluster => "cluster",
        ApiRequest::Nodes => "nodes",
        ApiRequest::NodeDrain { .. } => "node-drain",
        ApiRequest::NodeResume { .. } => "node-resume",
        ApiRequest::NodeMig { .. } => "node-mig",
        ApiRequest::NodeShare { .. } => "node-share",
        ApiRequest::NodeReplace { .. } => "node-replace",
        ApiRequest::Logs { .. } => "logs",
        ApiRequest::TokenCreate { .. } => "token-create",
        ApiRequest::TokenList => "token-list",
        ApiRequest::TokenRevoke { .. } => "token-revoke",
        ApiRequest::UseToken { .. } => "use-token",
        ApiRequest::Acct { .. } => "acct",
        ApiRequest::AddServer { .. } => "add-server",
        ApiRequest::RemoveServer { .. } => "remove-server",
        ApiRequest::SnapshotSave { .. } => "snapshot-save",
        ApiRequest::Admin { .. } => "admin",
        ApiRequest::PolicyShow => "policy-show",
        ApiRequest::Share => "share",
        ApiRequest::Priorities { .. } => "priorities",
        ApiRequest::StepStart { .. } => "step-start",
        ApiRequest::StepCancel { .. } => "step-cancel",
        ApiRequest::Release { .. } => "release",
        ApiRequest::StepLogs { .. } => "step-logs",
        ApiRequest::Signal { .. } => "signal",
        ApiRequest::Requeue { .. } => "requeue",
        ApiRequest::Update { .. } => "update",
        ApiRequest::Keepalive { .. } => "keepalive",
        ApiRequest::Exec { .. } => "exec",
        ApiRequest::Attach { .. } => "attach",
        ApiRequest::ApiTokenCreate { .. } => "api-token-create",
        ApiRequest::Utilisation { .. } => "utilisation",
        ApiRequest::ServiceCreate { .. } => "service-create",
        ApiRequest::ServiceScale { .. } => "service-scale",
        ApiRequest::ServiceDelete { .. } => "service-delete",
        ApiRequest::ServiceUpdate { .. } => "service-update",
        ApiRequest::ServiceApply { .. } => "service-apply",
        ApiRequest::Services { .. } => "services",
    }
}
