//! ITP trace replay, FIFO+backfill against the full policy: the same slice of
//! the trace, the same fleet size, the same compression, each on a fresh
//! server and fleet configured through `gpuq admin` as an admin would.
//!
//! - `fifo`: every priority weight 0, so the queue is in submit order;
//!   backfill as always (jobs carry time limits, so it can work).
//! - `full`: the built-in multifactor weights (fair-share 10,000, QoS 5,000,
//!   age 1,000, job size 1,000, partition 1,000), with the age horizon and
//!   the fair-share half-life (7 days each) divided by the compression so
//!   they mean in wall time what they mean in trace time; jobs of 32 GPUs or
//!   more ask for a `large` QoS (priority 100). The trace records no users:
//!   with one cluster every job charges one account and fair-share cannot
//!   tell jobs apart; with GPUQ_BENCH_REPLAY_CLUSTER=all each cluster is an
//!   account (both runs get the same accounts and the same QoS; only the
//!   weights differ).
//!
//! Compression: a job's declared runtime is divided by it; its time limit is
//! its compressed runtime plus GPUQ_BENCH_REPLAY_LIMIT_MARGIN_MS (default
//! 500), rounded up to whole wall seconds. The server schedules on events (a
//! pass 2 ms after each applied change, and every second); agents notice an
//! end on their next reconcile, GPUQ_BENCH_REPLAY_RECONCILE_MS (default 20).
//! Both costs are printed in trace seconds beside the job durations.
//! GPUQ_BENCH_REPLAY_POLICIES picks the runs (default `fifo,full`);
//! GPUQ_BENCH_REPLAY_LARGE_QOS=0 drops the large-job QoS.

use std::collections::BTreeSet;
use std::time::Duration;

use gpuq::sim::trace::{shape_for, TraceJob};
use gpuq::sim::workload::{self, ItpReplay};
use serde_json::json;

use crate::{drive_with, env_or};

const WEEK_S: f64 = 7.0 * 24.0 * 3600.0;

fn args(a: &[&str]) -> Vec<String> {
    a.iter().map(|s| s.to_string()).collect()
}

