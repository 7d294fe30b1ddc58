//! `squeue`: the queue in Slurm's columns and short state codes, from the
//! same `Queue` request as `gpuq queue`, pending array tasks folded as
//! `gpuq queue` folds them (`12_[4-9%2]`).

use std::collections::BTreeSet;
use std::process::ExitCode;

use clap::{ArgAction, FromArgMatches, Parser};

use super::format::{self, Format};
use crate::cli::queue::fetch_jobs;
use crate::cli::CliError;
use crate::model::hostlist::compress_hostlist;
use crate::model::{Job, JobState};

/// Slurm's default squeue format.
pub const DEFAULT_FORMAT: &str = "%.18i %.9P %.8j %.8u %.2t %.10M %.6D %R";

/// The `%` codes squeue fills in.
pub const CODES: &str = "iAjutTMDRPkNlCbaqrVSZoKFLe";

/// `--start`'s format: pending jobs and when they are expected to start.
pub const START_FORMAT: &str = "%.18i %.9P %.8j %.8u %.2t %.19S %.6D %R";

/// `-O/--Format` field names and the `%` code each is.
const FIELD_NAMES: [(&str, char); 29] = [
    ("jobid", 'i'),
    ("jobarrayid", 'i'),
    ("arrayjobid", 'F'),
    ("arraytaskid", 'K'),
    ("name", 'j'),
    ("username", 'u'),
    ("userid", 'u'),
    ("state", 'T'),
    ("statecompact", 't'),
    ("timeused", 'M'),
    ("numnodes", 'D'),
    ("nodelist", 'N'),
    ("reasonlist", 'R'),
    ("partition", 'P'),
    ("timelimit", 'l'),
    ("timeleft", 'L'),
    ("numcpus", 'C'),
    ("tres-per-node", 'b'),
    ("account", 'a'),
    ("qos", 'q'),
    ("reason", 'r'),
    ("submittime", 'V'),
    ("starttime", 'S'),
    ("endtime", 'e'),
    ("workdir", 'Z'),
    ("command", 'o'),
    ("comment", 'k'),
    ("minmemory", 'm'),
    ("cpus-per-task", 'c'),
];

/// Parses `-O` with squeue's field names.
pub fn parse_field_format(input: &str) -> Result<Format, String> {
    Format::parse_fields(input, &FIELD_NAMES)
}

#[derive(Parser, Debug, Clone, Default)]
#[command(
    name = "squeue",
    no_binary_name = true,
    disable_help_flag = true,
    disable_version_flag = true,
    max_term_width = 100,
    about = "List gpuq's pending and running jobs, as Slurm's squeue",
    after_help = "Format codes: %i job id (12, 12_3, 12_[4-9]), %A job or array id, %j name, \
                  %u user, %t state code, %T state, %M time used, %D nodes, %R nodes or \
                  (reason), %P partition, %k comment, %N nodes, %l time limit, %C CPUs, \
                  %b GPUs, %a account, %q QoS, %r reason, %V submit time, %S start time, \
                  %Z work dir, %o command, %K array index, %F array id, %L time left, %e end \
                  time, %m memory per node, %c CPUs per task. %.N right-justifies in N \
                  characters, %N left; longer values are cut. -O fields: JobID, Name, \
                  UserName, State, StateCompact, TimeUsed, TimeLeft, TimeLimit, NumNodes, \
                  NodeList, ReasonList, Reason, Partition, NumCPUs, tres-per-node, Account, \
                  QOS, SubmitTime, StartTime, EndTime, WorkDir, Command, Comment, ArrayJobID, \
                  ArrayTaskID, MinMemory, cpus-per-task."
)]
pub struct SqueueArgs {
    /// Print no header line
    #[arg(short = 'h', long)]
    pub noheader: bool,
    /// Only these users' jobs (comma list)
    #[arg(
        short = 'u',
        long = "user",
        value_name = "USER[,...]",
        value_delimiter = ','
    )]
    pub users: Vec<String>,
    /// Only your own jobs (as -u with your user name)
    #[arg(long)]
    pub me: bool,
    /// Only these jobs: 12, 12_3 (comma list); shows them in any state
    #[arg(
        short = 'j',
        long = "jobs",
        value_name = "ID[,...]",
        value_delimiter = ','
    )]
    pub jobs: Vec<String>,
    /// Only jobs in these states: PD, R, CG, CD, CA, F, TO, NF, PR, OOM, their
    /// long names, or all
    #[arg(
        short = 't',
        long = "states",
        value_name = "STATE[,...]",
        value_delimiter = ','
    )]
    pub states: Vec<String>,
    /// Only jobs with these names (comma list)
    #[arg(
        short = 'n',
        long = "name",
        value_name = "NAME[,...]",
        value_delimiter = ','
    )]
    pub names: Vec<String>,
    /// Only jobs in these partitions (comma list)
    #[arg(
        short = 'p',
        long = "partition",
        value_name = "PART[,...]",
        value_delimiter = ','
    )]
    pub partitions: Vec<String>,
    /// Output format, e.g. "%.18i %.2t %j" (see below)
    #[arg(
        short = 'o',
        long = "format",
        value_name = "FORMAT",
        conflicts_with = "field_format"
    )]
    pub format: Option<String>,
    /// Output fields, e.g. "JobID:10,Name:30,State,TimeLeft" (20 wide
    /// unless given; :. right-justifies)
    #[arg(short = 'O', long = "Format", value_name = "FIELD[:[.]N][,...]")]
    pub field_format: Option<String>,
    /// Only jobs on these nodes (host list, e.g. n[1-4])
    #[arg(short = 'w', long = "nodelist", value_name = "HOSTLIST")]
    pub nodelist: Option<String>,
    /// One line per array task, pending ones too
    #[arg(short = 'r', long = "array")]
    pub array: bool,
    /// Pending jobs and when the scheduler expects them to start
    #[arg(long = "start")]
    pub start: bool,
    /// Accepted for Slurm's sake: gpuq shows every partition anyway
    #[arg(short = 'a', long = "all")]
    pub all: bool,
    /// Print help
    #[arg(long, action = ArgAction::Help)]
    pub help: Option<bool>,
}

