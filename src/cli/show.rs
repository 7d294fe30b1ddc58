//! `gpuq show ID`: one job in full, and where each of its node ranks runs.

use crate::model::{format_cpulist, Job, JobState, Program};
use crate::net::proto::RankPlacement;
use crate::spec::memory::format_mem;

use super::table::{fmt_duration, fmt_time, opt_time, Table};
use super::CliError;

pub fn text(j: &Job, placement: &[RankPlacement]) -> String {
    let s = &j.spec;
    let program = match &s.program {
        Program::Script { path, .. } => format!("script {path}"),
        Program::Command { argv } => format!("command {}", argv.join(" ")),
    };
    let mut out = String::new();
    let mut kv = |k: &str, v: String| out.push_str(&format!("{k:>16}: {v}\n"));
    kv("JobId", j.id.to_string());
    if let Some(a) = &j.array {
        kv("ArrayJobId", a.array_job.to_string());
        kv("ArrayTaskId", a.index.to_string());
        if let Some(t) = a.throttle {
            kv("ArrayThrottle", t.to_string());
        }
    }
    kv("Name", s.name.clone());
    kv("User", j.user.clone());
    kv("State", j.state.to_string());
    if let Some(r) = &j.reason {
        kv("Reason", r.clone());
    }
    if j.state == JobState::Pending {
        kv("ExpectedStart", opt_time(j.expected_start));
    }
    if let Some(u) = &j.gpu_use {
        kv(
            "GpuUse",
            format!(
                "{}% utilisation, {}% memory (mean of {} samples)",
                u.mean_util_pct, u.mean_memory_pct, u.samples
            ),
        );
        if u.idle {
            kv(
                "GpuIdle",
                format!("yes: no GPU busy for {}", fmt_duration(u.idle_secs)),
            );
        }
    }
    if j.held {
        kv("Held", "yes (gpuq release to let it start)".into());
    }
    let q = &s.queue;
    if !q.dependency.is_empty() {
        let deps: Vec<String> = q.dependency.iter().map(|d| d.to_string()).collect();
        kv("Dependency", deps.join(","));
    }
    if let Some(b) = q.begin_time {
        kv("BeginTime", fmt_time(b));
    }
    if let Some(sig) = &s.signal {
        kv(
            "Signal",
            format!(
                "{}{}@{}",
                if sig.batch_only { "B:" } else { "" },
                sig.signal,
                sig.secs_before
            ),
        );
    }
    kv("Program", program);
    kv("WorkDir", s.workdir.clone());
    kv(
        "Nodes",
        match s.placement.elastic {
            Some(r) => format!("{} (elastic {r})", s.nodes),
            None => s.nodes.to_string(),
        },
    );
    kv("TasksPerNode", s.ntasks_per_node.to_string());
    kv("GpusPerNode", s.gpus_per_node.to_string());
    if let Some(total) = s.total_gpus {
        kv(
            "GpusTotal",
            format!("{total} (shape chosen by the scheduler)"),
        );
    }
    let p = &s.placement;
    if let Some(t) = &p.gpu_type {
        kv("GpuType", t.clone());
    }
    if let Some(profile) = &p.gpu_slice {
        kv(
            "GpuSlice",
            if crate::model::share::is_shared(profile) {
                "shared (slots of time-shared GPUs, not whole GPUs)".to_string()
            } else {
                format!("{profile} (MIG instances, not whole GPUs)")
            },
        );
    }
    if !p.features.is_empty() {
        kv("Constraint", p.features.join(","));
    }
    if !p.nodelist.is_empty() {
        kv("NodeList", p.nodelist.join(","));
    }
    if !p.exclude.is_empty() {
        kv("Exclude", p.exclude.join(","));
    }
    if let Some(level) = p.topology {
        kv("Topology", level.to_string());
    }
    kv("CpusPerTask", s.cpus_per_task.to_string());
    kv(
        "MemPerNode",
        s.mem_per_node_mb
            .map(|m| format!("{m}M"))
            .unwrap_or_else(|| "default".into()),
    );
    kv(
        "TimeLimit",
        s.time_limit_secs
            .map(fmt_duration)
            .unwrap_or_else(|| "UNLIMITED".into()),
    );
    kv(
        "Account",
        s.account.clone().unwrap_or_else(|| "default".into()),
    );
    kv(
        "Partition",
        s.partition.clone().unwrap_or_else(|| "default".into()),
    );
    kv("QoS", s.qos.clone().unwrap_or_else(|| "normal".into()));
    if s.nice != 0 {
        kv("Nice", s.nice.to_string());
    }
    kv(
        "Output",
        s.output.clone().unwrap_or_else(|| "gpuq-%j.out".into()),
    );
    kv("SubmitTime", fmt_time(j.submit_time));
    kv("StartTime", opt_time(j.start_time));
    kv("EndTime", opt_time(j.end_time));
    kv("Restarts", j.restart_count.to_string());
    if let Some(c) = j.exit_code {
        kv("ExitCode", c.to_string());
    }
    out.push_str(&super::report::preemption_lines(j));
    out.push_str(&super::report::resize_lines(j));
    if !placement.is_empty() {
        let attempt = j.run.as_ref().map_or(0, |r| r.attempt);
        out.push_str(&format!("\nPlacement (attempt {attempt}):\n"));
        out.push_str(&placement_table(placement));
    }
    out
}

/// One row per node rank: its task ranks, node, GPUs (indices, then UUIDs),
/// CPUs, memory and topology domain.
pub fn placement_table(placement: &[RankPlacement]) -> String {
    let mut t = Table::new(&[
        "NODE_RANK",
        "RANKS",
        "NODE",
        "GPUS",
        "CPUS",
        "MEM",
        "TOPOLOGY",
        "GPU_UUIDS",
    ]);
    for p in placement {
        let indices: Vec<u32> = p.gpus.iter().map(|g| g.index).collect();
        let ranks = if p.first_rank == p.last_rank {
            p.first_rank.to_string()
        } else {
            format!("{}-{}", p.first_rank, p.last_rank)
        };
        let dash = |s: String| if s.is_empty() { "-".to_string() } else { s };
        t.row(vec![
            p.node_rank.to_string(),
            ranks,
            p.node.clone(),
            dash(format_cpulist(&indices)),
            if p.cpus.is_empty() {
                format!("{} (no cpuset)", p.cpu_count)
            } else {
                p.cpus.clone()
            },
            format_mem(p.memory_mb),
            dash(p.topology.clone()),
            dash(
                p.gpus
                    .iter()
                    .map(|g| g.uuid.as_str())
                    .collect::<Vec<_>>()
                    .join(","),
            ),
        ]);
    }
    t.render()
}

/// The job as JSON with its per-rank placement added as `placement`.
pub fn json(job: &Job, placement: &[RankPlacement]) -> Result<serde_json::Value, CliError> {
    let mut v = serde_json::to_value(job).map_err(|e| CliError::internal(e.to_string()))?;
    let p = serde_json::to_value(placement).map_err(|e| CliError::internal(e.to_string()))?;
    if let Some(obj) = v.as_object_mut() {
        obj.insert("placement".into(), p);
    }
    Ok(v)
}
