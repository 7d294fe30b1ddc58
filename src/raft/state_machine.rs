//! The replicated state machine on redb: `State` in memory, its records, the
//! applied log id, the membership and the current snapshot in the shared file.
//!
//! Each applied batch is one write transaction: the records `apply` touched
//! (`store::write_dirty`), the last applied log id and (if it changed) the
//! membership. These transactions commit with `Durability::None`: redb keeps
//! them in order and the next durable commit, which the log writer makes within
//! one fsync, carries them to disk. (In redb 2.x `Durability::Eventual` fsyncs
//! too on Linux; `None` is the level that waits for a later durable commit.)
//! After a crash the state is therefore at some applied index behind the durable
//! log, and openraft re-applies the rest from the log (it re-applies up to the
//! saved committed index at start-up, and the leader's commit does the rest).
//!
//! That is safe only while the log still holds what the durable state has not
//! covered. openraft purges logs only up to the last snapshot, and a snapshot is
//! stored with `Durability::Immediate`, which also makes every earlier state
//! transaction durable: once a purge up to index `i` can happen, the durable
//! state is at `i` or later. Installing a snapshot replaces state, applied id,
//! membership and stored snapshot in one immediate transaction.
//!
//! Snapshots are built from a redb read transaction taken when openraft asks for
//! a builder, so they are a consistent view even while later batches apply.

use std::io::Cursor;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

use openraft::storage::RaftStateMachine;
use openraft::{
    EntryPayload, LogId, RaftSnapshotBuilder, Snapshot, SnapshotMeta, StorageError, StorageIOError,
    StoredMembership,
};
use redb::{
    Database, Durability, ReadTransaction, ReadableTable, TableDefinition, WriteTransaction,
};
use serde::de::DeserializeOwned;

use super::{LogEntry, ServerNode, TypeConfig};
use crate::state::codec::{self, encode, DecodeError, EncodeError};
use crate::state::store::{self, StoreError};
use crate::state::{CommandResult, Dirty, State};

/// `last_applied`, `last_membership`.
const SM_META: TableDefinition<&str, &[u8]> = TableDefinition::new("raft_sm_meta");
/// `meta`, `data` of the current snapshot.
const SNAPSHOT: TableDefinition<&str, &[u8]> = TableDefinition::new("raft_snapshot");

const LAST_APPLIED: &str = "last_applied";
const LAST_MEMBERSHIP: &str = "last_membership";
const SNAPSHOT_META: &str = "meta";
const SNAPSHOT_DATA: &str = "data";

type StorageResult<T> = Result<T, StorageError<u64>>;
type Membership = StoredMembership<u64, ServerNode>;
type Meta = SnapshotMeta<u64, ServerNode>;

/// Distinguishes snapshots built at the same log id.
static SNAPSHOT_SEQ: AtomicU64 = AtomicU64::new(0);

/// What went wrong inside a state machine transaction.
#[derive(Debug, thiserror::Error)]
enum SmError {
    #[error("state machine database: {0}")]
    Db(Box<redb::Error>),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("state machine record {what} could not be decoded: {source}")]
    Decode {
        what: &'static str,
        source: DecodeError,
    },
    #[error("state machine record could not be encoded: {0}")]
    Encode(#[from] EncodeError),
    #[error("state machine task failed: {0}")]
    Task(String),
}

fn db_err(e: impl Into<redb::Error>) -> SmError {
    SmError::Db(Box::new(e.into()))
}

fn get<T: DeserializeOwned>(
    table: &impl ReadableTable<&'static str, &'static [u8]>,
    key: &'static str,
) -> Result<Option<T>, SmError> {
    match table.get(key).map_err(db_err)? {
        Some(v) => Ok(Some(
            codec::decode(v.value()).map_err(|source| SmError::Decode { what: key, source })?,
        )),
        None => Ok(None),
    }
}

/// Applied log id and membership as recorded in `txn`.
fn read_applied(txn: &ReadTransaction) -> Result<(Option<LogId<u64>>, Membership), SmError> {
    let meta = txn.open_table(SM_META).map_err(db_err)?;
    let applied = get::<Option<LogId<u64>>>(&meta, LAST_APPLIED)?.flatten();
    let membership = get(&meta, LAST_MEMBERSHIP)?.unwrap_or_default();
    Ok((applied, membership))
}

fn write_applied(
    txn: &WriteTransaction,
    applied: &Option<LogId<u64>>,
    membership: Option<&Membership>,
) -> Result<(), SmError> {
    let mut meta = txn.open_table(SM_META).map_err(db_err)?;
    meta.insert(LAST_APPLIED, encode(applied)?.as_slice())
        .map_err(db_err)?;
    if let Some(m) = membership {
        meta.insert(LAST_MEMBERSHIP, encode(m)?.as_slice())
            .map_err(db_err)?;
    }
    Ok(())
}

