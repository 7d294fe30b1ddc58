//! The Raft log and vote on redb, with group commit.
//!
//! `append` returns as soon as the entries are in an in-memory map of unflushed
//! entries (readers consult it first, then redb) and queued for one writer
//! thread. The writer takes everything queued, writes it in one transaction,
//! commits it with `Durability::Immediate` (fsync) and only then fires the
//! `LogFlushed` callbacks and drops the entries from the unflushed map. While one
//! fsync runs, further appends queue up and share the next one: that is the group
//! commit, and `LogStats` counts it.
//!
//! openraft 0.9 itself waits for each append's callback before it issues the
//! next one (`RaftCore::append_to_log`), so from a running Raft a transaction
//! carries what openraft handed over in one call (one client write on a leader,
//! a replication batch on a follower) plus queued vote and committed writes; the
//! writer coalesces more as soon as its caller keeps several appends in flight
//! (as openraft 0.10 does, and as the tests do).
//!
//! Truncate, purge and vote go through the same queue and wait for their commit,
//! so every write reaches redb in the order openraft issued it (a truncate can
//! never overtake the append it cuts back). `save_committed` is queued without
//! waiting: the committed index is only a hint for re-applying after a restart,
//! and a stale one is harmless, but it stays in order behind the appends it
//! covers, so it is never durable before the entries it names. openraft saves
//! it after every commit, and a redb commit writes several pages even without
//! an fsync, so it is held instead: written with the next write once it is
//! `HINT_EVERY` entries ahead of the one on disk, and when the writer stops.
//! A restart re-applies the entries past the stale hint once the leader
//! commits again, as it does for entries committed after the last save.

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::io;
use std::ops::{Bound, RangeBounds};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Mutex, RwLock};
use std::thread;

use openraft::storage::{LogFlushed, RaftLogStorage};
use openraft::{LogId, LogState, RaftLogReader, StorageError, StorageIOError, Vote};
use redb::{Database, Durability, ReadableTable, TableDefinition, WriteTransaction};
use serde::de::DeserializeOwned;

use super::{LogEntry, TypeConfig};
use crate::state::codec::{decode, encode, EncodeError};

/// Log entries: index -> MessagePack of the entry.
const LOG: TableDefinition<u64, &[u8]> = TableDefinition::new("raft_log");
/// `vote`, `last_purged`, `committed`.
pub(super) const LOG_META: TableDefinition<&str, &[u8]> = TableDefinition::new("raft_log_meta");

const VOTE: &str = "vote";
const LAST_PURGED: &str = "last_purged";
pub(super) const COMMITTED: &str = "committed";

type StorageResult<T> = Result<T, StorageError<u64>>;
type Done = Box<dyn FnOnce(io::Result<()>) + Send>;
type Reply = tokio::sync::oneshot::Sender<Result<(), String>>;

/// Group-commit figures: how many append transactions carried how much.
#[derive(Debug, Default)]
pub struct LogStats {
    /// Write transactions that carried at least one append.
    pub appends_txns: AtomicU64,
    /// Log entries written by those transactions.
    pub entries: AtomicU64,
    /// `append` calls those transactions served (one call may carry many entries).
    pub append_calls: AtomicU64,
    /// The highest log index openraft told this store is committed.
    pub committed_index: AtomicU64,
    /// How long each durable log write took, its fsync included.
    pub write_seconds: crate::metric::Histogram,
}

impl LogStats {
    /// Mean number of entries per append transaction (0 before the first).
    pub fn mean_batch(&self) -> f64 {
        let txns = self.appends_txns.load(Ordering::Relaxed);
        if txns == 0 {
            return 0.0;
        }
        self.entries.load(Ordering::Relaxed) as f64 / txns as f64
    }
}

/// One write for the writer thread, in openraft's order.
enum Op {
    Append {
        entries: Vec<(LogId<u64>, Vec<u8>)>,
        done: Done,
    },
    Truncate {
        since: u64,
        reply: Reply,
    },
    Purge {
        upto: LogId<u64>,
        reply: Reply,
    },
    SaveVote {
        vote: Vote<u64>,
        reply: Reply,
    },
    SaveCommitted {
        committed: Option<LogId<u64>>,
    },
}

