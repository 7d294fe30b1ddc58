//! Packing: best fit over nodes, whole nodes for whole-node jobs, `--gpus N`
//! shapes, and inside a node the GPU sets that keep NVLink pairs and NUMA
//! quads whole, with cpusets on the GPUs' NUMA nodes.

use super::*;
use crate::sched::PendingReason::{Priority, Resources};

fn cases() -> Vec<Case> {
    use Expect::{Nodes, On, Unsatisfiable, Waits};
    vec![
        Case {
            name: "best fit: the node left with the fewest free GPUs",
            scenario: Scenario::new([dgx("a"), dgx("b"), dgx("c")])
                .running(held(90, "a", &[0, 1, 2, 3, 4]))
                .running(held(91, "b", &[0, 1, 2, 3, 4, 5]))
                .pending([job(1).gpus(2), job(2).gpus(3)]),
            // b is left with no free GPU; then a holds job 2 exactly, over c.
            expect: vec![(1, Nodes(&["b"])), (2, Nodes(&["a"]))],
        },
        Case {
            name: "best fit counts a pass's own placements",
            scenario: Scenario::new([dgx("a"), dgx("b")]).pending([
                job(1).gpus(3),
                job(2).gpus(4),
                job(3).gpus(1),
                job(4).gpus(8),
            ]),
            expect: vec![
                (1, On(&[("a", &[0, 1, 2])])),
                (2, On(&[("a", &[4, 5, 6, 7])])),
                (3, On(&[("a", &[3])])),
                (4, On(&[("b", ALL8)])),
            ],
        },
        Case {
            name: "a whole-node job takes a free node, never the room left on busy ones",
            scenario: Scenario::new([dgx("a"), dgx("b"), dgx("c")])
                .running(held(90, "a", &[0, 1, 2, 3]))
                .running(held(91, "b", &[4, 5, 6, 7]))
                .pending([job(1).gpus(8)]),
            expect: vec![(1, On(&[("c", ALL8)]))],
        },
        Case {
            name: "--exclusive takes an idle node whole; the next job goes elsewhere",
            scenario: Scenario::new([dgx("a"), dgx("b"), dgx("c")])
                .running(held(90, "a", &[0]))
                .pending([job(1).gpus(1).exclusive(), job(2).gpus(1), job(3).cpus(1)]),
            expect: vec![
                (1, On(&[("b", ALL8)])),
                (2, On(&[("a", &[1])])),
                (3, Nodes(&["a"])),
            ],
        },
        Case {
            name: "--exclusive waits for a node running nothing",
            scenario: Scenario::new([dgx("a"), dgx("b")])
                .running(held(90, "a", &[0]))
                .running(held(91, "b", &[7]))
                .pending([job(1).gpus(1).exclusive()]),
            expect: vec![(1, Waits(Resources))],
        },
        Case {
            name: "--gpus 16 is two whole nodes",
            scenario: Scenario::new([dgx("a"), dgx("b"), dgx("c"), dgx("d")])
                .running(held(90, "a", &[0, 1, 2, 3]))
                .running(held(91, "b", &[0, 1, 2, 3]))
                .pending([job(1).total(16)]),
            expect: vec![(1, On(&[("c", ALL8), ("d", ALL8)]))],
        },
        Case {
            name: "--gpus 16 waits for whole nodes rather than take four halves",
            scenario: Scenario::new([dgx("a"), dgx("b"), dgx("c"), dgx("d")])
                .running(held(90, "a", &[0, 1, 2, 3]))
                .running(held(91, "b", &[0, 1, 2, 3]))
                .running(held(92, "c", &[0, 1, 2, 3]))
                .pending([job(1).total(16), job(2).gpus(1)]),
            expect: vec![(1, Waits(Resources)), (2, Waits(Priority))],
        },
        Case {
            name: "--gpus 4 is one node, by best fit",
            scenario: Scenario::new([dgx("a"), dgx("b")])
                .running(held(90, "b", &[0, 1, 2, 3]))
                .pending([job(1).total(4)]),
            expect: vec![(1, On(&[("b", &[4, 5, 6, 7])]))],
        },
        Case {
            name: "--gpus 8 on 4-GPU nodes is two whole nodes",
            scenario: Scenario::new([
                node("a").gpus(4, Topo::NvSwitch),
                node("b").gpus(4, Topo::NvSwitch),
            ])
            .pending([job(1).total(8)]),
            expect: vec![(1, On(&[("a", &[0, 1, 2, 3]), ("b", &[0, 1, 2, 3])]))],
        },
        Case {
            name: "--gpus that neither fits one node nor fills whole nodes is unsatisfiable",
            scenario: Scenario::new([dgx("a"), dgx("b")]).pending([job(1).total(12)]),
            expect: vec![(
                1,
                Unsatisfiable(
                    "asks for 12 GPUs in total (--gpus), which fit on no single node \
                     (the largest up node has 8 healthy) and fill no whole nodes of 8 GPUs",
                ),
            )],
        },
        Case {
            name: "--gpus wider than the cluster names the shape it tried",
            scenario: Scenario::new([dgx("a"), dgx("b")]).pending([job(1).total(24)]),
            expect: vec![(
                1,
                Unsatisfiable("--gpus 24 as 3 nodes × 8 GPUs: asks for 3 nodes; 2 nodes are up"),
            )],
        },
        Case {
            name: "NVLink pairs: a 1-GPU job completes a broken pair",
            scenario: Scenario::new([dgx_pairs("a")])
                .running(held(90, "a", &[3]))
                .pending([job(1).gpus(1)]),
            expect: vec![(1, On(&[("a", &[2])]))],
        },
        Case {
            name:
                "NVLink pairs: 1-GPU jobs fill the broken quad, leaving a whole one for a 4-GPU job",
            scenario: Scenario::new([dgx_pairs("a")])
                .running(held(90, "a", &[4]))
                .pending([
                    job(1).gpus(1),
                    job(2).gpus(1),
                    job(3).gpus(1),
                    job(4).gpus(4),
                ]),
            // Lowest indices first would have taken 0, 1, 2 and left the
            // 4-GPU job nothing but GPUs across both NUMA nodes.
            expect: vec![
                (1, On(&[("a", &[5])])),
                (2, On(&[("a", &[6])])),
                (3, On(&[("a", &[7])])),
                (4, On(&[("a", &[0, 1, 2, 3])])),
            ],
        },
        Case {
            name: "NVLink pairs: a 2-GPU job takes a whole pair outside a whole quad",
            scenario: Scenario::new([dgx_pairs("a")])
                .running(held(90, "a", &[0]))
                .pending([job(1).gpus(2), job(2).gpus(4)]),
            expect: vec![(1, On(&[("a", &[2, 3])])), (2, On(&[("a", &[4, 5, 6, 7])]))],
        },
        Case {
            name: "NVSwitch: a 4-GPU job gets a NUMA-local quad, not the lowest indices",
            scenario: Scenario::new([dgx("a")])
                .running(held(90, "a", &[0, 1]))
                .pending([job(1).gpus(4)]),
            expect: vec![(1, On(&[("a", &[4, 5, 6, 7])]))],
        },
        Case {
            name: "NVSwitch: a 1-GPU job stays in the broken quad",
            scenario: Scenario::new([dgx("a")])
                .running(held(90, "a", &[5]))
                .pending([job(1).gpus(1), job(2).gpus(4)]),
            expect: vec![(1, On(&[("a", &[4])])), (2, On(&[("a", &[0, 1, 2, 3])]))],
        },
    ]
}

