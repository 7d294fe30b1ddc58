//! Advance reservations (`gpuq admin reservation`): whole nodes held over a
//! window for every job but those that run in it; shorter jobs fill the
//! time before it; jobs in it wait for its start and run on its nodes only.

use std::collections::BTreeSet;
use std::sync::Arc;

use super::*;
use crate::model::AdvanceReservation;
use crate::sched::PendingReason::{ReservationNotStarted, ReservedNodes, Resources};

const NOW: Millis = 50_000_000;
const MIN: Millis = 60_000;
const HOUR: Millis = 3_600_000;

/// `s` with reservation `name` on `nodes` over `[start, end)`.
fn reserve(
    mut s: Scenario,
    name: &str,
    nodes: &[&str],
    (start, end): (Millis, Millis),
    maint: bool,
) -> Scenario {
    let r = AdvanceReservation {
        name: name.into(),
        nodes: nodes.iter().map(|n| n.to_string()).collect(),
        start,
        end,
        users: BTreeSet::new(),
        accounts: BTreeSet::new(),
        maint,
        by: "root".into(),
    };
    Arc::make_mut(&mut s.view.policy.policy)
        .reservations
        .insert(name.into(), r);
    s
}

fn at_now(nodes: impl IntoIterator<Item = NodeBuilder>) -> Scenario {
    let mut s = Scenario::new(nodes);
    s.now = NOW;
    s
}

fn within(b: JobBuilder, name: &str) -> JobBuilder {
    let mut b = b;
    b.job.placement.reservation = Some(name.into());
    b
}

fn maint(name: &str) -> crate::sched::PendingReason {
    ReservedNodes {
        reservation: name.into(),
        maint: true,
    }
}

#[test]
fn reservations_hold_their_nodes_for_every_job_that_would_overlap_them() {
    use Expect::{Nodes, On, Unsatisfiable, Waits};
    run_table(vec![
        Case {
            name: "a maintenance window in 10 minutes lets a 5-minute job start, not a 1-hour one",
            scenario: reserve(
                at_now([dgx("a")]).pending([job(1).gpus(8).time(3600), job(2).gpus(8).time(300)]),
                "m",
                &["a"],
                (NOW + 10 * MIN, NOW + 2 * HOUR),
                true,
            ),
            expect: vec![(1, Waits(maint("m"))), (2, On(&[("a", ALL8)]))],
        },
        Case {
            name: "a job without a time limit never lands on a node with a window ahead",
            scenario: reserve(
                at_now([dgx("a"), dgx("b")]).pending([job(1).gpus(8), job(2).gpus(8)]),
                "m",
                &["a"],
                (NOW + 24 * HOUR, NOW + 25 * HOUR),
                true,
            ),
            expect: vec![(1, Nodes(&["b"])), (2, Waits(maint("m")))],
        },
        Case {
            name: "a job in a reservation waits for its start",
            scenario: reserve(
                at_now([dgx("a"), dgx("b")]).pending([within(job(1).gpus(8).time(600), "r")]),
                "r",
                &["b"],
                (NOW + 10 * MIN, NOW + HOUR),
                false,
            ),
            expect: vec![(1, Waits(ReservationNotStarted("r".into())))],
        },
        Case {
            name: "once it has started, its jobs run on its nodes only and others stay off them",
            scenario: reserve(
                at_now([dgx("a"), dgx("b")]).pending([
                    within(job(1).gpus(4).time(600), "r"),
                    job(2).gpus(8).time(600),
                    job(3).gpus(4).time(600),
                ]),
                "r",
                &["b"],
                (NOW - MIN, NOW + HOUR),
                false,
            ),
            expect: vec![
                (1, Nodes(&["b"])),
                (2, Nodes(&["a"])),
                (
                    3,
                    Waits(ReservedNodes {
                        reservation: "r".into(),
                        maint: false,
                    }),
                ),
            ],
        },
        Case {
            name: "a job in a reservation that is full waits for resources there",
            scenario: reserve(
                at_now([dgx("a"), dgx("b")])
                    .running_until(held(90, "b", ALL8), NOW + 30 * MIN)
                    .pending([within(job(1).gpus(8).time(600), "r")]),
                "r",
                &["b"],
                (NOW - MIN, NOW + HOUR),
                false,
            ),
            expect: vec![(1, Waits(Resources))],
        },
        Case {
            name: "a reservation that is over holds nothing; one that is gone leaves its jobs a reason",
            scenario: reserve(
                at_now([dgx("a")]).pending([job(1).gpus(8), within(job(2).gpus(1).time(60), "gone")]),
                "old",
                &["a"],
                (NOW - 2 * HOUR, NOW - HOUR),
                true,
            ),
            expect: vec![
                (1, Nodes(&["a"])),
                (2, Unsatisfiable("reservation gone does not exist any more")),
            ],
        },
    ]);
}

#[test]
fn a_blocked_job_is_expected_to_start_after_the_window_it_would_overlap() {
    let s = reserve(
        at_now([dgx("a")]).pending([job(1).gpus(8).time(3600)]),
        "m",
        &["a"],
        (NOW + 10 * MIN, NOW + 2 * HOUR),
        true,
    );
    let out = s.run();
    assert_eq!(out.reason(1), Some(&maint("m")));
    assert_eq!(out.expected_start(1), Some(NOW + 2 * HOUR));
}
