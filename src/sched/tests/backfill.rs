//! Backfill scenarios: reservations and expected starts for blocked jobs,
//! lower jobs let in only where they delay no reservation, and the reasons
//! of jobs kept back outside the scheduler (holds, dependencies, begin
//! times, array throttles, singletons).

use super::*;
use crate::model::TopologyRequirement::Leaf;
use crate::sched::BackfillOrder;
use crate::sched::PendingReason::{
    BeginTime, Dependency, Held, JobArrayTaskLimit, Priority, ReservedForOthers, Resources,
    Topology,
};

const NOW: Millis = 10_000_000;
const MIN: Millis = 60_000;
const HOUR: Millis = 3_600_000;

/// One GPU free on `a` until a 7-GPU job ends in an hour; job 1 needs all 8
/// (its reservation, the pass's one: depth 1), jobs 2 (50 minutes) and 3
/// (10 minutes) both fit the hole, one at a time; backfill tries them in
/// `order`.
fn one_hole(order: BackfillOrder) -> Scenario {
    let mut s = at_now([dgx("a")])
        .running_until(held(90, "a", &[0, 1, 2, 3, 4, 5, 6]), NOW + HOUR)
        .pending([
            job(1).gpus(8).time(7200),
            job(2).gpus(1).time(3000),
            job(3).gpus(1).time(600),
        ]);
    s.view.backfill.depth = 1;
    s.view.backfill.order = order;
    s
}

/// A scenario at [`NOW`].
fn at_now(nodes: impl IntoIterator<Item = NodeBuilder>) -> Scenario {
    let mut s = Scenario::new(nodes);
    s.now = NOW;
    s
}

/// A scenario at [`NOW`] where ten blocked jobs get reservations, tried in
/// priority order (Slurm's way; the default is one, then shortest first):
/// for the timeline's work across reservations.
fn deep_at_now(nodes: impl IntoIterator<Item = NodeBuilder>) -> Scenario {
    let mut s = at_now(nodes);
    s.view.backfill.depth = 10;
    s.view.backfill.order = BackfillOrder::Priority;
    s
}

