//! User input -> `model::JobSpec`: the `gpuq submit` flags, `#GPUQ` and
//! `#SBATCH` directives in job scripts, and the checks that turn a mistake into
//! a message naming the input and the fix.
//!
//! Directives are parsed by the same clap struct as the flags, so a value is
//! accepted or refused the same way in both places, and an unknown directive
//! gets the "did you mean" a mistyped flag gets. Every field of `SubmitArgs` is
//! optional so that the two sources can merge: directives in file order (a
//! later line wins), then flags over directives. Defaults are applied last,
//! in `build_spec`.

mod command;
pub mod container;
pub mod directives;
pub mod memory;
pub mod placement;
mod program;
pub mod queue;
pub mod time;
pub mod values;

use std::io;
use std::path::{Path, PathBuf};

use clap::{value_parser, Args, CommandFactory, Parser};

use crate::clock::now_ms;
use crate::model::{JobSpec, Program, RequeuePolicy, TopologyRequirement};
pub use command::build_command_spec;
use directives::DirectivePrefix;
pub use placement::{Features, HostList};
pub use program::{classify, read_script, script_text, ProgramKind};
pub use time::TimeLimit;
pub use values::{Export, GpuRequest};

/// The largest script accepted (Slurm's default `max_script_size`).
pub const MAX_SCRIPT_BYTES: u64 = 4 << 20;

/// The shell `--wrap` runs its command with.
pub const WRAP_SHELL: &str = "/bin/sh";

const PROGRAM_HELP: &str = "\
The script or command to run, with its arguments.

It is a batch script when it names an existing file (relative to the current \
directory) that starts with #! or whose name ends in .sh: gpuq stores its \
content at submit and reads its #GPUQ and #SBATCH directives (flags override \
them). A name ending in .sh that is not a readable file is an error.

Anything else is a command, run without a shell on the compute nodes and \
looked up in their PATH: gpuq submit -- python train.py --lr 3. Everything \
after the script or command belongs to it, not to gpuq, so put gpuq options \
first; use -- before a command that starts with '-'.";

// The `gpuq submit` flags; also the grammar of one directive line.
#[derive(Args, Clone, Debug, Default, PartialEq, Eq)]
pub struct SubmitArgs {
    /// Job name shown in the queue [default: the script or command name]
    #[arg(short = 'J', long, value_name = "NAME")]
    pub job_name: Option<String>,

