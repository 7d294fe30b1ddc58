//! In-place gang restart: a requeued gang keeps its healthy nodes at their
//! ranks, a replacement takes the lost rank, and the job goes first among
//! jobs of its priority.

use super::*;
use crate::model::TopologyRequirement::Leaf;
use crate::sched::PendingReason::{Priority, Resources};

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

/// A 4-node whole-node gang that last ran on a1..a4, a3 at rank 2.
fn restarting(id: u64) -> JobBuilder {
    job(id)
        .nodes(4)
        .gpus(8)
        .previous(&[("a4", ALL8), ("a1", ALL8), ("a3", ALL8), ("a2", ALL8)])
}

fn cases() -> Vec<Case> {
    use Expect::{Nodes, On, Waits};
    vec![
        Case {
            name: "one node down: the other three keep their ranks, the spare takes rank 2",
            scenario: Scenario::new(cluster(&[("a", 5, "s1/l1")]))
                .pending([restarting(1)])
                .tap(|s| s.node_state("a3", NodeState::Down)),
            expect: vec![(1, Nodes(&["a4", "a1", "a5", "a2"]))],
        },
        Case {
            name: "nothing lost (a rank failed): the same nodes in the same rank order",
            scenario: Scenario::new(cluster(&[("a", 6, "s1/l1")])).pending([restarting(1)]),
            expect: vec![(1, Nodes(&["a4", "a1", "a3", "a2"]))],
        },
        Case {
            name: "the replacement comes from the kept nodes' leaf, not the best fit elsewhere",
            scenario: Scenario::new(cluster(&[("a", 5, "s1/l1"), ("b", 1, "s1/l2")]))
                .running(held_full(90, "b1", &[], 8, 1024))
                .pending([restarting(1)])
                .tap(|s| s.node_state("a2", NodeState::Down)),
            expect: vec![(1, Nodes(&["a4", "a1", "a3", "a5"]))],
        },
        Case {
            name: "no spare in the leaf: one under the same spine, not another spine",
            scenario: Scenario::new(cluster(&[
                ("a", 4, "s1/l1"),
                ("b", 1, "s1/l2"),
                ("c", 1, "s2/l3"),
            ]))
            .pending([restarting(1)])
            .tap(|s| s.node_state("a1", NodeState::Down)),
            expect: vec![(1, Nodes(&["a4", "b1", "a3", "a2"]))],
        },
        Case {
            name: "a drained node (GPU fault) is replaced like a down one",
            scenario: Scenario::new(cluster(&[("a", 5, "s1/l1")]))
                .pending([restarting(1)])
                .tap(|s| s.node_state("a4", NodeState::Drained)),
            expect: vec![(1, Nodes(&["a5", "a1", "a3", "a2"]))],
        },
        Case {
            name: "no spare free: the job waits for resources at the head and blocks the rest",
            scenario: Scenario::new(cluster(&[("a", 5, "s1/l1")]))
                .running(held(90, "a5", &[0]))
                .pending([job(2).gpus(1).submit(0), restarting(3)])
                .tap(|s| s.node_state("a3", NodeState::Down)),
            expect: vec![(3, Waits(Resources)), (2, Waits(Priority))],
        },
        Case {
            name: "a restarting job goes ahead of older jobs of its priority",
            scenario: Scenario::new(cluster(&[("a", 5, "s1/l1")]))
                .pending([job(2).nodes(2).gpus(8).submit(0), restarting(3)])
                .tap(|s| s.node_state("a3", NodeState::Down)),
            expect: vec![(3, Nodes(&["a4", "a1", "a5", "a2"])), (2, Waits(Resources))],
        },
        Case {
            name: "but not ahead of a higher priority",
            scenario: Scenario::new(cluster(&[("a", 5, "s1/l1")]))
                .pending([job(2).nodes(2).gpus(8).prio(5), restarting(3)])
                .tap(|s| s.node_state("a3", NodeState::Down)),
            expect: vec![(2, Nodes(&["a1", "a2"])), (3, Waits(Resources))],
        },
        Case {
            name: "a kept node whose GPUs another job took is replaced too",
            scenario: Scenario::new(cluster(&[("a", 6, "s1/l1")]))
                .running(held(90, "a1", &[5]))
                .pending([restarting(1)])
                .tap(|s| s.node_state("a3", NodeState::Down)),
            expect: vec![(1, Nodes(&["a4", "a5", "a6", "a2"]))],
        },
        Case {
            name: "a kept node gets its old GPUs back when they are free",
            scenario: Scenario::new(cluster(&[("a", 2, "s1/l1")])).pending([job(1)
                .nodes(2)
                .gpus(2)
                .previous(&[("a2", &[6, 7]), ("a1", &[4, 5])])]),
            expect: vec![(1, On(&[("a2", &[6, 7]), ("a1", &[4, 5])]))],
        },
        Case {
            name: "no previous node can be kept: placed from scratch",
            scenario: Scenario::new(cluster(&[("a", 4, "s1/l1"), ("b", 4, "s1/l2")]))
                .pending([restarting(1)])
                .tap(|s| {
                    for n in ["a1", "a2", "a3", "a4"] {
                        s.node_state(n, NodeState::Down);
                    }
                }),
            expect: vec![(1, Nodes(&["b1", "b2", "b3", "b4"]))],
        },
        Case {
            name: "--topology leaf: the replacement must share the kept nodes' leaf",
            scenario: Scenario::new(cluster(&[("a", 4, "s1/l1"), ("b", 4, "s1/l2")]))
                .pending([restarting(1).topology(Leaf)])
                .tap(|s| s.node_state("a3", NodeState::Down)),
            // Not in place (no spare in leaf l1): from scratch, in leaf l2.
            expect: vec![(1, Nodes(&["b1", "b2", "b3", "b4"]))],
        },
        Case {
            name: "a different size than last time (a --gpus N reshape): from scratch",
            scenario: Scenario::new(cluster(&[("a", 5, "s1/l1")])).pending([job(1)
                .nodes(2)
                .gpus(8)
                .previous(&[("a5", ALL8), ("a4", ALL8), ("a3", ALL8)])]),
            expect: vec![(1, Nodes(&["a1", "a2"]))],
        },
    ]
}

#[test]
fn restart_table() {
    run_table(cases());
}

/// The whole point at scale: a 64-node gang that lost one node restarts on
/// its 63 healthy nodes at their ranks plus one spare.
#[test]
fn a_64_node_gang_keeps_63_nodes() {
    let nodes = cluster(&[("a", 40, "s1/l1"), ("b", 40, "s1/l2")]);
    // Last time on b1..b24 then a1..a40, and a17 (rank 40) is lost.
    let previous: Vec<String> = (1..=24)
        .map(|i| format!("b{i}"))
        .chain((1..=40).map(|i| format!("a{i}")))
        .collect();
    let prev: Vec<(&str, &[u32])> = previous.iter().map(|n| (n.as_str(), ALL8)).collect();
    let s = Scenario::new(nodes)
        .pending([job(1).nodes(64).gpus(8).previous(&prev)])
        .tap(|s| s.node_state("a17", NodeState::Down));
    let placed = s.run().placement(1).expect("placed");
    for (rank, (node, gpus)) in placed.iter().enumerate() {
        if rank == 40 {
            assert!(
                node.starts_with('b'),
                "the spare comes from leaf l2: {node}"
            );
            assert!(!previous.contains(node), "{node} was already in the job");
        } else {
            assert_eq!(node, &previous[rank], "rank {rank} keeps its node");
        }
        assert_eq!(gpus.as_slice(), ALL8);
    }
}