#[test]
fn packing_table() {
    run_table(cases());
}

/// The cpuset of `job`'s allocation on its first node.
fn cpuset(out: &Outcome, job: u64) -> Vec<u32> {
    out.allocation(job)
        .unwrap_or_else(|| panic!("job {job} placed"))
        .nodes[0]
        .cpus
        .clone()
}

fn ids(r: std::ops::Range<u32>) -> Vec<u32> {
    r.collect()
}

#[test]
fn cpusets_follow_the_gpus_numa_nodes_and_never_overlap() {
    // dgx: GPUs 0-3 and CPUs 0-63 on NUMA 0, GPUs 4-7 and CPUs 64-127 on NUMA 1.
    let out = Scenario::new([dgx("a")])
        .running(held_cpus(90, "a", &[0, 1], 0..8))
        .pending([
            job(1).gpus(2).cpus(8),
            job(2).gpus(4).tasks(4).cpus(4),
            job(3).cpus(6),
        ])
        .run();
    assert_eq!(out.placement(1).unwrap()[0].1, [2, 3]);
    assert_eq!(cpuset(&out, 1), ids(8..16), "NUMA 0, past job 90's CPUs");
    assert_eq!(out.placement(2).unwrap()[0].1, [4, 5, 6, 7]);
    assert_eq!(cpuset(&out, 2), ids(64..80), "NUMA 1");
    // No GPU is free now and both NUMA nodes have 48 CPUs free: the first.
    assert_eq!(cpuset(&out, 3), ids(16..22));
}

