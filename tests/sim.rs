//! The simulated fleet against a real server: a `gpuq server` process and a
//! `gpuq sim agents` process on loopback, driven through the real CLI.

mod common;

use std::collections::BTreeSet;
use std::time::Duration;

use common::{cli_env, Server, SimAgents};

const LONG: Duration = Duration::from_secs(60);

fn wait_final(server: &Server, id: &str) -> serde_json::Value {
    let start = std::time::Instant::now();
    loop {
        let j = server.job(id);
        let state = j["state"].as_str().unwrap_or_default().to_string();
        if !["PENDING", "RUNNING", "COMPLETING"].contains(&state.as_str()) {
            return j;
        }
        assert!(
            start.elapsed() < LONG,
            "job {id} still {state}: {j}\n--- server ---\n{}",
            server.log()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn submit(server: &Server, env: &[(&str, &str)], args: &[&str]) -> String {
    let mut full = vec!["submit", "--parsable"];
    full.extend_from_slice(args);
    let out = cli_env(&server.socket, &full, env);
    assert!(
        out.status.success(),
        "submit failed: {}",
        common::stderr(&out)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

#[test]
fn twenty_simulated_nodes_register_and_run_a_sixteen_node_gang() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::bootstrap(&dir.path().join("server"));
    let token = server.ok(&["token", "create"]).trim().to_string();
    let mut sim = SimAgents::spawn(
        &server,
        &dir.path().join("sim"),
        20,
        &token,
        &["--topology-leaves", "16", "--compression", "10"],
    );
    sim.wait_connected(&server, LONG);

    let nodes: Vec<serde_json::Value> =
        serde_json::from_str(&server.ok(&["nodes", "--json"])).unwrap();
    let names: Vec<&str> = nodes.iter().filter_map(|n| n["name"].as_str()).collect();
    let want: Vec<String> = (1..=20).map(|i| format!("sim{i:04}")).collect();
    assert_eq!(names, want);
    for n in &nodes {
        assert_eq!(n["state"], "up");
        assert_eq!(n["inventory"]["gpus"].as_array().unwrap().len(), 8);
        let leaf = if n["name"].as_str() <= Some("sim0016") {
            "spine1/leaf1"
        } else {
            "spine1/leaf2"
        };
        assert_eq!(n["inventory"]["topology"], leaf, "{}", n["name"]);
    }
    let table = server.ok(&["nodes"]);
    assert_eq!(
        table.lines().filter(|l| l.starts_with("sim")).count(),
        20,
        "{table}"
    );

    // 2 s declared, 0.2 s at compression 10.
    let gang = submit(
        &server,
        &[("GPUQ_SIM_DURATION_MS", "2000")],
        &["--nodes", "16", "--gpus-per-node", "8", "--", "train"],
    );
    let j = wait_final(&server, &gang);
    assert_eq!(j["state"], "COMPLETED", "{j}");
    let run = &j["run"];
    assert_eq!(run["started"].as_array().unwrap().len(), 16, "{j}");
    let ended = run["ended"].as_object().unwrap();
    assert_eq!(ended.len(), 16);
    assert!(ended.values().all(|e| e == "Completed"), "{j}");
    let placed: BTreeSet<&str> = run["allocation"]["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n["node"].as_str().unwrap())
        .collect();
    assert_eq!(placed.len(), 16, "16 distinct nodes: {placed:?}");

    // A declared exit code fails the job with it.
    let failing = submit(
        &server,
        &[("GPUQ_SIM_DURATION_MS", "100"), ("GPUQ_SIM_EXIT", "3")],
        &["--nodes", "2", "--gpus-per-node", "8", "--", "train"],
    );
    let j = wait_final(&server, &failing);
    assert_eq!(j["state"], "FAILED", "{j}");
    assert_eq!(j["exit_code"], 3, "{j}");

    // Cancel stops a long simulated task.
    let long = submit(
        &server,
        &[("GPUQ_SIM_DURATION_MS", "3600000")],
        &["--nodes", "4", "--gpus-per-node", "8", "--", "train"],
    );
    common::wait_for("the long job's ranks to start", LONG, || {
        server.job(&long)["run"]["started"]
            .as_array()
            .is_some_and(|s| s.len() == 4)
    });
    server.ok(&["cancel", &long]);
    let j = wait_final(&server, &long);
    assert_eq!(j["state"], "CANCELLED", "{j}");
    assert!(j["run"]["ended"]
        .as_object()
        .unwrap()
        .values()
        .all(|e| e == "Cancelled"));
    drop(sim);
}

#[test]
fn identities_in_a_data_dir_survive_a_restart_without_rejoining() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::bootstrap(&dir.path().join("server"));
    let created: serde_json::Value =
        serde_json::from_str(&server.ok(&["token", "create", "--json"])).unwrap();
    let token = created["token"].as_str().unwrap().to_string();
    let ids = dir.path().join("ids");
    let ids_flag = ["--data-dir", ids.to_str().unwrap()];
    let mut sim = SimAgents::spawn(&server, &dir.path().join("sim1"), 3, &token, &ids_flag);
    sim.wait_connected(&server, LONG);
    drop(sim);
    assert!(ids.join("sim0002/tls/node.crt").exists());

    // With the token revoked, only the kept identities can get them back in.
    server.ok(&["token", "revoke", created["info"]["id"].as_str().unwrap()]);
    let mut again = SimAgents::spawn(&server, &dir.path().join("sim2"), 3, &token, &ids_flag);
    again.wait_connected(&server, LONG);
    let fresh = SimAgents::spawn(
        &server,
        &dir.path().join("sim3"),
        1,
        &token,
        &["--first", "9"],
    );
    let start = std::time::Instant::now();
    let log = loop {
        let log = fresh.log();
        if log.contains("could not join") || start.elapsed() > LONG {
            break log;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(
        log.contains("revoked"),
        "a new node needs a valid token: {log}"
    );
}
