//! Agent heartbeat load: a real `gpuq server` and a `gpuq sim agents`
//! process of N agents, each with its own QUIC connection, connected and
//! idle (no jobs): what the server pays to keep them. Every agent sends a
//! heartbeat frame each second and QUIC keeps the connection alive (2 s
//! keep-alive); nothing else flows.
//!
//! Measured over a window once all are connected: the CPU of each process
//! (from /proc), the server's RSS, and the UDP datagrams of both directions,
//! counted in a network namespace holding only these two processes (its
//! /proc/PID/net/snmp), so other traffic on the box does not count. Without
//! root (no namespace) the datagrams are not measured and the row says so.

use std::time::{Duration, Instant};

use crate::common;

/// UDP datagrams received in `pid`'s network namespace (InDatagrams).
fn udp_in(pid: u32) -> Option<u64> {
    let snmp = std::fs::read_to_string(format!("/proc/{pid}/net/snmp")).ok()?;
    let mut udp = snmp.lines().filter(|l| l.starts_with("Udp:"));
    let (names, values) = (udp.next()?, udp.next()?);
    let i = names.split_whitespace().position(|n| n == "InDatagrams")?;
    values.split_whitespace().nth(i)?.parse().ok()
}

/// One fleet of `agents`, idle for `window`: the row's JSON.
pub fn one(agents: u32, window: Duration) -> serde_json::Value {
    let dir = tempfile::tempdir().unwrap();
    let root = common::is_root();
    // A namespace of our own (10.88.143.0/24, names `gqfhb...`), removed on drop.
    let mut net = root.then(|| common::netns::Net::new("hb", 143));
    let host = net.as_mut().map(|n| n.add_host());
    let mut server = common::Server::joining(&dir.path().join("server"), "s1", "", "");
    server.mode = vec!["--bootstrap".into()];
    // Agents silent for a while under a loaded box must not be marked down.
    server.node_ttl_secs = 30;
    if let Some(h) = &host {
        server.host = h.ip.clone();
        server.netns = Some(h.ns.clone());
    }
    server.start();
    let token = server.ok(&["token", "create"]).trim().to_string();
    let t0 = Instant::now();
    let mut sim = common::SimAgents::spawn(&server, &dir.path().join("sim"), agents, &token, &[]);
    sim.wait_connected(&server, Duration::from_secs(120 + u64::from(agents) / 5));
    let up_s = t0.elapsed().as_secs_f64();
    // Let the joins' aftermath (inventory, first reconciles) settle.
    std::thread::sleep(Duration::from_secs(3).min(window));
    let (spid, gpid) = (server.pid().unwrap(), sim.pid().unwrap());
    let (s0, g0, d0) = (
        common::cpu::own_cpu_s(spid),
        common::cpu::own_cpu_s(gpid),
        udp_in(spid),
    );
    let t = Instant::now();
    std::thread::sleep(window);
    let secs = t.elapsed().as_secs_f64();
    let (s1, g1, d1) = (
        common::cpu::own_cpu_s(spid),
        common::cpu::own_cpu_s(gpid),
        udp_in(spid),
    );
    let server_cpu = (s1 - s0) / secs * 100.0;
    let datagrams = match (root, d0, d1) {
        (true, Some(a), Some(b)) => Some((b - a) as f64 / secs),
        _ => None,
    };
    let n = f64::from(agents);
    let row = serde_json::json!({
        "bench": "heartbeat_idle",
        "agents": agents,
        "window_s": secs,
        "fleet_up_s": up_s,
        "server_cpu_pct": server_cpu,
        "server_cpu_pct_per_1000_agents": server_cpu / n * 1000.0,
        "sim_cpu_pct": (g1 - g0) / secs * 100.0,
        "server_rss_mib": common::cpu::rss_mib(spid),
        "sim_rss_mib": common::cpu::rss_mib(gpid),
        "heartbeats_per_s": n,
        "udp_datagrams_per_s": datagrams,
        "udp_datagrams_per_s_per_agent": datagrams.map(|d| d / n),
    });
    drop(sim);
    drop(server);
    drop(net);
    row
}

/// Runs each fleet size and prints the table.
pub fn run(counts: &[u64], window: Duration) -> Vec<serde_json::Value> {
    if counts.is_empty() {
        return vec![];
    }
    println!(
        "\nidle agents over QUIC ({} s window): {:>6} {:>8} {:>11} {:>8} {:>9} {:>9} {:>10} {:>8}",
        window.as_secs(),
        "agents",
        "srv cpu%",
        "%/1k agent",
        "sim cpu%",
        "srv MiB",
        "sim MiB",
        "dgram/s",
        "/agent"
    );
    let mut rows = Vec::new();
    for &n in counts {
        let r = one(n as u32, window);
        let f = |k: &str| r[k].as_f64().unwrap_or(f64::NAN);
        let dg = |k: &str| {
            r[k].as_f64()
                .map_or("n/a (root)".to_string(), |v| format!("{v:.1}"))
        };
        println!(
            "{:>38} {:>6} {:>8.1} {:>11.2} {:>8.1} {:>9.0} {:>9.0} {:>10} {:>8}",
            "",
            n,
            f("server_cpu_pct"),
            f("server_cpu_pct_per_1000_agents"),
            f("sim_cpu_pct"),
            f("server_rss_mib"),
            f("sim_rss_mib"),
            dg("udp_datagrams_per_s"),
            dg("udp_datagrams_per_s_per_agent"),
        );
        rows.push(r);
    }
    println!(
        "(each agent: 1 heartbeat frame/s and a 2 s QUIC keep-alive; dgram/s counts both \
         directions in a namespace holding only the server and the fleet)"
    );
    rows
}
