//! Scheduling policy end to end: a server and an agent as real processes,
//! the admin commands, and a high-QoS job preempting a low-QoS one whose
//! script traps SIGTERM, uses its grace, is requeued with the same id and
//! later completes.

mod common;

use std::time::Duration;

use common::{stderr, Cluster};

const LONG: Duration = Duration::from_secs(60);

#[test]
fn a_high_qos_job_preempts_a_low_one_which_gets_its_grace_and_requeues() {
    let dir = tempfile::tempdir().unwrap();
    let c = Cluster::start(dir.path(), 1, 8);
    let w = dir.path().join("w");
    std::fs::create_dir_all(&w).unwrap();
    let wd = w.to_str().unwrap();

    c.server.ok(&[
        "admin",
        "qos",
        "add",
        "low",
        "--grace",
        "5s",
        "--preempt-mode",
        "requeue",
    ]);
    c.server.ok(&[
        "admin",
        "qos",
        "add",
        "high",
        "--priority",
        "10",
        "--preempts",
        "low",
    ]);
    let list = c.server.ok(&["admin", "qos", "list"]);
    assert!(list.contains("high") && list.contains("normal"), "{list}");
    // Refusals name the input.
    let bad = c
        .server
        .cli(&["admin", "qos", "add", "x", "--preempts", "ghost"]);
    assert_eq!(bad.status.code(), Some(1));
    assert!(stderr(&bad).contains("QoS ghost"), "{}", stderr(&bad));
    let bad = c.server.cli(&["submit", "--qos", "gold", "--", "true"]);
    assert_eq!(bad.status.code(), Some(1));
    assert!(
        stderr(&bad).contains("QoS \"gold\" does not exist"),
        "{}",
        stderr(&bad)
    );

    // The victim: on its first attempt it runs until stopped; on SIGTERM it
    // writes a file, takes a second of its grace, writes another and exits.
    let script = format!(
        "trap 'echo term > {wd}/term-$GPUQ_RESTART_COUNT; sleep 1; \
         echo graced > {wd}/graced-$GPUQ_RESTART_COUNT; exit 0' TERM\n\
         if [ \"$GPUQ_RESTART_COUNT\" = 0 ]; then while true; do sleep 0.1; done; fi\n\
         echo done > {wd}/done"
    );
    let victim = c.submit(&[
        "-D",
        wd,
        "--qos",
        "low",
        "--gpus-per-node",
        "8",
        "--wrap",
        &script,
    ]);
    c.wait_started(&victim, LONG);
    let high = c.submit(&[
        "-D",
        wd,
        "--qos",
        "high",
        "--gpus-per-node",
        "8",
        "--",
        "true",
    ]);

    c.wait_state(&high, "COMPLETED", LONG);
    let j = c.wait_state(&victim, "COMPLETED", LONG);
    assert_eq!(j["id"].as_u64().unwrap().to_string(), victim, "same id");
    assert_eq!(j["restart_count"], 1, "{j}");
    assert_eq!(
        j["preemptions"][0]["by"].as_u64().unwrap().to_string(),
        high
    );
    assert_eq!(j["preemptions"][0]["mode"], "requeue");
    assert!(w.join("term-0").exists(), "the victim never saw SIGTERM");
    assert!(
        w.join("graced-0").exists(),
        "the victim was killed before its grace ran out"
    );
    assert!(w.join("done").exists(), "the requeued attempt did not run");
    let shown = c.server.ok(&["show", &victim]);
    assert!(shown.contains("PREEMPTED attempt 0"), "{shown}");
    assert!(shown.contains("QoS: low"), "{shown}");

    // The views of the policy answer.
    let share: serde_json::Value =
        serde_json::from_str(&c.server.ok(&["share", "--json"])).unwrap();
    let default = share["rows"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["account"] == "default" && r["user"].is_null())
        .cloned()
        .unwrap();
    assert!(default["usage_gpu_secs"].as_f64().unwrap() > 0.0, "{share}");
    c.server.ok(&["queue", "--priority"]);
    c.server.ok(&["admin", "priority", "show"]);
}

#[test]
fn accounts_and_partitions_are_enforced_at_submit() {
    let dir = tempfile::tempdir().unwrap();
    let c = Cluster::start(dir.path(), 1, 8);
    let me = c.server.ok(&["admin", "account", "list", "--json"]);
    assert!(me.contains("default"), "{me}");
    c.server
        .ok(&["admin", "account", "add", "ml", "--add-user", "nobody-else"]);
    let bad = c.server.cli(&["submit", "-A", "ml", "--", "true"]);
    assert_eq!(bad.status.code(), Some(1));
    assert!(
        stderr(&bad).contains("is not in account ml"),
        "{}",
        stderr(&bad)
    );
    c.server.ok(&[
        "admin",
        "partition",
        "add",
        "short",
        "--max-time",
        "10:00",
        "--nodes",
        "n1",
    ]);
    let bad = c
        .server
        .cli(&["submit", "-p", "short", "-t", "1:00:00", "--", "true"]);
    assert_eq!(bad.status.code(), Some(1));
    assert!(stderr(&bad).contains("maximum"), "{}", stderr(&bad));
    let id = c.submit(&["-p", "short", "-D", "/tmp", "--", "true"]);
    let j = c.wait_state(&id, "COMPLETED", LONG);
    assert_eq!(j["spec"]["time_limit_secs"], 600);
    let bad = c.server.cli(&["admin", "account", "remove", "default"]);
    assert!(stderr(&bad).contains("built in"), "{}", stderr(&bad));
}