    /// Number of nodes, started together (all or none) [default: 1]; MIN-MAX (or MIN:MAX) runs an elastic job: it starts on as many as are free, grows into idle nodes and shrinks to MIN instead of being preempted, restarting its ranks at each size
    #[arg(short = 'N', long, value_name = "N|MIN-MAX", allow_negative_numbers = true,
          value_parser = placement::parse_nodes)]
    pub nodes: Option<crate::model::NodeRange>,

    /// Tasks (processes) per node [default: 1]
    #[arg(long, value_name = "N", allow_negative_numbers = true,
          value_parser = value_parser!(u32).range(1..))]
    pub ntasks_per_node: Option<u32>,

    /// GPUs per node, optionally with a type: 8 or h100:8 [default: 0, a CPU-only job]
    #[arg(long, value_name = "[TYPE:]N", allow_negative_numbers = true,
          value_parser = values::parse_gpus_per_node, conflicts_with = "gres")]
    pub gpus_per_node: Option<GpuRequest>,

    /// GPUs per node, Slurm style: gpu:N or gpu:TYPE:N
    #[arg(long, value_name = "gpu:[TYPE:]N", value_parser = values::parse_gres)]
    pub gres: Option<GpuRequest>,

    /// GPUs in total, optionally with a type; the scheduler picks the shape (whole nodes for a multiple of the node size, else one node) unless --nodes is given
    #[arg(short = 'G', long = "gpus", value_name = "[TYPE:]N",
          value_parser = placement::parse_gpus_total,
          conflicts_with_all = ["gpus_per_node", "gres"])]
    pub total_gpus: Option<GpuRequest>,

    /// GPU type: a part of the model name, any case (h100 matches "NVIDIA H100 80GB HBM3")
    #[arg(long, value_name = "TYPE", value_parser = placement::parse_gpu_type)]
    pub gpu_type: Option<String>,

    /// Node features the job needs, all of them: ib,nvme
    #[arg(short = 'C', long, value_name = "FEATURE,...", value_parser = placement::parse_constraint)]
    pub constraint: Option<Features>,

    /// Run only on nodes of this list (n[1-4],gpu7); unlike Slurm, the job need not use them all
    #[arg(short = 'w', long, value_name = "HOSTLIST", value_parser = placement::parse_hostlist)]
    pub nodelist: Option<HostList>,

    /// Never run on these nodes (n[1-4],gpu7)
    #[arg(short = 'x', long, value_name = "HOSTLIST", value_parser = placement::parse_hostlist)]
    pub exclude: Option<HostList>,

    /// Keep all nodes of the job under one leaf switch or one spine; the job waits until they are free there
    #[arg(long, value_name = "leaf|spine", value_parser = placement::parse_topology)]
    pub topology: Option<TopologyRequirement>,

    /// Run in this advance reservation (`gpuq admin reservation list`): on its nodes, once it has started
    #[arg(long, value_name = "NAME")]
    pub reservation: Option<String>,

    /// CPUs per task [default: 1]
    #[arg(short = 'c', long, value_name = "N", allow_negative_numbers = true,
          value_parser = value_parser!(u32).range(1..))]
    pub cpus_per_task: Option<u32>,

    /// Memory per node: 512M, 16G, 1T (a plain number is MiB) [default: the partition's]
    #[arg(long, value_name = "SIZE", allow_negative_numbers = true,
          value_parser = memory::parse_mem)]
    pub mem: Option<u64>,

    /// Time limit: M, M:S, H:M:S, D-H, D-H:M, D-H:M:S or UNLIMITED [default: the partition's]
    #[arg(short = 't', long, value_name = "TIME", allow_negative_numbers = true,
          value_parser = time::parse_time_limit)]
    pub time: Option<TimeLimit>,

    /// Account charged for the job [default: your default account]
    #[arg(short = 'A', long, value_name = "ACCOUNT")]
    pub account: Option<String>,

    /// Partition to run in [default: the default partition]
    #[arg(short = 'p', long, value_name = "PARTITION")]
    pub partition: Option<String>,

    /// Quality of service: its priority, preemption rights and caps [default: normal]
    #[arg(short = 'q', long, value_name = "QOS")]
    pub qos: Option<String>,

    /// Lower the job's priority by N (-10000..10000; below 0 needs an admin) [default: 0]
    #[arg(long, value_name = "N", allow_negative_numbers = true,
          value_parser = value_parser!(i32).range(-10000..=10000))]
    pub nice: Option<i32>,

    /// Stdout file: %j job id, %t task rank, %n node rank, %x job name, %u user, %% a % [default: gpuq-%j.out]
    #[arg(short = 'o', long, value_name = "PATTERN", value_parser = values::parse_output_pattern)]
    pub output: Option<String>,

    /// Stderr file, same escapes as --output [default: joined with stdout]
    #[arg(short = 'e', long, value_name = "PATTERN", value_parser = values::parse_output_pattern)]
    pub error: Option<String>,

    /// Working directory of the job, relative to the current one [default: the current one]
    #[arg(short = 'D', long, value_name = "DIR")]
    pub chdir: Option<PathBuf>,

    /// Environment for the job: ALL, NONE, or VAR,VAR=value,... (only those); ALL,VAR=value adds to all [default: ALL]
    #[arg(long, value_name = "ALL|NONE|VARS", value_parser = values::parse_export)]
    pub export: Option<Export>,

    /// Requeue the job (same id) also when a rank exits non-zero, up to
    /// --max-restarts times [default: requeue only when a node or GPU fails]
    #[arg(long, conflicts_with = "no_requeue")]
    pub requeue: bool,

    /// Never requeue the job, not even when its node fails
    #[arg(long)]
    pub no_requeue: bool,

    /// How many times the job may be requeued [default: 3]
    #[arg(long, value_name = "N")]
    pub max_restarts: Option<u32>,

    /// Start only after other jobs: afterok:ID[:ID...], afterany:ID, afternotok:ID, after:ID, singleton; comma-separated, all must hold
    #[arg(short = 'd', long, value_name = "TYPE:ID[:ID...][,...]", value_parser = queue::parse_dependency)]
    pub dependency: Option<queue::Dependencies>,

    /// Start no earlier than this: 2026-12-01T15:00 (UTC), 2026-12-01, now+10min
    #[arg(short = 'b', long, value_name = "TIME", value_parser = queue::parse_begin)]
    pub begin: Option<queue::Begin>,

    /// Submit the job held: it waits until `gpuq release ID`
    #[arg(short = 'H', long)]
    pub hold: bool,

    /// Share its nodes with no other job: it takes them whole (every GPU,
    /// CPU and byte of memory) and starts only on nodes running nothing
    #[arg(long)]
    pub exclusive: bool,

    /// An array of jobs, one per index: 0-99, 1,3,5-7, 0-15:4, with %N to run at most N at once (0-99%8)
    #[arg(short = 'a', long, value_name = "INDICES[%N]", value_parser = queue::parse_array)]
    pub array: Option<crate::model::ArraySpec>,

    /// Send SIG SECS seconds before the time limit (and on preemption): USR1@60; B: sends it to the batch shell only
    #[arg(long, value_name = "[B:]SIG[@SECS]", value_parser = queue::parse_signal)]
    pub signal: Option<crate::model::SignalSpec>,

    /// Run this shell command (with /bin/sh -c) instead of a script
    #[arg(long, value_name = "COMMAND", conflicts_with = "script_or_command")]
    pub wrap: Option<String>,

    /// Run the tasks in this image: the absolute path, on the nodes, of an OCI image layout or root filesystem directory, an OCI/docker archive (.tar) or a squashfs file (.sqsh); or docker://REF, pulled by the nodes (skopeo)
    #[arg(long, value_name = "PATH|docker://REF", value_parser = container::parse_image)]
    pub container_image: Option<String>,

    /// Host paths to mount in the container: SRC:DST[:ro],... (absolute paths)
    #[arg(long, value_name = "SRC:DST[:ro],...", value_parser = container::parse_mounts)]
    pub container_mounts: Option<container::Mounts>,

    /// Working directory inside the container [default: the job's, which is mounted]
    #[arg(long, value_name = "DIR", value_parser = container::parse_workdir)]
    pub container_workdir: Option<String>,

    /// Leave your home directory out of the container [default: mounted]
    #[arg(long)]
    pub no_container_mount_home: bool,

    /// Mount your home directory in the container (the default)
    #[arg(long, conflicts_with = "no_container_mount_home")]
    pub container_mount_home: bool,

    /// Be uid 0 inside the container (a user namespace maps your uid to root there; no privilege on the node, and the image's own files stay the image's)
    #[arg(long, conflicts_with = "no_container_remap_root")]
    pub container_remap_root: bool,

    /// Keep your own uid inside the container (the default)
    #[arg(long)]
    pub no_container_remap_root: bool,

    /// Run the command through the image's ENTRYPOINT (an OCI or docker image's; by default it is skipped, as Pyxis does)
    #[arg(long, conflicts_with = "no_container_entrypoint")]
    pub container_entrypoint: bool,

    /// Skip the image's ENTRYPOINT (the default)
    #[arg(long)]
    pub no_container_entrypoint: bool,

    /// A container of the job's, on each node, that its steps share and keep: the first task naming it makes it from --container-image, later ones (any step, with or without an image) run in it, with what earlier ones wrote; gone after the job
    #[arg(long, value_name = "NAME", value_parser = container::parse_name)]
    pub container_name: Option<String>,

    /// Save the container's root filesystem, as the step leaves it, as a squashfs file at this absolute path on each node (written as you; the nodes need mksquashfs); loadable again with --container-image
    #[arg(long, value_name = "PATH", value_parser = container::parse_save)]
    pub container_save: Option<String>,

    /// Accepted for Pyxis's scripts: the entrypoint's output is the task's output already
    #[arg(long)]
    pub container_entrypoint_log: bool,

    /// Variables of the job's environment that override the image's (by default the image's value wins): VAR,...
    #[arg(long, value_name = "VAR,...", value_parser = container::parse_env_names)]
    pub container_env: Option<container::EnvNames>,

    /// A writable root filesystem in the container (the default: a per-task layer over the image, discarded at the end)
    #[arg(long, conflicts_with = "container_readonly")]
    pub container_writable: bool,

    /// A read-only root filesystem in the container (mounts and /dev/shm stay writable)
    #[arg(long)]
    pub container_readonly: bool,

    #[arg(value_name = "SCRIPT | COMMAND", trailing_var_arg = true, num_args = 0..,
          help = "Script to submit, or command to run (see --help for the rule)",
          long_help = PROGRAM_HELP)]
    pub script_or_command: Vec<String>,
}

