//! `sattach JOB.STEP`: follow a running job step, as Slurm's sattach. A
//! step on a terminal (`srun --pty`) is joined through its stream: its
//! output from the start, and this terminal's keys when it is one (Ctrl-]
//! detaches; the step goes on). Any other step's tasks are followed from
//! their nodes' spools as `srun` follows them (`-l` labels the lines), until
//! the step ends or this is interrupted, which leaves the step running.

use std::process::ExitCode;

use clap::{CommandFactory, FromArgMatches, Parser};

use super::srun_output::{show, Follower};
use crate::cli::interactive::{self, Mode};
use crate::cli::session::{self, Followed};
use crate::cli::CliError;
use crate::model::{JobId, JobState};

/// sattach's flags.
#[derive(Parser, Debug, Clone)]
#[command(
    name = "sattach",
    no_binary_name = true,
    disable_version_flag = true,
    max_term_width = 100,
    about = "Attach to a running job step, as Slurm's sattach: its output, and its terminal's \
             input for a step started with srun --pty (Ctrl-] detaches)",
    after_help = "Accepted and ignored: -Q/--quiet, -u/--unbuffered. Not yet: --input-filter, \
                  --output-filter, --error-filter, --layout."
)]
pub struct SattachArgs {
    /// The step, as JOB.STEP (sacct lists them)
    #[arg(value_name = "JOB.STEP", value_parser = parse_step)]
    pub step: (u64, u32),

    /// Prefix each output line with the task's rank
    #[arg(short = 'l', long)]
    pub label: bool,

    /// Accepted: sattach says little anyway
    #[arg(short = 'Q', long)]
    pub quiet: bool,

    /// Accepted: output is passed on as it comes
    #[arg(short = 'u', long)]
    pub unbuffered: bool,
}

fn parse_step(s: &str) -> Result<(u64, u32), String> {
    let bad = || format!("{s:?} is not JOB.STEP (e.g. 12.0): give the job id and the step id");
    let (job, step) = s.split_once('.').ok_or_else(bad)?;
    Ok((
        job.parse().map_err(|_| bad())?,
        step.parse().map_err(|_| bad())?,
    ))
}

/// Parses sattach's arguments.
pub fn parse_args(args: &[String]) -> Result<Option<SattachArgs>, CliError> {
    let Some(m) = super::parse_with(SattachArgs::command(), args)? else {
        return Ok(None);
    };
    SattachArgs::from_arg_matches(&m)
        .map(Some)
        .map_err(|e| CliError::input(super::clap_line(&e)))
}

/// `sattach ARGS`.
pub async fn run(args: Vec<String>) -> Result<ExitCode, CliError> {
    let Some(cli) = parse_args(&args)? else {
        return Ok(ExitCode::SUCCESS);
    };
    let (id, step) = (JobId(cli.step.0), cli.step.1);
    let job = show(id).await?;
    let found = job
        .run
        .as_ref()
        .filter(|_| job.state == JobState::Running)
        .and_then(|r| r.steps.get(step as usize).map(|s| (r.attempt, s.clone())));
    let Some((attempt, s)) = found else {
        return Err(CliError::input(format!(
            "job {id} is {} and has no running step {step}: sattach follows running steps",
            job.state
        )));
    };
    if s.is_over() {
        return Err(CliError::input(format!("step {id}.{step} has ended")));
    }
    if !s.spec.io.is_interactive() {
        let streamed = s.spec.output.is_none();
        let (label, ntasks) = (cli.label, s.spec.ntasks());
        return super::srun_output::follow(
            label,
            id,
            attempt,
            step,
            ntasks,
            streamed,
            Follower::Sattach,
        )
        .await;
    }
    let tty = interactive::stdin_is_terminal();
    let mode = Mode {
        pty: tty,
        input: tty,
        detach: true,
    };
    match session::follow(id, step, 0, mode).await? {
        Followed::Exit(code) => Ok(code),
        Followed::Detached | Followed::Interrupted => {
            eprintln!("sattach: detached from step {id}.{step}; it goes on");
            Ok(ExitCode::SUCCESS)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_step_is_job_dot_step_and_nothing_else() {
        SattachArgs::command().debug_assert();
        let a = parse_args(&["-l".into(), "12.3".into()]).unwrap().unwrap();
        assert_eq!((a.step, a.label), ((12, 3), true));
        for bad in ["12", "12.", ".3", "a.b", "12.3.4"] {
            let err = parse_args(&[bad.to_string()]).unwrap_err();
            assert!(err.message.contains("JOB.STEP"), "{bad}: {}", err.message);
        }
    }
}
