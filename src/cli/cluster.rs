//! `gpuq cluster`: the control plane's members and Raft progress, and the
//! commands that change the membership.

use clap::Subcommand;

use super::table::Table;
use super::{call, print_json, unexpected, CliError};
use crate::net::proto::{ApiRequest, ApiResponse, ClusterStatus};

/// `gpuq cluster ...`
#[derive(Subcommand, Debug)]
pub enum ClusterCommand {
    /// Remove a server from the membership (admins). It stops counting
    /// towards the quorum; to bring it back, wipe its data dir and join it
    /// again with a new server token.
    Remove {
        /// The server's node name, as `gpuq cluster` lists it.
        name: String,
    },
}

/// Runs `gpuq cluster [SUBCOMMAND]`.
pub async fn run(cmd: Option<ClusterCommand>, json: bool) -> Result<(), CliError> {
    match cmd {
        None => match call(ApiRequest::Cluster).await? {
            ApiResponse::Cluster { status } => print_status(&status, json),
            other => Err(unexpected(other)),
        },
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
    let mut t = Table::new(&["ID", "NAME", "ADDRESS", "ROLE", "LEADER", "MATCHED"]);
    for m in &status.members {
        t.row(vec![
            m.id.to_string(),
            m.name.clone(),
            m.addr.clone(),
            if m.voter { "voter" } else { "learner" }.into(),
            if m.leader { "*" } else { "" }.into(),
            opt(m.matched_index),
        ]);
    }
    print!("{}", t.render());
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
