//! Services in apply: a job per replica, the next one queued when a replica
//! ends (later and later in a crash loop), scaling and deleting, refusals,
//! and the store keeping it all.

use super::run::{alloc, cluster, ev, report, spec};
use crate::model::{JobSpec, TaskEnd, TaskEventKind};
use crate::state::*;

const SEC: Millis = 1000;

fn create(s: &mut State, d: &mut Dirty, name: &str, replicas: u32) -> CommandResult {
    s.apply(
        &Command::ServiceCreate {
            user: "alice".into(),
            name: name.into(),
            spec: Box::new(spec(1, 1)),
            settings: crate::model::ServiceSettings {
                replicas,
                restart_delay_secs: 5,
                health: None,
                ports: Vec::new(),
            },
            now: 100 * SEC,
        },
        d,
    )
}

fn queued(r: &CommandResult) -> Vec<JobId> {
    match r {
        CommandResult::ServiceChanged { queued, .. } => queued.clone(),
        other => panic!("{other:?}"),
    }
}

/// Index `index`'s current job.
fn replica(s: &State, name: &str, index: u32) -> Option<JobId> {
    s.services[name].slots.get(&index).and_then(|slot| slot.job)
}

/// Starts `id` on n1 at `at` and ends its rank at `end` with exit 1.
fn run_and_fail(s: &mut State, d: &mut Dirty, id: JobId, at: Millis, end: Millis) {
    s.apply(
        &Command::Schedule {
            allocations: vec![alloc(id.0, &[("n1", &[0])])],
            now: at,
        },
        d,
    );
    report(s, d, "n1", vec![ev(id, 0, TaskEventKind::Started)]);
    s.apply(
        &Command::TaskEvents {
            node: "n1".into(),
            events: vec![ev(
                id,
                0,
                TaskEventKind::Ended(TaskEnd::Failed {
                    exit_code: Some(1),
                    signal: None,
                }),
            )],
            now: end,
            gpu_use: Vec::new(),
        },
        d,
    );
}

#[test]
fn each_replica_is_a_job_and_an_ended_one_is_replaced_later_in_a_crash_loop() {
    let (mut s, mut d) = cluster();
    let jobs = queued(&create(&mut s, &mut d, "web", 2));
    assert_eq!(jobs.len(), 2);
    for (i, id) in jobs.iter().enumerate() {
        let job = &s.jobs[id];
        assert_eq!(job.spec.name, format!("web-{i}"));
        assert_eq!(job.user, "alice");
        assert_eq!(job.state, JobState::Pending);
        let of = job.replica_of.as_ref().unwrap();
        assert_eq!((of.service.as_str(), of.index), ("web", i as u32));
    }
    // Replica 0 fails 2 s after its start: a quick failure; its next job
    // waits the plain delay, the one after twice that.
    let mut id = jobs[0];
    let mut t = 200 * SEC;
    for delay in [5, 10, 20] {
        run_and_fail(&mut s, &mut d, id, t, t + 2 * SEC);
        assert_eq!(s.jobs[&id].state, JobState::Failed);
        let next = replica(&s, "web", 0).unwrap();
        assert_ne!(next, id);
        let job = &s.jobs[&next];
        assert_eq!(job.spec.queue.begin_time, Some(t + 2 * SEC + delay * SEC));
        let reason = job.reason.as_deref().unwrap_or_default();
        assert!(
            reason.contains(&format!("restarting in {delay} s")),
            "{reason}"
        );
        assert!(reason.contains("exit"), "{reason}");
        (id, t) = (next, t + 100 * SEC);
    }
    assert!(s.jobs[&id]
        .reason
        .as_deref()
        .unwrap_or_default()
        .contains("crash loop: 3 quick exits"));
    // One that ran for an hour before failing starts again after the plain
    // delay: the loop is over.
    run_and_fail(&mut s, &mut d, id, t, t + 3600 * SEC);
    let next = replica(&s, "web", 0).unwrap();
    assert_eq!(
        s.jobs[&next].spec.queue.begin_time,
        Some(t + 3600 * SEC + 5 * SEC)
    );
    assert_eq!(s.services["web"].slots[&0].restarts, 4);
    // Replica 1 was never touched.
    assert_eq!(replica(&s, "web", 1), Some(jobs[1]));
}

