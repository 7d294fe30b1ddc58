//! Backup files: the state machine as a snapshot (state, last applied log
//! id, membership), written atomically and readable only by its owner (it
//! holds the cluster CA key).
//!
//! Format: `gpuq-backup/1\n`, the body's length (8 bytes, big-endian), the
//! body (MessagePack of [`Backup`]), and the body's SHA-256, so a truncated
//! or damaged file is refused before anything is restored from it.

use std::io::{Cursor, Write};
use std::path::{Path, PathBuf};

use openraft::storage::{RaftLogStorage, RaftStateMachine};
use openraft::{Membership, SnapshotMeta, StoredMembership, Vote};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::{open_storage, RaftError, ServerNode};
use crate::state::codec;

const MAGIC: &[u8] = b"gpuq-backup/1\n";

/// A snapshot of the replicated state, as saved.
#[derive(Serialize, Deserialize)]
pub struct Backup {
    pub meta: SnapshotMeta<u64, ServerNode>,
    #[serde(with = "serde_bytes")]
    pub data: Vec<u8>,
}

/// Why a backup file cannot be written or used.
#[derive(Debug, thiserror::Error)]
pub enum BackupError {
    #[error("cannot {action} {path}: {source}")]
    Io {
        action: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path} is not a gpuq backup (made by `gpuq cluster snapshot save`)")]
    NotBackup { path: PathBuf },
    #[error("{path} is truncated: it holds {found} of {expected} bytes; copy it again")]
    Truncated {
        path: PathBuf,
        found: usize,
        expected: usize,
    },
    #[error("{path} is damaged (its checksum does not match); use another copy")]
    Damaged { path: PathBuf },
    #[error("{path} cannot be decoded: {reason}")]
    Decode { path: PathBuf, reason: String },
}

/// Exports the applied state of the store in `db`.
pub fn export(db: &redb::Database) -> Result<Backup, String> {
    let (meta, data) = super::state_machine::export(db)?;
    Ok(Backup { meta, data })
}

/// Writes `backup` to `path` atomically (a temp file renamed over it), 0600.
pub fn write(path: &Path, backup: &Backup) -> Result<u64, BackupError> {
    use std::os::unix::fs::OpenOptionsExt;
    let io = |action, source| BackupError::Io {
        action,
        path: path.to_path_buf(),
        source,
    };
    let body = codec::encode(backup).map_err(|e| BackupError::Decode {
        path: path.to_path_buf(),
        reason: e.to_string(),
    })?;
    let tmp = path.with_extension(format!("tmp-{}", std::process::id()));
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&tmp)
        .map_err(|e| io("create", e))?;
    let written = (|| {
        f.write_all(MAGIC)?;
        f.write_all(&(body.len() as u64).to_be_bytes())?;
        f.write_all(&body)?;
        f.write_all(&Sha256::digest(&body))?;
        f.sync_all()
    })();
    if let Err(e) = written.and_then(|_| std::fs::rename(&tmp, path)) {
        let _ = std::fs::remove_file(&tmp);
        return Err(io("write", e));
    }
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        if let Ok(d) = std::fs::File::open(dir) {
            let _ = d.sync_all();
        }
    }
    Ok((MAGIC.len() + 8 + body.len() + 32) as u64)
}

/// Reads and checks a backup file.
pub fn read(path: &Path) -> Result<Backup, BackupError> {
    let bytes = std::fs::read(path).map_err(|source| BackupError::Io {
        action: "read",
        path: path.to_path_buf(),
        source,
    })?;
    let p = || path.to_path_buf();
    let rest = bytes
        .strip_prefix(MAGIC)
        .ok_or(BackupError::NotBackup { path: p() })?;
    if rest.len() < 8 {
        return Err(BackupError::Truncated {
            path: p(),
            found: bytes.len(),
            expected: MAGIC.len() + 8,
        });
    }
    let len = u64::from_be_bytes(rest[..8].try_into().expect("8 bytes")) as usize;
    let expected = MAGIC.len() + 8 + len.saturating_add(32);
    if bytes.len() < expected {
        return Err(BackupError::Truncated {
            path: p(),
            found: bytes.len(),
            expected,
        });
    }
    let body = &rest[8..8 + len];
    if Sha256::digest(body).as_slice() != &rest[8 + len..8 + len + 32] {
        return Err(BackupError::Damaged { path: p() });
    }
    codec::decode(body).map_err(|e| BackupError::Decode {
        path: p(),
        reason: e.to_string(),
    })
}

/// Creates the store at `db_path` from `backup`, as a one-voter cluster of
/// `node_id` at `node`: the state is installed as a snapshot, and the vote
/// carries the backup's term, so the node's first election continues the
/// log's terms.
pub async fn restore(
    db_path: &Path,
    backup: Backup,
    node_id: u64,
    node: ServerNode,
) -> Result<(), RaftError> {
    let (mut log, mut sm) = open_storage(db_path).await?;
    let last = backup.meta.last_log_id;
    let membership = Membership::new(
        vec![std::collections::BTreeSet::from([node_id])],
        std::collections::BTreeMap::from([(node_id, node)]),
    );
    let meta = SnapshotMeta {
        last_log_id: last,
        last_membership: StoredMembership::new(last, membership),
        snapshot_id: format!("restored-{}", last.map(|l| l.index).unwrap_or(0)),
    };
    sm.install_snapshot(&meta, Box::new(Cursor::new(backup.data)))
        .await?;
    let term = last.map(|l| l.leader_id.term).unwrap_or(0);
    log.save_vote(&Vote::new(term, node_id)).await?;
    Ok(())
}
