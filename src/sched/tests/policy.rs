//! Policy scenarios: multifactor order, fair-share, quotas, partitions and
//! preemption (QoS and reclaim), as tables of nodes + running jobs +
//! pending jobs + policy -> plan.

use super::*;
use crate::model::{Account, Partition, PartitionState, Policy, PriorityWeights, Qos, UsageCell};
use crate::sched::{ActiveJob, Preemption};

fn weights(f: impl FnOnce(&mut PriorityWeights)) -> Policy {
    let mut p = Policy::fifo();
    f(&mut p.weights);
    p
}

fn with(mut s: Scenario, policy: Policy) -> Scenario {
    s.view.policy.policy = std::sync::Arc::new(policy);
    s
}

/// A running job of `account`/`qos` holding `gpus` on `node`, started at `start`.
fn running(
    mut s: Scenario,
    id: u64,
    node: &str,
    gpus: &[u32],
    account: &str,
    qos: &str,
    start: Millis,
) -> Scenario {
    let alloc = held(id, node, gpus);
    s = s.running(alloc.clone());
    s.view.policy.running.push(ActiveJob {
        id: JobId(id),
        user: "bob".into(),
        account: account.into(),
        qos: qos.into(),
        gpus: gpus.len() as u64,
        start_time: start,
        allocation: alloc.into(),
        completing: false,
        preempted_for: None,
        elastic: None,
    });
    s
}

fn order(s: &Scenario) -> Vec<u64> {
    crate::sched::queue_order(&s.view, s.now)
        .iter()
        .map(|(j, _)| j.id.0)
        .collect()
}

fn preemptions(s: &Scenario) -> Vec<(u64, Vec<u64>)> {
    s.run()
        .plan
        .preemptions
        .iter()
        .map(|Preemption { job, victims, .. }| (job.0, victims.iter().map(|v| v.0).collect()))
        .collect()
}

#[test]
fn each_factor_orders_the_queue() {
    let two_qos = |w: u32| {
        let mut p = weights(|x| x.qos = w);
        let mut hi = Qos::new("high");
        hi.priority = 10;
        p.qos.insert("high".into(), hi);
        p
    };
    let mut parts = weights(|w| w.partition = 100);
    let mut fast = Partition::new("fast");
    fast.priority = 5;
    parts.partitions.insert("fast".into(), fast);
    let base = || Scenario::new([dgx("a")]);
    let cases: Vec<(&str, Scenario, Vec<u64>)> = vec![
        (
            "no weights: submit order",
            base().pending([job(1), job(2).qos("high"), job(3)]),
            vec![1, 2, 3],
        ),
        (
            "age: the older first, whatever the id",
            with(
                base().pending([job(1).submit(900_000), job(2).submit(100)]),
                weights(|w| w.age = 1000),
            ),
            vec![2, 1],
        ),
        (
            "qos: the higher QoS first",
            with(
                base().pending([job(1), job(2).qos("high"), job(3)]),
                two_qos(1000),
            ),
            vec![2, 1, 3],
        ),
        (
            "partition priority",
            with(base().pending([job(1), job(2).partition("fast")]), parts),
            vec![2, 1],
        ),
        (
            "job size: the larger first",
            with(
                base().pending([job(1).gpus(1), job(2).gpus(8)]),
                weights(|w| w.job_size = 1000),
            ),
            vec![2, 1],
        ),
        (
            "nice pushes a job back",
            base().pending([job(1).nice(5), job(2)]),
            vec![2, 1],
        ),
        (
            "negative nice pulls a job forward",
            base().pending([job(1), job(2).nice(-1)]),
            vec![2, 1],
        ),
    ];
    let mut bad = Vec::new();
    for (name, s, want) in cases {
        let got = order(&s);
        if got != want {
            bad.push(format!("{name}: expected {want:?}, got {got:?}"));
        }
        // The planner follows the same order.
        s.run();
    }
    assert!(bad.is_empty(), "\n{}", bad.join("\n"));
}

