//! Running jobs through the state machine: scheduling decisions re-checked on
//! apply, idempotent task events, COMPLETING until every rank ended.

use super::*;
use crate::model::{
    Allocation, GpuInfo, GpuLink, JobSpec, NodeAllocation, NodeInventory, NumaNode, Program,
    TaskEnd, TaskEvent, TaskEventKind,
};

fn inventory(name: &str, gpus: u32) -> NodeInventory {
    NodeInventory {
        name: name.into(),
        gpus: (0..gpus)
            .map(|i| GpuInfo {
                index: i,
                uuid: format!("GPU-{name}-{i}"),
                model: "H100".into(),
                memory_mb: 81920,
                pci_bus_id: format!("0000:{i:02x}:00.0"),
                numa_node: Some(i / 4),
                healthy: true,
                fault: None,
            })
            .collect(),
        gpu_links: (0..gpus)
            .map(|i| {
                (0..gpus)
                    .map(|j| {
                        if i == j {
                            GpuLink::SelfLink
                        } else {
                            GpuLink::NvLink(18)
                        }
                    })
                    .collect()
            })
            .collect(),
        numa: vec![NumaNode {
            id: 0,
            cpus: (0..64).collect(),
            memory_mb: 512 * 1024,
        }],
        cpus: 64,
        memory_mb: 512 * 1024,
        topology: String::new(),
        features: vec![],
    }
}

fn spec(nodes: u32, gpus: u32) -> JobSpec {
    JobSpec {
        name: "train".into(),
        nodes,
        ntasks_per_node: 1,
        gpus_per_node: gpus,
        cpus_per_task: 4,
        mem_per_node_mb: Some(1024),
        time_limit_secs: None,
        account: None,
        partition: None,
        output: None,
        error: None,
        workdir: "/tmp".into(),
        env: vec![],
        export: Default::default(),
        total_gpus: None,
        placement: Default::default(),
        program: Program::Command {
            argv: vec!["true".into()],
        },
    }
}

fn alloc(job: u64, nodes: &[(&str, &[u32])]) -> Allocation {
    Allocation {
        job: JobId(job),
        nodes: nodes
            .iter()
            .map(|(n, g)| NodeAllocation {
                node: n.to_string(),
                gpus: g.to_vec(),
                cpus: vec![],
                cpu_count: 4,
                memory_mb: 1024,
            })
            .collect(),
    }
}

fn cluster() -> (State, Dirty) {
    let mut s = State::default();
    let mut d = Dirty::default();
    for (n, addr) in [("n1", "10.1.0.1:7421"), ("n2", "10.1.0.2:7421")] {
        s.apply(
            &Command::RegisterNode {
                inventory: inventory(n, 8),
                addr: addr.into(),
                now: 1,
            },
            &mut d,
        );
    }
    (s, d)
}

fn submit(s: &mut State, d: &mut Dirty, nodes: u32, gpus: u32) -> JobId {
    match s.apply(
        &Command::Submit {
            user: "alice".into(),
            spec: Box::new(spec(nodes, gpus)),
            now: 2,
        },
        d,
    ) {
        CommandResult::Submitted { id } => id,
        other => panic!("{other:?}"),
    }
}

fn ev(job: JobId, rank: u32, kind: TaskEventKind) -> TaskEvent {
    TaskEvent {
        job,
        attempt: 0,
        rank,
        kind,
    }
}

fn report(s: &mut State, d: &mut Dirty, node: &str, events: Vec<TaskEvent>) -> u32 {
    match s.apply(
        &Command::TaskEvents {
            node: node.into(),
            events,
            now: 10,
        },
        d,
    ) {
        CommandResult::TaskEventsApplied { applied } => applied,
        other => panic!("{other:?}"),
    }
}

#[test]
fn schedule_starts_gangs_whole_and_assigns_unique_master_ports() {
    let (mut s, mut d) = cluster();
    let a = submit(&mut s, &mut d, 2, 4);
    let b = submit(&mut s, &mut d, 1, 4);
    let r = s.apply(
        &Command::Schedule {
            allocations: vec![
                alloc(a.0, &[("n1", &[0, 1, 2, 3]), ("n2", &[0, 1, 2, 3])]),
                alloc(b.0, &[("n1", &[4, 5, 6, 7])]),
            ],
            now: 5,
        },
        &mut d,
    );
    assert_eq!(
        r,
        CommandResult::Scheduled {
            started: vec![a, b],
            skipped: vec![]
        }
    );
    let ra = s.jobs[&a].run.clone().unwrap();
    let rb = s.jobs[&b].run.clone().unwrap();
    assert_eq!(s.jobs[&a].state, JobState::Running);
    assert_eq!(ra.master_addr, "10.1.0.1");
    assert_ne!(ra.master_port, rb.master_port, "unique MASTER_PORT on n1");
    assert_eq!(s.desired_on("n2").len(), 1);
    assert_eq!(s.desired_on("n1").len(), 2);
}