#[test]
fn a_cpu_only_job_keeps_away_from_free_gpus() {
    let out = Scenario::new([dgx("a")])
        .running(held_cpus(90, "a", &[0, 1, 2, 3], 0..4))
        .pending([job(1).cpus(8)])
        .run();
    assert_eq!(
        cpuset(&out, 1),
        ids(4..12),
        "NUMA 0, whose GPUs are all taken"
    );
}

#[test]
fn a_short_numa_node_spills_to_the_other() {
    // 16 CPUs: 0-7 on NUMA 0, 8-15 on NUMA 1.
    let out = Scenario::new([node("a").gpus(8, Topo::NvSwitch).cpus(16)])
        .pending([job(1).gpus(1).cpus(12)])
        .run();
    assert_eq!(cpuset(&out, 1), ids(0..12));
    let out = Scenario::new([node("a").gpus(8, Topo::NvSwitch).cpus(16)])
        .running(held_cpus(90, "a", &[0], 8..10))
        .pending([job(1).gpus(1).cpus(4), job(2).gpus(1).cpus(9)])
        .run();
    assert_eq!(out.placement(1).unwrap()[0].1, [1]);
    assert_eq!(cpuset(&out, 1), ids(0..4));
    assert_eq!(cpuset(&out, 2), [4, 5, 6, 7, 10, 11, 12, 13, 14]);
}

#[test]
fn no_cpuset_where_the_cpu_count_was_declared() {
    let out = Scenario::new([dgx("a").declared_cpus(64)])
        .pending([job(1).gpus(1).cpus(8)])
        .run();
    let na = &out.allocation(1).expect("placed").nodes[0];
    assert_eq!((na.cpu_count, na.cpus.len()), (8, 0));
}

#[test]
fn a_gpus_total_job_is_checked_against_its_total() {
    let nodes: Vec<NodeView> = [dgx("a"), dgx("b")]
        .into_iter()
        .map(NodeBuilder::build)
        .collect();
    let on = |node: &str, gpus: &[u32]| NodeAllocation {
        node: node.into(),
        gpus: gpus.to_vec(),
        cpus: Vec::new(),
        cpu_count: 1,
        memory_mb: 1024,
    };
    let job = job(1).total(8).build();
    let whole = Allocation {
        job: JobId(1),
        nodes: vec![on("a", ALL8)],
    };
    let halves = Allocation {
        job: JobId(1),
        nodes: vec![on("a", &[0, 1, 2, 3]), on("b", &[0, 1, 2, 3])],
    };
    let uneven = Allocation {
        job: JobId(1),
        nodes: vec![on("a", &[0, 1, 2, 3, 4, 5]), on("b", &[0, 1])],
    };
    assert_eq!(check_allocation(&nodes, &whole, &job), Ok(()));
    assert_eq!(check_allocation(&nodes, &halves, &job), Ok(()));
    assert_eq!(
        check_allocation(&nodes, &uneven, &job),
        Err(
            "job 1 asks for 8 GPUs in total, the same number on each node; \
             the allocation gives 6 + 2"
                .into()
        )
    );
}
