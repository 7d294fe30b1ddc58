//! openraft glue: the type config, the log store and state machine on redb, and
//! the transport-agnostic network adapter.
//!
//! Log and state share one redb file (`Arc<redb::Database>`). The log store makes
//! entries fsync-durable before openraft hears they are flushed, and group-commits
//! concurrent appends on one writer thread. The state machine persists each applied
//! batch in one transaction that is made durable by the log's next fsync (see
//! `state_machine` for why that is safe). The network side is a trait
//! (`RaftTransport`) that the server role implements over QUIC.

// openraft's `StorageError` (over 200 bytes) is what its storage traits return;
// the helpers here return it as well rather than box and unbox it at every
// trait boundary.
#![allow(clippy::result_large_err)]

pub mod backup;
mod log_store;
pub mod network;
mod state_machine;

#[cfg(test)]
mod tests;

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

use openraft::error::{Fatal, InitializeError};
use openraft::{Config, RaftNetworkFactory, StorageError};
use serde::{Deserialize, Serialize};

pub use log_store::{LogStats, LogStore};
pub use network::{handle, Network, PeerClient, RaftRequest, RaftResponse, RaftTransport};
pub use state_machine::{SnapshotBuilder, StateMachine};

use crate::state::{Command, CommandResult, State};

openraft::declare_raft_types!(
    /// The openraft type configuration of gpuq's control plane.
    pub TypeConfig:
        D = Command,
        R = CommandResult,
        NodeId = u64,
        Node = ServerNode,
        Entry = openraft::Entry<TypeConfig>,
        SnapshotData = std::io::Cursor<Vec<u8>>,
        AsyncRuntime = openraft::TokioRuntime,
);

/// A running Raft member of the control plane.
pub type GpuqRaft = openraft::Raft<TypeConfig>;

/// One log entry of gpuq's replicated log.
pub type LogEntry = openraft::Entry<TypeConfig>;

/// A server as the Raft membership records it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServerNode {
    /// The server's node name (as in its certificate).
    pub name: String,
    /// `host:port` of the server's QUIC endpoint.
    pub addr: String,
}

impl fmt::Display for ServerNode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}@{}", self.name, self.addr)
    }
}