impl SubmitArgs {
    /// `self` with every option that `over` sets taken from `over`.
    pub fn overlay(&self, over: &SubmitArgs) -> SubmitArgs {
        fn pick<T: Clone>(base: &Option<T>, over: &Option<T>) -> Option<T> {
            over.clone().or_else(|| base.clone())
        }
        /// A yes/no flag pair: `over`'s where it says either, else `base`'s.
        fn pair(base: (bool, bool), over: (bool, bool)) -> (bool, bool) {
            if over.0 || over.1 {
                over
            } else {
                base
            }
        }
        // --gpus-per-node, --gres and --gpus are one setting spelled three ways.
        let gpus_from =
            if over.gpus_per_node.is_some() || over.gres.is_some() || over.total_gpus.is_some() {
                over
            } else {
                self
            };
        let home = pair(
            (self.no_container_mount_home, self.container_mount_home),
            (over.no_container_mount_home, over.container_mount_home),
        );
        let remap = pair(
            (self.container_remap_root, self.no_container_remap_root),
            (over.container_remap_root, over.no_container_remap_root),
        );
        let entry = pair(
            (self.container_entrypoint, self.no_container_entrypoint),
            (over.container_entrypoint, over.no_container_entrypoint),
        );
        SubmitArgs {
            job_name: pick(&self.job_name, &over.job_name),
            nodes: pick(&self.nodes, &over.nodes),
            ntasks_per_node: pick(&self.ntasks_per_node, &over.ntasks_per_node),
            gpus_per_node: gpus_from.gpus_per_node.clone(),
            gres: gpus_from.gres.clone(),
            total_gpus: gpus_from.total_gpus.clone(),
            gpu_type: pick(&self.gpu_type, &over.gpu_type),
            constraint: pick(&self.constraint, &over.constraint),
            nodelist: pick(&self.nodelist, &over.nodelist),
            exclude: pick(&self.exclude, &over.exclude),
            topology: pick(&self.topology, &over.topology),
            reservation: pick(&self.reservation, &over.reservation),
            cpus_per_task: pick(&self.cpus_per_task, &over.cpus_per_task),
            mem: pick(&self.mem, &over.mem),
            time: pick(&self.time, &over.time),
            account: pick(&self.account, &over.account),
            partition: pick(&self.partition, &over.partition),
            qos: pick(&self.qos, &over.qos),
            nice: pick(&self.nice, &over.nice),
            output: pick(&self.output, &over.output),
            error: pick(&self.error, &over.error),
            chdir: pick(&self.chdir, &over.chdir),
            export: pick(&self.export, &over.export),
            wrap: pick(&self.wrap, &over.wrap),
            // A flag on either side wins; the two conflict within one side.
            requeue: (self.requeue && !over.no_requeue) || over.requeue,
            no_requeue: (self.no_requeue && !over.requeue) || over.no_requeue,
            max_restarts: pick(&self.max_restarts, &over.max_restarts),
            dependency: pick(&self.dependency, &over.dependency),
            begin: pick(&self.begin, &over.begin),
            hold: self.hold || over.hold,
            exclusive: self.exclusive || over.exclusive,
            array: pick(&self.array, &over.array),
            signal: pick(&self.signal, &over.signal),
            container_image: pick(&self.container_image, &over.container_image),
            container_mounts: pick(&self.container_mounts, &over.container_mounts),
            container_name: pick(&self.container_name, &over.container_name),
            container_save: pick(&self.container_save, &over.container_save),
            container_entrypoint_log: self.container_entrypoint_log
                || over.container_entrypoint_log,
            container_workdir: pick(&self.container_workdir, &over.container_workdir),
            // Each pair is one setting spelled two ways (see `pair`).
            no_container_mount_home: home.0,
            container_mount_home: home.1,
            container_remap_root: remap.0,
            no_container_remap_root: remap.1,
            container_entrypoint: entry.0,
            no_container_entrypoint: entry.1,
            container_env: pick(&self.container_env, &over.container_env),
            // One setting spelled two ways: the side that says either wins.
            container_writable: if over.container_writable || over.container_readonly {
                over.container_writable
            } else {
                self.container_writable
            },
            container_readonly: if over.container_writable || over.container_readonly {
                over.container_readonly
            } else {
                self.container_readonly
            },
            script_or_command: if over.script_or_command.is_empty() {
                self.script_or_command.clone()
            } else {
                over.script_or_command.clone()
            },
        }
    }

