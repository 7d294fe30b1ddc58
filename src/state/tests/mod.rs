//! Apply is deterministic, ids are monotonic, transitions follow the table,
//! rejected commands change nothing, and the redb store round-trips.
//!
//! The state's other unit tests, one file a theme: `run` (running jobs, and
//! the cluster and job helpers the others share), `alloc`, `history`,
//! `queue`, `restart` and `policy`.

mod alloc;
mod elastic;
mod history;
mod mig;
mod policy;
mod power;
mod queue;
mod requeue;
mod reservations;
mod restart;
mod run;
mod services;
mod share;
mod steps;
mod update;

use super::*;
use crate::model::{ExportMode, JobSpec, Program, Role, TokenRecord};

fn spec(name: &str) -> JobSpec {
    JobSpec {
        qos: None,
        nice: 0,
        name: name.into(),
        nodes: 1,
        ntasks_per_node: 1,
        gpus_per_node: 0,
        cpus_per_task: 1,
        mem_per_node_mb: None,
        time_limit_secs: Some(60),
        account: None,
        partition: None,
        output: None,
        error: None,
        workdir: "/tmp".into(),
        env: vec![("A".into(), "1".into())],
        export: ExportMode::All,
        requeue: Default::default(),
        max_restarts: 3,
        total_gpus: None,
        placement: Default::default(),
        queue: Default::default(),
        signal: None,
        program: Program::Command {
            argv: vec!["true".into()],
        },
        launch: Default::default(),
        submit_host: None,
        first_step: None,
        exclusive: false,
        container: None,
    }
}

fn submit(user: &str, now: u64) -> Command {
    Command::Submit {
        user: user.into(),
        spec: Box::new(spec("j")),
        now,
    }
}

fn sample_log() -> Vec<Command> {
    let mut log = vec![Command::InitCluster {
        name: "c".into(),
        ca_cert_pem: "cert".into(),
        ca_key_pem: "key".into(),
        master_ports: Default::default(),
        now: 1,
    }];
    for i in 0..20 {
        log.push(submit(if i % 2 == 0 { "alice" } else { "bob" }, 10 + i));
    }
    log.push(Command::Cancel {
        by: "alice".into(),
        admin: false,
        ids: vec![JobId(1), JobId(3)],
        now: 50,
    });
    // Rejected: bob may not cancel alice's job; nothing of it applies.
    log.push(Command::Cancel {
        by: "bob".into(),
        admin: false,
        ids: vec![JobId(2), JobId(5)],
        now: 51,
    });
    log.push(Command::CreateToken {
        record: TokenRecord {
            max_uses: None,
            id: "abc123".into(),
            secret_sha256: "00".into(),
            role: Role::Agent,
            created_at: 52,
            expires_at: 1000,
            created_by: "root".into(),
            revoked: false,
            uses: 0,
        },
    });
    log.push(Command::RevokeToken {
        id: "abc123".into(),
        now: 53,
    });
    log
}

fn replay(log: &[Command]) -> (State, Vec<CommandResult>) {
    let mut s = State::default();
    let mut d = Dirty::default();
    let results = log.iter().map(|c| s.apply(c, &mut d)).collect();
    (s, results)
}

#[test]
fn same_log_twice_gives_identical_state() {
    let log = sample_log();
    let (a, ra) = replay(&log);
    let (b, rb) = replay(&log);
    assert_eq!(a, b);
    assert_eq!(ra, rb);
    assert_eq!(a.jobs.len(), 20);
}

#[test]
fn ids_are_monotonic_and_never_reused() {
    let mut s = State::default();
    let mut d = Dirty::default();
    let mut last = 0;
    for i in 0..50 {
        // Interleave rejected commands: they must not consume ids.
        let bad = Command::Submit {
            user: "u".into(),
            spec: Box::new(JobSpec {
                qos: None,
                nice: 0,
                nodes: 0,
                ..spec("bad")
            }),
            now: i,
        };
        assert!(matches!(s.apply(&bad, &mut d), CommandResult::Rejected(_)));
        match s.apply(&submit("u", i), &mut d) {
            CommandResult::Submitted { id } => {
                assert_eq!(id.0, last + 1);
                last = id.0;
            }
            other => panic!("unexpected {other:?}"),
        }
        if i % 7 == 0 {
            let r = s.apply(
                &Command::Cancel {
                    by: "u".into(),
                    admin: false,
                    ids: vec![JobId(last)],
                    now: i,
                },
                &mut d,
            );
            assert_eq!(
                r,
                CommandResult::Cancelled {
                    ids: vec![JobId(last)]
                }
            );
        }
    }
    assert_eq!(s.counters.next_job_id, 51);
}

#[test]
fn rejected_cancel_changes_nothing() {
    let (s, results) = replay(&sample_log());
    let bob_cancel = &results[results.len() - 3];
    assert!(
        matches!(bob_cancel, CommandResult::Rejected(Rejection::NotOwner { id, owner }) if *id == JobId(5) && owner == "alice"),
        "{bob_cancel:?}"
    );
    assert_eq!(s.jobs[&JobId(2)].state, JobState::Pending);
    assert_eq!(s.jobs[&JobId(1)].state, JobState::Cancelled);
    assert_eq!(s.jobs[&JobId(1)].cancelled_by.as_deref(), Some("alice"));
    assert!(s.tokens["abc123"].revoked);
}

