//! Control-plane failover with real processes on loopback: three `gpuq
//! server` processes (fast Raft timings: heartbeat 50 ms, election timeout
//! 300-600 ms) and one agent with fake GPUs. Each round SIGKILLs the leader
//! and measures, from the kill:
//!
//! - new leader accepting writes: a survivor reports itself leader and a
//!   submit sent to its own socket is acknowledged (committed);
//! - first scheduling decision: that job is scheduled (no longer PENDING) on
//!   the new leader.
//!
//! The killed server is restarted and the next round starts once it holds
//! the leader's whole log (its restart-to-caught-up time is printed too):
//! killing the leader while the last victim still catches up would measure
//! a double failure, not a failover.
//! Then, three times, a follower is frozen (SIGSTOP) while the leader takes
//! 2,000 submissions (200 with GPUQ_BENCH_SMOKE=1) and the time from SIGCONT
//! to its having applied the whole log is printed.
//! Prints p50/p99 over the rounds; asserts nothing. Writes
//! target/bench/failover.json.
//!
//! Knobs: GPUQ_BENCH_KILLS (default 20; 3 with GPUQ_BENCH_SMOKE=1);
//! GPUQ_SERVER_LOG sets the servers' GPUQ_LOG (e.g. `info,openraft=info`
//! for a per-round election timeline in each server.log).
//! Run: `cargo bench --bench failover`.

#[path = "../tests/common/mod.rs"]
mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::{Agent, ServerSet};
use gpuq::model::{JobId, JobSpec, JobState};
use gpuq::net::local::LocalClient;
use gpuq::net::proto::{ApiRequest, ApiResponse};

const RAFT_FAST: &str =
    "[server.raft]\nheartbeat_ms = 50\nelection_timeout_min_ms = 300\nelection_timeout_max_ms = 600\n";

fn spec(name: &str) -> JobSpec {
    common::trivial_spec(name)
}

async fn call(socket: &Path, req: &ApiRequest) -> Option<ApiResponse> {
    let attempt = async {
        let mut c = LocalClient::connect(socket).await.ok()?;
        c.call(req).await.ok()
    };
    tokio::time::timeout(Duration::from_secs(2), attempt)
        .await
        .ok()
        .flatten()
}