fn whoami() -> String {
    let out = std::process::Command::new("id")
        .arg("-un")
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// The `gpuq admin` commands of each policy, after the `common` ones.
fn setups(compression: f64, common: &[Vec<String>]) -> Vec<(&'static str, Vec<Vec<String>>)> {
    let mut fifo = common.to_vec();
    fifo.push(args(&[
        "admin",
        "priority",
        "set",
        "--age",
        "0",
        "--fairshare",
        "0",
        "--job-size",
        "0",
        "--qos",
        "0",
        "--partition",
        "0",
    ]));
    let horizon = format!("{}s", (WEEK_S / compression).ceil().max(1.0));
    let mut full = common.to_vec();
    full.push(args(&[
        "admin",
        "priority",
        "set",
        "--max-age",
        &horizon,
        "--half-life",
        &horizon,
    ]));
    vec![("fifo", fifo), ("full", full)]
}

fn f(v: &serde_json::Value, k: &str) -> f64 {
    v[k].as_f64().unwrap_or(0.0)
}

/// Replays `jobs` under each policy; returns every run's JSON and the
/// comparison.
pub async fn compare(
    cluster: &str,
    jobs: &[TraceJob],
    nodes: u32,
    compression: f64,
    smoke: bool,
) -> Vec<serde_json::Value> {
    let margin = Duration::from_millis(env_or("GPUQ_BENCH_REPLAY_LIMIT_MARGIN_MS", 500));
    let reconcile_ms: u64 = env_or("GPUQ_BENCH_REPLAY_RECONCILE_MS", 20);
    let large_qos = env_or("GPUQ_BENCH_REPLAY_LARGE_QOS", 1u8) != 0;
    let wanted: Vec<String> = env_or("GPUQ_BENCH_REPLAY_POLICIES", "fifo,full".to_string())
        .split(',')
        .map(|s| s.trim().to_string())
        .collect();
    let how = ItpReplay {
        limit_margin: Some(margin),
        large_qos: large_qos.then(|| "large".to_string()),
        account_per_cluster: cluster == "all",
        ..ItpReplay::plain(compression)
    };
    let items = workload::itp_items_with(jobs, &how);

    // What the slice asks of the fleet, in trace terms.
    let gpus = u64::from(nodes) * 8;
    let first = jobs.iter().map(|j| j.submit_s).min().unwrap_or(0);
    let last = jobs.iter().map(|j| j.submit_s).max().unwrap_or(0);
    let span_s = (last - first).max(1) as f64;
    let held = |j: &TraceJob| {
        let (n, g) = shape_for(j.gpus);
        f64::from(n * g) * j.runtime_s as f64
    };
    let offered = jobs.iter().map(held).sum::<f64>() / (gpus as f64 * span_s);
    let large = jobs.iter().filter(|j| j.gpus >= 32).count();
    let over: Vec<f64> = jobs
        .iter()
        .zip(&items)
        .filter(|(j, _)| j.runtime_s > 0)
        .map(|(j, i)| {
            i.spec.time_limit_secs.unwrap_or(0) as f64 / (j.runtime_s as f64 / compression)
        })
        .collect();
    let over_median = crate::pct(&over, 0.5);
    let runtimes: Vec<f64> = jobs.iter().map(|j| j.runtime_s as f64).collect();
    println!(
        "\n== ITP replay {cluster}: {} jobs over {:.1} trace days ({large} of >= 32 GPUs) on {nodes} \
         nodes x 8 = {gpus} GPUs; offered load {:.0}% ==",
        jobs.len(),
        span_s / 86400.0,
        offered * 100.0
    );
    println!(
        "compression {compression} (1 wall s = {:.0} trace min); runtime p10/p50/p90 {:.0}/{:.0}/{:.0} \
         trace s = {:.2}/{:.2}/{:.2} wall s",
        compression / 60.0,
        crate::pct(&runtimes, 0.1),
        crate::pct(&runtimes, 0.5),
        crate::pct(&runtimes, 0.9),
        crate::pct(&runtimes, 0.1) / compression,
        crate::pct(&runtimes, 0.5) / compression,
        crate::pct(&runtimes, 0.9) / compression,
    );
    println!(
        "scheduler: a pass 2 ms after each applied change and every 1 s; agents reconcile every \
         {reconcile_ms} ms (= {:.0} trace s per end noticed, at worst); time limits: compressed \
         runtime + {} ms, whole wall s (median {over_median:.1}x the runtime)",
        reconcile_ms as f64 * compression / 1e3,
        margin.as_millis(),
    );

    let mut common = Vec::new();
    if large_qos {
        common.push(args(&["admin", "qos", "add", "large", "--priority", "100"]));
    }
    if how.account_per_cluster {
        let user = whoami();
        let clusters: BTreeSet<&str> = jobs.iter().map(|j| j.cluster.as_str()).collect();
        for c in clusters {
            common.push(args(&["admin", "account", "add", c, "--add-user", &user]));
        }
    }
    let comp = compression.to_string();
    let rec = reconcile_ms.to_string();
    let flags = ["--compression", &comp, "--reconcile-ms", &rec];
    let mut runs = Vec::new();
    for (name, setup) in setups(compression, &common) {
        if !wanted.iter().any(|w| w == name) {
            continue;
        }
        let label = format!("itp_replay_{cluster}_{name}");
        let mut v = drive_with(&label, nodes, compression, &flags, &setup, items.clone()).await;
        v["policy"] = json!(name);
        v["offered_load"] = json!(offered);
        v["reconcile_ms"] = json!(reconcile_ms);
        v["limit_margin_ms"] = json!(margin.as_millis() as u64);
        v["limit_over_runtime_median"] = json!(over_median);
        runs.push(v);
    }

    // One table, trace hours (wall ms x compression).
    let h = |ms: f64| ms * compression / 3.6e6;
    let cols = [
        ("queue_delay_mean_ms", "delay mean h"),
        ("queue_delay_p99_ms", "delay p99 h"),
        ("jct_mean_ms", "JCT mean h"),
        ("large_wait_mean_ms", ">=32 wait h"),
        ("large_wait_p99_ms", ">=32 p99 h"),
    ];
    print!(
        "\n{:<12} {:>6} {:>7} {:>7}",
        "policy", "jobs", "util%", "win%"
    );
    for (_, head) in cols {
        print!(" {head:>13}");
    }
    println!(" {:>6} {:>7}", "unfin", "wall s");
    for r in &runs {
        print!(
            "{:<12} {:>6} {:>7.1} {:>7.1}",
            r["policy"].as_str().unwrap_or("?"),
            r["jobs"].as_u64().unwrap_or(0),
            f(r, "gpu_utilisation") * 100.0,
            f(r, "window_utilisation") * 100.0
        );
        for (k, _) in cols {
            print!(" {:>13.2}", h(f(r, k)));
        }
        println!(
            " {:>6} {:>7.0}",
            r["unfinished"].as_u64().unwrap_or(0),
            f(r, "wall_s")
        );
    }
    let mut out = runs.clone();
    let by = |p: &str| runs.iter().find(|r| r["policy"] == p);
    if let (Some(fifo), Some(full)) = (by("fifo"), by("full")) {
        let ratio = |k: &str| {
            let (a, b) = (f(full, k), f(fifo, k));
            if b == 0.0 {
                f64::NAN
            } else {
                a / b
            }
        };
        print!(
            "{:<12} {:>6} {:>7.3} {:>7.3}",
            "full/fifo",
            "",
            ratio("gpu_utilisation"),
            ratio("window_utilisation")
        );
        for (k, _) in cols {
            print!(" {:>13.3}", ratio(k));
        }
        println!();
        let mut cmp = json!({
            "bench": format!("itp_replay_{cluster}_compare"),
            "fleet_nodes": nodes, "compression": compression, "jobs": jobs.len(),
            "offered_load": offered, "large_jobs": large,
            "reconcile_ms": reconcile_ms, "limit_margin_ms": margin.as_millis() as u64,
        });
        for k in ["gpu_utilisation", "window_utilisation"]
            .into_iter()
            .chain(cols.iter().map(|c| c.0))
        {
            cmp[format!("{k}_full_over_fifo")] = json!(ratio(k));
        }
        out.push(cmp);
    }
    println!(
        "(util% over the makespan, win% within the arrival window; delays and JCT in trace hours; \
         ratios full/fifo{})",
        if smoke {
            "; smoke: figures mean nothing"
        } else {
            ""
        }
    );
    out
}
