//! Persistence of `State` in redb tables, inside transactions the caller owns
//! (the Raft state machine writes the applied index in the same transaction, so
//! state and index never disagree after a crash).
//!
//! Tables: `jobs` (id -> Job), `tokens` (id -> TokenRecord), `nodes` (name ->
//! NodeRecord), `state_meta` (`cluster`, `counters`, `policy`, `usage`, `api_tokens`),
//! and the history archive's
//! tables (`history`). Values are MessagePack with named fields (`codec`), so
//! records written by an older build still decode after an upgrade.
//!
//! A snapshot is `SNAPSHOT_MAGIC`, the active state's length (u64 LE), the
//! active state (MessagePack), then the history section: the archived rows as
//! stored, copied without decoding (see `history::dump`). Bytes without the
//! magic are an older build's snapshot: the active state alone.

use redb::{ReadTransaction, ReadableTable, TableDefinition, WriteTransaction};

use super::codec::{decode, encode};
use super::{Dirty, State};

pub use super::store_error::StoreError;

const JOBS: TableDefinition<u64, &[u8]> = TableDefinition::new("jobs");
const TOKENS: TableDefinition<&str, &[u8]> = TableDefinition::new("tokens");
const META: TableDefinition<&str, &[u8]> = TableDefinition::new("state_meta");
const NODES: TableDefinition<&str, &[u8]> = TableDefinition::new("nodes");

macro_rules! db {
    ($e:expr) => {
        $e.map_err(|e| StoreError::Db(Box::new(e.into())))
    };
}

/// Creates the tables if they are missing, so readers never see a missing table.
pub fn create_tables(txn: &WriteTransaction) -> Result<(), StoreError> {
    db!(txn.open_table(JOBS))?;
    db!(txn.open_table(TOKENS))?;
    db!(txn.open_table(META))?;
    db!(txn.open_table(NODES))?;
    super::history::create_tables(txn)?;
    Ok(())
}

/// Loads the whole state. Missing tables read as an empty state.
pub fn load(txn: &ReadTransaction) -> Result<State, StoreError> {
    let mut state = State::default();
    match txn.open_table(META) {
        Ok(meta) => {
            if let Some(v) = db!(meta.get("cluster"))? {
                state.cluster = Some(decode(v.value()).map_err(StoreError::decoding("cluster"))?);
            }
            if let Some(v) = db!(meta.get("counters"))? {
                state.counters = decode(v.value()).map_err(StoreError::decoding("counters"))?;
            }
            if let Some(v) = db!(meta.get("policy"))? {
                state.policy = decode(v.value()).map_err(StoreError::decoding("policy"))?;
            }
            if let Some(v) = db!(meta.get("usage"))? {
                state.usage = decode(v.value()).map_err(StoreError::decoding("usage"))?;
            }
            if let Some(v) = db!(meta.get("services"))? {
                state.services = decode(v.value()).map_err(StoreError::decoding("services"))?;
            }
            if let Some(v) = db!(meta.get("power"))? {
                state.power = decode(v.value()).map_err(StoreError::decoding("power"))?;
            }
            if let Some(v) = db!(meta.get("api_tokens"))? {
                state.api_tokens = decode(v.value()).map_err(StoreError::decoding("api_tokens"))?;
            }
        }
        Err(redb::TableError::TableDoesNotExist(_)) => return Ok(state),
        Err(e) => return Err(StoreError::Db(Box::new(e.into()))),
    }
    let jobs = db!(txn.open_table(JOBS))?;
    for row in db!(jobs.iter())? {
        let (k, v) = db!(row)?;
        let job: crate::model::Job =
            decode(v.value()).map_err(StoreError::decoding(format!("job {}", k.value())))?;
        state.jobs.insert(job.id, job);
    }
    let tokens = db!(txn.open_table(TOKENS))?;
    for row in db!(tokens.iter())? {
        let (k, v) = db!(row)?;
        let t: crate::model::TokenRecord =
            decode(v.value()).map_err(StoreError::decoding(format!("token {}", k.value())))?;
        state.tokens.insert(t.id.clone(), t);
    }
    match txn.open_table(NODES) {
        Ok(nodes) => {
            for row in db!(nodes.iter())? {
                let (k, v) = db!(row)?;
                let n: super::NodeRecord = decode(v.value())
                    .map_err(StoreError::decoding(format!("node {}", k.value())))?;
                state.nodes.insert(k.value().to_string(), n);
            }
        }
        Err(redb::TableError::TableDoesNotExist(_)) => {}
        Err(e) => return Err(StoreError::Db(Box::new(e.into()))),
    }
    state.rebuild_index();
    Ok(state)
}

