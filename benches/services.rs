//! Services with real processes on loopback (a `gpuq server`, `gpuq agent`s
//! with fake GPUs, and a `gpuq sim agents` fleet). Prints figures; asserts
//! nothing. Run: `cargo bench --bench services`.
//!
//! - exit: a replica's process is SIGKILLed -> its index is healthy again
//!   (an endpoint: running, and its HTTP check passed), p50/p99 over
//!   GPUQ_BENCH_SVC_ROUNDS kills (default 10) of 4 `python3 -m http.server`
//!   replicas on one agent (restart delay 0 s, check every 1 s, so the
//!   figure is the machinery: exit seen, replacement queued, scheduled,
//!   started, first check passed).
//! - node loss: the agent under a `sleep` replica is SIGKILLed -> the
//!   replica runs on the other node, p50/p99 over GPUQ_BENCH_SVC_NODE_ROUNDS
//!   (default 5), with a node TTL of GPUQ_BENCH_SVC_TTL seconds (default
//!   3); the killed agent is started again between rounds.
//! - roll: `gpuq service update` of 16 HTTP replicas with health checks:
//!   the time until every replica runs the new version and serves, and the
//!   fewest endpoints a client polling `gpuq service endpoints` saw.
//! - fleet: GPUQ_BENCH_SVC_NODES simulated 8-GPU nodes (default 1000) and
//!   one service of as many 8-GPU replicas: create -> every replica
//!   running (an endpoint), and the latency of `gpuq service endpoints`
//!   (the CLI, a process per call) and of the API read behind it.
//!
//! GPUQ_BENCH_SMOKE=1 shrinks it to about a minute.

#[path = "../tests/common/mod.rs"]
mod common;

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{pct, wait_for, Cluster};
use gpuq::model::ServiceSettings;
use gpuq::net::local::LocalClient;
use gpuq::net::proto::{ApiRequest, ApiResponse, ServiceInfo};

const LONG: Duration = Duration::from_secs(120);

fn smoke() -> bool {
    std::env::var_os("GPUQ_BENCH_SMOKE").is_some()
}

fn services(socket: &Path, name: &str) -> ServiceInfo {
    let out = common::cli(socket, &["service", "show", name, "--json"]);
    let v: Vec<ServiceInfo> = serde_json::from_slice(&out.stdout).unwrap_or_default();
    v.into_iter().next().expect("the service")
}

fn endpoints(socket: &Path, name: &str) -> usize {
    let out = common::cli(socket, &["service", "endpoints", name]);
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| !l.trim().is_empty())
        .count()
}

fn summary(what: &str, mut ms: Vec<f64>) {
    ms.sort_by(|a, b| a.partial_cmp(b).unwrap());
    println!(
        "{what:<44} n={:<3} p50 {:>8.0} ms  p99 {:>8.0} ms  max {:>8.0} ms",
        ms.len(),
        pct(&ms, 0.5),
        pct(&ms, 0.99),
        ms.last().copied().unwrap_or(0.0)
    );
}

const CHECK: [&str; 8] = [
    "--health-http",
    "/",
    "--health-interval",
    "1s",
    "--health-grace",
    "1s",
    "--health-failures",
    "2",
];

/// Process exit -> healthy again.
fn exit_rounds(rounds: usize) {
    let dir = common::shared_tempdir();
    let c = Cluster::start(dir.path(), 1, 8);
    c.server.ok(&["admin", "ports", "set", "43500-43599"]);
    let wd = dir.path().to_str().unwrap();
    let serve = format!(
        "echo $$ > {wd}/pid-$GPUQ_JOB_ID; exec python3 -m http.server $PORT --bind 127.0.0.1"
    );
    let mut args = vec![
        "service",
        "create",
        "web",
        "--replicas",
        "4",
        "--restart-delay",
        "0",
        "-D",
        wd,
    ];
    args.extend(CHECK);
    args.extend(["--wrap", &serve]);
    c.server.ok(&args);
    let socket = c.server.socket.clone();
    wait_for("4 endpoints", LONG, || endpoints(&socket, "web") == 4);
    let mut ms = Vec::new();
    for round in 0..rounds {
        let index = round % 4;
        let s = services(&socket, "web");
        let job = s.slots[index].job.expect("a job");
        let pid_file = dir.path().join(format!("pid-{job}"));
        wait_for("the pid file", LONG, || pid_file.exists());
        let pid: i32 = std::fs::read_to_string(&pid_file)
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        let t0 = Instant::now();
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGKILL,
        );
        wait_for("the replica healthy again", LONG, || {
            let s = services(&socket, "web");
            let r = &s.slots[index];
            r.job != Some(job) && r.endpoint.is_some()
        });
        ms.push(t0.elapsed().as_secs_f64() * 1000.0);
        wait_for("4 endpoints", LONG, || endpoints(&socket, "web") == 4);
    }
    summary("process exit -> healthy again", ms);
}

