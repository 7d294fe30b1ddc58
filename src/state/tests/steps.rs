//! Job steps through the state machine: who may start one and where, its
//! tasks' events, a batch job ending with its script while steps run, an
//! allocation released or past its limit, and a lost node taking its step
//! tasks along.

use super::run::{alloc, cluster, ev, report, spec};
use crate::model::{Launch, Program, StepSpec, TaskEnd, TaskEvent, TaskEventKind, TaskKey};
use crate::state::*;

fn step_spec(nodes: &[u32], tasks: &[u32]) -> StepSpec {
    StepSpec {
        name: "hostname".into(),
        program: Program::Command {
            argv: vec!["hostname".into()],
        },
        nodes: nodes.to_vec(),
        tasks: tasks.to_vec(),
        cpus_per_task: 1,
        gpus_per_task: None,
        workdir: "/tmp".into(),
        env: vec![("A".into(), "1".into())],
        output: None,
        error: None,
        kill_on_bad_exit: false,
        io: Default::default(),
        container: None,
    }
}

/// A running two-node job launched as `launch` on GPUs 0-3 of n1 and n2
/// (4-7 with `high`), with a time limit.
fn running_on(s: &mut State, d: &mut Dirty, launch: Launch, high: bool) -> JobId {
    let mut sp = spec(2, 4);
    sp.launch = launch;
    sp.time_limit_secs = Some(60);
    let gpus: &[u32] = if high { &[4, 5, 6, 7] } else { &[0, 1, 2, 3] };
    let id = match s.apply(
        &Command::Submit {
            user: "alice".into(),
            spec: Box::new(sp),
            now: 2,
        },
        d,
    ) {
        CommandResult::Submitted { id } => id,
        other => panic!("{other:?}"),
    };
    s.apply(
        &Command::Schedule {
            allocations: vec![alloc(id.0, &[("n1", gpus), ("n2", gpus)])],
            now: 5,
        },
        d,
    );
    assert_eq!(s.jobs[&id].state, JobState::Running);
    id
}

fn running(s: &mut State, d: &mut Dirty, launch: Launch) -> JobId {
    running_on(s, d, launch, false)
}

fn start_step(s: &mut State, d: &mut Dirty, id: JobId, by: &str, st: StepSpec) -> CommandResult {
    s.apply(
        &Command::StepStart {
            by: by.into(),
            admin: false,
            job: id,
            spec: Box::new(st),
            now: 20_000,
        },
        d,
    )
}

fn step_ev(job: JobId, step: u32, rank: u32, kind: TaskEventKind) -> TaskEvent {
    TaskEvent {
        key: TaskKey {
            job,
            attempt: 0,
            rank,
            step: Some(step),
        },
        kind,
    }
}

#[test]
fn steps_start_in_a_running_job_for_its_owner_only() {
    let (mut s, mut d) = cluster();
    let id = running(&mut s, &mut d, Launch::Batch);
    let r = start_step(&mut s, &mut d, id, "bob", step_spec(&[0], &[1]));
    assert!(
        matches!(r, CommandResult::Rejected(Rejection::NotOwner { .. })),
        "{r:?}"
    );
    let r = start_step(&mut s, &mut d, id, "alice", step_spec(&[2], &[1]));
    assert!(
        matches!(r, CommandResult::Rejected(Rejection::InvalidSpec(_))),
        "{r:?}"
    );
    let r = start_step(&mut s, &mut d, id, "alice", step_spec(&[0, 1], &[2, 1]));
    assert_eq!(r, CommandResult::StepStarted { step: 0 });
    let r = start_step(&mut s, &mut d, id, "alice", step_spec(&[1], &[1]));
    assert_eq!(r, CommandResult::StepStarted { step: 1 });
    let step = &s.jobs[&id].run.as_ref().unwrap().steps[0];
    // A 60 s limit, started at 5 ms, the step at 20 s: 19 whole seconds
    // used, 41 left.
    assert_eq!(step.time_limit_secs, Some(41));
    let pending = match s.apply(
        &Command::Submit {
            user: "alice".into(),
            spec: Box::new(spec(1, 8)),
            now: 30,
        },
        &mut d,
    ) {
        CommandResult::Submitted { id } => id,
        other => panic!("{other:?}"),
    };
    let r = start_step(&mut s, &mut d, pending, "alice", step_spec(&[0], &[1]));
    assert!(
        matches!(r, CommandResult::Rejected(Rejection::NotRunning { .. })),
        "{r:?}"
    );
}

