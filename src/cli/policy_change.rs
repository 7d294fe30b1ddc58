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
