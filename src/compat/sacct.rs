//! `sacct`: jobs and their steps from the accounting records, in Slurm's
//! fields and shapes. One `Acct` request with `active` set brings finished
//! jobs (from memory and the history archive) and the ones still queued or
//! running, each with its batch step (`12.batch`) and job steps (`12.0`);
//! the fields, widths and `-P`/`-p` output are Slurm's, so scripts and
//! tools that parse sacct (submitit, Open OnDemand) read it unchanged.

use std::process::ExitCode;

use clap::{ArgAction, FromArgMatches, Parser};

use super::format;
use crate::cli::acct::parse_when;
use crate::cli::{call, unexpected, CliError};
use crate::model::acct::{AcctFilter, AcctRecord, AcctStep, StepName};
use crate::model::hostlist::compress_hostlist;
use crate::model::{JobId, JobState, Millis};
use crate::net::proto::{ApiRequest, ApiResponse};

/// Slurm's default fields.
pub const DEFAULT_FIELDS: &str = "JobID,JobName,Partition,Account,AllocCPUS,State,ExitCode";
/// `-b`.
pub const BRIEF_FIELDS: &str = "JobID,State,ExitCode";
/// `-l`: every field gpuq records, in Slurm's long order.
pub const LONG_FIELDS: &str = "JobID,JobIDRaw,JobName,Partition,Account,User,QOS,NNodes,NTasks,\
AllocCPUS,ReqCPUS,ReqMem,ReqTRES,AllocTRES,Submit,Eligible,Start,End,Elapsed,CPUTime,Timelimit,\
State,ExitCode,DerivedExitCode,Reason,NodeList,WorkDir";

/// Every field: its name as Slurm spells it, its default width, and
/// whether it is left-justified (ids) or right (everything else).
const FIELDS: [(&str, usize, bool); 37] = [
    ("Account", 10, false),
    ("AllocCPUS", 10, false),
    ("AllocNodes", 10, false),
    ("AllocTRES", 10, false),
    ("ArrayJobID", 15, false),
    ("ArrayTaskID", 15, false),
    ("CPUTime", 10, false),
    ("CPUTimeRAW", 10, false),
    ("DerivedExitCode", 15, false),
    ("Elapsed", 10, false),
    ("ElapsedRaw", 10, false),
    ("Eligible", 19, false),
    ("End", 19, false),
    ("ExitCode", 8, false),
    ("JobID", 12, true),
    ("JobIDRaw", 12, true),
    ("JobName", 10, false),
    ("NCPUS", 10, false),
    ("NNodes", 8, false),
    ("NodeList", 15, false),
    ("NTasks", 8, false),
    ("Partition", 10, false),
    ("QOS", 10, false),
    ("Reason", 20, false),
    ("ReqCPUS", 8, false),
    ("ReqMem", 10, false),
    ("ReqNodes", 8, false),
    ("ReqTRES", 10, false),
    ("Restarts", 8, false),
    ("Start", 19, false),
    ("State", 10, false),
    ("Submit", 19, false),
    ("Timelimit", 10, false),
    ("TimelimitRaw", 12, false),
    ("UID", 6, false),
    ("User", 9, false),
    ("WorkDir", 30, false),
];

