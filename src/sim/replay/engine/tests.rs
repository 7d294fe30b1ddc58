//! The engine against schedules worked out by hand, and its promises:
//! the same trace gives the same run, skipped ticks change nothing.

use super::*;

fn job(id: &str, arrival_s: u64, gpus: u32, duration_s: u64) -> TraceJob {
    TraceJob {
        id: id.into(),
        arrival: arrival_s * 1000,
        gpus,
        duration: duration_s * 1000,
        user: String::new(),
        limit: None,
        line: 0,
    }
}

fn two_nodes() -> Shape {
    Shape {
        nodes: 2,
        gpus_per_node: 8,
        topology_leaves: None,
        autoscale: None,
    }
}

fn run(trace: &[TraceJob], shape: &Shape, policy: &str) -> Run {
    let p = ReplayPolicy::built_in(policy).unwrap();
    replay(trace, shape, &p, &mut |_| {}).unwrap()
}

/// (id, start s, end s) of every job.
fn schedule(r: &Run) -> Vec<(String, Option<u64>, Option<u64>)> {
    r.jobs
        .iter()
        .map(|o| {
            (
                o.id.clone(),
                o.start.map(|t| t / 1000),
                o.end.map(|t| t / 1000),
            )
        })
        .collect()
}

fn at(id: &str, start: u64, end: u64) -> (String, Option<u64>, Option<u64>) {
    (id.into(), Some(start), Some(end))
}

/// 2 nodes x 8 GPUs, submit order, exact limits:
/// - A (8 GPUs, 0-100) starts at once on one node.
/// - B (16 GPUs) needs both nodes: it waits, with a reservation at 100.
/// - C (4 GPUs, 80 s) arrives at 10 and ends by 90, before B's
///   reservation: backfilled at 10.
/// - D (4 GPUs, 200 s) would run past 100: it waits, and starts when B
///   ends at 150.
/// - E (1 GPU, 60 s) arrives at 30, after D, but ends by 90: backfilled.
///
/// Under the multifactor default the job-size factor puts B (16 GPUs) first
/// among the jobs of time 0: B runs 0-50, then A, C and D fill the 16 GPUs
/// at 50 (C to 130, D to 250), and E takes C's place at 130.
#[test]
fn backfill_fills_the_gap_before_a_gang_and_nothing_delays_it() {
    let trace = vec![
        job("A", 0, 8, 100),
        job("B", 0, 16, 50),
        job("C", 10, 4, 80),
        job("D", 20, 4, 200),
        job("E", 30, 1, 60),
    ];
    let by_hand = [
        (
            "fifo",
            vec![
                at("A", 0, 100),
                at("B", 100, 150),
                at("C", 10, 90),
                at("D", 150, 350),
                at("E", 30, 90),
            ],
            350,
        ),
        (
            "multifactor",
            vec![
                at("A", 50, 150),
                at("B", 0, 50),
                at("C", 50, 130),
                at("D", 50, 250),
                at("E", 130, 190),
            ],
            250,
        ),
    ];
    for (policy, expected, last_end) in by_hand {
        let r = run(&trace, &two_nodes(), policy);
        assert_eq!(schedule(&r), expected, "{policy}");
        assert!(r.skipped.is_empty());
        let last = r.samples.last().unwrap();
        assert_eq!(
            (last.t, last.busy_gpus, last.pending),
            (last_end * 1000, 0, 0)
        );
        let peak = r.samples.iter().map(|s| s.busy_gpus).max();
        assert_eq!(peak, Some(16), "{policy}");
    }
}

/// A 12-GPU job holds two whole 8-GPU nodes; a job larger than the cluster
/// is skipped and listed; a job whose trace limit is shorter than its run
/// ends at the limit.
#[test]
fn shapes_skips_and_limits() {
    let mut short = job("T", 0, 1, 100);
    short.limit = Some(40_000);
    let trace = vec![
        job("W", 0, 12, 10),
        job("X", 0, 24, 10),
        short,
        job("Y", 1, 1, 5),
    ];
    let r = run(&trace, &two_nodes(), "fifo");
    assert_eq!(r.skipped, vec!["X".to_string()]);
    // W takes both nodes whole, so T and Y wait for it.
    assert_eq!(
        schedule(&r),
        vec![at("W", 0, 10), at("T", 10, 50), at("Y", 10, 15)]
    );
    assert_eq!(r.samples.iter().map(|s| s.busy_gpus).max(), Some(16));
}