/// Entries appended but not yet committed by the writer, by index.
type Unflushed = Arc<RwLock<BTreeMap<u64, LogEntry>>>;

struct Shared {
    db: Arc<Database>,
    unflushed: Unflushed,
    /// Mirrors of what is (or is queued to be) in `LOG_META`.
    vote: Mutex<Option<Vote<u64>>>,
    last_purged: Mutex<Option<LogId<u64>>>,
    committed: Mutex<Option<LogId<u64>>>,
    queue: Option<mpsc::Sender<Op>>,
    writer: Option<thread::JoinHandle<()>>,
    stats: Arc<LogStats>,
}

impl Drop for Shared {
    fn drop(&mut self) {
        // Closing the queue ends the writer once it has written what is queued;
        // joining it releases its handle on the database before we return.
        drop(self.queue.take());
        if let Some(w) = self.writer.take() {
            let _ = w.join();
        }
    }
}

/// The Raft log store; clones share one log (and serve as its readers).
#[derive(Clone)]
pub struct LogStore {
    shared: Arc<Shared>,
}

fn read_err(e: impl std::error::Error + 'static) -> StorageError<u64> {
    StorageIOError::read_logs(&e).into()
}

fn write_err(e: impl std::error::Error + 'static) -> StorageError<u64> {
    StorageIOError::write_logs(&e).into()
}

fn meta_get<T: DeserializeOwned>(
    table: &impl ReadableTable<&'static str, &'static [u8]>,
    key: &str,
) -> StorageResult<Option<T>> {
    match table.get(key).map_err(read_err)? {
        Some(v) => Ok(Some(decode(v.value()).map_err(read_err)?)),
        None => Ok(None),
    }
}

/// Turns any range into a half-open `[start, end)`.
fn bounds(range: &impl RangeBounds<u64>) -> (u64, u64) {
    let start = match range.start_bound() {
        Bound::Included(&s) => s,
        Bound::Excluded(&s) => s.saturating_add(1),
        Bound::Unbounded => 0,
    };
    let end = match range.end_bound() {
        Bound::Included(&e) => e.saturating_add(1),
        Bound::Excluded(&e) => e,
        Bound::Unbounded => u64::MAX,
    };
    (start, end)
}

impl LogStore {
    /// Opens the log tables in `db` (creating them) and starts the writer thread.
    pub fn open(db: Arc<Database>, stats: Arc<LogStats>) -> StorageResult<LogStore> {
        let txn = db.begin_write().map_err(write_err)?;
        txn.open_table(LOG).map_err(write_err)?;
        txn.open_table(LOG_META).map_err(write_err)?;
        txn.commit().map_err(write_err)?;

        let txn = db.begin_read().map_err(read_err)?;
        let meta = txn.open_table(LOG_META).map_err(read_err)?;
        let vote = meta_get(&meta, VOTE)?;
        let last_purged = meta_get(&meta, LAST_PURGED)?;
        let committed = meta_get::<Option<LogId<u64>>>(&meta, COMMITTED)?.flatten();
        drop(meta);
        drop(txn);

        let unflushed: Unflushed = Arc::default();
        let (tx, rx) = mpsc::channel();
        let saved = index_of(&committed);
        let writer = {
            let db = db.clone();
            let unflushed = unflushed.clone();
            let stats = stats.clone();
            thread::Builder::new()
                .name("raft-log-writer".into())
                .spawn(move || run_writer(&db, &rx, &unflushed, &stats, saved))
                .map_err(write_err)?
        };
        Ok(LogStore {
            shared: Arc::new(Shared {
                db,
                unflushed,
                vote: Mutex::new(vote),
                last_purged: Mutex::new(last_purged),
                committed: Mutex::new(committed),
                queue: Some(tx),
                writer: Some(writer),
                stats,
            }),
        })
    }

    /// The store's group-commit figures.
    pub fn stats(&self) -> Arc<LogStats> {
        self.shared.stats.clone()
    }

