//! Client commands. Each talks to the local daemon's unix socket (which vouches
//! for the caller) and prints a human table, or JSON with `--json`.
//!
//! Exit codes: 0 success; 1 the input was wrong, or names something missing
//! or forbidden; 2 the cluster could not be reached or did not answer; 3 an
//! internal error.

pub(crate) mod acct;
pub mod admin;
pub mod cluster;
mod exec;
mod hold;
pub mod interactive;
mod nodegroup;
mod policy_change;
mod ports;
pub(crate) mod queue;
mod report;
mod reservation;
mod run;
mod service;
pub mod session;
mod show;
pub(crate) mod submit;
pub mod table;
mod token;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Subcommand};

use crate::model::{JobId, JobRef, JobState};
use crate::net::local::LocalClient;
use crate::net::proto::{ApiRequest, ApiResponse, ErrorKind};
use crate::socket_path;
use crate::spec::SubmitArgs;
use table::Table;
pub use token::{TokenCommand, TokenRole};

/// The daemon socket the CLI uses: `GPUQ_SOCKET`; else the system daemon's
/// socket if it exists; else a running `gpuq dev`'s; else the system default.
pub fn socket_path() -> PathBuf {
    if let Some(p) = std::env::var_os("GPUQ_SOCKET") {
        return PathBuf::from(p);
    }
    let system = socket_path::system();
    if system.exists() {
        return system;
    }
    let dev = socket_path::socket_in(&socket_path::dev_dir());
    if dev.exists() {
        return dev;
    }
    system
}

/// A failed command: what to print and how to exit.
#[derive(Debug)]
pub struct CliError {
    pub code: u8,
    pub message: String,
}

impl CliError {
    pub fn input(message: impl Into<String>) -> CliError {
        CliError {
            code: 1,
            message: message.into(),
        }
    }
    pub fn unreachable(message: impl Into<String>) -> CliError {
        CliError {
            code: 2,
            message: message.into(),
        }
    }
    pub fn internal(message: impl Into<String>) -> CliError {
        CliError {
            code: 3,
            message: message.into(),
        }
    }
    pub fn exit(self) -> ExitCode {
        eprintln!("gpuq: {}", self.message);
        ExitCode::from(self.code)
    }
}

impl From<ErrorKind> for u8 {
    fn from(k: ErrorKind) -> u8 {
        match k {
            ErrorKind::BadInput | ErrorKind::NotFound | ErrorKind::Forbidden => 1,
            ErrorKind::Unavailable => 2,
            ErrorKind::Internal => 3,
        }
    }
}

// `--json` for read commands.
#[derive(Args, Debug, Clone, Default)]
pub struct JsonFlag {
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
}

