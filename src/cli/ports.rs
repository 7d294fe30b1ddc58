//! `gpuq admin ports set|show`: the cluster's MASTER_PORT range, a setting
//! of the replicated state (set at bootstrap from `master_port_range`),
//! changed through the log like the rest of the policy.

use clap::Subcommand;

use super::{call, print_json, unexpected, CliError, JsonFlag};
use crate::model::policy_change::PolicyChange;
use crate::net::proto::{ApiRequest, ApiResponse};

// `gpuq admin ports ...`
#[derive(Subcommand, Debug)]
#[command(defer = true)]
pub enum PortsCommand {
    /// Set the range MASTER_PORT is chosen from for jobs started from now on.
    ///
    /// The range replaces the one set at bootstrap (`master_port_range` of
    /// the first server's config) on every server. Jobs already running keep
    /// their ports until they end, inside the new range or not; no port in
    /// use on a node is given to another job there. Each node can be rank 0
    /// of as many running jobs as the range has ports.
    Set {
        /// FIRST-LAST, inclusive, ports 1024 to 65535 (e.g. 29500-30499).
        range: String,
    },
    /// Print the range.
    Show {
        #[command(flatten)]
        json: JsonFlag,
    },
}

/// Runs `gpuq admin ports ...`.
pub async fn run(cmd: PortsCommand) -> Result<(), CliError> {
    match cmd {
        PortsCommand::Set { range } => {
            super::policy_change::send(PolicyChange::MasterPorts { range }).await
        }
        PortsCommand::Show { json } => {
            let range = match call(ApiRequest::PolicyShow).await? {
                ApiResponse::Policy { master_ports, .. } => master_ports,
                other => return Err(unexpected(other)),
            };
            if json.json {
                return print_json(&serde_json::json!({
                    "master_port_range": range.to_string(),
                    "first": range.first,
                    "last": range.last,
                    "ports": range.len(),
                }));
            }
            println!("master_port_range {range} ({} ports)", range.len());
            Ok(())
        }
    }
}