    fn send(&self, op: Op) -> StorageResult<()> {
        let queue = self
            .shared
            .queue
            .as_ref()
            .ok_or_else(|| write_err(io::Error::other("log writer closed")))?;
        queue
            .send(op)
            .map_err(|_| write_err(io::Error::other("the log writer thread has stopped")))
    }

    /// Queues a write and waits for its transaction to commit.
    async fn send_and_wait(&self, op: impl FnOnce(Reply) -> Op) -> Result<(), String> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        self.send(op(tx)).map_err(|e| e.to_string())?;
        rx.await
            .map_err(|_| "the log writer thread has stopped".to_string())?
    }

    /// Makes `entries` readable at once and calls `done` once they are durable.
    /// `append` is this with openraft's callback.
    pub(crate) fn append_with(&self, entries: Vec<LogEntry>, done: Done) -> StorageResult<()> {
        let mut encoded = Vec::with_capacity(entries.len());
        for e in &entries {
            encoded.push((
                e.log_id,
                encode(e).map_err(|err| StorageIOError::write_log_entry(e.log_id, &err))?,
            ));
        }
        {
            let mut unflushed = self
                .shared
                .unflushed
                .write()
                .map_err(|_| write_err(io::Error::other("poisoned")))?;
            for e in entries {
                unflushed.insert(e.log_id.index, e);
            }
        }
        self.send(Op::Append {
            entries: encoded,
            done,
        })
    }

    fn read_entries(&self, start: u64, end: u64) -> StorageResult<Vec<LogEntry>> {
        if start >= end {
            return Ok(Vec::new());
        }
        // Unflushed first, then redb: the writer drops an entry from the unflushed
        // map only after committing it, so this order never misses one.
        let mut out: BTreeMap<u64, LogEntry> = {
            let unflushed = self
                .shared
                .unflushed
                .read()
                .map_err(|_| read_err(io::Error::other("poisoned")))?;
            unflushed
                .range(start..end)
                .map(|(k, v)| (*k, v.clone()))
                .collect()
        };
        let txn = self.shared.db.begin_read().map_err(read_err)?;
        let table = txn.open_table(LOG).map_err(read_err)?;
        for row in table.range(start..end).map_err(read_err)? {
            let (k, v) = row.map_err(read_err)?;
            let index = k.value();
            if let std::collections::btree_map::Entry::Vacant(slot) = out.entry(index) {
                let entry: LogEntry =
                    decode(v.value()).map_err(|e| StorageIOError::read_log_at_index(index, &e))?;
                slot.insert(entry);
            }
        }
        Ok(out.into_values().collect())
    }

    fn last_log_id(&self) -> StorageResult<Option<LogId<u64>>> {
        let pending = {
            let unflushed = self
                .shared
                .unflushed
                .read()
                .map_err(|_| read_err(io::Error::other("poisoned")))?;
            unflushed.last_key_value().map(|(_, e)| e.log_id)
        };
        let txn = self.shared.db.begin_read().map_err(read_err)?;
        let table = txn.open_table(LOG).map_err(read_err)?;
        let stored = match table.last().map_err(read_err)? {
            Some((k, v)) => {
                let e: LogEntry = decode(v.value())
                    .map_err(|e| StorageIOError::read_log_at_index(k.value(), &e))?;
                Some(e.log_id)
            }
            None => None,
        };
        Ok(pending.max(stored))
    }
}

impl RaftLogReader<TypeConfig> for LogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + Send>(
        &mut self,
        range: RB,
    ) -> StorageResult<Vec<LogEntry>> {
        let (start, end) = bounds(&range);
        self.read_entries(start, end)
    }
}

impl RaftLogStorage<TypeConfig> for LogStore {
    type LogReader = LogStore;

    async fn get_log_state(&mut self) -> StorageResult<LogState<TypeConfig>> {
        let last_purged = *self
            .shared
            .last_purged
            .lock()
            .map_err(|_| read_err(io::Error::other("poisoned")))?;
        let last = self.last_log_id()?.or(last_purged);
        Ok(LogState {
            last_purged_log_id: last_purged,
            last_log_id: last,
        })
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote<u64>) -> StorageResult<()> {
        let v = *vote;
        self.send_and_wait(|reply| Op::SaveVote { vote: v, reply })
            .await
            .map_err(|e| StorageIOError::write_vote(&io::Error::other(e)))?;
        *self
            .shared
            .vote
            .lock()
            .map_err(|_| write_err(io::Error::other("poisoned")))? = Some(v);
        Ok(())
    }

