//! MIG slices end to end: an agent whose fake GPU 0 is partitioned into
//! seven 1g.10gb instances and whose GPU 1 stays whole, real jobs under
//! shims, the real CLI.

mod common;

use std::collections::BTreeSet;
use std::time::Duration;

use common::{stderr, Agent, AgentHw, Gated, Server};

const LONG: Duration = Duration::from_secs(60);

#[test]
fn seven_slice_jobs_share_one_gpu_an_eighth_waits_and_a_whole_gpu_job_takes_the_whole_gpu() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::bootstrap(&dir.path().join("server"));
    let token = server.ok(&["token", "create"]).trim().to_string();
    let hw = AgentHw {
        gpus: 2,
        mig: r#"mig_per_gpu = ["1g.10gb:7"]"#,
        ..AgentHw::default()
    };
    let _agent = Agent::start_hw(&server, &dir.path().join("n1"), "n1", hw, &token, "", None);

    let nodes = server.ok(&["nodes"]);
    assert!(nodes.contains("0/8 (1 whole, 7x 1g.10gb)"), "{nodes}");
    let node = server.ok(&["slurm", "scontrol", "show", "node", "n1"]);
    assert!(
        node.contains("Gres=gpu:nvidia_h100_80gb_hbm3:1,gpu:1g.10gb:7"),
        "{node}"
    );

    let jobs = Gated::new(dir.path(), "\"$CUDA_VISIBLE_DEVICES\"");
    let submit = |gpus: &[&str]| jobs.submit(&server, gpus);
    // The three spellings of a slice request.
    let mut slices: Vec<String> = Vec::new();
    for _ in 0..3 {
        slices.push(submit(&["--gpus-per-node", "1g.10gb:1"]));
    }
    for _ in 0..2 {
        slices.push(submit(&["--gres", "gpu:1g.10gb:1"]));
    }
    for _ in 0..2 {
        slices.push(submit(&["--gpus", "1g.10gb:1"]));
    }
    let whole = submit(&["--gpus-per-node", "1"]);
    let eighth = submit(&["--gpus-per-node", "1g.10gb:1"]);

    for id in slices.iter().chain([&whole]) {
        server.wait_job(id, "RUNNING", LONG);
    }
    let mut waiting = serde_json::Value::Null;
    common::wait_for("the eighth slice job's reason", LONG, || {
        waiting = server.job(&eighth);
        waiting["reason"].as_str().is_some_and(|r| !r.is_empty())
    });
    assert_eq!(waiting["state"], "PENDING", "{waiting}");
    assert_eq!(waiting["reason_code"], "Resources", "{waiting}");
    assert_eq!(
        waiting["reason"],
        "waiting for resources: not enough free 1g.10gb MIG slices, CPUs or memory now",
        "{waiting}"
    );

    let output = |id: &str| jobs.said(id);
    // Each slice job sees exactly one instance, by its MIG UUID, and the one
    // `gpuq show` names; no two share one.
    let mut seen = BTreeSet::new();
    for id in &slices {
        let visible = output(id);
        assert!(
            visible.starts_with("MIG-") && !visible.contains(','),
            "job {id}: {visible}"
        );
        let j = server.job(id);
        assert_eq!(
            j["placement"][0]["gpus"][0]["uuid"],
            visible.as_str(),
            "{j}"
        );
        assert!(seen.insert(visible));
    }
    assert_eq!(seen.len(), 7);
    // The whole-GPU job got GPU 1, the one not partitioned, by its index.
    assert_eq!(output(&whole), "1");
    let nodes = server.ok(&["nodes"]);
    assert!(nodes.contains("8/8 (1 whole, 7x 1g.10gb)"), "{nodes}");

    jobs.open();
    for id in slices.iter().chain([&whole, &eighth]) {
        let j = server.wait_job(id, "COMPLETED", LONG);
        assert_eq!(j["exit_code"], 0, "{j}");
    }
}

