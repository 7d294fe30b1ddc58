//! sacct's fields: the names `-o` takes, their widths, and each field's
//! value for a job, a folded array line or a step, as Slurm writes it.

use super::format;
use crate::model::acct::{AcctRecord, AcctStep, StepName};
use crate::model::hostlist::compress_hostlist;
use crate::model::{JobState, Millis};

/// Every field: its name as Slurm spells it, its default width, and
/// whether it is left-justified (ids) or right (everything else).
pub const FIELDS: [(&str, usize, bool); 37] = [
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

/// One line of output: a job, pending array tasks folded into one
/// (`12_[3-9%2]`, the first task's record), or one of a job's steps.
#[derive(Clone, Copy)]
pub enum Row<'a> {
    Job(&'a AcctRecord),
    Folded(&'a AcctRecord, &'a str),
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
pub use crate::cli::table::fmt_duration as elapsed;

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
    let (r, step, folded) = match row {
        Row::Job(r) => (r, None, None),
        Row::Folded(r, id) => (r, None, Some(id)),
        Row::Step(r, s) => (r, Some(s), None),
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
        "JobID" => match (step, folded) {
            (Some(s), _) => format!("{}.{}", job_id(r), step_suffix(s)),
            (None, Some(id)) => id.to_string(),
            (None, None) => job_id(r),
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