fn cases() -> Vec<Case> {
    use Expect::{Nodes, On, Waits};
    vec![
        Case {
            name: "a short job backfills into the gap before a reservation; longer ones may not",
            scenario: at_now([dgx("a")])
                .running_until(held(90, "a", &[0, 1, 2, 3, 4, 5]), NOW + HOUR)
                .pending([
                    job(1).gpus(8).time(7200),
                    job(2).gpus(1).time(1800),
                    job(3).gpus(1).time(7200),
                    job(4).gpus(1),
                ]),
            expect: vec![
                (1, Waits(Resources)),
                (2, On(&[("a", &[6])])),
                (3, Waits(ReservedForOthers)),
                (4, Waits(ReservedForOthers)),
            ],
        },
        Case {
            name: "a long job backfills on resources no reservation holds",
            scenario: at_now([dgx("a"), dgx("b")])
                .running_until(held(90, "a", ALL8), NOW + HOUR)
                .running_until(held(91, "b", &[0, 1, 2, 3]), NOW + 2 * HOUR)
                .pending([job(1).gpus(8).time(3600), job(2).gpus(4).time(36_000)]),
            expect: vec![(1, Waits(Resources)), (2, On(&[("b", &[4, 5, 6, 7])]))],
        },
        Case {
            name: "a job without a time limit backfills only outside every reservation",
            scenario: at_now([dgx("a"), dgx("b")])
                .running_until(held(90, "a", ALL8), NOW + HOUR)
                .running_until(held(91, "b", &[0, 1, 2, 3]), NOW + 2 * HOUR)
                .pending([job(1).gpus(8).time(3600), job(2).gpus(4)]),
            expect: vec![(1, Waits(Resources)), (2, Nodes(&["b"]))],
        },
        Case {
            name: "two gang reservations do not overlap; a job fitting neither gap waits",
            scenario: at_now([dgx("a"), dgx("b"), dgx("c")])
                .running_until(held(90, "a", ALL8), NOW + HOUR)
                .running_until(held(91, "b", ALL8), NOW + 2 * HOUR)
                .running_until(held(92, "c", ALL8), NOW + 3 * HOUR)
                .pending([
                    job(1).nodes(2).gpus(8).time(3600),
                    job(2).nodes(2).gpus(8).time(3600),
                    job(3).gpus(8).time(600),
                ]),
            expect: vec![
                (1, Waits(Resources)),
                (2, Waits(Priority)),
                (3, Waits(Priority)),
            ],
        },
        Case {
            name: "depth 0 is strict priority: nothing overtakes a blocked job",
            scenario: {
                let mut s = at_now([dgx("a")])
                    .running_until(held(90, "a", &[0, 1, 2, 3, 4, 5]), NOW + HOUR)
                    .pending([job(1).gpus(8).time(7200), job(2).gpus(1).time(60)]);
                s.view.backfill.depth = 0;
                s
            },
            expect: vec![(1, Waits(Resources)), (2, Waits(Priority))],
        },
        Case {
            name: "past max_job_test, jobs are not tried and wait for Priority",
            scenario: {
                let mut s = at_now([dgx("a")])
                    .running_until(held(90, "a", &[0, 1, 2, 3, 4, 5]), NOW + HOUR)
                    .pending([
                        job(1).gpus(8).time(7200),
                        job(2).gpus(1).time(60),
                        job(3).gpus(1).time(60),
                    ]);
                s.view.backfill.max_job_test = 1;
                s
            },
            expect: vec![
                (1, Waits(Resources)),
                (2, Nodes(&["a"])),
                (3, Waits(Priority)),
            ],
        },
        Case {
            name: "backfill in priority order: the first job to fit the hole takes it",
            scenario: one_hole(BackfillOrder::Priority),
            expect: vec![
                (1, Waits(Resources)),
                (2, On(&[("a", &[7])])),
                (3, Waits(Priority)),
            ],
        },
        Case {
            name: "backfill shortest first: the shorter job takes the hole",
            scenario: one_hole(BackfillOrder::Shortest),
            expect: vec![
                (1, Waits(Resources)),
                (2, Waits(Priority)),
                (3, On(&[("a", &[7])])),
            ],
        },
        Case {
            name: "a topology reservation waits for one leaf to free up",
            scenario: at_now([
                dgx("a").topo("s1/l1"),
                dgx("b").topo("s1/l1"),
                dgx("c").topo("s1/l2"),
                dgx("d").topo("s1/l2"),
            ])
            .running_until(held(90, "a", ALL8), NOW + HOUR)
            .running_until(held(91, "c", ALL8), NOW + 2 * HOUR)
            .pending([
                job(1).nodes(2).gpus(8).topology(Leaf).time(3600),
                job(2).gpus(8).time(7200),
            ]),
            // d is not in the reservation (a and b are): job 2 takes it.
            expect: vec![(1, Waits(Topology(Leaf))), (2, Nodes(&["d"]))],
        },
        Case {
            name: "held, dependent and not-yet-begun jobs wait with their reason and block nobody",
            scenario: at_now([dgx("a")]).pending([
                job(1).gpus(8).blocked(Held),
                job(2).gpus(8).blocked(Dependency),
                job(3).gpus(8).begin(NOW + MIN),
                job(4).gpus(2).begin(NOW - MIN),
                job(5).gpus(1),
            ]),
            expect: vec![
                (1, Waits(Held)),
                (2, Waits(Dependency)),
                (3, Waits(BeginTime)),
                (4, Nodes(&["a"])),
                (5, Nodes(&["a"])),
            ],
        },
        Case {
            name: "an array throttle: only as many tasks start as slots are left",
            scenario: at_now([dgx("a")]).pending([
                job(1).gpus(1).array(1, 2),
                job(2).gpus(1).array(1, 2),
                job(3).gpus(1).array(1, 2),
                job(4).gpus(1).array(4, 0),
                job(5).gpus(1),
            ]),
            expect: vec![
                (1, Nodes(&["a"])),
                (2, Nodes(&["a"])),
                (3, Waits(JobArrayTaskLimit)),
                (4, Waits(JobArrayTaskLimit)),
                (5, Nodes(&["a"])),
            ],
        },
        Case {
            name: "singletons: one of a user's same-named jobs starts per pass",
            scenario: at_now([dgx("a")]).pending([
                job(1).gpus(1).singleton("train"),
                job(2).gpus(1).singleton("train"),
                job(3).gpus(1).singleton("eval"),
            ]),
            expect: vec![
                (1, Nodes(&["a"])),
                (2, Waits(Dependency)),
                (3, Nodes(&["a"])),
            ],
        },
    ]
}

#[test]
fn backfill_table() {
    run_table(cases());
}

