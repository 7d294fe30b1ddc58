//! Scheduling quality and replay speed in virtual time: the ITP trace through
//! `gpuq sim replay`'s engine (the real scheduler pass and the real state
//! machine, no processes, no sleeping), each policy on the same jobs.
//!
//! 1. Quality: the whole trace (its ten clusters' jobs on one fleet, each
//!    cluster an account, so fair-share has users to weigh) on a fleet
//!    sized so the trace's offered load over its arrival window is
//!    GPUQ_BENCH_REPLAY_LOAD (0.9): about 158 nodes x 8 GPUs. Then its
//!    largest cluster (cluster04, 15,802 jobs, 260 of 32 GPUs or more) alone
//!    at the same load. For each policy (GPUQ_BENCH_REPLAY_POLICIES,
//!    default every built-in): GPU utilisation, mean/p99 wait, mean and
//!    longest wait of jobs of 32 GPUs or more, mean JCT, and ratios
//!    against the first policy.
//! 2. Speed: the whole trace on GPUQ_BENCH_REPLAY_NODES (1,000) nodes under
//!    the first policy: jobs per wall second, passes, the passes' share.
//!
//! Writes target/bench/replay.json. GPUQ_BENCH_TRACE=PATH names another ITP
//! file; GPUQ_BENCH_SMOKE=1 replays 400 jobs of cluster04 on 16 nodes.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use gpuq::sim::replay::engine::{replay, Progress, Shape};
use gpuq::sim::replay::input::{self, ReadOptions};
use gpuq::sim::replay::policy::{ReplayPolicy, BUILT_IN};
use gpuq::sim::replay::report::{self, Summary};
use gpuq::sim::replay::TraceJob;
use serde_json::json;

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn trace_path() -> PathBuf {
    std::env::var_os("GPUQ_BENCH_TRACE")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/traces/itp/itp_all_clusters.csv")
        })
}

fn read(path: &Path, cluster: Option<&str>, limit: Option<usize>) -> Vec<TraceJob> {
    let opts = ReadOptions {
        columns: None,
        limit,
        filter: cluster
            .map(|c| vec![("cluster".to_string(), c.to_string())])
            .unwrap_or_default(),
    };
    match input::read(path, &opts) {
        Ok(t) => t.jobs,
        Err(e) => panic!("cannot read the trace {}: {e}", path.display()),
    }
}

/// Nodes of `gpn` GPUs on which `jobs` offer `load` over their arrival
/// window, and never fewer than the largest job needs.
fn nodes_for(jobs: &[TraceJob], gpn: u32, load: f64) -> u32 {
    let window = jobs.iter().map(|j| j.arrival).max().unwrap_or(0).max(1) as f64;
    let gpu_ms: f64 = jobs
        .iter()
        .map(|j| f64::from(j.gpus) * j.duration as f64)
        .sum();
    let need = (gpu_ms / (window * f64::from(gpn) * load)).ceil() as u32;
    let largest = jobs.iter().map(|j| j.gpus.div_ceil(gpn)).max().unwrap_or(1);
    need.max(largest).max(1)
}

/// One replay: its summary and the wall time it took.
fn run_one(jobs: &[TraceJob], shape: &Shape, policy: &ReplayPolicy) -> (Summary, Duration, f64) {
    let began = Instant::now();
    let mut last = Instant::now();
    let mut pass_time = Duration::ZERO;
    let run = replay(jobs, shape, policy, &mut |p: &Progress| {
        pass_time = p.pass_time;
        if last.elapsed() >= Duration::from_secs(10) {
            last = Instant::now();
            eprintln!(
                "  {}: day {:.1}, {}/{} arrived, {} pending, {} passes",
                policy.name,
                p.now as f64 / 86_400_000.0,
                p.arrived,
                p.jobs,
                p.pending,
                p.passes
            );
        }
    })
    .unwrap_or_else(|e| panic!("replay under {}: {e}", policy.name));
    let wall = began.elapsed();
    let share = pass_time.as_secs_f64() / wall.as_secs_f64().max(1e-9);
    (report::summarize(&run), wall, share)
}