/// Slurm's short code for a state.
pub fn state_code(s: JobState) -> &'static str {
    match s {
        JobState::Pending => "PD",
        JobState::Running => "R",
        JobState::Completing => "CG",
        JobState::Completed => "CD",
        JobState::Cancelled => "CA",
        JobState::Failed => "F",
        JobState::Timeout => "TO",
        JobState::NodeFail => "NF",
        JobState::Preempted => "PR",
        JobState::OutOfMemory => "OOM",
    }
}

/// Parses `-t`: short codes or long names, any case; `all` is every state.
pub fn parse_states(words: &[String]) -> Result<Vec<JobState>, String> {
    let mut out = Vec::new();
    for w in words {
        let up = w.trim().to_ascii_uppercase();
        if up == "ALL" {
            return Ok(JobState::ALL.to_vec());
        }
        let state = JobState::ALL
            .into_iter()
            .find(|s| state_code(*s) == up || s.as_str() == up)
            .ok_or_else(|| {
                let codes: Vec<&str> = JobState::ALL.iter().map(|s| state_code(*s)).collect();
                format!(
                    "invalid job state specified: {w}; use {} (or their long names, or all)",
                    codes.join(", ")
                )
            })?;
        out.push(state);
    }
    Ok(out)
}

/// The header title of a code.
fn title(code: char) -> &'static str {
    match code {
        'i' | 'A' => "JOBID",
        'j' => "NAME",
        'u' => "USER",
        't' => "ST",
        'T' => "STATE",
        'M' => "TIME",
        'D' => "NODES",
        'R' => "NODELIST(REASON)",
        'P' => "PARTITION",
        'k' => "COMMENT",
        'N' => "NODELIST",
        'l' => "TIME_LIMIT",
        'C' => "CPUS",
        'b' => "TRES_PER_NODE",
        'a' => "ACCOUNT",
        'q' => "QOS",
        'r' => "REASON",
        'V' => "SUBMIT_TIME",
        'S' => "START_TIME",
        'Z' => "WORK_DIR",
        'o' => "COMMAND",
        'K' => "ARRAY_TASK_ID",
        'F' => "ARRAY_JOB_ID",
        'L' => "TIME_LEFT",
        'e' => "END_TIME",
        'm' => "MIN_MEMORY",
        'c' => "CPUS_PER_TASK",
        _ => "?",
    }
}

/// The nodes a job runs (or last ran) on, as a host list; empty if none.
pub fn nodelist(job: &Job) -> String {
    match &job.run {
        Some(run) if job.state != JobState::Pending => {
            let names: Vec<&str> = run
                .allocation
                .nodes
                .iter()
                .map(|n| n.node.as_str())
                .collect();
            compress_hostlist(&names)
        }
        _ => String::new(),
    }
}

