//! Placement scenarios: given nodes, running and pending jobs, expect this plan.

use std::collections::BTreeSet;

use super::*;
use crate::model::{Job, JobSpec, Program};
use crate::sched::PendingReason::{Priority, Resources};

fn cases() -> Vec<Case> {
    use Expect::{On, Unsatisfiable, Waits};
    vec![
        Case {
            name: "a 1-GPU job takes GPU 0 of an empty node",
            scenario: Scenario::new([dgx("a")]).pending([job(1).gpus(1)]),
            expect: vec![(1, On(&[("a", &[0])]))],
        },
        Case {
            name: "best fit: the fuller node first",
            scenario: Scenario::new([dgx("a"), dgx("b")])
                .running(held(90, "b", &[0, 1, 2, 3]))
                .pending([job(1).gpus(1)]),
            expect: vec![(1, On(&[("b", &[4])]))],
        },
        Case {
            name: "equal nodes: the first name, whatever the view's order",
            scenario: Scenario::new([dgx("b"), dgx("a")]).pending([job(1).gpus(2)]),
            expect: vec![(1, On(&[("a", &[0, 1])]))],
        },
        Case {
            name: "a 2x8 gang takes two whole free nodes",
            scenario: Scenario::new([dgx("a"), dgx("b"), dgx("c")])
                .running(held(90, "b", &[0]))
                .pending([job(1).nodes(2).gpus(8)]),
            expect: vec![(1, On(&[("a", ALL8), ("c", ALL8)]))],
        },
        Case {
            name: "a 2x8 gang waits whole when one node is partly busy, and blocks",
            scenario: Scenario::new([dgx("a"), dgx("b")])
                .running(held(90, "b", &[0]))
                .pending([job(1).nodes(2).gpus(8), job(2).gpus(1)]),
            expect: vec![(1, Waits(Resources)), (2, Waits(Priority))],
        },
        Case {
            name: "a gang takes the fullest nodes that fit, a NUMA-local quad on each; ranks in name order",
            scenario: Scenario::new([dgx("c"), dgx("b"), dgx("a"), dgx("d")])
                .running(held(90, "d", &[0, 1, 2, 3]))
                .running(held(91, "b", &[0, 1]))
                .pending([job(1).nodes(2).gpus(4)]),
            expect: vec![(1, On(&[("b", &[4, 5, 6, 7]), ("d", &[4, 5, 6, 7])]))],
        },
        Case {
            name: "FIFO: a blocked head holds back smaller jobs that would fit",
            scenario: Scenario::new([dgx("a")])
                .running(held(90, "a", &[0, 1, 2, 3, 4, 5]))
                .pending([job(1).gpus(4), job(2).gpus(1), job(3).gpus(1)]),
            expect: vec![
                (1, Waits(Resources)),
                (2, Waits(Priority)),
                (3, Waits(Priority)),
            ],
        },
        Case {
            name: "queue order: priority, then submit time, then id",
            scenario: Scenario::new([dgx("a")])
                .running(held(90, "a", &[0, 1, 2, 3, 4, 5, 6]))
                .pending([
                    job(1).gpus(1).submit(1),
                    job(2).gpus(1).submit(9).prio(5),
                    job(3).gpus(1).submit(0),
                    job(4).gpus(1).submit(0),
                ]),
            expect: vec![
                (2, On(&[("a", &[7])])),
                (3, Waits(Resources)),
                (4, Waits(Priority)),
                (1, Waits(Priority)),
            ],
        },
        Case {
            name: "an unsatisfiable job (9 GPUs per node) does not block",
            scenario: Scenario::new([dgx("a")]).pending([job(1).gpus(9), job(2).gpus(1)]),
            expect: vec![
                (
                    1,
                    Unsatisfiable("asks for 9 GPUs per node; the largest up node has 8 healthy"),
                ),
                (2, On(&[("a", &[0])])),
            ],
        },
        Case {
            name: "a gang wider than the cluster is unsatisfiable; the next gang runs",
            scenario: Scenario::new([dgx("a"), dgx("b"), dgx("c")])
                .running(held(90, "c", &[0]))
                .pending([job(1).nodes(4).gpus(8), job(2).nodes(2).gpus(8)]),
            expect: vec![
                (1, Unsatisfiable("asks for 4 nodes; 3 nodes are up")),
                (2, On(&[("a", ALL8), ("b", ALL8)])),
            ],
        },
        Case {
            name: "too few nodes of the shape is unsatisfiable, counting such nodes",
            scenario: Scenario::new([dgx("a"), dgx("b"), node("c").gpus(4, Topo::Pcie)])
                .pending([job(1).nodes(3).gpus(8)]),
            expect: vec![(
                1,
                Unsatisfiable("asks for 3 nodes with 8 GPUs; 2 such nodes are up"),
            )],
        },
        Case {
            name: "drained and down nodes are never used",
            scenario: Scenario::new([
                dgx("a").drained(),
                dgx("b").down(),
                node("c").gpus(2, Topo::Pcie),
            ])
            .pending([job(1).gpus(1), job(2).gpus(4), job(3).nodes(2)]),
            expect: vec![
                (1, On(&[("c", &[0])])),
                (2, Unsatisfiable("the largest up node has 2 healthy")),
                (3, Unsatisfiable("asks for 2 nodes; 1 node is up")),
            ],
        },
        Case {
            name: "faulty GPUs are never given out",
            scenario: Scenario::new([dgx("a").unhealthy(0).unhealthy(1)]).pending([
                job(1).gpus(1),
                job(2).gpus(7),
                job(3).gpus(5),
            ]),
            expect: vec![
                (1, On(&[("a", &[2])])),
                (2, Unsatisfiable("the largest up node has 6 healthy")),
                (3, On(&[("a", &[3, 4, 5, 6, 7])])),
            ],
        },
        Case {
            name: "running jobs' GPUs are not given again",
            scenario: Scenario::new([dgx("a")])
                .running(held(90, "a", &[0, 1, 2, 3]))
                .pending([job(1).gpus(4)]),
            expect: vec![(1, On(&[("a", &[4, 5, 6, 7])]))],
        },
        Case {
            name: "a pass counts its own placements",
            scenario: Scenario::new([dgx("a")]).pending([
                job(1).gpus(4),
                job(2).gpus(4),
                job(3).gpus(1),
            ]),
            expect: vec![
                (1, On(&[("a", &[0, 1, 2, 3])])),
                (2, On(&[("a", &[4, 5, 6, 7])])),
                (3, Waits(Resources)),
            ],
        },
        Case {
            name: "a CPU-only job goes where it wastes no free GPU",
            scenario: Scenario::new([dgx("a"), node("c")]).pending([job(1).cpus(8)]),
            expect: vec![(1, On(&[("c", &[])]))],
        },
        Case {
            name: "CPUs run out before GPUs",
            scenario: Scenario::new([node("a").gpus(8, Topo::NvSwitch).cpus(16)]).pending([
                job(1).gpus(1).cpus(8),
                job(2).gpus(1).cpus(8),
                job(3).gpus(1).cpus(1),
            ]),
            expect: vec![
                (1, On(&[("a", &[0])])),
                (2, On(&[("a", &[1])])),
                (3, Waits(Resources)),
            ],
        },
        Case {
            name: "CPUs are ntasks-per-node x cpus-per-task",
            scenario: Scenario::new([node("a")]).pending([
                job(1).tasks(4).cpus(8),
                job(2).tasks(3).cpus(8),
                job(3).tasks(2).cpus(8),
                job(4),
            ]),
            expect: vec![
                (1, On(&[("a", &[])])),
                (2, On(&[("a", &[])])),
                (3, Waits(Resources)),
                (4, Waits(Priority)),
            ],
        },
        Case {
            name: "running jobs' CPUs count",
            scenario: Scenario::new([node("a")])
                .running(held_full(90, "a", &[], 60, 1024))
                .pending([job(1).cpus(4), job(2).cpus(1)]),
            expect: vec![(1, On(&[("a", &[])])), (2, Waits(Resources))],
        },
        Case {
            name: "memory bounds a node",
            scenario: Scenario::new([node("a").mem_gb(100)])
                .pending([job(1).mem_gb(60), job(2).mem_gb(60)]),
            expect: vec![(1, On(&[("a", &[])])), (2, Waits(Resources))],
        },
        Case {
            name: "running jobs' memory counts",
            scenario: Scenario::new([node("a").mem_gb(100)])
                .running(held_full(90, "a", &[], 1, 50 * 1024))
                .pending([job(1).mem_gb(50), job(2).mem_gb(1)]),
            expect: vec![(1, On(&[("a", &[])])), (2, Waits(Resources))],
        },
        Case {
            name: "the default memory (1 GiB per CPU) is reserved, never oversubscribed",
            scenario: Scenario::new([node("a").mem_gb(32)]).pending([
                job(1).cpus(16),
                job(2).cpus(16),
                job(3),
            ]),
            expect: vec![
                (1, On(&[("a", &[])])),
                (2, On(&[("a", &[])])),
                (3, Waits(Resources)),
            ],
        },
        Case {
            name: "a default memory no node has is unsatisfiable and says so",
            scenario: Scenario::new([node("a").mem_gb(32)]).pending([job(1).cpus(64)]),
            expect: vec![(
                1,
                Unsatisfiable(
                    "asks for 64 GiB of memory per node (the default, 1 GiB per CPU; \
                     set --mem to ask for less); the largest up node has 32 GiB",
                ),
            )],
        },
        Case {
            name: "NVLink pairs: a 2-GPU job gets a whole pair",
            scenario: Scenario::new([dgx_pairs("a")])
                .running(held(90, "a", &[0]))
                .pending([job(1).gpus(2)]),
            expect: vec![(1, On(&[("a", &[2, 3])]))],
        },
        Case {
            name: "NVLink pairs: 4 GPUs stay on one NUMA node",
            scenario: Scenario::new([dgx_pairs("a")])
                .running(held(90, "a", &[0, 2]))
                .pending([job(1).gpus(4)]),
            expect: vec![(1, On(&[("a", &[4, 5, 6, 7])]))],
        },
        Case {
            name: "PCIe: a 2-GPU job shares a switch",
            scenario: Scenario::new([node("a").gpus(8, Topo::Pcie)])
                .running(held(90, "a", &[0]))
                .pending([job(1).gpus(2)]),
            expect: vec![(1, On(&[("a", &[2, 3])]))],
        },
        Case {
            name: "no node up",
            scenario: Scenario::new([]).pending([job(1).gpus(1)]),
            expect: vec![(1, Unsatisfiable("no node is up"))],
        },
        Case {
            name: "a malformed shape is unsatisfiable, not a panic",
            scenario: Scenario::new([dgx("a")]).pending([job(1).nodes(0), job(2).gpus(1)]),
            expect: vec![
                (1, Unsatisfiable("asks for 0 nodes")),
                (2, On(&[("a", &[0])])),
            ],
        },
    ]
}