#[test]
fn slice_requests_the_cluster_cannot_hold_are_refused_at_submit() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::bootstrap(&dir.path().join("server"));
    let token = server.ok(&["token", "create"]).trim().to_string();
    let hw = AgentHw {
        gpus: 1,
        mig: r#"mig = "3g.40gb:2""#,
        ..AgentHw::default()
    };
    let _agent = Agent::start_hw(&server, &dir.path().join("n1"), "n1", hw, &token, "", None);

    let refused = |args: &[&str], want: &str| {
        let mut full = vec!["submit"];
        full.extend_from_slice(args);
        full.extend_from_slice(&["--", "true"]);
        let o = server.cli(&full);
        assert_eq!(o.status.code(), Some(1), "{args:?}: {}", stderr(&o));
        assert!(stderr(&o).contains(want), "{args:?}: {}", stderr(&o));
    };
    refused(
        &["--gpus-per-node", "1g.7gb:1"],
        "unknown MIG profile \"1g.7gb\"; known profiles: 1g.10gb, 1g.20gb, 2g.20gb, 3g.40gb, 4g.40gb, 7g.80gb, 1g.18gb",
    );
    // Another model's profile is known, but no node has it.
    refused(
        &["--gpus", "1g.18gb:1"],
        "no node has MIG slices of profile 1g.18gb; the cluster has: 3g.40gb",
    );
    refused(
        &["--gres", "gpu:1g.10gb:1"],
        "no node has MIG slices of profile 1g.10gb; the cluster has: 3g.40gb",
    );
    refused(
        &["--gpus-per-node", "3g.40gb:3"],
        "asks for 3 GPUs per node; the largest matching node has 2",
    );
    refused(
        &["--gpus-per-node", "1"],
        "asks for whole GPUs; every GPU of the nodes is partitioned into MIG slices (3g.40gb)",
    );
    // Two 3g.40gb instances on one GPU: a job asking for both runs.
    let id = server
        .ok(&[
            "submit",
            "--parsable",
            "--gpus-per-node",
            "3g.40gb:2",
            "--",
            "true",
        ])
        .trim()
        .to_string();
    server.wait_job(&id, "COMPLETED", LONG);
}

/// `gpuq nodes --json`'s entry for `name`.
fn node_json(server: &Server, name: &str) -> serde_json::Value {
    let all: serde_json::Value = serde_json::from_str(&server.ok(&["nodes", "--json"])).unwrap();
    all.as_array()
        .and_then(|ns| ns.iter().find(|n| n["name"] == name).cloned())
        .unwrap_or_default()
}