/// Node loss -> running on another node.
fn node_rounds(rounds: usize, ttl: u64) {
    let dir = common::shared_tempdir();
    let mut c = Cluster::start_with_ttl(dir.path(), 2, 4, ttl);
    c.server.ok(&[
        "service",
        "create",
        "web",
        "--gpus-per-node",
        "4",
        "--restart-delay",
        "0",
        "--",
        "sleep",
        "3600",
    ]);
    let socket = c.server.socket.clone();
    let running = |avoid: Option<&str>| {
        let s = services(&socket, "web");
        let r = &s.slots[0];
        r.endpoint.is_some() && r.node.as_deref().is_some_and(|n| Some(n) != avoid)
    };
    wait_for("the replica running", LONG, || running(None));
    let mut ms = Vec::new();
    for _ in 0..rounds {
        let lost = services(&socket, "web").slots[0].node.clone().unwrap();
        let i = c.agents.iter().position(|a| a.name == lost).unwrap();
        let t0 = Instant::now();
        c.agents[i].kill();
        let moved = Instant::now();
        while !running(Some(&lost)) {
            assert!(
                moved.elapsed() < LONG,
                "the replica did not move from {lost}:\n{}\n{}",
                c.server.ok(&["nodes"]),
                c.server.ok(&["service", "show", "web"])
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        ms.push(t0.elapsed().as_secs_f64() * 1000.0);
        // The lost node comes back for the next round.
        c.agents[i].spawn();
        wait_for("the agent back", LONG, || {
            let out = c.server.cli(&["nodes", "--json"]);
            let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
            v.as_array().is_some_and(|ns| {
                ns.iter()
                    .any(|n| n["name"] == lost.as_str() && n["connected"] == true)
            })
        });
    }
    let less_ttl: Vec<f64> = ms.iter().map(|m| m - ttl as f64 * 1000.0).collect();
    summary(&format!("node loss -> running elsewhere (TTL {ttl} s)"), ms);
    summary("  the same, less the TTL", less_ttl);
}

/// A rolling update of `n` HTTP replicas, watched by a client.
fn roll(n: usize) {
    let dir = common::shared_tempdir();
    let c = Cluster::start(dir.path(), 1, 8);
    c.server.ok(&["admin", "ports", "set", "43600-43699"]);
    let wd = dir.path().to_str().unwrap();
    let serve = |v: &str| format!("V={v}; exec python3 -m http.server $PORT --bind 127.0.0.1");
    let count = n.to_string();
    let mut args = vec!["service", "create", "web", "--replicas", &count, "-D", wd];
    args.extend(CHECK);
    let v1 = serve("1");
    args.extend(["--wrap", &v1]);
    c.server.ok(&args);
    let socket = c.server.socket.clone();
    wait_for("every replica serving", LONG, || {
        endpoints(&socket, "web") == n
    });

    let stop = Arc::new(AtomicBool::new(false));
    let poller = {
        let (stop, socket) = (stop.clone(), socket.clone());
        std::thread::spawn(move || {
            let (mut min, mut polls) = (usize::MAX, 0u64);
            while !stop.load(Ordering::Relaxed) {
                min = min.min(endpoints(&socket, "web"));
                polls += 1;
            }
            (min, polls)
        })
    };
    let v2 = serve("2");
    let t0 = Instant::now();
    c.server
        .ok(&["service", "update", "web", "-D", wd, "--wrap", &v2]);
    wait_for("the roll done", Duration::from_secs(600), || {
        let s = services(&socket, "web");
        s.version == 2
            && s.roll.is_none()
            && s.slots
                .iter()
                .all(|r| r.version == 2 && r.endpoint.is_some())
    });
    let total = t0.elapsed().as_secs_f64();
    stop.store(true, Ordering::Relaxed);
    let (min, polls) = poller.join().unwrap();
    println!(
        "rolling update of {n} replicas: {total:.1} s in all ({:.2} s a replica); \
         fewest endpoints seen {min} of {n} ({polls} polls)",
        total / n as f64
    );
}

async fn call(c: &mut LocalClient, req: ApiRequest) -> ApiResponse {
    match c.call(&req).await {
        Ok(ApiResponse::Error { kind, message, .. }) => panic!("{kind:?} {message}"),
        Ok(r) => r,
        Err(e) => panic!("{e}"),
    }
}

async fn read(c: &mut LocalClient, name: &str) -> ServiceInfo {
    let req = ApiRequest::Services {
        name: Some(name.to_string()),
    };
    match call(c, req).await {
        ApiResponse::Services { services } => services.into_iter().next().unwrap(),
        other => panic!("{other:?}"),
    }
}

/// `nodes` simulated nodes and a service of as many 8-GPU replicas.
fn fleet(nodes: u32, reads: usize) {
    let dir = tempfile::tempdir().unwrap();
    let server = common::Server::bootstrap(&dir.path().join("server"));
    let token = server.ok(&["token", "create"]).trim().to_string();
    let t0 = Instant::now();
    let mut sim = common::SimAgents::spawn(&server, &dir.path().join("sim"), nodes, &token, &[]);
    sim.wait_connected(&server, Duration::from_secs(60 + u64::from(nodes) / 5));
    println!(
        "{nodes} simulated nodes connected in {:.1} s",
        t0.elapsed().as_secs_f64()
    );
    let socket = server.socket.clone();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let mut c = LocalClient::connect(&socket).await.unwrap();
        let spec = gpuq::sim::workload::sim_spec("svc", 1, 8, Duration::from_secs(36_000), 0);
        let req = ApiRequest::ServiceCreate {
            name: "fleet".into(),
            spec: Box::new(spec),
            settings: ServiceSettings {
                replicas: nodes,
                restart_delay_secs: 5,
                health: None,
                ..Default::default()
            },
        };
        let t0 = Instant::now();
        call(&mut c, req).await;
        let acked = t0.elapsed();
        let last = loop {
            let s = read(&mut c, "fleet").await;
            let up = s.slots.iter().filter(|r| r.endpoint.is_some()).count();
            if up == nodes as usize {
                break up;
            }
            assert!(
                t0.elapsed() < Duration::from_secs(600),
                "{up} of {nodes} replicas running after 600 s"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        println!(
            "service of {nodes} replicas: create acknowledged in {:.0} ms, all {last} running \
             in {:.2} s",
            acked.as_secs_f64() * 1000.0,
            t0.elapsed().as_secs_f64()
        );
        let mut api = Vec::new();
        for _ in 0..reads {
            let t = Instant::now();
            read(&mut c, "fleet").await;
            api.push(t.elapsed().as_secs_f64() * 1000.0);
        }
        summary(&format!("API read of {nodes} replicas"), api);
    });
    let mut cli = Vec::new();
    for _ in 0..reads {
        let t = Instant::now();
        let n = endpoints(&socket, "fleet");
        cli.push(t.elapsed().as_secs_f64() * 1000.0);
        assert_eq!(n, nodes as usize);
    }
    summary(&format!("`gpuq service endpoints` of {nodes}"), cli);
    drop(sim);
}

fn main() {
    let small = smoke();
    let env = |k: &str, full: u64, smoke: u64| common::env_u64(k, if small { smoke } else { full });
    let skip = |k: &str| std::env::var(k).is_ok_and(|v| v == "0");
    println!("# services (cores: {})", num_cpus());
    if !skip("GPUQ_BENCH_SVC_ROUNDS") {
        exit_rounds(env("GPUQ_BENCH_SVC_ROUNDS", 10, 3) as usize);
    }
    if !skip("GPUQ_BENCH_SVC_NODE_ROUNDS") {
        node_rounds(
            env("GPUQ_BENCH_SVC_NODE_ROUNDS", 5, 2) as usize,
            env("GPUQ_BENCH_SVC_TTL", 3, 3),
        );
    }
    if !skip("GPUQ_BENCH_SVC_ROLL") {
        roll(env("GPUQ_BENCH_SVC_ROLL", 16, 4) as usize);
    }
    if !skip("GPUQ_BENCH_SVC_NODES") {
        fleet(
            env("GPUQ_BENCH_SVC_NODES", 1000, 50) as u32,
            env("GPUQ_BENCH_SVC_READS", 20, 5) as usize,
        );
    }
}

fn num_cpus() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}
