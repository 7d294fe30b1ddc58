//! `scontrol`: `show hostnames [LIST]` (from `$SLURM_JOB_NODELIST`, else a
//! gpuq job's `$GPUQ_NODELIST`, when no list is given), `show job|node|
//! partition [NAME]` in Slurm's key=value form, `update`, `hold`,
//! `release`, `requeue`. scontrol's grammar is words, not flags, so it is
//! read by hand; `scontrol_update.rs` holds update and the node and
//! partition views.

use std::process::ExitCode;

use super::format;
use crate::cli::queue::fetch_jobs;
use crate::cli::{call, unexpected, CliError};
use crate::model::hostlist::compress_hostlist;
use crate::model::{expand_hostlist, Job, JobRef, JobState};
use crate::net::proto::{ApiRequest, ApiResponse};

const HELP: &str = "\
scontrol, as gpuq speaks it

Usage: scontrol [-o|--oneliner] COMMAND [ARGS]

Commands:
  show hostnames [LIST]  one node name per line (LIST default: $SLURM_JOB_NODELIST,
                         else $GPUQ_NODELIST)
  show job [ID]          a job (12, 12_3), or every job, as key=value
  hold ID...             keep pending jobs from starting
  release ID...          let held jobs start
  requeue ID...          send running jobs back to the queue, same ids
  requeuehold ID...      the same, held (release them to run)
  show node [NAME]       a node, or every node, as key=value
  show partition [NAME]  a partition, or every one
  update JobId=ID[,ID] KEY=VALUE...
                         change TimeLimit (or +N/-N more or less; owners
                         lower it, admins also raise it, while it runs too),
                         JobName, Nice (negative: admins),
                         and while pending Partition, QOS, Account
  update NodeName=NODE State=DRAIN Reason=TEXT | State=RESUME   (admins)

Options:
  -o, --oneliner         show each job on one line
  -h, --help             print this help
";

