//! Group commit at the proposal level. openraft 0.9 keeps one log append in
//! flight at a time, so concurrent `client_write`s each pay an fsync. The
//! proposer instead queues writes while one proposal is in flight and sends
//! everything queued as one `Command::Batch` entry: a burst of N concurrent
//! submits costs one log write, and each caller still gets its own answer
//! only after commit. A command proposed `alone` (a bulk submit, already
//! one large entry) is never folded into a batch, so one entry stays within
//! what a replication frame carries.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use tokio::sync::{mpsc, oneshot};

use crate::net::proto::{ApiResponse, ErrorKind};
use crate::raft::GpuqRaft;
use crate::state::{Command, CommandResult};

/// The most commands one log entry carries.
const MAX_BATCH: usize = 512;

type Reply = oneshot::Sender<Result<CommandResult, ApiResponse>>;

/// A queued proposal: the command, who waits for it, and whether it must be
/// its own log entry.
struct Proposal {
    cmd: Command,
    reply: Reply,
    alone: bool,
}

/// A handle for proposing commands through the batching task.
#[derive(Clone)]
pub struct Proposer {
    tx: mpsc::Sender<Proposal>,
    /// Log entries proposed and the commands they carried: the ratio is the
    /// mean group-commit batch.
    pub stats: Arc<ProposalStats>,
}

/// Counters of the proposer.
#[derive(Default, Debug)]
pub struct ProposalStats {
    pub entries: AtomicU64,
    pub commands: AtomicU64,
}

impl Proposer {
    /// Starts the batching task for `raft`.
    pub fn start(raft: GpuqRaft) -> Proposer {
        let (tx, rx) = mpsc::channel(4096);
        let stats = Arc::new(ProposalStats::default());
        tokio::spawn(run(raft, rx, stats.clone()));
        Proposer { tx, stats }
    }

    /// Proposes `cmd` and waits until it is committed and applied.
    pub async fn propose(&self, cmd: Command) -> Result<CommandResult, ApiResponse> {
        self.send(cmd, false).await
    }

    /// Proposes `cmd` as a log entry of its own (never batched with others).
    pub async fn propose_alone(&self, cmd: Command) -> Result<CommandResult, ApiResponse> {
        self.send(cmd, true).await
    }

    async fn send(&self, cmd: Command, alone: bool) -> Result<CommandResult, ApiResponse> {
        let (reply, answer) = oneshot::channel();
        let stopped = || ApiResponse::error(ErrorKind::Unavailable, "the server is shutting down");
        self.tx
            .send(Proposal { cmd, reply, alone })
            .await
            .map_err(|_| stopped())?;
        answer.await.map_err(|_| stopped())?
    }
}

async fn run(raft: GpuqRaft, mut rx: mpsc::Receiver<Proposal>, stats: Arc<ProposalStats>) {
    // A proposal taken off the queue that must wait for the next entry.
    let mut held: Option<Proposal> = None;
    loop {
        let first = match held.take() {
            Some(p) => p,
            None => match rx.recv().await {
                Some(p) => p,
                None => return,
            },
        };
        let mut batch = vec![first];
        while !batch[0].alone && batch.len() < MAX_BATCH {
            match rx.try_recv() {
                Ok(next) if next.alone => {
                    held = Some(next);
                    break;
                }
                Ok(next) => batch.push(next),
                Err(_) => break,
            }
        }
        // A caller that gave up waiting (its write timed out behind a
        // proposal that could not commit) was told the outcome is unknown;
        // proposing it now would only surprise it later.
        batch.retain(|p| !p.reply.is_closed());
        if batch.is_empty() {
            continue;
        }
        stats.entries.fetch_add(1, Ordering::Relaxed);
        stats
            .commands
            .fetch_add(batch.len() as u64, Ordering::Relaxed);
        if batch.len() == 1 {
            let p = batch.pop().expect("one command");
            let _ = p.reply.send(write(&raft, p.cmd).await);
            continue;
        }
        let (cmds, replies): (Vec<Command>, Vec<Reply>) =
            batch.into_iter().map(|p| (p.cmd, p.reply)).unzip();
        match write(&raft, Command::Batch(cmds)).await {
            Ok(CommandResult::Batch(results)) if results.len() == replies.len() => {
                for (reply, r) in replies.into_iter().zip(results) {
                    let _ = reply.send(Ok(r));
                }
            }
            Ok(other) => {
                let e = ApiResponse::error(
                    ErrorKind::Internal,
                    format!("unexpected answer to a batch: {other:?}"),
                );
                for reply in replies {
                    let _ = reply.send(Err(e.clone()));
                }
            }
            Err(e) => {
                for reply in replies {
                    let _ = reply.send(Err(e.clone()));
                }
            }
        }
    }
}

async fn write(raft: &GpuqRaft, cmd: Command) -> Result<CommandResult, ApiResponse> {
    use openraft::error::{ClientWriteError, RaftError};
    match raft.client_write(cmd).await {
        Ok(resp) => Ok(resp.data),
        Err(RaftError::APIError(ClientWriteError::ForwardToLeader(f))) => Err(ApiResponse::error(
            ErrorKind::Unavailable,
            match f.leader_node {
                Some(n) => format!("not leader; the leader is {} at {}: retry", n.name, n.addr),
                None => "no leader is elected yet: retry in a moment".to_string(),
            },
        )),
        Err(e) => Err(ApiResponse::error(
            ErrorKind::Unavailable,
            format!("the write was not committed: {e}"),
        )),
    }
}
