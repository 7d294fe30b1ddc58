//! `srun`: inside an allocation (`SLURM_JOB_ID` set, or `--jobid`), a job
//! step: `ntasks` copies of a command on the allocation's nodes, started by
//! the agents under their shims within the job's GPUs and CPUs. Outside
//! one, an allocation job is queued first and released when the step ends,
//! as Slurm does. Either way the tasks' output is streamed here (each task
//! writes to its node's spool; `-o/-e` send it to files instead), signals
//! stop the step, and the exit status is the highest of the tasks' (128 +
//! N for a task killed by signal N).
//!
//! The step's shape, as Slurm's inside an allocation: every node and the
//! job's tasks per node by default; `-N` the first N nodes (one task each
//! unless `-n` or `--ntasks-per-node` says more), `-w` named nodes, `-n`
//! spread in blocks (the first nodes get the remainder).

use std::path::Path;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::{value_parser, CommandFactory, FromArgMatches, Parser};

use super::sbatch::SbatchArgs;
use super::srun_output::{show, Follower::Srun, Interrupts};
use crate::cli::{call, unexpected, CliError};
use crate::model::{JobId, JobState, Program, StepSpec};
use crate::net::proto::{ApiRequest, ApiResponse};

/// srun's flags: sbatch's (for an allocation of its own) and srun's.
#[derive(Parser, Debug, Clone, Default)]
#[command(
    name = "srun",
    no_binary_name = true,
    disable_version_flag = true,
    max_term_width = 100,
    about = "Run a parallel job step, as Slurm's srun: in the current allocation (SLURM_JOB_ID) \
             or in a new one",
    after_help = "Accepted with a note: --mpi (no PMIx server is offered), --cpu-bind, --exact, \
                  --overlap, -u/--unbuffered (output is never buffered here).\n\
                  --pty: one task, on a pseudo-terminal on its node; Ctrl-C, Ctrl-Z and Ctrl-D \
                  act there; the exit status is the task's (128+N for signal N). Outside an \
                  allocation, the allocation is held while this srun renews it (see salloc \
                  --help) and released when the task ends.\n\
                  Not yet: --multi-prog."
)]
pub struct SrunArgs {
    #[command(flatten)]
    pub alloc: SbatchArgs,

    /// Prefix each output line with the task's rank
    #[arg(short = 'l', long)]
    pub label: bool,

    /// Accepted: output is passed on as it comes
    #[arg(short = 'u', long)]
    pub unbuffered: bool,

    /// MPI plugin type; gpuq offers no PMIx/PMI2 server
    #[arg(long, value_name = "TYPE")]
    pub mpi: Option<String>,

    /// Accepted and ignored: tasks share the job's CPU set on each node
    #[arg(long, value_name = "TYPE")]
    pub cpu_bind: Option<String>,

    /// Stop the step's other tasks when one exits non-zero
    #[arg(short = 'K', long, value_name = "0|1", num_args = 0..=1,
          default_missing_value = "1", value_parser = value_parser!(u8).range(0..=1))]
    pub kill_on_bad_exit: Option<u8>,

    /// Run the step in this job's allocation rather than SLURM_JOB_ID's
    #[arg(long, value_name = "ID")]
    pub jobid: Option<u64>,

    /// Accepted: steps may always share the allocation's resources
    #[arg(long)]
    pub overlap: bool,

    /// Accepted: each step uses only what it asks for
    #[arg(long)]
    pub exact: bool,

    /// Run the step's one task on a terminal (a shell: srun --pty bash), this
    /// one in raw mode until it ends; needs a terminal on stdin
    #[arg(long)]
    pub pty: bool,
}

fn command() -> clap::Command {
    SrunArgs::command()
        .mut_arg("script_or_command", |a| {
            a.help("The program to run, and its arguments")
                .long_help(None)
                .value_name("COMMAND")
        })
        .mut_arg("parsable", |a| a.hide(true))
        .mut_arg("wait", |a| a.hide(true))
}

/// Parses srun's arguments.
pub fn parse_args(args: &[String]) -> Result<Option<SrunArgs>, CliError> {
    let Some(m) = super::parse_with(command(), args)? else {
        return Ok(None);
    };
    SrunArgs::from_arg_matches(&m)
        .map(Some)
        .map_err(|e| CliError::input(super::clap_line(&e)))
}

/// The step's nodes (the job's node ranks) and tasks on each, for a job on
/// `job_nodes` with `job_per_node` tasks per node.
pub fn step_shape(
    args: &SrunArgs,
    job_nodes: &[String],
    job_per_node: u32,
) -> Result<(Vec<u32>, Vec<u32>), String> {
    let (nodes, tasks) = shape(args, job_nodes, job_per_node)?;
    if args.pty {
        let n: u32 = tasks.iter().sum();
        if n != 1 {
            return Err(format!(
                "--pty runs one task on a terminal, and this step would run {n}: ask for one \
                 (-n 1), or leave out --pty"
            ));
        }
    }
    Ok((nodes, tasks))
}