#[test]
fn scaling_and_deleting_cancel_replicas_that_nothing_replaces() {
    let (mut s, mut d) = cluster();
    let jobs = queued(&create(&mut s, &mut d, "web", 3));
    let r = s.apply(
        &Command::ServiceScale {
            by: "alice".into(),
            admin: false,
            name: "web".into(),
            replicas: 1,
            now: 150 * SEC,
        },
        &mut d,
    );
    assert_eq!(
        r,
        CommandResult::ServiceChanged {
            queued: vec![],
            cancelled: vec![jobs[1], jobs[2]],
        }
    );
    assert_eq!(s.jobs[&jobs[2]].state, JobState::Cancelled);
    assert!(s.jobs[&jobs[2]]
        .reason
        .as_deref()
        .unwrap_or_default()
        .contains("scaled to 1"));
    assert_eq!(s.services["web"].slots.len(), 1, "nothing replaced them");
    // Up again: the missing indexes get new jobs.
    let r = s.apply(
        &Command::ServiceScale {
            by: "root".into(),
            admin: true,
            name: "web".into(),
            replicas: 2,
            now: 160 * SEC,
        },
        &mut d,
    );
    let added = queued(&r);
    assert_eq!(added.len(), 1);
    assert_eq!(s.jobs[&added[0]].replica_of.as_ref().unwrap().index, 1);
    let before = s.jobs.len();
    let r = s.apply(
        &Command::ServiceDelete {
            by: "alice".into(),
            admin: false,
            name: "web".into(),
            now: 170 * SEC,
        },
        &mut d,
    );
    assert!(
        matches!(r, CommandResult::ServiceChanged { ref cancelled, .. } if cancelled.len() == 2)
    );
    assert!(s.services.is_empty());
    assert_eq!(s.jobs.len(), before, "no replacement was queued");
    assert!(s.jobs.values().all(|j| j.state == JobState::Cancelled));
}

#[test]
fn bad_service_commands_are_refused_and_change_nothing() {
    let (mut s, mut d) = cluster();
    create(&mut s, &mut d, "web", 1);
    let before = s.clone();
    let refused = |r: CommandResult, says: &str| match r {
        CommandResult::Rejected(why) => {
            assert!(why.to_string().contains(says), "{why}")
        }
        other => panic!("{other:?}"),
    };
    refused(create(&mut s, &mut d, "web", 1), "exists already");
    refused(create(&mut s, &mut d, "Web", 1), "lowercase");
    refused(create(&mut s, &mut d, "big", 5000), "at most 1000");
    for (by, name, says) in [
        ("bob", "web", "belongs to alice"),
        ("alice", "nope", "does not exist"),
    ] {
        let r = s.apply(
            &Command::ServiceDelete {
                by: by.into(),
                admin: false,
                name: name.into(),
                now: 0,
            },
            &mut d,
        );
        refused(r, says);
    }
    assert_eq!(s, before);
}

#[test]
fn the_store_keeps_services() {
    let (mut s, _) = cluster();
    let mut d = Dirty::default();
    create(&mut s, &mut d, "web", 2);
    let dir = tempfile::tempdir().unwrap();
    let db = redb::Database::create(dir.path().join("s.redb")).unwrap();
    let txn = db.begin_write().unwrap();
    store::create_tables(&txn).unwrap();
    let all = store::to_snapshot_bytes(&s, &[]).unwrap();
    let (snap, history) = store::from_snapshot_bytes(&all).unwrap();
    store::replace_all(&txn, &snap, history).unwrap();
    txn.commit().unwrap();
    let loaded = store::load(&db.begin_read().unwrap()).unwrap();
    assert_eq!(loaded.services, s.services);
    // And a delete removes it from the store.
    let mut d = Dirty::default();
    s.apply(
        &Command::ServiceDelete {
            by: "alice".into(),
            admin: false,
            name: "web".into(),
            now: 1,
        },
        &mut d,
    );
    let txn = db.begin_write().unwrap();
    store::write_dirty(&txn, &s, &d).unwrap();
    txn.commit().unwrap();
    assert!(store::load(&db.begin_read().unwrap())
        .unwrap()
        .services
        .is_empty());
}

/// Starts `id` on n1's GPU `gpu` at `at`.
fn start(s: &mut State, d: &mut Dirty, id: JobId, gpu: u32, at: Millis) {
    let r = s.apply(
        &Command::Schedule {
            allocations: vec![alloc(id.0, &[("n1", &[gpu])])],
            now: at,
        },
        d,
    );
    report(s, d, "n1", vec![ev(id, 0, TaskEventKind::Started)]);
    assert_eq!(s.jobs[&id].state, JobState::Running, "{r:?}");
}

fn update(s: &mut State, d: &mut Dirty, spec: Option<JobSpec>, now: Millis) -> CommandResult {
    s.apply(
        &Command::ServiceUpdate {
            by: "alice".into(),
            admin: false,
            name: "web".into(),
            spec: spec.map(Box::new),
            now,
        },
        d,
    )
}