#[test]
fn fair_share_favours_the_account_under_its_share() {
    let mut p = weights(|w| w.fairshare = 10_000);
    for (name, shares) in [("ml", 1), ("cv", 1)] {
        let mut a = Account::new(name);
        a.shares = shares;
        p.accounts.insert(name.into(), a);
    }
    let mut s = with(
        Scenario::new([dgx("a")]).pending([job(1).account("ml"), job(2).account("cv")]),
        p.clone(),
    );
    // ml used 10 GPU-hours, cv nothing: cv goes first.
    s.view.policy.usage.insert(
        "ml".into(),
        [(
            "alice".to_string(),
            UsageCell {
                gpu_ms: 36_000_000_000,
                at: s.now,
                total_gpu_ms: 0,
            },
        )]
        .into(),
    );
    assert_eq!(order(&s), vec![2, 1]);
    let fs = crate::sched::fairshare::compute(&s.view.policy, s.now);
    assert!(fs.of("cv") > fs.of("ml"));
    assert_eq!(fs.of("cv"), 1.0, "no usage: factor 1");
    // Norm shares: default, ml, cv a third each.
    let ml = fs
        .rows
        .iter()
        .find(|r| r.account == "ml" && r.user.is_none());
    assert!((ml.unwrap().norm_shares - 1.0 / 3.0).abs() < 1e-9);
    // A running job counts as usage too.
    let s = running(s, 9, "a", &[0, 1, 2, 3], "cv", "", 0);
    let fs = crate::sched::fairshare::compute(&s.view.policy, s.now);
    assert!(fs.of("cv") < 1.0);
}

#[test]
fn hierarchical_shares_split_the_parent() {
    let mut p = Policy::fifo();
    let mut org = Account::new("org");
    org.shares = 3;
    p.accounts.insert("org".into(), org);
    for (name, shares) in [("a", 1), ("b", 2)] {
        let mut x = Account::new(name);
        x.parent = Some("org".into());
        x.shares = shares;
        p.accounts.insert(name.into(), x);
    }
    let s = with(Scenario::new([dgx("n")]), p);
    let fs = crate::sched::fairshare::compute(&s.view.policy, s.now);
    let norm = |a: &str| {
        fs.rows
            .iter()
            .find(|r| r.account == a && r.user.is_none())
            .unwrap()
            .norm_shares
    };
    // org 3 of 4 top-level shares (default has 1); a and b split it 1:2.
    assert!((norm("org") - 0.75).abs() < 1e-9);
    assert!((norm("a") - 0.25).abs() < 1e-9);
    assert!((norm("b") - 0.5).abs() < 1e-9);
}

#[test]
fn quotas_hold_jobs_without_blocking_others() {
    let mut p = Policy::fifo();
    let mut ml = Account::new("ml");
    ml.max_gpus = Some(8);
    p.accounts.insert("ml".into(), ml);
    let mut q = Qos::new("capped");
    q.max_gpus_per_user = Some(2);
    p.qos.insert("capped".into(), q);
    let base = || Scenario::new([dgx("a"), dgx("b")]);
    run_table(vec![
        Case {
            name: "account cap counts running jobs",
            scenario: with(
                running(base(), 50, "a", &[0, 1, 2, 3, 4, 5], "ml", "", 0)
                    .pending([job(1).account("ml").gpus(4), job(2).gpus(4)]),
                p.clone(),
            ),
            expect: vec![
                (1, Expect::Waits(PendingReason::QuotaExceeded)),
                // Not blocked behind it.
                (2, Expect::Nodes(&["b"])),
            ],
        },
        Case {
            name: "account cap counts the pass's own starts",
            scenario: with(
                base().pending([
                    job(1).account("ml").gpus(8),
                    job(2).account("ml").gpus(1),
                    job(3).gpus(1),
                ]),
                p.clone(),
            ),
            expect: vec![
                (1, Expect::Nodes(&["a"])),
                (2, Expect::Waits(PendingReason::QuotaExceeded)),
                (3, Expect::Nodes(&["b"])),
            ],
        },
        Case {
            name: "QoS GPUs per user",
            scenario: with(
                base().pending([
                    job(1).qos("capped").gpus(2),
                    job(2).qos("capped").gpus(1),
                    job(3).qos("capped").gpus(1).user("carol"),
                ]),
                p.clone(),
            ),
            expect: vec![
                (1, Expect::Nodes(&["a"])),
                (2, Expect::Waits(PendingReason::QuotaExceeded)),
                (3, Expect::Nodes(&["a"])),
            ],
        },
    ]);
}