#[test]
fn a_step_ends_with_its_tasks_and_never_fails_the_job() {
    let (mut s, mut d) = cluster();
    let id = running(&mut s, &mut d, Launch::Batch);
    start_step(&mut s, &mut d, id, "alice", step_spec(&[0, 1], &[2, 1]));
    // Rank 2 runs on n2: n1 reporting it changes nothing.
    let wrong = step_ev(id, 0, 2, TaskEventKind::Started);
    assert_eq!(report(&mut s, &mut d, "n1", vec![wrong.clone()]), 0);
    assert_eq!(report(&mut s, &mut d, "n2", vec![wrong]), 1);
    let failed = TaskEnd::Failed {
        exit_code: Some(3),
        signal: None,
    };
    let ends = vec![
        step_ev(id, 0, 0, TaskEventKind::Ended(TaskEnd::Completed)),
        step_ev(id, 0, 1, TaskEventKind::Ended(failed.clone())),
    ];
    assert_eq!(report(&mut s, &mut d, "n1", ends.clone()), 2);
    assert_eq!(
        report(&mut s, &mut d, "n1", ends),
        0,
        "a repeat changes nothing"
    );
    let step = &s.jobs[&id].run.as_ref().unwrap().steps[0];
    assert!(!step.is_over());
    report(
        &mut s,
        &mut d,
        "n2",
        vec![step_ev(id, 0, 2, TaskEventKind::Ended(TaskEnd::Completed))],
    );
    let step = &s.jobs[&id].run.as_ref().unwrap().steps[0];
    assert!(step.is_over());
    assert_eq!(step.exit_code(), 3);
    assert!(
        step.spec.env.is_empty(),
        "an ended step drops its environment"
    );
    assert_eq!(
        s.jobs[&id].state,
        JobState::Running,
        "a step's failure is not the job's"
    );
}

#[test]
fn the_batch_script_ending_stops_its_steps_then_completes_the_job() {
    let (mut s, mut d) = cluster();
    let id = running(&mut s, &mut d, Launch::Batch);
    start_step(&mut s, &mut d, id, "alice", step_spec(&[1], &[1]));
    report(
        &mut s,
        &mut d,
        "n1",
        vec![ev(id, 0, TaskEventKind::Ended(TaskEnd::Completed))],
    );
    assert_eq!(
        s.jobs[&id].state,
        JobState::Completing,
        "the step still runs"
    );
    report(
        &mut s,
        &mut d,
        "n2",
        vec![step_ev(id, 0, 0, TaskEventKind::Ended(TaskEnd::Cancelled))],
    );
    assert_eq!(s.jobs[&id].state, JobState::Completed);
    assert_eq!(s.jobs[&id].exit_code, Some(0));

    // sacct's rows: the batch step on the first node, then step 0, stopped.
    use crate::model::acct::{AcctRecord, StepName};
    let rec = AcctRecord::from_job(&s.jobs[&id]);
    let steps: Vec<(StepName, JobState, Option<i32>, Vec<String>)> = rec
        .detail
        .steps
        .iter()
        .map(|st| (st.id, st.state, st.signal, st.nodes.clone()))
        .collect();
    assert_eq!(
        steps,
        vec![
            (
                StepName::Batch,
                JobState::Completed,
                None,
                vec!["n1".into()]
            ),
            (
                StepName::Step(0),
                JobState::Cancelled,
                Some(15),
                vec!["n2".into()]
            ),
        ]
    );
    assert_eq!(
        (rec.detail.req_nodes, rec.detail.ntasks, rec.detail.cpus),
        (2, 2, 8)
    );
}

#[test]
fn a_cancelled_step_stops_and_an_allocation_is_released() {
    let (mut s, mut d) = cluster();
    let id = running(&mut s, &mut d, Launch::Allocation);
    start_step(&mut s, &mut d, id, "alice", step_spec(&[0], &[1]));
    let cancel = Command::StepCancel {
        by: "alice".into(),
        admin: false,
        job: id,
        step: 0,
        now: 30,
    };
    assert_eq!(s.apply(&cancel, &mut d), CommandResult::StepCancelled);
    assert!(s.jobs[&id].run.as_ref().unwrap().steps[0].cancelled);
    let missing = Command::StepCancel {
        by: "alice".into(),
        admin: false,
        job: id,
        step: 7,
        now: 30,
    };
    assert!(matches!(
        s.apply(&missing, &mut d),
        CommandResult::Rejected(Rejection::NoSuchStep { .. })
    ));
    let release = |by: &str| Command::Release {
        by: by.into(),
        admin: false,
        job: id,
        now: 40,
    };
    assert!(matches!(
        s.apply(&release("bob"), &mut d),
        CommandResult::Rejected(Rejection::NotOwner { .. })
    ));
    assert_eq!(s.apply(&release("alice"), &mut d), CommandResult::Released);
    assert_eq!(s.jobs[&id].state, JobState::Completing);
    report(
        &mut s,
        &mut d,
        "n1",
        vec![step_ev(id, 0, 0, TaskEventKind::Ended(TaskEnd::Cancelled))],
    );
    assert_eq!(s.jobs[&id].state, JobState::Completed);
}

