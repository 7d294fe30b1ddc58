//! Services in apply: a job per replica, the next one queued when a replica
//! ends (later and later in a crash loop), scaling and deleting, refusals,
//! and the store keeping it all.

use super::run::{alloc, cluster, ev, report, spec};
use crate::model::{TaskEnd, TaskEventKind};
use crate::state::*;

const SEC: Millis = 1000;

fn create(s: &mut State, d: &mut Dirty, name: &str, replicas: u32) -> CommandResult {
    s.apply(
        &Command::ServiceCreate {
            user: "alice".into(),
            name: name.into(),
            spec: Box::new(spec(1, 1)),
            replicas,
            restart_delay_secs: 5,
            now: 100 * SEC,
            health: None,
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
