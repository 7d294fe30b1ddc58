//! Forwarding to the leader: a follower sends what only the leader may
//! answer (writes, and what needs its agent connections) on to it, with
//! the caller it vouches for, and says so when the leader goes away while
//! holding a request. An interactive stream is forwarded whole: the
//! leader's answer, then the stream spliced to the caller's.

use crate::model::Role;
use crate::net::endpoint::ALPN_API;
use crate::net::proto::{ApiRequest, ApiResponse, Caller, ErrorKind, Vouched};
use crate::net::rpc::Reply;
use crate::net::stdio::{quic_stream, MAX_STDIO_FRAME};
use crate::net::{rpc, DEFAULT_MAX_FRAME};

use super::Api;

impl Api {
    /// On a follower that knows a leader: its id, node and address.
    fn leader_to_forward_to(
        &self,
    ) -> Option<Result<(u64, crate::raft::ServerNode, std::net::SocketAddr), ApiResponse>> {
        let metrics = self.node.raft.metrics().borrow().clone();
        let leader = metrics.current_leader?;
        if leader == metrics.id {
            return None;
        }
        let node = metrics
            .membership_config
            .membership()
            .get_node(&leader)?
            .clone();
        Some(match node.addr.parse() {
            Ok(addr) => Ok((leader, node, addr)),
            Err(_) => Err(ApiResponse::error(
                ErrorKind::Internal,
                format!("leader address {:?} is not HOST:PORT", node.addr),
            )),
        })
    }

    /// On a follower, sends the request to the leader and returns its answer.
    pub(in crate::server) async fn forward_if_follower(
        &self,
        caller: &Caller,
        req: &ApiRequest,
    ) -> Option<ApiResponse> {
        let (leader, node, addr) = match self.leader_to_forward_to()? {
            Ok(found) => found,
            Err(resp) => return Some(resp),
        };
        let v = Vouched {
            caller: caller.clone(),
            request: req.clone(),
        };
        let result = async {
            let peer = self
                .endpoint
                .dial(addr, ALPN_API, &[Role::Server])
                .await
                .map_err(|e| e.to_string())?;
            rpc::call::<Vouched, ApiResponse>(&peer.conn, &v, DEFAULT_MAX_FRAME)
                .await
                .map_err(|e| e.to_string())
        };
        // A leader that dies holding the request never answers, and its
        // connection would stay open until QUIC's idle timeout. Once this
        // server sees another leader, or none, the answer cannot come: say so
        // at once. The old leader may have committed the request, so this is
        // neither a success nor a definite refusal.
        let mut metrics = self.node.raft.metrics();
        let deposed = async move {
            // The leader may have changed since it was read above.
            while metrics.borrow_and_update().current_leader == Some(leader) {
                if metrics.changed().await.is_err() {
                    std::future::pending::<()>().await
                }
            }
        };
        Some(tokio::select! {
            r = result => match r {
                Ok(r) => r,
                Err(e) => ApiResponse::error(
                    ErrorKind::Unavailable,
                    format!(
                        "cannot reach the leader {} at {}: {e}",
                        node.name, node.addr
                    ),
                ),
            },
            () = deposed => ApiResponse::error(
                ErrorKind::Unavailable,
                format!(
                    "the leader {} at {} went away while it held this request, which it may \
                     or may not have applied: check (`gpuq queue`, `gpuq show`) before you retry",
                    node.name, node.addr
                ),
            ),
        })
    }

    /// On a follower, sends an interactive request to the leader: its
    /// answer, and the leader's stream to splice the caller's to.
    pub(super) async fn forward_stream_if_follower(
        &self,
        caller: &Caller,
        req: &ApiRequest,
    ) -> Option<Reply<ApiResponse>> {
        let (_, node, addr) = match self.leader_to_forward_to()? {
            Ok(found) => found,
            Err(resp) => return Some(resp.into()),
        };
        let v = Vouched {
            caller: caller.clone(),
            request: req.clone(),
        };
        let opened = async {
            let peer = self
                .endpoint
                .dial(addr, ALPN_API, &[Role::Server])
                .await
                .map_err(|e| e.to_string())?;
            rpc::call_keeping::<Vouched, ApiResponse>(&peer.conn, &v, MAX_STDIO_FRAME)
                .await
                .map_err(|e| e.to_string())
        };
        Some(match opened.await {
            Ok((resp @ ApiResponse::Attached { .. }, send, recv)) => {
                Reply::Relay(resp, quic_stream(send, recv))
            }
            Ok((resp, _, _)) => Reply::Answer(resp),
            Err(e) => ApiResponse::error(
                ErrorKind::Unavailable,
                format!(
                    "cannot reach the leader {} at {}: {e}",
                    node.name, node.addr
                ),
            )
            .into(),
        })
    }
}