/// Stores `meta` + `data` as the current snapshot; with `only_if_newer`, keeps a
/// stored snapshot that covers more (a build racing an install).
fn write_snapshot(
    txn: &WriteTransaction,
    meta: &Meta,
    data: &[u8],
    only_if_newer: bool,
) -> Result<bool, SmError> {
    let mut table = txn.open_table(SNAPSHOT).map_err(db_err)?;
    if only_if_newer {
        if let Some(current) = get::<Meta>(&table, SNAPSHOT_META)? {
            if current.last_log_id > meta.last_log_id {
                return Ok(false);
            }
        }
    }
    table
        .insert(SNAPSHOT_META, encode(meta)?.as_slice())
        .map_err(db_err)?;
    table.insert(SNAPSHOT_DATA, data).map_err(db_err)?;
    Ok(true)
}

async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, SmError> + Send + 'static,
) -> Result<T, SmError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| SmError::Task(e.to_string()))?
}

fn sm_write_err(e: SmError) -> StorageError<u64> {
    StorageIOError::write_state_machine(&e).into()
}

fn sm_read_err(e: SmError) -> StorageError<u64> {
    StorageIOError::read_state_machine(&e).into()
}

/// The Raft state machine: `State` plus its persistence.
pub struct StateMachine {
    db: Arc<Database>,
    state: Arc<RwLock<State>>,
    last_applied: Option<LogId<u64>>,
    last_membership: Membership,
}

impl StateMachine {
    /// Opens the state machine tables in `db` (creating them) and loads `State`.
    pub fn open(db: Arc<Database>) -> StorageResult<StateMachine> {
        let prepare = || -> Result<(), SmError> {
            let txn = db.begin_write().map_err(db_err)?;
            store::create_tables(&txn)?;
            txn.open_table(SM_META).map_err(db_err)?;
            txn.open_table(SNAPSHOT).map_err(db_err)?;
            txn.commit().map_err(db_err)?;
            Ok(())
        };
        prepare().map_err(sm_write_err)?;
        let load = || -> Result<_, SmError> {
            let txn = db.begin_read().map_err(db_err)?;
            let state = store::load(&txn)?;
            let (applied, membership) = read_applied(&txn)?;
            Ok((state, applied, membership))
        };
        let (state, last_applied, last_membership) = load().map_err(sm_read_err)?;
        Ok(StateMachine {
            db,
            state: Arc::new(RwLock::new(state)),
            last_applied,
            last_membership,
        })
    }

    /// The applied state, shared with readers.
    pub fn state(&self) -> Arc<RwLock<State>> {
        self.state.clone()
    }

    /// The redb file the state lives in (readers of the history archive).
    pub fn db(&self) -> Arc<Database> {
        self.db.clone()
    }
}

impl RaftStateMachine<TypeConfig> for StateMachine {
    type SnapshotBuilder = SnapshotBuilder;

    async fn applied_state(&mut self) -> StorageResult<(Option<LogId<u64>>, Membership)> {
        Ok((self.last_applied, self.last_membership.clone()))
    }

    async fn apply<I>(&mut self, entries: I) -> StorageResult<Vec<CommandResult>>
    where
        I: IntoIterator<Item = LogEntry> + Send,
        I::IntoIter: Send,
    {
        let mut results = Vec::new();
        let mut dirty = Dirty::default();
        let mut membership_changed = false;
        let mut last = None;
        {
            let mut state = self
                .state
                .write()
                .map_err(|_| sm_write_err(SmError::Task("state lock poisoned".into())))?;
            for entry in entries {
                last = Some(entry.log_id);
                match entry.payload {
                    EntryPayload::Blank => results.push(CommandResult::Noop),
                    EntryPayload::Normal(cmd) => results.push(state.apply(&cmd, &mut dirty)),
                    EntryPayload::Membership(m) => {
                        self.last_membership = StoredMembership::new(Some(entry.log_id), m);
                        membership_changed = true;
                        results.push(CommandResult::Noop);
                    }
                }
            }
        }
        if last.is_none() {
            return Ok(results);
        }
        self.last_applied = last;

        let db = self.db.clone();
        let state = self.state.clone();
        let applied = self.last_applied;
        let membership = membership_changed.then(|| self.last_membership.clone());
        let archived = dirty.archived;
        blocking(move || {
            let mut txn = db.begin_write().map_err(db_err)?;
            txn.set_durability(Durability::None);
            {
                let state = state
                    .read()
                    .map_err(|_| SmError::Task("state lock poisoned".into()))?;
                store::write_dirty(&txn, &state, &dirty)?;
            }
            write_applied(&txn, &applied, membership.as_ref())?;
            txn.commit().map_err(db_err)?;
            if archived {
                // Committed: readers find these jobs in the history tables now.
                state
                    .write()
                    .map_err(|_| SmError::Task("state lock poisoned".into()))?
                    .archiving
                    .clear();
            }
            Ok(())
        })
        .await
        .map_err(|e| match applied {
            Some(id) => StorageIOError::apply(id, &e).into(),
            None => sm_write_err(e),
        })?;
        Ok(results)
    }

