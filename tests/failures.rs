//! Nodes and GPUs fail: liveness and requeue, agents restarting under running
//! jobs, the control plane going away, GPU faults and health checks. Real
//! server and agent processes; tasks are real processes under shims.

mod common;

use std::time::Duration;

use common::{Agent, Cluster};

const LONG: Duration = Duration::from_secs(60);

fn node_of(job: &serde_json::Value) -> String {
    job["run"]["allocation"]["nodes"][0]["node"]
        .as_str()
        .expect("an allocated job")
        .to_string()
}

fn node_info(c: &Cluster, name: &str) -> serde_json::Value {
    let v: serde_json::Value = serde_json::from_str(&c.server.ok(&["nodes", "--json"])).unwrap();
    v.as_array()
        .unwrap()
        .iter()
        .find(|n| n["name"] == name)
        .cloned()
        .unwrap_or_else(|| panic!("node {name} missing: {v}"))
}

#[test]
fn a_killed_agent_s_node_goes_down_and_its_job_completes_elsewhere() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = Cluster::start_with_ttl(dir.path(), 2, 8, 2);
    let w = dir.path().to_str().unwrap();
    let id = c.submit(&[
        "--gpus-per-node",
        "8",
        "-D",
        w,
        "--",
        "sh",
        "-c",
        "echo $GPUQ_NODELIST > attempt-$GPUQ_RESTART_COUNT.txt; sleep 2",
    ]);
    let job = c.wait_started(&id, LONG);
    let first = node_of(&job);
    let idx = c.agents.iter().position(|a| a.name == first).unwrap();
    c.agents[idx].kill();
    let done = c.wait_state(&id, "COMPLETED", LONG);
    assert_eq!(done["restart_count"], 1, "{done}");
    let second = node_of(&done);
    assert_ne!(second, first, "it ran again on the other node");
    assert_eq!(
        std::fs::read_to_string(dir.path().join("attempt-1.txt"))
            .unwrap()
            .trim(),
        second
    );
    assert_eq!(node_info(&c, &first)["state"], "down");
}

#[test]
fn an_agent_restarted_within_the_ttl_re_adopts_its_running_task() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = Cluster::start_with_ttl(dir.path(), 1, 8, 8);
    let w = dir.path().to_str().unwrap();
    let id = c.submit(&["-D", w, "--", "sh", "-c", "sleep 3; exit 5"]);
    c.wait_started(&id, LONG);
    c.agents[0].kill();
    c.agents[0].spawn();
    let j = c.wait_state(&id, "FAILED", LONG);
    assert_eq!(j["exit_code"], 5, "the task's own exit code: {j}");
    assert_eq!(j["restart_count"], 0, "never requeued");
    assert_eq!(node_info(&c, "n1")["state"], "up");
}

#[test]
fn a_task_that_ends_while_its_agent_is_down_is_reported_after_restart() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = Cluster::start_with_ttl(dir.path(), 1, 8, 30);
    let w = dir.path().to_str().unwrap();
    let marker = dir.path().join("ended");
    let id = c.submit(&[
        "-D",
        w,
        "--",
        "sh",
        "-c",
        &format!("sleep 1; touch {}; exit 4", marker.display()),
    ]);
    c.wait_started(&id, LONG);
    c.agents[0].kill();
    common::wait_for("the task to end", LONG, || marker.exists());
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(c.job(&id)["state"], "RUNNING", "nobody has reported it yet");
    c.agents[0].spawn();
    let j = c.wait_state(&id, "FAILED", LONG);
    assert_eq!(j["exit_code"], 4);
}

#[test]
fn a_critical_xid_drains_the_node_and_an_application_xid_does_not() {
    let dir = tempfile::tempdir().unwrap();
    let c = Cluster::start(dir.path(), 2, 8);
    let faults = dir.path().join("n1/faults");
    std::fs::write(&faults, "xid 3 13\n").unwrap();
    common::wait_for("the fault file to be read", LONG, || !faults.exists());
    std::thread::sleep(Duration::from_millis(1500));
    let n1 = node_info(&c, "n1");
    assert_eq!(n1["state"], "up", "XID 13 is the application's: {n1}");
    assert_eq!(n1["inventory"]["gpus"][3]["healthy"], true);

    std::fs::write(&faults, "xid 3 79\n").unwrap();
    common::wait_for("n1 to drain", LONG, || {
        node_info(&c, "n1")["state"] == "drained"
    });
    let n1 = node_info(&c, "n1");
    let reason = n1["reason"].as_str().unwrap();
    assert!(
        reason.contains("GPU 3") && reason.contains("79"),
        "{reason}"
    );
    assert_eq!(n1["inventory"]["gpus"][3]["healthy"], false);
    let out = c.server.ok(&["nodes"]);
    assert!(out.contains("drained") && out.contains("XID 79"), "{out}");
    // New work avoids the drained node.
    for _ in 0..3 {
        let id = c.submit(&[
            "--gpus-per-node",
            "1",
            "-D",
            dir.path().to_str().unwrap(),
            "--",
            "true",
        ]);
        let j = c.wait_state(&id, "COMPLETED", LONG);
        assert_eq!(node_of(&j), "n2");
    }
}

