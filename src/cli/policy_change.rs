//! Sending one policy change (`gpuq admin ...`, `gpuq admin ports set`) to
//! the leader and printing what it says was updated. Every admin command that
//! changes the replicated policy ends here, so they answer alike.

use super::{call, unexpected, CliError};
use crate::model::policy_change::PolicyChange;
use crate::net::proto::{ApiRequest, ApiResponse};

/// Proposes `change` and prints the leader's one-line summary of it.
pub(super) async fn send(change: PolicyChange) -> Result<(), CliError> {
    match call(ApiRequest::Admin { change }).await? {
        ApiResponse::PolicyUpdated { what } => {
            println!("{}", capitalise(&what));
            Ok(())
        }
        other => Err(unexpected(other)),
    }
}

fn capitalise(s: &str) -> String {
    let mut c = s.chars();
    match c.next() {
        Some(f) => f.to_uppercase().chain(c).collect(),
        None => String::new(),
    }
}

/// Parses a duration flag of an admin change (`30s`, `10m`, `4h`, `2d`).
pub(super) fn parse_secs(s: &str) -> Result<u64, String> {
    crate::spec::time::parse_ttl(s)
        .map(|d| d.as_secs())
        .map_err(|e| e.to_string())
}

/// The policy in force, built-ins included (`gpuq admin ... list`).
pub(super) async fn current() -> Result<crate::model::Policy, CliError> {
    match call(ApiRequest::PolicyShow).await? {
        ApiResponse::Policy { policy, .. } => Ok(*policy),
        other => Err(unexpected(other)),
    }
}
