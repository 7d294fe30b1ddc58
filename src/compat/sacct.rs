//! `sacct`: jobs and their steps from the accounting records, in Slurm's
//! fields and shapes. One `Acct` request with `active` set brings finished
//! jobs (from memory and the history archive) and the ones still queued or
//! running, each with its batch step (`12.batch`) and job steps (`12.0`);
//! the fields, widths and `-P`/`-p` output are Slurm's, so scripts and
//! tools that parse sacct (submitit, Open OnDemand) read it unchanged.

use std::process::ExitCode;

use clap::{ArgAction, FromArgMatches, Parser};

pub use super::sacct_fields::{
    elapsed, job_id, parse_fields, state_word, value, Field, Row, FIELDS,
};
use crate::cli::acct::parse_when;
use crate::cli::CliError;
use crate::model::acct::{AcctFilter, AcctRecord, StepName};
use crate::model::{JobId, JobState, Millis};

/// Slurm's default fields.
pub const DEFAULT_FIELDS: &str = "JobID,JobName,Partition,Account,AllocCPUS,State,ExitCode";
/// `-b`.
pub const BRIEF_FIELDS: &str = "JobID,State,ExitCode";
/// `-l`: every field gpuq records, in Slurm's long order.
pub const LONG_FIELDS: &str = "JobID,JobIDRaw,JobName,Partition,Account,User,QOS,NNodes,NTasks,\
AllocCPUS,ReqCPUS,ReqMem,ReqTRES,AllocTRES,Submit,Eligible,Start,End,Elapsed,CPUTime,Timelimit,\
State,ExitCode,DerivedExitCode,Reason,NodeList,WorkDir";

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
        ..AcctFilter::default()
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

/// Pending array tasks as sacct folds them: for each record, the id of
/// the line it heads (`12_[3-9%2]`), or `None` when an earlier line holds
/// it. Records are in id order, an array's tasks in a row.
pub fn fold_pending(records: &[AcctRecord]) -> Vec<Option<String>> {
    let mut out = vec![None; records.len()];
    let mut i = 0;
    while i < records.len() {
        let r = &records[i];
        let array = r.detail.array.filter(|_| r.state == JobState::Pending);
        let Some(a) = array else {
            out[i] = Some(job_id(r));
            i += 1;
            continue;
        };
        let mut k = i + 1;
        while k < records.len()
            && records[k].state == JobState::Pending
            && records[k]
                .detail
                .array
                .is_some_and(|b| b.array_job == a.array_job)
        {
            k += 1;
        }
        let indices: Vec<u32> = records[i..k]
            .iter()
            .filter_map(|t| t.detail.array.map(|a| a.index))
            .collect();
        out[i] = Some(if indices.len() == 1 {
            job_id(r)
        } else {
            let throttle = a.throttle.map(|t| format!("%{t}")).unwrap_or_default();
            format!(
                "{}_[{}{throttle}]",
                a.array_job,
                crate::cli::queue::ranges(&indices)
            )
        });
        i = k;
    }
    out
}

/// The rows `q` selects from `records`, jobs in id order, each followed by
/// its steps (unless `-X`); `folded` is [`fold_pending`] of the records.
pub fn rows<'a>(
    q: &Query,
    allocations: bool,
    records: &'a [AcctRecord],
    folded: &'a [Option<String>],
) -> Vec<Row<'a>> {
    let mut out = Vec::new();
    for (r, fold) in records.iter().zip(folded) {
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
        // A task named by its index gets its own line; otherwise a folded
        // array's line is on its first task, none on the others.
        let by_index = picked.iter().any(|j| j.index.is_some());
        if whole {
            match fold {
                Some(id) if !by_index && *id != job_id(r) => out.push(Row::Folded(r, id)),
                Some(_) => out.push(Row::Job(r)),
                None if by_index => out.push(Row::Job(r)),
                None => {}
            }
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
    let records = crate::cli::acct::fetch_records(q.filter.clone()).await?;
    let kept: Vec<AcctRecord> = records
        .into_iter()
        .filter(|r| q.users.is_empty() || q.users.contains(&r.user))
        .collect();
    let folded = fold_pending(&kept);
    let rows = rows(&q, args.allocations, &kept, &folded);
    print!("{}", render(&args, &q.fields, &rows, now));
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
#[path = "tests/sacct.rs"]
mod tests;