/// `scontrol ARGS`.
pub async fn run(args: Vec<String>) -> Result<ExitCode, CliError> {
    let mut oneliner = false;
    let mut words = Vec::new();
    for a in args {
        match a.as_str() {
            "-h" | "--help" => {
                print!("{HELP}");
                return Ok(ExitCode::SUCCESS);
            }
            "-o" | "--oneliner" => oneliner = true,
            // Details and quiet change nothing in what gpuq prints.
            "-d" | "--details" | "-Q" | "--quiet" => {}
            flag if flag.starts_with('-') && words.is_empty() => {
                return Err(CliError::input(format!(
                    "unrecognized option '{flag}'; see scontrol --help"
                )))
            }
            _ => words.push(a),
        }
    }
    let lower: Vec<String> = words.iter().map(|w| w.to_ascii_lowercase()).collect();
    let lower: Vec<&str> = lower.iter().map(String::as_str).collect();
    match lower.as_slice() {
        [] => Err(CliError::input("no command given; see scontrol --help")),
        ["show", "hostnames" | "hostname", rest @ ..] => {
            let list = match rest {
                // gpuq's jobs carry GPUQ_NODELIST (SLURM_* are not set yet).
                [] => std::env::var("SLURM_JOB_NODELIST")
                    .or_else(|_| std::env::var("GPUQ_NODELIST"))
                    .map_err(|_| {
                        CliError::input(
                            "show hostnames needs a host list (n[1-4]), or $SLURM_JOB_NODELIST \
                             or $GPUQ_NODELIST set (as in a job)",
                        )
                    })?,
                _ => words[2..].join(","),
            };
            for name in hostnames(&list)? {
                println!("{name}");
            }
            Ok(ExitCode::SUCCESS)
        }
        ["show", "job" | "jobs" | "jobid", rest @ ..] => {
            let jobs = match rest {
                [] => fetch_jobs(true, None, Vec::new()).await?,
                [_] => {
                    let r = parse_ref(&words[2])?;
                    match call(ApiRequest::Show {
                        id: r.id,
                        task: r.task,
                    })
                    .await
                    .map_err(|e| CliError {
                        code: e.code,
                        message: format!("Invalid job id specified: {}", e.message),
                    })? {
                        ApiResponse::Job { job, .. } => vec![*job],
                        other => return Err(unexpected(other)),
                    }
                }
                _ => {
                    return Err(CliError::input(
                        "show job takes one job id (12 or 12_3), or none for every job",
                    ))
                }
            };
            if jobs.is_empty() {
                println!("No jobs in the system");
            }
            let now = crate::clock::now_ms();
            let texts: Vec<String> = jobs.iter().map(|j| show_job(j, now, oneliner)).collect();
            print!("{}", texts.join(if oneliner { "" } else { "\n" }));
            Ok(ExitCode::SUCCESS)
        }
        ["show", what @ ("node" | "nodes" | "nodename" | "partition" | "partitions"), rest @ ..] => {
            let name = rest.first().map(|_| words[2].as_str());
            print!(
                "{}",
                show_nodes_or_partitions(what.starts_with("node"), name, oneliner).await?
            );
            Ok(ExitCode::SUCCESS)
        }
        ["show", "reservation" | "reservations" | "res", rest @ ..] => {
            let name = rest.first().map(|_| words[2].as_str());
            let policy = match call(ApiRequest::PolicyShow).await? {
                ApiResponse::Policy { policy, .. } => *policy,
                other => return Err(unexpected(other)),
            };
            let now = crate::clock::now_ms();
            let texts: Vec<String> = (policy.reservations.values())
                .filter(|r| name.is_none_or(|w| w == r.name))
                .map(|r| show_reservation(r, now, oneliner))
                .collect();
            match (texts.is_empty(), name) {
                (true, Some(w)) => {
                    return Err(CliError::input(format!(
                        "Reservation {w} not found; `scontrol show reservation` lists them"
                    )))
                }
                (true, None) => println!("No reservations in the system"),
                _ => print!("{}", texts.join(if oneliner { "" } else { "\n" })),
            }
            Ok(ExitCode::SUCCESS)
        }
        ["show", what, ..] => Err(CliError::input(format!(
            "show {what} is not supported; gpuq's scontrol shows hostnames, job, node, partition \
             and reservation"
        ))),
        ["show"] => Err(CliError::input(
            "show what? give hostnames LIST, job ID, node NAME, partition NAME or reservation",
        )),
        ["update", ..] => {
            let req = super::scontrol_update::parse_update(&words[1..]).map_err(CliError::input)?;
            match call(req).await? {
                ApiResponse::Updated { .. } | ApiResponse::NodeUpdated { .. } => {
                    Ok(ExitCode::SUCCESS)
                }
                other => Err(unexpected(other)),
            }
        }
        [verb @ ("requeue" | "requeuehold"), rest @ ..] => {
            let jobs = parse_refs(verb, rest.is_empty(), &words[1..])?;
            match call(ApiRequest::Requeue {
                jobs,
                hold: *verb == "requeuehold",
            })
            .await?
            {
                ApiResponse::Requeued { .. } => Ok(ExitCode::SUCCESS),
                other => Err(unexpected(other)),
            }
        }
        [verb @ ("hold" | "release" | "uhold"), rest @ ..] => {
            let jobs = parse_refs(verb, rest.is_empty(), &words[1..])?;
            match call(ApiRequest::Hold {
                jobs,
                hold: *verb != "release",
            })
            .await?
            {
                ApiResponse::Held { .. } => Ok(ExitCode::SUCCESS),
                other => Err(unexpected(other)),
            }
        }
        [other, ..] => Err(CliError::input(format!(
            "invalid command: {other}; gpuq's scontrol knows show hostnames|job|node|partition, \
             update, hold, release, requeue, requeuehold (see scontrol --help)"
        ))),
    }
}

/// The job ids after `verb` (`12 13_4`, `12,13`); `none`: there are none.
fn parse_refs(verb: &str, none: bool, words: &[String]) -> Result<Vec<JobRef>, CliError> {
    if none {
        return Err(CliError::input(format!("{verb} needs job ids (12, 12_3)")));
    }
    words
        .iter()
        .flat_map(|w| w.split(','))
        .filter(|w| !w.is_empty())
        .map(parse_ref)
        .collect()
}

fn parse_ref(word: &str) -> Result<JobRef, CliError> {
    JobRef::parse(word.trim())
        .map_err(|e| CliError::input(format!("Invalid job id specified: {e}")))
}

/// The names a host list stands for, in order.
pub fn hostnames(list: &str) -> Result<Vec<String>, CliError> {
    expand_hostlist(list).map_err(|e| CliError::input(e.to_string()))
}

/// A `%`-pattern of `--output` as the job's file name, relative paths
/// under its working directory (rank 0's, for `%t`/`%n`).
fn output_path(job: &Job, pattern: &str) -> String {
    let mut out = String::new();
    let mut chars = pattern.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('j') => out.push_str(&job.id.to_string()),
            Some('x') => out.push_str(&job.spec.name),
            Some('u') => out.push_str(&job.user),
            Some('t' | 'n') => out.push('0'),
            Some(other) => out.push(other),
            None => {}
        }
    }
    if out.starts_with('/') {
        out
    } else {
        format!("{}/{out}", job.spec.workdir.trim_end_matches('/'))
    }
}

