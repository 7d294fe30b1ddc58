//! Queue control in apply and the view: dependencies of every kind (and the
//! never-satisfiable ones), holds and releases, arrays and their throttle,
//! begin times passed to the scheduler.

use crate::model::{
    ArraySpec, Dependency, DependencyKind, ExportMode, JobRef, JobSpec, Program, QueueSpec,
};
use crate::sched::PendingReason;
use crate::state::*;

fn spec(name: &str, queue: QueueSpec) -> JobSpec {
    JobSpec {
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
        env: Vec::new(),
        export: ExportMode::All,
        requeue: Default::default(),
        max_restarts: 3,
        total_gpus: None,
        placement: Default::default(),
        queue,
        signal: None,
        qos: None,
        nice: 0,
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

fn submit(s: &mut State, user: &str, name: &str, queue: QueueSpec) -> Result<JobId, Rejection> {
    let cmd = Command::Submit {
        user: user.into(),
        spec: Box::new(spec(name, queue)),
        now: 100,
    };
    match s.apply(&cmd, &mut Dirty::default()) {
        CommandResult::Submitted { id } => Ok(id),
        CommandResult::Rejected(r) => Err(r),
        other => panic!("unexpected {other:?}"),
    }
}

fn dep(kind: DependencyKind, jobs: &[JobId]) -> QueueSpec {
    QueueSpec {
        dependency: vec![Dependency {
            kind,
            jobs: jobs.to_vec(),
        }],
        ..Default::default()
    }
}

/// The reason the view gives job `id` (None: free to be scheduled).
fn blocked(s: &State, id: JobId) -> Option<PendingReason> {
    s.cluster_view()
        .pending
        .into_iter()
        .find(|p| p.id == id)
        .expect("pending")
        .blocked
}

fn set_state(s: &mut State, id: JobId, state: JobState) {
    s.jobs.get_mut(&id).unwrap().state = state;
    s.reindex_job(id);
}

#[test]
fn every_dependency_kind_waits_then_holds_or_can_never_hold() {
    use DependencyKind::*;
    use JobState::*;
    // (kind, state of the job depended on, verdict: None met, Some(true) waits,
    // Some(false) never)
    let table = [
        (After, Pending, Some(true)),
        (After, Running, None),
        (After, Cancelled, None),
        (AfterAny, Running, Some(true)),
        (AfterAny, Failed, None),
        (AfterAny, Completed, None),
        (AfterOk, Running, Some(true)),
        (AfterOk, Completed, None),
        (AfterOk, Failed, Some(false)),
        (AfterOk, Timeout, Some(false)),
        (AfterOk, Cancelled, Some(false)),
        (AfterNotOk, Running, Some(true)),
        (AfterNotOk, Failed, None),
        (AfterNotOk, OutOfMemory, None),
        (AfterNotOk, Completed, Some(false)),
    ];
    for (kind, state, want) in table {
        let mut s = State::default();
        let a = submit(&mut s, "alice", "a", QueueSpec::default()).unwrap();
        let b = submit(&mut s, "alice", "b", dep(kind, &[a])).unwrap();
        set_state(&mut s, a, state);
        let got = blocked(&s, b);
        let ok = match (want, &got) {
            (None, None) => true,
            (Some(true), Some(PendingReason::Dependency)) => true,
            (Some(false), Some(PendingReason::DependencyNeverSatisfied(why))) => {
                why.contains(kind.as_str()) && why.contains(state.as_str())
            }
            _ => false,
        };
        assert!(
            ok,
            "{kind:?} on a {state:?} job: got {got:?}, want {want:?}"
        );
    }
}

#[test]
fn all_terms_must_hold_and_a_never_wins() {
    let mut s = State::default();
    let a = submit(&mut s, "alice", "a", QueueSpec::default()).unwrap();
    let b = submit(&mut s, "alice", "b", QueueSpec::default()).unwrap();
    let q = QueueSpec {
        dependency: vec![
            Dependency {
                kind: DependencyKind::AfterOk,
                jobs: vec![a],
            },
            Dependency {
                kind: DependencyKind::AfterAny,
                jobs: vec![b],
            },
        ],
        ..Default::default()
    };
    let c = submit(&mut s, "alice", "c", q).unwrap();
    set_state(&mut s, a, JobState::Completed);
    assert_eq!(blocked(&s, c), Some(PendingReason::Dependency));
    set_state(&mut s, b, JobState::Failed);
    assert_eq!(blocked(&s, c), None);
    set_state(&mut s, a, JobState::Failed);
    assert!(matches!(
        blocked(&s, c),
        Some(PendingReason::DependencyNeverSatisfied(_))
    ));
}

#[test]
fn an_unknown_dependency_is_refused_and_nothing_is_queued() {
    let mut s = State::default();
    let r = submit(
        &mut s,
        "alice",
        "x",
        dep(DependencyKind::AfterOk, &[JobId(42)]),
    );
    assert_eq!(r, Err(Rejection::UnknownDependency(JobId(42))));
    assert!(s.jobs.is_empty());
    assert_eq!(s.counters.next_job_id, 1);
    assert!(Rejection::UnknownDependency(JobId(42))
        .to_string()
        .contains("job 42, which does not exist"));
}

#[test]
fn singleton_waits_while_a_same_named_job_of_the_user_runs() {
    let mut s = State::default();
    let a = submit(&mut s, "alice", "train", QueueSpec::default()).unwrap();
    let single = dep(DependencyKind::Singleton, &[]);
    let b = submit(&mut s, "alice", "train", single.clone()).unwrap();
    let c = submit(&mut s, "bob", "train", single.clone()).unwrap();
    assert_eq!(blocked(&s, b), None, "a is only pending");
    set_state(&mut s, a, JobState::Running);
    assert_eq!(blocked(&s, b), Some(PendingReason::Dependency));
    assert_eq!(blocked(&s, c), None, "another user's job does not count");
    let view = s.cluster_view();
    let pb = view.pending.iter().find(|p| p.id == b).unwrap();
    assert_eq!(pb.singleton.as_deref(), Some("train"));
}

#[test]
fn hold_and_release_own_pending_jobs_with_clear_errors() {
    let mut s = State::default();
    let a = submit(&mut s, "alice", "a", QueueSpec::default()).unwrap();
    let held = QueueSpec {
        hold: true,
        ..Default::default()
    };
    let b = submit(&mut s, "alice", "b", held).unwrap();
    assert_eq!(blocked(&s, b), Some(PendingReason::Held));
    let hold = |by: &str, admin, ids: Vec<JobId>, hold| Command::Hold {
        by: by.into(),
        admin,
        ids,
        hold,
    };
    let mut d = Dirty::default();
    let r = s.apply(&hold("alice", false, vec![a], true), &mut d);
    assert_eq!(
        r,
        CommandResult::Held {
            ids: vec![a],
            hold: true
        }
    );
    assert_eq!(blocked(&s, a), Some(PendingReason::Held));
    // Bob may not release alice's jobs; an admin may.
    let r = s.apply(&hold("bob", false, vec![a], false), &mut d);
    assert!(matches!(
        r,
        CommandResult::Rejected(Rejection::NotOwner { .. })
    ));
    let r = s.apply(&hold("root", true, vec![a, b], false), &mut d);
    assert!(matches!(r, CommandResult::Held { hold: false, .. }));
    assert_eq!(blocked(&s, a), None);
    // Releasing a job that is not held, or holding one that is not pending.
    let r = s.apply(&hold("alice", false, vec![a], false), &mut d);
    assert_eq!(r, CommandResult::Rejected(Rejection::NotHeld(a)));
    set_state(&mut s, b, JobState::Running);
    let r = s.apply(&hold("alice", false, vec![a, b], true), &mut d);
    assert!(matches!(
        r,
        CommandResult::Rejected(Rejection::NotPending { id, .. }) if id == b
    ));
    assert!(!s.jobs[&a].held, "all or none: a was not held");
    let r = s.apply(&hold("alice", false, vec![JobId(99)], true), &mut d);
    assert_eq!(r, CommandResult::Rejected(Rejection::NoSuchJob(JobId(99))));
}

#[test]
fn an_array_is_one_command_with_one_task_job_per_index() {
    let mut s = State::default();
    let before = submit(&mut s, "alice", "x", QueueSpec::default()).unwrap();
    let q = QueueSpec {
        array: Some(ArraySpec {
            indices: (0..10_000).collect(),
            throttle: Some(8),
        }),
        ..Default::default()
    };
    let mut d = Dirty::default();
    let r = s.apply(
        &Command::Submit {
            user: "alice".into(),
            spec: Box::new(spec("arr", q)),
            now: 5,
        },
        &mut d,
    );
    let CommandResult::Submitted { id } = r else {
        panic!("{r:?}")
    };
    assert_eq!(id, JobId(before.0 + 1));
    assert_eq!(d.jobs.len(), 10_000);
    assert_eq!(s.counters.next_job_id, id.0 + 10_000);
    let last = &s.jobs[&JobId(id.0 + 9_999)];
    assert_eq!(last.display_id(), format!("{id}_9999"));
    assert!(last.spec.queue.array.is_none(), "tasks carry no index list");
    // Names: the array, one task, and a task that does not exist.
    assert_eq!(
        s.resolve(JobRef { id, task: None }, |_| true)
            .unwrap()
            .len(),
        10_000
    );
    assert_eq!(
        s.resolve(JobRef { id, task: Some(3) }, |_| true).unwrap(),
        vec![JobId(id.0 + 3)]
    );
    assert!(s
        .resolve(
            JobRef {
                id,
                task: Some(10_000)
            },
            |_| true
        )
        .unwrap_err()
        .contains("has no task 10000"));
    assert!(s
        .resolve(
            JobRef {
                id: before,
                task: Some(1)
            },
            |_| true
        )
        .unwrap_err()
        .contains("not an array"));
    // The throttle: slots are the limit minus running tasks.
    for k in 0..3 {
        set_state(&mut s, JobId(id.0 + k), JobState::Running);
    }
    let view = s.cluster_view();
    let t = view
        .pending
        .iter()
        .find(|p| p.id == JobId(id.0 + 5))
        .unwrap()
        .array_throttle
        .unwrap();
    assert_eq!((t.array, t.slots), (id, 5));
    // Cancelling the array cancels every unfinished task.
    let ids = s
        .resolve(JobRef { id, task: None }, |j| !j.state.is_final())
        .unwrap();
    let r = s.apply(
        &Command::Cancel {
            by: "alice".into(),
            admin: false,
            ids,
            now: 9,
        },
        &mut d,
    );
    assert!(matches!(r, CommandResult::Cancelled { ref ids } if ids.len() == 10_000));
}

#[test]
fn afterok_on_an_array_means_every_task() {
    let mut s = State::default();
    let q = QueueSpec {
        array: Some(ArraySpec {
            indices: vec![1, 2],
            throttle: None,
        }),
        ..Default::default()
    };
    let arr = submit(&mut s, "alice", "arr", q).unwrap();
    let after = submit(&mut s, "alice", "b", dep(DependencyKind::AfterOk, &[arr])).unwrap();
    set_state(&mut s, arr, JobState::Completed);
    assert_eq!(blocked(&s, after), Some(PendingReason::Dependency));
    set_state(&mut s, JobId(arr.0 + 1), JobState::Completed);
    assert_eq!(blocked(&s, after), None);
}

#[test]
fn begin_times_and_running_ends_reach_the_scheduler() {
    let mut s = State::default();
    let q = QueueSpec {
        begin_time: Some(5_000),
        ..Default::default()
    };
    let a = submit(&mut s, "alice", "a", q).unwrap();
    let view = s.cluster_view();
    assert_eq!(view.pending[0].begin_time, Some(5_000));
    assert_eq!(view.pending[0].time_limit_secs, Some(60));
    assert!(view.running.is_empty());
    let _ = a;
}
