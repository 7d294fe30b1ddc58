//! Fuzzing at volume: the targets of `tests/fuzzing/` (the local socket's
//! frames, the agent and Raft protocols, apply and the scheduler behind
//! them, snapshots, job specs and directives, config files, hostlists) with
//! 10 million inputs in all, split by weight, on every core. Prints per
//! target the inputs, the crashes (must be 0) and inputs/s, and writes
//! `target/bench/fuzz.json`. Knobs: `GPUQ_BENCH_FUZZ_CASES` (total inputs),
//! `GPUQ_FUZZ_SEED`, `GPUQ_BENCH_SMOKE=1` (2,000 inputs). Run:
//! `cargo bench --bench fuzz`.

#[path = "../tests/fuzzing/mod.rs"]
mod fuzzing;

use std::time::Instant;

#[global_allocator]
static ALLOC: fuzzing::alloc::Counting = fuzzing::alloc::Counting;

fn main() {
    let smoke = std::env::var_os("GPUQ_BENCH_SMOKE").is_some();
    let total = fuzzing::env_u64(
        "GPUQ_BENCH_FUZZ_CASES",
        if smoke { 2_000 } else { 10_000_000 },
    );
    let seed = fuzzing::env_u64("GPUQ_FUZZ_SEED", fuzzing::DEFAULT_SEED);
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get()) as u64;
    let targets = fuzzing::targets();
    let shares = fuzzing::shares(&targets, total);
    println!("fuzz: {total} inputs, seed {seed}, {threads} threads");
    println!(
        "{:<16} {:>10} {:>8} {:>10} {:>10}",
        "target", "inputs", "crashes", "inputs/s", "slowest ms"
    );
    let started = Instant::now();
    let mut rows = Vec::new();
    let mut crashes_total = 0;
    for (target, count) in targets.iter().zip(shares) {
        // Each thread takes a contiguous range of case numbers, so a crash's
        // case number reproduces it alone.
        let t0 = Instant::now();
        let per = count.div_ceil(threads);
        let reports: Vec<fuzzing::Report> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..threads)
                .map(|i| {
                    let from = i * per;
                    let n = per.min(count.saturating_sub(from));
                    s.spawn(move || fuzzing::run(target, seed, from, n))
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().expect("a fuzz thread"))
                .collect()
        });
        let elapsed = t0.elapsed().as_secs_f64();
        let crashes: Vec<&fuzzing::Crash> = reports.iter().flat_map(|r| &r.crashes).collect();
        let slowest = reports.iter().map(|r| r.slowest).max().unwrap_or_default();
        let rate = count as f64 / elapsed.max(1e-9);
        println!(
            "{:<16} {:>10} {:>8} {:>10.0} {:>10.1}",
            target.name,
            count,
            crashes.len(),
            rate,
            slowest.as_secs_f64() * 1e3
        );
        for c in crashes.iter().take(3) {
            println!(
                "  crash: case {} {}: {}",
                c.case,
                c.saved
                    .as_ref()
                    .map_or("(not saved)".into(), |p| p.display().to_string()),
                c.why
            );
        }
        crashes_total += crashes.len();
        rows.push(serde_json::json!({
            "target": target.name,
            "inputs": count,
            "crashes": crashes.len(),
            "inputs_per_s": rate,
            "slowest_ms": slowest.as_secs_f64() * 1e3,
            "crash_cases": crashes.iter().map(|c| c.case).collect::<Vec<_>>(),
        }));
    }
    println!(
        "{:<16} {:>10} {:>8} {:>10.0}   ({:.0} s)",
        "all",
        total,
        crashes_total,
        total as f64 / started.elapsed().as_secs_f64(),
        started.elapsed().as_secs_f64()
    );
    let out = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("target/bench");
    std::fs::create_dir_all(&out).unwrap();
    std::fs::write(
        out.join("fuzz.json"),
        serde_json::to_string_pretty(&serde_json::json!({
            "seed": seed,
            "threads": threads,
            "inputs": total,
            "crashes": crashes_total,
            "targets": rows,
        }))
        .unwrap(),
    )
    .unwrap();
}