/// `name(uid)` as Slurm shows a user, the uid from this host's user table.
fn user_id(user: &str) -> String {
    match nix::unistd::User::from_name(user) {
        Ok(Some(u)) => format!("{user}({})", u.uid),
        _ => format!("{user}(?)"),
    }
}

/// One job in Slurm's `scontrol show job` layout.
pub fn show_job(job: &Job, now: crate::model::Millis, oneliner: bool) -> String {
    let spec = &job.spec;
    let reason = match job.state {
        JobState::Pending => super::squeue::reason(job),
        _ => "None".into(),
    };
    let run_secs = match (job.start_time, job.state) {
        (Some(start), s) if s != JobState::Pending => {
            job.end_time.unwrap_or(now).saturating_sub(start) / 1000
        }
        _ => 0,
    };
    let nodelist = super::squeue::nodelist(job);
    let stdout = output_path(job, spec.output.as_deref().unwrap_or("gpuq-%j.out"));
    let stderr = spec
        .error
        .as_deref()
        .map_or_else(|| stdout.clone(), |p| output_path(job, p));
    let command = match &spec.program {
        crate::model::Program::Script { path, .. } => path.clone(),
        crate::model::Program::Command { argv } => argv.join(" "),
    };
    let mut lines: Vec<Vec<String>> = vec![
        vec![
            format!("JobId={}", job.id),
            format!("JobName={}", spec.name),
        ],
        vec![format!("UserId={}", user_id(&job.user))],
        vec![
            format!("Account={}", spec.account.as_deref().unwrap_or("default")),
            format!("QOS={}", spec.qos.as_deref().unwrap_or("normal")),
        ],
        vec![
            format!("JobState={}", job.state),
            format!("Reason={reason}"),
        ],
        vec![
            format!("Restarts={}", job.restart_count),
            format!("ExitCode={}:0", job.exit_code.unwrap_or(0)),
        ],
        vec![
            format!("RunTime={}", crate::cli::table::fmt_duration(run_secs)),
            format!(
                "TimeLimit={}",
                spec.time_limit_secs
                    .map(crate::cli::table::fmt_duration)
                    .unwrap_or_else(|| "UNLIMITED".into())
            ),
        ],
        vec![
            format!("SubmitTime={}", format::time(Some(job.submit_time))),
            format!("StartTime={}", format::time(job.start_time)),
            format!("EndTime={}", format::time(job.end_time)),
        ],
        vec![format!(
            "Partition={}",
            spec.partition.as_deref().unwrap_or("default")
        )],
        vec![format!(
            "NodeList={}",
            if nodelist.is_empty() {
                "(null)"
            } else {
                &nodelist
            }
        )],
        vec![
            format!("NumNodes={}", spec.nodes),
            format!("NumTasks={}", spec.total_tasks()),
            format!("CPUs/Task={}", spec.cpus_per_task),
        ],
        vec![format!(
            "TRES=cpu={},gres/gpu={}",
            spec.total_tasks() * u64::from(spec.cpus_per_task),
            spec.total_gpus()
        )],
        vec![format!("Command={command}")],
        vec![format!("WorkDir={}", spec.workdir)],
        vec![format!("StdErr={stderr}")],
        vec![format!("StdOut={stdout}")],
    ];
    if let Some(a) = job.array {
        lines[0].push(format!("ArrayJobId={}", a.array_job));
        lines[0].push(format!("ArrayTaskId={}", a.index));
    }
    super::scontrol_update::layout(lines, oneliner)
}

/// `show node [NAME]` or `show partition [NAME]`.
/// One reservation in `scontrol show reservation`'s layout.
pub fn show_reservation(
    r: &crate::model::AdvanceReservation,
    now: crate::model::Millis,
    oneliner: bool,
) -> String {
    let list = |set: &std::collections::BTreeSet<String>| {
        if set.is_empty() {
            "(null)".to_string()
        } else {
            set.iter().cloned().collect::<Vec<_>>().join(",")
        }
    };
    let fields = [
        vec![
            format!("ReservationName={}", r.name),
            format!("StartTime={}", crate::clock::fmt_time(r.start)),
            format!("EndTime={}", crate::clock::fmt_time(r.end)),
            format!(
                "Duration={}",
                crate::model::policy::fmt_secs((r.end - r.start) / 1000)
            ),
        ],
        vec![
            format!("Nodes={}", compress_hostlist(&r.nodes)),
            format!("NodeCnt={}", r.nodes.len()),
            format!("Flags={}", if r.maint { "MAINT" } else { "(null)" }),
        ],
        vec![
            format!("Users={}", list(&r.users)),
            format!("Accounts={}", list(&r.accounts)),
            format!(
                "State={}",
                if r.active(now) { "ACTIVE" } else { "INACTIVE" }
            ),
        ],
    ];
    let lines: Vec<String> = fields.iter().map(|f| f.join(" ")).collect();
    if oneliner {
        format!("{}\n", lines.join(" "))
    } else {
        format!("{}\n", lines.join("\n   "))
    }
}

