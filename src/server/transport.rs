//! Raft messages between servers over QUIC (`gpuq-raft/1`): one bidirectional
//! stream per Raft RPC on a cached connection per peer.

use std::sync::Arc;

use crate::model::Role;
use crate::net::endpoint::{Endpoint, ALPN_RAFT};
use crate::net::{rpc, DEFAULT_MAX_FRAME};
use crate::raft::network::{RaftRequest, RaftResponse, RaftTransport};
use crate::raft::ServerNode;

/// The Raft transport of a server: its own QUIC endpoint dials the peers.
pub struct QuicRaftNetwork {
    endpoint: Arc<Endpoint>,
}

impl QuicRaftNetwork {
    pub fn new(endpoint: Arc<Endpoint>) -> QuicRaftNetwork {
        QuicRaftNetwork { endpoint }
    }
}

#[async_trait::async_trait]
impl RaftTransport for QuicRaftNetwork {
    async fn call(
        &self,
        _target: u64,
        node: &ServerNode,
        req: RaftRequest,
    ) -> Result<RaftResponse, String> {
        let addr = node.addr.parse().map_err(|_| {
            format!(
                "server {} has an invalid address {:?}",
                node.name, node.addr
            )
        })?;
        let peer = self
            .endpoint
            .dial(addr, ALPN_RAFT, &[Role::Server])
            .await
            .map_err(|e| e.to_string())?;
        rpc::call::<RaftRequest, RaftResponse>(&peer.conn, &req, DEFAULT_MAX_FRAME)
            .await
            .map_err(|e| e.to_string())
    }
}
