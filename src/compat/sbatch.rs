//! `sbatch`: a batch script from a file or stdin, its `#SBATCH` lines and
//! sbatch's flags, translated onto `spec::SubmitArgs` and built by `spec`
//! as `gpuq submit` builds a script job.
//!
//! sbatch's grammar is `gpuq submit`'s (whose flags were named after
//! sbatch's) plus what only sbatch has: `-n/--ntasks`, `--parsable`,
//! `-W/--wait`, and flags gpuq accepts but cannot honour (mail, comment,
//! wckey: a one-line warning each). The same grammar reads the script's
//! `#SBATCH` (and `#GPUQ`) lines, so a directive is refused exactly as the
//! flag would be; flags win over directives. Where the words mean something
//! else, this file translates: sbatch's `--requeue` only allows requeueing
//! (gpuq's default), and the default output file is `slurm-%j.out`.

use std::io::Read;
use std::path::Path;
use std::process::ExitCode;
use std::time::Duration;

use clap::{value_parser, CommandFactory, FromArgMatches, Parser};

use crate::cli::queue::fetch_jobs;
use crate::cli::{call, unexpected, CliError};
use crate::model::{Job, JobId, JobSpec, JobState};
use crate::net::proto::{ApiRequest, ApiResponse};
use crate::spec::{self, SubmitArgs};

/// The output file of a job that names none, as Slurm's.
pub const DEFAULT_OUTPUT: &str = "slurm-%j.out";

/// sbatch's flags: `gpuq submit`'s and sbatch's own.
#[derive(Parser, Debug, Clone, Default, PartialEq, Eq)]
#[command(
    name = "sbatch",
    no_binary_name = true,
    disable_version_flag = true,
    max_term_width = 100,
    about = "Submit a batch script to gpuq, as Slurm's sbatch (from stdin when no script is given)",
    after_help = "Accepted and ignored, with a warning: --mail-type, --mail-user, --comment, --wckey.\n\
                  --exclusive holds the job's nodes whole: all their GPUs, CPUs and memory."
)]
pub struct SbatchArgs {
    #[command(flatten)]
    pub job: SubmitArgs,

    /// Tasks in all; gpuq runs the same number on every node, so N must
    /// split evenly over --nodes (or set --ntasks-per-node)
    #[arg(short = 'n', long, value_name = "N", allow_negative_numbers = true,
          value_parser = value_parser!(u32).range(1..))]
    pub ntasks: Option<u32>,

    /// Memory per CPU (512M, 4G); becomes --mem: this times the CPUs of a node's tasks
    #[arg(long, value_name = "SIZE", conflicts_with_all = ["mem", "mem_per_gpu"],
          value_parser = spec::memory::parse_mem)]
    pub mem_per_cpu: Option<u64>,

    /// Memory per GPU (80G); becomes --mem: this times the GPUs per node
    #[arg(long, value_name = "SIZE", conflicts_with = "mem",
          value_parser = spec::memory::parse_mem)]
    pub mem_per_gpu: Option<u64>,

    /// CPUs per GPU; becomes --cpus-per-task: this times the GPUs per node over the tasks per node
    #[arg(long, value_name = "N", conflicts_with = "cpus_per_task",
          value_parser = value_parser!(u32).range(1..))]
    pub cpus_per_gpu: Option<u32>,

    /// GPUs per task; becomes --gpus-per-node: this times the tasks per
    /// node, and srun's tasks each see this many
    #[arg(long, value_name = "N", conflicts_with_all = ["gpus_per_node", "gres", "total_gpus"],
          value_parser = value_parser!(u32).range(1..))]
    pub gpus_per_task: Option<u32>,

    /// Print only the job id
    #[arg(long)]
    pub parsable: bool,

    /// Wait until the job ends and exit with its exit code
    #[arg(short = 'W', long)]
    pub wait: bool,

    /// How output files open: append (what gpuq does) or truncate (accepted
    /// with a warning: gpuq always appends, so a requeued job keeps its
    /// earlier output)
    #[arg(long, value_name = "append|truncate", value_parser = ["append", "truncate"])]
    pub open_mode: Option<String>,

    /// Ignored: gpuq sends no mail
    #[arg(long, value_name = "TYPE")]
    pub mail_type: Option<String>,

    /// Ignored: gpuq sends no mail
    #[arg(long, value_name = "USER")]
    pub mail_user: Option<String>,

    /// Ignored: gpuq keeps no job comment yet
    #[arg(long, value_name = "TEXT")]
    pub comment: Option<String>,

    /// Ignored: gpuq has no workload characterization keys
    #[arg(long, value_name = "KEY")]
    pub wckey: Option<String>,
}