    /// The per-node GPU request, from whichever of `--gpus-per-node` / `--gres` is set.
    pub fn gpus(&self) -> Option<&GpuRequest> {
        self.gpus_per_node.as_ref().or(self.gres.as_ref())
    }
}

/// Why a submission was refused. Each message names the input and the fix.
#[derive(Debug, thiserror::Error)]
pub enum SpecError {
    #[error("nothing to run: give a script (gpuq submit job.sh), a command (gpuq submit -- python train.py) or --wrap \"command\"")]
    NoProgram,
    #[error("--wrap runs its own command, so {0:?} cannot follow it; drop one of them")]
    WrapWithProgram(String),
    #[error("--wrap is empty; give the shell command to run, e.g. --wrap \"python train.py\"")]
    EmptyWrap,
    #[error("script {path} does not exist; check the path (relative paths start at {cwd})")]
    ScriptNotFound { path: String, cwd: String },
    #[error("{path} is a directory, not a script; name the script file to run")]
    ScriptIsDirectory { path: String },
    #[error("cannot read script {path}: {source}; check that it exists and that you may read it")]
    ScriptUnreadable { path: String, source: io::Error },
    #[error("script {path} is empty; write the commands to run in it")]
    ScriptEmpty { path: String },
    #[error("script {path} is not UTF-8 text; save it as UTF-8")]
    ScriptNotText { path: String },
    #[error("script {path} is larger than {MAX_SCRIPT_BYTES} bytes; keep data out of the script and read it from a file")]
    ScriptTooLarge { path: String },
    #[error("script {path} is followed by {args:?}, but script arguments are not supported yet; put gpuq options before the script, or use --wrap \"{path} ...\"")]
    ScriptArgs { path: String, args: Vec<String> },
    #[error("script {path} line {line}: {message}")]
    Directive {
        path: String,
        line: usize,
        message: String,
    },
    #[error("{field} {value:?} {problem}")]
    BadValue {
        field: &'static str,
        value: String,
        problem: &'static str,
    },
    #[error("{flag}: {source}")]
    Pattern {
        flag: &'static str,
        source: values::PatternError,
    },
    #[error("the current directory {0:?} is not absolute; run gpuq from a real directory")]
    RelativeCwd(PathBuf),
    #[error("working directory {0:?} is not valid UTF-8; use a directory whose path is UTF-8")]
    WorkdirNotUtf8(PathBuf),
    #[error("{0}")]
    Invalid(String),
}

