//! A long simulated run of backfill: the real planner, simulated time (a pass
//! every simulated minute), no processes. 16 DGX nodes (128 GPUs) take a
//! steady stream of 1-GPU jobs at about 90% load; a 64-GPU gang (8 whole
//! nodes) arrives once the cluster is full, at a higher priority.
//!
//! Asserted from the simulated timeline:
//! - every plan is sound and no job it starts delays a reservation of a job
//!   ahead of it ([`assert_no_delay`]);
//! - the gang's expected start never moves later from one pass to the next
//!   (jobs end at or before their limits, and backfill never takes what a
//!   reservation holds), and it starts no later than the first expected
//!   start it was given: no starvation;
//! - small jobs did backfill while the gang waited (backfill is not strict
//!   priority in disguise).

use super::*;
use crate::sched::RunningJob;

/// splitmix64: small, seeded, the same on every machine.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        (z ^ (z >> 31)) % n
    }
}

const MIN: Millis = 60_000;
const GANG: u64 = 1_000_000;

struct Running {
    alloc: Allocation,
    /// When it really ends.
    end: Millis,
    /// Start plus time limit: what the planner is told.
    limit_end: Millis,
}

#[test]
fn a_big_job_is_not_starved_by_a_stream_of_small_ones() {
    for seed in 1..=3 {
        run(seed);
    }
}

fn run(seed: u64) {
    let mut rng = Rng(seed);
    let mut view = ClusterView {
        nodes: (0..16).map(|i| dgx(&format!("n{i:02}")).build()).collect(),
        ..Default::default()
    };
    let mut running: Vec<Running> = Vec::new();
    // Actual durations of pending jobs (at most their limits).
    let mut durations: std::collections::BTreeMap<JobId, Millis> = Default::default();
    let mut next_id = 1;
    let mut first_expected: Option<Millis> = None;
    let mut last_expected: Option<Millis> = None;
    let mut gang_start: Option<Millis> = None;
    let mut backfilled_while_waiting = 0;
    let (mut busy_gpu_minutes, mut minutes) = (0u64, 0u64);
    for minute in 0..3000u64 {
        let now = minute * MIN;
        // Ends.
        running.retain(|r| {
            if r.end > now {
                return true;
            }
            for na in &r.alloc.nodes {
                let n = view.nodes.iter_mut().find(|n| n.name == na.node).unwrap();
                n.used.release(na);
            }
            false
        });
        // Arrivals: about 1.15 a minute (1-GPU, 30-240 min limits, running
        // 50-100% of it: ~100 min), so about 90% of 128 GPUs; none after
        // minute 2000, so the queue drains.
        if minute < 2000 {
            let arrivals = if rng.below(100) < 15 { 2 } else { 1 };
            for _ in 0..arrivals {
                let limit_min = 30 + rng.below(211);
                let actual = limit_min * MIN * (50 + rng.below(51)) / 100;
                let id = next_id;
                next_id += 1;
                let j = job(id).gpus(1).cpus(4).submit(now).time(limit_min * 60);
                view.pending.push(j.build());
                durations.insert(JobId(id), actual.max(MIN));
            }
        }
        if minute == 300 {
            let j = job(GANG)
                .nodes(8)
                .gpus(8)
                .cpus(16)
                .submit(now)
                .prio(10)
                .time(120 * 60);
            view.pending.push(j.build());
            durations.insert(JobId(GANG), 100 * MIN);
        }
        view.running = running
            .iter()
            .map(|r| RunningJob {
                id: r.alloc.job,
                allocation: r.alloc.clone().into(),
                expected_end: Some(r.limit_end),
            })
            .collect();
        let plan = plan(&view, now);
        assert_sound(&view, &plan, now);
        assert_no_delay(&view, &plan, now);
        if let Some(t) = plan.expected_start(JobId(GANG)) {
            first_expected.get_or_insert(t);
            if let Some(last) = last_expected {
                assert!(
                    t <= last,
                    "seed {seed} minute {minute}: the gang's expected start moved from {last} to {t}"
                );
            }
            last_expected = Some(t);
        }
        let gang_waiting = view.pending.iter().any(|j| j.id == JobId(GANG));
        for alloc in plan.allocations {
            let pj = view
                .pending
                .iter()
                .find(|j| j.id == alloc.job)
                .unwrap()
                .clone();
            check_allocation(&view.nodes, &alloc, &pj).unwrap();
            for na in &alloc.nodes {
                view.nodes
                    .iter_mut()
                    .find(|n| n.name == na.node)
                    .unwrap()
                    .used
                    .charge(na);
            }
            if alloc.job == JobId(GANG) {
                gang_start = Some(now);
            } else if gang_waiting {
                backfilled_while_waiting += 1;
            }
            let actual = durations[&alloc.job];
            let limit = pj.time_limit_secs.unwrap() * 1000;
            running.push(Running {
                alloc,
                end: now + actual,
                limit_end: now + limit,
            });
            view.pending.retain(|j| j.id != pj.id);
        }
        busy_gpu_minutes += view
            .nodes
            .iter()
            .map(|n| n.used.gpus.len() as u64)
            .sum::<u64>();
        minutes += 1;
        if minute > 2000 && view.pending.is_empty() && running.is_empty() {
            break;
        }
    }
    let start = gang_start.unwrap_or_else(|| panic!("seed {seed}: the gang never started"));
    let promised = first_expected.expect("the gang had an expected start");
    assert!(
        start <= promised,
        "seed {seed}: the gang started at minute {}, later than its first expected start {}",
        start / MIN,
        promised / MIN
    );
    assert!(
        backfilled_while_waiting > 0,
        "seed {seed}: nothing backfilled while the gang waited"
    );
    println!(
        "seed {seed}: gang submitted at minute 300, first expected start minute {}, started minute {}; \
         {backfilled_while_waiting} jobs backfilled meanwhile; utilisation {:.0}%",
        promised / MIN,
        start / MIN,
        100.0 * busy_gpu_minutes as f64 / (minutes * 128) as f64
    );
}