// The client commands.
#[derive(Subcommand, Debug)]
#[command(defer = true)]
pub enum ClientCommand {
    /// Queue a batch job (a script with #GPUQ/#SBATCH directives, or a command),
    /// or many at once with --from.
    Submit {
        #[command(flatten)]
        args: Box<SubmitArgs>,
        /// Submit many jobs in one call, all or none: each line of FILE (- for
        /// stdin) is one job, written as you would after `gpuq submit` (flags,
        /// then a script or command; quote as in a shell). Blank lines and #
        /// comments are skipped; flags given here apply to every line, a
        /// line's own flags win. One bad line submits nothing and names the
        /// line. Prints one id per line (--json: {"ids": [...]}).
        #[arg(long, value_name = "FILE")]
        from: Option<PathBuf>,
        /// Print only the job id.
        #[arg(long)]
        parsable: bool,
        #[command(flatten)]
        json: JsonFlag,
    },
    /// List jobs: pending and running by default.
    Queue {
        /// Include finished jobs.
        #[arg(short, long)]
        all: bool,
        /// Only this user's jobs.
        #[arg(short, long)]
        user: Option<String>,
        /// Only jobs in these states (comma list, e.g. PENDING,RUNNING).
        #[arg(short = 't', long, value_delimiter = ',', value_parser = parse_state)]
        state: Vec<JobState>,
        /// Pending jobs with the time backfill expects them to start (N/A: not known).
        #[arg(long)]
        start: bool,
        /// Pending jobs in priority order with their priority factors.
        #[arg(long)]
        priority: bool,
        #[command(flatten)]
        json: JsonFlag,
    },
    /// Finished jobs with their usage (as Slurm's sacct), from memory and the
    /// on-disk history archive; or totals per account and user (--summary).
    Acct(acct::AcctArgs),
    /// Show one job in full.
    Show {
        /// The job id (12, or an array task: 12_3).
        #[arg(value_parser = hold::parse_job_ref)]
        id: JobRef,
        #[command(flatten)]
        json: JsonFlag,
    },
    /// Cancel jobs (all or none: nothing is cancelled if one id is wrong).
    Cancel {
        /// Job ids: 12 (an array id cancels all its tasks), or 12_3 for one array task.
        #[arg(required = true, value_parser = hold::parse_job_ref)]
        ids: Vec<JobRef>,
    },
    /// Keep pending jobs from starting until `gpuq release` (your own; admins any).
    Hold {
        /// Job ids: 12 (an array id holds all its pending tasks), or 12_3.
        #[arg(required = true, value_parser = hold::parse_job_ref)]
        ids: Vec<JobRef>,
    },
    /// Let held jobs start again.
    Release {
        /// Job ids: 12 (an array id releases all its pending tasks), or 12_3.
        #[arg(required = true, value_parser = hold::parse_job_ref)]
        ids: Vec<JobRef>,
    },
    /// Control-plane members, leader, term and log progress; with a
    /// subcommand, change the membership.
    Cluster {
        #[command(subcommand)]
        cmd: Option<cluster::ClusterCommand>,
        #[command(flatten)]
        json: JsonFlag,
    },
    /// Compute nodes: state, GPUs, CPUs and memory in use (--json adds per-GPU
    /// UUIDs, PCI ids and topology).
    Nodes {
        #[command(flatten)]
        json: JsonFlag,
    },
    /// Drain or resume a compute node (admins).
    Node {
        #[command(subcommand)]
        cmd: NodeCommand,
    },
    /// Print a rank's output, read from its node (no shared filesystem needed).
    Logs {
        /// The job id.
        id: u64,
        /// Which rank's output.
        #[arg(long, default_value_t = 0)]
        rank: u32,
        /// Keep printing new output until the job ends.
        #[arg(short, long)]
        follow: bool,
    },
    /// Run a command as an interactive job: an allocation of what the flags ask
    /// for (those of `gpuq submit`), the command one task on its first node,
    /// its output (a terminal with --pty) here, released when it ends (as
    /// Slurm's `srun --pty`). Exits with the command's status.
    Run {
        #[command(flatten)]
        args: Box<SubmitArgs>,
        /// Run the command on a terminal (a shell, a debugger); this one is
        /// put in raw mode until it ends. Needs a terminal on stdin.
        #[arg(long)]
        pty: bool,
    },
    /// Run a command beside a running job's rank: on its node, in its cgroup,
    /// with its GPUs and environment, as its user (as `srun --overlap
    /// --jobid` or `kubectl exec`; py-spy, nvidia-smi, gdb). The job's owner
    /// and admins only. Exits with the command's status.
    Exec {
        /// The job id.
        id: u64,
        /// Which rank's node and task to join.
        #[arg(long, default_value_t = 0)]
        rank: u32,
        /// Run the command on a terminal (a shell, top, gdb); this one is put
        /// in raw mode until it ends. Needs a terminal on stdin.
        #[arg(short = 't', long)]
        pty: bool,
        /// The command and its arguments (after `--` when they have flags).
        #[arg(required = true, trailing_var_arg = true, allow_hyphen_values = true)]
        command: Vec<String>,
    },
    /// Follow a running task: a step on a terminal (`srun --pty`, `gpuq run`;
    /// an allocation's latest one unless --step names it) shows its output
    /// from the start and takes your keys, Ctrl-] detaching; a task writing
    /// files has its output followed as it comes, as `gpuq logs -f`.
    Attach {
        /// The job id.
        id: u64,
        /// Which rank (of the job, or of the step).
        #[arg(long, default_value_t = 0)]
        rank: u32,
        /// The job step (`sacct` shows them as JOB.STEP).
        #[arg(long)]
        step: Option<u32>,
    },
    /// Long-running replicated services (inference servers, APIs) beside
    /// batch jobs: create, list, show, scale, delete, endpoints.
    Service {
        #[command(subcommand)]
        cmd: service::ServiceCommand,
    },
    /// Create, list and revoke join tokens (admins) and API tokens (users).
    Token {
        #[command(subcommand)]
        cmd: TokenCommand,
    },
    /// Manage accounts, QoS, partitions and priority weights (admins).
    Admin {
        #[command(subcommand)]
        cmd: admin::AdminCommand,
    },
    /// Fair-share: shares, normalised shares, decayed usage and factor per
    /// account and user.
    Share {
        #[command(flatten)]
        json: JsonFlag,
    },
}