/// Every policy on `jobs`: prints the side-by-side table and returns JSON.
fn study(
    label: &str,
    jobs: &[TraceJob],
    shape: &Shape,
    policies: &[ReplayPolicy],
) -> serde_json::Value {
    let gpus = u64::from(shape.nodes) * u64::from(shape.gpus_per_node);
    println!(
        "\n== {label}: {} jobs ({} of >= 32 GPUs) on {} nodes x {} = {gpus} GPUs ==",
        jobs.len(),
        jobs.iter().filter(|j| j.gpus >= 32).count(),
        shape.nodes,
        shape.gpus_per_node
    );
    let results: Vec<(Summary, Duration, f64)> = std::thread::scope(|s| {
        let hs: Vec<_> = policies
            .iter()
            .map(|p| s.spawn(move || run_one(jobs, shape, p)))
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let summaries: Vec<Summary> = results.iter().map(|r| r.0.clone()).collect();
    print!("{}", report::table(&summaries));
    let first = &summaries[0];
    let mut runs = Vec::new();
    for (s, wall, share) in &results {
        let ratio = |a: f64, b: f64| if b > 0.0 { a / b } else { 0.0 };
        let large = s.by_size.get(">=32").map(|c| c.wait.mean_s).unwrap_or(0.0);
        let large_first = first
            .by_size
            .get(">=32")
            .map(|c| c.wait.mean_s)
            .unwrap_or(0.0);
        println!(
            "{:<14} util {:.1}% | mean wait {:.2} h ({:.2}x) | p99 {:.1} h | >=32 mean {:.2} h ({:.2}x), max {:.1} h | \
             JCT {:.2} h | {:.1} s wall, passes {:.0}%",
            s.policy,
            100.0 * s.gpu_utilisation,
            s.wait.mean_s / 3600.0,
            ratio(s.wait.mean_s, first.wait.mean_s),
            s.wait.p99_s / 3600.0,
            large / 3600.0,
            ratio(large, large_first),
            s.starvation_s / 3600.0,
            s.jct.mean_s / 3600.0,
            wall.as_secs_f64(),
            100.0 * share
        );
        runs.push(json!({
            "policy": s.policy,
            "gpu_utilisation": s.gpu_utilisation,
            "window_utilisation": s.window_utilisation,
            "wait_mean_s": s.wait.mean_s,
            "wait_p50_s": s.wait.p50_s,
            "wait_p99_s": s.wait.p99_s,
            "large_wait_mean_s": large,
            "large_wait_max_s": s.starvation_s,
            "jct_mean_s": s.jct.mean_s,
            "bounded_slowdown_mean": s.bounded_slowdown_mean,
            "never_started": s.never_started,
            "wall_s": wall.as_secs_f64(),
            "pass_share": share,
        }));
    }
    json!({"label": label, "jobs": jobs.len(), "nodes": shape.nodes, "runs": runs})
}

fn main() {
    let smoke = std::env::var_os("GPUQ_BENCH_SMOKE").is_some();
    let path = trace_path();
    if !path.exists() {
        println!(
            "replay bench: no trace at {} (set GPUQ_BENCH_TRACE=PATH to the ITP CSV); nothing measured",
            path.display()
        );
        return;
    }
    let gpn = 8;
    let load: f64 = env_or("GPUQ_BENCH_REPLAY_LOAD", 0.9);
    let names: String = env_or("GPUQ_BENCH_REPLAY_POLICIES", BUILT_IN.join(","));
    let policies: Vec<ReplayPolicy> = names
        .split(',')
        .map(|n| ReplayPolicy::load(n.trim()).unwrap_or_else(|e| panic!("{e}")))
        .collect();
    let mut out = Vec::new();

    let sets: Vec<(String, Vec<TraceJob>)> = if smoke {
        vec![(
            "ITP cluster04, first 400 jobs".into(),
            read(&path, Some("cluster04"), Some(400)),
        )]
    } else {
        vec![
            ("ITP, all clusters".into(), read(&path, None, None)),
            ("ITP cluster04".into(), read(&path, Some("cluster04"), None)),
        ]
    };
    for (label, jobs) in &sets {
        let nodes = if smoke {
            16
        } else {
            nodes_for(jobs, gpn, load)
        };
        let shape = Shape {
            nodes,
            gpus_per_node: gpn,
            topology_leaves: None,
            autoscale: None,
        };
        out.push(study(
            &format!("{label} at load {load}"),
            jobs,
            &shape,
            &policies,
        ));
    }

    // Speed: the whole trace on a large fleet, one policy, one thread.
    // The first set: the whole trace (cluster04's first jobs in a smoke run).
    let jobs = &sets[0].1;
    let nodes = if smoke {
        64
    } else {
        env_or("GPUQ_BENCH_REPLAY_NODES", 1000u32)
    };
    let shape = Shape {
        nodes,
        gpus_per_node: gpn,
        topology_leaves: None,
        autoscale: None,
    };
    let (s, wall, share) = run_one(jobs, &shape, &policies[0]);
    let rate = jobs.len() as f64 / wall.as_secs_f64().max(1e-9);
    println!(
        "\n== speed: {} jobs on {nodes} nodes x {gpn} under {}: {:.1} s wall, {rate:.0} jobs/s, \
         {} passes ({:.0}% of the wall time in passes, {:.2} ms a pass) ==",
        jobs.len(),
        s.policy,
        wall.as_secs_f64(),
        s.passes,
        100.0 * share,
        1e3 * share * wall.as_secs_f64() / (s.passes.max(1) as f64)
    );
    let speed = json!({
        "jobs": jobs.len(), "nodes": nodes, "policy": s.policy,
        "wall_s": wall.as_secs_f64(), "jobs_per_s": rate,
        "passes": s.passes, "pass_share": share,
    });

    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/bench");
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("replay.json");
    std::fs::write(
        &file,
        serde_json::to_string_pretty(&json!({"studies": out, "speed": speed})).unwrap(),
    )
    .unwrap();
    println!("wrote {}", file.display());
}
