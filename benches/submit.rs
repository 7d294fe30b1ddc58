//! Submit path: latency through the local socket (one client, sequential),
//! the CLI process rate (one process a job, sequential and 4 loops at once),
//! 4 and 8 concurrent socket clients (group commit), and bulk submit (1,000
//! specs a `SubmitMany` call through the socket, and `gpuq submit --from
//! FILE`), against a real `gpuq server` process. Prints figures; asserts
//! nothing. Run: `cargo bench --bench submit` (GPUQ_BENCH_N scales it).

#[path = "../tests/common/mod.rs"]
mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use gpuq::model::JobSpec;
use gpuq::net::local::LocalClient;
use gpuq::net::proto::{ApiRequest, ApiResponse};

fn spec() -> JobSpec {
    common::trivial_spec("bench")
}

async fn submit(c: &mut LocalClient) {
    match c
        .call(&ApiRequest::Submit {
            spec: Box::new(spec()),
        })
        .await
    {
        Ok(ApiResponse::Submitted { .. }) => {}
        other => panic!("submit failed: {other:?}"),
    }
}

/// (commands proposed, log write transactions): their ratio is how many
/// submits one fsync carried.
async fn log_counters(socket: &Path) -> (u64, u64) {
    let mut c = LocalClient::connect(socket).await.unwrap();
    match c.call(&ApiRequest::Cluster).await.unwrap() {
        ApiResponse::Cluster { status } => (status.proposed_commands, status.log_write_txns),
        other => panic!("{other:?}"),
    }
}

fn pct(sorted: &[Duration], p: f64) -> f64 {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i].as_secs_f64() * 1e3
}

