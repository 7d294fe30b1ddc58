//! Chaos at length: the nemesis and workload of tests/chaos.rs (three
//! servers and two agents with four fake GPUs each, in network namespaces;
//! three clients on the real CLI) through a long seeded schedule of leader
//! SIGKILLs and partitions (leader isolated, follower isolated, one-way cut
//! from the leader, in turn), plus a few faults of the other kinds. Each
//! fault heals before the next. Prints faults by kind with their failover
//! times (fault to the first write a new leader acknowledged), the
//! acknowledged submissions, and the checker's counts: lost, duplicated,
//! double-booked GPUs, jobs cancelled while pending that started, ids that
//! went back (all must be 0; the run exits non-zero otherwise, after the
//! table). Writes target/bench/chaos.json. Needs root (namespaces, tmpfs,
//! iptables).
//!
//! Knobs: GPUQ_BENCH_KILLS (leader kills, default 100), GPUQ_BENCH_PARTITIONS
//! (default 50), GPUQ_BENCH_OTHERS (faults of the other five kinds, round
//! robin, default 10), GPUQ_BENCH_SEED (default 1); GPUQ_BENCH_SMOKE=1 runs
//! one of each: a kill, an isolated leader and a paused follower.
//! Run: `cargo bench --bench chaos` (about 20 minutes at the defaults).

#[path = "../tests/common/mod.rs"]
mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::history::{read_task_runs, FinalJob, History};
use common::nemesis::{report, schedule, Chaos, Fault};
use common::workload::Workload;

fn knob(name: &str, full: usize, smoke: usize) -> usize {
    let default = if std::env::var_os("GPUQ_BENCH_SMOKE").is_some() {
        smoke
    } else {
        full
    };
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn main() {
    assert!(
        common::is_root(),
        "the chaos bench needs root (network namespaces, tmpfs, iptables)"
    );
    let kills = knob("GPUQ_BENCH_KILLS", 100, 1);
    let partitions = knob("GPUQ_BENCH_PARTITIONS", 50, 1);
    let others = knob("GPUQ_BENCH_OTHERS", 10, 1);
    let seed = knob("GPUQ_BENCH_SEED", 1, 1) as u64;
    let mut counts = vec![(Fault::KillLeader, kills)];
    for (i, f) in Fault::PARTITIONS.iter().enumerate() {
        let n = partitions / 3 + usize::from(i < partitions % 3);
        counts.push((*f, n));
    }
    let rest: Vec<Fault> = Fault::ALL
        .into_iter()
        .filter(|f| *f != Fault::KillLeader && !Fault::PARTITIONS.contains(f))
        .collect();
    for (i, f) in rest.iter().enumerate() {
        let n = others / rest.len() + usize::from(i < others % rest.len());
        counts.push((*f, n));
    }
    let plan = schedule(seed, &counts);
    eprintln!("chaos bench, seed {seed}: {} faults", plan.len());

    let dir = tempfile::tempdir().unwrap();
    let history = Arc::new(History::new());
    let began = Instant::now();
    let mut chaos = Chaos::start(dir.path(), "gqb", "chaos", 144, seed, history.clone());
    let records = chaos.work.join("tasks");
    let load = Workload::start(
        history.clone(),
        &chaos.sockets(),
        &chaos.work,
        &records,
        seed,
    );
    std::thread::sleep(Duration::from_secs(3));
    for (i, f) in plan.iter().enumerate() {
        let what = chaos.inflict(*f);
        eprintln!("fault {:>3} at {:>6.1?}: {what}", i + 1, began.elapsed());
    }
    load.stop();
    let jobs = chaos.finish();
    let runs = read_task_runs(&records);
    let finals = FinalJob::all(&jobs);
    let bad = history.check_all(&finals, &runs);
    let (table, mut json) = report(&plan, &chaos, &history, &runs, &bad);
    println!(
        "chaos: {} faults in {:.0?} (3 servers, 2 agents x 4 GPUs, netns; election timeout 300-600 ms)",
        plan.len(),
        began.elapsed()
    );
    print!("{table}");
    for n in &chaos.notes {
        println!("note: {n}");
    }
    json["seed"] = seed.into();
    json["seconds"] = began.elapsed().as_secs_f64().into();
    let out = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("target/bench");
    std::fs::create_dir_all(&out).unwrap();
    std::fs::write(
        out.join("chaos.json"),
        serde_json::to_vec_pretty(&json).unwrap(),
    )
    .unwrap();
    for (_, v) in &bad {
        eprintln!("VIOLATION: {v}");
    }
    assert!(bad.is_empty(), "{} violations (see above)", bad.len());
}
