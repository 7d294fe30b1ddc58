//! Running jobs through the state machine: scheduling decisions re-checked on
//! apply, idempotent task events, COMPLETING until every rank ended.

use crate::model::{
    Allocation, GpuInfo, JobSpec, NodeAllocation, NodeInventory, NumaNode, Program, RequeuePolicy,
    TaskEnd, TaskEvent, TaskEventKind, TaskKey,
};
use crate::state::*;

pub(super) fn inventory(name: &str, gpus: u32) -> NodeInventory {
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
                mig: None,
            })
            .collect(),
        gpu_links: crate::model::nvswitch_links(gpus as usize),
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

pub(super) fn spec(nodes: u32, gpus: u32) -> JobSpec {
    JobSpec {
        qos: None,
        nice: 0,
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

pub(super) fn alloc(job: u64, nodes: &[(&str, &[u32])]) -> Allocation {
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

pub(super) fn cluster() -> (State, Dirty) {
    let mut s = State::default();
    let mut d = Dirty::default();
    for (n, addr) in [("n1", "10.1.0.1:7421"), ("n2", "10.1.0.2:7421")] {
        s.apply(
            &Command::RegisterNode {
                inventory: inventory(n, 8),
                addr: addr.into(),
                preflight: false,
                now: 1,
                cert_sha256: String::new(),
            },
            &mut d,
        );
    }
    (s, d)
}

pub(super) fn submit(s: &mut State, d: &mut Dirty, nodes: u32, gpus: u32) -> JobId {
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

pub(super) fn ev(job: JobId, rank: u32, kind: TaskEventKind) -> TaskEvent {
    TaskEvent {
        key: TaskKey {
            job,
            attempt: 0,
            rank,
            step: None,
        },
        kind,
    }
}

pub(super) fn report(s: &mut State, d: &mut Dirty, node: &str, events: Vec<TaskEvent>) -> u32 {
    match s.apply(
        &Command::TaskEvents {
            node: node.into(),
            events,
            now: 10,
            gpu_use: Vec::new(),
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
    // What `gpuq nodes` reads: the index's view, charged by the start.
    for n in ["n1", "n2"] {
        assert_eq!(s.node_view(n).map(|v| v.used.gpus.len()), Some(8), "{n}");
    }
    assert_eq!(s.node_view("nowhere"), None);
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
    assert_eq!(s.node_view("n1").map(|v| v.used.gpus.len()), Some(0));
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
    let mut stale = ev(a, 0, TaskEventKind::Ended(TaskEnd::Completed));
    stale.key.attempt = 7;
    assert_eq!(report(&mut s, &mut d, "n1", vec![stale]), 0);
    report(
        &mut s,
        &mut d,
        "n1",
        vec![ev(a, 0, TaskEventKind::Ended(TaskEnd::Cancelled))],
    );
    assert_eq!(s.jobs[&a].state, JobState::Cancelled);
}

pub(super) fn start(s: &mut State, d: &mut Dirty, job: JobId, nodes: &[(&str, &[u32])]) {
    let r = s.apply(
        &Command::Schedule {
            allocations: vec![alloc(job.0, nodes)],
            now: 5,
        },
        d,
    );
    assert!(
        matches!(r, CommandResult::Scheduled { ref started, .. } if started == &vec![job]),
        "{r:?}"
    );
}

#[test]
fn a_lost_node_requeues_its_jobs_with_the_same_id_and_stops_the_other_ranks() {
    let (mut s, mut d) = cluster();
    let a = submit(&mut s, &mut d, 2, 8);
    start(
        &mut s,
        &mut d,
        a,
        &[
            ("n1", &[0, 1, 2, 3, 4, 5, 6, 7]),
            ("n2", &[0, 1, 2, 3, 4, 5, 6, 7]),
        ],
    );
    s.apply(
        &Command::NodeDown {
            node: "n2".into(),
            reason: "no heartbeat for 10 s".into(),
            now: 20,
        },
        &mut d,
    );
    assert!(matches!(s.nodes["n2"].status, NodeStatus::Down { .. }));
    let job = &s.jobs[&a];
    assert_eq!(
        job.state,
        JobState::Completing,
        "rank 0 on n1 must stop first"
    );
    assert!(s.desired_on("n1").is_empty());
    report(
        &mut s,
        &mut d,
        "n1",
        vec![ev(a, 0, TaskEventKind::Ended(TaskEnd::Cancelled))],
    );
    let job = &s.jobs[&a];
    assert_eq!(job.state, JobState::Pending);
    assert_eq!(job.restart_count, 1);
    assert!(
        job.reason.as_deref().unwrap().contains("n2"),
        "{:?}",
        job.reason
    );
    // The next attempt's events are keyed by attempt 1; attempt 0's change nothing.
    assert_eq!(
        report(&mut s, &mut d, "n1", vec![ev(a, 0, TaskEventKind::Started)]),
        0
    );
    // The node comes back when its agent registers again.
    s.apply(
        &Command::RegisterNode {
            inventory: inventory("n2", 8),
            addr: "10.1.0.2:7421".into(),
            preflight: false,
            now: 30,
            cert_sha256: String::new(),
        },
        &mut d,
    );
    assert_eq!(s.nodes["n2"].status, NodeStatus::Up);
}

#[test]
fn requeue_policies_and_the_restart_cap() {
    let (mut s, mut d) = cluster();
    // --no-requeue: a lost node ends the job NODE_FAIL.
    let never = match s.apply(
        &Command::Submit {
            user: "alice".into(),
            spec: Box::new(JobSpec {
                qos: None,
                nice: 0,
                requeue: RequeuePolicy::Never,
                ..spec(1, 8)
            }),
            now: 2,
        },
        &mut d,
    ) {
        CommandResult::Submitted { id } => id,
        other => panic!("{other:?}"),
    };
    start(&mut s, &mut d, never, &[("n1", &[0, 1, 2, 3, 4, 5, 6, 7])]);
    s.apply(
        &Command::NodeDown {
            node: "n1".into(),
            reason: "gone".into(),
            now: 9,
        },
        &mut d,
    );
    assert_eq!(s.jobs[&never].state, JobState::NodeFail);

    // --requeue: a non-zero exit requeues, up to max_restarts, then FAILED.
    let always = match s.apply(
        &Command::Submit {
            user: "alice".into(),
            spec: Box::new(JobSpec {
                qos: None,
                nice: 0,
                requeue: RequeuePolicy::Always,
                max_restarts: 1,
                ..spec(1, 8)
            }),
            now: 2,
        },
        &mut d,
    ) {
        CommandResult::Submitted { id } => id,
        other => panic!("{other:?}"),
    };
    let fail = TaskEventKind::Ended(TaskEnd::Failed {
        exit_code: Some(1),
        signal: None,
    });
    start(&mut s, &mut d, always, &[("n2", &[0, 1, 2, 3, 4, 5, 6, 7])]);
    report(&mut s, &mut d, "n2", vec![ev(always, 0, fail.clone())]);
    assert_eq!(s.jobs[&always].state, JobState::Pending);
    assert_eq!(s.jobs[&always].restart_count, 1);
    start(&mut s, &mut d, always, &[("n2", &[0, 1, 2, 3, 4, 5, 6, 7])]);
    report(
        &mut s,
        &mut d,
        "n2",
        vec![{
            let mut ev = ev(always, 0, fail);
            ev.key.attempt = 1;
            ev
        }],
    );
    assert_eq!(
        s.jobs[&always].state,
        JobState::Failed,
        "the cap is reached"
    );

    // The default policy does not requeue a program's own failure.
    let plain = submit(&mut s, &mut d, 1, 8);
    start(&mut s, &mut d, plain, &[("n2", &[0, 1, 2, 3, 4, 5, 6, 7])]);
    report(
        &mut s,
        &mut d,
        "n2",
        vec![ev(
            plain,
            0,
            TaskEventKind::Ended(TaskEnd::Failed {
                exit_code: Some(2),
                signal: None,
            }),
        )],
    );
    assert_eq!(s.jobs[&plain].state, JobState::Failed);
}

#[test]
fn an_unhealthy_gpu_drains_the_node_and_requeues_only_the_job_on_it() {
    let (mut s, mut d) = cluster();
    let on3 = submit(&mut s, &mut d, 1, 4);
    let other = submit(&mut s, &mut d, 1, 4);
    start(&mut s, &mut d, on3, &[("n1", &[0, 1, 2, 3])]);
    start(&mut s, &mut d, other, &[("n1", &[4, 5, 6, 7])]);
    let mut gpus = inventory("n1", 8).gpus;
    gpus[3].healthy = false;
    gpus[3].fault = Some("XID 79 (GPU fell off the bus)".into());
    s.apply(
        &Command::GpuHealth {
            node: "n1".into(),
            gpus: gpus.clone(),
            now: 9,
        },
        &mut d,
    );
    match &s.nodes["n1"].status {
        NodeStatus::Drained { reason, by, .. } => {
            assert!(
                reason.contains("GPU 3") && reason.contains("XID 79"),
                "{reason}"
            );
            assert_eq!(*by, DrainSource::Gpu);
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(
        s.jobs[&on3].state,
        JobState::Pending,
        "requeued (its rank was lost)"
    );
    assert_eq!(s.jobs[&other].state, JobState::Running, "untouched");
    // Reporting the same health again changes nothing more.
    s.apply(
        &Command::GpuHealth {
            node: "n1".into(),
            gpus,
            now: 10,
        },
        &mut d,
    );
    assert_eq!(s.jobs[&other].state, JobState::Running);
}

#[test]
fn a_health_check_resumes_only_its_own_drain() {
    let (mut s, mut d) = cluster();
    let drain = |by, reason: Option<&str>| Command::SetDrain {
        node: "n1".into(),
        drain: reason.map(str::to_string),
        by,
        user: None,
        requeue_now: false,
        now: 9,
    };
    s.apply(&drain(DrainSource::Admin, Some("maintenance")), &mut d);
    s.apply(&drain(DrainSource::HealthCheck, None), &mut d);
    assert!(
        matches!(s.nodes["n1"].status, NodeStatus::Drained { .. }),
        "admin drain stays"
    );
    s.apply(&drain(DrainSource::Admin, None), &mut d);
    assert_eq!(s.nodes["n1"].status, NodeStatus::Up);
    s.apply(&drain(DrainSource::HealthCheck, Some("disk full")), &mut d);
    s.apply(&drain(DrainSource::HealthCheck, None), &mut d);
    assert_eq!(s.nodes["n1"].status, NodeStatus::Up);
    let r = s.apply(
        &Command::SetDrain {
            node: "n9".into(),
            drain: None,
            by: DrainSource::Admin,
            user: None,
            requeue_now: false,
            now: 9,
        },
        &mut d,
    );
    assert_eq!(
        r,
        CommandResult::Rejected(Rejection::NoSuchNode("n9".into()))
    );
}

#[test]
fn the_gpu_use_reported_with_the_ends_stays_with_the_run() {
    let (mut s, mut d) = cluster();
    let a = submit(&mut s, &mut d, 2, 8);
    let all8: &[u32] = &[0, 1, 2, 3, 4, 5, 6, 7];
    s.apply(
        &Command::Schedule {
            allocations: vec![alloc(a.0, &[("n1", all8), ("n2", all8)])],
            now: 5,
        },
        &mut d,
    );
    let used = |samples, util| crate::model::GpuUse {
        samples,
        mean_util_pct: util,
        mean_memory_pct: util / 2,
        idle_secs: 0,
        idle: false,
    };
    let done = TaskEventKind::Ended(TaskEnd::Completed);
    let mut end_on = |node: &str, rank, use_| {
        s.apply(
            &Command::TaskEvents {
                node: node.into(),
                events: vec![ev(a, rank, done.clone())],
                now: 10,
                gpu_use: vec![(a, use_)],
            },
            &mut d,
        );
    };
    // A report from a node the job does not hold changes nothing.
    end_on("n3", 0, used(10, 100));
    end_on("n1", 0, used(10, 90));
    end_on("n2", 1, used(30, 50));
    let job = s.job(a).or_else(|| s.archiving_job(a)).unwrap();
    assert_eq!(job.state, JobState::Completed);
    let run = job.run.as_ref().unwrap();
    assert_eq!(run.gpu_use.keys().collect::<Vec<_>>(), ["n1", "n2"]);
    // Weighted by samples: (10 x 90 + 30 x 50) / 40.
    let record = crate::model::acct::AcctRecord::from_job(job);
    assert_eq!(record.gpu_use.map(|u| u.mean_util_pct), Some(60));
    assert_eq!(record.gpu_use.map(|u| u.samples), Some(40));
}