fn batch(before: (u64, u64), after: (u64, u64)) -> f64 {
    let (e, t) = (after.0 - before.0, after.1 - before.1);
    if t == 0 {
        0.0
    } else {
        e as f64 / t as f64
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let n: usize = std::env::var("GPUQ_BENCH_N")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2000);
    let dir = tempfile::tempdir().unwrap();
    let server = tokio::task::block_in_place(|| common::Server::bootstrap(dir.path()));
    let socket = server.socket.clone();
    let mut rows = Vec::new();

    // 1. One client, sequential, through the socket.
    let mut c = LocalClient::connect(&socket).await.unwrap();
    for _ in 0..50 {
        submit(&mut c).await; // warm-up
    }
    let before = log_counters(&socket).await;
    let mut lat = Vec::with_capacity(n);
    let t0 = Instant::now();
    for _ in 0..n {
        let t = Instant::now();
        submit(&mut c).await;
        lat.push(t.elapsed());
    }
    let secs = t0.elapsed().as_secs_f64();
    let after = log_counters(&socket).await;
    lat.sort();
    rows.push(serde_json::json!({
        "bench": "submit_sequential_socket", "jobs": n,
        "p50_ms": pct(&lat, 0.5), "p99_ms": pct(&lat, 0.99),
        "jobs_per_s": n as f64 / secs, "mean_commit_batch": batch(before, after),
    }));

    // 2. One CLI process per job (what a user's shell loop pays).
    let cli_n = (n / 5).max(20);
    let before = log_counters(&socket).await;
    let t0 = Instant::now();
    let mut cli_lat = Vec::with_capacity(cli_n);
    for _ in 0..cli_n {
        let t = Instant::now();
        let out = common::cli(&socket, &["submit", "--parsable", "--", "true"]);
        assert!(out.status.success());
        cli_lat.push(t.elapsed());
    }
    let secs = t0.elapsed().as_secs_f64();
    let after = log_counters(&socket).await;
    cli_lat.sort();
    rows.push(serde_json::json!({
        "bench": "submit_sequential_cli", "jobs": cli_n,
        "p50_ms": pct(&cli_lat, 0.5), "p99_ms": pct(&cli_lat, 0.99),
        "jobs_per_s": cli_n as f64 / secs, "mean_commit_batch": batch(before, after),
    }));

    // 3. Eight concurrent clients.
    for clients in [4usize, 8] {
        let before = log_counters(&socket).await;
        let per = n / clients;
        let t0 = Instant::now();
        let mut tasks = Vec::new();
        for _ in 0..clients {
            let socket = socket.clone();
            tasks.push(tokio::spawn(async move {
                let mut c = LocalClient::connect(&socket).await.unwrap();
                let mut lat = Vec::with_capacity(per);
                for _ in 0..per {
                    let t = Instant::now();
                    submit(&mut c).await;
                    lat.push(t.elapsed());
                }
                lat
            }));
        }
        let mut lat = Vec::new();
        for t in tasks {
            lat.extend(t.await.unwrap());
        }
        let secs = t0.elapsed().as_secs_f64();
        let after = log_counters(&socket).await;
        lat.sort();
        rows.push(serde_json::json!({
            "bench": format!("submit_concurrent_{clients}_socket"), "jobs": per * clients,
            "p50_ms": pct(&lat, 0.5), "p99_ms": pct(&lat, 0.99),
            "jobs_per_s": (per * clients) as f64 / secs, "mean_commit_batch": batch(before, after),
        }));
    }

    // 4. Four concurrent CLI loops (four users' shells, each a process a job).
    {
        let clients = 4;
        let per = (cli_n / clients).max(5);
        let before = log_counters(&socket).await;
        let t0 = Instant::now();
        let threads: Vec<_> = (0..clients)
            .map(|_| {
                let socket = socket.clone();
                std::thread::spawn(move || {
                    (0..per)
                        .map(|_| {
                            let t = Instant::now();
                            let out = common::cli(&socket, &["submit", "--parsable", "--", "true"]);
                            assert!(out.status.success());
                            t.elapsed()
                        })
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        let mut lat: Vec<Duration> = threads
            .into_iter()
            .flat_map(|t| t.join().unwrap())
            .collect();
        let secs = t0.elapsed().as_secs_f64();
        let after = log_counters(&socket).await;
        lat.sort();
        rows.push(serde_json::json!({
            "bench": format!("submit_concurrent_{clients}_cli"), "jobs": per * clients,
            "p50_ms": pct(&lat, 0.5), "p99_ms": pct(&lat, 0.99),
            "jobs_per_s": (per * clients) as f64 / secs, "mean_commit_batch": batch(before, after),
        }));
    }

    // 5. Bulk: SubmitMany calls of 1,000 specs through the socket (one log
    //    entry each), and one `gpuq submit --from FILE` process.
    // (A server without SubmitMany, measured through GPUQ_BIN, skips them.)
    let bulk = matches!(
        c.call(&ApiRequest::SubmitMany {
            specs: vec![spec()]
        })
        .await,
        Ok(ApiResponse::SubmittedMany { .. })
    );
    if !bulk {
        eprintln!("this server has no bulk submit (SubmitMany): bulk rows skipped");
    } else {
        let chunk = 1000.min(n);
        let calls = (n / chunk).max(1);
        let specs: Vec<JobSpec> = (0..chunk).map(|_| spec()).collect();
        let before = log_counters(&socket).await;
        let mut lat = Vec::with_capacity(calls);
        let t0 = Instant::now();
        for _ in 0..calls {
            let t = Instant::now();
            match c
                .call(&ApiRequest::SubmitMany {
                    specs: specs.clone(),
                })
                .await
            {
                Ok(ApiResponse::SubmittedMany { ids }) => assert_eq!(ids.len(), chunk),
                other => panic!("bulk submit failed: {other:?}"),
            }
            lat.push(t.elapsed());
        }
        let secs = t0.elapsed().as_secs_f64();
        let after = log_counters(&socket).await;
        lat.sort();
        rows.push(serde_json::json!({
            "bench": format!("submit_bulk_{chunk}_socket"), "jobs": calls * chunk,
            "p50_ms": pct(&lat, 0.5), "p99_ms": pct(&lat, 0.99),
            "jobs_per_s": (calls * chunk) as f64 / secs, "mean_commit_batch": batch(before, after),
        }));

        let file = dir.path().join("jobs.txt");
        std::fs::write(&file, "-- true\n".repeat(chunk)).unwrap();
        let before = log_counters(&socket).await;
        let t0 = Instant::now();
        let out = common::cli(
            &socket,
            &["submit", "--parsable", "--from", file.to_str().unwrap()],
        );
        let took = t0.elapsed();
        assert!(out.status.success(), "{}", common::stderr(&out));
        assert_eq!(String::from_utf8_lossy(&out.stdout).lines().count(), chunk);
        let after = log_counters(&socket).await;
        rows.push(serde_json::json!({
            "bench": format!("submit_bulk_{chunk}_cli_from_file"), "jobs": chunk,
            "p50_ms": took.as_secs_f64() * 1e3, "p99_ms": took.as_secs_f64() * 1e3,
            "jobs_per_s": chunk as f64 / took.as_secs_f64(), "mean_commit_batch": batch(before, after),
        }));
    }

    println!(
        "{:<32} {:>7} {:>9} {:>9} {:>10} {:>7}",
        "bench", "jobs", "p50 ms", "p99 ms", "jobs/s", "batch"
    );
    for r in &rows {
        println!(
            "{:<32} {:>7} {:>9.3} {:>9.3} {:>10.0} {:>7.2}",
            r["bench"].as_str().unwrap(),
            r["jobs"],
            r["p50_ms"].as_f64().unwrap(),
            r["p99_ms"].as_f64().unwrap(),
            r["jobs_per_s"].as_f64().unwrap(),
            r["mean_commit_batch"].as_f64().unwrap()
        );
    }
    let out = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("target/bench");
    std::fs::create_dir_all(&out).unwrap();
    std::fs::write(
        out.join("submit.json"),
        serde_json::to_string_pretty(&rows).unwrap(),
    )
    .unwrap();
    drop(server);
}
