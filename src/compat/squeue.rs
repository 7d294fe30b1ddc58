//! `squeue`: the queue in Slurm's columns and short state codes, from the
//! same `Queue` request as `gpuq queue`, pending array tasks folded as
//! `gpuq queue` folds them (`12_[4-9%2]`).

use std::collections::BTreeSet;
use std::process::ExitCode;

use clap::{ArgAction, FromArgMatches, Parser};

use super::format::{self, Format};
use crate::cli::{call, unexpected, CliError};
use crate::model::hostlist::compress_hostlist;
use crate::model::{Job, JobState};
use crate::net::proto::{ApiRequest, ApiResponse};

/// Slurm's default squeue format.
pub const DEFAULT_FORMAT: &str = "%.18i %.9P %.8j %.8u %.2t %.10M %.6D %R";

/// The `%` codes squeue fills in.
pub const CODES: &str = "iAjutTMDRPkNlCbaqrVSZoKF";

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
                  %Z work dir, %o command, %K array index, %F array id. %.N right-justifies \
                  in N characters, %N left; longer values are cut."
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
    #[arg(short = 'o', long = "format", value_name = "FORMAT")]
    pub format: Option<String>,
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
const REASONS: [(&str, &str); 14] = [
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
}

/// The lines squeue prints for `jobs`.
pub fn render(
    args: &SqueueArgs,
    states: &[JobState],
    jobs: &[Job],
    now: crate::model::Millis,
) -> Result<String, String> {
    let fmt = Format::parse(args.format.as_deref().unwrap_or(DEFAULT_FORMAT), CODES)?;
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
    for row in crate::cli::queue::rows(&kept) {
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
    } else {
        vec![JobState::Pending, JobState::Running, JobState::Completing]
    };
    Format::parse(args.format.as_deref().unwrap_or(DEFAULT_FORMAT), CODES)
        .map_err(CliError::input)?;
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
    let jobs = match call(ApiRequest::Queue {
        all,
        user,
        states: Vec::new(),
    })
    .await?
    {
        ApiResponse::Jobs { jobs } => jobs,
        other => return Err(unexpected(other)),
    };
    let text = render(&args, &states, &jobs, crate::clock::now_ms()).map_err(CliError::input)?;
    print!("{text}");
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{JobId, JobSpec};

    fn job(id: u64, name: &str, state: JobState) -> Job {
        let spec = JobSpec {
            name: name.into(),
            nodes: 2,
            ntasks_per_node: 4,
            gpus_per_node: 8,
            cpus_per_task: 2,
            mem_per_node_mb: None,
            time_limit_secs: Some(3600),
            account: None,
            partition: Some("gpu".into()),
            output: None,
            error: None,
            workdir: "/home/u".into(),
            env: Vec::new(),
            export: Default::default(),
            program: crate::model::Program::Command {
                argv: vec!["true".into()],
            },
            requeue: Default::default(),
            max_restarts: 3,
            total_gpus: None,
            placement: Default::default(),
            queue: Default::default(),
            signal: None,
            qos: None,
            nice: 0,
            launch: Default::default(),
            submit_host: None,
            first_step: None,
        };
        let mut j = Job::pending(JobId(id), "alice", spec, 0);
        j.state = state;
        j
    }

    fn args(words: &[&str]) -> SqueueArgs {
        SqueueArgs::try_parse_from(words).unwrap()
    }

    #[test]
    fn every_state_has_slurms_code_and_parses_back() {
        let codes: Vec<&str> = JobState::ALL.iter().map(|s| state_code(*s)).collect();
        assert_eq!(
            codes,
            ["PD", "R", "CG", "CD", "F", "CA", "TO", "NF", "PR", "OOM"]
        );
        let words: Vec<String> = codes.iter().map(|c| c.to_lowercase()).collect();
        assert_eq!(parse_states(&words).unwrap(), JobState::ALL.to_vec());
        assert_eq!(
            parse_states(&["running".into()]).unwrap(),
            [JobState::Running]
        );
        assert_eq!(parse_states(&["all".into()]).unwrap().len(), 10);
        let e = parse_states(&["XX".into()]).unwrap_err();
        assert!(e.contains("XX") && e.contains("PD"), "{e}");
    }

    #[test]
    fn default_columns_and_pending_reason() {
        let mut p = job(7, "train", JobState::Pending);
        p.reason = Some("Priority".into());
        let a = args(&[]);
        let text = render(&a, &[JobState::Pending], &[p], 0).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(
            lines[0].split_whitespace().collect::<Vec<_>>(),
            [
                "JOBID",
                "PARTITION",
                "NAME",
                "USER",
                "ST",
                "TIME",
                "NODES",
                "NODELIST(REASON)"
            ]
        );
        assert_eq!(
            lines[1].split_whitespace().collect::<Vec<_>>(),
            [
                "7",
                "gpu",
                "train",
                "alice",
                "PD",
                "0:00",
                "2",
                "(Priority)"
            ]
        );
    }

    #[test]
    fn every_scheduler_reason_has_its_word() {
        use crate::sched::PendingReason as R;
        let all = [
            R::Resources,
            R::Priority,
            R::Unsatisfiable("x".into()),
            R::Dependency,
            R::QuotaExceeded,
            R::Held,
            R::BeginTime,
            R::Topology(crate::model::TopologyRequirement::Leaf),
            R::ReservedForOthers,
            R::DependencyNeverSatisfied("x".into()),
            R::JobArrayTaskLimit,
            R::NoMasterPort,
            R::PartitionDown,
            R::Preempting,
        ];
        for r in all {
            let mut j = job(1, "a", JobState::Pending);
            j.reason = Some(r.to_string());
            let want = match r {
                R::Held => "JobHeldUser",
                _ => r.as_str(),
            };
            assert_eq!(reason(&j), want, "{r}");
        }
    }

    #[test]
    fn format_codes_and_filters() {
        let mut r = job(3, "a", JobState::Running);
        r.start_time = Some(1_000);
        let jobs = vec![r, job(4, "b", JobState::Pending)];
        let a = args(&["-h", "-o", "%i,%t,%T,%j,%D,%l,%C,%b,%M,%k,%A", "-n", "a"]);
        let all = JobState::ALL.to_vec();
        let text = render(&a, &all, &jobs, 66_000).unwrap();
        assert_eq!(
            text,
            "3,R,RUNNING,a,2,1:00:00,16,gres/gpu:8,1:05,(null),3\n"
        );
        let a = args(&["-h", "-o", "%i", "-t", "PD"]);
        let states = parse_states(&a.states).unwrap();
        assert_eq!(render(&a, &states, &jobs, 0).unwrap(), "4\n");
        let a = args(&["-h", "-o", "%i", "-u", "bob"]);
        assert_eq!(render(&a, &all, &jobs, 0).unwrap(), "");
        let a = args(&["-h", "-o", "%i", "-j", "4"]);
        assert_eq!(render(&a, &all, &jobs, 0).unwrap(), "4\n");
    }
}