fn pct(v: &[f64], p: f64) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[((v.len() as f64 - 1.0) * p).round() as usize]
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let smoke = std::env::var_os("GPUQ_BENCH_SMOKE").is_some();
    let kills: usize = std::env::var("GPUQ_BENCH_KILLS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(if smoke { 3 } else { 20 });
    let dir = tempfile::tempdir().unwrap();
    let mut set = ServerSet::start_with(&dir.path().join("servers"), 3, RAFT_FAST);
    let li = set.leader();
    let token = set.servers[li].ok(&["token", "create"]).trim().to_string();
    let _agent = Agent::start(&set.servers[li], &dir.path().join("n1"), "n1", 8, &token);

    let mut to_write = Vec::new();
    let mut to_schedule = Vec::new();
    let mut to_catch_up = Vec::new();
    for round in 0..kills {
        let old = set.leader();
        let killed_at = Instant::now();
        set.servers[old].kill();
        // Poll the survivors' own views until one leads and takes a write.
        let (leader, id, wrote) = 'found: loop {
            for (i, s) in set.servers.iter().enumerate() {
                if i == old {
                    continue;
                }
                let Some(ApiResponse::Cluster { status }) =
                    call(&s.socket, &ApiRequest::Cluster).await
                else {
                    continue;
                };
                if status.leader.as_deref() != Some(status.answered_by.as_str()) {
                    continue;
                }
                let submit = ApiRequest::Submit {
                    spec: Box::new(spec(&format!("probe-{round}"))),
                };
                if let Some(ApiResponse::Submitted { id }) = call(&s.socket, &submit).await {
                    break 'found (i, id, killed_at.elapsed());
                }
            }
            assert!(
                killed_at.elapsed() < Duration::from_secs(60),
                "no new leader took a write within 60 s"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        };
        let scheduled = loop {
            if let Some(ApiResponse::Job { job, .. }) = call(
                &set.servers[leader].socket,
                &ApiRequest::Show {
                    id: JobId(id.0),
                    task: None,
                },
            )
            .await
            {
                if job.state != JobState::Pending {
                    break killed_at.elapsed();
                }
            }
            assert!(
                killed_at.elapsed() < Duration::from_secs(60),
                "the probe job was not scheduled within 60 s"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        };
        to_write.push(wrote.as_secs_f64() * 1000.0);
        to_schedule.push(scheduled.as_secs_f64() * 1000.0);
        eprintln!(
            "round {round}: write after {:.0} ms, scheduled after {:.0} ms",
            wrote.as_secs_f64() * 1000.0,
            scheduled.as_secs_f64() * 1000.0
        );
        let restarted_at = Instant::now();
        set.servers[old].start();
        set.wait_members(3);
        // The next kill must find three up-to-date servers, or it measures a
        // double failure: a survivor still catching up cannot win the vote,
        // and its rejected candidacy costs openraft's greater-log backoff.
        set.wait_caught_up(old);
        to_catch_up.push(restarted_at.elapsed().as_secs_f64() * 1000.0);
    }

    let behind = if smoke { 200 } else { 2000 };
    let mut to_catch_up_behind = Vec::new();
    for _ in 0..3 {
        to_catch_up_behind.push(catch_up_from_behind(&set, behind).await);
    }

    println!(
        "failover over {kills} leader SIGKILLs (3 servers, loopback, election timeout 300-600 ms)"
    );
    println!("{:<44} {:>9} {:>9}", "from the kill to", "p50 ms", "p99 ms");
    println!(
        "{:<44} {:>9.0} {:>9.0}",
        "new leader accepting writes",
        pct(&to_write, 0.5),
        pct(&to_write, 0.99)
    );
    println!(
        "{:<44} {:>9.0} {:>9.0}",
        "first scheduling decision",
        pct(&to_schedule, 0.5),
        pct(&to_schedule, 0.99)
    );
    println!(
        "{:<44} {:>9.0} {:>9.0}",
        "(restart of the killed server to caught up)",
        pct(&to_catch_up, 0.5),
        pct(&to_catch_up, 0.99)
    );
    let catch_up = pct(&to_catch_up_behind, 0.5);
    println!(
        "a follower frozen while {behind} submissions were taken: SIGCONT to caught up \
         p50 {catch_up:.0} ms of 3 ({:.0} submissions/s)",
        behind as f64 / (catch_up / 1000.0)
    );
    let json = serde_json::json!({
        "kills": kills,
        "write_ms": { "p50": pct(&to_write, 0.5), "p99": pct(&to_write, 0.99), "all": to_write },
        "schedule_ms": { "p50": pct(&to_schedule, 0.5), "p99": pct(&to_schedule, 0.99), "all": to_schedule },
        "catch_up_ms": { "p50": pct(&to_catch_up, 0.5), "p99": pct(&to_catch_up, 0.99), "all": to_catch_up },
        "behind_catch_up_ms": { "submissions": behind, "p50": catch_up, "all": to_catch_up_behind },
    });
    let out = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/bench");
    std::fs::create_dir_all(&out).unwrap();
    std::fs::write(
        out.join("failover.json"),
        serde_json::to_vec_pretty(&json).unwrap(),
    )
    .unwrap();
}

/// Freezes a follower (SIGSTOP), has the leader take `behind` held
/// submissions that carry this process's environment (what `gpuq submit`
/// sends, a few KB), thaws it and returns the ms until it has applied the
/// leader's whole log: the catch-up that append-entries batches must fit
/// into heartbeats for.
async fn catch_up_from_behind(set: &ServerSet, behind: usize) -> f64 {
    let li = set.leader();
    let f = (li + 1) % set.servers.len();
    set.servers[f].freeze(true);
    let env: Vec<(String, String)> = std::env::vars().collect();
    let clients: Vec<_> = (0..4)
        .map(|k| {
            let (socket, env) = (set.servers[li].socket.clone(), env.clone());
            tokio::spawn(async move {
                let mut c = LocalClient::connect(&socket).await.unwrap();
                for i in 0..behind / 4 {
                    let mut s = spec(&format!("behind-{k}-{i}"));
                    s.env = env.clone();
                    s.queue.hold = true;
                    let r = c.call(&ApiRequest::Submit { spec: Box::new(s) }).await;
                    assert!(matches!(r, Ok(ApiResponse::Submitted { .. })), "{r:?}");
                }
            })
        })
        .collect();
    for c in clients {
        c.await.unwrap();
    }
    let status = |i: usize| tokio::task::block_in_place(|| set.servers[i].status());
    let end = status(li)["last_log_index"].as_u64().unwrap();
    let thawed = Instant::now();
    set.servers[f].freeze(false);
    loop {
        if status(f)["applied_index"].as_u64() >= Some(end) {
            return thawed.elapsed().as_secs_f64() * 1000.0;
        }
        assert!(
            thawed.elapsed() < Duration::from_secs(120),
            "the follower did not catch up within 120 s"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}