#[test]
fn expected_starts_come_from_running_jobs_ends() {
    let out = deep_at_now([dgx("a"), dgx("b"), dgx("c")])
        .running_until(held(90, "a", ALL8), NOW + HOUR)
        .running_until(held(91, "b", ALL8), NOW + 2 * HOUR)
        .running_until(held(92, "c", ALL8), NOW + 3 * HOUR)
        .pending([
            job(1).gpus(8).time(600),
            job(2).nodes(2).gpus(8).time(3600),
            job(3).nodes(2).gpus(8).time(3600),
        ])
        .run();
    // Job 1 gets a at +1h (for 10 minutes); job 2 needs two nodes: a and b
    // at +2h; job 3 has to wait for job 2's reservation to end at +3h.
    assert_eq!(out.expected_start(1), Some(NOW + HOUR));
    assert_eq!(out.expected_start(2), Some(NOW + 2 * HOUR));
    assert_eq!(out.expected_start(3), Some(NOW + 3 * HOUR));
    let nodes = |j: u64| -> Vec<String> {
        let r = out
            .plan
            .reservations
            .iter()
            .find(|r| r.job == JobId(j))
            .expect("reserved");
        r.allocation.nodes.iter().map(|n| n.node.clone()).collect()
    };
    assert_eq!(nodes(1), ["a"]);
    assert_eq!(nodes(2), ["a", "b"]);
}

#[test]
fn an_overdue_job_is_expected_to_end_any_moment() {
    let out = at_now([dgx("a")])
        .running_until(held(90, "a", ALL8), NOW - HOUR)
        .pending([job(1).gpus(8).time(60)])
        .run();
    assert_eq!(out.reason(1), Some(&Resources));
    assert_eq!(out.expected_start(1), Some(NOW + 1));
}

#[test]
fn without_a_timeline_a_blocked_job_holds_the_queue() {
    // Usage with no running job behind it: when it ends is unknown, so the
    // blocked job gets no expected start and nothing overtakes it.
    let out = at_now([dgx("a")])
        .running(held(90, "a", &[0, 1, 2, 3, 4, 5]))
        .pending([job(1).gpus(8).time(60), job(2).gpus(1).time(60)])
        .run();
    assert_eq!(out.expected_start(1), None);
    assert_eq!(out.reason(2), Some(&Priority));
}

#[test]
fn a_long_queue_behind_a_blocked_head_is_cheap_and_sound() {
    // 20,000 one-GPU jobs behind a blocked whole-node job: the 6 free GPUs
    // go to short jobs that end before the reservation, the rest wait.
    let mut s = at_now([dgx("a"), dgx("b")])
        .running_until(held(90, "a", &[0, 1]), NOW + HOUR)
        .running_until(held(91, "b", ALL8), NOW + 2 * HOUR)
        .pending([job(1).nodes(2).gpus(8).time(3600)]);
    s = s.pending((2..20_002).map(|i| job(i).gpus(1).time(if i % 2 == 0 { 10_800 } else { 600 })));
    let out = s.run();
    assert_eq!(out.expected_start(1), Some(NOW + 2 * HOUR));
    assert_eq!(out.plan.allocations.len(), 6, "{:?}", out.plan.allocations);
    assert!(out
        .plan
        .allocations
        .iter()
        .all(|a| a.job.0 % 2 == 1 && a.job.0 < 20));
}

#[test]
fn the_timeline_carried_between_reservations_counts_the_starts_made_since() {
    // Job 1's reservation leaves the timeline's pool at +1h. Job 2 then
    // starts on d until +2h; job 3's search starts at +1h on that same
    // pool, which must hold job 2 too: d is not whole before +2h.
    let out = deep_at_now([dgx("a"), dgx("b"), dgx("c"), dgx("d")])
        .running_until(held(90, "a", ALL8), NOW + HOUR)
        .running_until(held(91, "b", ALL8), NOW + HOUR)
        .running_until(held(92, "c", ALL8), NOW + HOUR)
        .running_until(held(93, "d", &[0, 1]), NOW + HOUR)
        .pending([
            job(1).nodes(3).gpus(8).time(3600),
            job(2).gpus(6).time(7200),
            job(3).gpus(8).time(600),
        ])
        .run();
    assert_eq!(out.expected_start(1), Some(NOW + HOUR));
    assert!(
        out.plan.allocations.iter().any(|a| a.job == JobId(2)),
        "{:?}",
        out.plan
    );
    assert_eq!(out.expected_start(3), Some(NOW + 2 * HOUR));
}