impl SbatchArgs {
    /// `self` with every option that `over` sets taken from `over`.
    fn overlay(&self, over: &SbatchArgs) -> SbatchArgs {
        SbatchArgs {
            job: self.job.overlay(&over.job),
            ntasks: over.ntasks.or(self.ntasks),
            // Each is one way of giving --mem (or -c): the side that gives
            // any of them gives all three.
            mem_per_cpu: if over.sets_memory() {
                over.mem_per_cpu
            } else {
                self.mem_per_cpu
            },
            mem_per_gpu: if over.sets_memory() {
                over.mem_per_gpu
            } else {
                self.mem_per_gpu
            },
            cpus_per_gpu: if over.job.cpus_per_task.is_some() || over.cpus_per_gpu.is_some() {
                over.cpus_per_gpu
            } else {
                self.cpus_per_gpu
            },
            gpus_per_task: if over.job.gpus().is_some() || over.job.total_gpus.is_some() {
                over.gpus_per_task
            } else {
                over.gpus_per_task.or(self.gpus_per_task)
            },
            parsable: self.parsable || over.parsable,
            wait: self.wait || over.wait,
            open_mode: over.open_mode.clone().or_else(|| self.open_mode.clone()),
            mail_type: over.mail_type.clone().or_else(|| self.mail_type.clone()),
            mail_user: over.mail_user.clone().or_else(|| self.mail_user.clone()),
            comment: over.comment.clone().or_else(|| self.comment.clone()),
            wckey: over.wckey.clone().or_else(|| self.wckey.clone()),
        }
    }

    /// Whether memory is given here in any of its three ways.
    fn sets_memory(&self) -> bool {
        self.job.mem.is_some() || self.mem_per_cpu.is_some() || self.mem_per_gpu.is_some()
    }

    /// The flags given that gpuq accepts but does not act on.
    fn ignored(&self) -> Vec<&'static str> {
        [
            ("--mail-type", self.mail_type.is_some()),
            ("--mail-user", self.mail_user.is_some()),
            ("--comment", self.comment.is_some()),
            ("--wckey", self.wckey.is_some()),
            (
                "--open-mode=truncate",
                self.open_mode.as_deref() == Some("truncate"),
            ),
        ]
        .into_iter()
        .filter(|(_, set)| *set)
        .map(|(flag, _)| flag)
        .collect()
    }
}

/// sbatch's command: the derived one with sbatch's meaning in the help of
/// the flags whose meaning differs from `gpuq submit`'s.
fn command() -> clap::Command {
    SbatchArgs::command()
        .mut_arg("requeue", |a| {
            a.help("Let the job be requeued (node failure, preemption): gpuq's default, as Slurm's")
        })
        .mut_arg("max_restarts", |a| a.hide(true))
        .mut_arg("output", |a| {
            a.help("Stdout file: %j job id, %x job name, %u user, %t task rank, %% a % [default: slurm-%j.out]")
        })
        .mut_arg("script_or_command", |a| {
            a.help("The batch script (its first line must be #!); read from stdin when absent")
                .long_help(None)
                .value_name("SCRIPT")
        })
}

/// Parses sbatch arguments (a command line, or one directive's words).
pub fn parse_args(args: &[String]) -> Result<Option<SbatchArgs>, CliError> {
    let Some(m) = super::parse_with(command(), args)? else {
        return Ok(None);
    };
    SbatchArgs::from_arg_matches(&m)
        .map(Some)
        .map_err(|e| CliError::input(super::clap_line(&e)))
}

