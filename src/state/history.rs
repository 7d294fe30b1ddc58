//! The history archive: finished jobs leave the in-memory active set after a
//! retention window and live on in redb tables, so memory stays bounded while
//! `gpuq show` and `gpuq acct` still answer for them.
//!
//! The move is a log entry (`Command::Archive { before }`, proposed by the
//! leader with `before = now - retention`), so every server archives the same
//! jobs at the same index. Apply moves the jobs from `State::jobs` to
//! `State::archiving`; the state machine writes them to the history tables in
//! the same transaction that deletes their active rows, then empties
//! `archiving`. A reader that looks in `jobs`, then `archiving`, then the
//! tables therefore always finds a job.
//!
//! Tables (in the same redb file as the log and the active state):
//! `history_jobs` (id -> Job), `history_by_end` ((end, id) -> ()),
//! `history_by_user` and `history_by_account` (name ->> id, multimaps).

use redb::{
    MultimapTableDefinition, ReadTransaction, ReadableMultimapTable, ReadableTable,
    ReadableTableMetadata, TableDefinition, WriteTransaction,
};

use super::codec::{decode, encode};
use super::store_error::StoreError;
use super::{CommandResult, Dirty, State};
use crate::model::acct::{account_of, AcctFilter};
use crate::model::{Job, JobId, Millis};

const HISTORY: TableDefinition<u64, &[u8]> = TableDefinition::new("history_jobs");
const BY_END: TableDefinition<(u64, u64), ()> = TableDefinition::new("history_by_end");
const BY_USER: MultimapTableDefinition<&str, u64> = MultimapTableDefinition::new("history_by_user");
const BY_ACCOUNT: MultimapTableDefinition<&str, u64> =
    MultimapTableDefinition::new("history_by_account");

macro_rules! db {
    ($e:expr) => {
        $e.map_err(|e| StoreError::Db(Box::new(e.into())))
    };
}

impl State {
    /// Moves every finished job that ended at or before `before` out of the
    /// active set (into `archiving`, for the store to write).
    pub(super) fn archive(&mut self, before: Millis, dirty: &mut Dirty) -> CommandResult {
        let ids: Vec<JobId> = self
            .jobs
            .values()
            .filter(|j| j.state.is_final() && j.end_time.is_some_and(|e| e <= before))
            .map(|j| j.id)
            .collect();
        for id in &ids {
            if let Some(job) = self.jobs.remove(id) {
                self.archiving.push(job);
                dirty.jobs.insert(*id);
            }
        }
        if !ids.is_empty() {
            dirty.archived = true;
        }
        CommandResult::Archived {
            count: ids.len() as u64,
        }
    }

    /// Whether some finished job ended at or before `before` (the leader asks
    /// before proposing an `Archive`).
    pub fn has_archivable(&self, before: Millis) -> bool {
        self.jobs
            .values()
            .any(|j| j.state.is_final() && j.end_time.is_some_and(|e| e <= before))
    }

    /// A job being archived right now (between apply and the store's commit).
    pub fn archiving_job(&self, id: JobId) -> Option<&Job> {
        self.archiving.iter().find(|j| j.id == id)
    }
}

/// Creates the history tables if missing.
pub fn create_tables(txn: &WriteTransaction) -> Result<(), StoreError> {
    db!(txn.open_table(HISTORY))?;
    db!(txn.open_table(BY_END))?;
    db!(txn.open_multimap_table(BY_USER))?;
    db!(txn.open_multimap_table(BY_ACCOUNT))?;
    Ok(())
}

/// Deletes every history table (installing a snapshot).
pub fn delete_tables(txn: &WriteTransaction) -> Result<(), StoreError> {
    db!(txn.delete_table(HISTORY))?;
    db!(txn.delete_table(BY_END))?;
    db!(txn.delete_multimap_table(BY_USER))?;
    db!(txn.delete_multimap_table(BY_ACCOUNT))?;
    create_tables(txn)
}

/// Writes archived jobs and their index entries.
pub fn write(txn: &WriteTransaction, jobs: &[Job]) -> Result<(), StoreError> {
    if jobs.is_empty() {
        return Ok(());
    }
    let mut rows = db!(txn.open_table(HISTORY))?;
    for job in jobs {
        db!(rows.insert(job.id.0, encode(job)?.as_slice()))?;
    }
    drop(rows);
    index(txn, jobs.iter())
}

fn index<'a>(
    txn: &WriteTransaction,
    jobs: impl Iterator<Item = &'a Job>,
) -> Result<(), StoreError> {
    let mut by_end = db!(txn.open_table(BY_END))?;
    let mut by_user = db!(txn.open_multimap_table(BY_USER))?;
    let mut by_account = db!(txn.open_multimap_table(BY_ACCOUNT))?;
    for job in jobs {
        db!(by_end.insert((job.end_time.unwrap_or(0), job.id.0), ()))?;
        db!(by_user.insert(job.user.as_str(), job.id.0))?;
        db!(by_account.insert(account_of(job), job.id.0))?;
    }
    Ok(())
}

/// One archived job.
pub fn get(txn: &ReadTransaction, id: JobId) -> Result<Option<Job>, StoreError> {
    let rows = match txn.open_table(HISTORY) {
        Ok(t) => t,
        Err(redb::TableError::TableDoesNotExist(_)) => return Ok(None),
        Err(e) => return Err(StoreError::Db(Box::new(e.into()))),
    };
    match db!(rows.get(id.0))? {
        Some(v) => Ok(Some(
            decode(v.value()).map_err(StoreError::decoding(format!("archived job {id}")))?,
        )),
        None => Ok(None),
    }
}