// `gpuq node ...`
#[derive(Subcommand, Debug)]
#[command(defer = true)]
pub enum NodeCommand {
    /// Take no new work on NAME; running jobs finish (or, with --now, requeue).
    Drain {
        name: String,
        /// Why, as `gpuq nodes` will show it.
        #[arg(long)]
        reason: String,
        /// Requeue the node's jobs now instead of letting them finish.
        #[arg(long)]
        now: bool,
    },
    /// Let NAME take work again.
    Resume { name: String },
    /// Let a new machine take the name NAME (admins): its next join with a
    /// token and --node-name NAME is admitted; the old machine's certificate
    /// is refused from then on.
    Replace { name: String },
    /// MIG partitioning of a node's GPUs (admins).
    Mig {
        #[command(subcommand)]
        cmd: MigCommand,
    },
    /// Share every whole GPU of NAME between up to N jobs at once
    /// (time-slicing, admins): jobs ask for a slot with --gpus shared:1 or
    /// --gres gpu:shared:1 and are told GPUQ_GPU_SHARED=N. Refused while
    /// jobs hold GPUs on NAME (drain it first) and on MIG-partitioned GPUs.
    Share {
        name: String,
        /// Slots per GPU, 1 to 64.
        #[arg(long, required_unless_present = "off", conflicts_with = "off")]
        slots: Option<u32>,
        /// Stop sharing: whole GPUs again.
        #[arg(long)]
        off: bool,
    },
}

// `gpuq node mig ...`
#[derive(Subcommand, Debug)]
pub enum MigCommand {
    /// Repartition every GPU of NAME: the node drains, its jobs finish (or,
    /// with --now, requeue), the layout is applied, and the node resumes
    /// once its agent reports it; a failure leaves it drained with the
    /// reason (see `gpuq nodes`).
    Set {
        name: String,
        /// The MIG instances of each GPU, e.g. 1g.10gb:7 or
        /// 3g.40gb,2g.20gb,1g.10gb:2 (80 GB H100/H200 profiles: 1g.10gb,
        /// 1g.20gb, 2g.20gb, 3g.40gb, 4g.40gb, 7g.80gb; at most 7 compute
        /// and 8 memory slices a GPU), or `none` for whole GPUs.
        #[arg(long)]
        layout: String,
        /// Requeue the node's jobs now instead of waiting for them to end.
        #[arg(long)]
        now: bool,
    },
}

fn parse_state(s: &str) -> Result<JobState, String> {
    JobState::parse(s).ok_or_else(|| {
        let all: Vec<_> = JobState::ALL.iter().map(|s| s.as_str()).collect();
        format!("unknown state {s:?}; use one of {}", all.join(", "))
    })
}

/// Sends `req` to the daemon; its refusals become a [`CliError`].
pub(crate) async fn call(req: ApiRequest) -> Result<ApiResponse, CliError> {
    match call_answer(req).await? {
        ApiResponse::Error { kind, message, .. } => Err(CliError {
            code: kind.into(),
            message,
        }),
        other => Ok(other),
    }
}

/// Sends `req` to the daemon and returns its answer as it is, a refusal
/// included; only not reaching the daemon is an error.
pub(crate) async fn call_answer(req: ApiRequest) -> Result<ApiResponse, CliError> {
    let path = socket_path();
    let mut client = LocalClient::connect(&path)
        .await
        .map_err(|e| CliError::unreachable(e.to_string()))?;
    client
        .call(&req)
        .await
        .map_err(|e| CliError::unreachable(e.to_string()))
}