#[test]
fn a_failing_health_check_drains_and_a_passing_one_resumes() {
    let dir = tempfile::tempdir().unwrap();
    let c = Cluster::start(dir.path(), 1, 8);
    let token = c.server.ok(&["token", "create"]).trim().to_string();
    let flag = dir.path().join("health-code");
    std::fs::write(&flag, "1").unwrap();
    let extra = format!(
        "[agent.health_check]\ncommand = \"echo disk check; exit $(cat {})\"\ninterval_secs = 1\ntimeout_secs = 5\n",
        flag.display()
    );
    let _n2 = Agent::start_with(&c.server, &dir.path().join("n2"), "n2", 8, &token, &extra);
    common::wait_for("n2 to drain", LONG, || {
        node_info(&c, "n2")["state"] == "drained"
    });
    let reason = node_info(&c, "n2")["reason"].as_str().unwrap().to_string();
    assert!(
        reason.contains("health check failed") && reason.contains("disk check"),
        "{reason}"
    );
    std::fs::write(&flag, "0").unwrap();
    common::wait_for("n2 to resume", LONG, || {
        node_info(&c, "n2")["state"] == "up"
    });

    // An admin's drain is not undone by a passing check.
    c.server
        .ok(&["node", "drain", "n2", "--reason", "replace PSU"]);
    std::thread::sleep(Duration::from_millis(2500));
    let n2 = node_info(&c, "n2");
    assert_eq!(n2["state"], "drained");
    assert!(n2["reason"].as_str().unwrap().contains("replace PSU"));
    c.server.ok(&["node", "resume", "n2"]);
    assert_eq!(node_info(&c, "n2")["state"], "up");
    let out = c.server.cli(&["node", "drain", "n9", "--reason", "x"]);
    assert_eq!(out.status.code(), Some(1));
}

#[test]
fn drain_now_requeues_and_a_drained_node_takes_no_new_work() {
    let dir = tempfile::tempdir().unwrap();
    let c = Cluster::start(dir.path(), 2, 8);
    let w = dir.path().to_str().unwrap();
    let id = c.submit(&["--gpus-per-node", "8", "-D", w, "--", "sleep", "2"]);
    let j = c.wait_started(&id, LONG);
    let first = node_of(&j);
    c.server
        .ok(&["node", "drain", &first, "--reason", "maintenance", "--now"]);
    let j = c.wait_state(&id, "COMPLETED", LONG);
    assert_eq!(j["restart_count"], 1);
    assert_ne!(node_of(&j), first);
}

#[test]
fn the_control_plane_down_for_a_minute_does_not_disturb_a_running_job() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = Cluster::start_with_ttl(dir.path(), 1, 8, 5);
    let w = dir.path().to_str().unwrap();
    let marker = dir.path().join("finished");
    let id = c.submit(&[
        "-D",
        w,
        "--",
        "sh",
        "-c",
        &format!("sleep 20; touch {}", marker.display()),
    ]);
    c.wait_started(&id, LONG);
    c.server.kill();
    std::thread::sleep(Duration::from_secs(60));
    assert!(
        marker.exists(),
        "the task ran to its end without a control plane"
    );
    c.server.start();
    let j = c.wait_state(&id, "COMPLETED", LONG);
    assert_eq!(
        j["restart_count"], 0,
        "nothing was requeued by mistake: {j}"
    );
    assert_eq!(j["exit_code"], 0);
}

/// The nodes of a job's current attempt, in node-rank order, from
/// `gpuq show --json`'s placement.
fn placed_nodes(job: &serde_json::Value) -> Vec<String> {
    job["placement"]
        .as_array()
        .expect("a placement")
        .iter()
        .map(|p| p["node"].as_str().unwrap().to_string())
        .collect()
}

#[test]
fn a_gang_that_loses_a_node_restarts_on_its_healthy_nodes_plus_a_spare() {
    let dir = tempfile::tempdir().unwrap();
    // Four nodes for the gang and a fifth, idle, as the spare.
    let mut c = Cluster::start_with_ttl(dir.path(), 5, 8, 2);
    let w = dir.path().to_str().unwrap();
    let id = c.submit(&[
        "--nodes",
        "4",
        "--gpus-per-node",
        "8",
        "-D",
        w,
        "--",
        "sh",
        "-c",
        "echo $GPUQ_NODELIST $TORCHELASTIC_RESTART_COUNT > a$GPUQ_RESTART_COUNT-r$GPUQ_NODE_RANK.txt; \
         if [ $GPUQ_RESTART_COUNT = 0 ]; then sleep 600; else sleep 1; fi",
    ]);
    let job = c.wait_started(&id, LONG);
    let first = placed_nodes(&job);
    assert_eq!(first.len(), 4, "{job}");
    let spare: Vec<&str> = ["n1", "n2", "n3", "n4", "n5"]
        .into_iter()
        .filter(|n| !first.iter().any(|f| f == n))
        .collect();
    assert_eq!(spare.len(), 1);
    // Kill the agent of node rank 1.
    let lost = first[1].clone();
    let idx = c.agents.iter().position(|a| a.name == lost).unwrap();
    c.agents[idx].kill();

    let done = c.wait_state(&id, "COMPLETED", LONG);
    assert_eq!(done["restart_count"], 1, "{done}");
    let second = placed_nodes(&done);
    let mut want = first.clone();
    want[1] = spare[0].to_string();
    assert_eq!(
        second, want,
        "the three healthy nodes keep their ranks, the spare takes the lost one"
    );
    for rank in 0..4 {
        let text = std::fs::read_to_string(dir.path().join(format!("a1-r{rank}.txt"))).unwrap();
        assert!(
            text.trim().ends_with(" 1"),
            "TORCHELASTIC_RESTART_COUNT=1: {text}"
        );
    }
    assert_eq!(node_info(&c, &lost)["state"], "down");

    // `gpuq show` lists the placement per rank with GPU UUIDs.
    let text = c.server.ok(&["show", &id]);
    assert!(text.contains("Placement (attempt 1):"), "{text}");
    assert!(text.contains("NODE_RANK"), "{text}");
    let uuid = done["placement"][1]["gpus"][0]["uuid"].as_str().unwrap();
    assert!(uuid.starts_with("GPU-"), "{done}");
    assert!(text.contains(uuid), "{text}");
}
