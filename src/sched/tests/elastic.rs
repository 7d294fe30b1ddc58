//! Elastic jobs (`--nodes MIN-MAX`) in a pass: the size they start at,
//! growth into what nobody waits for, and shrinking instead of preemption.

use super::*;
use crate::model::{Policy, Qos};
use crate::sched::{ActiveJob, ElasticRun, Growth, Preemption};

const ALL8: &[u32] = &[0, 1, 2, 3, 4, 5, 6, 7];

fn four() -> Scenario {
    Scenario::new([dgx("a"), dgx("b"), dgx("c"), dgx("d")])
}

/// A running elastic job `id` of 8 GPUs a node on `nodes`, range `min-max`,
/// of the built-in QoS; `end`: when its time limit ends.
fn elastic_running(
    mut s: Scenario,
    id: u64,
    nodes: &[&str],
    (min, max): (u32, u32),
    end: Option<Millis>,
) -> Scenario {
    let mut alloc = held(id, nodes[0], ALL8);
    for n in &nodes[1..] {
        alloc.nodes.push(held(id, n, ALL8).nodes.remove(0));
    }
    s = s.running(alloc.clone());
    let shape = job(id).elastic(min, max).gpus(8).build();
    s.view.policy.running.push(ActiveJob {
        id: JobId(id),
        user: "alice".into(),
        account: "".into(),
        qos: "".into(),
        gpus: alloc.gpus(),
        start_time: 0,
        allocation: alloc.into(),
        completing: false,
        preempted_for: None,
        elastic: Some(Box::new(ElasticRun {
            shape,
            range: crate::model::NodeRange { min, max },
            end,
            since: 0,
            resizing_to: None,
        })),
    });
    s
}

fn nodes_of(a: &Allocation) -> Vec<&str> {
    a.nodes.iter().map(|n| n.node.as_str()).collect()
}

#[test]
fn an_elastic_job_starts_on_as_many_nodes_of_its_range_as_are_free() {
    let cases: Vec<(&str, Scenario, usize)> = vec![
        ("all four free: its maximum", four(), 4),
        (
            "two busy: the two free ones",
            four()
                .running(held(50, "a", ALL8))
                .running(held(51, "b", ALL8)),
            2,
        ),
        (
            "three busy: fewer than its minimum, it waits",
            four()
                .running(held(50, "a", ALL8))
                .running(held(51, "b", ALL8))
                .running(held(52, "c", ALL8)),
            0,
        ),
    ];
    for (what, s, want) in cases {
        let out = s.pending([job(1).elastic(2, 4).gpus(8)]).run();
        let got = out.plan.allocations.first().map_or(0, |a| a.nodes.len());
        assert_eq!(got, want, "{what}: {:?}", out.plan);
    }
}

#[test]
fn a_running_elastic_job_grows_into_free_nodes_nobody_waits_for() {
    let s = elastic_running(four(), 1, &["a", "b"], (2, 4), None);
    let plan = s.run().plan;
    let [Growth { job: grown, added }] = &plan.growths[..] else {
        panic!("{plan:?}")
    };
    assert_eq!((grown.0, nodes_of(added)), (1, vec!["c", "d"]));
    // Not before it has run its settle time at its size.
    let young = elastic_running(four(), 1, &["a", "b"], (2, 4), None).tap(|s| {
        let e = s.view.policy.running[0].elastic.as_mut().unwrap();
        e.since = s.now - 1000;
    });
    assert!(young.run().plan.growths.is_empty());
    // At its maximum, or with a pending job taking the free nodes: no growth.
    let full = elastic_running(four(), 1, &["a", "b", "c", "d"], (2, 4), None);
    assert!(full.run().plan.growths.is_empty());
    let taken =
        elastic_running(four(), 1, &["a", "b"], (2, 4), None).pending([job(2).nodes(2).gpus(8)]);
    let plan = taken.run().plan;
    assert_eq!(plan.allocations.len(), 1, "{plan:?}");
    assert!(plan.growths.is_empty(), "{plan:?}");
}

#[test]
fn growth_never_takes_nodes_a_blocked_job_is_reserved() {
    // Job 2 needs three nodes; c and d are free, e frees in an hour: it is
    // reserved c, d and e from then. The elastic job, unlimited, may not
    // grow into c and d; one that ends before the reservation may.
    let hour = 3_600_000;
    let base = |end| {
        let s = Scenario::new([dgx("a"), dgx("b"), dgx("c"), dgx("d"), dgx("e")]);
        let s = elastic_running(s, 1, &["a", "b"], (2, 4), end);
        let now = s.now;
        s.running_until(held(3, "e", ALL8), now + hour)
            .pending([job(2).nodes(3).gpus(8).time(7200)])
    };
    let unlimited = base(None).run().plan;
    assert_eq!(unlimited.reservations.len(), 1, "{unlimited:?}");
    assert!(unlimited.growths.is_empty(), "{unlimited:?}");
    let now = base(None).now;
    let short = base(Some(now + hour / 2)).run().plan;
    let [Growth { added, .. }] = &short.growths[..] else {
        panic!("{short:?}")
    };
    assert_eq!(nodes_of(added), vec!["c", "d"]);
}

#[test]
fn a_preemptor_shrinks_an_elastic_job_to_its_minimum_before_preempting_it() {
    let mut p = Policy::fifo();
    let mut hi = Qos::new("high");
    hi.preempts.insert("normal".into());
    p.qos.insert("high".into(), hi);
    let p = std::sync::Arc::new(p);
    // On four nodes, range 2-4: it gives back two nodes, its last ranks.
    let s = elastic_running(four(), 1, &["a", "b", "c", "d"], (2, 4), None)
        .pending([job(2).nodes(2).gpus(8).qos("high")])
        .tap(|s| s.view.policy.policy = p.clone());
    let plan = s.run().plan;
    let [Preemption {
        job: preemptor,
        victims,
        shrinks,
        ..
    }] = &plan.preemptions[..]
    else {
        panic!("{plan:?}")
    };
    assert_eq!(preemptor.0, 2);
    assert!(victims.is_empty(), "{plan:?}");
    assert_eq!(shrinks.len(), 1, "{plan:?}");
    assert_eq!(nodes_of(&shrinks[0]), vec!["a", "b"]);
    // At its minimum it cannot shrink: it is preempted whole.
    let s = elastic_running(four(), 1, &["a", "b"], (2, 4), None)
        .running(held(50, "c", ALL8))
        .running(held(51, "d", ALL8))
        .pending([job(2).nodes(2).gpus(8).qos("high")])
        .tap(|s| s.view.policy.policy = p.clone());
    let plan = s.run().plan;
    let [Preemption {
        victims, shrinks, ..
    }] = &plan.preemptions[..]
    else {
        panic!("{plan:?}")
    };
    assert_eq!(victims, &vec![JobId(1)]);
    assert!(shrinks.is_empty());
}
