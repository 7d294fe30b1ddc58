//! `scontrol update` and `scontrol show node|partition`: Slurm's
//! `Key=Value` words onto gpuq's `Update`, `NodeDrain` and `NodeResume`
//! requests, and nodes and partitions in Slurm's key=value layout.

use crate::model::{JobRef, JobUpdate, Partition, PartitionState};
use crate::net::proto::{ApiRequest, NodeInfo};

/// The job fields `update` changes, as Slurm names them.
const JOB_KEYS: &str = "TimeLimit, JobName (Name), Nice, Partition, QOS, Account";

/// Parses `update`'s words into the request they ask for: a job update
/// (`JobId=12[,13] TimeLimit=...`) or a node's drain or resume
/// (`NodeName=n1 State=DRAIN Reason=...`).
pub fn parse_update(words: &[String]) -> Result<ApiRequest, String> {
    let mut pairs = Vec::new();
    for w in words {
        let (k, v) = w.split_once('=').ok_or_else(|| {
            format!("invalid input: {w}; give Key=Value words, e.g. JobId=12 TimeLimit=1:00:00")
        })?;
        pairs.push((k.to_ascii_lowercase(), v.to_string()));
    }
    let take = |key: &str| pairs.iter().find(|(k, _)| k == key).map(|(_, v)| v.clone());
    if let Some(node) = take("nodename") {
        return node_update(&node, &pairs);
    }
    let Some(ids) = take("jobid").or_else(|| take("job")) else {
        return Err("update needs JobId=ID (or NodeName=NODE); see scontrol --help".into());
    };
    let jobs = ids
        .split(',')
        .filter(|w| !w.is_empty())
        .map(|w| JobRef::parse(w.trim()).map_err(|e| format!("Invalid job id specified: {e}")))
        .collect::<Result<Vec<_>, _>>()?;
    if jobs.is_empty() {
        return Err("JobId= names no job; give JobId=12 or JobId=12,13".into());
    }
    let mut change = JobUpdate::default();
    for (k, v) in &pairs {
        match k.as_str() {
            "jobid" | "job" => {}
            "timelimit" => {
                let (sign, amount) = match v.as_bytes().first() {
                    Some(b'+') => (1, &v[1..]),
                    Some(b'-') => (-1, &v[1..]),
                    _ => (0, v.as_str()),
                };
                let limit = crate::spec::time::parse_time(amount)
                    .map_err(|e| format!("TimeLimit={v}: {e}"))?;
                match (sign, limit) {
                    (0, limit) => change.time_limit_secs = Some(limit),
                    (_, None) => {
                        return Err(format!(
                            "TimeLimit={v}: add or take a time (e.g. TimeLimit=+30 for 30 \
                             minutes more), or give TimeLimit=UNLIMITED"
                        ))
                    }
                    (sign, Some(secs)) => {
                        change.time_limit_change_secs =
                            Some(sign * secs.min(i64::MAX as u64) as i64)
                    }
                }
            }
            "jobname" | "name" if !v.trim().is_empty() => change.name = Some(v.clone()),
            "jobname" | "name" => return Err("JobName= is empty; give a name".into()),
            "nice" => {
                let n: i32 = v.parse().map_err(|_| {
                    format!("Nice={v} is not a number; give e.g. Nice=100 (negative: admins)")
                })?;
                change.nice = Some(n);
            }
            "partition" => change.partition = Some(v.clone()),
            "qos" => change.qos = Some(v.clone()),
            "account" => change.account = Some(v.clone()),
            other => {
                return Err(format!(
                    "Update of this parameter is not supported: {other}; gpuq's scontrol \
                     changes {JOB_KEYS}"
                ))
            }
        }
    }
    if change.is_empty() {
        return Err(format!("nothing to change: give one of {JOB_KEYS}"));
    }
    Ok(ApiRequest::Update { jobs, change })
}

/// `NodeName=n1 State=DRAIN|RESUME|IDLE|UNDRAIN Reason=...`.
fn node_update(node: &str, pairs: &[(String, String)]) -> Result<ApiRequest, String> {
    let mut state = None;
    let mut reason = None;
    for (k, v) in pairs {
        match k.as_str() {
            "nodename" => {}
            "state" => state = Some(v.to_ascii_uppercase()),
            "reason" => reason = Some(v.clone()),
            other => {
                return Err(format!(
                    "Update of this node parameter is not supported: {other}; gpuq's scontrol \
                     changes a node's State (DRAIN, RESUME) with a Reason"
                ))
            }
        }
    }
    match state.as_deref() {
        Some("DRAIN") => {
            let reason = reason.filter(|r| !r.trim().is_empty()).ok_or(
                "you must specify a reason when changing a node's state to DRAIN: add Reason=\"...\"",
            )?;
            Ok(ApiRequest::NodeDrain {
                node: node.to_string(),
                reason,
                now: false,
            })
        }
        Some("RESUME" | "IDLE" | "UNDRAIN") => Ok(ApiRequest::NodeResume {
            node: node.to_string(),
        }),
        Some(other) => Err(format!(
            "State={other} is not one gpuq sets; use State=DRAIN Reason=... or State=RESUME"
        )),
        None => Err("give the node a State=DRAIN Reason=... or State=RESUME".into()),
    }
}

