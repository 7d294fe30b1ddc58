//! The node's health-check command (config `health_check`): run every
//! interval with a timeout; its latest result (passed, and its output) is
//! published for the leader connection, which reports changes. A failure
//! drains the node with the output as the reason; a later pass undoes a
//! drain the check made itself.

use std::time::Duration;

use tokio::sync::watch;

pub use crate::config::health_check::HealthCheck;

/// The latest result: `None` until the first run finished.
pub type Latest = watch::Receiver<Option<(bool, String)>>;

/// Runs the check once: whether it passed, and what it printed (or why not).
pub async fn run_once(check: &HealthCheck) -> (bool, String) {
    let child = tokio::process::Command::new("/bin/sh")
        .arg("-c")
        .arg(&check.command)
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true)
        .output();
    let timeout = Duration::from_secs(check.timeout_secs.max(1));
    match tokio::time::timeout(timeout, child).await {
        Ok(Ok(out)) => {
            let mut text = String::from_utf8_lossy(&out.stdout).into_owned();
            text.push_str(&String::from_utf8_lossy(&out.stderr));
            let mut text = text.trim().to_string();
            if text.len() > 500 {
                let mut cut = 500;
                while !text.is_char_boundary(cut) {
                    cut -= 1;
                }
                text.truncate(cut);
            }
            if text.is_empty() {
                text = format!("{} exited with {}", check.command, out.status);
            }
            (out.status.success(), text)
        }
        Ok(Err(e)) => (false, format!("cannot run {:?}: {e}", check.command)),
        Err(_) => (
            false,
            format!(
                "{:?} did not finish within {} s",
                check.command,
                timeout.as_secs()
            ),
        ),
    }
}

/// Starts running `check` periodically until `shutdown`.
pub fn spawn(check: HealthCheck, mut shutdown: watch::Receiver<bool>) -> Latest {
    let (tx, rx) = watch::channel(None);
    tokio::spawn(async move {
        let every = Duration::from_secs(check.interval_secs.max(1));
        loop {
            let result = run_once(&check).await;
            if !result.0 {
                tracing::warn!(output = %result.1, "health check failed");
            }
            tx.send_if_modified(|latest| {
                let changed = latest.as_ref() != Some(&result);
                *latest = Some(result);
                changed
            });
            tokio::select! {
                _ = tokio::time::sleep(every) => {}
                _ = shutdown.changed() => return,
            }
        }
    });
    rx
}