    async fn read_vote(&mut self) -> StorageResult<Option<Vote<u64>>> {
        Ok(*self
            .shared
            .vote
            .lock()
            .map_err(|_| read_err(io::Error::other("poisoned")))?)
    }

    async fn save_committed(&mut self, committed: Option<LogId<u64>>) -> StorageResult<()> {
        self.shared
            .stats
            .committed_index
            .fetch_max(index_of(&committed), Ordering::Relaxed);
        *self
            .shared
            .committed
            .lock()
            .map_err(|_| write_err(io::Error::other("poisoned")))? = committed;
        self.send(Op::SaveCommitted { committed })
    }

    async fn read_committed(&mut self) -> StorageResult<Option<LogId<u64>>> {
        Ok(*self
            .shared
            .committed
            .lock()
            .map_err(|_| read_err(io::Error::other("poisoned")))?)
    }

    async fn append<I>(&mut self, entries: I, callback: LogFlushed<TypeConfig>) -> StorageResult<()>
    where
        I: IntoIterator<Item = LogEntry> + Send,
        I::IntoIter: Send,
    {
        let entries: Vec<LogEntry> = entries.into_iter().collect();
        self.append_with(entries, Box::new(move |res| callback.log_io_completed(res)))
    }

    async fn truncate(&mut self, log_id: LogId<u64>) -> StorageResult<()> {
        self.send_and_wait(|reply| Op::Truncate {
            since: log_id.index,
            reply,
        })
        .await
        .map_err(|e| write_err(io::Error::other(e)))
    }

    async fn purge(&mut self, log_id: LogId<u64>) -> StorageResult<()> {
        self.send_and_wait(|reply| Op::Purge {
            upto: log_id,
            reply,
        })
        .await
        .map_err(|e| write_err(io::Error::other(e)))?;
        let mut last = self
            .shared
            .last_purged
            .lock()
            .map_err(|_| write_err(io::Error::other("poisoned")))?;
        if *last < Some(log_id) {
            *last = Some(log_id);
        }
        Ok(())
    }
}

/// How far the committed index may run ahead of the one on disk: what a
/// restart re-applies only after the next commit, rather than at once.
const HINT_EVERY: u64 = 1024;

fn index_of(committed: &Option<LogId<u64>>) -> u64 {
    committed.map_or(0, |c| c.index)
}