/// Builds the job spec: reads the script (if it is one) and its directives,
/// lets flags override them, fills defaults, applies `--export` to the
/// submitter's `env` and checks the result. `cwd` is the submit directory.
pub fn build_spec(
    args: &SubmitArgs,
    env: &[(String, String)],
    cwd: &Path,
) -> Result<JobSpec, SpecError> {
    if !cwd.is_absolute() {
        return Err(SpecError::RelativeCwd(cwd.to_path_buf()));
    }
    let (program, default_name, merged) = match (&args.wrap, args.script_or_command.as_slice()) {
        (Some(_), [first, ..]) => return Err(SpecError::WrapWithProgram(first.clone())),
        (Some(wrap), []) if wrap.trim().is_empty() => return Err(SpecError::EmptyWrap),
        (Some(wrap), []) => (
            Program::Command {
                argv: vec![WRAP_SHELL.into(), "-c".into(), wrap.clone()],
            },
            "wrap".to_string(),
            args.clone(),
        ),
        (None, []) => return Err(SpecError::NoProgram),
        (None, [first, rest @ ..]) => match classify(first, cwd)? {
            ProgramKind::Script(path) => {
                let shown = path.to_string_lossy().into_owned();
                if !rest.is_empty() {
                    return Err(SpecError::ScriptArgs {
                        path: first.clone(),
                        args: rest.to_vec(),
                    });
                }
                let content = read_script(&path)?;
                let from_directives = parse_directives(&content, first)?;
                let name = file_name(first);
                let program = Program::Script {
                    path: shown,
                    content,
                    args: Vec::new(),
                };
                (program, name, from_directives.overlay(args))
            }
            ProgramKind::Command => (
                Program::Command {
                    argv: args.script_or_command.clone(),
                },
                file_name(first),
                args.clone(),
            ),
        },
    };
    finish_spec(&merged, program, default_name, env, cwd)
}