/// Turns sbatch's flags into `gpuq submit`'s: `-n` onto tasks per node,
/// sbatch's `--requeue` onto gpuq's default policy, Slurm's output default.
pub fn translate(args: &SbatchArgs) -> Result<SubmitArgs, String> {
    let mut job = args.job.clone();
    // Slurm's --requeue permits a requeue; gpuq's also requeues a failed
    // program, which sbatch users do not ask for.
    job.requeue = false;
    if job.output.is_none() {
        job.output = Some(DEFAULT_OUTPUT.into());
    }
    if let Some(n) = args.ntasks {
        if let Some(r) = job.nodes.filter(|r| r.min < r.max) {
            return Err(format!(
                "-n {n} with an elastic -N {r}: the task count changes with the node count; \
                 give --ntasks-per-node instead of -n"
            ));
        }
        match (job.nodes.map(|r| r.min), job.ntasks_per_node) {
            (nodes, Some(per)) => {
                let nodes = nodes.unwrap_or_else(|| n.div_ceil(per));
                if u64::from(nodes) * u64::from(per) != u64::from(n) {
                    return Err(format!(
                        "-n {n} does not match --ntasks-per-node {per} on {nodes} node(s) \
                         ({} tasks); give one of them, or numbers that agree",
                        u64::from(nodes) * u64::from(per)
                    ));
                }
                job.nodes = Some(crate::model::NodeRange::fixed(nodes));
            }
            (Some(nodes), None) => {
                if n % nodes != 0 {
                    return Err(format!(
                        "-n {n} does not split evenly over -N {nodes}: gpuq runs the same \
                         number of tasks on every node; give a multiple of {nodes}, or \
                         --ntasks-per-node"
                    ));
                }
                job.ntasks_per_node = Some(n / nodes);
            }
            (None, None) if job.total_gpus.is_some() => {
                return Err(format!(
                    "-n {n} with -G/--gpus needs -N too, so the tasks can be split over the \
                     nodes; give -N, or --gpus-per-node instead of --gpus"
                ));
            }
            (None, None) => job.ntasks_per_node = Some(n),
        }
    }
    if let Some(per_task) = args.gpus_per_task {
        let tasks = job.ntasks_per_node.unwrap_or(1);
        job.gres = None;
        job.total_gpus = None;
        job.gpus_per_node = Some(spec::values::GpuRequest {
            gpu_type: None,
            count: per_task.saturating_mul(tasks),
        });
    }
    per_gpu_and_cpu(args, &mut job)?;
    Ok(job)
}

/// The variable that hands `--gpus-per-task` to the job's `srun`s, as
/// Slurm's sbatch sets it.
pub const GPUS_PER_TASK_VAR: &str = "SLURM_GPUS_PER_TASK";

/// The GPUs per node `job` asks for, when it can be known at submit.
fn gpus_per_node(job: &SubmitArgs) -> Result<u32, String> {
    if let Some(g) = job.gpus() {
        return Ok(g.count);
    }
    match (&job.total_gpus, job.nodes.map(|r| r.min)) {
        (Some(total), Some(n)) if n > 0 => Ok(total.count / n),
        (Some(_), _) => Err(
            "with -G/--gpus, gpuq knows the GPUs per node only with -N; give -N or --gpus-per-node"
                .into(),
        ),
        _ => Ok(0),
    }
}

