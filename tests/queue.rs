//! Queue control end to end, with real processes: an afterok chain (and one
//! that can never run), an array with a throttle, hold and release, --begin,
//! and --signal delivered before a short time limit.

mod common;

use std::time::Duration;

use common::{stderr, Cluster};

const LONG: Duration = Duration::from_secs(90);

fn ms(j: &serde_json::Value, field: &str) -> u64 {
    j[field]
        .as_u64()
        .unwrap_or_else(|| panic!("{field} missing: {j}"))
}

#[test]
fn an_afterok_chain_runs_in_order_and_a_failed_dependency_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let c = Cluster::start(dir.path(), 1, 2);
    let a = c.submit(&["--wrap", "sleep 1"]);
    let b = c.submit(&["-d", &format!("afterok:{a}"), "--wrap", "sleep 1"]);
    let d = c.submit(&["--dependency", &format!("afterok:{b}"), "--wrap", "true"]);
    let waiting = c.job(&d);
    assert_eq!(waiting["state"], "PENDING");
    let jd = c.wait_state(&d, "COMPLETED", LONG);
    let ja = c.job(&a);
    let jb = c.job(&b);
    assert_eq!(ja["state"], "COMPLETED");
    assert_eq!(jb["state"], "COMPLETED");
    assert!(ms(&jb, "start_time") >= ms(&ja, "end_time"), "{ja}\n{jb}");
    assert!(ms(&jd, "start_time") >= ms(&jb, "end_time"), "{jb}\n{jd}");

    // afterok on a job that failed can never be met: it says so and waits.
    let bad = c.submit(&["--wrap", "exit 3"]);
    c.wait_state(&bad, "FAILED", LONG);
    let never = c.submit(&["-d", &format!("afterok:{bad}"), "--wrap", "true"]);
    common::wait_for("the never-satisfied reason", LONG, || {
        c.job(&never)["reason"]
            .as_str()
            .is_some_and(|r| r.contains("can never be met") && r.contains("FAILED"))
    });
    // afternotok on it runs.
    let rescue = c.submit(&["-d", &format!("afternotok:{bad}"), "--wrap", "true"]);
    c.wait_state(&rescue, "COMPLETED", LONG);

    // An unknown job id is refused at submit, naming it.
    let out = c
        .server
        .cli(&["submit", "-d", "afterok:999999", "--wrap", "true"]);
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("999999") && stderr(&out).contains("does not exist"),
        "{}",
        stderr(&out)
    );
    // A malformed one is refused by the CLI (exit 1), showing the forms.
    let out = c
        .server
        .cli(&["submit", "-d", "aftrok:1", "--wrap", "true"]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(stderr(&out).contains("afterok:ID"), "{}", stderr(&out));
}

#[test]
fn an_array_of_six_with_throttle_two_never_runs_more_than_two() {
    let dir = tempfile::tempdir().unwrap();
    let c = Cluster::start(dir.path(), 2, 4);
    let out = dir.path().join("out");
    std::fs::create_dir_all(&out).unwrap();
    let id = c.submit(&[
        "--array",
        "0-5%2",
        "-D",
        out.to_str().unwrap(),
        "--wrap",
        "echo $GPUQ_ARRAY_JOB_ID $GPUQ_ARRAY_TASK_ID > task_$GPUQ_ARRAY_TASK_ID; sleep 1",
    ]);
    // The queue folds the pending tasks: 12_[2-5%2] or so.
    let queue = c.server.ok(&["queue"]);
    assert!(queue.contains(&format!("{id}_[")), "{queue}");
    assert!(queue.contains("%2]"), "{queue}");
    let tasks: Vec<serde_json::Value> = (0..6)
        .map(|i| c.wait_state(&format!("{id}_{i}"), "COMPLETED", LONG))
        .collect();
    for (i, t) in tasks.iter().enumerate() {
        let text = std::fs::read_to_string(out.join(format!("task_{i}"))).unwrap();
        assert_eq!(text.trim(), format!("{id} {i}"));
        assert_eq!(t["array"]["index"], i as u64);
    }
    // From the recorded starts and ends: never more than 2 at once.
    for t in &tasks {
        let at = ms(t, "start_time");
        let overlapping = tasks
            .iter()
            .filter(|o| ms(o, "start_time") <= at && ms(o, "end_time") > at)
            .count();
        assert!(
            overlapping <= 2,
            "{overlapping} tasks ran at {at}: {tasks:?}"
        );
    }
    // Cancelling a finished array says so.
    let out = c.server.cli(&["cancel", &format!("{id}_3")]);
    assert!(!out.status.success());
    assert!(stderr(&out).contains("already ended"), "{}", stderr(&out));
}