/// Builds the spec of a batch script whose directives the caller has read
/// and merged into `args` itself (sbatch reads `#SBATCH` lines with its own,
/// larger grammar); `content` is the script, `path` where it came from (for
/// display). Defaults, `--export` and the checks are `build_spec`'s.
pub fn build_batch_spec(
    args: &SubmitArgs,
    path: &str,
    content: String,
    env: &[(String, String)],
    cwd: &Path,
) -> Result<JobSpec, SpecError> {
    if !cwd.is_absolute() {
        return Err(SpecError::RelativeCwd(cwd.to_path_buf()));
    }
    if content.is_empty() {
        return Err(SpecError::ScriptEmpty {
            path: path.to_string(),
        });
    }
    let program = Program::Script {
        path: path.to_string(),
        content,
        args: Vec::new(),
    };
    finish_spec(args, program, file_name(path), env, cwd)
}

/// Builds the spec of an allocation (`srun` outside one, `salloc`): nothing
/// runs by itself; `argv` is what its first step will run, for display.
pub fn build_allocation_spec(
    args: &SubmitArgs,
    argv: Vec<String>,
    env: &[(String, String)],
    cwd: &Path,
) -> Result<JobSpec, SpecError> {
    if !cwd.is_absolute() {
        return Err(SpecError::RelativeCwd(cwd.to_path_buf()));
    }
    let name = argv
        .first()
        .map(|a| file_name(a))
        .unwrap_or_else(|| "allocation".into());
    let mut spec = finish_spec(args, Program::Command { argv }, name, env, cwd)?;
    spec.launch = crate::model::Launch::Allocation;
    Ok(spec)
}

/// The common end of `build_spec` and `build_batch_spec`: defaults, the
/// environment, placement and the checks, on flags already merged.
fn finish_spec(
    merged: &SubmitArgs,
    program: Program,
    default_name: String,
    env: &[(String, String)],
    cwd: &Path,
) -> Result<JobSpec, SpecError> {
    let name = merged.job_name.clone().unwrap_or(default_name);
    for (flag, pattern) in [("--output", &merged.output), ("--error", &merged.error)] {
        if let Some(p) = pattern {
            values::parse_output_pattern(p)
                .map_err(|source| SpecError::Pattern { flag, source })?;
        }
    }
    let workdir = match &merged.chdir {
        Some(dir) => cwd.join(dir),
        None => cwd.to_path_buf(),
    };
    let workdir = workdir
        .to_str()
        .ok_or_else(|| SpecError::WorkdirNotUtf8(workdir.clone()))?
        .to_string();
    let export = merged.export.clone().unwrap_or_default();
    let (nodes, gpus_per_node, total_gpus, placement) = placement::resolve(merged)?;

    let mut spec = JobSpec {
        qos: merged.qos.clone(),
        nice: merged.nice.unwrap_or(0),
        name,
        nodes,
        ntasks_per_node: merged.ntasks_per_node.unwrap_or(1),
        gpus_per_node,
        cpus_per_task: merged.cpus_per_task.unwrap_or(1),
        mem_per_node_mb: merged.mem,
        time_limit_secs: merged.time.and_then(|t| t.0),
        account: merged.account.clone(),
        partition: merged.partition.clone(),
        output: merged.output.clone(),
        error: merged.error.clone(),
        workdir,
        env: values::export_env(&export, env),
        export: export.mode,
        requeue: match (merged.requeue, merged.no_requeue) {
            (true, _) => RequeuePolicy::Always,
            (_, true) => RequeuePolicy::Never,
            _ => RequeuePolicy::OnNodeFailure,
        },
        max_restarts: merged.max_restarts.unwrap_or(3),
        program,
        total_gpus,
        placement,
        queue: crate::model::QueueSpec {
            dependency: merged.dependency.clone().map(|d| d.0).unwrap_or_default(),
            begin_time: merged.begin.map(|b| b.resolve(now_ms())),
            hold: merged.hold,
            array: merged.array.clone(),
        },
        signal: merged.signal,
        launch: Default::default(),
        submit_host: None,
        first_step: None,
        exclusive: merged.exclusive,
        container: container::resolve(merged)?,
    };
    if let (Some(sig), Some(limit)) = (&spec.signal, spec.time_limit_secs) {
        if sig.secs_before >= limit {
            return Err(SpecError::Invalid(format!(
                "--signal is sent {}s before the time limit, but the limit is only {limit}s;                  give fewer seconds (--signal SIG@N) or a longer --time",
                sig.secs_before
            )));
        }
    }
    if let Some(c) = &spec.container {
        let pull = c.is_registry().then_some(crate::model::OCI_PULL_FEATURE);
        for f in std::iter::once(crate::model::OCI_FEATURE).chain(pull) {
            if !spec.placement.features.iter().any(|have| have == f) {
                spec.placement.features.push(f.to_string());
            }
        }
    }
    spec.check_invariants().map_err(SpecError::Invalid)?;
    check_word("job name", &spec.name, true)?;
    if let Some(account) = &spec.account {
        check_word("account", account, false)?;
    }
    if let Some(partition) = &spec.partition {
        check_word("partition", partition, false)?;
    }
    if let Some(qos) = &spec.qos {
        check_word("QoS", qos, false)?;
    }
    Ok(spec)
}

