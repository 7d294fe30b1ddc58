//! `scancel`: cancel jobs by id (`12`, every task of array 12; `12_3`, one
//! task), or every unfinished job of a user (`-u`) or with a name (`-n`);
//! given together, the filters narrow each other, as Slurm's do. Silent on
//! success, as Slurm is; the cancel is the same all-or-none request as
//! `gpuq cancel`.

use std::process::ExitCode;

use clap::{ArgAction, FromArgMatches, Parser};

use crate::cli::queue::fetch_jobs;
use crate::cli::{call, unexpected, CliError};
use crate::model::{JobId, JobRef};
use crate::net::proto::{ApiRequest, ApiResponse, SignalScope};

#[derive(Parser, Debug, Clone, Default)]
#[command(
    name = "scancel",
    no_binary_name = true,
    disable_version_flag = true,
    max_term_width = 100,
    about = "Cancel gpuq jobs, as Slurm's scancel"
)]
pub struct ScancelArgs {
    /// Job ids: 12 (an array id cancels every task), 12_3 (one array task)
    #[arg(value_name = "JOB_ID", value_delimiter = ',')]
    pub ids: Vec<String>,
    /// Only (or all unfinished) jobs of this user
    #[arg(short = 'u', long = "user", value_name = "USER")]
    pub user: Option<String>,
    /// Only (or all unfinished) jobs with this name
    #[arg(
        short = 'n',
        long = "name",
        visible_alias = "jobname",
        value_name = "NAME"
    )]
    pub name: Option<String>,
    /// Only jobs in these states (PENDING, RUNNING, or PD, R)
    #[arg(
        short = 't',
        long = "state",
        value_name = "STATE[,...]",
        value_delimiter = ','
    )]
    pub states: Vec<String>,
    /// Print what is cancelled
    #[arg(short = 'v', long = "verbose", action = ArgAction::SetTrue)]
    pub verbose: bool,
    /// Send this signal (USR1, 10, SIGTERM) to the jobs' steps instead of
    /// cancelling them
    #[arg(short = 's', long = "signal", value_name = "SIGNAL")]
    pub signal: Option<String>,
    /// With --signal: only the batch script, not its steps
    #[arg(short = 'b', long = "batch", conflicts_with = "full")]
    pub batch: bool,
    /// With --signal: the batch script and every step
    #[arg(short = 'f', long = "full")]
    pub full: bool,
}

/// Parses the job ids as Slurm names them.
pub fn parse_ids(ids: &[String]) -> Result<Vec<JobRef>, String> {
    ids.iter()
        .filter(|s| !s.trim().is_empty() && !s.contains('.'))
        .map(|s| JobRef::parse(s.trim()).map_err(|e| format!("invalid job id {s}: {e}")))
        .collect()
}

/// The job steps named as `12.3`.
pub fn parse_steps(ids: &[String]) -> Result<Vec<(JobId, u32)>, String> {
    ids.iter()
        .filter_map(|s| s.trim().split_once('.').map(|parts| (s, parts)))
        .map(|(s, (job, step))| {
            let bad = || {
                format!("invalid job step {s}: give JOB.STEP with numbers, e.g. 12.0 (see sacct -j JOB)")
            };
            Ok((
                JobId(job.parse().map_err(|_| bad())?),
                step.parse().map_err(|_| bad())?,
            ))
        })
        .collect()
}

