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
//!
//! openraft 0.9 cancels an append-entries call after one heartbeat interval
//! and then sends the same range again. A follower far behind is sent up to
//! `max_payload_entries` entries at once, and a batch that cannot be encoded,
//! carried and stored within a heartbeat would be cancelled forever: the
//! follower never catches up (seen with 330 submissions of 5.5 KB each in a
//! debug build, 50 ms heartbeats). So each peer's client sends at most a
//! batch that it sizes by how long the last calls took ([`Batch`]), and
//! answers a truncated send with `PartialSuccess`, which openraft continues
//! from.

use std::sync::Arc;
use std::time::{Duration, Instant};

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
            batch: Batch::default(),
        }
    }
}

/// openraft's connection to one peer.
pub struct PeerClient {
    target: u64,
    node: ServerNode,
    transport: Arc<dyn RaftTransport>,
    batch: Batch,
}

/// How many log entries one append-entries call to a peer may carry: halved
/// when a call takes longer than its budget (openraft's soft TTL, 3/4 of the
/// heartbeat interval) or is cancelled, doubled while calls that were full
/// come back within half of it. The follower's fsync is a fixed cost per
/// call, so between the two the limit stays. openraft's
/// `max_payload_entries` stays the upper bound.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Batch {
    limit: usize,
}

impl Default for Batch {
    fn default() -> Batch {
        Batch {
            limit: Batch::FIRST,
        }
    }
}

impl Batch {
    /// The first limit: small enough for a slow peer, and a fast one gets to
    /// 512 in three calls.
    const FIRST: usize = 64;

    /// How many of `available` entries to send now.
    pub(crate) fn take(&self, available: usize) -> usize {
        available.min(self.limit)
    }

    /// Before a call with `sent` entries: the limit that stands if the call
    /// never comes back (openraft cancels it at the hard TTL).
    pub(crate) fn start(&mut self, sent: usize) -> Batch {
        let before = *self;
        if sent > 1 {
            self.limit = (sent / 2).max(1);
        }
        before
    }

    /// After a call with `sent` entries that took `took` of `budget`, from
    /// the limit `before` it.
    pub(crate) fn finish(&mut self, before: Batch, sent: usize, took: Duration, budget: Duration) {
        if sent == 0 {
            // A heartbeat says nothing about how long entries take.
            *self = before;
            return;
        }
        self.limit = if took > budget {
            (sent / 2).max(1)
        } else if took < budget / 2 && sent >= before.limit {
            before.limit.saturating_mul(2)
        } else {
            before.limit
        };
    }
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
        mut rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<AppendEntriesResponse<u64>, RpcError> {
        let sent = self.batch.take(rpc.entries.len());
        // The last entry sent, when fewer than all are: a success then
        // matches only up to it.
        let truncated_at = (sent < rpc.entries.len()).then(|| {
            rpc.entries.truncate(sent);
            rpc.entries.last().map(|e| e.log_id)
        });
        let before = self.batch.start(sent);
        let began = Instant::now();
        let resp = self.call(RaftRequest::AppendEntries(rpc)).await;
        self.batch
            .finish(before, sent, began.elapsed(), option.soft_ttl());
        match resp? {
            RaftResponse::AppendEntries(AppendEntriesResponse::Success) => Ok(match truncated_at {
                Some(last) => AppendEntriesResponse::PartialSuccess(last),
                None => AppendEntriesResponse::Success,
            }),
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

#[cfg(test)]
mod tests {
    use super::*;

    const BUDGET: Duration = Duration::from_millis(40);

    /// One call of `available` entries that takes `took`; returns how many went.
    fn call(b: &mut Batch, available: usize, took: Option<Duration>) -> usize {
        let sent = b.take(available);
        let before = b.start(sent);
        if let Some(took) = took {
            b.finish(before, sent, took, BUDGET);
        }
        sent
    }

    #[test]
    fn a_slow_peer_gets_smaller_batches_until_they_fit() {
        let mut b = Batch::default();
        assert_eq!(call(&mut b, 500, Some(Duration::from_millis(45))), 64);
        assert_eq!(call(&mut b, 500, None), 32, "halved after a slow call");
        // Cancelled at the hard TTL: halved again.
        assert_eq!(call(&mut b, 500, Some(Duration::from_millis(30))), 16);
        // Within budget but not fast: stays.
        assert_eq!(call(&mut b, 500, Some(Duration::from_millis(30))), 16);
        assert_eq!(call(&mut b, 500, Some(Duration::from_millis(19))), 16);
    }

    #[test]
    fn a_fast_peer_gets_bigger_batches_only_while_they_are_full() {
        let mut b = Batch::default();
        let fast = Some(Duration::from_millis(1));
        assert_eq!(call(&mut b, 500, fast), 64);
        assert_eq!(call(&mut b, 500, fast), 128);
        assert_eq!(call(&mut b, 3, fast), 3, "few entries: sends what there is");
        assert_eq!(call(&mut b, 500, fast), 256, "and does not grow on it");
        assert_eq!(call(&mut b, 500, fast), 500);
        assert_eq!(call(&mut b, 500, fast), 500, "openraft's cap bounds it");
    }

    #[test]
    fn heartbeats_and_single_entries_never_shrink_the_batch_to_nothing() {
        let mut b = Batch::default();
        let slow = Some(Duration::from_secs(1));
        assert_eq!(call(&mut b, 0, slow), 0);
        assert_eq!(b, Batch::default(), "a slow heartbeat changes nothing");
        for _ in 0..10 {
            call(&mut b, 500, slow);
        }
        assert_eq!(call(&mut b, 500, None), 1, "never below one entry");
        assert_eq!(call(&mut b, 500, slow), 1);
    }
}