/// One directive line, parsed by the submit flags' own grammar.
#[derive(Parser, Debug)]
#[command(
    name = "directive",
    no_binary_name = true,
    disable_help_flag = true,
    disable_version_flag = true
)]
struct DirectiveLine {
    #[command(flatten)]
    args: SubmitArgs,
}

/// Parses a script's directives and merges them in file order.
pub fn parse_directives(script: &str, path: &str) -> Result<SubmitArgs, SpecError> {
    let lines = directives::read_directives(script).map_err(|e| SpecError::Directive {
        path: path.to_string(),
        line: e.line,
        message: e.problem.to_string(),
    })?;
    let mut merged = SubmitArgs::default();
    for directive in lines {
        let fail = |message: String| SpecError::Directive {
            path: path.to_string(),
            line: directive.line,
            message,
        };
        let parsed = DirectiveLine::try_parse_from(&directive.args)
            .map_err(|e| fail(clap_message(&e, directive.prefix)))?
            .args;
        if let Some(first) = parsed.script_or_command.first() {
            return Err(fail(format!(
                "{} takes options only, but {first:?} is not one; quote values with spaces",
                directive.prefix.as_str()
            )));
        }
        if parsed.wrap.is_some() {
            return Err(fail(
                "--wrap cannot be a directive: the script is what runs".into(),
            ));
        }
        merged = merged.overlay(&parsed);
    }
    Ok(merged)
}

/// Turns a clap error about a directive into one line without clap's usage
/// block, with our own "did you mean" for unknown flags.
fn clap_message(err: &clap::Error, prefix: DirectivePrefix) -> String {
    use clap::error::{ContextKind, ContextValue, ErrorKind};
    if err.kind() == ErrorKind::UnknownArgument {
        if let Some(ContextValue::String(arg)) = err.get(ContextKind::InvalidArg) {
            let flag = arg.split('=').next().unwrap_or(arg);
            let command = DirectiveLine::command();
            let longs = command.get_arguments().filter_map(|a| a.get_long());
            let hint = match flag.strip_prefix("--").and_then(|f| crate::suggest::nearest(f, longs)) {
                Some(long) => format!("did you mean --{long}?"),
                None if prefix == DirectivePrefix::Sbatch => {
                    "gpuq does not support this sbatch option; remove the line or disable it as \"# SBATCH\"".into()
                }
                None => "see gpuq submit --help for the options".into(),
            };
            return format!("unknown directive {flag}; {hint}");
        }
    }
    let rendered = err.render().to_string();
    let first = rendered.lines().next().unwrap_or_default();
    first.strip_prefix("error: ").unwrap_or(first).to_string()
}

fn file_name(word: &str) -> String {
    Path::new(word)
        .file_name()
        .map_or_else(|| word.to_string(), |n| n.to_string_lossy().into_owned())
}

/// Names, accounts and partitions appear in tables and file names: refuse
/// empty ones and control characters; an account or partition is one word.
fn check_word(field: &'static str, value: &str, spaces_ok: bool) -> Result<(), SpecError> {
    let problem = if value.trim().is_empty() {
        Some("is empty; give a name")
    } else if value.chars().any(char::is_control) {
        Some("contains control characters; use printable text")
    } else if !spaces_ok && value.chars().any(char::is_whitespace) {
        Some("contains spaces; use one word")
    } else {
        None
    };
    match problem {
        Some(problem) => Err(SpecError::BadValue {
            field,
            value: value.to_string(),
            problem,
        }),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests;
