//! Fleet-scale benchmarks on a simulated fleet: a real `gpuq server` process
//! and a `gpuq sim agents` process on loopback. Prints figures; asserts
//! nothing. Run: `cargo bench --bench fleet` (see bench/run.sh).
//!
//! - gang: a 64 x 8-GPU job on an idle fleet of each size in
//!   GPUQ_BENCH_FLEETS (default 64,256,1000), GPUQ_BENCH_RUNS times (default
//!   10): submit -> every rank reported running (the job's `run.started`
//!   holds all 64 ranks; `show` is polled every 2 ms over the socket). Also
//!   the fleet's join time, the idle CPU of both processes (heartbeats) and
//!   their RSS. GPUQ_BENCH_SIM_FLAGS adds flags to `gpuq sim agents` (e.g.
//!   `--reconcile-ms 20`).
//! - replay: GPUQ_BENCH_REPLAY_JOBS jobs (default 2000) of ITP
//!   GPUQ_BENCH_REPLAY_CLUSTER (default cluster04; `all` replays every
//!   cluster, each its own account) at GPUQ_BENCH_REPLAY_COMPRESSION
//!   (default 5000) on GPUQ_BENCH_REPLAY_NODES nodes (default 64: the first
//!   2,000 jobs of cluster04 ask for ~630 GPUs busy on average, so 512 GPUs
//!   is an overload and the queue builds), once under FIFO+backfill and once
//!   under the full policy, then one table of both and their ratios
//!   (benches/fleet/replay.rs has the policies and the other knobs); 0 jobs
//!   skips it.
//! - mix: a synthetic mix (trivial, 1-GPU, 8-GPU, 64x8 gangs) of
//!   GPUQ_BENCH_MIX_JOBS jobs (default 500; 0 skips) arriving at
//!   GPUQ_BENCH_MIX_RATE per second (default 20) on 64 nodes, at
//!   GPUQ_BENCH_MIX_COMPRESSION (default 1000).
//!
//! GPUQ_BENCH_SMOKE=1 shrinks all of it to seconds. Results go to
//! target/bench/fleet.json.

#[path = "../tests/common/mod.rs"]
mod common;
#[path = "fleet/replay.rs"]
mod replay;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use gpuq::model::JobId;
use gpuq::net::local::LocalClient;
use gpuq::net::proto::{ApiRequest, ApiResponse};
use gpuq::sim::report;
use gpuq::sim::workload::{self, DriveOptions, JobClass, Mix};
use serde_json::json;

pub(crate) fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

pub(crate) fn pct(v: &[f64], p: f64) -> f64 {
    report::quantile(v, p)
}

struct Bed {
    _dir: tempfile::TempDir,
    server: common::Server,
    sim: common::SimAgents,
    socket: PathBuf,
    up_s: f64,
}

/// A server and `nodes` simulated agents, every one connected.
fn bed(nodes: u32, extra: &[&str]) -> Bed {
    let dir = tempfile::tempdir().unwrap();
    let server = common::Server::bootstrap(&dir.path().join("server"));
    let token = server.ok(&["token", "create"]).trim().to_string();
    let t0 = Instant::now();
    let mut sim = common::SimAgents::spawn(&server, &dir.path().join("sim"), nodes, &token, extra);
    sim.wait_connected(&server, Duration::from_secs(60 + u64::from(nodes) / 5));
    let up_s = t0.elapsed().as_secs_f64();
    let socket = server.socket.clone();
    Bed {
        _dir: dir,
        server,
        sim,
        socket,
        up_s,
    }
}

async fn call(c: &mut LocalClient, req: ApiRequest) -> ApiResponse {
    match c.call(&req).await {
        Ok(ApiResponse::Error { kind, message, .. }) => panic!("{req:?}: {kind:?} {message}"),
        Ok(r) => r,
        Err(e) => panic!("{req:?}: {e}"),
    }
}

async fn show(c: &mut LocalClient, id: JobId) -> gpuq::model::Job {
    match call(c, ApiRequest::Show { id, task: None }).await {
        ApiResponse::Job { job, .. } => *job,
        other => panic!("{other:?}"),
    }
}

