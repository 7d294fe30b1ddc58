//! `gpuq exec` and `gpuq attach`: a command run beside a running job's
//! rank (in its cgroup, with its GPUs and environment, as its user), and a
//! connection to a running task's terminal, both over an interactive
//! stream (see `interactive`).

use std::process::ExitCode;

use super::interactive::{self, Ended, Input, Mode, RawMode};
use super::session::Followed;
use super::{call, unexpected, CliError};
use crate::model::{JobId, JobState, Launch};
use crate::net::proto::{ApiRequest, ApiResponse};
use crate::net::stdio::{ExecSpec, OutputSeen};

/// `gpuq exec JOB [--rank N] [--pty] -- COMMAND...`.
pub async fn exec(
    id: JobId,
    rank: u32,
    pty: bool,
    argv: Vec<String>,
) -> Result<ExitCode, CliError> {
    if pty && !interactive::stdin_is_terminal() {
        return Err(interactive::needs_terminal("gpuq exec"));
    }
    let req = ApiRequest::Exec {
        job: id,
        rank,
        exec: ExecSpec {
            argv,
            pty,
            term: pty.then(|| std::env::var("TERM").ok()).flatten(),
            size: pty.then(interactive::terminal_size).flatten(),
        },
    };
    let (node, stream) = interactive::open(&req).await?;
    let raw = if pty { Some(RawMode::enter()?) } else { None };
    let mut input = Input::start();
    let mode = Mode {
        pty,
        input: true,
        detach: false,
    };
    let ended = interactive::pump(stream, mode, &mut input, &mut OutputSeen::default()).await;
    drop(raw);
    finish(ended, &format!("job {id} rank {rank} on {node}"))
}

/// `gpuq attach JOB [--rank N] [--step S]`: a step on a terminal or pipes
/// (by default an allocation's latest such step: what `srun --pty` or `gpuq
/// run` started) is followed through its stream, keys included when this is
/// a terminal (Ctrl-] detaches); any other task's output is followed as it
/// comes, as `gpuq logs -f`.
pub async fn attach(id: JobId, rank: u32, step: Option<u32>) -> Result<ExitCode, CliError> {
    let job = match call(ApiRequest::Show { id, task: None }).await? {
        ApiResponse::Job { job, .. } => job,
        other => return Err(unexpected(other)),
    };
    if job.state != JobState::Running {
        return Err(CliError::input(format!(
            "job {id} is {}: only a running job's tasks can be attached to",
            job.state
        )));
    }
    let steps = job.run.as_ref().map(|r| r.steps.as_slice()).unwrap_or(&[]);
    let step = match step {
        Some(s) => Some(s),
        None if job.spec.launch == Launch::Allocation => {
            let live = steps
                .iter()
                .rev()
                .find(|s| !s.is_over() && s.spec.io.is_interactive());
            match live {
                Some(s) => Some(s.id),
                None => {
                    return Err(CliError::input(format!(
                        "allocation {id} runs no step on a terminal now; name one with --step"
                    )))
                }
            }
        }
        None => None,
    };
    let interactive = step
        .and_then(|s| steps.get(s as usize))
        .is_some_and(|s| s.spec.io.is_interactive());
    let Some(step) = step.filter(|_| interactive) else {
        eprintln!("gpuq: following the output of job {id} rank {rank} (it has no terminal)");
        return match step {
            Some(s) => follow_step_output(id, s, rank).await,
            None => super::logs(id, rank, true)
                .await
                .map(|()| ExitCode::SUCCESS),
        };
    };
    let tty = interactive::stdin_is_terminal();
    if tty {
        eprint!("gpuq: attached to step {id}.{step}; Ctrl-] detaches\r\n");
    }
    let mode = Mode {
        pty: tty,
        input: tty,
        detach: true,
    };
    match super::session::follow(id, step, rank, mode).await? {
        Followed::Exit(code) => Ok(code),
        Followed::Detached | Followed::Interrupted => {
            eprintln!("gpuq: detached from step {id}.{step}; it goes on");
            Ok(ExitCode::SUCCESS)
        }
    }
}

/// A step task's output from its spool, as it comes, until the step ends.
async fn follow_step_output(id: JobId, step: u32, rank: u32) -> Result<ExitCode, CliError> {
    let mut offset = 0;
    let mut last = false;
    loop {
        let (data, next, state) = match call(ApiRequest::StepLogs {
            job: id,
            step,
            rank,
            stderr: false,
            offset,
        })
        .await?
        {
            ApiResponse::Logs {
                data,
                next_offset,
                state,
                ..
            } => (data, next_offset, state),
            other => return Err(unexpected(other)),
        };
        interactive::emit(false, &data);
        offset = next;
        if data.is_empty() {
            // Seen ended after an empty read: one more read takes what
            // it wrote in between.
            if last {
                return Ok(ExitCode::SUCCESS);
            }
            last = state.is_final() || step_over(id, step).await?;
            if !last {
                tokio::time::sleep(std::time::Duration::from_millis(200)).await;
            }
        }
    }
}

/// Whether step `step` of job `id`'s current run has ended (or is gone).
async fn step_over(id: JobId, step: u32) -> Result<bool, CliError> {
    match call(ApiRequest::Show { id, task: None }).await? {
        ApiResponse::Job { job, .. } => Ok(job
            .run
            .and_then(|r| r.steps.get(step as usize).map(|s| s.is_over()))
            .unwrap_or(true)),
        other => Err(unexpected(other)),
    }
}

/// The exit status for how a stream ended.
pub(crate) fn finish(ended: Ended, what: &str) -> Result<ExitCode, CliError> {
    match ended {
        Ended::Exit(exit) => interactive::exit_code(&exit),
        Ended::Refused(why) => Err(CliError::input(format!("{what}: {why}"))),
        Ended::Lost(why) => Err(CliError::unreachable(format!(
            "the stream to {what} was lost ({why}); the process goes on there until it ends"
        ))),
        Ended::Interrupted | Ended::Detached => Err(CliError::input(format!(
            "interrupted; the process goes on in {what} until it ends"
        ))),
    }
}