#[test]
fn an_update_rolls_one_replica_at_a_time_and_halts_on_a_failing_one() {
    let (mut s, mut d) = cluster();
    let old = queued(&create(&mut s, &mut d, "web", 2));
    start(&mut s, &mut d, old[0], 0, 110 * SEC);
    start(&mut s, &mut d, old[1], 1, 110 * SEC);
    let v2 = JobSpec {
        env: vec![("V".into(), "2".into())],
        ..spec(1, 1)
    };
    // One new replica at a time, beside the old one.
    let new0 = queued(&update(&mut s, &mut d, Some(v2), 200 * SEC));
    assert_eq!(new0.len(), 1);
    assert_eq!(s.jobs[&new0[0]].spec.env, [("V".into(), "2".into())]);
    let slot = &s.services["web"].slots[&0];
    assert_eq!(
        (slot.job, slot.next, slot.version),
        (Some(old[0]), Some(new0[0]), 1)
    );
    assert!(s.services["web"].rolling());
    // Running (no health check): it takes index 0, the old one stops,
    // and index 1's new replica starts.
    start(&mut s, &mut d, new0[0], 2, 210 * SEC);
    let slot = &s.services["web"].slots[&0];
    assert_eq!(
        (slot.job, slot.next, slot.version),
        (Some(new0[0]), None, 2)
    );
    assert_eq!(s.jobs[&old[0]].state, JobState::Completing);
    assert!(s.jobs[&old[0]]
        .reason
        .as_deref()
        .unwrap_or_default()
        .contains("replaced by version 2"));
    let new1 = s.services["web"].slots[&1].next.unwrap();
    // It fails before it is ready (its launch failed): the roll halts; the
    // old replica serves.
    s.apply(
        &Command::Schedule {
            allocations: vec![alloc(new1.0, &[("n1", &[3])])],
            now: 220 * SEC,
        },
        &mut d,
    );
    let failed = TaskEventKind::Ended(TaskEnd::LaunchFailed {
        reason: "no such file".into(),
    });
    report(&mut s, &mut d, "n1", vec![ev(new1, 0, failed)]);
    let web = &s.services["web"];
    assert!(web
        .roll_halted
        .as_deref()
        .unwrap_or_default()
        .contains("replica 1 ended before it was ready"));
    assert!(!web.rolling());
    assert_eq!(
        (web.slots[&1].job, web.slots[&1].next),
        (Some(old[1]), None)
    );
    assert_eq!(s.jobs[&old[1]].state, JobState::Running);
    let restarted = queued(&update(&mut s, &mut d, None, 300 * SEC));
    // Rollback: version 3 is version 1's spec, rolled the same way.
    let web = &s.services["web"];
    assert_eq!(web.version, 3);
    assert!(web.spec.env.is_empty());
    assert_eq!(restarted.len(), 1);
    assert!(s.jobs[&restarted[0]].spec.env.is_empty());
    assert_eq!(web.slots[&0].next, Some(restarted[0]));
}

#[test]
fn a_checked_replica_takes_its_place_only_when_the_leader_says_it_is_healthy() {
    let (mut s, mut d) = cluster();
    let mut d2 = Dirty::default();
    s.apply(
        &Command::ServiceCreate {
            user: "alice".into(),
            name: "web".into(),
            spec: Box::new(spec(1, 1)),
            now: 100 * SEC,
            settings: crate::model::ServiceSettings {
                replicas: 1,
                restart_delay_secs: 5,
                health: Some(crate::model::HealthCheck {
                    path: "/".into(),
                    interval_secs: 1,
                    grace_secs: 1,
                    failures: 1,
                    cmd: None,
                }),
                ports: Vec::new(),
            },
        },
        &mut d2,
    );
    let old = replica(&s, "web", 0).unwrap();
    start(&mut s, &mut d, old, 0, 110 * SEC);
    let v2 = JobSpec {
        env: vec![("V".into(), "2".into())],
        ..spec(1, 1)
    };
    let new = queued(&update(&mut s, &mut d, Some(v2), 200 * SEC))[0];
    start(&mut s, &mut d, new, 1, 210 * SEC);
    assert_eq!(replica(&s, "web", 0), Some(old), "running is not enough");
    let ready = |s: &mut State, d: &mut Dirty, job| {
        s.apply(
            &Command::ServiceReplicaReady {
                name: "web".into(),
                index: 0,
                job,
                now: 220 * SEC,
            },
            d,
        )
    };
    // A stale or wrong report changes nothing.
    ready(&mut s, &mut d, old);
    assert_eq!(replica(&s, "web", 0), Some(old));
    ready(&mut s, &mut d, new);
    assert_eq!(replica(&s, "web", 0), Some(new));
    assert_eq!(s.jobs[&old].state, JobState::Completing);
    assert!(!s.services["web"].rolling());
}

