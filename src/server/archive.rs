//! The leader's archiver: finished jobs older than the retention window leave
//! the in-memory active set for the on-disk history archive. The leader
//! proposes `Command::Archive { before: now - retention }`; apply does the
//! move, so every server archives the same jobs at the same log index.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use crate::clock::now_ms;
use crate::state::{Command, CommandResult};

use super::Api;

/// Runs while this server leads, until `shutdown`: checks every `retention / 4`
/// (between 100 ms and 10 s) for finished jobs past `retention`.
pub async fn run(api: Arc<Api>, retention: Duration, mut shutdown: watch::Receiver<bool>) {
    let every = (retention / 4).clamp(Duration::from_millis(100), Duration::from_secs(10));
    let mut tick = tokio::time::interval(every);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = shutdown.changed() => return,
        }
        if !api.is_leader() {
            continue;
        }
        let before = now_ms().saturating_sub(retention.as_millis() as u64);
        if !api.state().has_archivable(before) {
            continue;
        }
        match api.write(Command::Archive { before }).await {
            Ok(CommandResult::Archived { count }) => {
                tracing::debug!(count, "archived finished jobs")
            }
            Ok(other) => tracing::warn!("unexpected archive result {other:?}"),
            Err(e) => tracing::debug!("archive not committed: {e:?}"),
        }
    }
}