/// Lines of `key=value` words laid out as scontrol does: the first line
/// flush, the rest indented three spaces; or all on one line.
pub fn layout(lines: Vec<Vec<String>>, oneliner: bool) -> String {
    if oneliner {
        let words: Vec<String> = lines.into_iter().flatten().collect();
        return format!("{}\n", words.join(" "));
    }
    let mut out = String::new();
    for (i, line) in lines.iter().enumerate() {
        if i > 0 {
            out.push_str("   ");
        }
        out.push_str(&line.join(" "));
        out.push('\n');
    }
    out
}

fn null_if_empty(v: String) -> String {
    if v.is_empty() {
        "(null)".into()
    } else {
        v
    }
}

/// One node in `scontrol show node`'s layout; `partitions` those it is in.
pub fn show_node(n: &NodeInfo, partitions: &[&str], oneliner: bool) -> String {
    let inv = &n.inventory;
    let gpus = inv.gpus.len();
    let whole = inv.gpus_of(None).count();
    let mut gres = match (whole, inv.gpu_model()) {
        (0, _) => "(null)".to_string(),
        (n, Some(model)) if !model.is_empty() => {
            format!("gpu:{}:{n}", model.to_ascii_lowercase().replace(' ', "_"))
        }
        (n, _) => format!("gpu:{n}"),
    };
    // MIG instances as Slurm lists them: one GRES type per profile.
    let slices: Vec<String> = inv
        .slice_counts()
        .iter()
        .map(|(p, n)| format!("gpu:{p}:{n}"))
        .collect();
    if !slices.is_empty() {
        gres = match whole {
            0 => slices.join(","),
            _ => format!("{gres},{}", slices.join(",")),
        };
    }
    let state = super::sinfo::node_state(n).to_ascii_uppercase();
    let state = state.replace("DRNG", "MIXED+DRAIN").replace("MIX", "MIXED");
    let cfg = format!(
        "cpu={},mem={}M,billing={},gres/gpu={gpus}",
        inv.cpus, inv.memory_mb, inv.cpus
    );
    let alloc = if n.running_jobs > 0 {
        format!(
            "cpu={},mem={}M,gres/gpu={}",
            n.cpus_used, n.memory_used_mb, n.gpus_used
        )
    } else {
        String::new()
    };
    let mut lines = vec![
        vec![format!("NodeName={}", n.name)],
        vec![
            format!("CPUAlloc={}", n.cpus_used),
            format!("CPUTot={}", inv.cpus),
        ],
        vec![format!(
            "AvailableFeatures={}",
            null_if_empty(inv.features.join(","))
        )],
        vec![format!("Gres={gres}")],
        vec![
            format!("NodeAddr={}", n.addr),
            format!("NodeHostName={}", n.name),
        ],
        vec![
            format!("RealMemory={}", inv.memory_mb),
            format!("AllocMem={}", n.memory_used_mb),
        ],
        vec![format!("State={state}")],
        vec![format!(
            "Partitions={}",
            null_if_empty(partitions.join(","))
        )],
        vec![format!("CfgTRES={cfg}")],
        vec![format!("AllocTRES={alloc}")],
    ];
    if !inv.topology.is_empty() {
        lines.push(vec![format!("Topology={}", inv.topology)]);
    }
    if let Some(r) = &n.reason {
        // Slurm's form: who set it and when, in brackets.
        let user = n.reason_user.as_deref();
        let when = n
            .reason_since
            .map(|at| format!("@{}", super::format::time(Some(at))))
            .unwrap_or_default();
        lines.push(vec![format!(
            "Reason={} [{}{when}]",
            super::sinfo::shown_reason(r, user),
            user.unwrap_or("gpuq")
        )]);
    }
    layout(lines, oneliner)
}

