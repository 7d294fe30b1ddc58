//! Elastic jobs end to end (`--nodes MIN-MAX`): a server and four agents as
//! real processes. A 2-4 job on a cluster with two busy nodes starts on
//! two, grows to four when the others free, and shrinks back to two when a
//! preempting 2-node job arrives, RUNNING throughout and never requeued;
//! its ranks see each size (world size, node count, restart count and
//! torchrun's PET_NNODES). Bad ranges are refused with exit 1.

mod common;

use std::time::Duration;

use common::{stderr, Cluster};

const LONG: Duration = Duration::from_secs(60);

/// The `(attempt, nodes, world size, PET_NNODES)` lines the ranks wrote.
fn sizes(path: &std::path::Path) -> Vec<String> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(str::to_string)
        .collect()
}

fn count(lines: &[String], line: &str) -> usize {
    lines.iter().filter(|l| l.as_str() == line).count()
}

#[test]
fn an_elastic_job_starts_small_grows_into_free_nodes_and_shrinks_for_a_preemptor() {
    let dir = tempfile::tempdir().unwrap();
    let c = Cluster::start(dir.path(), 4, 8);
    let w = dir.path().join("w");
    std::fs::create_dir_all(&w).unwrap();
    let wd = w.to_str().unwrap();
    let log = w.join("sizes");
    c.server.ok(&[
        "admin",
        "qos",
        "add",
        "high",
        "--priority",
        "10",
        "--preempts",
        "normal",
    ]);
    let busy: Vec<String> = (0..2)
        .map(|_| c.submit(&["--gpus-per-node", "8", "--", "sleep", "300"]))
        .collect();
    for id in &busy {
        c.wait_started(id, LONG);
    }

    // Two nodes free: it starts on two.
    let script = format!(
        "echo \"$GPUQ_RESTART_COUNT $GPUQ_NUM_NODES $WORLD_SIZE $PET_NNODES\" >> {}; \
         exec sleep 300",
        log.display()
    );
    let id = c.submit(&[
        "--nodes",
        "2-4",
        "--gpus-per-node",
        "8",
        "-D",
        wd,
        "--wrap",
        &script,
    ]);
    let job = c.wait_started(&id, LONG);
    assert_eq!(
        job["run"]["allocation"]["nodes"].as_array().unwrap().len(),
        2,
        "{job}"
    );
    common::wait_for("two ranks at size 2", LONG, || {
        count(&sizes(&log), "0 2 2 2:4") == 2
    });

    // The busy nodes free: it grows to four, restarting its ranks.
    for b in &busy {
        c.server.ok(&["cancel", b]);
    }
    // Freed one after the other, both are taken in one growth: it grows
    // only after its settle time (10 s) at a size.
    common::wait_for("four ranks at size 4", LONG, || {
        count(&sizes(&log), "1 4 4 2:4") == 4
    });
    let job = c.job(&id);
    assert_eq!(job["state"], "RUNNING", "{job}");
    assert_eq!(job["spec"]["nodes"], 4, "{job}");

    // A preempting 2-node job: it gives two nodes back, not all four.
    let high = c.submit(&[
        "--qos",
        "high",
        "--nodes",
        "2",
        "--gpus-per-node",
        "8",
        "--",
        "sleep",
        "300",
    ]);
    c.wait_started(&high, LONG);
    common::wait_for("two ranks at size 2 again", LONG, || {
        count(&sizes(&log), "2 2 2 2:4") == 2
    });
    let job = c.job(&id);
    assert_eq!(job["state"], "RUNNING", "{job}");
    assert_eq!(job["restart_count"], 0, "never requeued: {job}");
    assert_eq!(job["resizes"].as_array().unwrap().len(), 2, "{job}");
    let show = c.server.ok(&["show", &id]);
    assert!(show.contains("2 (elastic 2-4)"), "{show}");
    assert!(
        show.contains("2 -> 4 nodes") && show.contains("4 -> 2 nodes"),
        "{show}"
    );
    assert!(
        show.contains(&format!("gave nodes back to job {high}")),
        "{show}"
    );
    c.server.ok(&["cancel", &id, &high]);
    c.wait_state(&id, "CANCELLED", LONG);
}

#[test]
fn bad_elastic_ranges_are_refused_naming_the_fix() {
    let dir = tempfile::tempdir().unwrap();
    let c = Cluster::start(dir.path(), 1, 8);
    for (args, text) in [
        (
            vec!["submit", "--nodes", "4-2", "--", "true"],
            "more than the maximum",
        ),
        (
            vec!["submit", "--nodes", "0-2", "--", "true"],
            "at least 1 node",
        ),
        (vec!["submit", "--nodes", "2-x", "--", "true"], "MIN-MAX"),
        (
            vec!["submit", "--nodes", "1-2", "--gpus", "16", "--", "true"],
            "use --gpus-per-node",
        ),
        (
            vec!["slurm", "sbatch", "-N", "1-2", "-n", "8", "--wrap", "true"],
            "give --ntasks-per-node",
        ),
        (
            vec!["slurm", "salloc", "-N", "1-2", "true"],
            "keeps the nodes it was given",
        ),
        (
            vec![
                "service",
                "create",
                "web",
                "--replicas",
                "1",
                "--nodes",
                "1-2",
                "--",
                "true",
            ],
            "fixed size",
        ),
    ] {
        let out = c.server.cli(&args);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {}", stderr(&out));
        assert!(stderr(&out).contains(text), "{args:?}: {}", stderr(&out));
    }
    let queue = c.server.ok(&["queue", "--all"]);
    assert_eq!(queue.lines().count(), 1, "nothing queued: {queue}");
}