#[test]
fn partitions_restrict_nodes_and_can_be_down() {
    let mut p = Policy::fifo();
    let mut small = Partition::new("small");
    small.nodes = Some("b".into());
    p.partitions.insert("small".into(), small);
    let mut off = Partition::new("off");
    off.state = PartitionState::Down;
    p.partitions.insert("off".into(), off);
    run_table(vec![
        Case {
            name: "a partition's jobs go to its nodes only",
            scenario: with(
                Scenario::new([dgx("a"), dgx("b")])
                    .pending([job(1).gpus(1).partition("small"), job(2).gpus(8)]),
                p.clone(),
            ),
            expect: vec![(1, Expect::Nodes(&["b"])), (2, Expect::Nodes(&["a"]))],
        },
        Case {
            name: "too big for the partition's nodes: unsatisfiable",
            scenario: with(
                Scenario::new([dgx("a"), dgx("b")])
                    .pending([job(1).gpus(8).nodes(2).partition("small")]),
                p.clone(),
            ),
            expect: vec![(1, Expect::Unsatisfiable(""))],
        },
        Case {
            name: "a down partition holds its jobs, not the others",
            scenario: with(
                Scenario::new([dgx("a")]).pending([job(1).partition("off"), job(2)]),
                p.clone(),
            ),
            expect: vec![
                (1, Expect::Waits(PendingReason::PartitionDown)),
                (2, Expect::Nodes(&["a"])),
            ],
        },
    ]);
}

fn preempting_policy() -> Policy {
    let mut p = weights(|w| w.qos = 1000);
    let mut hi = Qos::new("high");
    hi.priority = 10;
    hi.preempts.insert("normal".into());
    p.qos.insert("high".into(), hi);
    p
}

