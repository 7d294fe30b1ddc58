//! MASTER_PORT: a node is rank 0 of at most as many running jobs as the
//! cluster's range has ports; a job whose every candidate is full waits.

use super::*;
use crate::sched::PendingReason::{NoMasterPort, Priority};

fn cases() -> Vec<Case> {
    use Expect::{Nodes, Waits};
    vec![
        Case {
            name: "a one-node job skips the best fit when its ports are taken",
            scenario: Scenario::new([dgx("a"), dgx("b")])
                .running(held(90, "a", &[0]))
                .master_ports(1, &[("a", 1)])
                .pending([job(1).gpus(1)]),
            expect: vec![(1, Nodes(&["b"]))],
        },
        Case {
            name: "a gang takes as rank 0 the first of its nodes with a port free",
            scenario: Scenario::new([dgx("a"), dgx("b"), dgx("c")])
                .master_ports(2, &[("a", 2)])
                .pending([job(1).nodes(2).gpus(8)]),
            expect: vec![(1, Nodes(&["b", "a"]))],
        },
        Case {
            name: "ports run out within one pass too",
            scenario: Scenario::new([dgx("a")]).master_ports(2, &[]).pending([
                job(1).gpus(1),
                job(2).gpus(1),
                job(3).gpus(1),
            ]),
            expect: vec![
                (1, Nodes(&["a"])),
                (2, Nodes(&["a"])),
                (3, Waits(NoMasterPort)),
            ],
        },
        Case {
            name: "every candidate full: the job waits, and blocks the queue",
            scenario: Scenario::new([dgx("a"), dgx("b")])
                .master_ports(1, &[("a", 1), ("b", 1)])
                .pending([job(1).nodes(2).gpus(1), job(2).gpus(1)]),
            expect: vec![(1, Waits(NoMasterPort)), (2, Waits(Priority))],
        },
    ]
}

#[test]
fn master_port_table() {
    run_table(cases());
}

#[test]
fn the_reason_names_the_setting() {
    let text = NoMasterPort.to_string();
    assert!(text.contains("master_port_range"), "{text}");
}
