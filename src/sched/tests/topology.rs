//! Topology-aware gangs: the fewest domains at the lowest level, best fit
//! among domains, and `--topology` as a requirement.

use super::*;
use crate::model::TopologyRequirement::{Leaf, Spine};
use crate::sched::PendingReason::{Priority, Topology};

/// `n` DGX nodes `{prefix}1..` on the topology path `path`.
fn leaf(prefix: &str, n: u32, path: &str) -> Vec<NodeBuilder> {
    (1..=n)
        .map(|i| dgx(&format!("{prefix}{i}")).topo(path))
        .collect()
}

fn cluster(leaves: &[(&str, u32, &str)]) -> Vec<NodeBuilder> {
    leaves
        .iter()
        .flat_map(|(p, n, path)| leaf(p, *n, path))
        .collect()
}

/// A whole-node gang of `n` nodes.
fn gang(id: u64, n: u32) -> JobBuilder {
    job(id).nodes(n).gpus(8)
}

fn cases() -> Vec<Case> {
    use Expect::{Nodes, Unsatisfiable, Waits};
    vec![
        Case {
            name: "one leaf holds the gang: the smallest leaf that does",
            scenario: Scenario::new(cluster(&[
                ("a", 4, "s1/l1"),
                ("b", 3, "s1/l2"),
                ("c", 2, "s2/l3"),
            ]))
            .pending([gang(1, 3)]),
            expect: vec![(1, Nodes(&["b1", "b2", "b3"]))],
        },
        Case {
            name: "a leaf's size is its free nodes, not all of them",
            scenario: Scenario::new(cluster(&[("a", 4, "s1/l1"), ("b", 4, "s1/l2")]))
                .running(held(90, "a1", &[0]))
                .pending([gang(1, 3)]),
            expect: vec![(1, Nodes(&["a2", "a3", "a4"]))],
        },
        Case {
            name: "no leaf holds it: leaves under one spine, over a bigger leaf elsewhere",
            scenario: Scenario::new(cluster(&[
                ("a", 3, "s1/l1"),
                ("b", 2, "s1/l2"),
                ("c", 4, "s2/l3"),
            ]))
            .pending([gang(1, 5)]),
            expect: vec![(1, Nodes(&["a1", "a2", "a3", "b1", "b2"]))],
        },
        Case {
            name: "inside the spine: the biggest leaf whole, the rest in the smallest leaf that holds it",
            scenario: Scenario::new(cluster(&[
                ("a", 3, "s1/l1"),
                ("b", 2, "s1/l2"),
                ("c", 2, "s1/l3"),
            ]))
            .running(held(90, "c2", &[0]))
            .pending([gang(1, 4)]),
            expect: vec![(1, Nodes(&["a1", "a2", "a3", "c1"]))],
        },
        Case {
            name: "the spine needing the fewest leaves, then the smallest",
            scenario: Scenario::new(cluster(&[
                ("a", 2, "s1/l1"),
                ("b", 2, "s1/l2"),
                ("c", 2, "s1/l3"),
                ("d", 3, "s2/l4"),
                ("e", 3, "s2/l5"),
            ]))
            .pending([gang(1, 5)]),
            // s1 (6 free) would need 3 leaves, s2 (6 free) only 2.
            expect: vec![(1, Nodes(&["d1", "d2", "d3", "e1", "e2"]))],
        },
        Case {
            name: "no spine holds it: the fewest spines",
            scenario: Scenario::new(cluster(&[
                ("a", 3, "s1/l1"),
                ("b", 2, "s2/l2"),
                ("c", 1, "s3/l3"),
            ]))
            .pending([gang(1, 4)]),
            expect: vec![(1, Nodes(&["a1", "a2", "a3", "c1"]))],
        },
        Case {
            name: "deeper paths: pod, spine, leaf",
            scenario: Scenario::new(cluster(&[
                ("a", 1, "p1/s1/l1"),
                ("b", 1, "p1/s1/l2"),
                ("c", 2, "p1/s2/l3"),
                ("d", 3, "p2/s3/l4"),
            ]))
            .running(held(90, "d1", &[0]))
            .pending([gang(1, 3)]),
            // No leaf or spine has 3 free; pod p1 has 4 (p2 only 2). In p1,
            // spine s2's one leaf whole, and one node of s1.
            expect: vec![(1, Nodes(&["a1", "c1", "c2"]))],
        },
        Case {
            name: "ranks follow the topology path, then the name",
            scenario: Scenario::new([
                dgx("a1").topo("s1/l2"),
                dgx("z1").topo("s1/l1"),
                dgx("z2").topo("s1/l1"),
            ])
            .pending([gang(1, 3)]),
            expect: vec![(1, Nodes(&["z1", "z2", "a1"]))],
        },
        Case {
            name: "nodes without a path are placed by best fit alone",
            scenario: Scenario::new([dgx("a"), dgx("b"), dgx("c")])
                .running(held(90, "b", &[0, 1]))
                .running(held(91, "c", &[0]))
                .pending([job(1).nodes(2).gpus(4)]),
            expect: vec![(1, Nodes(&["b", "c"]))],
        },
        Case {
            name: "--topology leaf: the gang waits while only several leaves hold it, and blocks",
            scenario: Scenario::new(cluster(&[("a", 2, "s1/l1"), ("b", 2, "s1/l2")]))
                .running(held(90, "a1", &[0]))
                .running(held(91, "b1", &[0]))
                .pending([gang(1, 2).topology(Leaf), job(2).gpus(1)]),
            expect: vec![(1, Waits(Topology(Leaf))), (2, Waits(Priority))],
        },
        Case {
            name: "--topology leaf: placed once one leaf holds it",
            scenario: Scenario::new(cluster(&[("a", 2, "s1/l1"), ("b", 3, "s1/l2")]))
                .running(held(90, "a1", &[0]))
                .pending([gang(1, 2).topology(Leaf)]),
            expect: vec![(1, Nodes(&["b1", "b2"]))],
        },
        Case {
            name: "--topology spine: several leaves of one spine will do",
            scenario: Scenario::new(cluster(&[
                ("a", 2, "s1/l1"),
                ("b", 2, "s1/l2"),
                ("c", 1, "s2/l3"),
            ]))
            .running(held(90, "a1", &[0]))
            .running(held(91, "b1", &[0]))
            .pending([gang(1, 3).topology(Spine), gang(2, 2).topology(Spine)]),
            expect: vec![(1, Waits(Topology(Spine))), (2, Waits(Priority))],
        },
        Case {
            name: "--topology spine: placed under the one spine that holds it",
            scenario: Scenario::new(cluster(&[
                ("a", 2, "s1/l1"),
                ("b", 2, "s1/l2"),
                ("c", 2, "s2/l3"),
            ]))
            .running(held(90, "c1", &[0]))
            .pending([gang(1, 3).topology(Spine)]),
            expect: vec![(1, Nodes(&["a1", "a2", "b1"]))],
        },
        Case {
            name: "--topology leaf wider than every leaf is unsatisfiable, not waiting",
            scenario: Scenario::new(cluster(&[("a", 2, "s1/l1"), ("b", 2, "s1/l2")]))
                .pending([gang(1, 3).topology(Leaf), job(2).gpus(1)]),
            expect: vec![
                (
                    1,
                    Unsatisfiable(
                        "asks for 3 nodes under one leaf (--topology leaf); \
                         the largest leaf has 2 such nodes",
                    ),
                ),
                (2, Nodes(&["a1"])),
            ],
        },
        Case {
            name: "--topology and nodes without a path: each is its own leaf",
            scenario: Scenario::new([dgx("a"), dgx("b")])
                .pending([gang(1, 2).topology(Leaf), gang(2, 1).topology(Leaf)]),
            expect: vec![
                (
                    1,
                    Unsatisfiable("(a node without a topology path is a domain of its own)"),
                ),
                (2, Nodes(&["a"])),
            ],
        },
    ]
}

