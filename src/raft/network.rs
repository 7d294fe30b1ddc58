//! openraft's network, independent of the transport: Raft RPCs as one request
//! enum and one response enum (serde, for the wire), a `RaftTransport` trait that
//! carries a request to a peer and brings back its response, and `handle` for
//! the receiving side. The server role implements `RaftTransport` over QUIC.
//!
//! Failures map onto openraft's retry policy: a transport error (no connection,
//! a call that broke on the way) is `Unreachable`, so openraft backs off before
//! it tries that peer again instead of spinning on it; an answer that came back
//! but is not the answer to the request (the peer could not handle it) is a
//! `NetworkError`, retried with the next heartbeat; a remote Raft that has
//! stopped is a `RemoteError`.

use std::sync::Arc;

use async_trait::async_trait;
use openraft::error::{
    Fatal, InstallSnapshotError, NetworkError, RPCError, RaftError, RemoteError, SnapshotMismatch,
    Unreachable,
};
use openraft::network::RPCOption;
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    VoteRequest, VoteResponse,
};
use openraft::{AnyError, RaftNetwork, RaftNetworkFactory};
use serde::{Deserialize, Serialize};

use super::{GpuqRaft, ServerNode, TypeConfig};

/// A Raft RPC, as sent to a peer.
#[derive(Debug, Serialize, Deserialize)]
pub enum RaftRequest {
    /// Answered by `RaftResponse::AppendEntries`.
    AppendEntries(AppendEntriesRequest<TypeConfig>),
    /// Answered by `RaftResponse::Vote`.
    Vote(VoteRequest<u64>),
    /// One chunk of a snapshot; answered by `RaftResponse::InstallSnapshot`.
    InstallSnapshot(InstallSnapshotRequest<TypeConfig>),
}

/// A peer's answer to a `RaftRequest`.
#[derive(Debug, Serialize, Deserialize)]
pub enum RaftResponse {
    AppendEntries(AppendEntriesResponse<u64>),
    Vote(VoteResponse<u64>),
    InstallSnapshot(InstallSnapshotResponse<u64>),
    /// The peer's Raft has stopped (shut down, or a storage failure).
    Fatal(Fatal<u64>),
    /// A snapshot chunk did not continue the snapshot the peer is receiving;
    /// the sender restarts the snapshot.
    SnapshotMismatch(SnapshotMismatch),
    /// The peer could not handle the request (it names why).
    Error(String),
}

/// Carries Raft requests to peers: implemented by the server over QUIC, and by
/// in-process transports in tests. Timeouts are openraft's business.
#[async_trait]
pub trait RaftTransport: Send + Sync + 'static {
    /// Sends `req` to server `target` at `node` and returns its response, or
    /// says why no response came back.
    async fn call(
        &self,
        target: u64,
        node: &ServerNode,
        req: RaftRequest,
    ) -> Result<RaftResponse, String>;
}

/// The `RaftNetworkFactory` handed to openraft: one `PeerClient` per peer.
#[derive(Clone)]
pub struct Network {
    transport: Arc<dyn RaftTransport>,
}

impl Network {
    pub fn new(transport: Arc<dyn RaftTransport>) -> Network {
        Network { transport }
    }
}

impl RaftNetworkFactory<TypeConfig> for Network {
    type Network = PeerClient;

    async fn new_client(&mut self, target: u64, node: &ServerNode) -> PeerClient {
        PeerClient {
            target,
            node: node.clone(),
            transport: self.transport.clone(),
        }
    }
}

/// openraft's connection to one peer.
pub struct PeerClient {
    target: u64,
    node: ServerNode,
    transport: Arc<dyn RaftTransport>,
}

type RpcError<E = openraft::error::Infallible> = RPCError<u64, ServerNode, RaftError<u64, E>>;

fn unexpected<E: std::error::Error>(what: &str, resp: &RaftResponse) -> RpcError<E> {
    let msg = match resp {
        RaftResponse::Error(e) => format!("peer could not handle {what}: {e}"),
        other => format!("peer answered {what} with {other:?}"),
    };
    RPCError::Network(NetworkError::new(&AnyError::error(msg)))
}

impl PeerClient {
    async fn call<E: std::error::Error>(
        &self,
        req: RaftRequest,
    ) -> Result<RaftResponse, RpcError<E>> {
        match self.transport.call(self.target, &self.node, req).await {
            Ok(RaftResponse::Fatal(f)) => Err(RPCError::RemoteError(RemoteError::new_with_node(
                self.target,
                self.node.clone(),
                RaftError::Fatal(f),
            ))),
            Ok(resp) => Ok(resp),
            Err(why) => Err(RPCError::Unreachable(Unreachable::new(&AnyError::error(
                format!(
                    "raft peer {} ({}) unreachable: {why}",
                    self.target, self.node
                ),
            )))),
        }
    }
}

impl RaftNetwork<TypeConfig> for PeerClient {
    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        _option: RPCOption,
    ) -> Result<AppendEntriesResponse<u64>, RpcError> {
        match self.call(RaftRequest::AppendEntries(rpc)).await? {
            RaftResponse::AppendEntries(r) => Ok(r),
            other => Err(unexpected("append-entries", &other)),
        }
    }

    async fn install_snapshot(
        &mut self,
        rpc: InstallSnapshotRequest<TypeConfig>,
        _option: RPCOption,
    ) -> Result<InstallSnapshotResponse<u64>, RpcError<InstallSnapshotError>> {
        match self.call(RaftRequest::InstallSnapshot(rpc)).await? {
            RaftResponse::InstallSnapshot(r) => Ok(r),
            RaftResponse::SnapshotMismatch(m) => {
                Err(RPCError::RemoteError(RemoteError::new_with_node(
                    self.target,
                    self.node.clone(),
                    RaftError::APIError(InstallSnapshotError::SnapshotMismatch(m)),
                )))
            }
            other => Err(unexpected("install-snapshot", &other)),
        }
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<u64>,
        _option: RPCOption,
    ) -> Result<VoteResponse<u64>, RpcError> {
        match self.call(RaftRequest::Vote(rpc)).await? {
            RaftResponse::Vote(r) => Ok(r),
            other => Err(unexpected("vote", &other)),
        }
    }
}

/// Hands a request that arrived from a peer to the local Raft.
pub async fn handle(raft: &GpuqRaft, req: RaftRequest) -> RaftResponse {
    match req {
        RaftRequest::AppendEntries(r) => match raft.append_entries(r).await {
            Ok(resp) => RaftResponse::AppendEntries(resp),
            Err(RaftError::Fatal(f)) => RaftResponse::Fatal(f),
            Err(RaftError::APIError(never)) => match never {},
        },
        RaftRequest::Vote(r) => match raft.vote(r).await {
            Ok(resp) => RaftResponse::Vote(resp),
            Err(RaftError::Fatal(f)) => RaftResponse::Fatal(f),
            Err(RaftError::APIError(never)) => match never {},
        },
        RaftRequest::InstallSnapshot(r) => match raft.install_snapshot(r).await {
            Ok(resp) => RaftResponse::InstallSnapshot(resp),
            Err(RaftError::Fatal(f)) => RaftResponse::Fatal(f),
            Err(RaftError::APIError(InstallSnapshotError::SnapshotMismatch(m))) => {
                RaftResponse::SnapshotMismatch(m)
            }
        },
    }
}
