//! Elastic jobs in the state: growth (`Command::Resize`) and shrinking
//! (`Command::Preempt` with shrinks) stop every rank, then the next attempt
//! starts on the new nodes, the job RUNNING throughout.

use super::run::{alloc, cluster, spec, start};
use crate::model::{JobState, NodeRange, TaskEnd, TaskEvent, TaskEventKind, TaskKey};
use crate::sched::{Growth, Preemption};
use crate::state::*;

fn ended(job: JobId, attempt: u32, rank: u32, end: TaskEnd) -> TaskEvent {
    TaskEvent {
        key: TaskKey {
            job,
            attempt,
            rank,
            step: None,
        },
        kind: TaskEventKind::Ended(end),
    }
}

fn report(s: &mut State, d: &mut Dirty, node: &str, events: Vec<TaskEvent>, now: u64) {
    s.apply(
        &Command::TaskEvents {
            node: node.into(),
            events,
            now,
            gpu_use: Vec::new(),
        },
        d,
    );
}

#[test]
fn an_elastic_job_grows_and_shrinks_in_place_with_a_new_attempt_each_time() {
    let (mut s, mut d) = cluster();
    let mut elastic = spec(1, 4);
    elastic.placement.elastic = Some(NodeRange { min: 1, max: 2 });
    let CommandResult::Submitted { id } = s.apply(
        &Command::Submit {
            user: "alice".into(),
            spec: Box::new(elastic),
            now: 2,
        },
        &mut d,
    ) else {
        panic!()
    };
    start(&mut s, &mut d, id, &[("n1", &[0, 1, 2, 3])]);
    // Growing past its maximum, or onto a node it has, is refused.
    let grow = |nodes: &[(&str, &[u32])]| Command::Resize {
        growths: vec![Growth {
            job: id,
            added: alloc(id.0, nodes),
        }],
        now: 6,
    };
    let r = s.apply(&grow(&[("n1", &[4, 5, 6, 7])]), &mut d);
    assert!(
        matches!(&r, CommandResult::Resized { grown, .. } if grown.is_empty()),
        "{r:?}"
    );
    let r = s.apply(&grow(&[("n2", &[0, 1, 2, 3])]), &mut d);
    assert!(
        matches!(&r, CommandResult::Resized { grown, .. } if grown == &vec![id]),
        "{r:?}"
    );
    // Its rank stops; the job holds both nodes meanwhile and runs nothing.
    let j = &s.jobs[&id];
    assert_eq!(j.state, JobState::Running);
    assert_eq!(j.run.as_ref().unwrap().allocation.nodes.len(), 2);
    assert!(s.desired_on("n1").is_empty() && s.desired_on("n2").is_empty());
    assert!(s.index.node_views["n2"].used.gpus.contains(&0));
    // The stopped rank's non-zero end does not fail it: attempt 1 starts.
    report(
        &mut s,
        &mut d,
        "n1",
        vec![ended(id, 0, 0, TaskEnd::Cancelled)],
        20,
    );
    let j = &s.jobs[&id];
    let run = j.run.as_ref().unwrap();
    assert_eq!(
        (j.state, j.spec.nodes, run.attempt),
        (JobState::Running, 2, 1)
    );
    assert_eq!(run.node_names(), ["n1", "n2"]);
    assert_eq!(j.restart_count, 0, "a resize is no requeue");
    assert_eq!(s.desired_on("n2").len(), 1);
    let r = &j.resizes[0];
    assert_eq!(
        (r.from_nodes, r.to_nodes, r.from_gpus, r.to_gpus),
        (1, 2, 4, 8)
    );

    // A preemptor takes n2 back: it shrinks to n1 instead of being stopped.
    let CommandResult::Submitted { id: by } = s.apply(
        &Command::Submit {
            user: "bob".into(),
            spec: Box::new(spec(1, 4)),
            now: 30,
        },
        &mut d,
    ) else {
        panic!()
    };
    let r = s.apply(
        &Command::Preempt {
            preemptions: vec![Preemption {
                job: by,
                victims: vec![],
                why: vec!["QoS high preempts QoS normal".into()],
                shrinks: vec![alloc(id.0, &[("n1", &[0, 1, 2, 3])])],
            }],
            now: 31,
        },
        &mut d,
    );
    assert!(
        matches!(&r, CommandResult::Preempted { stopped, .. } if stopped == &vec![id]),
        "{r:?}"
    );
    report(
        &mut s,
        &mut d,
        "n1",
        vec![ended(id, 1, 0, TaskEnd::Cancelled)],
        40,
    );
    assert_eq!(
        s.jobs[&id].run.as_ref().unwrap().attempt,
        1,
        "rank 1 still runs"
    );
    report(
        &mut s,
        &mut d,
        "n2",
        vec![ended(id, 1, 1, TaskEnd::Cancelled)],
        41,
    );
    let j = &s.jobs[&id];
    let run = j.run.as_ref().unwrap();
    assert_eq!(
        (j.state, j.spec.nodes, run.attempt),
        (JobState::Running, 1, 2)
    );
    assert!(j.resizes[1]
        .why
        .contains(&format!("gave nodes back to job {by}")));
    assert!(!s.index.node_views["n2"].used.gpus.contains(&0));
    // Below its minimum it cannot shrink: the preemption is skipped whole.
    let r = s.apply(
        &Command::Preempt {
            preemptions: vec![Preemption {
                job: by,
                victims: vec![],
                why: vec![],
                shrinks: vec![alloc(id.0, &[])],
            }],
            now: 50,
        },
        &mut d,
    );
    assert!(
        matches!(&r, CommandResult::Preempted { skipped, .. } if skipped == &vec![by]),
        "{r:?}"
    );
    // Accounting charges each size over its span: 4 GPUs 5..20, 8 GPUs
    // 20..41, 4 GPUs 41..100.
    report(
        &mut s,
        &mut d,
        "n1",
        vec![ended(id, 2, 0, TaskEnd::Completed)],
        100,
    );
    let j = &s.jobs[&id];
    assert_eq!(j.state, JobState::Completed);
    let rec = crate::model::acct::AcctRecord::from_job(j);
    let want = (4 * 15 + 8 * 21 + 4 * 59) as f64 / 3_600_000.0;
    assert!(
        (rec.gpu_hours - want).abs() < 1e-12,
        "{} vs {want}",
        rec.gpu_hours
    );
}