/// `--cpus-per-gpu`, `--mem-per-cpu` and `--mem-per-gpu` as the per-task
/// CPUs and per-node memory gpuq asks for.
fn per_gpu_and_cpu(args: &SbatchArgs, job: &mut SubmitArgs) -> Result<(), String> {
    let tasks = job.ntasks_per_node.unwrap_or(1);
    if let Some(per_gpu) = args.cpus_per_gpu {
        let cpus = u64::from(per_gpu) * u64::from(gpus_per_node(job)?);
        if cpus == 0 || cpus % u64::from(tasks) != 0 || cpus / u64::from(tasks) > 1 << 20 {
            return Err(format!(
                "--cpus-per-gpu {per_gpu} makes {cpus} CPUs per node, which does not split over \
                 {tasks} task(s) per node; ask for GPUs, or give -c/--cpus-per-task instead"
            ));
        }
        job.cpus_per_task = Some((cpus / u64::from(tasks)) as u32);
    }
    if let Some(per_cpu) = args.mem_per_cpu {
        let cpus = u64::from(job.cpus_per_task.unwrap_or(1)) * u64::from(tasks);
        job.mem = Some(per_cpu.saturating_mul(cpus));
    }
    if let Some(per_gpu) = args.mem_per_gpu {
        let gpus = gpus_per_node(job)?;
        if gpus == 0 {
            return Err(
                "--mem-per-gpu needs GPUs; add --gpus-per-node N (or --gres=gpu:N), or give --mem"
                    .into(),
            );
        }
        job.mem = Some(per_gpu.saturating_mul(u64::from(gpus)));
    }
    Ok(())
}

/// What runs and where it came from.
struct Script {
    /// For display: the script's path, or `(stdin)`.
    shown: String,
    content: String,
    /// What follows the script's name on the command line: `$1`, `$2`...
    args: Vec<String>,
}

/// Reads the batch script named by the first positional word, or stdin.
fn read_script(words: &[String], cwd: &Path) -> Result<Script, CliError> {
    let input = |e: spec::SpecError| CliError::input(e.to_string());
    let script = match words {
        [] => {
            let mut bytes = Vec::new();
            std::io::stdin()
                .take(spec::MAX_SCRIPT_BYTES + 1)
                .read_to_end(&mut bytes)
                .map_err(|e| CliError::input(format!("cannot read the script from stdin: {e}")))?;
            let shown = "(stdin)".to_string();
            let content = spec::script_text(bytes, &shown).map_err(input)?;
            Script {
                shown,
                content,
                args: Vec::new(),
            }
        }
        [first, args @ ..] => {
            let path = cwd.join(first);
            let content = spec::read_script(&path).map_err(input)?;
            Script {
                shown: path.to_string_lossy().into_owned(),
                content,
                args: args.to_vec(),
            }
        }
    };
    if !script.content.starts_with("#!") {
        return Err(CliError::input(format!(
            "{}: this does not look like a batch script: the first line must start with #! \
             followed by the path to an interpreter, e.g. #!/bin/sh",
            script.shown
        )));
    }
    Ok(script)
}

/// The script's `#SBATCH` (and `#GPUQ`) lines, parsed by sbatch's grammar
/// and merged in file order.
fn directives(script: &Script) -> Result<SbatchArgs, CliError> {
    let at =
        |line: usize, why: String| CliError::input(format!("{} line {line}: {why}", script.shown));
    let lines = spec::directives::read_directives(&script.content)
        .map_err(|e| at(e.line, e.problem.to_string()))?;
    let mut merged = SbatchArgs::default();
    for d in lines {
        let parsed = parse_args(&d.args)
            .map_err(|e| at(d.line, e.message))?
            .ok_or_else(|| at(d.line, "--help is not a directive".into()))?;
        if let Some(first) = parsed.job.script_or_command.first() {
            return Err(at(
                d.line,
                format!(
                    "{} takes options only, but {first:?} is not one; quote values with spaces",
                    d.prefix.as_str()
                ),
            ));
        }
        merged = merged.overlay(&parsed);
    }
    Ok(merged)
}

/// Builds the job spec from sbatch's command line (the script read from
/// its file or stdin), with `env` and `cwd` the submitter's.
pub fn build(
    cli: &SbatchArgs,
    env: &[(String, String)],
    cwd: &Path,
) -> Result<(JobSpec, SbatchArgs), CliError> {
    let input = |e: String| CliError::input(e);
    if cli.job.wrap.is_some() {
        let args = translate(cli).map_err(input)?;
        let spec = spec::build_spec(&args, env, cwd).map_err(|e| input(e.to_string()))?;
        return Ok((spec, cli.clone()));
    }
    let script = read_script(&cli.job.script_or_command, cwd)?;
    let merged = directives(&script)?.overlay(cli);
    let mut args = translate(&merged).map_err(input)?;
    if script.shown == "(stdin)" && args.job_name.is_none() {
        args.job_name = Some("sbatch".into());
    }
    let mut spec = spec::build_batch_spec(&args, &script.shown, script.content, env, cwd)
        .map_err(|e| input(e.to_string()))?;
    // The script runs once, on the first node; srun starts the steps.
    spec.launch = crate::model::Launch::Batch;
    if let crate::model::Program::Script { args, .. } = &mut spec.program {
        *args = script.args;
    }
    Ok((spec, merged))
}