    async fn get_snapshot_builder(&mut self) -> SnapshotBuilder {
        SnapshotBuilder {
            db: self.db.clone(),
            view: self.db.begin_read().map_err(|e| e.to_string()),
        }
    }

    async fn begin_receiving_snapshot(&mut self) -> StorageResult<Box<Cursor<Vec<u8>>>> {
        Ok(Box::new(Cursor::new(Vec::new())))
    }

    async fn install_snapshot(
        &mut self,
        meta: &Meta,
        snapshot: Box<Cursor<Vec<u8>>>,
    ) -> StorageResult<()> {
        let data = snapshot.into_inner();
        let signature = meta.signature();
        let snap_err = |e: SmError| -> StorageError<u64> {
            StorageIOError::write_snapshot(Some(signature.clone()), &e).into()
        };
        let db = self.db.clone();
        let m = meta.clone();
        let new_state = blocking(move || {
            let (new_state, history) = store::from_snapshot_bytes(&data)?;
            let mut txn = db.begin_write().map_err(db_err)?;
            txn.set_durability(Durability::Immediate);
            store::replace_all(&txn, &new_state, history)?;
            write_applied(&txn, &m.last_log_id, Some(&m.last_membership))?;
            write_snapshot(&txn, &m, &data, false)?;
            txn.commit().map_err(db_err)?;
            Ok(new_state)
        })
        .await
        .map_err(snap_err)?;

        let mut new_state = new_state;
        let mut state = self
            .state
            .write()
            .map_err(|_| snap_err(SmError::Task("state lock poisoned".into())))?;
        // Node versions keep growing, so no agent loop takes the new
        // state's desired tasks for ones it already sent.
        new_state.succeed(&state);
        *state = new_state;
        drop(state);
        self.last_applied = meta.last_log_id;
        self.last_membership = meta.last_membership.clone();
        Ok(())
    }

    async fn get_current_snapshot(&mut self) -> StorageResult<Option<Snapshot<TypeConfig>>> {
        let db = self.db.clone();
        let found = blocking(move || {
            let txn = db.begin_read().map_err(db_err)?;
            let table = txn.open_table(SNAPSHOT).map_err(db_err)?;
            let Some(meta) = get::<Meta>(&table, SNAPSHOT_META)? else {
                return Ok(None);
            };
            let data = match table.get(SNAPSHOT_DATA).map_err(db_err)? {
                Some(v) => v.value().to_vec(),
                None => Vec::new(),
            };
            Ok(Some((meta, data)))
        })
        .await
        .map_err(|e| StorageError::from(StorageIOError::read_snapshot(None, &e)))?;
        Ok(found.map(|(meta, data)| Snapshot {
            meta,
            snapshot: Box::new(Cursor::new(data)),
        }))
    }
}

/// The applied state as a snapshot (its meta and the bytes `install_snapshot`
/// takes), from one consistent read of `db`: for backups.
pub fn export(db: &Database) -> Result<(Meta, Vec<u8>), String> {
    let view = db.begin_read().map_err(|e| e.to_string())?;
    let data = store::snapshot_of(&view).map_err(|e| e.to_string())?;
    let (applied, membership) = read_applied(&view).map_err(|e| e.to_string())?;
    drop(view);
    let snapshot_id = format!("backup-{}", applied.map(|a| a.index).unwrap_or(0));
    Ok((
        Meta {
            last_log_id: applied,
            last_membership: membership,
            snapshot_id,
        },
        data,
    ))
}

/// Builds a snapshot from the redb view taken when it was created.
pub struct SnapshotBuilder {
    db: Arc<Database>,
    view: Result<ReadTransaction, String>,
}

impl RaftSnapshotBuilder<TypeConfig> for SnapshotBuilder {
    async fn build_snapshot(&mut self) -> StorageResult<Snapshot<TypeConfig>> {
        let view = std::mem::replace(&mut self.view, Err("snapshot builder used twice".into()))
            .map_err(|e| {
                StorageError::from(StorageIOError::read_state_machine(&SmError::Task(e)))
            })?;
        let db = self.db.clone();
        let (meta, data) = blocking(move || {
            let data = store::snapshot_of(&view)?;
            let (applied, membership) = read_applied(&view)?;
            drop(view);
            let seq = SNAPSHOT_SEQ.fetch_add(1, Ordering::Relaxed);
            let snapshot_id = match applied {
                Some(id) => format!("{}-{}-{}", id.leader_id, id.index, seq),
                None => format!("none-{seq}"),
            };
            let meta = Meta {
                last_log_id: applied,
                last_membership: membership,
                snapshot_id,
            };
            let mut txn = db.begin_write().map_err(db_err)?;
            // Durable before openraft may purge the logs it covers.
            txn.set_durability(Durability::Immediate);
            write_snapshot(&txn, &meta, &data, true)?;
            txn.commit().map_err(db_err)?;
            Ok((meta, data))
        })
        .await
        .map_err(|e| StorageError::from(StorageIOError::write_snapshot(None, &e)))?;
        Ok(Snapshot {
            meta,
            snapshot: Box::new(Cursor::new(data)),
        })
    }
}
