//! Backup and restore of a whole cluster: `gpuq cluster snapshot save FILE`
//! (on any server, admins) writes the applied state; `gpuq cluster snapshot
//! restore FILE --data-dir D` (offline) makes D the data dir of a new
//! one-voter cluster with every job, node, token and the CA of the old one.
//! More servers then join it with server tokens.

use std::net::SocketAddr;
use std::path::Path;

use anyhow::{bail, Context};

use crate::model::Role;
use crate::net::pki::ClusterCa;
use crate::net::proto::{ApiResponse, Caller, ErrorKind};
use crate::raft::{backup, ServerNode};

use super::{Api, DataDir};

impl Api {
    /// Writes this server's applied state to `path` (absolute, on this host).
    pub(super) async fn snapshot_save(
        &self,
        caller: &Caller,
        path: std::path::PathBuf,
    ) -> ApiResponse {
        if !caller.admin {
            return ApiResponse::error(
                ErrorKind::Forbidden,
                "saving a snapshot needs an admin (root, or a member of admin_group): it holds the cluster CA key",
            );
        }
        if !path.is_absolute() {
            return ApiResponse::error(
                ErrorKind::BadInput,
                format!("{} is not an absolute path", path.display()),
            );
        }
        let db = self.raft_node().db.clone();
        let jobs = self.state().jobs.len() as u64;
        let result = tokio::task::spawn_blocking(move || {
            let b = backup::export(&db)?;
            let index = b.meta.last_log_id.map(|l| l.index).unwrap_or(0);
            let term = b.meta.last_log_id.map(|l| l.leader_id.term).unwrap_or(0);
            let bytes = backup::write(&path, &b).map_err(|e| e.to_string())?;
            Ok::<_, String>((path, index, term, bytes))
        })
        .await
        .map_err(|e| e.to_string())
        .and_then(|r| r);
        match result {
            Ok((path, index, term, bytes)) => ApiResponse::SnapshotSaved {
                path,
                index,
                term,
                jobs,
                bytes,
            },
            Err(e) => ApiResponse::error(ErrorKind::BadInput, e),
        }
    }
}

/// Creates the data dir `data_dir` of a new one-voter cluster from the backup
/// at `file`; the server then starts with no flags.
pub async fn restore(
    file: &Path,
    data_dir: &Path,
    node_name: &str,
    advertise: SocketAddr,
) -> anyhow::Result<String> {
    let b = backup::read(file)?;
    if data_dir.exists()
        && std::fs::read_dir(data_dir)
            .map(|mut d| d.next().is_some())
            .unwrap_or(true)
    {
        bail!(
            "{} is not empty: restore into a new data dir (a restore never overwrites one)",
            data_dir.display()
        );
    }
    let (state, _history) = crate::state::store::from_snapshot_bytes(&b.data)
        .map_err(|e| anyhow::anyhow!("{} holds an unreadable state: {e}", file.display()))?;
    let Some(cluster) = state.cluster.as_ref() else {
        bail!(
            "{} holds no cluster identity (CA): it was saved before the cluster was initialised",
            file.display()
        );
    };
    let ca = ClusterCa {
        cert_pem: cluster.ca_cert_pem.clone(),
        key_pem: cluster.ca_key_pem.clone(),
    };
    let identity = ca
        .issue(Role::Server, node_name)
        .context("cannot issue this server's certificate")?;
    let jobs = state.jobs.len();
    let index = b.meta.last_log_id.map(|l| l.index).unwrap_or(0);
    let dir = DataDir::open(data_dir)?;
    let node_id = dir.save_restored(&identity)?;
    let node = ServerNode {
        name: node_name.to_string(),
        addr: advertise.to_string(),
    };
    if let Err(e) = backup::restore(&dir.private_store()?, b, node_id, node).await {
        let _ = std::fs::remove_dir_all(data_dir);
        return Err(e).context("cannot write the restored state");
    }
    Ok(format!(
        "Restored {jobs} active jobs and the history archive (log index {index}) into {}: start it with \
         `gpuq server --data-dir {} --node-name {node_name} --listen {advertise}`",
        data_dir.display(),
        data_dir.display()
    ))
}