#[test]
fn hold_release_and_begin_keep_jobs_back_with_their_reason() {
    let dir = tempfile::tempdir().unwrap();
    let c = Cluster::start(dir.path(), 1, 2);
    let held = c.submit(&["--hold", "--wrap", "true"]);
    common::wait_for("the Held reason", LONG, || {
        c.job(&held)["reason"]
            .as_str()
            .is_some_and(|r| r.contains("held"))
    });
    let later = c.submit(&["--begin", "now+1hour", "--wrap", "true"]);
    common::wait_for("the BeginTime reason", LONG, || {
        c.job(&later)["reason"]
            .as_str()
            .is_some_and(|r| r.contains("begin time"))
    });
    c.server.ok(&["hold", &later]);
    let out = c.server.cli(&["release", &held, "99999"]);
    assert!(!out.status.success(), "all or none");
    assert_eq!(c.job(&held)["held"], true);
    let out = c.server.ok(&["release", &held]);
    assert!(out.contains(&format!("Released job {held}")), "{out}");
    c.wait_state(&held, "COMPLETED", LONG);
    // Only pending jobs can be held; a finished one is refused clearly.
    let out = c.server.cli(&["hold", &held]);
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("only a PENDING job"),
        "{}",
        stderr(&out)
    );
    let out = c.server.ok(&["release", &later]);
    assert!(out.contains("Released"), "{out}");
    common::wait_for("the BeginTime reason again", LONG, || {
        c.job(&later)["reason"]
            .as_str()
            .is_some_and(|r| r.contains("begin time"))
    });
    c.server.ok(&["cancel", &later]);
}

#[test]
fn signal_before_the_time_limit_reaches_the_script() {
    let dir = tempfile::tempdir().unwrap();
    let c = Cluster::start(dir.path(), 1, 1);
    let out = dir.path().join("out");
    std::fs::create_dir_all(&out).unwrap();
    let flag = out.join("warned");
    let script = format!(
        "trap 'echo warned > {}; exit 0' USR1; while true; do sleep 0.1; done",
        flag.display()
    );
    // A 20-second limit; USR1 at 15 seconds before it.
    let id = c.submit(&[
        "-t",
        "0:20",
        "--signal",
        "USR1@15",
        "-D",
        out.to_str().unwrap(),
        "--wrap",
        &script,
    ]);
    let j = c.wait_state(&id, "COMPLETED", LONG);
    assert_eq!(std::fs::read_to_string(&flag).unwrap().trim(), "warned");
    // It ended on the signal, well before the limit.
    assert!(ms(&j, "end_time") - ms(&j, "start_time") < 20_000, "{j}");
}

#[test]
fn a_queue_bigger_than_one_frame_is_listed_whole_in_pages() {
    // Six held jobs with 3 MiB scripts: 18 MiB of queue, more than the
    // 16 MiB one answer may carry. Every listing still shows all six.
    let dir = tempfile::tempdir().unwrap();
    let c = Cluster::start(dir.path(), 1, 2);
    let script = dir.path().join("big.sh");
    let filler = format!("# {}\n", "x".repeat(1022)).repeat(3 << 10);
    std::fs::write(&script, format!("#!/bin/sh\n{filler}true\n")).unwrap();
    let ids: Vec<String> = (0..6)
        .map(|_| c.submit(&["--hold", script.to_str().unwrap()]))
        .collect();
    let out = c.server.ok(&["queue", "--json"]);
    let listed: Vec<serde_json::Value> = serde_json::from_str(&out).unwrap();
    let got: Vec<String> = listed.iter().map(|j| j["id"].to_string()).collect();
    assert_eq!(got, ids, "gpuq queue --json");
    let out = c.server.ok(&["slurm", "squeue", "-h", "-o", "%i"]);
    let got: Vec<&str> = out.lines().map(str::trim).collect();
    assert_eq!(got, ids, "squeue");
    let out = c.server.ok(&["slurm", "scancel", "-u", "root"]);
    assert!(out.is_empty(), "{out}");
    for id in &ids {
        c.wait_state(id, "CANCELLED", LONG);
    }
}
