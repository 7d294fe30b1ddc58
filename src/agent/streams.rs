//! The streams the leader opens on this agent's connection: a log read
//! (`LogRequest`, answered by `logs`) or an interactive stream
//! (`StdioRequest`): this agent's hop of `gpuq exec`, `gpuq attach` and
//! `srun --pty` (see `net::stdio`). The first frame says which, by its
//! fields; a leader from before interactive work sends only log requests.
//!
//! An interactive stream is spliced to the task's shim, which listens on
//! `io.sock` in the task's (or the exec's) directory: the agent only
//! finds the socket, waiting while the task starts, and copies bytes. A
//! restarted agent loses the streams, never the tasks or their output.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::io::AsyncWriteExt;

use super::exec::task::{SOCKET_FILE, STATUS_FILE};
use super::runner::TaskRunner;
use crate::net::agent_proto::{LogRequest, StdioRequest};
use crate::net::frame::{read_frame_body, write_frame};
use crate::net::stdio::{quic_stream, splice, ByteStream, StdioMsg};

/// How long an attach waits for its task's shim to listen (the task may
/// be starting: its desired state and the attach race from the leader).
const TASK_START_LIMIT: Duration = Duration::from_secs(15);

/// Serves the leader's streams on `conn` until it closes.
pub async fn serve(conn: quinn::Connection, runner: Arc<dyn TaskRunner>) {
    while let Ok((send, mut recv)) = conn.accept_bi().await {
        let runner = runner.clone();
        tokio::spawn(async move {
            let Ok(Some(body)) = read_frame_body(&mut recv, 64 << 10).await else {
                return;
            };
            if let Ok(req) = rmp_serde::from_slice::<StdioRequest>(&body) {
                relay(quic_stream(send, recv), req, runner).await;
            } else if let Ok(req) = rmp_serde::from_slice::<LogRequest>(&body) {
                super::logs::answer(send, req, runner.spool_root()).await;
            }
        });
    }
}

/// Splices the leader's stream to the task's shim, or says why not.
async fn relay(mut leader: Box<dyn ByteStream>, req: StdioRequest, runner: Arc<dyn TaskRunner>) {
    let task = req.task;
    let found = {
        let req = req.clone();
        tokio::task::spawn_blocking(move || runner.stdio_dir(&req))
            .await
            .unwrap_or_else(|e| Err(format!("the agent failed: {e}")))
    };
    let shim = match found {
        Ok(dir) => connect(&dir, TASK_START_LIMIT).await,
        Err(why) => Err(why),
    };
    let mut shim = match shim {
        Ok(s) => s,
        Err(message) => {
            tracing::info!(%task, "interactive stream refused: {message}");
            return refuse(leader, message).await;
        }
    };
    if write_frame(&mut shim, &req.seen).await.is_err() {
        return refuse(leader, format!("task {task} closed its streams")).await;
    }
    if let Err(e) = splice(&mut leader, &mut shim).await {
        tracing::debug!(%task, "interactive stream ended: {e}");
    }
}

/// Says why the stream is refused, then reads what the client still sends
/// until it closes its side. Dropping the receiving half at once would
/// stop the leader's copy toward this agent, and the leader would tear
/// down the client's stream before the refusal reached it.
async fn refuse(mut leader: Box<dyn ByteStream>, message: String) {
    use tokio::io::AsyncReadExt;
    let _ = write_frame(&mut leader, &StdioMsg::Error { message }).await;
    let _ = leader.shutdown().await;
    let mut sink = [0u8; 4096];
    let drain = async { while matches!(leader.read(&mut sink).await, Ok(n) if n > 0) {} };
    let _ = tokio::time::timeout(REFUSAL_LINGER, drain).await;
}

/// How long a refused stream waits for the client to close its side.
const REFUSAL_LINGER: Duration = Duration::from_secs(10);

/// Connects to the shim listening in `dir`, waiting up to `limit` for it
/// to start listening; refused at once when the task has ended.
async fn connect(dir: &Path, limit: Duration) -> Result<tokio::net::UnixStream, String> {
    let deadline = Instant::now() + limit;
    loop {
        if dir.join(STATUS_FILE).exists() {
            return Err("the task has ended".into());
        }
        if let Some(s) = try_connect(dir).await {
            return Ok(s);
        }
        if Instant::now() > deadline {
            return Err(format!(
                "the task did not open its streams within {} s",
                limit.as_secs()
            ));
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// One try, through a descriptor of the directory (a deep task root would
/// pass the 108-byte limit of a socket path).
async fn try_connect(dir: &Path) -> Option<tokio::net::UnixStream> {
    use std::os::fd::AsRawFd;
    use std::os::unix::fs::OpenOptionsExt;
    let handle = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC)
        .open(dir)
        .ok()?;
    let path: PathBuf = format!("/proc/self/fd/{}/{SOCKET_FILE}", handle.as_raw_fd()).into();
    tokio::net::UnixStream::connect(&path).await.ok()
}