fn shape(
    args: &SrunArgs,
    job_nodes: &[String],
    job_per_node: u32,
) -> Result<(Vec<u32>, Vec<u32>), String> {
    let job = &args.alloc.job;
    let shaped = job.nodes.is_some()
        || job.nodelist.is_some()
        || job.ntasks_per_node.is_some()
        || args.alloc.ntasks.is_some();
    if args.pty && !shaped {
        // A shell on the allocation's first node, as Slurm's `srun --pty bash`.
        return Ok((vec![0], vec![1]));
    }
    let named: Option<Vec<u32>> = match &job.nodelist {
        Some(list) => Some(
            list.0
                .iter()
                .map(|name| {
                    job_nodes
                        .iter()
                        .position(|n| n == name)
                        .map(|i| i as u32)
                        .ok_or_else(|| {
                            format!(
                                "-w {name}: node {name} is not part of this allocation ({}); \
                                 name one of its nodes",
                                crate::model::hostlist::compress_hostlist(job_nodes)
                            )
                        })
                })
                .collect::<Result<_, _>>()?,
        ),
        None => None,
    };
    let count = match (job.nodes.map(|r| r.min), &named) {
        (Some(n), Some(w)) if n as usize != w.len() => {
            return Err(format!(
                "-N {n} does not match the {} node(s) named by -w; give one of them",
                w.len()
            ))
        }
        (Some(n), _) if n as usize > job_nodes.len() => {
            return Err(format!(
                "-N {n}: the allocation has {} node(s); ask for at most that many",
                job_nodes.len()
            ))
        }
        (Some(n), _) => n as usize,
        (None, Some(w)) => w.len(),
        (None, None) => match args.alloc.ntasks {
            // -n alone: as few nodes as hold the tasks at the job's density.
            Some(n) => (n.div_ceil(job_per_node.max(1)) as usize).clamp(1, job_nodes.len()),
            None => job_nodes.len(),
        },
    };
    let nodes: Vec<u32> = named.unwrap_or_else(|| (0..count as u32).collect());
    let per_node_default = if job.nodes.is_some() || job.nodelist.is_some() {
        1
    } else {
        job_per_node.max(1)
    };
    let tasks = match (args.alloc.ntasks, job.ntasks_per_node) {
        (Some(n), Some(per)) if u64::from(per) * count as u64 != u64::from(n) => {
            return Err(format!(
                "-n {n} does not match --ntasks-per-node {per} on {count} node(s); give one of them"
            ))
        }
        (_, Some(per)) => vec![per; count],
        (Some(n), None) => {
            if (n as usize) < count {
                return Err(format!(
                    "-n {n} is fewer tasks than the {count} node(s) asked for; every node runs \
                     at least one task: lower -N or raise -n"
                ));
            }
            let base = n / count as u32;
            let extra = n as usize % count;
            (0..count).map(|i| base + u32::from(i < extra)).collect()
        }
        (None, None) => vec![per_node_default; count],
    };
    Ok((nodes, tasks))
}

/// `srun ARGS`.
pub async fn run(args: Vec<String>) -> Result<ExitCode, CliError> {
    let Some(cli) = parse_args(&args)? else {
        return Ok(ExitCode::SUCCESS);
    };
    if cli.pty && !crate::cli::interactive::stdin_is_terminal() {
        return Err(crate::cli::interactive::needs_terminal("srun"));
    }
    if cli.pty && (cli.alloc.job.output.is_some() || cli.alloc.job.error.is_some()) {
        return Err(CliError::input(
            "--pty shows the task's output on this terminal: leave out -o/-e (the output is \
             kept on the node too, for sattach)",
        ));
    }
    if cli.alloc.job.script_or_command.is_empty() {
        return Err(CliError::input(
            "no command to run: give one after the options, e.g. srun -N2 hostname",
        ));
    }
    if let Some(mpi) = cli.mpi.as_deref().filter(|m| *m != "none") {
        eprintln!(
            "srun: --mpi={mpi}: gpuq offers no PMIx or PMI2 server; ranks meet through \
             MASTER_ADDR/MASTER_PORT and the SLURM_* variables"
        );
    }
    let in_job = cli.jobid.map(JobId).or_else(|| {
        std::env::var("SLURM_JOB_ID")
            .ok()
            .and_then(|v| v.parse().ok())
            .map(JobId)
    });
    let cwd = std::env::current_dir()
        .map_err(|e| CliError::input(format!("cannot read the current directory: {e}")))?;
    match in_job {
        Some(job) => run_step(&cli, job, &cwd).await,
        None => run_in_new_allocation(&cli, &cwd).await,
    }
}