#[derive(Parser, Debug, Clone, Default)]
#[command(
    name = "sacct",
    no_binary_name = true,
    disable_help_flag = true,
    disable_version_flag = true,
    max_term_width = 100,
    about = "Accounting data of gpuq jobs and their steps, as Slurm's sacct",
    after_help = "Without -j, jobs that ended since midnight (UTC) and every job not yet \
                  ended; without -u or -a, your own jobs (root sees everyone's). Fields \
                  (-e lists them) are case-insensitive; Name%N sets a width. The default \
                  is $SACCT_FORMAT if set, else JobID,JobName,Partition,Account,AllocCPUS,\
                  State,ExitCode."
)]
pub struct SacctArgs {
    /// Only these jobs: 12, 12_3, 12.batch, 12.0 (comma list or repeated)
    #[arg(
        short = 'j',
        long = "jobs",
        value_name = "ID[,...]",
        value_delimiter = ','
    )]
    pub jobs: Vec<String>,
    /// Only these users' jobs (comma list)
    #[arg(
        short = 'u',
        long = "user",
        visible_alias = "uid",
        value_name = "USER[,...]",
        value_delimiter = ','
    )]
    pub users: Vec<String>,
    /// Every user's jobs
    #[arg(short = 'a', long = "allusers")]
    pub all_users: bool,
    /// Only jobs charged to these accounts (comma list)
    #[arg(
        short = 'A',
        long = "accounts",
        value_name = "ACCOUNT[,...]",
        value_delimiter = ','
    )]
    pub accounts: Vec<String>,
    /// Only jobs in these partitions (comma list)
    #[arg(
        short = 'r',
        long = "partition",
        value_name = "PART[,...]",
        value_delimiter = ','
    )]
    pub partitions: Vec<String>,
    /// Only jobs with these names (comma list)
    #[arg(long = "name", value_name = "NAME[,...]", value_delimiter = ',')]
    pub names: Vec<String>,
    /// Only jobs in these states: CA, CD, F, NF, OOM, PD, PR, R, TO (or
    /// their long names)
    #[arg(
        short = 's',
        long = "state",
        value_name = "STATE[,...]",
        value_delimiter = ','
    )]
    pub states: Vec<String>,
    /// Jobs that ended at or after this time: YYYY-MM-DD[THH:MM[:SS]] (UTC),
    /// now, now-2h, now-3days
    #[arg(short = 'S', long = "starttime", value_name = "TIME")]
    pub start: Option<String>,
    /// Jobs submitted at or before this time (same forms)
    #[arg(short = 'E', long = "endtime", value_name = "TIME")]
    pub end: Option<String>,
    /// Fields to show, e.g. JobID,State,NodeList%30 (-e lists them)
    #[arg(short = 'o', long = "format", value_name = "FIELD[%WIDTH][,...]")]
    pub format: Option<String>,
    /// JobID, State and ExitCode only
    #[arg(short = 'b', long = "brief")]
    pub brief: bool,
    /// Every field gpuq records
    #[arg(short = 'l', long = "long")]
    pub long: bool,
    /// Jobs only, not their steps
    #[arg(short = 'X', long = "allocations")]
    pub allocations: bool,
    /// Print no header
    #[arg(short = 'n', long = "noheader")]
    pub noheader: bool,
    /// Fields separated by '|', one after each
    #[arg(short = 'p', long = "parsable")]
    pub parsable: bool,
    /// Fields separated by '|', none after the last
    #[arg(short = 'P', long = "parsable2")]
    pub parsable2: bool,
    /// Accepted for Slurm's sake: values longer than a width are always cut
    #[arg(short = 'T', long = "truncate")]
    pub truncate: bool,
    /// Accepted for Slurm's sake: each job shows its last attempt
    #[arg(short = 'D', long = "duplicates")]
    pub duplicates: bool,
    /// Accepted for Slurm's sake: gpuq is one cluster
    #[arg(short = 'L', long = "allclusters")]
    pub all_clusters: bool,
    /// List the fields -o takes
    #[arg(short = 'e', long = "helpformat")]
    pub helpformat: bool,
    /// Print help
    #[arg(long, action = ArgAction::Help)]
    pub help: Option<bool>,
}

/// One field to print: its name and width.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Field {
    pub name: &'static str,
    pub width: usize,
    pub left: bool,
}

/// Every field name `-o` takes.
fn names() -> impl Iterator<Item = &'static str> {
    FIELDS.iter().map(|f| f.0)
}

/// Parses `-o`: names (any case), each with an optional `%WIDTH`.
pub fn parse_fields(list: &str) -> Result<Vec<Field>, String> {
    let mut out = Vec::new();
    for word in list.split(',').map(str::trim).filter(|w| !w.is_empty()) {
        let (name, width) = match word.split_once('%') {
            Some((n, w)) => {
                let width: i64 = w.parse().map_err(|_| {
                    format!("invalid field width in {word:?}: give a number, e.g. JobName%30")
                })?;
                (n, Some(width))
            }
            None => (word, None),
        };
        let Some(canonical) = names().find(|n| n.eq_ignore_ascii_case(name)) else {
            let hint = crate::suggest::nearest(name, names())
                .map(|n| format!("did you mean {n}? "))
                .unwrap_or_default();
            return Err(format!(
                "invalid field requested: \"{name}\"; {hint}sacct -e lists the fields"
            ));
        };
        let (default, left) = FIELDS
            .iter()
            .find(|f| f.0 == canonical)
            .map_or((10, false), |f| (f.1, f.2));
        out.push(Field {
            name: canonical,
            width: width.map_or(default, |w| w.unsigned_abs() as usize),
            left: width.map_or(left, |w| w < 0),
        });
    }
    if out.is_empty() {
        return Err("no fields given to --format; e.g. -o JobID,State,ExitCode".into());
    }
    Ok(out)
}

