//! Time-sliced GPU sharing end to end: an agent whose fake GPU is shared
//! into slots (`shared = N` in its config, or `gpuq node share`), real jobs
//! under shims, the real CLI.

mod common;

use std::time::Duration;

use common::{stderr, Agent, AgentHw, Gated, Server};

const LONG: Duration = Duration::from_secs(60);

fn refused(server: &Server, args: &[&str], want: &str) {
    let o = server.cli(args);
    assert_eq!(o.status.code(), Some(1), "{args:?}: {}", stderr(&o));
    assert!(stderr(&o).contains(want), "{args:?}: {}", stderr(&o));
}

#[test]
fn three_slot_jobs_share_one_gpu_a_fourth_waits_and_whole_gpu_jobs_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::bootstrap(&dir.path().join("server"));
    let token = server.ok(&["token", "create"]).trim().to_string();
    let hw = AgentHw {
        gpus: 1,
        mig: "shared = 3",
        ..AgentHw::default()
    };
    let _agent = Agent::start_hw(&server, &dir.path().join("n1"), "n1", hw, &token, "", None);

    let nodes = server.ok(&["nodes"]);
    assert!(nodes.contains("0/3 (1x shared/3)"), "{nodes}");
    let node = server.ok(&["slurm", "scontrol", "show", "node", "n1"]);
    assert!(node.contains("Gres=gpu:shared:3"), "{node}");

    let jobs = Gated::new(dir.path(), "\"$CUDA_VISIBLE_DEVICES $GPUQ_GPU_SHARED\"");
    let submit = |gpus: &[&str]| jobs.submit(&server, gpus);
    // The three spellings of a slot request.
    let slots = [
        submit(&["--gres", "gpu:shared:1"]),
        submit(&["--gpus", "shared:1"]),
        submit(&["--gpus-per-node", "shared:1"]),
    ];
    let fourth = submit(&["--gpus-per-node", "shared:1"]);
    for id in &slots {
        server.wait_job(id, "RUNNING", LONG);
    }
    let mut waiting = serde_json::Value::Null;
    common::wait_for("the fourth slot job's reason", LONG, || {
        waiting = server.job(&fourth);
        waiting["reason"].as_str().is_some_and(|r| !r.is_empty())
    });
    assert_eq!(waiting["state"], "PENDING", "{waiting}");
    assert_eq!(waiting["reason_code"], "Resources", "{waiting}");
    assert_eq!(
        waiting["reason"],
        "waiting for resources: not enough free shared GPU slots, CPUs or memory now",
        "{waiting}"
    );
    // Each sees the physical GPU (index 0) and that it is shared 3 ways.
    for id in &slots {
        assert_eq!(jobs.said(id), "0 3", "job {id}");
    }
    let nodes = server.ok(&["nodes"]);
    assert!(nodes.contains("3/3 (1x shared/3)"), "{nodes}");
    // A whole-GPU job never lands on a shared GPU: here none is whole.
    refused(
        &server,
        &["submit", "--gpus-per-node", "1", "--", "true"],
        "asks for whole GPUs; every GPU of the nodes is time-shared (shared); ask for a slice \
         instead, e.g. --gpus-per-node shared:1",
    );
    refused(
        &server,
        &["submit", "--gpus-per-node", "shared:4", "--", "true"],
        "asks for 4 GPUs per node; the largest matching node has 3",
    );

    jobs.open();
    for id in slots.iter().chain([&fourth]) {
        let j = server.wait_job(id, "COMPLETED", LONG);
        assert_eq!(j["exit_code"], 0, "{j}");
    }
}

/// `gpuq nodes --json`'s entry for `name`.
fn node_json(server: &Server, name: &str) -> serde_json::Value {
    let all: serde_json::Value = serde_json::from_str(&server.ok(&["nodes", "--json"])).unwrap();
    all.as_array()
        .and_then(|ns| ns.iter().find(|n| n["name"] == name).cloned())
        .unwrap_or_default()
}