fn itp_like(n: u64) -> Vec<TraceJob> {
    // A deterministic mix: mostly 1 GPU, some 8, a few gangs, over-asked
    // limits on some, four users.
    (0..n)
        .map(|i| {
            let gpus = match i % 17 {
                0 => 16,
                1 | 2 => 8,
                3 => 4,
                _ => 1,
            };
            let mut j = job(
                &format!("j{i}"),
                i * 7 + (i * i) % 13,
                gpus,
                20 + (i * 37) % 400,
            );
            j.user = format!("u{}", i % 4);
            if i % 3 == 0 {
                j.limit = Some(j.duration * 2);
            }
            j
        })
        .collect()
}

#[test]
fn the_same_trace_twice_gives_the_same_run() {
    let trace = itp_like(300);
    let a = run(&trace, &two_nodes(), "multifactor");
    let b = run(&trace, &two_nodes(), "multifactor");
    assert_eq!(a, b);
    assert!(a.jobs.iter().all(|o| o.end.is_some()), "every job ends");
}

/// The ticks the engine skips could not have started anything: replaying
/// with every tick run gives the same schedule.
#[test]
fn skipped_ticks_change_nothing() {
    let trace = itp_like(120);
    for name in ["fifo", "multifactor"] {
        let p = ReplayPolicy {
            tick_ms: 20_000,
            ..ReplayPolicy::built_in(name).unwrap()
        };
        let skipping = replay(&trace, &two_nodes(), &p, &mut |_| {}).unwrap();
        let mut engine = Engine::new(&two_nodes(), &p).unwrap();
        engine.skip_ticks = false;
        let jobs: Vec<&TraceJob> = trace.iter().collect();
        engine.run(&jobs, &mut |_| {}).unwrap();
        assert_eq!(skipping.jobs, engine.outcomes, "{name}");
        assert!(
            engine.passes > skipping.passes,
            "{name}: some ticks were skipped"
        );
    }
}

#[test]
fn an_empty_cluster_is_refused() {
    let shape = Shape {
        nodes: 0,
        ..two_nodes()
    };
    let p = ReplayPolicy::built_in("fifo").unwrap();
    let e = replay(&[job("A", 0, 1, 1)], &shape, &p, &mut |_| {}).unwrap_err();
    assert!(e.to_string().contains("--nodes"), "{e}");
}

/// The trace says nothing of CPUs: a whole 16-GPU node's job is not held
/// back by them (at 16 CPUs per GPU it needed more than the node has).
#[test]
fn cpus_never_bind_before_gpus() {
    let shape = Shape {
        nodes: 1,
        gpus_per_node: 16,
        topology_leaves: None,
        autoscale: None,
    };
    let r = run(&[job("A", 0, 16, 10), job("B", 0, 16, 10)], &shape, "fifo");
    assert_eq!(schedule(&r), vec![at("A", 0, 10), at("B", 10, 20)]);
}

#[test]
fn an_autoscaled_fleet_boots_for_waiting_jobs_and_stops_when_idle() {
    let shape = Shape {
        nodes: 4,
        gpus_per_node: 8,
        topology_leaves: None,
        autoscale: Some(Autoscale {
            min: 0,
            boot_ms: 60_000,
            idle_secs: 600,
            demand_secs: 0,
        }),
    };
    // Four whole-node jobs at once; one small one after they end.
    let mut trace: Vec<TraceJob> = (0..4).map(|i| job(&format!("j{i}"), 0, 8, 3600)).collect();
    trace.push(job("late", 10_000, 1, 60));
    let r = run(&trace, &shape, "fifo");
    // They wait for the boot only.
    for o in &r.jobs[..4] {
        assert_eq!(o.start, Some(60_000), "{o:?}");
    }
    // The late one finds the fleet stopped and boots one node.
    let late = &r.jobs[4];
    assert_eq!(late.start, Some(10_060_000), "{late:?}");
    // Powered: 4 nodes from 0 to the end of the jobs plus the idle time
    // (stopped at the first look past it, at most a minute late), then one
    // node for the late job's boot, run and idle time.
    let gpu_s = r.provisioned_gpu_ms.unwrap() / 1000;
    let four = 32 * (3660 + 600);
    let one = 8 * (60 + 60 + 600);
    assert!(
        (four + one..=four + one + 32 * 60 + 8 * 60).contains(&gpu_s),
        "{gpu_s}"
    );
    // A fixed fleet has all of it powered for the whole span.
    let fixed = Shape {
        autoscale: None,
        ..shape
    };
    assert_eq!(run(&trace, &fixed, "fifo").provisioned_gpu_ms, None);
}