/// `scancel ARGS`.
pub async fn run(args: Vec<String>) -> Result<ExitCode, CliError> {
    let Some(m) = super::parse_with(<ScancelArgs as clap::CommandFactory>::command(), &args)?
    else {
        return Ok(ExitCode::SUCCESS);
    };
    let args =
        ScancelArgs::from_arg_matches(&m).map_err(|e| CliError::input(super::clap_line(&e)))?;
    let named = parse_ids(&args.ids).map_err(CliError::input)?;
    let steps = parse_steps(&args.ids).map_err(CliError::input)?;
    let signal = match &args.signal {
        Some(name) => Some(crate::spec::queue::signal_number(name).ok_or_else(|| {
            CliError::input(format!(
                "--signal {name}: unknown signal; give a name (USR1, TERM) or a number 1-64"
            ))
        })?),
        None if args.batch || args.full => {
            return Err(CliError::input(
                "-b/--batch and -f/--full choose where --signal goes; give --signal SIG too",
            ))
        }
        None => None,
    };
    for (job, step) in &steps {
        if signal.is_some() {
            return Err(CliError::input(format!(
                "--signal to one step ({job}.{step}) is not supported yet; signal the job \
                 ({job}), which reaches all of its steps"
            )));
        }
        match call(ApiRequest::StepCancel {
            job: *job,
            step: *step,
        })
        .await?
        {
            ApiResponse::StepCancelled => {}
            other => return Err(unexpected(other)),
        }
    }
    if named.is_empty() && !steps.is_empty() && args.user.is_none() && args.name.is_none() {
        return Ok(ExitCode::SUCCESS);
    }
    let states = super::squeue::parse_states(&args.states).map_err(CliError::input)?;
    let filtered = args.user.is_some() || args.name.is_some() || !states.is_empty();
    if named.is_empty() && !filtered {
        return Err(CliError::input(
            "no job identification provided: give job ids (12, 12_3), -u USER or -n NAME",
        ));
    }
    let refs: Vec<JobRef> = if filtered {
        let jobs = fetch_jobs(false, args.user.clone(), Vec::new()).await?;
        jobs.iter()
            .filter(|j| !j.state.is_final())
            .filter(|j| args.name.as_ref().is_none_or(|n| &j.spec.name == n))
            .filter(|j| states.is_empty() || states.contains(&j.state))
            .filter(|j| {
                named.is_empty()
                    || named.iter().any(|r| {
                        (r.task.is_none() && r.id == j.id)
                            || j.array.is_some_and(|a| {
                                a.array_job == r.id && r.task.is_none_or(|t| t == a.index)
                            })
                    })
            })
            .map(|j| match j.array {
                Some(a) => JobRef {
                    id: a.array_job,
                    task: Some(a.index),
                },
                None => JobRef {
                    id: j.id,
                    task: None,
                },
            })
            .collect()
    } else {
        named
    };
    if refs.is_empty() {
        return Ok(ExitCode::SUCCESS);
    }
    if let Some(signal) = signal {
        let scope = match (args.batch, args.full) {
            (true, _) => SignalScope::Batch,
            (_, true) => SignalScope::Full,
            _ => SignalScope::Steps,
        };
        return match call(ApiRequest::Signal {
            jobs: refs,
            signal,
            scope,
            step: None,
        })
        .await
        {
            Ok(ApiResponse::Signalled { .. }) => Ok(ExitCode::SUCCESS),
            Ok(other) => Err(unexpected(other)),
            Err(e) => Err(CliError {
                code: e.code,
                message: format!("Kill job error: {}", e.message),
            }),
        };
    }
    let (tasks, plain): (Vec<JobRef>, Vec<JobRef>) =
        refs.into_iter().partition(|r| r.task.is_some());
    let ids = plain.into_iter().map(|r| r.id).collect();
    match call(ApiRequest::Cancel { ids, tasks }).await {
        Ok(ApiResponse::Cancelled { ids }) => {
            if args.verbose {
                for id in ids {
                    eprintln!("scancel: Terminating job {id}");
                }
            }
            Ok(ExitCode::SUCCESS)
        }
        Ok(other) => Err(unexpected(other)),
        Err(e) => Err(CliError {
            code: e.code,
            message: format!("Kill job error: {}", e.message),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_as_slurm_writes_them() {
        let refs = parse_ids(&["12".into(), "13_4".into()]).unwrap();
        assert_eq!(refs[0].to_string(), "12");
        assert_eq!(refs[1].to_string(), "13_4");
        let e = parse_ids(&["12x".into()]).unwrap_err();
        assert!(e.starts_with("invalid job id 12x"), "{e}");
    }

    #[test]
    fn steps_are_job_dot_step() {
        let ids = ["12.3".to_string(), "14".to_string()];
        assert_eq!(parse_steps(&ids).unwrap(), [(JobId(12), 3)]);
        assert_eq!(parse_ids(&ids).unwrap().len(), 1);
        assert!(parse_steps(&["12.batch".into()])
            .unwrap_err()
            .contains("12.batch"));
    }

    #[test]
    fn comma_lists_split() {
        let a = ScancelArgs::try_parse_from(["1,2", "3"]).unwrap();
        assert_eq!(a.ids, ["1", "2", "3"]);
    }
}