/// Writes the records named in `dirty` as they are now in `state` (a record no
/// longer in `state` is deleted).
pub fn write_dirty(txn: &WriteTransaction, state: &State, dirty: &Dirty) -> Result<(), StoreError> {
    if dirty.meta {
        let mut meta = db!(txn.open_table(META))?;
        match &state.cluster {
            Some(c) => db!(meta.insert("cluster", encode(c)?.as_slice()))?,
            None => db!(meta.remove("cluster"))?,
        };
        db!(meta.insert("counters", encode(&state.counters)?.as_slice()))?;
        db!(meta.insert("policy", encode(&state.policy)?.as_slice()))?;
        db!(meta.insert("usage", encode(&state.usage)?.as_slice()))?;
        if !state.api_tokens.is_empty() {
            db!(meta.insert("api_tokens", encode(&state.api_tokens)?.as_slice()))?;
        }
        if state.services.is_empty() {
            db!(meta.remove("services"))?;
        } else {
            db!(meta.insert("services", encode(&state.services)?.as_slice()))?;
        }
        if state.power.is_empty() {
            db!(meta.remove("power"))?;
        } else {
            db!(meta.insert("power", encode(&state.power)?.as_slice()))?;
        }
    }
    if !dirty.jobs.is_empty() {
        let mut jobs = db!(txn.open_table(JOBS))?;
        for id in &dirty.jobs {
            match state.jobs.get(id) {
                Some(j) => db!(jobs.insert(id.0, encode(j)?.as_slice()))?,
                None => db!(jobs.remove(id.0))?,
            };
        }
    }
    if !dirty.nodes.is_empty() {
        let mut nodes = db!(txn.open_table(NODES))?;
        for name in &dirty.nodes {
            match state.nodes.get(name) {
                Some(n) => db!(nodes.insert(name.as_str(), encode(n)?.as_slice()))?,
                None => db!(nodes.remove(name.as_str()))?,
            };
        }
    }
    if dirty.archived {
        super::history::write(txn, &state.archiving)?;
    }
    if !dirty.tokens.is_empty() {
        let mut tokens = db!(txn.open_table(TOKENS))?;
        for id in &dirty.tokens {
            match state.tokens.get(id) {
                Some(t) => db!(tokens.insert(id.as_str(), encode(t)?.as_slice()))?,
                None => db!(tokens.remove(id.as_str()))?,
            };
        }
    }
    Ok(())
}

/// Marks a snapshot in this file's format.
const SNAPSHOT_MAGIC: &[u8; 8] = b"GPQSNAP2";

/// Replaces every state table with `state` and the archive with the rows of
/// `history` (a snapshot's history section), when installing a snapshot.
pub fn replace_all(
    txn: &WriteTransaction,
    state: &State,
    history: &[u8],
) -> Result<(), StoreError> {
    db!(txn.delete_table(JOBS))?;
    db!(txn.delete_table(TOKENS))?;
    db!(txn.delete_table(META))?;
    db!(txn.delete_table(NODES))?;
    create_tables(txn)?;
    super::history::restore(txn, history)?;
    let dirty = Dirty {
        meta: true,
        jobs: state.jobs.keys().copied().collect(),
        tokens: state.tokens.keys().cloned().collect(),
        nodes: state.nodes.keys().cloned().collect(),
        archived: false,
    };
    write_dirty(txn, state, &dirty)
}

/// Encodes `state` and a history section (from `history::dump`) as a snapshot.
pub fn to_snapshot_bytes(state: &State, history: &[u8]) -> Result<Vec<u8>, StoreError> {
    let active = encode(state)?;
    let mut out = Vec::with_capacity(16 + active.len() + history.len());
    out.extend_from_slice(SNAPSHOT_MAGIC);
    out.extend_from_slice(&(active.len() as u64).to_le_bytes());
    out.extend_from_slice(&active);
    out.extend_from_slice(history);
    Ok(out)
}

/// Builds a snapshot of everything `txn` sees: active state and archive.
pub fn snapshot_of(txn: &ReadTransaction) -> Result<Vec<u8>, StoreError> {
    let state = load(txn)?;
    let mut history = Vec::new();
    super::history::dump(txn, &mut history)?;
    to_snapshot_bytes(&state, &history)
}

/// Decodes a snapshot into the active state and its history section.
pub fn from_snapshot_bytes(bytes: &[u8]) -> Result<(State, &[u8]), StoreError> {
    let Some(rest) = bytes.strip_prefix(SNAPSHOT_MAGIC.as_slice()) else {
        let mut state: State = decode(bytes).map_err(StoreError::decoding("snapshot"))?;
        state.rebuild_index();
        return Ok((state, &[]));
    };
    let short = || StoreError::Snapshot("it ends inside its header".into());
    let len = u64::from_le_bytes(
        rest.get(..8)
            .ok_or_else(short)?
            .try_into()
            .unwrap_or([0; 8]),
    );
    let len = usize::try_from(len).map_err(|_| short())?;
    let end = len.checked_add(8).ok_or_else(short)?;
    let active = rest.get(8..end).ok_or_else(short)?;
    let mut state: State = decode(active).map_err(StoreError::decoding("snapshot"))?;
    check_keys(&state)?;
    state.rebuild_index();
    Ok((state, &rest[end..]))
}

/// Refuses a snapshot whose records are filed under another key than their
/// own id or name: the indexes are built from the keys and looked up by the
/// ids, so a mismatch would leave them out of step with the state.
fn check_keys(state: &State) -> Result<(), StoreError> {
    let misfiled = |what: &str, key: &dyn std::fmt::Display, own: &dyn std::fmt::Display| {
        StoreError::Snapshot(format!("{what} {own} is filed under {key}"))
    };
    if let Some((key, job)) = state.jobs.iter().find(|(k, j)| **k != j.id) {
        return Err(misfiled("job", key, &job.id));
    }
    if let Some((key, t)) = state.tokens.iter().find(|(k, t)| **k != t.id) {
        return Err(misfiled("token", key, &t.id));
    }
    if let Some((key, n)) = state.nodes.iter().find(|(k, n)| **k != n.inventory.name) {
        return Err(misfiled("node", key, &n.inventory.name));
    }
    Ok(())
}