#[test]
fn a_reservation_earlier_than_the_last_one_is_found() {
    // Job 1 is reserved at +2h; job 2 starts on c now and ends in 30
    // minutes; job 3 fits a at +1h, before job 1's reservation, so its
    // search must look at times before the timeline's last one.
    let out = deep_at_now([dgx("a"), dgx("b"), dgx("c")])
        .running_until(held(90, "a", ALL8), NOW + HOUR)
        .running_until(held(91, "b", ALL8), NOW + 2 * HOUR)
        .running_until(held(92, "c", &[0, 1, 2, 3]), NOW + 3 * HOUR)
        .pending([
            job(1).nodes(2).gpus(8).time(3600),
            job(2).gpus(4).time(1800),
            job(3).gpus(8).time(600),
            job(4).gpus(8).time(3600),
        ])
        .run();
    assert_eq!(out.expected_start(1), Some(NOW + 2 * HOUR));
    assert!(
        out.plan.allocations.iter().any(|a| a.job == JobId(2)),
        "{:?}",
        out.plan
    );
    assert_eq!(out.expected_start(3), Some(NOW + HOUR));
    // a is job 3's for 10 minutes, then job 1's from +2h; b is job 1's
    // from +2h; c is whole at +3h.
    assert_eq!(out.expected_start(4), Some(NOW + 3 * HOUR));
}

#[test]
fn each_partition_gets_its_own_reservations() {
    // Depth 1 in each of two partitions, one node each: job 2 is the first
    // blocked job of its partition, so it gets a reservation there although
    // job 1 took the pass's first; the long job 3 may not take b's free GPU
    // ahead of it, the short job 4 may.
    let mut p = crate::model::Policy::fifo();
    for (name, node) in [("left", "a"), ("right", "b")] {
        let mut part = crate::model::Partition::new(name);
        part.nodes = Some(node.into());
        p.partitions.insert(name.into(), part);
    }
    let mut s = at_now([dgx("a"), dgx("b")])
        .running_until(held(90, "a", &[0, 1, 2, 3, 4, 5, 6]), NOW + HOUR)
        .running_until(held(91, "b", &[0, 1, 2, 3, 4, 5, 6]), NOW + HOUR)
        .pending([
            job(1).gpus(8).time(7200).partition("left"),
            job(2).gpus(8).time(7200).partition("right"),
            job(3).gpus(1).time(36_000).partition("right"),
            job(4).gpus(1).time(600).partition("right"),
        ]);
    s.view.policy.policy = std::sync::Arc::new(p);
    s.view.backfill.order = BackfillOrder::Priority;
    let out = s.run();
    assert_eq!(out.expected_start(1), Some(NOW + HOUR));
    assert_eq!(out.expected_start(2), Some(NOW + HOUR));
    let expect = [
        (1, Expect::Waits(Resources)),
        (2, Expect::Waits(Priority)),
        (3, Expect::Waits(ReservedForOthers)),
        (4, Expect::On(&[("b", &[7])])),
    ];
    assert_eq!(out.mismatches(&expect), Vec::<String>::new());
}

#[test]
fn blocked_jobs_past_the_reservation_get_expected_starts_that_hold_nothing() {
    // Depth 1 (the default): job 1 is reserved at +1h on a; job 2 gets an
    // estimate only. Job 3 (one GPU for 3 hours) starts now on b's free GPU
    // although job 2 could have had b at +2h had it been reserved:
    // estimates are shown, never held.
    let scenario = || {
        at_now([dgx("a"), dgx("b")])
            .running_until(held(90, "a", ALL8), NOW + HOUR)
            .running_until(held(91, "b", &[0, 1, 2, 3, 4, 5, 6]), NOW + 2 * HOUR)
            .pending([
                job(1).gpus(8).time(600),
                job(2).nodes(2).gpus(8).time(3600),
                job(3).gpus(1).time(3 * 3600),
            ])
    };
    let out = scenario().run();
    assert_eq!(out.expected_start(1), Some(NOW + HOUR));
    // b is whole once job 3 ends, at +3h.
    assert_eq!(out.expected_start(2), Some(NOW + 3 * HOUR));
    assert_eq!(out.placement(3), Some(vec![("b".into(), vec![7])]));
    let mut s = scenario();
    s.view.backfill.estimates = 0;
    let out = s.run();
    assert_eq!(out.expected_start(1), Some(NOW + HOUR));
    assert_eq!(out.expected_start(2), None);
}