/// Queues an allocation with the step as its first, follows the step and
/// releases the allocation.
async fn run_in_new_allocation(cli: &SrunArgs, cwd: &Path) -> Result<ExitCode, CliError> {
    let env: Vec<(String, String)> = std::env::vars().collect();
    // The allocation holds the step's nodes with room for its busiest node:
    // -n 3 on -N 2 runs 2 and 1 tasks, on an allocation of 2 per node.
    let mut alloc = cli.alloc.clone();
    if let (Some(n), None) = (alloc.ntasks, alloc.job.ntasks_per_node) {
        let nodes = alloc.job.nodes.map_or(1, |r| r.min).max(1);
        alloc.ntasks = None;
        alloc.job.ntasks_per_node = Some(n.div_ceil(nodes));
    }
    // The step's shape, on the nodes it will have (named by -w, or as many
    // as asked for; the allocation is exactly those), checked before
    // anything is queued.
    let planned: Vec<String> = match &cli.alloc.job.nodelist {
        Some(list) => list.0.clone(),
        None => (0..alloc.job.nodes.map_or(1, |r| r.min))
            .map(|i| format!("node {i}"))
            .collect(),
    };
    let per_node = alloc.job.ntasks_per_node.unwrap_or(1);
    let (_, tasks) = step_shape(cli, &planned, per_node).map_err(CliError::input)?;
    let nodes = (0..tasks.len() as u32).collect();
    let step = step_spec(cli, nodes, tasks, 1, cwd)?;
    let mut args = super::sbatch::translate(&alloc).map_err(CliError::input)?;
    // Slurm's srun writes to the terminal, not to slurm-%j.out.
    if cli.alloc.job.output.is_none() {
        args.output = None;
    }
    let argv = cli.alloc.job.script_or_command.clone();
    let mut spec = crate::spec::build_allocation_spec(&args, argv, &env, cwd)
        .map_err(|e| CliError::input(e.to_string()))?;
    spec.submit_host = super::submit_host();
    let step = StepSpec {
        cpus_per_task: spec.cpus_per_task,
        ..step
    };
    let (streamed, ntasks) = (step.output.is_none(), step.ntasks());
    spec.first_step = Some(Box::new(step));
    let Some((id, attempt)) = allocate("srun", spec).await? else {
        return Ok(ExitCode::from(1));
    };
    let held = crate::cli::session::KeepAlive::start(id);
    let code = match cli.pty {
        true => on_terminal(id, 0).await,
        false => {
            super::srun_output::follow(cli.label, id, attempt, 0, ntasks, streamed, Srun).await
        }
    };
    drop(held);
    let _ = call(ApiRequest::Release { job: id }).await;
    code
}

/// Follows a step's one task on this terminal to its end (see
/// `cli::session`); stopping the step when this process is told to stop.
async fn on_terminal(id: JobId, step: u32) -> Result<ExitCode, CliError> {
    let mode = crate::cli::interactive::Mode {
        pty: true,
        input: true,
        detach: false,
    };
    match crate::cli::session::follow(id, step, 0, mode).await? {
        crate::cli::session::Followed::Exit(code) => Ok(code),
        crate::cli::session::Followed::Interrupted | crate::cli::session::Followed::Detached => {
            let _ = call(ApiRequest::StepCancel { job: id, step }).await;
            Err(CliError::input(format!(
                "interrupted: step {id}.{step} was stopped"
            )))
        }
    }
}

/// Queues the allocation `spec` and waits until it runs, saying so on
/// stderr as `command` when it has to wait: its id and attempt; `None` when
/// interrupted while waiting (the job is then cancelled).
pub(crate) async fn allocate(
    command: &str,
    spec: crate::model::JobSpec,
) -> Result<Option<(JobId, u32)>, CliError> {
    let id = match call(ApiRequest::Submit {
        spec: Box::new(spec),
    })
    .await?
    {
        ApiResponse::Submitted { id } => id,
        other => return Err(unexpected(other)),
    };
    let queued = Instant::now();
    let mut said = false;
    let mut interrupt = Interrupts::new()?;
    let attempt = loop {
        let job = show(id).await?;
        match job.state {
            JobState::Running => break job.run.map_or(0, |r| r.attempt),
            JobState::Pending => {
                if !said && queued.elapsed() > Duration::from_secs(1) {
                    eprintln!("{command}: job {id} queued and waiting for resources");
                    said = true;
                }
            }
            other => {
                return Err(CliError::input(format!(
                    "job {id} ended ({other}) before it started{}",
                    job.reason.map(|r| format!(": {r}")).unwrap_or_default()
                )))
            }
        }
        if interrupt.poll() {
            let _ = call(ApiRequest::Cancel {
                ids: vec![id],
                tasks: Vec::new(),
            })
            .await;
            eprintln!("{command}: job {id} cancelled while waiting");
            return Ok(None);
        }
        // Quick at first: an idle cluster starts the job within a pass.
        let pause = if queued.elapsed() < Duration::from_millis(500) {
            5
        } else {
            50
        };
        tokio::time::sleep(Duration::from_millis(pause)).await;
    };
    if said {
        eprintln!("{command}: job {id} has been allocated resources");
    }
    Ok(Some((id, attempt)))
}

