//! `scontrol requeue`: same id, back to PENDING through COMPLETING, owner or
//! admin only, all or none, held with requeuehold.

use super::run::{alloc, cluster, ev, report, spec, submit};
use crate::model::{RequeuePolicy, TaskEnd, TaskEventKind};
use crate::state::*;

fn requeue(s: &mut State, d: &mut Dirty, by: &str, ids: Vec<JobId>, hold: bool) -> CommandResult {
    s.apply(
        &Command::Requeue {
            by: by.into(),
            admin: false,
            ids,
            hold,
            now: 50,
        },
        d,
    )
}

fn start(s: &mut State, d: &mut Dirty, id: JobId, gpus: &[u32]) {
    s.apply(
        &Command::Schedule {
            allocations: vec![alloc(id.0, &[("n1", gpus)])],
            now: 5,
        },
        d,
    );
    assert_eq!(s.jobs[&id].state, JobState::Running);
}

#[test]
fn a_requeued_job_keeps_its_id_and_runs_again() {
    let (mut s, mut d) = cluster();
    let id = submit(&mut s, &mut d, 1, 1);
    start(&mut s, &mut d, id, &[0]);
    let r = requeue(&mut s, &mut d, "alice", vec![id], false);
    assert_eq!(r, CommandResult::Requeued { ids: vec![id] });
    assert_eq!(
        s.jobs[&id].state,
        JobState::Completing,
        "its rank stops first"
    );
    report(
        &mut s,
        &mut d,
        "n1",
        vec![ev(id, 0, TaskEventKind::Ended(TaskEnd::Cancelled))],
    );
    let job = &s.jobs[&id];
    assert_eq!(job.state, JobState::Pending);
    assert_eq!(job.restart_count, 1);
    assert!(!job.held);
    assert_eq!(job.end_time, None, "it never ended");
}

#[test]
fn requeuehold_holds_and_others_are_refused_whole() {
    let (mut s, mut d) = cluster();
    let a = submit(&mut s, &mut d, 1, 1);
    let b = submit(&mut s, &mut d, 1, 1);
    start(&mut s, &mut d, a, &[0]);
    let r = requeue(&mut s, &mut d, "bob", vec![a], false);
    assert!(
        matches!(r, CommandResult::Rejected(Rejection::NotOwner { .. })),
        "{r:?}"
    );
    // b is pending: a plain requeue of both changes neither.
    let r = requeue(&mut s, &mut d, "alice", vec![a, b], false);
    assert!(
        matches!(r, CommandResult::Rejected(Rejection::NotRequeueable { .. })),
        "{r:?}"
    );
    assert_eq!(s.jobs[&a].state, JobState::Running);
    let r = requeue(&mut s, &mut d, "alice", vec![a, b], true);
    assert_eq!(r, CommandResult::Requeued { ids: vec![a, b] });
    report(
        &mut s,
        &mut d,
        "n1",
        vec![ev(a, 0, TaskEventKind::Ended(TaskEnd::Cancelled))],
    );
    assert!(s.jobs[&a].held && s.jobs[&b].held);
    assert_eq!(s.jobs[&a].state, JobState::Pending);
}

#[test]
fn no_requeue_jobs_and_finished_jobs_stay_as_they_are() {
    let (mut s, mut d) = cluster();
    let mut never = spec(1, 1);
    never.requeue = RequeuePolicy::Never;
    let id = match s.apply(
        &Command::Submit {
            user: "alice".into(),
            spec: Box::new(never),
            now: 2,
        },
        &mut d,
    ) {
        CommandResult::Submitted { id } => id,
        other => panic!("{other:?}"),
    };
    start(&mut s, &mut d, id, &[0]);
    let r = requeue(&mut s, &mut d, "alice", vec![id], false);
    assert!(
        matches!(r, CommandResult::Rejected(Rejection::NotRequeueable { .. })),
        "{r:?}"
    );
    report(
        &mut s,
        &mut d,
        "n1",
        vec![ev(id, 0, TaskEventKind::Ended(TaskEnd::Completed))],
    );
    assert_eq!(s.jobs[&id].state, JobState::Completed);
    let r = requeue(&mut s, &mut d, "alice", vec![id], false);
    assert!(matches!(r, CommandResult::Rejected(_)), "{r:?}");
}