/// gpuq's pending reasons (the scheduler's sentences, as the API carries
/// them) by their opening words, and the one word squeue shows for each:
/// Slurm's where Slurm has one, else the scheduler's own short name. The
/// tests hold this table to the scheduler's.
const REASONS: [(&str, &str); 18] = [
    ("waiting for resources", "Resources"),
    ("waiting behind a higher-priority job", "Priority"),
    ("cannot run on the nodes that are up", "Unsatisfiable"),
    ("waiting for its dependencies", "Dependency"),
    ("its account is at its quota", "QuotaExceeded"),
    ("held", "JobHeldUser"),
    ("its begin time", "BeginTime"),
    ("waiting for enough free nodes under one", "Topology"),
    ("the free resources are reserved", "ReservedForOthers"),
    (
        "its dependency can never be met",
        "DependencyNeverSatisfied",
    ),
    ("its array runs as many tasks", "JobArrayTaskLimit"),
    ("waiting for a free MASTER_PORT", "MasterPort"),
    ("its partition is down", "PartitionDown"),
    ("waiting for the jobs preempted", "Preempting"),
    ("waiting for its reservation", "Reservation"),
    (
        "the nodes it could use are reserved for maintenance",
        "ReservedForMaintenance",
    ),
    ("the nodes it could use are reserved", "ReservedNodes"),
    ("waiting for nodes of group", "NodesStarting"),
];

/// A pending job's reason as one word, as squeue shows it.
pub fn reason(job: &Job) -> String {
    if job.held {
        return "JobHeldUser".into();
    }
    // The scheduler's own word, from servers that send it.
    if let Some(code) = job.reason_code.as_deref().filter(|c| !c.is_empty()) {
        return match code {
            "Held" => "JobHeldUser".into(),
            other => other.into(),
        };
    }
    // Older servers send the sentence only.
    match job.reason.as_deref() {
        Some(r) if !r.is_empty() => REASONS
            .iter()
            .find(|(opening, _)| r.starts_with(opening))
            .map_or_else(|| r.to_string(), |(_, word)| word.to_string()),
        _ => "None".into(),
    }
}

/// The value of `code` for one row: `id` is the row's (possibly folded) id.
pub fn field(code: char, id: &str, job: &Job, now: crate::model::Millis) -> String {
    let spec = &job.spec;
    match code {
        'i' => id.to_string(),
        'A' | 'F' => job
            .array
            .map_or_else(|| job.id.to_string(), |a| a.array_job.to_string()),
        'K' => job
            .array
            .map_or_else(|| "N/A".into(), |a| a.index.to_string()),
        'j' => spec.name.clone(),
        'u' => job.user.clone(),
        't' if job.is_requeueing() => "RQ".into(),
        't' => state_code(job.state).into(),
        'T' if job.is_requeueing() => "REQUEUED".into(),
        'T' => job.state.as_str().into(),
        'M' => match (job.state, job.start_time) {
            (JobState::Pending, _) | (_, None) => "0:00".into(),
            (_, Some(start)) => {
                let end = job.end_time.unwrap_or(now);
                format::duration(end.saturating_sub(start) / 1000)
            }
        },
        'D' => spec.nodes.to_string(),
        'R' => match job.state {
            JobState::Pending => format!("({})", reason(job)),
            _ => nodelist(job),
        },
        'r' => reason(job),
        'P' => spec.partition.clone().unwrap_or_else(|| "default".into()),
        'k' => "(null)".into(),
        'N' => nodelist(job),
        'l' => format::time_limit(spec.time_limit_secs),
        'C' => (spec.total_tasks() * u64::from(spec.cpus_per_task)).to_string(),
        'b' => match spec.gpus_per_node {
            0 => "N/A".into(),
            n => match &spec.placement.gpu_type {
                Some(t) => format!("gres/gpu:{t}:{n}"),
                None => format!("gres/gpu:{n}"),
            },
        },
        'a' => spec.account.clone().unwrap_or_else(|| "default".into()),
        'q' => spec.qos.clone().unwrap_or_else(|| "normal".into()),
        'V' => format::time(Some(job.submit_time)),
        'S' => format::time(job.start_time.or(job.expected_start)),
        'Z' => spec.workdir.clone(),
        'L' => match (spec.time_limit_secs, job.state, job.start_time) {
            (None, _, _) => "UNLIMITED".into(),
            (Some(limit), JobState::Running | JobState::Completing, Some(start)) => {
                let used = now.saturating_sub(start) / 1000;
                format::duration(limit.saturating_sub(used))
            }
            (Some(limit), _, _) => format::duration(limit),
        },
        'e' => match (job.end_time, job.start_time, spec.time_limit_secs) {
            (Some(end), _, _) => format::time(Some(end)),
            (None, Some(start), Some(limit)) => {
                format::time(Some(start.saturating_add(limit.saturating_mul(1000))))
            }
            _ => "N/A".into(),
        },
        'm' => spec
            .mem_per_node_mb
            .map_or_else(|| "0".into(), |m| format!("{m}M")),
        'c' => spec.cpus_per_task.to_string(),
        'o' => match &spec.program {
            crate::model::Program::Script { path, .. } => path.clone(),
            crate::model::Program::Command { argv } => argv.join(" "),
        },
        _ => String::new(),
    }
}

