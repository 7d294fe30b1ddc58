//! `gpuq cluster`: the control plane's members and Raft progress, and the
//! commands that change the membership.

use clap::Subcommand;

use super::table::Table;
use super::{call, print_json, unexpected, CliError};
use crate::net::proto::{ApiRequest, ApiResponse, ClusterStatus};

// `gpuq cluster ...`
#[derive(Subcommand, Debug)]
#[command(defer = true)]
pub enum ClusterCommand {
    /// Remove a server from the membership (admins). It stops counting
    /// towards the quorum; to bring it back, wipe its data dir and join it
    /// again with a new server token.
    Remove {
        /// The server's node name, as `gpuq cluster` lists it.
        name: String,
    },
    /// Back up or restore the whole cluster state.
    #[command(subcommand)]
    Snapshot(SnapshotCommand),
}

// `gpuq cluster snapshot ...`
#[derive(Subcommand, Debug)]
#[command(defer = true)]
pub enum SnapshotCommand {
    /// Write the state (jobs, nodes, tokens, the CA key, membership) to FILE
    /// on this server's host, atomically and mode 0600 (admins; any server).
    Save {
        file: std::path::PathBuf,
        #[command(flatten)]
        json: super::JsonFlag,
    },
    /// Offline: make a new data dir D from FILE; a server started on it is a
    /// new one-voter cluster with all of FILE's state. Others join it.
    Restore {
        file: std::path::PathBuf,
        /// The new data dir (must not exist or be empty).
        #[arg(long)]
        data_dir: std::path::PathBuf,
        /// The restored server's node name.
        #[arg(long)]
        node_name: String,
        /// The IP:PORT the restored server will listen on and advertise.
        #[arg(long)]
        advertise: std::net::SocketAddr,
    },
}

/// Runs `gpuq cluster [SUBCOMMAND]`.
pub async fn run(cmd: Option<ClusterCommand>, json: bool) -> Result<(), CliError> {
    match cmd {
        None => match call(ApiRequest::Cluster).await? {
            ApiResponse::Cluster { status } => print_status(&status, json),
            other => Err(unexpected(other)),
        },
        Some(ClusterCommand::Snapshot(SnapshotCommand::Save { file, json: flag })) => {
            let path = std::path::absolute(&file)
                .map_err(|e| CliError::input(format!("{}: {e}", file.display())))?;
            match call(ApiRequest::SnapshotSave { path }).await? {
                ApiResponse::SnapshotSaved {
                    path,
                    index,
                    term,
                    jobs,
                    bytes,
                } => {
                    if json || flag.json {
                        return print_json(&serde_json::json!({
                            "path": path, "index": index, "term": term, "jobs": jobs, "bytes": bytes,
                        }));
                    }
                    println!(
                        "Saved {jobs} jobs at log index {index} (term {term}), {bytes} bytes, to {}",
                        path.display()
                    );
                    Ok(())
                }
                other => Err(unexpected(other)),
            }
        }
        Some(ClusterCommand::Snapshot(SnapshotCommand::Restore { .. })) => Err(CliError::internal(
            "gpuq cluster snapshot restore runs offline, in the gpuq binary's main",
        )),
        Some(ClusterCommand::Remove { name }) => {
            match call(ApiRequest::RemoveServer { name }).await? {
                ApiResponse::ServerRemoved { name } => {
                    println!("Removed server {name} from the cluster");
                    Ok(())
                }
                other => Err(unexpected(other)),
            }
        }
    }
}

fn print_status(status: &ClusterStatus, json: bool) -> Result<(), CliError> {
    if json {
        return print_json(&status);
    }
    let opt = |v: Option<u64>| v.map(|v| v.to_string()).unwrap_or_else(|| "-".into());
    println!(
        "cluster {}  leader {}  term {}  last log {}  applied {}  snapshot {}",
        status.cluster_name,
        status.leader.as_deref().unwrap_or("(none)"),
        status.term,
        opt(status.last_log_index),
        opt(status.applied_index),
        opt(status.snapshot_index)
    );
    let mut t = Table::new(&[
        "ID", "NAME", "ADDRESS", "ROLE", "LEADER", "MATCHED", "LAG", "CONTACT", "HEALTH",
    ]);
    for m in &status.members {
        t.row(vec![
            m.id.to_string(),
            m.name.clone(),
            m.addr.clone(),
            if m.voter { "voter" } else { "learner" }.into(),
            if m.leader { "*" } else { "" }.into(),
            opt(m.matched_index),
            opt(m.lag),
            m.last_contact_ms
                .map(|ms| format!("{ms} ms"))
                .unwrap_or_else(|| "-".into()),
            match (&m.problem, m.last_contact_ms) {
                (Some(p), _) => format!("UNHEALTHY: {p}"),
                (None, Some(_)) => "ok".into(),
                (None, None) => "-".into(),
            },
        ]);
    }
    print!("{}", t.render());
    if !status.members.iter().any(|m| m.last_contact_ms.is_some()) {
        println!("(lag, contact and health are known to the leader: run this on it for them)");
    }
    let jobs: Vec<String> = status
        .jobs
        .iter()
        .map(|(s, n)| format!("{s} {n}"))
        .collect();
    println!(
        "jobs: {}",
        if jobs.is_empty() {
            "none".into()
        } else {
            jobs.join(", ")
        }
    );
    Ok(())
}
