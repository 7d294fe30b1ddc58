//! Allocations through the state machine: a `--gpus N` job runs in the shape
//! the plan chose, and apply refuses a cpuset another job holds.

use super::run::*;
use crate::model::{JobSpec, TaskEnd, TaskEventKind};
use crate::state::*;

#[test]
fn a_gpus_total_job_starts_in_the_shape_the_plan_chose() {
    let (mut s, mut d) = cluster();
    let id = match s.apply(
        &Command::Submit {
            user: "alice".into(),
            spec: Box::new(JobSpec {
                qos: None,
                nice: 0,
                total_gpus: Some(16),
                ..spec(1, 16)
            }),
            now: 2,
        },
        &mut d,
    ) {
        CommandResult::Submitted { id } => id,
        other => panic!("{other:?}"),
    };
    let plan = crate::sched::plan(&s.cluster_view(), 3);
    assert_eq!(plan.allocations.len(), 1, "{plan:?}");
    let r = s.apply(
        &Command::Schedule {
            allocations: plan.allocations,
            now: 5,
        },
        &mut d,
    );
    assert!(
        matches!(r, CommandResult::Scheduled { ref started, .. } if started == &[id]),
        "{r:?}"
    );
    let job = &s.jobs[&id];
    assert_eq!((job.spec.nodes, job.spec.gpus_per_node), (2, 8));
    assert_eq!((job.spec.total_gpus, job.spec.total_tasks()), (Some(16), 2));
    assert_eq!(job.spec.check_invariants(), Ok(()));
    assert_eq!((s.desired_on("n1").len(), s.desired_on("n2").len()), (1, 1));
    for (node, rank) in [("n1", 0), ("n2", 1)] {
        report(
            &mut s,
            &mut d,
            node,
            vec![ev(id, rank, TaskEventKind::Ended(TaskEnd::Completed))],
        );
    }
    assert_eq!(s.jobs[&id].state, JobState::Completed);
}

#[test]
fn apply_refuses_a_cpuset_another_job_holds() {
    let (mut s, mut d) = cluster();
    let a = submit(&mut s, &mut d, 1, 1);
    let b = submit(&mut s, &mut d, 1, 1);
    let with_cpus = |job: JobId, gpu: u32, cpus: std::ops::Range<u32>| {
        let mut al = alloc(job.0, &[("n1", &[gpu])]);
        al.nodes[0].cpus = cpus.collect();
        al
    };
    let r = s.apply(
        &Command::Schedule {
            allocations: vec![with_cpus(a, 0, 0..4), with_cpus(b, 1, 2..6)],
            now: 5,
        },
        &mut d,
    );
    assert_eq!(
        r,
        CommandResult::Scheduled {
            started: vec![a],
            skipped: vec![(b, "CPU 2 on node n1 is in another job's cpuset".into())]
        }
    );
    // And a pass now picks CPUs around job a's.
    let plan = crate::sched::plan(&s.cluster_view(), 6);
    assert_eq!(plan.allocations[0].nodes[0].cpus, [4, 5, 6, 7]);
}
