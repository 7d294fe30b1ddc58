//! A job step's task on a terminal or pipes (`srun --pty`, `gpuq run`),
//! followed to its end from here: attach, relay, and when the stream is
//! lost (a server failover, a node's agent restarting) attach again with
//! what was already shown, for as long as the task runs. The task belongs
//! to its node's shim, so a lost stream costs a moment, never the task.
//! When the stream cannot say how the task ended (it ended before the
//! first attach, or between two), the step's end is read from the cluster
//! and whatever output was not shown yet from the node's spool.

use std::process::ExitCode;
use std::time::{Duration, Instant};

use super::interactive::{self, Ended, Input, Mode, RawMode};
use super::{call, unexpected, CliError};
use crate::model::{JobId, JobState, Step};
use crate::net::proto::{ApiRequest, ApiResponse};
use crate::net::stdio::OutputSeen;

/// How long the task may stay out of reach (no leader, its node's agent
/// away) before the client gives up on it; the task runs on regardless.
const OUT_OF_REACH: Duration = Duration::from_secs(120);

/// Renews allocation `id` for as long as it is held (see
/// `ApiRequest::Keepalive`): at once, then every third of the servers'
/// limit; a failed renewal is retried each second. Dropped, it stops, and
/// the servers release the allocation when their limit passes (unless the
/// caller released it first).
pub struct KeepAlive {
    task: tokio::task::JoinHandle<()>,
}

impl KeepAlive {
    pub fn start(id: JobId) -> KeepAlive {
        let task = tokio::spawn(async move {
            loop {
                let pause = match call(ApiRequest::Keepalive { job: id }).await {
                    // 0: the servers release nothing for silence.
                    Ok(ApiResponse::KeptAlive { limit_secs: 0 }) => return,
                    Ok(ApiResponse::KeptAlive { limit_secs }) => {
                        Duration::from_millis((limit_secs * 1000 / 3).max(500))
                    }
                    // The allocation has ended, or the servers are older.
                    Ok(_) => return,
                    Err(e) if e.code == 2 => Duration::from_secs(1),
                    Err(_) => return,
                };
                tokio::time::sleep(pause).await;
            }
        });
        KeepAlive { task }
    }
}

impl Drop for KeepAlive {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// What `follow` ended with.
pub enum Followed {
    /// The task's exit status.
    Exit(ExitCode),
    /// This process was asked to stop (SIGTERM, SIGHUP): the caller stops
    /// the step.
    Interrupted,
    /// Left with the detach key; the task goes on.
    Detached,
}

/// Follows task `rank` of step `step` of job `id` until it ends. With a
/// pty, this terminal is in raw mode meanwhile (restored on every way
/// out); without, signals are passed on.
pub async fn follow(id: JobId, step: u32, rank: u32, mode: Mode) -> Result<Followed, CliError> {
    let raw = if mode.pty {
        Some(RawMode::enter()?)
    } else {
        None
    };
    let result = follow_in_mode(id, step, rank, mode).await;
    drop(raw);
    result
}

async fn follow_in_mode(id: JobId, step: u32, rank: u32, mode: Mode) -> Result<Followed, CliError> {
    let pty = mode.pty;
    let mut input = if mode.input {
        Input::start()
    } else {
        Input::none()
    };
    let mut seen = OutputSeen::default();
    let mut reached = Instant::now();
    let mut said_lost = false;
    loop {
        let req = ApiRequest::Attach {
            job: id,
            rank,
            step: Some(step),
            seen,
        };
        let why = match interactive::open(&req).await {
            Ok((_, stream)) => {
                reached = Instant::now();
                match interactive::pump(stream, mode, &mut input, &mut seen).await {
                    Ended::Exit(exit) => return interactive::exit_code(&exit).map(Followed::Exit),
                    Ended::Interrupted => return Ok(Followed::Interrupted),
                    Ended::Detached => return Ok(Followed::Detached),
                    Ended::Refused(why) | Ended::Lost(why) => why,
                }
            }
            Err(e) => e.message,
        };
        // The stream says no more: the step's record says whether it ended.
        if let Some(s) = current_step(id, step).await? {
            if s.is_over() {
                drain(id, step, rank, &mut seen).await;
                // A task that never ran says why, as its stream would have.
                let nl = if pty { "\r\n" } else { "\n" };
                for end in s.ended.values() {
                    if let crate::model::TaskEnd::LaunchFailed { reason } = end {
                        eprint!("gpuq: the command did not start: {reason}{nl}");
                    }
                }
                let code = s.exit_code().clamp(0, 255) as u8;
                return Ok(Followed::Exit(ExitCode::from(code)));
            }
        }
        if reached.elapsed() > OUT_OF_REACH {
            return Err(CliError::unreachable(format!(
                "step {id}.{step} has been out of reach for {} s ({why}); it runs on: attach \
                 again with gpuq attach {id} --step {step}",
                OUT_OF_REACH.as_secs()
            )));
        }
        if !said_lost && reached.elapsed() > Duration::from_secs(2) {
            let nl = if pty { "\r\n" } else { "\n" };
            eprint!("{nl}gpuq: lost the stream to step {id}.{step} ({why}); reconnecting{nl}");
            said_lost = true;
        }
        // Quick at first: a task's end is committed within moments.
        let pause = if reached.elapsed() < Duration::from_secs(1) {
            20
        } else {
            100
        };
        tokio::time::sleep(Duration::from_millis(pause)).await;
    }
}

/// Step `step` of job `id`'s current run, if the cluster can say; an error
/// when the job has no such step any more.
async fn current_step(id: JobId, step: u32) -> Result<Option<Step>, CliError> {
    let job = match call(ApiRequest::Show { id, task: None }).await {
        Ok(ApiResponse::Job { job, .. }) => job,
        Ok(other) => return Err(unexpected(other)),
        // No leader now: try again later.
        Err(e) if e.code == 2 => return Ok(None),
        Err(e) => return Err(e),
    };
    match job.run.as_ref().and_then(|r| r.steps.get(step as usize)) {
        Some(s) => Ok(Some(s.clone())),
        None if job.state == JobState::Pending => Err(CliError::input(format!(
            "job {id} went back to the queue: step {id}.{step} is gone"
        ))),
        None => Err(CliError::input(format!(
            "step {id}.{step} is gone: job {id} is {}",
            job.state
        ))),
    }
}

/// Shows the task's output that the stream did not, from its spool.
async fn drain(id: JobId, step: u32, rank: u32, seen: &mut OutputSeen) {
    for stderr in [false, true] {
        loop {
            let offset = if stderr { seen.stderr } else { seen.stdout };
            let req = ApiRequest::StepLogs {
                job: id,
                step,
                rank,
                stderr,
                offset,
            };
            let Ok(ApiResponse::Logs {
                data, next_offset, ..
            }) = call(req).await
            else {
                break;
            };
            if data.is_empty() {
                break;
            }
            interactive::emit(stderr, &data);
            if stderr {
                seen.stderr = next_offset;
            } else {
                seen.stdout = next_offset;
            }
        }
    }
}
