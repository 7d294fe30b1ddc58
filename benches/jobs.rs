//! Jobs end to end with real processes: a server and agent processes with fake
//! GPUs on loopback. Prints figures; asserts nothing.
//!
//! - gang start: a 2-node x 8-GPU job, submit -> every rank reported started
//!   (p50/p99 over 20 runs);
//! - idle cluster: submit -> the rank reported running (p50/p99 over 30);
//! - trivial throughput: `true` jobs on 2 agents, first submit -> all
//!   completed (jobs/s), submitted through the socket (GPUQ_BENCH_JOBS, 400)
//!   and with one `gpuq submit` process per job (half as many), with the
//!   CPU-ms per job of the server, agents, shims and tasks (common::cpu) plus
//!   the CLI processes;
//! - failover of a node: agent SIGKILL -> the job running again on another
//!   node (p50 over 10 runs, node TTL 3 s);
//! - agent restart -> the node connected again with its task re-adopted.
//!
//! Run: `cargo bench --bench jobs` (GPUQ_BENCH_FAILURES=0 skips the node
//! failure and agent restart rows).

#[path = "../tests/common/mod.rs"]
mod common;

use std::time::{Duration, Instant};

use common::Cluster;
use gpuq::model::{JobId, JobState};
use gpuq::net::local::LocalClient;
use gpuq::net::proto::{ApiRequest, ApiResponse};

async fn show(c: &mut LocalClient, id: JobId) -> gpuq::model::Job {
    match c.call(&ApiRequest::Show { id, task: None }).await.unwrap() {
        ApiResponse::Job { job, .. } => *job,
        other => panic!("{other:?}"),
    }
}

fn pct(v: &mut [f64], p: f64) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[((v.len() as f64 - 1.0) * p).round() as usize]
}

fn submit(cl: &Cluster, args: &[&str]) -> JobId {
    JobId(cl.submit(args).trim().parse().unwrap())
}