/// Whether `job` passes the filters of `args` (states already resolved).
fn wanted(args: &SqueueArgs, states: &[JobState], job: &Job) -> bool {
    let named_id = |w: &String| {
        let w = w.trim();
        *w == job.id.to_string()
            || *w == job.display_id()
            || job.array.is_some_and(|a| *w == a.array_job.to_string())
    };
    (args.users.is_empty() || args.users.contains(&job.user))
        && (args.jobs.is_empty() || args.jobs.iter().any(named_id))
        && (args.names.is_empty() || args.names.contains(&job.spec.name))
        && (args.partitions.is_empty()
            || args
                .partitions
                .iter()
                .any(|p| job.spec.partition.as_deref().unwrap_or("default") == p))
        && states.contains(&job.state)
        && args.nodelist.as_deref().is_none_or(|list| {
            let wanted = crate::model::expand_hostlist(list).unwrap_or_default();
            job.state != JobState::Pending
                && job
                    .run
                    .as_ref()
                    .is_some_and(|r| r.allocation.nodes.iter().any(|n| wanted.contains(&n.node)))
        })
}

/// The format `args` ask for: `-O`, `-o`, `--start`'s, or the default.
fn chosen_format(args: &SqueueArgs) -> Result<Format, String> {
    match (&args.field_format, &args.format) {
        (Some(fields), _) => parse_field_format(fields),
        (None, Some(f)) => Format::parse(f, CODES),
        (None, None) if args.start => Format::parse(START_FORMAT, CODES),
        (None, None) => Format::parse(DEFAULT_FORMAT, CODES),
    }
}

/// The lines squeue prints for `jobs`.
pub fn render(
    args: &SqueueArgs,
    states: &[JobState],
    jobs: &[Job],
    now: crate::model::Millis,
) -> Result<String, String> {
    let fmt = chosen_format(args)?;
    let kept: Vec<Job> = jobs
        .iter()
        .filter(|j| wanted(args, states, j))
        .cloned()
        .collect();
    let mut out = String::new();
    if !args.noheader {
        out.push_str(&fmt.header(title));
        out.push('\n');
    }
    let rows = if args.array {
        kept.iter()
            .map(|j| crate::cli::queue::QueueRow {
                id: j.display_id(),
                job: j,
            })
            .collect()
    } else {
        crate::cli::queue::rows(&kept)
    };
    for row in rows {
        out.push_str(&fmt.render(|code| field(code, &row.id, row.job, now)));
        out.push('\n');
    }
    Ok(out)
}

/// `squeue ARGS`.
pub async fn run(args: Vec<String>) -> Result<ExitCode, CliError> {
    let Some(m) = super::parse_with(<SqueueArgs as clap::CommandFactory>::command(), &args)? else {
        return Ok(ExitCode::SUCCESS);
    };
    let mut args =
        SqueueArgs::from_arg_matches(&m).map_err(|e| CliError::input(super::clap_line(&e)))?;
    if args.me {
        let uid = nix::unistd::Uid::current();
        let me = nix::unistd::User::from_uid(uid)
            .ok()
            .flatten()
            .ok_or_else(|| CliError::input(format!("--me: uid {uid} has no user name here")))?;
        args.users.push(me.name);
    }
    for id in &args.jobs {
        crate::model::JobRef::parse(id.trim())
            .map_err(|e| CliError::input(format!("invalid job id {id}: {e}")))?;
    }
    // Slurm's default: jobs not yet ended; named jobs in any state.
    let states = if !args.states.is_empty() {
        parse_states(&args.states).map_err(CliError::input)?
    } else if !args.jobs.is_empty() {
        JobState::ALL.to_vec()
    } else if args.start {
        vec![JobState::Pending]
    } else {
        vec![JobState::Pending, JobState::Running, JobState::Completing]
    };
    chosen_format(&args).map_err(CliError::input)?;
    if let Some(list) = &args.nodelist {
        crate::model::expand_hostlist(list)
            .map_err(|e| CliError::input(format!("-w {list}: {e}")))?;
    }
    let all = states.iter().any(|s| {
        !matches!(
            s,
            JobState::Pending | JobState::Running | JobState::Completing
        )
    });
    let users: BTreeSet<&String> = args.users.iter().collect();
    let user = match users.len() {
        1 => users.first().map(|u| u.to_string()),
        _ => None,
    };
    let jobs = fetch_jobs(all, user, Vec::new()).await?;
    let text = render(&args, &states, &jobs, crate::clock::now_ms()).map_err(CliError::input)?;
    print!("{text}");
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
#[path = "tests/squeue.rs"]
mod tests;