#[test]
fn allocations_expire_at_their_limit_and_others_never_do() {
    let (mut s, mut d) = cluster();
    let a = running(&mut s, &mut d, Launch::Allocation);
    let b = running_on(&mut s, &mut d, Launch::Ranks, true);
    let early = Command::Expire {
        jobs: vec![a, b],
        now: 59_000,
    };
    assert_eq!(
        s.apply(&early, &mut d),
        CommandResult::Expired { ids: vec![] }
    );
    let late = Command::Expire {
        jobs: vec![a, b],
        now: 61_000,
    };
    assert_eq!(
        s.apply(&late, &mut d),
        CommandResult::Expired { ids: vec![a] }
    );
    assert_eq!(
        s.jobs[&a].state,
        JobState::Timeout,
        "no tasks: it ends at once"
    );
    assert_eq!(
        s.jobs[&b].state,
        JobState::Running,
        "its shims keep its limit"
    );
}

#[test]
fn a_lost_node_takes_its_step_tasks_along() {
    let (mut s, mut d) = cluster();
    let id = running(&mut s, &mut d, Launch::Batch);
    start_step(&mut s, &mut d, id, "alice", step_spec(&[0, 1], &[1, 1]));
    s.apply(
        &Command::NodeDown {
            node: "n2".into(),
            reason: "gone".into(),
            now: 50,
        },
        &mut d,
    );
    let job = &s.jobs[&id];
    let step = &job.run.as_ref().unwrap().steps[0];
    assert!(
        matches!(step.ended.get(&1), Some(TaskEnd::Lost { .. })),
        "{step:?}"
    );
    assert!(!step.ended.contains_key(&0));
    assert_eq!(job.state, JobState::Completing);
}

#[test]
fn an_allocation_asked_with_a_first_step_starts_it_with_the_job() {
    let (mut s, mut d) = cluster();
    let mut sp = spec(2, 4);
    sp.launch = Launch::Allocation;
    sp.first_step = Some(Box::new(step_spec(&[0, 1], &[1, 1])));
    let id = match s.apply(
        &Command::Submit {
            user: "alice".into(),
            spec: Box::new(sp),
            now: 2,
        },
        &mut d,
    ) {
        CommandResult::Submitted { id } => id,
        other => panic!("{other:?}"),
    };
    s.apply(
        &Command::Schedule {
            allocations: vec![alloc(id.0, &[("n1", &[0, 1, 2, 3]), ("n2", &[0, 1, 2, 3])])],
            now: 5,
        },
        &mut d,
    );
    let steps = &s.jobs[&id].run.as_ref().unwrap().steps;
    assert_eq!(steps.len(), 1);
    assert_eq!(steps[0].spec.ntasks(), 2);
    // A batch job may not ask for one.
    let mut bad = spec(1, 1);
    bad.launch = Launch::Batch;
    bad.first_step = Some(Box::new(step_spec(&[0], &[1])));
    let r = s.apply(
        &Command::Submit {
            user: "alice".into(),
            spec: Box::new(bad),
            now: 6,
        },
        &mut d,
    );
    assert!(matches!(r, CommandResult::Rejected(_)), "{r:?}");
}

#[test]
fn an_allocation_whose_client_stops_renewing_it_is_released_and_nothing_else_is() {
    let (mut s, mut d) = cluster();
    let a = running(&mut s, &mut d, Launch::Allocation);
    let b = running_on(&mut s, &mut d, Launch::Ranks, true);
    let sweep = |now, limit_secs| Command::ReleaseInactive {
        jobs: vec![a, b],
        now,
        limit_secs,
    };
    let renew = |by: &str, job, now| Command::Keepalive {
        by: by.into(),
        admin: false,
        job,
        now,
    };
    // Counted from its start (5 ms) until a renewal.
    let none = CommandResult::Expired { ids: vec![] };
    assert_eq!(s.apply(&sweep(10_004, 10), &mut d), none);
    assert!(matches!(
        s.apply(&renew("bob", a, 8_000), &mut d),
        CommandResult::Rejected(Rejection::NotOwner { .. })
    ));
    assert!(matches!(
        s.apply(&renew("alice", b, 8_000), &mut d),
        CommandResult::Rejected(Rejection::InvalidSpec(_))
    ));
    assert_eq!(
        s.apply(&renew("alice", a, 8_000), &mut d),
        CommandResult::KeptAlive
    );
    // A renewal replayed late never moves the time back.
    s.apply(&renew("alice", a, 7_000), &mut d);
    assert_eq!(s.apply(&sweep(17_999, 10), &mut d), none);
    assert_eq!(s.apply(&sweep(1_000_000, 0), &mut d), none, "0: never");
    assert_eq!(
        s.apply(&sweep(18_000, 10), &mut d),
        CommandResult::Expired { ids: vec![a] }
    );
    assert_eq!(s.jobs[&a].state, JobState::Timeout);
    let reason = s.jobs[&a].reason.clone().unwrap_or_default();
    assert!(reason.contains("stopped renewing"), "{reason}");
    assert_eq!(s.jobs[&b].state, JobState::Running);
}