/// One line of output: a job, or one of its steps.
#[derive(Clone, Copy)]
pub enum Row<'a> {
    Job(&'a AcctRecord),
    Step(&'a AcctRecord, &'a AcctStep),
}

/// A job's id as Slurm names it: `12`, or `12_3` for an array task.
pub fn job_id(r: &AcctRecord) -> String {
    match r.detail.array {
        Some(a) => format!("{}_{}", a.array_job, a.index),
        None => r.id.to_string(),
    }
}

fn step_suffix(s: &AcctStep) -> String {
    match s.id {
        StepName::Batch => "batch".into(),
        StepName::Step(n) => n.to_string(),
    }
}

/// A duration as sacct writes it: `HH:MM:SS`, or `D-HH:MM:SS`.
pub fn elapsed(secs: u64) -> String {
    let (d, h, m, s) = (
        secs / 86_400,
        secs % 86_400 / 3600,
        secs % 3600 / 60,
        secs % 60,
    );
    if d > 0 {
        format!("{d}-{h:02}:{m:02}:{s:02}")
    } else {
        format!("{h:02}:{m:02}:{s:02}")
    }
}

/// A job's state word: `CANCELLED by UID` when someone cancelled it.
pub fn state_word(r: &AcctRecord) -> String {
    if r.detail.requeueing {
        return "REQUEUED".into();
    }
    match (&r.state, &r.detail.cancelled_by) {
        (JobState::Cancelled, Some(who)) => {
            let uid = nix::unistd::User::from_name(who)
                .ok()
                .flatten()
                .map_or_else(|| who.clone(), |u| u.uid.to_string());
            format!("CANCELLED by {uid}")
        }
        (state, _) => state.as_str().into(),
    }
}

fn tres(cpus: u32, gpus: u32, mem_mb: Option<u64>, nodes: u32) -> String {
    let mut parts = vec![format!("billing={cpus}"), format!("cpu={cpus}")];
    if gpus > 0 {
        parts.push(format!("gres/gpu={gpus}"));
    }
    if let Some(mb) = mem_mb {
        parts.push(format!("mem={}M", mb.saturating_mul(u64::from(nodes))));
    }
    parts.push(format!("node={nodes}"));
    parts.join(",")
}

