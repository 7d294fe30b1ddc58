//! `gpuq run [FLAGS] [--pty] -- COMMAND`: an interactive job. An
//! allocation of what the flags ask for (as `gpuq submit`'s), with the
//! command as its first step's one task on its first node; the task's
//! standard streams (a terminal with `--pty`, pipes without) come here, and
//! the allocation is released when the command ends. The task obeys what a
//! batch job does: placement, quotas, its time limit (told on the terminal
//! a minute before), preemption, accounting.

use std::process::ExitCode;

use super::session::{self, Followed};
use super::{call, interactive, unexpected, CliError};
use crate::model::{JobId, JobState, Program, StepSpec, TaskIo};
use crate::net::proto::{ApiRequest, ApiResponse};
use crate::spec::SubmitArgs;

/// `gpuq run`.
pub async fn run(args: &SubmitArgs, pty: bool) -> Result<ExitCode, CliError> {
    if pty && !interactive::stdin_is_terminal() {
        return Err(interactive::needs_terminal("gpuq run"));
    }
    let argv = args.script_or_command.clone();
    if argv.is_empty() {
        return Err(CliError::input(
            "no command to run: give one after the flags, e.g. gpuq run --pty -- bash",
        ));
    }
    if args.array.is_some() || args.wrap.is_some() {
        return Err(CliError::input(
            "gpuq run takes a command, not --array or --wrap: use gpuq submit for those",
        ));
    }
    let cwd = std::env::current_dir()
        .map_err(|e| CliError::input(format!("cannot read the current directory: {e}")))?;
    let env: Vec<(String, String)> = std::env::vars().collect();
    let mut spec = crate::spec::build_allocation_spec(args, argv.clone(), &env, &cwd)
        .map_err(|e| CliError::input(e.to_string()))?;
    let io = if pty { TaskIo::Pty } else { TaskIo::Pipes };
    spec.first_step = Some(Box::new(StepSpec {
        name: spec.name.clone(),
        program: Program::Command { argv },
        nodes: vec![0],
        tasks: vec![1],
        cpus_per_task: spec.cpus_per_task,
        gpus_per_task: None,
        workdir: spec.workdir.clone(),
        env: spec.env.clone(),
        output: None,
        error: None,
        kill_on_bad_exit: false,
        io,
        container: None,
    }));
    let id = match call(ApiRequest::Submit {
        spec: Box::new(spec),
    })
    .await?
    {
        ApiResponse::Submitted { id } => id,
        other => return Err(unexpected(other)),
    };
    wait_running(id).await?;
    let held = session::KeepAlive::start(id);
    let mode = interactive::Mode {
        pty,
        input: true,
        detach: false,
    };
    let followed = session::follow(id, 0, 0, mode).await;
    drop(held);
    let _ = call(ApiRequest::Release { job: id }).await;
    match followed? {
        Followed::Exit(code) => Ok(code),
        Followed::Interrupted | Followed::Detached => Err(CliError::input(format!(
            "interrupted: job {id} was released"
        ))),
    }
}

/// Waits until job `id` runs, saying so once when it has to wait; a job
/// that ends first is an error naming why.
async fn wait_running(id: JobId) -> Result<(), CliError> {
    let started = std::time::Instant::now();
    let mut said = false;
    loop {
        let job = match call(ApiRequest::Show { id, task: None }).await? {
            ApiResponse::Job { job, .. } => job,
            other => return Err(unexpected(other)),
        };
        match job.state {
            JobState::Running => return Ok(()),
            JobState::Pending => {
                if !said && started.elapsed() > std::time::Duration::from_secs(1) {
                    eprintln!(
                        "gpuq: job {id} waits for resources ({})",
                        job.reason.unwrap_or_default()
                    );
                    said = true;
                }
            }
            state => {
                return Err(CliError::input(format!(
                    "job {id} ended ({state}) before it started{}",
                    job.reason.map(|r| format!(": {r}")).unwrap_or_default()
                )))
            }
        }
        let pause = if started.elapsed().as_millis() < 500 {
            5
        } else {
            50
        };
        tokio::time::sleep(std::time::Duration::from_millis(pause)).await;
    }
}