#[test]
fn placement_table() {
    run_table(cases());
}

#[test]
fn sixteen_one_gpu_jobs_fill_two_nodes_and_the_seventeenth_waits() {
    let out = Scenario::new([dgx("a"), dgx("b")])
        .pending((1..=17).map(|i| job(i).gpus(1)))
        .run();
    let mut slots = BTreeSet::new();
    for i in 1..=16 {
        let p = out
            .placement(i)
            .unwrap_or_else(|| panic!("job {i} not placed"));
        assert_eq!(p.len(), 1);
        assert_eq!(p[0].1.len(), 1);
        assert!(
            slots.insert((p[0].0.clone(), p[0].1[0])),
            "job {i} reuses a GPU"
        );
    }
    assert_eq!(slots.len(), 16);
    assert_eq!(out.reason(17), Some(&Resources));
}

#[test]
fn a_gang_is_never_half_placed() {
    // One GPU short on b: the job gets nothing, not node a alone.
    let out = Scenario::new([dgx("a"), dgx("b")])
        .running(held(90, "b", &[7]))
        .pending([job(1).nodes(2).gpus(8)])
        .run();
    assert!(out.plan.allocations.is_empty());
    assert_eq!(out.reason(1), Some(&Resources));
}

#[test]
fn allocations_carry_cpusets_and_memory_per_node() {
    let out = Scenario::new([dgx("a"), dgx("b")])
        .pending([
            job(1).nodes(2).gpus(8).tasks(8).cpus(4),
            job(2).tasks(2).cpus(3).mem_gb(5),
        ])
        .run();
    let a1 = out.allocation(1).expect("job 1 placed");
    // 8 GPUs, 4 on each NUMA node: half the CPUs from each.
    let halves: Vec<u32> = (0..16).chain(64..80).collect();
    for na in &a1.nodes {
        assert_eq!(na.cpu_count, 32);
        assert_eq!(na.memory_mb, 32 * 1024, "default: 1 GiB per CPU");
        assert_eq!(na.cpus, halves);
    }
    let a2 = out.allocation(2).expect("job 2 placed");
    assert_eq!(a2.nodes[0].node, "a");
    assert_eq!(a2.nodes[0].cpu_count, 6);
    assert_eq!(a2.nodes[0].memory_mb, 5 * 1024);
    assert_eq!(
        a2.nodes[0].cpus,
        (16..22).collect::<Vec<u32>>(),
        "next to job 1's, on NUMA 0"
    );
}

