//! `gpuq exec` and `gpuq attach`: a command run beside a running job's
//! rank (in its cgroup, with its GPUs and environment, as its user), and a
//! connection to a running task's terminal, both over an interactive
//! stream (see `interactive`).

use std::process::ExitCode;

use super::interactive::{self, Ended, Input, Mode, RawMode};
use super::CliError;
use crate::model::JobId;
use crate::net::proto::ApiRequest;
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
    let mode = Mode { pty, input: true };
    let ended = interactive::pump(stream, mode, &mut input, &mut OutputSeen::default()).await;
    drop(raw);
    finish(ended, &format!("job {id} rank {rank} on {node}"))
}

/// `gpuq attach JOB [--rank N] [--step S]`: with a step on a terminal, its
/// terminal; otherwise the rank's output as it comes (as `gpuq logs -f`).
pub async fn attach(id: JobId, rank: u32, step: Option<u32>) -> Result<ExitCode, CliError> {
    let Some(step) = step else {
        super::logs(id, rank, true).await?;
        return Ok(ExitCode::SUCCESS);
    };
    let pty = interactive::stdin_is_terminal();
    let req = ApiRequest::Attach {
        job: id,
        rank,
        step: Some(step),
        seen: OutputSeen::default(),
    };
    let (node, stream) = interactive::open(&req).await?;
    let raw = if pty { Some(RawMode::enter()?) } else { None };
    let mut input = Input::start();
    let mode = Mode { pty, input: pty };
    let ended = interactive::pump(stream, mode, &mut input, &mut OutputSeen::default()).await;
    drop(raw);
    finish(ended, &format!("step {id}.{step} task {rank} on {node}"))
}

/// The exit status for how a stream ended.
pub(crate) fn finish(ended: Ended, what: &str) -> Result<ExitCode, CliError> {
    match ended {
        Ended::Exit(exit) => interactive::exit_code(&exit),
        Ended::Refused(why) => Err(CliError::input(format!("{what}: {why}"))),
        Ended::Lost(why) => Err(CliError::unreachable(format!(
            "the stream to {what} was lost ({why}); the process goes on there until it ends"
        ))),
        Ended::Interrupted => Err(CliError::input(format!(
            "interrupted; the process goes on in {what} until it ends"
        ))),
    }
}