#[test]
fn qos_preemption_picks_the_fewest_then_cheapest_victims() {
    let p = preempting_policy();
    type Row = (&'static str, Scenario, Vec<(u64, Vec<u64>)>);
    let cases: Vec<Row> = vec![
        (
            "one low job in the way",
            running(Scenario::new([dgx("a")]), 50, "a", ALL8, "", "", 0)
                .pending([job(1).qos("high").gpus(8)]),
            vec![(1, vec![50])],
        ),
        (
            "fewest victims: one 8-GPU job over two 4-GPU ones",
            running(
                running(
                    running(
                        Scenario::new([dgx("a"), dgx("b")]),
                        50,
                        "a",
                        ALL8,
                        "",
                        "",
                        999_000,
                    ),
                    51,
                    "b",
                    &[0, 1, 2, 3],
                    "",
                    "",
                    999_000,
                ),
                52,
                "b",
                &[4, 5, 6, 7],
                "",
                "",
                999_000,
            )
            .pending([job(1).qos("high").gpus(8)]),
            vec![(1, vec![50])],
        ),
        (
            "fewest GPU-hours lost: the younger of two",
            running(
                running(
                    Scenario::new([dgx("a"), dgx("b")]),
                    50,
                    "a",
                    ALL8,
                    "",
                    "",
                    0,
                ),
                51,
                "b",
                ALL8,
                "",
                "",
                900_000,
            )
            .pending([job(1).qos("high").gpus(8)]),
            vec![(1, vec![51])],
        ),
        (
            "only what is needed: 2 free + one 2-GPU victim for 4 GPUs",
            running(
                running(
                    running(Scenario::new([dgx("a")]), 50, "a", &[0, 1], "", "", 0),
                    51,
                    "a",
                    &[2, 3],
                    "",
                    "",
                    500_000,
                ),
                52,
                "a",
                &[4, 5],
                "",
                "",
                0,
            )
            .pending([job(1).qos("high").gpus(4)]),
            vec![(1, vec![51])],
        ),
        (
            "a gang preempts on every node it needs",
            running(
                running(
                    Scenario::new([dgx("a"), dgx("b")]),
                    50,
                    "a",
                    ALL8,
                    "",
                    "",
                    0,
                ),
                51,
                "b",
                &[0],
                "",
                "",
                0,
            )
            .pending([job(1).qos("high").gpus(8).nodes(2)]),
            vec![(1, vec![50, 51])],
        ),
        (
            "no preemption when it fits on free GPUs",
            running(
                Scenario::new([dgx("a"), dgx("b")]),
                50,
                "a",
                ALL8,
                "",
                "",
                0,
            )
            .pending([job(1).qos("high").gpus(8)]),
            vec![],
        ),
        (
            "no preemption of a QoS it does not list",
            running(Scenario::new([dgx("a")]), 50, "a", ALL8, "", "high", 0)
                .pending([job(1).qos("high").gpus(8)]),
            vec![],
        ),
        (
            "no preemption when the victims could not make it fit",
            running(Scenario::new([dgx("a")]), 50, "a", &[0], "", "", 0)
                .pending([job(1).qos("high").gpus(8).nodes(2)]),
            vec![],
        ),
        (
            "a normal job never preempts",
            running(Scenario::new([dgx("a")]), 50, "a", ALL8, "", "", 0).pending([job(1).gpus(8)]),
            vec![],
        ),
    ];
    let mut bad = Vec::new();
    for (name, s, want) in cases {
        let s = with(s, p.clone());
        let got = preemptions(&s);
        if got != want {
            bad.push(format!("{name}: expected {want:?}, got {got:?}"));
        }
        if !want.is_empty() {
            let out = s.run();
            if out.reason(1) != Some(&PendingReason::Preempting) {
                bad.push(format!("{name}: job 1 {:?}", out.reason(1)));
            }
        }
    }
    assert!(bad.is_empty(), "\n{}", bad.join("\n"));
}

#[test]
fn a_job_waits_for_its_victims_and_preempts_no_more() {
    let p = preempting_policy();
    let mut s = with(
        running(
            running(
                Scenario::new([dgx("a"), dgx("b")]),
                50,
                "a",
                ALL8,
                "",
                "",
                0,
            ),
            51,
            "b",
            ALL8,
            "",
            "",
            0,
        )
        .pending([job(1).qos("high").gpus(8), job(2).gpus(1)]),
        p,
    );
    s.view.policy.running[0].completing = true;
    s.view.policy.running[0].preempted_for = Some(JobId(1));
    let out = s.run();
    assert!(
        out.plan.preemptions.is_empty(),
        "{:?}",
        out.plan.preemptions
    );
    assert_eq!(out.reason(1), Some(&PendingReason::Preempting));
}

#[test]
fn an_account_reclaims_its_guarantee_from_borrowers() {
    let mut p = Policy::fifo();
    let mut ml = Account::new("ml");
    ml.guaranteed_gpus = 8;
    p.accounts.insert("ml".into(), ml);
    p.accounts.insert("cv".into(), Account::new("cv"));
    let base = || running(Scenario::new([dgx("a")]), 50, "a", ALL8, "cv", "", 0);
    // cv borrows all 8 GPUs; ml, under its guarantee, takes them back.
    let s = with(base().pending([job(1).account("ml").gpus(8)]), p.clone());
    assert_eq!(preemptions(&s), vec![(1, vec![50])]);
    let why = &s.run().plan.preemptions[0].why[0];
    assert!(why.contains("reclaims"), "{why}");
    // Beyond its guarantee ml only borrows: no reclaim.
    let mut small = p.clone();
    small.accounts.get_mut("ml").unwrap().guaranteed_gpus = 4;
    let s = with(base().pending([job(1).account("ml").gpus(8)]), small);
    assert!(preemptions(&s).is_empty());
    // A job of an account with no guarantee reclaims nothing.
    let s = with(base().pending([job(1).gpus(8)]), p);
    assert!(preemptions(&s).is_empty());
}

/// In the backfill loop, a preemptor behind a blocked job may take only what
/// leaves room for that job's reservation.
#[test]
fn preemption_behind_a_reservation_delays_it_not() {
    let mut p = preempting_policy();
    p.weights.qos = 0; // FIFO: the normal job 1 is ahead of the high job 2.
                       // 50 (normal, preemptible) on a ends at 1 h; 51 (high) on b at 10 h.
    let with_ends = |s: Scenario| {
        let mut s = with(s, p.clone());
        for (id, node, qos, end) in [(50, "a", "", 3_600_000), (51, "b", "high", 36_000_000)] {
            let alloc = held(id, node, ALL8);
            s = s.running_until(alloc.clone(), end);
            s.view.policy.running.push(ActiveJob {
                id: JobId(id),
                user: "bob".into(),
                account: Default::default(),
                qos: qos.into(),
                gpus: 8,
                start_time: 0,
                allocation: alloc.into(),
                completing: false,
                preempted_for: None,
                elastic: None,
            });
        }
        s
    };
    let base = || Scenario::new([dgx("a"), dgx("b")]);
    // Job 1 is reserved node a from 1 h to 3 h; job 2 (2 h) would overlap it.
    let s = with_ends(base().pending([
        job(1).gpus(8).time(7200),
        job(2).qos("high").gpus(8).time(7200),
    ]));
    let out = s.run();
    assert_eq!(out.plan.expected_start(JobId(1)), Some(3_600_000));
    assert!(
        out.plan.preemptions.is_empty(),
        "{:?}",
        out.plan.preemptions
    );
    // Ending (30 min) before the reservation starts, it may preempt 50.
    let s = with_ends(base().pending([
        job(1).gpus(8).time(7200),
        job(2).qos("high").gpus(8).time(1800),
    ]));
    assert_eq!(preemptions(&s), vec![(2, vec![50])]);
    assert!(s
        .run()
        .plan
        .pending
        .contains(&(JobId(2), PendingReason::Preempting)));
}