#[test]
fn apply_rechecks_allocations_and_never_oversubscribes() {
    let (mut s, mut d) = cluster();
    let a = submit(&mut s, &mut d, 1, 8);
    let b = submit(&mut s, &mut d, 1, 1);
    s.apply(
        &Command::Schedule {
            allocations: vec![alloc(a.0, &[("n1", &[0, 1, 2, 3, 4, 5, 6, 7])])],
            now: 5,
        },
        &mut d,
    );
    // A stale plan that puts b on a GPU a holds is skipped, b stays pending.
    let r = s.apply(
        &Command::Schedule {
            allocations: vec![alloc(b.0, &[("n1", &[3])])],
            now: 6,
        },
        &mut d,
    );
    match r {
        CommandResult::Scheduled { started, skipped } => {
            assert!(started.is_empty());
            assert_eq!(skipped.len(), 1);
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(s.jobs[&b].state, JobState::Pending);
    // A gang with one bad node starts nowhere.
    let c = submit(&mut s, &mut d, 2, 8);
    s.apply(
        &Command::Schedule {
            allocations: vec![alloc(
                c.0,
                &[
                    ("n2", &[0, 1, 2, 3, 4, 5, 6, 7]),
                    ("n1", &[0, 1, 2, 3, 4, 5, 6, 7]),
                ],
            )],
            now: 7,
        },
        &mut d,
    );
    assert_eq!(s.jobs[&c].state, JobState::Pending);
    assert!(s.jobs[&c].run.is_none());
}

#[test]
fn all_ranks_completing_completes_the_job_and_repeats_change_nothing() {
    let (mut s, mut d) = cluster();
    let a = submit(&mut s, &mut d, 2, 8);
    s.apply(
        &Command::Schedule {
            allocations: vec![alloc(
                a.0,
                &[
                    ("n1", &[0, 1, 2, 3, 4, 5, 6, 7]),
                    ("n2", &[0, 1, 2, 3, 4, 5, 6, 7]),
                ],
            )],
            now: 5,
        },
        &mut d,
    );
    assert_eq!(
        report(&mut s, &mut d, "n1", vec![ev(a, 0, TaskEventKind::Started)]),
        1
    );
    assert_eq!(
        report(&mut s, &mut d, "n1", vec![ev(a, 0, TaskEventKind::Started)]),
        0
    );
    // A report for rank 1 from the wrong node is ignored.
    assert_eq!(
        report(
            &mut s,
            &mut d,
            "n1",
            vec![ev(a, 1, TaskEventKind::Ended(TaskEnd::Completed))]
        ),
        0
    );
    let done = TaskEventKind::Ended(TaskEnd::Completed);
    report(&mut s, &mut d, "n1", vec![ev(a, 0, done.clone())]);
    assert_eq!(s.jobs[&a].state, JobState::Running);
    assert!(
        s.desired_on("n1").len() == 1,
        "the job still runs on n1 until all ranks end"
    );
    report(&mut s, &mut d, "n2", vec![ev(a, 1, done.clone())]);
    assert_eq!(s.jobs[&a].state, JobState::Completed);
    assert_eq!(s.jobs[&a].exit_code, Some(0));
    assert!(s.desired_on("n1").is_empty());
    assert_eq!(report(&mut s, &mut d, "n2", vec![ev(a, 1, done)]), 0);
    assert_eq!(
        s.node_views()
            .iter()
            .map(|v| v.used.gpus.len())
            .sum::<usize>(),
        0
    );
}

#[test]
fn one_failing_rank_stops_the_others_and_names_itself() {
    let (mut s, mut d) = cluster();
    let a = submit(&mut s, &mut d, 2, 8);
    s.apply(
        &Command::Schedule {
            allocations: vec![alloc(
                a.0,
                &[
                    ("n1", &[0, 1, 2, 3, 4, 5, 6, 7]),
                    ("n2", &[0, 1, 2, 3, 4, 5, 6, 7]),
                ],
            )],
            now: 5,
        },
        &mut d,
    );
    report(
        &mut s,
        &mut d,
        "n2",
        vec![ev(
            a,
            1,
            TaskEventKind::Ended(TaskEnd::Failed {
                exit_code: Some(3),
                signal: None,
            }),
        )],
    );
    let job = &s.jobs[&a];
    assert_eq!(job.state, JobState::Completing);
    let reason = job.reason.clone().unwrap();
    assert!(
        reason.contains("rank 1") && reason.contains("n2") && reason.contains("code 3"),
        "{reason}"
    );
    assert!(
        s.desired_on("n1").is_empty(),
        "rank 0 is no longer desired: the agent stops it"
    );
    // Its GPUs stay held until rank 0 has stopped.
    assert_eq!(
        s.node_views()
            .iter()
            .map(|v| v.used.gpus.len())
            .sum::<usize>(),
        16
    );
    report(
        &mut s,
        &mut d,
        "n1",
        vec![ev(a, 0, TaskEventKind::Ended(TaskEnd::Cancelled))],
    );
    assert_eq!(s.jobs[&a].state, JobState::Failed);
    assert_eq!(s.jobs[&a].exit_code, Some(3));
}

#[test]
fn cancel_of_a_running_job_completes_through_completing() {
    let (mut s, mut d) = cluster();
    let a = submit(&mut s, &mut d, 1, 2);
    s.apply(
        &Command::Schedule {
            allocations: vec![alloc(a.0, &[("n1", &[0, 1])])],
            now: 5,
        },
        &mut d,
    );
    let r = s.apply(
        &Command::Cancel {
            by: "alice".into(),
            admin: false,
            ids: vec![a],
            now: 6,
        },
        &mut d,
    );
    assert_eq!(r, CommandResult::Cancelled { ids: vec![a] });
    assert_eq!(s.jobs[&a].state, JobState::Completing);
    // Events of another attempt change nothing.
    let stale = TaskEvent {
        attempt: 7,
        ..ev(a, 0, TaskEventKind::Ended(TaskEnd::Completed))
    };
    assert_eq!(report(&mut s, &mut d, "n1", vec![stale]), 0);
    report(
        &mut s,
        &mut d,
        "n1",
        vec![ev(a, 0, TaskEventKind::Ended(TaskEnd::Cancelled))],
    );
    assert_eq!(s.jobs[&a].state, JobState::Cancelled);
}

#[test]
fn a_gpus_total_job_starts_in_the_shape_the_plan_chose() {
    let (mut s, mut d) = cluster();
    let id = match s.apply(
        &Command::Submit {
            user: "alice".into(),
            spec: Box::new(JobSpec {
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