#[test]
fn node_share_fills_one_gpu_first_and_refuses_busy_nodes_mig_gpus_and_bad_counts() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::bootstrap(&dir.path().join("server"));
    let token = server.ok(&["token", "create"]).trim().to_string();
    let hw = AgentHw {
        gpus: 2,
        ..AgentHw::default()
    };
    let _n1 = Agent::start_hw(&server, &dir.path().join("n1"), "n1", hw, &token, "", None);
    let mig = AgentHw {
        gpus: 1,
        mig: r#"mig = "3g.40gb:2""#,
        ..AgentHw::default()
    };
    let _n2 = Agent::start_hw(&server, &dir.path().join("n2"), "n2", mig, &token, "", None);

    // No GPU is shared yet: a slot request is refused at submit.
    refused(
        &server,
        &["submit", "--gres", "gpu:shared:1", "--", "true"],
        "no node has shared GPUs (ask for whole GPUs or MIG slices, or an admin shares some \
         with `gpuq node share NODE --slots N`)",
    );

    let jobs = Gated::new(dir.path(), "\"$CUDA_VISIBLE_DEVICES $GPUQ_GPU_SHARED\"");
    let submit = |gpus: &str| jobs.submit(&server, &["-w", "n1", "--gpus-per-node", gpus]);
    // Sharing is refused while a job holds GPUs there.
    let whole = submit("1");
    server.wait_job(&whole, "RUNNING", LONG);
    refused(
        &server,
        &["node", "share", "n1", "--slots", "2"],
        &format!("node n1 has jobs on its GPUs ({whole}); drain it (`gpuq node drain n1`)"),
    );
    jobs.open();
    server.wait_job(&whole, "COMPLETED", LONG);
    jobs.close();

    server.ok(&["node", "share", "n1", "--slots", "2"]);
    let nodes = server.ok(&["nodes"]);
    assert!(nodes.contains("0/4 (2x shared/2)"), "{nodes}");
    // Best fit: both slots on one GPU before the other is touched.
    let a = submit("shared:1");
    let b = submit("shared:1");
    server.wait_job(&a, "RUNNING", LONG);
    server.wait_job(&b, "RUNNING", LONG);
    let (sa, sb) = (jobs.said(&a), jobs.said(&b));
    assert_eq!(sa, sb);
    assert!(sa == "0 2" || sa == "1 2", "{sa}");
    refused(
        &server,
        &["node", "share", "n1", "--off"],
        "node n1 has jobs on its GPUs",
    );
    jobs.open();
    server.wait_job(&a, "COMPLETED", LONG);
    server.wait_job(&b, "COMPLETED", LONG);

    // Mistakes: slot counts, MIG GPUs, unknown nodes; then MIG set on shared GPUs.
    for (args, want) in [
        (
            ["node", "share", "n1", "--slots", "0"],
            "--slots 0: a GPU is shared into 1 to 64 slots; use --off to stop sharing",
        ),
        (
            ["node", "share", "n1", "--slots", "65"],
            "--slots 65: a GPU is shared into 1 to 64 slots",
        ),
        (
            ["node", "share", "n2", "--slots", "2"],
            "node n2's GPUs are MIG-partitioned (2x 3g.40gb); only whole GPUs are shared: run \
             `gpuq node mig set n2 --layout none` first",
        ),
        (
            ["node", "share", "n9", "--slots", "2"],
            "node n9 does not exist",
        ),
    ] {
        refused(&server, &args, want);
    }
    refused(
        &server,
        &["node", "mig", "set", "n1", "--layout", "1g.10gb:7"],
        "node n1's GPUs are time-shared (2x shared/2); stop sharing first: `gpuq node share n1 \
         --off`",
    );
    assert_eq!(node_json(&server, "n1")["state"], "up");

    // Off: whole GPUs again.
    server.ok(&["node", "share", "n1", "--off"]);
    let nodes = server.ok(&["nodes"]);
    assert!(
        nodes
            .lines()
            .any(|l| l.starts_with("n1") && l.contains("0/2")),
        "{nodes}"
    );
}