fn profiles(node: &serde_json::Value) -> Vec<String> {
    node["inventory"]["gpus"]
        .as_array()
        .map(|gs| {
            gs.iter()
                .map(|g| g["mig"]["profile"].as_str().unwrap_or("whole").to_string())
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn mig_set_waits_for_the_jobs_or_requeues_them_and_a_failure_leaves_the_node_drained() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::bootstrap(&dir.path().join("server"));
    let token = server.ok(&["token", "create"]).trim().to_string();
    let agent_dir = dir.path().join("n1");
    let hw = AgentHw {
        gpus: 1,
        ..AgentHw::default()
    };
    let _agent = Agent::start_hw(&server, &agent_dir, "n1", hw, &token, "", None);
    let jobs = Gated::new(dir.path(), "started");
    let submit = |gpus: &str| jobs.submit(&server, &["--gpus-per-node", gpus]);

    // A whole-GPU job runs; the repartition waits for it.
    let whole = submit("1");
    server.wait_job(&whole, "RUNNING", LONG);
    server.ok(&["node", "mig", "set", "n1", "--layout", "1g.10gb:7"]);
    let n = node_json(&server, "n1");
    assert_eq!(n["state"], "drained", "{n}");
    assert_eq!(
        n["reason"], "MIG repartition to 1g.10gb:7: waiting for its jobs to end (by root)",
        "{n}"
    );
    assert_eq!(profiles(&n), ["whole"]);
    assert_eq!(server.job(&whole)["state"], "RUNNING");

    // Once it ended, the agent applies the layout and the node resumes.
    jobs.open();
    server.wait_job(&whole, "COMPLETED", LONG);
    common::wait_for("the node back up in 7 slices", LONG, || {
        let n = node_json(&server, "n1");
        n["state"] == "up" && profiles(&n) == vec!["1g.10gb".to_string(); 7]
    });
    jobs.close();
    let slice = submit("1g.10gb:1");
    server.wait_job(&slice, "RUNNING", LONG);

    // --now requeues what runs there; `none` gives the whole GPU back.
    server.ok(&["node", "mig", "set", "n1", "--layout", "none", "--now"]);
    common::wait_for("the node back up whole", LONG, || {
        let n = node_json(&server, "n1");
        n["state"] == "up" && profiles(&n) == ["whole"]
    });
    let requeued = server.job(&slice);
    assert_eq!(requeued["state"], "PENDING", "{requeued}");
    assert_eq!(requeued["restart_count"], 1, "{requeued}");
    server.ok(&["cancel", &slice]);

    // A failure midway leaves the node drained, saying why, with its GPUs
    // as they were: never half-configured and schedulable.
    std::fs::write(agent_dir.join("mig-fail"), "").unwrap();
    server.ok(&["node", "mig", "set", "n1", "--layout", "3g.40gb:2"]);
    let mut n = serde_json::Value::Null;
    common::wait_for("the failure's reason", LONG, || {
        n = node_json(&server, "n1");
        n["reason"].as_str().is_some_and(|r| r.contains("failed"))
    });
    assert_eq!(n["state"], "drained", "{n}");
    assert!(
        n["reason"].as_str().unwrap().starts_with(
            "MIG repartition to 3g.40gb:2 failed: simulated NVML failure (mig-fail file present)"
        ),
        "{n}"
    );
    assert_eq!(profiles(&n), ["whole"]);
    std::fs::remove_file(agent_dir.join("mig-fail")).unwrap();
    server.ok(&["node", "resume", "n1"]);
    assert_eq!(node_json(&server, "n1")["state"], "up");

    // Layouts the GPU cannot hold, and unknown nodes, are refused.
    for (args, want) in [
        (
            ["node", "mig", "set", "n1", "--layout", "1g.20gb:5"],
            "needs 5 compute slices and 10 memory slices; a GPU has 7 and 8",
        ),
        (
            ["node", "mig", "set", "n1", "--layout", "2g.15gb:1"],
            "unknown MIG profile \"2g.15gb\"",
        ),
        (
            ["node", "mig", "set", "n9", "--layout", "1g.10gb:7"],
            "node n9 does not exist",
        ),
        (
            ["node", "mig", "set", "n1", "--layout", "1g.18gb:7"],
            "node n1's GPU 0 is a NVIDIA H100 80GB HBM3: the H100 80GB has no MIG profile \
             1g.18gb; it supports 1g.10gb, 1g.20gb, 2g.20gb, 3g.40gb, 4g.40gb, 7g.80gb",
        ),
    ] {
        let o = server.cli(&args);
        assert_eq!(o.status.code(), Some(1), "{args:?}: {}", stderr(&o));
        assert!(stderr(&o).contains(want), "{args:?}: {}", stderr(&o));
    }
    assert_eq!(node_json(&server, "n1")["state"], "up");
}

#[test]
fn a_services_replicas_run_on_mig_slices() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::bootstrap(&dir.path().join("server"));
    let token = server.ok(&["token", "create"]).trim().to_string();
    let hw = AgentHw {
        gpus: 1,
        mig: r#"mig_per_gpu = ["1g.10gb:7"]"#,
        ..AgentHw::default()
    };
    let _agent = Agent::start_hw(&server, &dir.path().join("n1"), "n1", hw, &token, "", None);
    let out = dir.path().join("out");
    std::fs::create_dir_all(&out).unwrap();
    let said = server.ok(&[
        "service",
        "create",
        "infer",
        "--replicas",
        "3",
        "--gpus-per-node",
        "1g.10gb:1",
        "-D",
        out.to_str().unwrap(),
        "--wrap",
        "echo $CUDA_VISIBLE_DEVICES > r$GPUQ_REPLICA; exec sleep 300",
    ]);
    assert!(said.contains("service infer created"), "{said}");
    // Each replica sees one instance of its own, by its MIG UUID.
    let mut seen = BTreeSet::new();
    for i in 0..3 {
        let file = out.join(format!("r{i}"));
        let mut text = String::new();
        common::wait_for(&format!("replica {i}'s GPU"), LONG, || {
            text = std::fs::read_to_string(&file).unwrap_or_default();
            !text.trim().is_empty()
        });
        let uuid = text.trim().to_string();
        assert!(uuid.starts_with("MIG-") && !uuid.contains(','), "{uuid}");
        assert!(seen.insert(uuid));
    }
    let nodes = server.ok(&["nodes"]);
    assert!(nodes.contains("3/7 (7x 1g.10gb)"), "{nodes}");
    server.ok(&["service", "delete", "infer"]);
    common::wait_for("the slices free again", LONG, || {
        server.ok(&["nodes"]).contains("0/7 (7x 1g.10gb)")
    });
}