async fn show_nodes_or_partitions(
    nodes_wanted: bool,
    name: Option<&str>,
    oneliner: bool,
) -> Result<String, CliError> {
    use super::scontrol_update::{show_node, show_partition};
    let (nodes, partitions) = super::sinfo::nodes_and_partitions().await?;
    let mut texts = Vec::new();
    if nodes_wanted {
        for n in nodes.iter().filter(|n| name.is_none_or(|w| w == n.name)) {
            let member_of: Vec<&str> = partitions
                .iter()
                .filter(|p| super::sinfo::members(p, std::slice::from_ref(n)).len() == 1)
                .map(|p| p.name.as_str())
                .collect();
            texts.push(show_node(n, &member_of, oneliner));
        }
        if texts.is_empty() {
            return Err(CliError::input(match name {
                Some(w) => format!("Node {w} not found; `sinfo -N` lists the nodes"),
                None => "no nodes have joined the cluster".into(),
            }));
        }
    } else {
        for p in partitions
            .iter()
            .filter(|p| name.is_none_or(|w| w == p.name))
        {
            texts.push(show_partition(
                p,
                &super::sinfo::members(p, &nodes),
                oneliner,
            ));
        }
        if texts.is_empty() {
            return Err(CliError::input(format!(
                "Partition {} not found; `sinfo` lists the partitions",
                name.unwrap_or("")
            )));
        }
    }
    Ok(texts.join(if oneliner { "" } else { "\n" }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hostnames_expand_in_order() {
        assert_eq!(
            hostnames("n[1-3],gpu7").unwrap(),
            ["n1", "n2", "n3", "gpu7"]
        );
        let e = hostnames("n[1-").unwrap_err();
        assert_eq!(e.code, 1);
    }

    #[test]
    fn show_reservation_has_slurms_keys() {
        let r = crate::model::AdvanceReservation {
            name: "fw".into(),
            nodes: vec!["n1".into(), "n2".into()],
            start: 1_796_083_200_000,
            end: 1_796_083_200_000 + 4 * 3_600_000,
            users: ["alice".to_string()].into(),
            accounts: Default::default(),
            maint: true,
            by: "root".into(),
        };
        let text = show_reservation(&r, 0, false);
        for want in [
            "ReservationName=fw StartTime=2026-12-01T00:00:00 EndTime=2026-12-01T04:00:00 Duration=04:00:00\n",
            "   Nodes=n[1-2] NodeCnt=2 Flags=MAINT\n",
            "   Users=alice Accounts=(null) State=INACTIVE\n",
        ] {
            assert!(text.contains(want), "{want:?} in\n{text}");
        }
        let one = show_reservation(&r, r.start, true);
        assert_eq!(one.lines().count(), 1);
        assert!(one.contains("State=ACTIVE"), "{one}");
    }

    #[test]
    fn show_job_has_slurms_keys() {
        let spec = crate::model::JobSpec {
            output: Some("logs/out-%j-%x.txt".into()),
            ..crate::spec::build_spec(
                &crate::spec::SubmitArgs {
                    job_name: Some("train".into()),
                    script_or_command: vec!["true".into()],
                    ..Default::default()
                },
                &[],
                std::path::Path::new("/work"),
            )
            .unwrap()
        };
        let mut job = Job::pending(crate::model::JobId(42), "nobody-here", spec, 0);
        job.held = true;
        let text = show_job(&job, 0, false);
        for key in [
            "JobId=42 JobName=train",
            "UserId=nobody-here(?)",
            "JobState=PENDING Reason=JobHeldUser",
            "Partition=default",
            "NumNodes=1 NumTasks=1",
            "TimeLimit=UNLIMITED",
            "SubmitTime=1970-01-01T00:00:00 StartTime=Unknown",
            "NodeList=(null)",
            "WorkDir=/work",
            "StdOut=/work/logs/out-42-train.txt",
        ] {
            assert!(text.contains(key), "{key} in\n{text}");
        }
        assert!(text.lines().skip(1).all(|l| l.starts_with("   ")), "{text}");
        assert_eq!(show_job(&job, 0, true).lines().count(), 1);
    }
}