/// One gang start: (ack, scheduled, all ranks running), ms.
async fn gang_once(c: &mut LocalClient, nodes: u32) -> (f64, f64, f64) {
    let spec = workload::sim_spec("gang", nodes, 8, Duration::from_secs(3600), 0);
    let t0 = Instant::now();
    let id = match call(
        c,
        ApiRequest::Submit {
            spec: Box::new(spec),
        },
    )
    .await
    {
        ApiResponse::Submitted { id } => id,
        other => panic!("{other:?}"),
    };
    let ack = t0.elapsed();
    let mut scheduled = None;
    let all = loop {
        let job = show(c, id).await;
        if scheduled.is_none() && job.run.is_some() {
            scheduled = Some(t0.elapsed());
        }
        if job
            .run
            .as_ref()
            .is_some_and(|r| r.started.len() as u32 == nodes)
        {
            break t0.elapsed();
        }
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "gang {id} did not start: {job:?}"
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
    };
    // Back to idle: cancel and wait for every rank to stop.
    call(
        c,
        ApiRequest::Cancel {
            ids: vec![id],
            tasks: vec![],
        },
    )
    .await;
    let t = Instant::now();
    while !show(c, id).await.state.is_final() {
        assert!(
            t.elapsed() < Duration::from_secs(60),
            "gang {id} did not stop"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    (ms(ack), ms(scheduled.unwrap_or(all)), ms(all))
}

async fn gang(fleet: u32, runs: usize, idle_window: Duration) -> serde_json::Value {
    let flags = std::env::var("GPUQ_BENCH_SIM_FLAGS").unwrap_or_default();
    let flags: Vec<&str> = flags.split_whitespace().collect();
    let b = tokio::task::block_in_place(|| bed(fleet, &flags));
    let (spid, gpid) = (b.server.pid().unwrap(), b.sim.pid().unwrap());
    // Idle load: heartbeats and keep-alives only.
    let (s0, g0) = (common::cpu::own_cpu_s(spid), common::cpu::own_cpu_s(gpid));
    tokio::time::sleep(idle_window).await;
    let secs = idle_window.as_secs_f64();
    let idle_server_cpu = (common::cpu::own_cpu_s(spid) - s0) / secs * 100.0;
    let idle_sim_cpu = (common::cpu::own_cpu_s(gpid) - g0) / secs * 100.0;
    let (idle_server_rss, idle_sim_rss) = (common::cpu::rss_mib(spid), common::cpu::rss_mib(gpid));

    let mut c = LocalClient::connect(&b.socket).await.unwrap();
    let (mut acks, mut scheds, mut alls) = (vec![], vec![], vec![]);
    let (mut server_rss, mut sim_rss) = (idle_server_rss, idle_sim_rss);
    for _ in 0..runs {
        let (a, s, all) = gang_once(&mut c, 64).await;
        acks.push(a);
        scheds.push(s);
        alls.push(all);
        server_rss = server_rss.max(common::cpu::rss_mib(spid));
        sim_rss = sim_rss.max(common::cpu::rss_mib(gpid));
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    json!({
        "bench": "gang_start_64x8", "fleet_nodes": fleet, "runs": runs, "sim_flags": flags,
        "fleet_up_s": b.up_s,
        "ack_p50_ms": pct(&acks, 0.5),
        "scheduled_p50_ms": pct(&scheds, 0.5),
        "all_running_p50_ms": pct(&alls, 0.5), "all_running_p99_ms": pct(&alls, 0.99),
        "all_running_ms": alls,
        "server_rss_mb": server_rss, "sim_rss_mb": sim_rss,
        "idle_server_cpu_pct": idle_server_cpu, "idle_sim_cpu_pct": idle_sim_cpu,
        "idle_server_rss_mb": idle_server_rss, "idle_sim_rss_mb": idle_sim_rss,
    })
}

async fn drive_on(
    label: &str,
    nodes: u32,
    compression: f64,
    items: Vec<workload::WorkItem>,
) -> serde_json::Value {
    let comp = compression.to_string();
    drive_with(
        label,
        nodes,
        compression,
        &["--compression", &comp],
        &[],
        items,
    )
    .await
}

/// A fresh server and fleet, configured by the `gpuq admin ...` commands in
/// `setup` (the CLI an admin would use), then `items` driven through it.
pub(crate) async fn drive_with(
    label: &str,
    nodes: u32,
    compression: f64,
    sim_flags: &[&str],
    setup: &[Vec<String>],
    items: Vec<workload::WorkItem>,
) -> serde_json::Value {
    let b = tokio::task::block_in_place(|| bed(nodes, sim_flags));
    for args in setup {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        tokio::task::block_in_place(|| b.server.ok(&args));
    }
    let policy =
        tokio::task::block_in_place(|| b.server.ok(&["admin", "priority", "show", "--json"]));
    let gpus = workload::fleet_gpus(&b.socket).await.unwrap();
    let opts = DriveOptions {
        drain_timeout: Duration::from_secs(env_or("GPUQ_BENCH_DRAIN_S", 900)),
        ..DriveOptions::default()
    };
    let t0 = Instant::now();
    let records = workload::drive(&b.socket, items, &opts).await.unwrap();
    let wall = t0.elapsed().as_secs_f64();
    let report = report::report(&records, gpus, compression);
    println!("\n== {label} ({nodes} nodes, {wall:.1} s) ==\n{report}");
    let spid = b.server.pid().unwrap();
    let mut v = serde_json::to_value(&report).unwrap();
    v["bench"] = json!(label);
    v["fleet_nodes"] = json!(nodes);
    v["wall_s"] = json!(wall);
    v["server_rss_mb"] = json!(common::cpu::rss_mib(spid));
    v["sim_rss_mb"] = json!(common::cpu::rss_mib(b.sim.pid().unwrap()));
    v["priority"] = serde_json::from_str(&policy).unwrap_or(json!(policy));
    v["setup"] = json!(setup);
    v
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let smoke = std::env::var_os("GPUQ_BENCH_SMOKE").is_some();
    let fleets: Vec<u32> = std::env::var("GPUQ_BENCH_FLEETS")
        .unwrap_or_else(|_| if smoke { "64" } else { "64,256,1000" }.into())
        .split(',')
        .filter_map(|s| s.trim().parse().ok())
        .collect();
    let runs = env_or("GPUQ_BENCH_RUNS", if smoke { 3 } else { 10 });
    let idle = Duration::from_secs(if smoke { 1 } else { 5 });
    let mut rows = Vec::new();
    for &fleet in &fleets {
        let row = gang(fleet, runs, idle).await;
        println!("{row}");
        rows.push(row);
    }

    let replay_jobs: usize = env_or("GPUQ_BENCH_REPLAY_JOBS", if smoke { 100 } else { 2000 });
    let mut reports = Vec::new();
    if replay_jobs > 0 {
        let cluster: String = env_or("GPUQ_BENCH_REPLAY_CLUSTER", "cluster04".to_string());
        let compression: f64 = env_or(
            "GPUQ_BENCH_REPLAY_COMPRESSION",
            if smoke { 200_000.0 } else { 5000.0 },
        );
        let nodes: u32 = env_or("GPUQ_BENCH_REPLAY_NODES", if smoke { 16 } else { 64 });
        let trace =
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/traces/itp/itp_all_clusters.csv");
        let trace = std::env::var_os("GPUQ_BENCH_TRACE").map_or(trace, PathBuf::from);
        let only = (cluster != "all").then_some(cluster.as_str());
        match gpuq::sim::trace::read_itp(&trace, only, Some(replay_jobs)) {
            Ok(jobs) => {
                let r = replay::compare(&cluster, &jobs, nodes, compression, smoke).await;
                reports.extend(r);
            }
            Err(e) => eprintln!("replay skipped: {e}"),
        }
    }
    let mix_jobs: usize = env_or("GPUQ_BENCH_MIX_JOBS", if smoke { 40 } else { 500 });
    if mix_jobs > 0 {
        let s = Duration::from_secs;
        let mix = Mix {
            weights: vec![
                (JobClass::Trivial, 40, Duration::ZERO),
                (JobClass::OneGpu, 40, s(600)),
                (JobClass::EightGpu, 18, s(1800)),
                (JobClass::Gang64x8, 2, s(1800)),
            ],
            rate_per_s: env_or("GPUQ_BENCH_MIX_RATE", 20.0),
        };
        let items = workload::synthetic(&mix, mix_jobs, 1);
        let compression = env_or(
            "GPUQ_BENCH_MIX_COMPRESSION",
            if smoke { 20_000.0 } else { 1000.0 },
        );
        reports.push(drive_on("synthetic_mix", 64, compression, items).await);
    }

    println!(
        "\n{:<16} {:>6} {:>5} {:>8} {:>8} {:>9} {:>9} {:>9} {:>9} {:>8} {:>8}",
        "bench",
        "nodes",
        "runs",
        "up s",
        "ack ms",
        "sched ms",
        "p50 ms",
        "p99 ms",
        "srv MiB",
        "sim MiB",
        "idle%"
    );
    for r in &rows {
        println!(
            "{:<16} {:>6} {:>5} {:>8.1} {:>8.2} {:>9.1} {:>9.1} {:>9.1} {:>9.0} {:>8.0} {:>4.0}/{:<3.0}",
            "gang_start_64x8",
            r["fleet_nodes"].as_u64().unwrap(),
            r["runs"].as_u64().unwrap(),
            r["fleet_up_s"].as_f64().unwrap(),
            r["ack_p50_ms"].as_f64().unwrap(),
            r["scheduled_p50_ms"].as_f64().unwrap(),
            r["all_running_p50_ms"].as_f64().unwrap(),
            r["all_running_p99_ms"].as_f64().unwrap(),
            r["server_rss_mb"].as_f64().unwrap(),
            r["sim_rss_mb"].as_f64().unwrap(),
            r["idle_server_cpu_pct"].as_f64().unwrap(),
            r["idle_sim_cpu_pct"].as_f64().unwrap(),
        );
    }
    println!(
        "(idle% = server/sim CPU with the fleet idle; p50/p99 = submit -> all 64 ranks running)"
    );
    let out = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/bench");
    std::fs::create_dir_all(&out).unwrap();
    rows.extend(reports);
    std::fs::write(
        out.join("fleet.json"),
        serde_json::to_string_pretty(&rows).unwrap(),
    )
    .unwrap();
}