#[test]
fn now_and_input_order_do_not_change_the_plan() {
    let sc = Scenario::new([dgx("a"), dgx_pairs("b"), node("c")])
        .running(held(90, "b", &[1]))
        .pending([
            job(1).gpus(3),
            job(2).nodes(2).gpus(2),
            job(3).cpus(9),
            job(4).gpus(8),
        ]);
    let mut shuffled = sc.clone();
    shuffled.view.nodes.reverse();
    shuffled.view.pending.reverse();
    shuffled.now += 3_600_000;
    assert_eq!(sc.run().plan, shuffled.run().plan);
}

#[test]
fn reasons_read_as_sentences() {
    assert_eq!(
        Resources.to_string(),
        "waiting for resources: not enough free GPUs, CPUs or memory now"
    );
    assert_eq!(
        PendingReason::Unsatisfiable("no node is up".into()).to_string(),
        "cannot run on the nodes that are up: no node is up"
    );
    assert_eq!(Priority.as_str(), "Priority");
}

#[test]
fn a_pending_job_is_built_from_the_recorded_job() {
    let spec = JobSpec {
        qos: None,
        nice: 0,
        name: "train".into(),
        nodes: 2,
        ntasks_per_node: 8,
        gpus_per_node: 8,
        cpus_per_task: 12,
        mem_per_node_mb: Some(512 * 1024),
        time_limit_secs: None,
        account: None,
        partition: None,
        output: None,
        error: None,
        workdir: "/home/alice".into(),
        env: Vec::new(),
        export: Default::default(),
        requeue: Default::default(),
        max_restarts: 3,
        total_gpus: None,
        placement: Default::default(),
        queue: Default::default(),
        signal: None,
        program: Program::Command {
            argv: vec!["torchrun".into()],
        },
        launch: Default::default(),
        submit_host: None,
        first_step: None,
        exclusive: false,
        container: None,
    };
    let recorded = Job::pending(JobId(42), "alice", spec, 1234);
    let p = PendingJob::from(&recorded);
    assert_eq!(
        (
            p.id,
            p.user.as_str(),
            p.nodes,
            p.ntasks_per_node,
            p.gpus_per_node
        ),
        (JobId(42), "alice", 2, 8, 8)
    );
    assert_eq!((p.cpus_per_task, p.mem_per_node_mb), (12, Some(512 * 1024)));
    assert_eq!((p.submit_time, p.priority), (1234, 0));
    assert_eq!(p.per_node().cpus, 96);
}
