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
                  Not yet: --exclusive."
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
        match (job.nodes, job.ntasks_per_node) {
            (nodes, Some(per)) => {
                let nodes = nodes.unwrap_or_else(|| n.div_ceil(per));
                if u64::from(nodes) * u64::from(per) != u64::from(n) {
                    return Err(format!(
                        "-n {n} does not match --ntasks-per-node {per} on {nodes} node(s) \
                         ({} tasks); give one of them, or numbers that agree",
                        u64::from(nodes) * u64::from(per)
                    ));
                }
                job.nodes = Some(nodes);
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
    match (&job.total_gpus, job.nodes) {
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
            match call(ApiRequest::Queue {
                all: true,
                user: None,
                states: Vec::new(),
            })
            .await?
            {
                ApiResponse::Jobs { jobs } => jobs
                    .into_iter()
                    .filter(|j| j.array.is_some_and(|a| a.array_job == id))
                    .collect(),
                other => return Err(unexpected(other)),
            }
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
mod tests {
    use super::*;

    fn parse(words: &[&str]) -> SbatchArgs {
        let words: Vec<String> = words.iter().map(|s| s.to_string()).collect();
        parse_args(&words).unwrap().unwrap()
    }

    fn spec_of(script: &str, flags: &[&str]) -> Result<JobSpec, String> {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("job.sh"), script).unwrap();
        let mut words = flags.to_vec();
        words.push("job.sh");
        let env = vec![("PATH".to_string(), "/usr/bin:/bin".to_string())];
        build(&parse(&words), &env, dir.path())
            .map(|(spec, _)| spec)
            .map_err(|e| e.message)
    }

    #[test]
    fn common_flags_land_on_the_spec() {
        let spec = spec_of(
            "#!/bin/sh\nhostname\n",
            &[
                "-J",
                "train",
                "-p",
                "gpu",
                "-t",
                "1:00:00",
                "-N",
                "2",
                "--ntasks-per-node",
                "4",
                "-c",
                "8",
                "--gres=gpu:h100:8",
                "--mem",
                "64G",
                "-o",
                "out-%j.txt",
                "-e",
                "err-%j.txt",
                "-q",
                "high",
                "-A",
                "proj",
                "-x",
                "n[5-6]",
                "-w",
                "n[1-4]",
                "-H",
                "--no-requeue",
            ],
        )
        .unwrap();
        assert_eq!(spec.name, "train");
        assert_eq!(spec.partition.as_deref(), Some("gpu"));
        assert_eq!(spec.time_limit_secs, Some(3600));
        assert_eq!(
            (spec.nodes, spec.ntasks_per_node, spec.cpus_per_task),
            (2, 4, 8)
        );
        assert_eq!(spec.gpus_per_node, 8);
        assert_eq!(spec.placement.gpu_type.as_deref(), Some("h100"));
        assert_eq!(spec.mem_per_node_mb, Some(64 * 1024));
        assert_eq!(spec.output.as_deref(), Some("out-%j.txt"));
        assert_eq!(spec.error.as_deref(), Some("err-%j.txt"));
        assert_eq!(spec.qos.as_deref(), Some("high"));
        assert_eq!(spec.account.as_deref(), Some("proj"));
        assert_eq!(spec.placement.exclude, ["n5", "n6"]);
        assert_eq!(spec.placement.nodelist, ["n1", "n2", "n3", "n4"]);
        assert!(spec.queue.hold);
        assert_eq!(spec.requeue, crate::model::RequeuePolicy::Never);
    }

    #[test]
    fn directives_are_read_with_sbatch_grammar_and_flags_win() {
        let script = "#!/bin/bash\n#SBATCH -n 8 -N 2\n#SBATCH --job-name='my job'\n\
                      #SBATCH --mail-type=ALL --time=10\n#SBATCH --gpus-per-node=2\necho hi\n\
                      #SBATCH --nodes 9\n";
        let spec = spec_of(script, &["-t", "5"]).unwrap();
        assert_eq!(spec.name, "my job");
        assert_eq!((spec.nodes, spec.ntasks_per_node), (2, 4));
        assert_eq!(spec.gpus_per_node, 2);
        assert_eq!(spec.time_limit_secs, Some(300), "the flag wins");
        assert_eq!(spec.output.as_deref(), Some(DEFAULT_OUTPUT));
    }

    #[test]
    fn sbatch_requeue_is_gpuqs_default_policy() {
        let spec = spec_of("#!/bin/sh\n#SBATCH --no-requeue\ntrue\n", &["--requeue"]).unwrap();
        assert_eq!(spec.requeue, crate::model::RequeuePolicy::OnNodeFailure);
        let spec = spec_of("#!/bin/sh\ntrue\n", &[]).unwrap();
        assert_eq!(spec.requeue, crate::model::RequeuePolicy::OnNodeFailure);
    }

    #[test]
    fn ntasks_becomes_tasks_per_node() {
        let t = |words: &[&str]| translate(&parse(words));
        let a = t(&["-n", "4"]).unwrap();
        assert_eq!((a.nodes, a.ntasks_per_node), (None, Some(4)));
        let a = t(&["-n", "8", "--ntasks-per-node", "4"]).unwrap();
        assert_eq!((a.nodes, a.ntasks_per_node), (Some(2), Some(4)));
        let e = t(&["-n", "5", "-N", "2"]).unwrap_err();
        assert!(e.contains("-n 5") && e.contains("-N 2"), "{e}");
        let e = t(&["-n", "6", "-N", "2", "--ntasks-per-node", "4"]).unwrap_err();
        assert!(e.contains("--ntasks-per-node 4"), "{e}");
        assert!(t(&["-n", "2", "-G", "16"]).is_err());
    }

    #[test]
    fn per_cpu_and_per_gpu_amounts_become_per_node_and_per_task() {
        let t = |words: &[&str]| translate(&parse(words));
        let a = t(&[
            "--gpus-per-node",
            "8",
            "--ntasks-per-node",
            "8",
            "--cpus-per-gpu",
            "4",
        ])
        .unwrap();
        assert_eq!(a.cpus_per_task, Some(4));
        let a = t(&["--gres=gpu:4", "--mem-per-gpu", "10G"]).unwrap();
        assert_eq!(a.mem, Some(40 * 1024));
        let a = t(&["-n", "4", "-c", "2", "--mem-per-cpu", "1G"]).unwrap();
        assert_eq!(a.mem, Some(8 * 1024));
        let a = t(&["-N", "2", "-G", "16", "--mem-per-gpu", "1G"]).unwrap();
        assert_eq!(a.mem, Some(8 * 1024));
        assert!(t(&["--mem-per-gpu", "1G"])
            .unwrap_err()
            .contains("needs GPUs"));
        assert!(t(&["-G", "4", "--mem-per-gpu", "1G"])
            .unwrap_err()
            .contains("-N"));
        let e = t(&[
            "--gpus-per-node",
            "1",
            "--ntasks-per-node",
            "2",
            "--cpus-per-gpu",
            "1",
        ])
        .unwrap_err();
        assert!(e.contains("--cpus-per-gpu 1"), "{e}");
        assert!(parse_args(&["--mem=1G".into(), "--mem-per-cpu=1G".into()]).is_err());
        // A directive's --mem gives way to a flag's --mem-per-cpu, and the
        // other way round; so do -c and --cpus-per-gpu.
        let merged = parse(&["--mem", "1G"]).overlay(&parse(&["--mem-per-cpu", "2G"]));
        assert_eq!(translate(&merged).unwrap().mem, Some(2048));
        let merged = parse(&["--mem-per-cpu", "2G"]).overlay(&parse(&["--mem", "1G"]));
        assert_eq!(translate(&merged).unwrap().mem, Some(1024));
        let merged =
            parse(&["--gpus-per-node", "2", "--cpus-per-gpu", "4"]).overlay(&parse(&["-c", "3"]));
        assert_eq!(translate(&merged).unwrap().cpus_per_task, Some(3));
    }

    #[test]
    fn gpus_per_task_times_the_tasks_per_node() {
        let t = |words: &[&str]| translate(&parse(words));
        let a = t(&["--ntasks-per-node", "4", "--gpus-per-task", "2"]).unwrap();
        assert_eq!(a.gpus().map(|g| g.count), Some(8));
        assert!(parse_args(&["--gpus-per-task=1".into(), "--gres=gpu:2".into()]).is_err());
        let merged = parse(&["--gpus-per-task", "1"]).overlay(&parse(&["--gres=gpu:4"]));
        assert_eq!(translate(&merged).unwrap().gpus().map(|g| g.count), Some(4));
    }

    #[test]
    fn the_commands_are_well_formed() {
        command().debug_assert();
        <super::super::squeue::SqueueArgs as CommandFactory>::command().debug_assert();
        <super::super::scancel::ScancelArgs as CommandFactory>::command().debug_assert();
        <super::super::sinfo::SinfoArgs as CommandFactory>::command().debug_assert();
    }

    #[test]
    fn ignored_flags_are_listed_unknown_ones_refused() {
        let a = parse(&[
            "--mail-type=END",
            "--mail-user",
            "me@x",
            "--comment",
            "c",
            "--wckey=k",
        ]);
        assert_eq!(
            a.ignored(),
            ["--mail-type", "--mail-user", "--comment", "--wckey"]
        );
        let e = parse_args(&["--bogus-flag".into(), "x.sh".into()]).unwrap_err();
        assert_eq!(e.code, 1);
        assert!(e.message.contains("'--bogus-flag'"), "{}", e.message);
        let e = parse_args(&["--parsabel".into()]).unwrap_err();
        assert!(
            e.message.contains("did you mean --parsable"),
            "{}",
            e.message
        );
    }

    #[test]
    fn bad_scripts_and_directives_name_the_line_and_fix() {
        let e = spec_of("echo no shebang\n", &[]).unwrap_err();
        assert!(e.contains("#!"), "{e}");
        let e = spec_of("#!/bin/sh\n#SBATCH --frobnicate\ntrue\n", &[]).unwrap_err();
        assert!(e.contains("line 2") && e.contains("--frobnicate"), "{e}");
        let e = spec_of("#!/bin/sh\n#SBATCH -N 0\ntrue\n", &[]).unwrap_err();
        assert!(e.contains("line 2"), "{e}");
    }

    #[test]
    fn parsable_and_wait_come_from_flags_or_directives() {
        let a = parse(&["--parsable", "-W"]);
        assert!(a.parsable && a.wait);
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("j.sh"),
            "#!/bin/sh\n#SBATCH --parsable\ntrue\n",
        )
        .unwrap();
        let (_, merged) = build(&parse(&["j.sh"]), &[], dir.path()).unwrap();
        assert!(merged.parsable && !merged.wait);
    }

    #[test]
    fn exit_status_of_ended_jobs() {
        let spec = spec_of("#!/bin/sh\ntrue\n", &[]).unwrap();
        let mut job = Job::pending(JobId(1), "u", spec, 0);
        job.state = JobState::Completed;
        assert_eq!(exit_status(&job), 0);
        job.state = JobState::Failed;
        job.exit_code = Some(3);
        assert_eq!(exit_status(&job), 3);
        job.state = JobState::Cancelled;
        job.exit_code = None;
        assert_eq!(exit_status(&job), 1);
    }
}