/// The value of field `name` for `row`, at time `now`.
pub fn value(name: &str, row: Row<'_>, now: Millis) -> String {
    let (r, step) = match row {
        Row::Job(r) => (r, None),
        Row::Step(r, s) => (r, Some(s)),
    };
    let d = &r.detail;
    let (start, end) = match step {
        Some(s) => (Some(s.start_time), s.end_time),
        None => (r.start_time, r.end_time),
    };
    let secs = match start {
        Some(s) => end.unwrap_or(now).saturating_sub(s) / 1000,
        None => 0,
    };
    let started = r.start_time.is_some();
    let alloc_cpus = match step {
        Some(s) => s.cpus,
        None if started => d.cpus,
        None => 0,
    };
    let nodes: Vec<&str> = match step {
        Some(s) => s.nodes.iter().map(String::as_str).collect(),
        None => r.nodes.iter().map(String::as_str).collect(),
    };
    let exit = |code: i32, signal: Option<i32>| format!("{code}:{}", signal.unwrap_or(0));
    match name {
        "Account" => r.account.clone(),
        "AllocCPUS" | "NCPUS" => alloc_cpus.to_string(),
        "AllocNodes" => match step {
            None if !started => "0".into(),
            _ => nodes.len().to_string(),
        },
        "AllocTRES" => match step {
            Some(s) => tres(s.cpus, 0, None, s.nodes.len() as u32),
            None if started => tres(d.cpus, r.gpus, d.mem_per_node_mb, r.nodes.len() as u32),
            None => String::new(),
        },
        "ArrayJobID" => d
            .array
            .map_or_else(|| r.id.to_string(), |a| a.array_job.to_string()),
        "ArrayTaskID" => d.array.map_or_else(String::new, |a| a.index.to_string()),
        "CPUTime" => elapsed(secs * u64::from(alloc_cpus)),
        "CPUTimeRAW" => (secs * u64::from(alloc_cpus)).to_string(),
        "DerivedExitCode" => match step {
            Some(_) => String::new(),
            None => {
                let worst = d.steps.iter().map(|s| s.exit_code).max().unwrap_or(0);
                format!("{}:0", worst.max(r.exit_code.unwrap_or(0).clamp(0, 255)))
            }
        },
        "Elapsed" => elapsed(secs),
        "ElapsedRaw" => secs.to_string(),
        "Eligible" | "Submit" => format::time(Some(step.map_or(r.submit_time, |s| s.start_time))),
        "End" => format::time(end),
        "ExitCode" => match step {
            Some(s) => exit(s.exit_code, s.signal),
            None => exit(r.exit_code.unwrap_or(0).clamp(0, 255), d.signal),
        },
        "JobID" => match step {
            Some(s) => format!("{}.{}", job_id(r), step_suffix(s)),
            None => job_id(r),
        },
        "JobIDRaw" => match step {
            Some(s) => format!("{}.{}", r.id, step_suffix(s)),
            None => r.id.to_string(),
        },
        "JobName" => step.map_or_else(|| r.name.clone(), |s| s.name.clone()),
        "NNodes" => match step {
            Some(s) => s.nodes.len().to_string(),
            None if started => r.nodes.len().to_string(),
            None => d.req_nodes.to_string(),
        },
        "NodeList" if nodes.is_empty() => "None assigned".into(),
        "NodeList" => compress_hostlist(&nodes),
        "NTasks" => step.map_or_else(String::new, |s| s.ntasks.to_string()),
        "Partition" if step.is_none() => d.partition.clone().unwrap_or_else(|| "default".into()),
        "QOS" if step.is_none() => d.qos.clone().unwrap_or_else(|| "normal".into()),
        "Reason" if step.is_none() => d.reason.clone().unwrap_or_else(|| "None".into()),
        "ReqCPUS" => step.map_or(d.cpus, |s| s.cpus).to_string(),
        "ReqMem" if step.is_none() => d
            .mem_per_node_mb
            .map_or_else(|| "0".into(), |m| format!("{m}M")),
        "ReqNodes" if step.is_none() => d.req_nodes.to_string(),
        "ReqTRES" if step.is_none() => tres(d.cpus, d.req_gpus, d.mem_per_node_mb, d.req_nodes),
        "Restarts" if step.is_none() => r.restart_count.to_string(),
        "Start" => format::time(start),
        "State" => match step {
            Some(s) => s.state.as_str().into(),
            None => state_word(r),
        },
        "Timelimit" if step.is_none() => d
            .time_limit_secs
            .map_or_else(|| "UNLIMITED".into(), elapsed),
        "TimelimitRaw" if step.is_none() => d
            .time_limit_secs
            .map_or_else(|| "UNLIMITED".into(), |s| (s / 60).to_string()),
        "User" if step.is_none() => r.user.clone(),
        "UID" if step.is_none() => nix::unistd::User::from_name(&r.user)
            .ok()
            .flatten()
            .map_or_else(String::new, |u| u.uid.to_string()),
        "WorkDir" if step.is_none() => d.workdir.clone(),
        _ => String::new(),
    }
}

/// What `-j` names: a job or array (`12`), one array task (`12_3`), and
/// perhaps one step of it (`12.batch`, `12.0`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JobSel {
    pub id: JobId,
    pub index: Option<u32>,
    pub step: Option<StepName>,
}