#[test]
fn cancel_of_missing_or_ended_job_is_refused() {
    let (mut s, _) = replay(&sample_log());
    let mut d = Dirty::default();
    let r = s.apply(
        &Command::Cancel {
            by: "root".into(),
            admin: true,
            ids: vec![JobId(2), JobId(999)],
            now: 60,
        },
        &mut d,
    );
    assert_eq!(r, CommandResult::Rejected(Rejection::NoSuchJob(JobId(999))));
    assert!(d.is_empty());
    let r = s.apply(
        &Command::Cancel {
            by: "root".into(),
            admin: true,
            ids: vec![JobId(1)],
            now: 60,
        },
        &mut d,
    );
    assert!(matches!(
        r,
        CommandResult::Rejected(Rejection::AlreadyEnded { .. })
    ));
    assert_eq!(s.jobs[&JobId(2)].state, JobState::Pending);
}

#[test]
fn second_init_is_rejected() {
    let (mut s, _) = replay(&sample_log());
    let r = s.apply(&sample_log()[0], &mut Dirty::default());
    assert_eq!(r, CommandResult::Rejected(Rejection::AlreadyInitialized));
}

#[test]
fn transition_table_is_exactly_as_documented() {
    use JobState::*;
    let allowed: &[(JobState, &[JobState])] = &[
        (Pending, &[Running, Cancelled, Failed]),
        (
            Running,
            &[
                Completing,
                Completed,
                Failed,
                Cancelled,
                Timeout,
                NodeFail,
                Preempted,
                OutOfMemory,
                Pending,
            ],
        ),
        (
            Completing,
            &[
                Completed,
                Failed,
                Cancelled,
                Timeout,
                NodeFail,
                OutOfMemory,
                Pending,
            ],
        ),
        (NodeFail, &[Pending]),
        (Preempted, &[Pending]),
        (Completed, &[]),
        (Failed, &[]),
        (Cancelled, &[]),
        (Timeout, &[]),
        (OutOfMemory, &[]),
    ];
    for from in JobState::ALL {
        let row = allowed.iter().find(|(f, _)| *f == from).expect("row");
        for to in JobState::ALL {
            assert_eq!(from.can_move_to(to), row.1.contains(&to), "{from} -> {to}");
        }
    }
}

#[test]
fn store_round_trips_dirty_records() {
    let dir = tempfile::tempdir().unwrap();
    let db = redb::Database::create(dir.path().join("s.redb")).unwrap();
    let mut s = State::default();
    for (i, cmd) in sample_log().iter().enumerate() {
        let mut d = Dirty::default();
        s.apply(cmd, &mut d);
        let txn = db.begin_write().unwrap();
        if i == 0 {
            store::create_tables(&txn).unwrap();
        }
        store::write_dirty(&txn, &s, &d).unwrap();
        txn.commit().unwrap();
    }
    let loaded = store::load(&db.begin_read().unwrap()).unwrap();
    assert_eq!(loaded, s);

    let bytes = store::to_snapshot_bytes(&s, &[]).unwrap();
    let other = tempfile::tempdir().unwrap();
    let db2 = redb::Database::create(other.path().join("s.redb")).unwrap();
    let txn = db2.begin_write().unwrap();
    let (snap, history) = store::from_snapshot_bytes(&bytes).unwrap();
    store::replace_all(&txn, &snap, history).unwrap();
    txn.commit().unwrap();
    assert_eq!(store::load(&db2.begin_read().unwrap()).unwrap(), s);
}

#[test]
fn a_snapshot_with_a_job_filed_under_another_id_is_refused() {
    // Found by fuzzing snapshot installs: a job whose id differs from its
    // key left the rebuilt indexes out of step with the jobs (a debug
    // assertion of the next scheduling pass fired).
    let (mut s, _) = replay(&sample_log());
    let mut job = s.jobs.values().next().unwrap().clone();
    job.id = JobId(job.id.0 + 1000);
    let key = *s.jobs.keys().next().unwrap();
    s.jobs.insert(key, job);
    let bytes = store::to_snapshot_bytes(&s, &[]).unwrap();
    let err = store::from_snapshot_bytes(&bytes).unwrap_err();
    assert!(err.to_string().contains("is filed under"), "{err}");
}

#[test]
fn a_snapshot_header_announcing_usize_max_bytes_is_refused() {
    // 8 + len overflowed in debug builds before the slice was checked.
    let mut bytes = store::to_snapshot_bytes(&State::default(), &[]).unwrap();
    bytes[8..16].copy_from_slice(&u64::MAX.to_le_bytes());
    let err = store::from_snapshot_bytes(&bytes).unwrap_err();
    assert!(err.to_string().contains("ends inside its header"), "{err}");
}

#[test]
fn a_batch_applies_each_command_and_answers_each() {
    let mut s = State::default();
    let mut d = Dirty::default();
    let batch = Command::Batch(vec![
        submit("a", 1),
        Command::Submit {
            user: "b".into(),
            spec: Box::new(JobSpec {
                qos: None,
                nice: 0,
                nodes: 0,
                ..spec("bad")
            }),
            now: 1,
        },
        submit("c", 1),
        Command::Batch(vec![submit("d", 1)]),
    ]);
    let r = s.apply(&batch, &mut d);
    let CommandResult::Batch(results) = r else {
        panic!("{r:?}")
    };
    assert_eq!(results[0], CommandResult::Submitted { id: JobId(1) });
    assert!(matches!(
        results[1],
        CommandResult::Rejected(Rejection::InvalidSpec(_))
    ));
    assert_eq!(results[2], CommandResult::Submitted { id: JobId(2) });
    assert_eq!(results[3], CommandResult::Rejected(Rejection::NestedBatch));
    assert_eq!(s.jobs.len(), 2);
}