#[test]
fn a_preempted_job_gets_its_signal_first_then_the_grace_then_sigterm() {
    let dir = tempfile::tempdir().unwrap();
    let c = Cluster::start(dir.path(), 1, 8);
    let w = dir.path().join("w");
    std::fs::create_dir_all(&w).unwrap();
    let wd = w.to_str().unwrap();
    for args in [
        &[
            "admin",
            "qos",
            "add",
            "low",
            "--grace",
            "2s",
            "--preempt-mode",
            "requeue",
        ][..],
        &[
            "admin",
            "qos",
            "add",
            "high",
            "--priority",
            "10",
            "--preempts",
            "low",
        ][..],
    ] {
        c.server.ok(args);
    }
    // As submitit and Lightning do: checkpoint on USR1, ignore TERM's
    // meaning beyond noting it.
    let script = format!(
        "trap 'echo $EPOCHREALTIME > {wd}/usr1-$GPUQ_RESTART_COUNT' USR1\n\
         trap 'echo $EPOCHREALTIME > {wd}/term-$GPUQ_RESTART_COUNT; exit 0' TERM\n\
         if [ \"$GPUQ_RESTART_COUNT\" = 0 ]; then while true; do sleep 0.1; done; fi"
    );
    let victim = c.submit(&[
        "-D",
        wd,
        "--qos",
        "low",
        "--gpus-per-node",
        "8",
        "--signal",
        "USR1@60",
        "--wrap",
        &format!("exec bash -c '{}'", script.replace('\'', "'\\''")),
    ]);
    c.wait_started(&victim, LONG);
    let high = c.submit(&[
        "-D",
        wd,
        "--qos",
        "high",
        "--gpus-per-node",
        "8",
        "--",
        "true",
    ]);
    c.wait_state(&high, "COMPLETED", LONG);
    c.wait_state(&victim, "COMPLETED", LONG);
    let stamp = |name: &str| -> f64 {
        std::fs::read_to_string(w.join(name))
            .unwrap_or_else(|e| panic!("{name}: {e}"))
            .trim()
            .parse()
            .unwrap()
    };
    let (usr1, term) = (stamp("usr1-0"), stamp("term-0"));
    assert!(
        term - usr1 >= 1.5,
        "SIGTERM came {:.2} s after USR1; the grace is 2 s",
        term - usr1
    );
}

/// A QoS may cancel its jobs once their GPUs sat idle for its idle time;
/// other QoS's jobs are only flagged, at the servers' time (long here).
#[test]
fn a_qos_that_cancels_idle_jobs_cancels_them_and_no_other() {
    let dir = tempfile::tempdir().unwrap();
    let c = Cluster::start(dir.path(), 1, 4);
    // Refused whole, naming the flags to change.
    let bad = c.server.cli(&[
        "admin",
        "qos",
        "add",
        "never",
        "--idle-gpu-time",
        "0",
        "--cancel-idle",
        "true",
    ]);
    assert_eq!(bad.status.code(), Some(1));
    assert!(
        stderr(&bad).contains("--idle-gpu-time 0"),
        "{}",
        stderr(&bad)
    );
    let bad = c
        .server
        .cli(&["admin", "qos", "add", "x", "--cancel-idle", "maybe"]);
    assert_eq!(bad.status.code(), Some(1), "{}", stderr(&bad));
    assert!(stderr(&bad).contains("--cancel-idle"), "{}", stderr(&bad));
    assert!(!c.server.ok(&["admin", "qos", "list"]).contains("never"));

    c.server.ok(&[
        "admin",
        "qos",
        "add",
        "scavenger",
        "--idle-gpu-time",
        "3s",
        "--cancel-idle",
        "true",
    ]);
    let list = c.server.ok(&["admin", "qos", "list"]);
    assert!(list.contains("3s,cancel"), "{list}");
    let idle = c.submit(&["--qos", "scavenger", "--gpus", "1", "--", "sleep", "300"]);
    let other = c.submit(&["--gpus", "1", "--", "sleep", "300"]);
    c.wait_started(&other, LONG);
    let ended = c.wait_state(&idle, "CANCELLED", LONG);
    let reason = ended["reason"].as_str().unwrap_or_default();
    assert!(reason.contains("QoS scavenger's idle-GPU rule"), "{ended}");
    let still = c.job(&other);
    assert_eq!(still["state"], "RUNNING", "{still}");
    assert!(still["gpu_use"]["idle"].is_null(), "{still}");
}