/// The step srun's flags describe, on the job's node ranks `nodes` with
/// `tasks` on each; `cpus_per_task` unless -c says otherwise.
fn step_spec(
    cli: &SrunArgs,
    nodes: Vec<u32>,
    tasks: Vec<u32>,
    cpus_per_task: u32,
    cwd: &Path,
) -> Result<StepSpec, CliError> {
    let argv = cli.alloc.job.script_or_command.clone();
    let chdir = match &cli.alloc.job.chdir {
        Some(d) => cwd.join(d),
        None => cwd.to_path_buf(),
    };
    let env: Vec<(String, String)> = std::env::vars().collect();
    let env = match &cli.alloc.job.export {
        Some(export) => crate::spec::values::export_env(export, &env),
        None => env,
    };
    let spec = StepSpec {
        name: cli
            .alloc
            .job
            .job_name
            .clone()
            .unwrap_or_else(|| file_name(&argv[0])),
        program: Program::Command { argv },
        nodes,
        tasks,
        cpus_per_task: cli.alloc.job.cpus_per_task.unwrap_or(cpus_per_task),
        // A job's sbatch --gpus-per-task reaches its sruns as Slurm's does.
        gpus_per_task: cli.alloc.gpus_per_task.or_else(|| {
            std::env::var(super::sbatch::GPUS_PER_TASK_VAR)
                .ok()
                .and_then(|v| v.parse().ok())
                .filter(|n| *n > 0)
        }),
        workdir: chdir.to_string_lossy().into_owned(),
        env,
        output: cli.alloc.job.output.clone(),
        error: cli.alloc.job.error.clone(),
        kill_on_bad_exit: cli.kill_on_bad_exit == Some(1),
        io: match cli.pty {
            true => crate::model::TaskIo::Pty,
            false => crate::model::TaskIo::Files,
        },
        // Its own image, or (None) the job's.
        container: crate::spec::container::resolve(&cli.alloc.job)
            .map_err(|e| CliError::input(e.to_string()))?,
    };
    for (flag, pattern) in [("--output", &spec.output), ("--error", &spec.error)] {
        if let Some(p) = pattern {
            crate::spec::values::parse_output_pattern(p)
                .map_err(|e| CliError::input(format!("{flag} {p}: {e}")))?;
        }
    }
    Ok(spec)
}

/// Starts the step in job `job`, streams its output, and returns its exit
/// status.
async fn run_step(cli: &SrunArgs, id: JobId, cwd: &Path) -> Result<ExitCode, CliError> {
    let job = show(id).await?;
    let Some(run) = job.run.as_ref().filter(|_| job.state == JobState::Running) else {
        return Err(CliError::input(format!(
            "job {id} is {}, not running: steps start only in a running allocation{}",
            job.state,
            if cli.jobid.is_none() {
                " (SLURM_JOB_ID names it; unset it to get a new allocation)"
            } else {
                ""
            }
        )));
    };
    let job_nodes = run.node_names();
    let (nodes, tasks) =
        step_shape(cli, &job_nodes, job.spec.ntasks_per_node).map_err(CliError::input)?;
    let spec = step_spec(cli, nodes, tasks, job.spec.cpus_per_task, cwd)?;
    let streamed = spec.output.is_none();
    let ntasks = spec.ntasks();
    let step = match call(ApiRequest::StepStart {
        job: id,
        spec: Box::new(spec),
    })
    .await?
    {
        ApiResponse::StepStarted { step } => step,
        other => return Err(unexpected(other)),
    };
    if cli.pty {
        return on_terminal(id, step).await;
    }
    super::srun_output::follow(cli.label, id, run.attempt, step, ntasks, streamed, Srun).await
}

fn file_name(path: &str) -> String {
    Path::new(path)
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| path.to_string())
}

#[cfg(test)]
#[path = "tests/srun.rs"]
mod tests;
