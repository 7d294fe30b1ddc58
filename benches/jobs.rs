//! Jobs end to end with real processes: a server and agent processes with fake
//! GPUs on loopback. Prints figures; asserts nothing.
//!
//! - gang start: a 2-node x 8-GPU job, submit -> every rank reported started
//!   (p50/p99 over 20 runs);
//! - trivial throughput: 200 `true` jobs on one agent, first submit -> all
//!   completed (jobs/s);
//! - failover of a node: agent SIGKILL -> the job running again on another
//!   node (p50 over 10 runs, node TTL 3 s);
//! - agent restart -> the node connected again with its task re-adopted.
//!
//! Run: `cargo bench --bench jobs`.

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
    JobId(cl.submit(args).parse().unwrap())
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
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

    let trivial = spec_of(&["--", "true"]);
    let t = Instant::now();
    let mut ids = Vec::new();
    for _ in 0..200 {
        match c
            .call(&ApiRequest::Submit {
                spec: Box::new(trivial.clone()),
            })
            .await
            .unwrap()
        {
            ApiResponse::Submitted { id } => ids.push(id),
            other => panic!("{other:?}"),
        }
    }
    let submitted = t.elapsed().as_secs_f64();
    for id in &ids {
        while !show(&mut c, *id).await.state.is_final() {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
    let secs = t.elapsed().as_secs_f64();
    let failed = {
        let mut n = 0;
        for id in &ids {
            n += (show(&mut c, *id).await.state != JobState::Completed) as u32;
        }
        n
    };
    rows.push(
        serde_json::json!({"bench": "trivial_true_jobs_2_agents", "jobs": 200,
        "jobs_per_s": 200.0 / secs, "submit_s": submitted, "not_completed": failed}),
    );
    drop(c);
    drop(cl);

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

    for r in &rows {
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
