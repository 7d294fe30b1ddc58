//! Raft messages between servers over QUIC (`gpuq-raft/1`): one bidirectional
//! stream per Raft RPC on a cached connection per peer.

use std::sync::Arc;

use crate::model::Role;
use crate::net::endpoint::{Endpoint, ALPN_RAFT};
use crate::net::{rpc, DEFAULT_MAX_FRAME};
use crate::raft::network::{RaftRequest, RaftResponse, RaftTransport};
use crate::raft::ServerNode;

/// When each peer last answered a Raft request of this server: the leader's
/// "last contact" with its followers, for `gpuq cluster`.
#[derive(Default)]
pub struct PeerContacts(std::sync::Mutex<std::collections::HashMap<u64, std::time::Instant>>);

impl PeerContacts {
    fn record(&self, id: u64) {
        let mut m = self.0.lock().unwrap_or_else(|p| p.into_inner());
        m.insert(id, std::time::Instant::now());
    }

    /// Milliseconds since `id` last answered, if it ever did.
    pub fn since_ms(&self, id: u64) -> Option<u64> {
        let m = self.0.lock().unwrap_or_else(|p| p.into_inner());
        m.get(&id).map(|t| t.elapsed().as_millis() as u64)
    }
}

/// The Raft transport of a server: its own QUIC endpoint dials the peers.
pub struct QuicRaftNetwork {
    endpoint: Arc<Endpoint>,
    contacts: Arc<PeerContacts>,
}

impl QuicRaftNetwork {
    pub fn new(endpoint: Arc<Endpoint>, contacts: Arc<PeerContacts>) -> QuicRaftNetwork {
        QuicRaftNetwork { endpoint, contacts }
    }
}

#[async_trait::async_trait]
impl RaftTransport for QuicRaftNetwork {
    async fn call(
        &self,
        target: u64,
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
        let resp = rpc::call::<RaftRequest, RaftResponse>(&peer.conn, &req, DEFAULT_MAX_FRAME)
            .await
            .map_err(|e| e.to_string())?;
        self.contacts.record(target);
        Ok(resp)
    }
}