/// Parses one `-j` value.
pub fn parse_job(word: &str) -> Result<JobSel, String> {
    let bad = || {
        format!("invalid job id {word:?}: give JOB, JOB_INDEX or JOB.STEP, e.g. 12, 12_3, 12.batch or 12.0")
    };
    let word = word.trim();
    let (job, step) = match word.split_once('.') {
        Some((j, "batch")) => (j, Some(StepName::Batch)),
        Some((j, n)) => (j, Some(StepName::Step(n.parse().map_err(|_| bad())?))),
        None => (word, None),
    };
    let (id, index) = match job.split_once('_') {
        Some((id, index)) => (id, Some(index.parse().map_err(|_| bad())?)),
        None => (job, None),
    };
    Ok(JobSel {
        id: JobId(id.parse().map_err(|_| bad())?),
        index,
        step,
    })
}

impl JobSel {
    /// Whether the job of `r` is one this names.
    fn names_job(&self, r: &AcctRecord) -> bool {
        match (self.index, r.detail.array) {
            (None, _) => r.id == self.id || r.detail.array.is_some_and(|a| a.array_job == self.id),
            (Some(i), Some(a)) => a.array_job == self.id && a.index == i,
            (Some(_), None) => false,
        }
    }
}

/// What to print and for whom, resolved from the flags.
pub struct Query {
    pub fields: Vec<Field>,
    pub jobs: Vec<JobSel>,
    pub users: Vec<String>,
    pub accounts: Vec<String>,
    pub partitions: Vec<String>,
    pub filter: AcctFilter,
}

/// Resolves the flags: `me` is the caller's user name, `root` whether it
/// is root (who sees everyone's jobs by default), `fmt_env` $SACCT_FORMAT.
pub fn query(
    args: &SacctArgs,
    me: Option<&str>,
    root: bool,
    fmt_env: Option<&str>,
    now: Millis,
) -> Result<Query, String> {
    let list = if args.brief {
        BRIEF_FIELDS
    } else if args.long {
        LONG_FIELDS
    } else {
        args.format.as_deref().or(fmt_env).unwrap_or(DEFAULT_FIELDS)
    };
    let fields = parse_fields(list)?;
    let jobs = args
        .jobs
        .iter()
        .filter(|w| !w.trim().is_empty())
        .map(|w| parse_job(w))
        .collect::<Result<Vec<_>, _>>()?;
    let users = if !args.users.is_empty() {
        args.users.clone()
    } else if args.all_users || root {
        Vec::new()
    } else {
        vec![me
            .ok_or("your uid has no user name here; name the user with -u, or all with -a")?
            .to_string()]
    };
    let when = |flag: &str, t: &Option<String>| {
        t.as_deref()
            .map(|t| parse_when(&slurm_time(t)).map_err(|e| format!("{flag}: {e}")))
            .transpose()
    };
    let mut since = when("--starttime", &args.start)?;
    let until = when("--endtime", &args.end)?;
    if since.is_none() && jobs.is_empty() {
        since = Some(now - now % 86_400_000);
    }
    if let (Some(s), Some(u)) = (since, until) {
        if s > u {
            return Err("--starttime is after --endtime; give the earlier time to -S".into());
        }
    }
    let states = super::squeue::parse_states(&args.states)?;
    let one = |v: &[String]| match v {
        [only] => Some(only.clone()),
        _ => None,
    };
    let filter = AcctFilter {
        user: one(&users),
        account: one(&args.accounts),
        states,
        since,
        until,
        ids: jobs.iter().map(|j| j.id).collect(),
        names: args.names.clone(),
        active: true,
    };
    Ok(Query {
        fields,
        jobs,
        users,
        accounts: args.accounts.clone(),
        partitions: args.partitions.clone(),
        filter,
    })
}

/// Slurm's relative times (`now-3days`, `now-2hours`) in the forms
/// `parse_when` reads (`now-3d`).
fn slurm_time(t: &str) -> String {
    let Some(ago) = t.trim().strip_prefix("now-") else {
        return t.to_string();
    };
    let digits = ago.find(|c: char| !c.is_ascii_digit()).unwrap_or(ago.len());
    let (n, unit) = ago.split_at(digits);
    let unit = match unit {
        "days" | "day" => "d",
        "hours" | "hour" => "h",
        "minutes" | "minute" | "min" => "m",
        "seconds" | "second" | "sec" => "s",
        other => other,
    };
    format!("now-{n}{unit}")
}