#[test]
fn named_ports_are_unique_on_a_node_and_bad_names_are_refused() {
    let (mut s, mut d) = cluster();
    let create_with = |s: &mut State, d: &mut Dirty, name: &str, ports: &[&str]| {
        s.apply(
            &Command::ServiceCreate {
                user: "alice".into(),
                name: name.into(),
                spec: Box::new(spec(1, 1)),
                settings: crate::model::ServiceSettings {
                    replicas: 2,
                    restart_delay_secs: 5,
                    health: None,
                    ports: ports.iter().map(|p| p.to_string()).collect(),
                },
                now: 100 * SEC,
            },
            d,
        )
    };
    let before = s.clone();
    for (ports, says) in [
        (&["http", "HTTP"][..], "given twice"),
        (&["9000"][..], "with a letter"),
        (
            &["a", "b", "c", "d", "e", "f", "g", "h", "i"][..],
            "at most 8",
        ),
    ] {
        match create_with(&mut s, &mut d, "bad", ports) {
            CommandResult::Rejected(why) => assert!(why.to_string().contains(says), "{why}"),
            other => panic!("{ports:?}: {other:?}"),
        }
    }
    assert_eq!(s, before, "nothing half-applied");

    let jobs = queued(&create_with(&mut s, &mut d, "web", &["http", "metrics"]));
    let plain = queued(&create_with(&mut s, &mut d, "plain", &[]));
    let r = s.apply(
        &Command::Schedule {
            allocations: vec![
                alloc(jobs[0].0, &[("n1", &[0])]),
                alloc(jobs[1].0, &[("n1", &[1])]),
                alloc(plain[0].0, &[("n1", &[2])]),
            ],
            now: 110 * SEC,
        },
        &mut d,
    );
    assert!(
        matches!(&r, CommandResult::Scheduled { skipped, .. } if skipped.is_empty()),
        "{r:?}"
    );
    let mut all = Vec::new();
    for id in jobs.iter().chain(&plain[..1]) {
        let run = s.jobs[id].run.as_ref().expect("started");
        all.push(run.master_port);
        all.extend(run.named_ports.values());
    }
    for id in &jobs {
        let run = s.jobs[id].run.as_ref().unwrap();
        let names: Vec<&str> = run.named_ports.keys().map(String::as_str).collect();
        assert_eq!(names, ["http", "metrics"]);
    }
    assert!(s.jobs[&plain[0]]
        .run
        .as_ref()
        .unwrap()
        .named_ports
        .is_empty());
    assert_eq!(all.len(), 7);
    let unique: std::collections::BTreeSet<_> = all.iter().collect();
    assert_eq!(
        unique.len(),
        all.len(),
        "every port on n1 is its own: {all:?}"
    );
}

#[test]
fn a_replica_on_a_lost_node_is_requeued_then_replaced() {
    let (mut s, mut d) = cluster();
    create(&mut s, &mut d, "web", 1);
    let mut t = 110 * SEC;
    // Requeued (the same job) while it has restarts left, then a new job.
    for round in 0..6 {
        let node = ["n1", "n2"][round % 2];
        let job = replica(&s, "web", 0).unwrap();
        s.apply(
            &Command::Schedule {
                allocations: vec![alloc(job.0, &[(node, &[0])])],
                now: t,
            },
            &mut d,
        );
        report(
            &mut s,
            &mut d,
            node,
            vec![ev(job, 0, TaskEventKind::Started)],
        );
        assert_eq!(s.jobs[&job].state, JobState::Running, "round {round}");
        s.apply(
            &Command::NodeDown {
                node: node.into(),
                reason: "no heartbeat".into(),
                now: t + SEC,
            },
            &mut d,
        );
        let next = replica(&s, "web", 0).unwrap();
        assert_eq!(
            s.jobs[&next].state,
            JobState::Pending,
            "round {round}: {:?} {:?}",
            s.jobs[&job],
            s.services["web"]
        );
        s.apply(
            &Command::RegisterNode {
                inventory: super::run::inventory(node, 8),
                addr: "10.1.0.9:7421".into(),
                preflight: false,
                now: t + 2 * SEC,
                cert_sha256: String::new(),
            },
            &mut d,
        );
        t += 3600 * SEC;
    }
}