/// The writer thread: one transaction per drain of the queue.
/// `saved`: the index of the committed hint on disk.
fn run_writer(
    db: &Database,
    queue: &mpsc::Receiver<Op>,
    unflushed: &Unflushed,
    stats: &LogStats,
    mut saved: u64,
) {
    // The latest committed hint not yet written (see the module documentation).
    let mut held = None;
    while let Ok(first) = queue.recv() {
        let mut batch = Vec::new();
        for op in std::iter::once(first).chain(queue.try_iter()) {
            match op {
                Op::SaveCommitted { committed } => held = Some(committed),
                op => batch.push(op),
            }
        }
        if batch.is_empty() {
            continue;
        }
        let due = held.filter(|c| index_of(c) >= saved + HINT_EVERY);
        if let Some(committed) = due {
            // First: it covers only entries already durable.
            batch.insert(0, Op::SaveCommitted { committed });
            saved = index_of(&committed);
            held = None;
        }

        let began = std::time::Instant::now();
        let outcome = write_batch(db, &batch).map_err(|e| {
            tracing::error!(error = %e, "raft log write failed");
            e.to_string()
        });

        if outcome.is_ok() {
            stats.write_seconds.observe_duration(began.elapsed());
            let mut txns_with_appends = 0;
            let mut entries = 0;
            let mut calls = 0;
            // Safe to drop from the unflushed map now: redb has them.
            let mut map = unflushed.write().unwrap_or_else(|p| p.into_inner());
            for op in &batch {
                match op {
                    Op::Append {
                        entries: written, ..
                    } => {
                        txns_with_appends = 1;
                        calls += 1;
                        entries += written.len() as u64;
                        for (id, _) in written {
                            if map.get(&id.index).map(|e| e.log_id) == Some(*id) {
                                map.remove(&id.index);
                            }
                        }
                    }
                    Op::Truncate { since, .. } => {
                        map.split_off(since);
                    }
                    Op::Purge { upto, .. } => {
                        let keep = map.split_off(&(upto.index + 1));
                        *map = keep;
                    }
                    Op::SaveVote { .. } | Op::SaveCommitted { .. } => {}
                }
            }
            drop(map);
            stats
                .appends_txns
                .fetch_add(txns_with_appends, Ordering::Relaxed);
            stats.entries.fetch_add(entries, Ordering::Relaxed);
            stats.append_calls.fetch_add(calls, Ordering::Relaxed);
        }

        for op in batch {
            let res = outcome.clone();
            match op {
                Op::Append { done, .. } => done(res.map_err(io::Error::other)),
                Op::Truncate { reply, .. }
                | Op::Purge { reply, .. }
                | Op::SaveVote { reply, .. } => {
                    let _ = reply.send(res);
                }
                Op::SaveCommitted { .. } => {}
            }
        }
    }
    if let Some(committed) = held {
        if let Err(e) = write_batch(db, &[Op::SaveCommitted { committed }]) {
            tracing::warn!(error = %e, "cannot save the committed index on the way out");
        }
    }
}

#[derive(Debug, thiserror::Error)]
enum WriteError {
    #[error("raft log database: {0}")]
    Db(Box<redb::Error>),
    #[error("raft log record could not be encoded: {0}")]
    Encode(#[from] EncodeError),
}

fn db_err(e: impl Into<redb::Error>) -> WriteError {
    WriteError::Db(Box::new(e.into()))
}

/// Writes `batch` in one transaction, made durable (fsync) before it returns.
fn write_batch(db: &Database, batch: &[Op]) -> Result<(), WriteError> {
    let mut txn = db.begin_write().map_err(db_err)?;
    txn.set_durability(Durability::Immediate);
    for op in batch {
        apply_op(&txn, op)?;
    }
    txn.commit().map_err(db_err)?;
    Ok(())
}

fn apply_op(txn: &WriteTransaction, op: &Op) -> Result<(), WriteError> {
    match op {
        Op::Append { entries, .. } => {
            let mut log = txn.open_table(LOG).map_err(db_err)?;
            for (id, bytes) in entries {
                log.insert(id.index, bytes.as_slice()).map_err(db_err)?;
            }
        }
        Op::Truncate { since, .. } => {
            let mut log = txn.open_table(LOG).map_err(db_err)?;
            log.retain_in(*since.., |_, _| false).map_err(db_err)?;
        }
        Op::Purge { upto, .. } => {
            let mut log = txn.open_table(LOG).map_err(db_err)?;
            log.retain_in(..=upto.index, |_, _| false).map_err(db_err)?;
            let mut meta = txn.open_table(LOG_META).map_err(db_err)?;
            // Purges only move forward.
            let prev: Option<LogId<u64>> = match meta.get(LAST_PURGED).map_err(db_err)? {
                Some(v) => decode(v.value()).ok(),
                None => None,
            };
            if prev < Some(*upto) {
                meta.insert(LAST_PURGED, encode(upto)?.as_slice())
                    .map_err(db_err)?;
            }
        }
        Op::SaveVote { vote, .. } => {
            let mut meta = txn.open_table(LOG_META).map_err(db_err)?;
            meta.insert(VOTE, encode(vote)?.as_slice())
                .map_err(db_err)?;
        }
        Op::SaveCommitted { committed } => {
            let mut meta = txn.open_table(LOG_META).map_err(db_err)?;
            meta.insert(COMMITTED, encode(committed)?.as_slice())
                .map_err(db_err)?;
        }
    }
    Ok(())
}