/// Why a Raft node could not be opened or initialised.
#[derive(Debug, thiserror::Error)]
pub enum RaftError {
    #[error("the raft database {path} is in use by another process (is another gpuq server running on this data dir?)")]
    InUse { path: PathBuf },
    #[error("cannot open the raft database {path}: {source}; {DAMAGED_FIX}")]
    Open {
        path: PathBuf,
        source: redb::DatabaseError,
    },
    #[error("the raft database {path} is damaged ({reason}); {DAMAGED_FIX}")]
    Damaged { path: PathBuf, reason: String },
    #[error(
        "the raft database {path} is missing or empty, but this data dir belongs to a \
         cluster (it holds a node_id): refusing to start with an empty state. Put the file \
         back from a copy, or restore a backup into a new data dir (`gpuq cluster snapshot \
         restore`), or remove this server (`gpuq cluster remove NAME`) and join again with \
         an empty data dir"
    )]
    Missing { path: PathBuf },
    #[error("raft storage error: {0}")]
    Storage(#[from] StorageError<u64>),
    #[error("invalid raft configuration: {0}")]
    Config(#[from] openraft::ConfigError),
    #[error("the raft node stopped: {0}")]
    Stopped(#[from] Fatal<u64>),
    #[error("cannot initialise the cluster: {0}")]
    Initialize(#[from] openraft::error::RaftError<u64, InitializeError<u64, ServerNode>>),
}

/// What to do about a raft database that cannot be read.
const DAMAGED_FIX: &str = "the file is left as it is; put it back from a copy, or restore a \
     backup into a new data dir (`gpuq cluster snapshot restore`), or remove this server \
     (`gpuq cluster remove NAME`) and join again with an empty data dir";

/// Refuses a raft database that should exist (its data dir belongs to a
/// cluster) but is missing or empty: redb would create a new, empty one.
pub fn expect_store(db_path: &Path) -> Result<(), RaftError> {
    match std::fs::metadata(db_path) {
        Ok(m) if m.len() > 0 => Ok(()),
        _ => Err(RaftError::Missing {
            path: db_path.to_path_buf(),
        }),
    }
}

/// A started Raft node with a read view of the state it has applied. Clones
/// share the node.
#[derive(Clone)]
pub struct RaftNode {
    pub raft: GpuqRaft,
    /// The applied state. Readers take the read lock; only apply writes it.
    pub state: Arc<RwLock<State>>,
    /// Group-commit figures of the log store.
    pub stats: Arc<LogStats>,
    /// The redb file of log and state: the history archive and backups read it.
    pub db: Arc<redb::Database>,
}

impl RaftNode {
    /// Makes this node a one-member cluster; see the free `initialize_single`.
    pub async fn initialize_single(&self, node_id: u64, node: ServerNode) -> Result<(), RaftError> {
        initialize_single(&self.raft, node_id, node).await
    }
}

/// Makes `raft` a one-member cluster of `node_id` at `node`. A node that already
/// has a log or a vote (a restart) is left as it is, so calling this on every
/// start is fine.
pub async fn initialize_single(
    raft: &GpuqRaft,
    node_id: u64,
    node: ServerNode,
) -> Result<(), RaftError> {
    match raft.initialize(BTreeMap::from([(node_id, node)])).await {
        Ok(()) => Ok(()),
        Err(openraft::error::RaftError::APIError(InitializeError::NotAllowed(_))) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// redb's page cache. Its default, 1 GiB, is a ceiling that a server fills
/// as it writes (every log entry and history row passes through it) and
/// never gives back: a server of 15,000 small jobs sat at 800 MB. What is
/// read back hot is recent log entries (replication) and the B-tree's
/// interior pages, which this holds many times over.
const CACHE_BYTES: usize = 64 << 20;

/// Opens (or creates) the redb file at `db_path` and returns the log store and
/// state machine that share it. Exposed for tools and tests; `open` is the usual
/// entry point.
pub async fn open_storage(db_path: &Path) -> Result<(LogStore, StateMachine), RaftError> {
    let path = db_path.to_path_buf();
    // Opening may run redb's repair after a crash (it reads the whole file), and
    // preparing the tables commits with an fsync: keep both off the runtime.
    let damaged = |reason: String| RaftError::Damaged {
        path: db_path.to_path_buf(),
        reason,
    };
    tokio::task::spawn_blocking(move || {
        let db = redb::Builder::new()
            .set_cache_size(CACHE_BYTES)
            .create(&path)
            .map_err(|source| match source {
                redb::DatabaseError::DatabaseAlreadyOpen => RaftError::InUse { path },
                source => RaftError::Open { path, source },
            })?;
        let db = Arc::new(db);
        let log = LogStore::open(db.clone(), Arc::new(LogStats::default()))?;
        let sm = StateMachine::open(db)?;
        Ok((log, sm))
    })
    .await
    // redb asserts on some damage (a file shorter than its header says)
    // rather than returning an error: the panic is the file's fault.
    .map_err(|e| match e.try_into_panic() {
        Ok(panic) => damaged(
            panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "reading it failed".into()),
        ),
        Err(e) => StorageError::from(openraft::StorageIOError::read(&e)).into(),
    })?
}

/// Opens the store at `db_path` and starts a Raft node on it.
pub async fn open<N>(
    db_path: &Path,
    node_id: u64,
    config: Config,
    network: N,
) -> Result<RaftNode, RaftError>
where
    N: RaftNetworkFactory<TypeConfig>,
{
    let config = Arc::new(config.validate()?);
    let (log, sm) = open_storage(db_path).await?;
    let state = sm.state();
    let db = sm.db();
    let stats = log.stats();
    let raft = openraft::Raft::new(node_id, config, network, log, sm).await?;
    Ok(RaftNode {
        raft,
        state,
        stats,
        db,
    })
}
