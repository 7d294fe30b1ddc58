//! The highly available control plane's figures, with real `gpuq server`
//! processes on loopback: submit throughput with 3 servers vs 1 (sequential
//! and 4 concurrent socket clients), the redb file size after a steady
//! workload of GPUQ_BENCH_JOBS (default 100,000) jobs submitted and
//! cancelled, the snapshot's size and build time (`gpuq cluster snapshot
//! save`), and the time a new server takes to join and catch up with that
//! state. Prints figures; asserts nothing. Run: `cargo bench --bench ha`
//! (GPUQ_BENCH_N: submits per throughput run, default 2000).

#[path = "../tests/common/mod.rs"]
mod common;

use std::path::Path;
use std::time::Instant;

use common::{Server, ServerSet};
use gpuq::model::{JobId, JobSpec};
use gpuq::net::local::LocalClient;
use gpuq::net::proto::{ApiRequest, ApiResponse};

fn spec() -> JobSpec {
    common::trivial_spec("bench")
}

async fn submit(c: &mut LocalClient) -> JobId {
    match c
        .call(&ApiRequest::Submit {
            spec: Box::new(spec()),
        })
        .await
    {
        Ok(ApiResponse::Submitted { id }) => id,
        other => panic!("submit failed: {other:?}"),
    }
}

/// Submits per second: `n` sequential, then `n` over 4 concurrent clients.
async fn throughput(socket: &Path, n: usize) -> (f64, f64) {
    let mut c = LocalClient::connect(socket).await.unwrap();
    let t = Instant::now();
    for _ in 0..n {
        submit(&mut c).await;
    }
    let seq = n as f64 / t.elapsed().as_secs_f64();
    let t = Instant::now();
    let tasks: Vec<_> = (0..4)
        .map(|_| {
            let socket = socket.to_path_buf();
            tokio::spawn(async move {
                let mut c = LocalClient::connect(&socket).await.unwrap();
                for _ in 0..n / 4 {
                    submit(&mut c).await;
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    let conc = (n / 4 * 4) as f64 / t.elapsed().as_secs_f64();
    (seq, conc)
}

/// `jobs` jobs submitted and cancelled in rounds of 1,000, 4 clients.
async fn steady(socket: &Path, jobs: usize) {
    let round = 1000.min(jobs);
    let mut done = 0;
    while done < jobs {
        let per = round / 4;
        let tasks: Vec<_> = (0..4)
            .map(|_| {
                let socket = socket.to_path_buf();
                tokio::spawn(async move {
                    let mut c = LocalClient::connect(&socket).await.unwrap();
                    let mut ids = Vec::with_capacity(per);
                    for _ in 0..per {
                        ids.push(submit(&mut c).await);
                    }
                    match c.call(&ApiRequest::Cancel { ids, tasks: vec![] }).await {
                        Ok(ApiResponse::Cancelled { .. }) => {}
                        other => panic!("cancel failed: {other:?}"),
                    }
                })
            })
            .collect();
        for t in tasks {
            t.await.unwrap();
        }
        done += per * 4;
    }
}

fn mib(bytes: u64) -> f64 {
    bytes as f64 / (1 << 20) as f64
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let smoke = std::env::var_os("GPUQ_BENCH_SMOKE").is_some();
    let env = |k: &str, d: usize| {
        std::env::var(k)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(d)
    };
    let n = env("GPUQ_BENCH_N", if smoke { 80 } else { 2000 });
    let jobs = env("GPUQ_BENCH_JOBS", if smoke { 400 } else { 100_000 });
    let root = tempfile::tempdir().unwrap();

    let one = Server::bootstrap(&root.path().join("one"));
    let (seq1, conc1) = throughput(&one.socket, n).await;
    drop(one);

    let set = ServerSet::start(&root.path().join("three"), 3);
    let leader = &set.servers[set.leader()];
    let (seq3, conc3) = throughput(&leader.socket, n).await;

    let t = Instant::now();
    steady(&leader.socket, jobs).await;
    let steady_s = t.elapsed().as_secs_f64();
    let redb = std::fs::metadata(leader.dir.join("data/gpuq.redb"))
        .map(|m| m.len())
        .unwrap_or(0);

    let file = root.path().join("snap");
    let t = Instant::now();
    leader.ok(&["cluster", "snapshot", "save", file.to_str().unwrap()]);
    let snap_s = t.elapsed().as_secs_f64();
    let snap = std::fs::metadata(&file).map(|m| m.len()).unwrap_or(0);

    let token = leader.server_token();
    let t = Instant::now();
    let s4 = Server::join(&root.path().join("s4"), "s4", leader, &token);
    let total = jobs + 2 * (n / 4 * 4).max(n);
    let held = |v: serde_json::Value| -> u64 {
        v["jobs"]
            .as_array()
            .map(|a| a.iter().map(|p| p[1].as_u64().unwrap_or(0)).sum())
            .unwrap_or(0)
    };
    let want = held(leader.status());
    while held(s4.status()) < want {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let join_s = t.elapsed().as_secs_f64();
    let caught_up = want;

    println!("ha bench: {total} jobs in the state at the end");
    println!("  submit/s, 1 server:   sequential {seq1:8.0}   4 clients {conc1:8.0}");
    println!("  submit/s, 3 servers:  sequential {seq3:8.0}   4 clients {conc3:8.0}");
    println!("  steady workload: {jobs} jobs submitted+cancelled in {steady_s:.1} s");
    println!("  leader redb file after it: {:.1} MiB", mib(redb));
    println!(
        "  snapshot save (build+write): {:.1} MiB in {:.2} s",
        mib(snap),
        snap_s
    );
    println!("  new server join + catch up (holding all {caught_up} jobs): {join_s:.2} s");
    let json = serde_json::json!({
        "jobs": total, "submit_seq_1": seq1, "submit_conc4_1": conc1,
        "submit_seq_3": seq3, "submit_conc4_3": conc3, "steady_jobs": jobs,
        "steady_s": steady_s, "redb_bytes": redb, "snapshot_bytes": snap,
        "snapshot_s": snap_s, "join_catch_up_s": join_s,
    });
    let out = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/bench");
    let _ = std::fs::create_dir_all(&out);
    let _ = std::fs::write(
        out.join("ha.json"),
        serde_json::to_string_pretty(&json).unwrap(),
    );
}
