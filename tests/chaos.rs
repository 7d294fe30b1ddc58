//! Chaos with a checker (Jepsen's idea on our own harness): three client
//! threads drive the real CLI against different servers while the nemesis
//! (`common::nemesis`) inflicts a seeded schedule of about twenty faults of
//! every kind; then the history checker (`common::history`) proves, from
//! what clients were told and what the jobs' scripts recorded on the
//! agents, that nothing acknowledged was lost or duplicated, no GPU was held
//! twice at once, no job cancelled while pending started, and ids only grew.
//! `GPUQ_CHAOS_SEED` replays a schedule. The checker's own tests feed it bad
//! histories and see it refuse them.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::history::{read_task_runs, FinalJob, History};
use common::nemesis::{fill, report, schedule, Chaos, Fault, Tmpfs};
use common::workload::Workload;
use common::{cli_within, require_root, wait_for, Server};

#[test]
fn twenty_faults_of_every_kind_break_no_promise() {
    if !require_root("twenty_faults_of_every_kind_break_no_promise") {
        return;
    }
    let seed: u64 = std::env::var("GPUQ_CHAOS_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(20);
    // Two of each kind, and four more drawn at random.
    let mut counts: Vec<(Fault, usize)> = Fault::ALL.iter().map(|f| (*f, 2)).collect();
    for f in schedule(seed, &counts).into_iter().take(4) {
        counts[Fault::ALL.iter().position(|g| *g == f).unwrap()].1 += 1;
    }
    let plan = schedule(seed, &counts);
    eprintln!(
        "seed {seed}: {}",
        plan.iter().map(|f| f.name()).collect::<Vec<_>>().join(", ")
    );
    let tmp = tempfile::Builder::new()
        .prefix("gpuq-chaos-")
        .tempdir()
        .unwrap();
    let root = tmp.path().to_path_buf();
    eprintln!("in {} (GPUQ_CHAOS_KEEP=1 keeps it)", root.display());
    let _tmp = if std::env::var_os("GPUQ_CHAOS_KEEP").is_some() {
        let _ = tmp.keep();
        None
    } else {
        Some(tmp)
    };
    let history = Arc::new(History::new());
    let began = Instant::now();
    let mut chaos = Chaos::start(&root, "gqf", "chaos", 143, seed, history.clone());
    let records = chaos.work.join("tasks");
    let load = Workload::start(
        history.clone(),
        &chaos.sockets(),
        &chaos.work,
        &records,
        seed,
    );
    // Some work running before the first fault.
    std::thread::sleep(std::time::Duration::from_secs(3));
    for (i, f) in plan.iter().enumerate() {
        let what = chaos.inflict(*f);
        eprintln!("fault {:>2} at {:>5.1?}: {what}", i + 1, began.elapsed());
    }
    load.stop();
    let jobs = chaos.finish();
    let runs = read_task_runs(&records);
    let finals = FinalJob::all(&jobs);
    let bad = history.check_all(&finals, &runs);
    let (table, _) = report(&plan, &chaos, &history, &runs, &bad);
    eprintln!("{table}{}", chaos.notes.join("\n"));
    eprintln!(
        "{} faults and the check in {:.1?}",
        plan.len(),
        began.elapsed()
    );
    let (ok, _, _) = history.counts();
    assert!(
        bad.is_empty(),
        "the history breaks promises:\n{}",
        bad.iter()
            .map(|(_, s)| s.as_str())
            .collect::<Vec<_>>()
            .join("\n")
    );
    // A check over next to nothing proves next to nothing.
    assert!(ok >= 40, "only {ok} submissions were acknowledged");
    assert!(runs.len() >= 20, "only {} tasks ran", runs.len());
    let cancelled = history
        .cancels()
        .iter()
        .filter(|c| matches!(c.outcome, Some(common::history::Outcome::Ok(_))))
        .count();
    assert!(
        cancelled >= 5,
        "only {cancelled} cancellations were acknowledged"
    );
}

/// Found by the chaos run: a server whose storage write failed (a full disk)
/// lived on with a stopped Raft core, a member that never voted or applied
/// again even once the disk had room; two such followers and the cluster had
/// no leader for good. It must exit (non-zero, for its service manager to
/// restart it) and come back whole.
#[test]
fn a_server_whose_disk_fills_exits_and_comes_back_whole_after_a_restart() {
    if !require_root("a_server_whose_disk_fills_exits_and_comes_back_whole_after_a_restart") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let sdir = dir.path().join("s1");
    let disk = Tmpfs::mount(&sdir.join("data"), "32m");
    let mut s = Server::bootstrap_with(&sdir, "");
    let submit = |s: &Server, name: &str| {
        cli_within(
            &s.socket,
            &["submit", "--parsable", "--hold", "-J", name, "--", "true"],
            Duration::from_secs(5),
        )
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
    };
    let before: Vec<String> = (0..5)
        .map(|i| submit(&s, &format!("before-{i}")).expect("a write before the disk filled"))
        .collect();
    let fill_file = disk.0.join("chaos-fill");
    fill(&fill_file);
    let mut n = 0;
    wait_for(
        "the server to exit on its full disk",
        Duration::from_secs(60),
        || {
            n += 1;
            let _ = submit(&s, &format!("during-{n}"));
            s.exited().is_some()
        },
    );
    let status = s.exited().unwrap();
    assert!(!status.success(), "it exited with {status}");
    assert!(
        s.log().contains("the Raft core stopped"),
        "the log does not say why it exited:\n{}",
        s.log()
    );
    std::fs::remove_file(&fill_file).unwrap();
    s.start();
    let jobs = common::workload::jobs_on(&s.socket).expect("the restarted server answers");
    for id in &before {
        assert!(
            jobs.iter().any(|j| j.id.0.to_string() == *id),
            "acknowledged job {id} is gone after the restart"
        );
    }
    assert!(submit(&s, "after").is_some(), "no write after the restart");
}

/// The new checks' own tests: each is fed a history that breaks it.
mod checker {
    use super::common::history::*;
    use gpuq::model::JobState::{self, *};

    fn acked(key: &str, id: u64, invoked: f64, completed: f64) -> Op {
        Op {
            key: key.into(),
            outcome: Some(Outcome::Ok(id)),
            invoked,
            completed,
        }
    }

    fn run(
        job: u64,
        attempt: u32,
        node: &str,
        gpus: &[u32],
        start: f64,
        stop: Option<f64>,
    ) -> TaskRun {
        TaskRun {
            job,
            attempt,
            node: node.into(),
            gpus: gpus.to_vec(),
            start,
            stop,
        }
    }

    fn cancelled(job: u64) -> CancelOp {
        CancelOp {
            job,
            outcome: Some(Outcome::Ok(job)),
            invoked: 1.0,
            completed: 2.0,
        }
    }

    fn job(id: u64, state: JobState, attempt: u32, placed: bool) -> FinalJob {
        FinalJob {
            attempt,
            placed,
            ..FinalJob::new(id, &format!("j{id}"), state)
        }
    }

    fn kinds(v: &Violations) -> Vec<Violation> {
        v.iter().map(|(k, _)| *k).collect()
    }

    #[test]
    fn ids_that_go_back_after_an_acknowledgement_fail() {
        // b was sent after a was acknowledged, yet got the smaller id.
        let ops = [acked("a", 5, 1.0, 2.0), acked("b", 4, 3.0, 4.0)];
        assert_eq!(kinds(&check_id_order(&ops)), [Violation::IdWentBack]);
        // Overlapping submissions may commit in either order.
        let ops = [acked("a", 5, 1.0, 3.0), acked("b", 4, 2.0, 4.0)];
        assert!(check_id_order(&ops).is_empty());
        // Unacknowledged ones promise nothing.
        let mut lost = acked("c", 1, 5.0, 6.0);
        lost.outcome = Some(Outcome::Unknown("timeout".into()));
        let ops = [acked("a", 5, 1.0, 2.0), lost];
        assert!(check_id_order(&ops).is_empty());
        // And through the submissions' checker too.
        let jobs = [
            FinalJob::new(5, "a", Completed),
            FinalJob::new(4, "b", Completed),
        ];
        let ops = [acked("a", 5, 1.0, 2.0), acked("b", 4, 3.0, 4.0)];
        assert!(check(&ops, &[], &jobs).unwrap_err()[0].contains("before it was sent"));
    }

    #[test]
    fn a_gpu_held_by_two_tasks_at_once_fails() {
        let jobs = [job(1, Completed, 0, true), job(2, Completed, 0, true)];
        // Back to back on GPU 1 of n1, and job 2 also on GPU 2: fine.
        let ok = [
            run(1, 0, "n1", &[0, 1], 10.0, Some(12.0)),
            run(2, 0, "n1", &[1, 2], 12.5, Some(13.0)),
        ];
        assert!(check_runs(&ok, &jobs).is_empty());
        // The same GPU index on another node is another GPU.
        let ok = [
            run(1, 0, "n1", &[1], 10.0, Some(12.0)),
            run(2, 0, "n2", &[1], 11.0, Some(13.0)),
        ];
        assert!(check_runs(&ok, &jobs).is_empty());
        let bad = [
            run(1, 0, "n1", &[0, 1], 10.0, Some(12.0)),
            run(2, 0, "n1", &[1, 2], 11.0, Some(13.0)),
        ];
        assert_eq!(kinds(&check_runs(&bad, &jobs)), [Violation::DoubleBooked]);
        // A task with no stop record holds its GPU to the end, and a long
        // holder is caught after a short one in between.
        let jobs3 = [
            job(1, Completed, 0, true),
            job(2, Completed, 0, true),
            job(3, Completed, 0, true),
        ];
        let bad = [
            run(1, 0, "n1", &[3], 10.0, None),
            run(2, 0, "n1", &[0], 11.0, Some(12.0)),
            run(3, 0, "n1", &[3], 50.0, Some(51.0)),
        ];
        assert_eq!(kinds(&check_runs(&bad, &jobs3)), [Violation::DoubleBooked]);
        let bad = [
            run(1, 0, "n1", &[3], 10.0, Some(40.0)),
            run(2, 0, "n1", &[3], 41.0, Some(42.0)),
            run(3, 0, "n1", &[3], 39.0, Some(39.5)),
        ];
        assert_eq!(kinds(&check_runs(&bad, &jobs3)), [Violation::DoubleBooked]);
    }

    #[test]
    fn an_attempt_started_twice_or_a_task_of_no_job_fails() {
        let jobs = [job(1, Completed, 1, true)];
        // A requeued job runs again as its next attempt: fine.
        let ok = [
            run(1, 0, "n1", &[0], 1.0, None),
            run(1, 1, "n2", &[0], 2.0, Some(3.0)),
        ];
        assert!(check_runs(&ok, &jobs).is_empty());
        let bad = [
            run(1, 1, "n1", &[0], 1.0, Some(1.5)),
            run(1, 1, "n2", &[0], 2.0, Some(3.0)),
        ];
        assert_eq!(kinds(&check_runs(&bad, &jobs)), [Violation::Duplicated]);
        let bad = [run(9, 0, "n1", &[0], 1.0, Some(2.0))];
        assert_eq!(kinds(&check_runs(&bad, &jobs)), [Violation::UnknownJobRan]);
    }

    #[test]
    fn a_job_cancelled_while_pending_that_started_fails() {
        let runs = [run(1, 0, "n1", &[0], 5.0, Some(6.0))];
        // Cancelled while running (placed): its start is fine.
        let jobs = [job(1, Cancelled, 0, true)];
        assert!(check_cancels(&[cancelled(1)], &runs, &jobs).is_empty());
        // Cancelled while pending: no start of that attempt may exist.
        let jobs = [job(1, Cancelled, 0, false)];
        assert_eq!(
            kinds(&check_cancels(&[cancelled(1)], &runs, &jobs)),
            [Violation::CancelledThenStarted]
        );
        // Requeued (attempt 1), then cancelled while pending: attempt 0's
        // run is history, attempt 1's may not exist.
        let jobs = [job(1, Cancelled, 1, false)];
        assert!(check_cancels(&[cancelled(1)], &runs, &jobs).is_empty());
        let runs = [run(1, 1, "n2", &[0], 7.0, Some(8.0))];
        assert_eq!(
            kinds(&check_cancels(&[cancelled(1)], &runs, &jobs)),
            [Violation::CancelledThenStarted]
        );
        // A cancellation that failed promises nothing.
        let mut failed = cancelled(1);
        failed.outcome = Some(Outcome::Fail("not leader".into()));
        assert!(check_cancels(&[failed], &runs, &jobs).is_empty());
    }

    #[test]
    fn an_acknowledged_cancel_of_a_job_that_ended_otherwise_fails() {
        let jobs = [job(1, Completed, 0, true)];
        assert_eq!(
            kinds(&check_cancels(&[cancelled(1)], &[], &jobs)),
            [Violation::CancelLost]
        );
        assert_eq!(
            kinds(&check_cancels(&[cancelled(2)], &[], &jobs)),
            [Violation::CancelLost]
        );
    }

    #[test]
    fn the_recording_script_writes_what_the_reader_pairs() {
        let dir = tempfile::tempdir().unwrap();
        let records = dir.path().join("tasks");
        let env = [
            ("GPUQ_JOB_ID", "7"),
            ("GPUQ_RESTART_COUNT", "1"),
            ("GPUQ_NODELIST", "n2"),
            ("CUDA_VISIBLE_DEVICES", "2,3"),
        ];
        let st = std::process::Command::new("sh")
            .args(["-c", &recording_script(&records, "true")])
            .envs(env)
            .status()
            .unwrap();
        assert!(st.success());
        // A task sent SIGTERM records its stop too.
        let mut child = std::process::Command::new("sh")
            .args(["-c", &recording_script(&records, "sleep 30")])
            .envs(env)
            .env("GPUQ_JOB_ID", "8")
            .spawn()
            .unwrap();
        super::common::wait_for(
            "the start record",
            std::time::Duration::from_secs(10),
            || read_task_runs(&records).len() == 2,
        );
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(child.id() as i32),
            nix::sys::signal::Signal::SIGTERM,
        )
        .unwrap();
        child.wait().unwrap();
        let runs = read_task_runs(&records);
        assert_eq!(runs.len(), 2, "{runs:?}");
        for (r, job) in runs.iter().zip([7, 8]) {
            assert_eq!((r.job, r.attempt, r.node.as_str()), (job, 1, "n2"));
            assert_eq!(r.gpus, [2, 3]);
            assert!(r.stop.is_some_and(|s| s >= r.start), "{r:?}");
        }
    }
}