async fn submit_spec(c: &mut LocalClient, spec: &gpuq::model::JobSpec) -> JobId {
    match c
        .call(&ApiRequest::Submit {
            spec: Box::new(spec.clone()),
        })
        .await
        .unwrap()
    {
        ApiResponse::Submitted { id } => id,
        other => panic!("{other:?}"),
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let trivial_n: usize = std::env::var("GPUQ_BENCH_JOBS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(400);
    let failures = std::env::var("GPUQ_BENCH_FAILURES").map_or(true, |v| v != "0");
    let dir = tempfile::tempdir().unwrap();
    let w = dir.path().to_str().unwrap().to_string();
    let mut rows = Vec::new();

    // Gang start and trivial throughput on 2 nodes.
    let cl = tokio::task::block_in_place(|| Cluster::start(&dir.path().join("a"), 2, 8));
    let mut c = LocalClient::connect(&cl.server.socket).await.unwrap();
    let spec_of = |args: &[&str]| {
        let mut a = vec!["gpuq-submit"];
        a.extend_from_slice(args);
        let parsed = <gpuq::spec::SubmitArgs as clap::FromArgMatches>::from_arg_matches(
            &<gpuq::spec::SubmitArgs as clap::Args>::augment_args(clap::Command::new("x"))
                .get_matches_from(a),
        )
        .unwrap();
        let env: Vec<(String, String)> = vec![("PATH".into(), "/usr/bin:/bin".into())];
        gpuq::spec::build_spec(&parsed, &env, std::path::Path::new(&w)).unwrap()
    };
    let gang = spec_of(&["-N", "2", "--gpus-per-node", "8", "--", "sleep", "0.2"]);
    let mut lat = Vec::new();
    for _ in 0..20 {
        let t = Instant::now();
        let id = match c
            .call(&ApiRequest::Submit {
                spec: Box::new(gang.clone()),
            })
            .await
            .unwrap()
        {
            ApiResponse::Submitted { id } => id,
            other => panic!("{other:?}"),
        };
        loop {
            let j = show(&mut c, id).await;
            if j.run.as_ref().is_some_and(|r| r.started.len() == 2) {
                lat.push(t.elapsed().as_secs_f64() * 1e3);
                break;
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        while !show(&mut c, id).await.state.is_final() {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    rows.push(
        serde_json::json!({"bench": "gang_2x8_submit_to_all_ranks_started_ms",
        "p50": pct(&mut lat, 0.5), "p99": pct(&mut lat, 0.99), "runs": lat.len()}),
    );

    // Idle cluster: submit -> the rank reported running (p50 over 30).
    let short = spec_of(&["--", "sleep", "0.05"]);
    let mut idle = Vec::new();
    for _ in 0..30 {
        let t = Instant::now();
        let id = submit_spec(&mut c, &short).await;
        loop {
            let j = show(&mut c, id).await;
            if j.run.as_ref().is_some_and(|r| !r.started.is_empty()) || j.state.is_final() {
                idle.push(t.elapsed().as_secs_f64() * 1e3);
                break;
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        while !show(&mut c, id).await.state.is_final() {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
    rows.push(serde_json::json!({"bench": "idle_submit_to_running_ms",
        "p50": pct(&mut idle, 0.5), "p99": pct(&mut idle, 0.99), "runs": idle.len()}));

    // Trivial `true` jobs, first submit -> all completed, with the CPU the
    // cluster spent on them (server, agents, shims, tasks; and the CLI
    // processes when each job is its own `gpuq submit`).
    let mut meter = common::cpu::CpuMeter::new("jobs");
    meter.add(cl.server.pid().unwrap());
    for a in &cl.agents {
        meter.add(a.pid().unwrap());
    }
    let trivial = spec_of(&["--", "true"]);
    for via_cli in [false, true] {
        let n = if via_cli { trivial_n / 2 } else { trivial_n };
        let (cpu0, cli0) = (meter.ms(), common::cpu::children_ms());
        let t = Instant::now();
        let mut ids = Vec::new();
        for _ in 0..n {
            if via_cli {
                ids.push(submit(&cl, &["-D", &w, "--", "true"]));
            } else {
                ids.push(submit_spec(&mut c, &trivial).await);
            }
        }
        let submitted = t.elapsed().as_secs_f64();
        // One queue listing per poll: cheaper for the server than a show per job.
        loop {
            let open = match c
                .call(&ApiRequest::Queue {
                    all: false,
                    user: None,
                    states: vec![],
                    after: None,
                })
                .await
                .unwrap()
            {
                ApiResponse::Jobs { jobs, .. } => {
                    jobs.iter().filter(|j| ids.contains(&j.id)).count()
                }
                other => panic!("{other:?}"),
            };
            if open == 0 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let secs = t.elapsed().as_secs_f64();
        let (cpu, cli_cpu) = (meter.ms() - cpu0, common::cpu::children_ms() - cli0);
        let mut failed = 0;
        for id in &ids {
            failed += (show(&mut c, *id).await.state != JobState::Completed) as u32;
        }
        rows.push(serde_json::json!({
            "bench": if via_cli { "trivial_true_jobs_2_agents_cli_each" } else { "trivial_true_jobs_2_agents" },
            "jobs": n, "jobs_per_s": n as f64 / secs, "submit_s": submitted, "not_completed": failed,
            "cpu_ms_per_job": (cpu + cli_cpu) / n as f64,
            "cluster_cpu_ms_per_job": cpu / n as f64, "cli_cpu_ms_per_job": cli_cpu / n as f64,
            "cpu_scope": meter.scope(),
        }));
    }
    drop(c);
    drop(meter);
    drop(cl);
    if !failures {
        return write_rows(&rows);
    }

    // Node failure: kill the agent running the job, time until it runs again elsewhere.
    let mut cl =
        tokio::task::block_in_place(|| Cluster::start_with_ttl(&dir.path().join("b"), 2, 8, 3));
    let mut c = LocalClient::connect(&cl.server.socket).await.unwrap();
    let mut again = Vec::new();
    for _ in 0..10 {
        let id = submit(
            &cl,
            &["--gpus-per-node", "8", "-D", &w, "--", "sleep", "30"],
        );
        let first = loop {
            let j = show(&mut c, id).await;
            if let Some(r) = j.run.as_ref().filter(|r| !r.started.is_empty()) {
                break r.allocation.nodes[0].node.clone();
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        };
        let idx = cl.agents.iter().position(|a| a.name == first).unwrap();
        let t = Instant::now();
        tokio::task::block_in_place(|| cl.agents[idx].kill());
        loop {
            let j = show(&mut c, id).await;
            if j.restart_count == 1 && j.run.as_ref().is_some_and(|r| !r.started.is_empty()) {
                again.push(t.elapsed().as_secs_f64() * 1e3);
                break;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let _ = c
            .call(&ApiRequest::Cancel {
                ids: vec![id],
                tasks: vec![],
            })
            .await;
        tokio::task::block_in_place(|| cl.agents[idx].spawn());
        // Wait until the node is back up and empty before the next round.
        loop {
            let nodes = match c.call(&ApiRequest::Nodes).await.unwrap() {
                ApiResponse::Nodes { nodes } => nodes,
                other => panic!("{other:?}"),
            };
            if nodes
                .iter()
                .all(|n| n.state == "up" && n.connected && n.gpus_used == 0)
            {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    rows.push(
        serde_json::json!({"bench": "agent_sigkill_to_running_elsewhere_ms_ttl_3s",
        "p50": pct(&mut again, 0.5), "p99": pct(&mut again, 0.99), "runs": again.len()}),
    );

    // Agent restart under a running job: restart -> connected with the task re-adopted.
    let id = submit(&cl, &["-D", &w, "--", "sleep", "60"]);
    while show(&mut c, id)
        .await
        .run
        .as_ref()
        .is_none_or(|r| r.started.is_empty())
    {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let node = show(&mut c, id).await.run.unwrap().allocation.nodes[0]
        .node
        .clone();
    let idx = cl.agents.iter().position(|a| a.name == node).unwrap();
    let mut readopt = Vec::new();
    for _ in 0..5 {
        tokio::task::block_in_place(|| cl.agents[idx].kill());
        tokio::time::sleep(Duration::from_millis(1600)).await; // the old connection goes quiet
        let t = Instant::now();
        tokio::task::block_in_place(|| cl.agents[idx].spawn());
        loop {
            let nodes = match c.call(&ApiRequest::Nodes).await.unwrap() {
                ApiResponse::Nodes { nodes } => nodes,
                other => panic!("{other:?}"),
            };
            if nodes.iter().any(|n| n.name == node && n.connected) {
                readopt.push(t.elapsed().as_secs_f64() * 1e3);
                break;
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }
    let still = show(&mut c, id).await;
    rows.push(
        serde_json::json!({"bench": "agent_restart_to_reconnected_ms",
        "p50": pct(&mut readopt, 0.5), "p99": pct(&mut readopt, 0.99), "runs": readopt.len(),
        "job_state_after": still.state.as_str(), "restarts": still.restart_count}),
    );
    let _ = c
        .call(&ApiRequest::Cancel {
            ids: vec![id],
            tasks: vec![],
        })
        .await;

    write_rows(&rows);
}

fn write_rows(rows: &[serde_json::Value]) {
    for r in rows {
        println!("{r}");
    }
    let out = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("target/bench");
    std::fs::create_dir_all(&out).unwrap();
    std::fs::write(
        out.join("jobs.json"),
        serde_json::to_string_pretty(&rows).unwrap(),
    )
    .unwrap();
}
