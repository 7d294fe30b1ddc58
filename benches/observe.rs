//! The HTTP port at scale: one real `gpuq server` with GPUQ_BENCH_OBSERVE_NODES
//! (1,000) simulated agents (`gpuq sim agents`, 8 GPUs each) and
//! GPUQ_BENCH_OBSERVE_JOBS (100,000) jobs: pending and held, submitted with
//! `--from` 10,000 a call, plus 500 running 8-GPU jobs (one per node for
//! an hour of virtual time), so the GPU families have something allocated.
//! Then, each GPUQ_BENCH_N (20) times over a fresh TCP connection (as a
//! scraper would): `GET /metrics` (time and bytes) and `GET /api/v1/jobs`
//! (every job as JSON, anonymous on loopback). Prints p50/p99 and sizes to
//! stdout and target/bench/observe.json.
//!
//! Run: `cargo bench --bench observe`. GPUQ_BENCH_SMOKE=1 shrinks it to
//! seconds.

use std::io::{Read, Write};
use std::path::Path;
use std::time::{Duration, Instant};

#[path = "../tests/common/mod.rs"]
mod common;

use common::{env_u64, http_url_in, pct, run_clean, Server, SimAgents};

/// One `GET path` over a new connection: (milliseconds, body bytes).
fn get(addr: &str, path: &str) -> (f64, usize) {
    let t = Instant::now();
    let mut s = std::net::TcpStream::connect(addr).expect("connect to the HTTP port");
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut buf = Vec::new();
    s.read_to_end(&mut buf).unwrap();
    let ms = t.elapsed().as_secs_f64() * 1e3;
    let text = String::from_utf8_lossy(&buf[..buf.len().min(64)]).to_string();
    assert!(text.starts_with("HTTP/1.1 200"), "GET {path}: {text}");
    let body = buf
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .map_or(0, |i| buf.len() - i - 4);
    (ms, body)
}

/// `reps` GETs of `path`: (p50 ms, p99 ms, bytes).
fn time(addr: &str, path: &str, reps: usize) -> (f64, f64, usize) {
    let mut ms = Vec::with_capacity(reps);
    let mut bytes = 0;
    for _ in 0..reps {
        let (t, b) = get(addr, path);
        ms.push(t);
        bytes = b;
    }
    ms.sort_by(|a, b| a.total_cmp(b));
    (pct(&ms, 0.5), pct(&ms, 0.99), bytes)
}

fn main() {
    let smoke = std::env::var_os("GPUQ_BENCH_SMOKE").is_some();
    let nodes = env_u64("GPUQ_BENCH_OBSERVE_NODES", if smoke { 16 } else { 1_000 }) as u32;
    let jobs = env_u64(
        "GPUQ_BENCH_OBSERVE_JOBS",
        if smoke { 1_000 } else { 100_000 },
    );
    let reps = env_u64("GPUQ_BENCH_N", if smoke { 3 } else { 20 }) as usize;
    let running = u64::from(nodes / 2);
    let dir = tempfile::tempdir().unwrap();
    let server = Server::bootstrap_with_config(dir.path(), 60, "");
    let socket = server.socket.clone();
    let token = server.ok(&["token", "create"]).trim().to_string();
    let mut fleet = SimAgents::spawn(&server, &dir.path().join("sim"), nodes, &token, &[]);
    fleet.wait_connected(&server, Duration::from_secs(600));

    let t0 = Instant::now();
    // Running work: one 8-GPU job per node on half the nodes, an hour long.
    let long = dir.path().join("long.txt");
    let lines: String = (0..running)
        .map(|i| format!("-J run{i} -G 8 --export=NONE,GPUQ_SIM_DURATION_MS=3600000 -- train\n"))
        .collect();
    std::fs::write(&long, lines).unwrap();
    run_clean(&socket, &["submit", "--from", long.to_str().unwrap()]);
    // The queue: held jobs, 10,000 a call.
    let batch = jobs.min(10_000);
    let sweep = dir.path().join("sweep.txt");
    let lines: String = (0..batch)
        .map(|i| format!("-J lr{i} -G 1 --time 1:00:00 -- python train.py --lr {i}\n"))
        .collect();
    std::fs::write(&sweep, lines).unwrap();
    let mut made = 0;
    while made + batch <= jobs {
        run_clean(
            &socket,
            &[
                "submit",
                "--hold",
                "--export",
                "NONE",
                "--from",
                sweep.to_str().unwrap(),
            ],
        );
        made += batch;
    }
    let build_s = t0.elapsed().as_secs_f64();

    let url = http_url_in(&server.log()).expect("the server's HTTP port in its log");
    let addr = url.trim_start_matches("http://").to_string();
    // Wait until the running jobs run (the page then shows them).
    let deadline = Instant::now() + Duration::from_secs(300);
    loop {
        let out = run_clean(&socket, &["queue", "--state", "RUNNING", "--json"]);
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        if v.as_array().map_or(0, |a| a.len()) as u64 >= running {
            break;
        }
        assert!(Instant::now() < deadline, "the running jobs did not start");
        std::thread::sleep(Duration::from_millis(500));
    }

    println!(
        "HTTP port at {nodes} nodes and {} jobs ({running} running; built in {build_s:.1} s), {reps} GETs each:",
        made + running
    );
    println!(
        "{:<22} {:>10} {:>10} {:>12}",
        "request", "p50 ms", "p99 ms", "bytes"
    );
    let mut rows = Vec::new();
    for (name, path) in [
        ("GET /metrics", "/metrics"),
        ("GET /api/v1/jobs", "/api/v1/jobs"),
        ("GET /api/v1/nodes", "/api/v1/nodes"),
    ] {
        let (p50, p99, bytes) = time(&addr, path, reps);
        println!("{name:<22} {p50:>10.1} {p99:>10.1} {bytes:>12}");
        rows.push(serde_json::json!({
            "request": name, "p50_ms": p50, "p99_ms": p99, "bytes": bytes,
        }));
    }
    let out = serde_json::json!({
        "nodes": nodes, "jobs": made + running, "running": running,
        "build_s": build_s, "requests": rows,
    });
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/bench/observe.json");
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(&path, serde_json::to_string_pretty(&out).unwrap()).unwrap();
    drop(fleet);
}