/// One partition in `scontrol show partition`'s layout, over its `nodes`.
pub fn show_partition(p: &Partition, nodes: &[&NodeInfo], oneliner: bool) -> String {
    let limit = |secs: Option<u64>, none: &str| {
        secs.map(super::format::duration)
            .unwrap_or_else(|| none.to_string())
    };
    let names: Vec<&str> = nodes.iter().map(|n| n.name.as_str()).collect();
    let cpus: u64 = nodes.iter().map(|n| u64::from(n.inventory.cpus)).sum();
    let gpus: usize = nodes.iter().map(|n| n.inventory.gpus.len()).sum();
    let state = match p.state {
        PartitionState::Up => "UP",
        _ => "DOWN",
    };
    layout(
        vec![
            vec![format!("PartitionName={}", p.name)],
            vec![
                "AllowGroups=ALL".into(),
                "AllowAccounts=ALL".into(),
                "AllowQos=ALL".into(),
            ],
            vec![format!("Default={}", if p.default { "YES" } else { "NO" })],
            vec![
                format!("DefaultTime={}", limit(p.default_time_secs, "NONE")),
                format!("MaxTime={}", limit(p.max_time_secs, "UNLIMITED")),
            ],
            vec![format!(
                "Nodes={}",
                null_if_empty(
                    p.nodes
                        .clone()
                        .unwrap_or_else(|| { crate::model::hostlist::compress_hostlist(&names) })
                )
            )],
            vec![
                format!("PriorityJobFactor={}", p.priority),
                format!("State={state}"),
                format!("TotalCPUs={cpus}"),
                format!("TotalNodes={}", nodes.len()),
            ],
            vec![format!(
                "TRES=cpu={cpus},node={},gres/gpu={gpus}",
                nodes.len()
            )],
        ],
        oneliner,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(w: &[&str]) -> Vec<String> {
        w.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn job_updates_parse_to_one_request() {
        let r = parse_update(&words(&[
            "JobId=12,13_2",
            "TimeLimit=1:30:00",
            "jobname=x",
            "Nice=10",
        ]))
        .unwrap();
        let ApiRequest::Update { jobs, change } = r else {
            panic!("{r:?}")
        };
        assert_eq!(jobs.len(), 2);
        assert_eq!(change.time_limit_secs, Some(Some(5400)));
        assert_eq!(change.name.as_deref(), Some("x"));
        assert_eq!(change.nice, Some(10));
        let r = parse_update(&words(&["jobid=7", "TimeLimit=UNLIMITED", "Partition=gpu"])).unwrap();
        let ApiRequest::Update { change, .. } = r else {
            panic!()
        };
        assert_eq!(change.time_limit_secs, Some(None));
        assert!(change.needs_pending());
        // +N / -N: Slurm's minutes (and its other time forms), added or taken.
        let delta = |v: &str| match parse_update(&words(&["JobId=7", v])).unwrap() {
            ApiRequest::Update { change, .. } => {
                (change.time_limit_secs, change.time_limit_change_secs)
            }
            r => panic!("{r:?}"),
        };
        assert_eq!(delta("TimeLimit=+30"), (None, Some(1800)));
        assert_eq!(delta("TimeLimit=-1:00:00"), (None, Some(-3600)));
    }

    #[test]
    fn node_states_become_drain_and_resume() {
        let r = parse_update(&words(&["NodeName=n1", "State=drain", "Reason=bad gpu"])).unwrap();
        assert!(
            matches!(r, ApiRequest::NodeDrain { ref node, ref reason, now: false } if node == "n1" && reason == "bad gpu"),
            "{r:?}"
        );
        let r = parse_update(&words(&["NodeName=n1", "State=RESUME"])).unwrap();
        assert!(matches!(r, ApiRequest::NodeResume { .. }), "{r:?}");
    }

    #[test]
    fn bad_updates_name_the_input_and_the_fix() {
        let e = |w: &[&str]| parse_update(&words(w)).unwrap_err();
        assert!(e(&["TimeLimit=10"]).contains("JobId="));
        assert!(e(&["JobId=x", "TimeLimit=10"]).contains("Invalid job id"));
        let m = e(&["JobId=1", "TimeLimit=soon"]);
        assert!(m.contains("TimeLimit=soon"), "{m}");
        assert!(e(&["JobId=1", "TimeLimit=+UNLIMITED"]).contains("TimeLimit=+30"));
        assert!(e(&["JobId=1", "TimeLimit=+x"]).contains("TimeLimit=+x"));
        let m = e(&["JobId=1", "Features=ib"]);
        assert!(m.contains("features") && m.contains("TimeLimit"), "{m}");
        assert!(e(&["JobId=1"]).contains("nothing to change"));
        assert!(e(&["JobId=1", "Nice=high"]).contains("Nice=high"));
        assert!(e(&["JobId"]).contains("Key=Value"));
        assert!(e(&["NodeName=n1", "State=DRAIN"]).contains("Reason="));
        assert!(e(&["NodeName=n1", "State=FUTURE"]).contains("FUTURE"));
    }
}
