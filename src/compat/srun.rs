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

use std::io::Write;
use std::path::Path;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::{value_parser, CommandFactory, FromArgMatches, Parser};

use super::sbatch::SbatchArgs;
use crate::cli::{call, unexpected, CliError};
use crate::model::{Job, JobId, JobState, Program, Step, StepSpec};
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
                  Not yet: --pty (interactive), --multi-prog."
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

    /// An interactive task on a terminal (not yet)
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
    let job = &args.alloc.job;
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
    let count = match (job.nodes, &named) {
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
    if cli.pty {
        return Err(CliError::input(
            "--pty: interactive steps are not supported yet; run a command (srun CMD ARGS), \
             or submit a script with sbatch",
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

/// The job `id` as the cluster has it now.
pub(crate) async fn show(id: JobId) -> Result<Job, CliError> {
    match call(ApiRequest::Show { id, task: None }).await? {
        ApiResponse::Job { job, .. } => Ok(*job),
        other => Err(unexpected(other)),
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
        let nodes = alloc.job.nodes.unwrap_or(1).max(1);
        alloc.ntasks = None;
        alloc.job.ntasks_per_node = Some(n.div_ceil(nodes));
    }
    // The step's shape, on the nodes it will have (named by -w, or as many
    // as asked for; the allocation is exactly those), checked before
    // anything is queued.
    let planned: Vec<String> = match &cli.alloc.job.nodelist {
        Some(list) => list.0.clone(),
        None => (0..alloc.job.nodes.unwrap_or(1))
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
    let code = follow(cli, id, attempt, 0, ntasks, streamed).await;
    let _ = call(ApiRequest::Release { job: id }).await;
    code
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
        io: crate::model::TaskIo::Files,
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
    follow(cli, id, run.attempt, step, ntasks, streamed).await
}

/// One task's stream of output being copied here.
struct Stream {
    rank: u32,
    stderr: bool,
    offset: u64,
    /// A line not yet ended (for `-l` labels).
    partial: Vec<u8>,
}

/// Streams the step's output until it ends; its exit status.
async fn follow(
    cli: &SrunArgs,
    id: JobId,
    attempt: u32,
    step: u32,
    ntasks: u32,
    streamed: bool,
) -> Result<ExitCode, CliError> {
    let mut streams: Vec<Stream> = if streamed {
        (0..ntasks)
            .flat_map(|rank| {
                [false, true].map(|stderr| Stream {
                    rank,
                    stderr,
                    offset: 0,
                    partial: Vec::new(),
                })
            })
            .collect()
    } else {
        Vec::new()
    };
    let mut interrupt = Interrupts::new()?;
    let mut cancelled = false;
    loop {
        let job = show(id).await?;
        let current = job
            .run
            .as_ref()
            .filter(|r| r.attempt == attempt)
            .and_then(|r| r.steps.get(step as usize))
            .cloned();
        let Some(s) = current else {
            return Err(CliError::input(format!(
                "step {id}.{step} is gone: job {id} is {} (requeued or ended)",
                job.state
            )));
        };
        let over = s.is_over();
        for st in streams.iter_mut() {
            if s.started.contains(&st.rank) || s.ended.contains_key(&st.rank) {
                copy_new(cli, id, step, st).await?;
            }
        }
        if over {
            // Whatever was written before the end.
            for st in streams.iter_mut() {
                copy_new(cli, id, step, st).await?;
                flush_partial(cli, st);
            }
            report_bad_tasks(id, &s);
            let code = s.exit_code().clamp(0, 255) as u8;
            return Ok(ExitCode::from(code));
        }
        if interrupt.poll() && !cancelled {
            eprintln!("srun: interrupted: stopping step {id}.{step}");
            let _ = call(ApiRequest::StepCancel { job: id, step }).await;
            cancelled = true;
        }
        for signal in interrupt.passed_on_since() {
            let _ = call(ApiRequest::Signal {
                jobs: vec![crate::model::JobRef { id, task: None }],
                signal,
                scope: crate::net::proto::SignalScope::Steps,
                step: Some(step),
            })
            .await;
        }
        tokio::time::sleep(Duration::from_millis(if streamed { 100 } else { 50 })).await;
    }
}

/// Copies what task `st` wrote since the last call.
async fn copy_new(cli: &SrunArgs, id: JobId, step: u32, st: &mut Stream) -> Result<(), CliError> {
    loop {
        let reply = call(ApiRequest::StepLogs {
            job: id,
            step,
            rank: st.rank,
            stderr: st.stderr,
            offset: st.offset,
        })
        .await?;
        let data = match reply {
            ApiResponse::Logs {
                data, next_offset, ..
            } => {
                st.offset = next_offset;
                data
            }
            other => return Err(unexpected(other)),
        };
        if data.is_empty() {
            return Ok(());
        }
        write_out(cli, st, &data);
        if data.len() < crate::net::agent_proto::MAX_LOG_CHUNK as usize {
            return Ok(());
        }
    }
}

fn write_out(cli: &SrunArgs, st: &mut Stream, data: &[u8]) {
    let mut out: Vec<u8> = Vec::with_capacity(data.len() + 16);
    if cli.label {
        st.partial.extend_from_slice(data);
        while let Some(end) = st.partial.iter().position(|b| *b == b'\n') {
            let line: Vec<u8> = st.partial.drain(..=end).collect();
            out.extend_from_slice(format!("{}: ", st.rank).as_bytes());
            out.extend_from_slice(&line);
        }
    } else {
        out.extend_from_slice(data);
    }
    emit(st.stderr, &out);
}

fn flush_partial(cli: &SrunArgs, st: &mut Stream) {
    if cli.label && !st.partial.is_empty() {
        let mut out = format!("{}: ", st.rank).into_bytes();
        out.append(&mut st.partial);
        out.push(b'\n');
        emit(st.stderr, &out);
    }
}

fn emit(stderr: bool, bytes: &[u8]) {
    if bytes.is_empty() {
        return;
    }
    if stderr {
        let mut e = std::io::stderr().lock();
        let _ = e.write_all(bytes);
        let _ = e.flush();
    } else {
        let mut o = std::io::stdout().lock();
        let _ = o.write_all(bytes);
        let _ = o.flush();
    }
}

/// Slurm's one line per task that did not exit 0.
fn report_bad_tasks(id: JobId, step: &Step) {
    for (rank, end) in &step.ended {
        if *end != crate::model::TaskEnd::Completed && *end != crate::model::TaskEnd::Cancelled {
            eprintln!(
                "srun: error: step {id}.{}: task {rank}: {}",
                step.id,
                end.describe()
            );
        }
    }
}

fn file_name(path: &str) -> String {
    Path::new(path)
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| path.to_string())
}

/// SIGINT and SIGTERM (which stop the step), and the signals srun passes
/// on to its tasks as Slurm's does (USR1, USR2, HUP, ALRM: submitit and
/// Lightning checkpoint on USR1/USR2), seen without stopping the process.
pub(crate) struct Interrupts {
    int: tokio::signal::unix::Signal,
    term: tokio::signal::unix::Signal,
    passed_on: Vec<(i32, tokio::signal::unix::Signal)>,
}

impl Interrupts {
    pub(crate) fn new() -> Result<Interrupts, CliError> {
        use tokio::signal::unix::{signal, SignalKind};
        let err = |e: std::io::Error| CliError::internal(format!("cannot watch signals: {e}"));
        let mut passed_on = Vec::new();
        for n in [libc::SIGUSR1, libc::SIGUSR2, libc::SIGHUP, libc::SIGALRM] {
            passed_on.push((n, signal(SignalKind::from_raw(n)).map_err(err)?));
        }
        Ok(Interrupts {
            int: signal(SignalKind::interrupt()).map_err(err)?,
            term: signal(SignalKind::terminate()).map_err(err)?,
            passed_on,
        })
    }

    /// The signals to pass on to the step that came since the last call.
    fn passed_on_since(&mut self) -> Vec<i32> {
        use std::task::{Context, Poll};
        let mut cx = Context::from_waker(std::task::Waker::noop());
        let mut came = Vec::new();
        for (n, s) in &mut self.passed_on {
            if matches!(s.poll_recv(&mut cx), Poll::Ready(Some(()))) {
                came.push(*n);
            }
        }
        came
    }

    /// Whether a signal came since the last call.
    fn poll(&mut self) -> bool {
        use std::task::{Context, Poll};
        let mut cx = Context::from_waker(std::task::Waker::noop());
        let int = matches!(self.int.poll_recv(&mut cx), Poll::Ready(Some(())));
        let term = matches!(self.term.poll_recv(&mut cx), Poll::Ready(Some(())));
        int || term
    }
}

#[cfg(test)]
#[path = "tests/srun.rs"]
mod tests;