/// How many jobs the archive holds.
pub fn len(txn: &ReadTransaction) -> Result<u64, StoreError> {
    match txn.open_table(HISTORY) {
        Ok(t) => db!(t.len()),
        Err(redb::TableError::TableDoesNotExist(_)) => Ok(0),
        Err(e) => Err(StoreError::Db(Box::new(e.into()))),
    }
}

/// The archived jobs `filter` selects, in id order. The narrowest index
/// decides which rows are read: a user's or an account's ids, or the range
/// of end times from `since`; every row read is then checked in full.
pub fn query(txn: &ReadTransaction, filter: &AcctFilter) -> Result<Vec<Job>, StoreError> {
    let rows = match txn.open_table(HISTORY) {
        Ok(t) => t,
        Err(redb::TableError::TableDoesNotExist(_)) => return Ok(Vec::new()),
        Err(e) => return Err(StoreError::Db(Box::new(e.into()))),
    };
    let mut ids: Option<Vec<u64>> = None;
    if !filter.ids.is_empty() {
        // A job's row, or an array's tasks: their ids follow the array's
        // own (one submit numbers them in a row), so read from it on while
        // rows belong to it.
        let mut v = Vec::new();
        for &JobId(first) in &filter.ids {
            for row in db!(rows.range(first..))? {
                let (k, bytes) = db!(row)?;
                let id = k.value();
                let job: Job = decode(bytes.value())
                    .map_err(StoreError::decoding(format!("archived job {id}")))?;
                if id != first && job.array.is_none_or(|a| a.array_job != JobId(first)) {
                    break;
                }
                v.push(id);
            }
        }
        v.sort_unstable();
        v.dedup();
        ids = Some(v);
    } else if let Some(user) = &filter.user {
        let t = db!(txn.open_multimap_table(BY_USER))?;
        ids = Some(collect_multimap(&t, user)?);
    } else if let Some(account) = &filter.account {
        let t = db!(txn.open_multimap_table(BY_ACCOUNT))?;
        ids = Some(collect_multimap(&t, account)?);
    } else if let Some(since) = filter.since {
        let t = db!(txn.open_table(BY_END))?;
        let mut v = Vec::new();
        for row in db!(t.range((since, 0)..))? {
            let (k, _) = db!(row)?;
            v.push(k.value().1);
        }
        v.sort_unstable();
        ids = Some(v);
    }
    let mut out = Vec::new();
    let limit = filter.limit.map_or(usize::MAX, |l| l as usize);
    let after = filter.after.map_or(0, |a| a.0 + 1);
    let mut keep = |id: u64, bytes: &[u8]| -> Result<bool, StoreError> {
        let job: Job = decode(bytes).map_err(StoreError::decoding(format!("archived job {id}")))?;
        if filter.matches(&job) {
            out.push(job);
        }
        Ok(out.len() < limit)
    };
    match ids {
        Some(ids) => {
            for id in ids.into_iter().filter(|&id| id >= after) {
                if let Some(v) = db!(rows.get(id))? {
                    if !keep(id, v.value())? {
                        break;
                    }
                }
            }
        }
        None => {
            for row in db!(rows.range(after..))? {
                let (k, v) = db!(row)?;
                if !keep(k.value(), v.value())? {
                    break;
                }
            }
        }
    }
    Ok(out)
}

fn collect_multimap(
    t: &impl ReadableMultimapTable<&'static str, u64>,
    key: &str,
) -> Result<Vec<u64>, StoreError> {
    let mut v = Vec::new();
    for id in db!(t.get(key))? {
        v.push(db!(id)?.value());
    }
    Ok(v)
}

/// Appends every archived row to `out` as (id u64 LE, length u32 LE, bytes):
/// the snapshot's history section, copied without decoding.
pub fn dump(txn: &ReadTransaction, out: &mut Vec<u8>) -> Result<u64, StoreError> {
    let rows = match txn.open_table(HISTORY) {
        Ok(t) => t,
        Err(redb::TableError::TableDoesNotExist(_)) => return Ok(0),
        Err(e) => return Err(StoreError::Db(Box::new(e.into()))),
    };
    let mut n = 0;
    for row in db!(rows.iter())? {
        let (k, v) = db!(row)?;
        let bytes = v.value();
        out.extend_from_slice(&k.value().to_le_bytes());
        out.extend_from_slice(&(bytes.len() as u32).to_le_bytes());
        out.extend_from_slice(bytes);
        n += 1;
    }
    Ok(n)
}

/// Replaces the archive with the rows of a snapshot's history section (made by
/// `dump`), rebuilding the indexes.
pub fn restore(txn: &WriteTransaction, mut section: &[u8]) -> Result<u64, StoreError> {
    delete_tables(txn)?;
    let mut rows = db!(txn.open_table(HISTORY))?;
    let mut jobs = Vec::new();
    let mut n = 0;
    while !section.is_empty() {
        let bad = || StoreError::Snapshot("the history section is cut short".into());
        let id = u64::from_le_bytes(
            section
                .get(..8)
                .ok_or_else(bad)?
                .try_into()
                .unwrap_or([0; 8]),
        );
        let len = u32::from_le_bytes(
            section
                .get(8..12)
                .ok_or_else(bad)?
                .try_into()
                .unwrap_or([0; 4]),
        ) as usize;
        let bytes = section.get(12..12 + len).ok_or_else(bad)?;
        let job: Job = decode(bytes).map_err(StoreError::decoding(format!(
            "archived job {id} in the snapshot"
        )))?;
        db!(rows.insert(id, bytes))?;
        jobs.push(job);
        section = &section[12 + len..];
        n += 1;
        // Index in slices so a million-job archive is not decoded all at once.
        if jobs.len() >= 10_000 {
            index(txn, jobs.iter())?;
            jobs.clear();
        }
    }
    drop(rows);
    index(txn, jobs.iter())?;
    Ok(n)
}