#[test]
fn topology_table() {
    run_table(cases());
}

#[test]
fn topology_reasons_read_as_sentences() {
    assert_eq!(
        Topology(Leaf).to_string(),
        "waiting for enough free nodes under one leaf (--topology leaf); \
         enough are free now only across several leaves"
    );
    assert_eq!(Topology(Spine).as_str(), "Topology");
}

#[test]
fn domains_of_a_path_at_each_level() {
    use crate::sched::topology::{domain, Domain, Level};
    let d = |t, l| domain(t, "n1", l);
    assert_eq!(d("p1/s1/l1", Level::Up(0)), Domain::Path("p1/s1/l1"));
    assert_eq!(d("p1/s1/l1", Level::Up(1)), Domain::Path("p1/s1"));
    assert_eq!(d("p1/s1/l1", Level::Up(2)), Domain::Path("p1"));
    assert_eq!(d("p1/s1/l1", Level::Up(3)), Domain::Path(""));
    assert_eq!(d("leaf7", Level::Up(1)), Domain::Path(""));
    assert_eq!(d("", Level::Up(0)), Domain::Alone("n1"));
    assert_eq!(d("", Level::All), Domain::All);
}

#[test]
fn check_allocation_keeps_a_strict_gang_in_one_domain() {
    let nodes: Vec<NodeView> = cluster(&[("a", 1, "s1/l1"), ("b", 1, "s1/l2")])
        .into_iter()
        .map(NodeBuilder::build)
        .collect();
    let alloc = Allocation {
        job: JobId(1),
        nodes: ["a1", "b1"]
            .iter()
            .map(|n| NodeAllocation {
                node: n.to_string(),
                gpus: ALL8.to_vec(),
                cpus: Vec::new(),
                cpu_count: 1,
                memory_mb: 1024,
            })
            .collect(),
    };
    assert_eq!(
        check_allocation(&nodes, &alloc, &gang(1, 2).topology(Leaf).build()),
        Err(
            "job 1 must stay under one leaf (--topology leaf); the allocation spans 2 leaves"
                .into()
        )
    );
    assert_eq!(
        check_allocation(&nodes, &alloc, &gang(1, 2).topology(Spine).build()),
        Ok(())
    );
}