pub(crate) fn print_json<T: serde::Serialize>(v: &T) -> Result<(), CliError> {
    let s = serde_json::to_string_pretty(v).map_err(|e| CliError::internal(e.to_string()))?;
    println!("{s}");
    Ok(())
}

pub(crate) fn unexpected(r: ApiResponse) -> CliError {
    CliError::internal(format!("unexpected answer from the daemon: {r:?}"))
}

/// Runs a client command; its exit status.
pub async fn run(cmd: ClientCommand) -> Result<ExitCode, CliError> {
    match cmd {
        ClientCommand::Exec {
            id,
            rank,
            pty,
            command,
        } => exec::exec(JobId(id), rank, pty, command).await,
        ClientCommand::Attach { id, rank, step } => exec::attach(JobId(id), rank, step).await,
        ClientCommand::Run { args, pty } => run::run(&args, pty).await,
        other => run_command(other).await.map(|()| ExitCode::SUCCESS),
    }
}

/// Runs a client command that exits 0 when it succeeds.
async fn run_command(cmd: ClientCommand) -> Result<(), CliError> {
    match cmd {
        ClientCommand::Exec { .. } | ClientCommand::Attach { .. } | ClientCommand::Run { .. } => {
            Err(CliError::internal(
                "an interactive command has its own runner",
            ))
        }
        ClientCommand::Submit {
            args,
            from,
            parsable,
            json,
        } => submit::run(&args, from, parsable, json.json).await,
        ClientCommand::Queue {
            priority: true,
            user,
            json,
            ..
        } => report::queue_priority(user, json.json).await,
        ClientCommand::Queue {
            all,
            user,
            state,
            start,
            json,
            ..
        } => {
            let jobs = queue::fetch_jobs(all, user, state).await?;
            if json.json {
                return print_json(&jobs);
            }
            if start {
                print!("{}", queue::start_table(&jobs));
            } else {
                print!("{}", queue::queue_table(&jobs));
            }
            Ok(())
        }
        ClientCommand::Acct(args) => acct::run(args).await,
        ClientCommand::Show { id, json } => match call(ApiRequest::Show {
            id: id.id,
            task: id.task,
        })
        .await?
        {
            ApiResponse::Job { job, placement } => {
                if json.json {
                    return print_json(&show::json(&job, &placement)?);
                }
                print!("{}", show::text(&job, &placement));
                if job.state == JobState::Pending {
                    if let Some((_, f)) = report::priorities(vec![job.id]).await?.first() {
                        println!("{:>16}: {}", "Priority", report::factors_line(f));
                    }
                }
                Ok(())
            }
            other => Err(unexpected(other)),
        },
        ClientCommand::Hold { ids } => hold::run(ids, true).await,
        ClientCommand::Release { ids } => hold::run(ids, false).await,
        ClientCommand::Cancel { ids } => {
            let (tasks, plain): (Vec<JobRef>, Vec<JobRef>) =
                ids.into_iter().partition(|r| r.task.is_some());
            let ids = plain.into_iter().map(|r| r.id).collect();
            match call(ApiRequest::Cancel { ids, tasks }).await? {
                ApiResponse::Cancelled { ids } => {
                    for id in ids {
                        println!("Cancelled job {id}");
                    }
                    Ok(())
                }
                other => Err(unexpected(other)),
            }
        }
        ClientCommand::Cluster { cmd, json } => cluster::run(cmd, json.json).await,
        ClientCommand::Nodes { json } => match call(ApiRequest::Nodes).await? {
            ApiResponse::Nodes { nodes } => {
                if json.json {
                    return print_json(&nodes);
                }
                print!("{}", nodes_table(&nodes));
                Ok(())
            }
            other => Err(unexpected(other)),
        },
        ClientCommand::Node { cmd } => {
            let (req, verb) = match cmd {
                NodeCommand::Drain { name, reason, now } => (
                    ApiRequest::NodeDrain {
                        node: name,
                        reason,
                        now,
                    },
                    "Drained",
                ),
                NodeCommand::Resume { name } => (ApiRequest::NodeResume { node: name }, "Resumed"),
                NodeCommand::Replace { name } => (
                    ApiRequest::NodeReplace { node: name },
                    "A new machine may now join (with a token and --node-name) as",
                ),
                NodeCommand::Mig {
                    cmd: MigCommand::Set { name, layout, now },
                } => (
                    ApiRequest::NodeMig {
                        node: name,
                        layout,
                        now,
                    },
                    "Repartitioning (drained until the layout is applied; see `gpuq nodes`)",
                ),
                NodeCommand::Share { name, slots, .. } => (
                    ApiRequest::NodeShare { node: name, slots },
                    if slots.is_some() {
                        "Shared the GPUs of"
                    } else {
                        "Stopped sharing the GPUs of"
                    },
                ),
            };
            match call(req).await? {
                ApiResponse::NodeUpdated { node } => {
                    println!("{verb} node {node}");
                    Ok(())
                }
                other => Err(unexpected(other)),
            }
        }
        ClientCommand::Logs { id, rank, follow } => logs(JobId(id), rank, follow).await,
        ClientCommand::Token { cmd } => token::token(cmd).await,
        ClientCommand::Service { cmd } => service::run(cmd).await,
        ClientCommand::Admin { cmd } => admin::run(cmd).await,
        ClientCommand::Share { json } => report::share(json.json).await,
    }
}