/// The rows `q` selects from `records`, jobs in id order, each followed by
/// its steps (unless `-X`).
pub fn rows<'a>(q: &Query, allocations: bool, records: &'a [AcctRecord]) -> Vec<Row<'a>> {
    let mut out = Vec::new();
    for r in records {
        let picked: Vec<&JobSel> = q.jobs.iter().filter(|j| j.names_job(r)).collect();
        let wanted = (q.jobs.is_empty() || !picked.is_empty())
            && (q.users.is_empty() || q.users.contains(&r.user))
            && (q.accounts.is_empty() || q.accounts.contains(&r.account))
            && (q.partitions.is_empty()
                || q.partitions
                    .iter()
                    .any(|p| r.detail.partition.as_deref().unwrap_or("default") == p));
        if !wanted {
            continue;
        }
        // `-j 12.0` shows that step alone.
        let only_steps: Vec<StepName> = picked.iter().filter_map(|j| j.step).collect();
        let whole = picked.is_empty() || picked.iter().any(|j| j.step.is_none());
        if whole {
            out.push(Row::Job(r));
        }
        for s in &r.detail.steps {
            if (whole && !allocations) || only_steps.contains(&s.id) {
                out.push(Row::Step(r, s));
            }
        }
    }
    out
}

/// The text sacct prints for `rows`.
pub fn render(args: &SacctArgs, fields: &[Field], rows: &[Row<'_>], now: Millis) -> String {
    let parsable = args.parsable || args.parsable2;
    let line = |cell: &dyn Fn(&Field) -> String| -> String {
        let cells: Vec<String> = fields.iter().map(cell).collect();
        if args.parsable2 {
            cells.join("|")
        } else if args.parsable {
            cells.iter().map(|c| format!("{c}|")).collect()
        } else {
            cells.iter().map(|c| format!("{c} ")).collect()
        }
    };
    let fit = |f: &Field, v: String| -> String {
        if parsable {
            return v;
        }
        let w = f.width;
        let v = if v.chars().count() > w && w > 0 {
            let mut cut: String = v.chars().take(w - 1).collect();
            cut.push('+');
            cut
        } else {
            v
        };
        if f.left {
            format!("{v:<w$}")
        } else {
            format!("{v:>w$}")
        }
    };
    let mut out = String::new();
    if !args.noheader {
        out.push_str(&line(&|f| fit(f, f.name.to_string())));
        out.push('\n');
        if !parsable {
            out.push_str(&line(&|f| "-".repeat(f.width)));
            out.push('\n');
        }
    }
    for row in rows {
        out.push_str(&line(&|f| fit(f, value(f.name, *row, now))));
        out.push('\n');
    }
    out
}

/// `sacct ARGS`.
pub async fn run(args: Vec<String>) -> Result<ExitCode, CliError> {
    let Some(m) = super::parse_with(<SacctArgs as clap::CommandFactory>::command(), &args)? else {
        return Ok(ExitCode::SUCCESS);
    };
    let args =
        SacctArgs::from_arg_matches(&m).map_err(|e| CliError::input(super::clap_line(&e)))?;
    if args.helpformat {
        for chunk in FIELDS.chunks(4) {
            let line: Vec<String> = chunk.iter().map(|f| format!("{:<20}", f.0)).collect();
            println!("{}", line.concat().trim_end());
        }
        return Ok(ExitCode::SUCCESS);
    }
    let uid = nix::unistd::Uid::current();
    let me = nix::unistd::User::from_uid(uid)
        .ok()
        .flatten()
        .map(|u| u.name);
    let env_format = std::env::var("SACCT_FORMAT")
        .ok()
        .filter(|f| !f.trim().is_empty());
    let now = crate::clock::now_ms();
    let q = query(
        &args,
        me.as_deref(),
        uid.is_root(),
        env_format.as_deref(),
        now,
    )
    .map_err(CliError::input)?;
    let records = match call(ApiRequest::Acct {
        filter: q.filter.clone(),
        summary: false,
    })
    .await?
    {
        ApiResponse::Acct { records } => records,
        other => return Err(unexpected(other)),
    };
    let rows = rows(&q, args.allocations, &records);
    print!("{}", render(&args, &q.fields, &rows, now));
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
#[path = "tests/sacct.rs"]
mod tests;