/// `sbatch ARGS`.
pub async fn run(args: Vec<String>) -> Result<ExitCode, CliError> {
    let Some(cli) = parse_args(&args)? else {
        return Ok(ExitCode::SUCCESS);
    };
    let env: Vec<(String, String)> = std::env::vars().collect();
    let cwd = std::env::current_dir()
        .map_err(|e| CliError::input(format!("cannot read the current directory: {e}")))?;
    let (mut spec, merged) = build(&cli, &env, &cwd)?;
    spec.submit_host = super::submit_host();
    spec.env.retain(|(k, _)| k != GPUS_PER_TASK_VAR);
    if let Some(n) = merged.gpus_per_task {
        spec.env.push((GPUS_PER_TASK_VAR.into(), n.to_string()));
    }
    for flag in merged.ignored() {
        eprintln!("sbatch: warning: {flag} is accepted and ignored: gpuq does not support it");
    }
    crate::cli::submit::check_output_files(&spec).map_err(CliError::input)?;
    let is_array = spec.queue.array.is_some();
    let id = match call(ApiRequest::Submit {
        spec: Box::new(spec),
    })
    .await?
    {
        ApiResponse::Submitted { id } => id,
        other => return Err(unexpected(other)),
    };
    if merged.parsable {
        println!("{id}");
    } else {
        println!("Submitted batch job {id}");
    }
    if !merged.wait {
        return Ok(ExitCode::SUCCESS);
    }
    use std::io::Write;
    let _ = std::io::stdout().flush();
    let code = wait(id, is_array).await?;
    Ok(ExitCode::from(code))
}

/// Polls until job `id` (every task, for an array) has ended; returns the
/// exit status sbatch --wait gives: 0 when all completed, else the highest
/// exit code (1 for a job that ended badly without one).
async fn wait(id: JobId, is_array: bool) -> Result<u8, CliError> {
    // NODE_FAIL and PREEMPTED end a job unless it is requeued, which
    // happens at once: one still there after this many polls has ended.
    const SETTLED_POLLS: u32 = 8;
    let mut unsettled = 0;
    loop {
        let jobs: Vec<Job> = if is_array {
            fetch_jobs(true, None, Vec::new())
                .await?
                .into_iter()
                .filter(|j| j.array.is_some_and(|a| a.array_job == id))
                .collect()
        } else {
            match call(ApiRequest::Show { id, task: None }).await? {
                ApiResponse::Job { job, .. } => vec![*job],
                other => return Err(unexpected(other)),
            }
        };
        let ended = |j: &Job| {
            j.state.is_final()
                || (matches!(j.state, JobState::NodeFail | JobState::Preempted)
                    && unsettled >= SETTLED_POLLS)
        };
        if !jobs.is_empty() && jobs.iter().all(ended) {
            return Ok(jobs.iter().map(exit_status).max().unwrap_or(0));
        }
        if jobs
            .iter()
            .any(|j| matches!(j.state, JobState::NodeFail | JobState::Preempted))
        {
            unsettled += 1;
        } else {
            unsettled = 0;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// One ended job's exit status as sbatch --wait reports it.
fn exit_status(job: &Job) -> u8 {
    if job.state == JobState::Completed {
        return 0;
    }
    match job.exit_code {
        Some(c) if c > 0 => c.min(255) as u8,
        _ => 1,
    }
}

#[cfg(test)]
#[path = "tests/sbatch.rs"]
mod tests;