pub(crate) async fn logs(id: JobId, rank: u32, follow: bool) -> Result<(), CliError> {
    use std::io::Write;
    let mut offset = 0;
    loop {
        let (data, next, state, missing) = match call(ApiRequest::Logs { id, rank, offset }).await?
        {
            ApiResponse::Logs {
                data,
                next_offset,
                state,
                missing,
            } => (data, next_offset, state, missing),
            other => return Err(unexpected(other)),
        };
        let mut out = std::io::stdout().lock();
        out.write_all(&data)
            .and_then(|_| out.flush())
            .map_err(|e| CliError::internal(format!("cannot write the output: {e}")))?;
        offset = next;
        if !data.is_empty() {
            continue;
        }
        if !follow {
            if missing {
                eprintln!("gpuq: job {id} rank {rank} has no output yet ({state})");
            }
            return Ok(());
        }
        if state.is_final() {
            return Ok(());
        }
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
}

/// GPUs in use of the node's GPU entries; with MIG, what they are:
/// `3/56 (56x 1g.10gb)`, `0/8 (1 whole, 7x 1g.10gb)`.
fn gpus_cell(used: impl std::fmt::Display, inv: &crate::model::NodeInventory) -> String {
    let slices = inv.slice_summary();
    if slices.is_empty() {
        return format!("{used}/{}", inv.gpus.len());
    }
    let whole = inv.gpus_of(None).count();
    let what = if whole > 0 {
        format!("{whole} whole, {slices}")
    } else {
        slices
    };
    format!("{used}/{} ({what})", inv.gpus.len())
}

fn nodes_table(nodes: &[crate::net::proto::NodeInfo]) -> String {
    let mut t = Table::new(&[
        "NODE",
        "STATE",
        "GPU_MODEL",
        "GPUS",
        "CPUS",
        "MEMORY",
        "JOBS",
        "TOPOLOGY",
        "CONTAINERS",
        "REASON",
    ]);
    for n in nodes {
        let inv = &n.inventory;
        let state = if n.connected || n.state != "up" {
            n.state.clone()
        } else {
            "up (not connected)".into()
        };
        t.row(vec![
            n.name.clone(),
            state,
            inv.gpu_model().unwrap_or("-").to_string(),
            gpus_cell(n.gpus_used, inv),
            format!("{}/{}", n.cpus_used, inv.cpus),
            format!(
                "{}/{}",
                crate::spec::memory::format_mem(n.memory_used_mb),
                crate::spec::memory::format_mem(inv.memory_mb)
            ),
            n.running_jobs.to_string(),
            if inv.topology.is_empty() {
                "-".into()
            } else {
                inv.topology.clone()
            },
            crate::model::containers_summary(&inv.features),
            n.reason.clone().unwrap_or_default(),
        ]);
    }
    t.render()
}
