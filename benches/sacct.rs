//! `sacct` over a large history, end to end: one real server (Raft, redb)
//! holding GPUQ_BENCH_SACCT_JOBS (100,000) finished jobs in its history
//! archive, half of them different jobs submitted with `--from` (10,000 a
//! call), half the tasks of 10,000-task arrays; all cancelled before they
//! ran, then archived. Each query runs through the real binary as a user
//! would (`gpuq slurm sacct ...`, a fresh process each time) and is timed
//! from spawn to exit: every job (`-a -X -P`, fetched 5,000 records a
//! request), one job (`-j ID`), one array (`-j ARRAY`), and `gpuq acct
//! --summary`. Prints p50/p99 per query with its row count (checked
//! against what was submitted) to stdout and target/bench/sacct.json.
//!
//! Run: `cargo bench --bench sacct`. Knobs: GPUQ_BENCH_SACCT_JOBS,
//! GPUQ_BENCH_N (repetitions, 10); GPUQ_BENCH_SMOKE=1 shrinks it to
//! seconds.

use std::path::Path;
use std::time::{Duration, Instant};

#[path = "../tests/common/mod.rs"]
mod common;

use common::{env_u64, pct, run_clean, Server};

/// Times `args` `reps` times: (p50 ms, p99 ms, lines of its output).
fn time(socket: &Path, args: &[&str], reps: usize) -> (f64, f64, usize) {
    let mut ms = Vec::with_capacity(reps);
    let mut lines = 0;
    for _ in 0..reps {
        let t = Instant::now();
        let out = run_clean(socket, args);
        ms.push(t.elapsed().as_secs_f64() * 1e3);
        lines = out.stdout.iter().filter(|&&b| b == b'\n').count();
    }
    ms.sort_by(|a, b| a.total_cmp(b));
    (pct(&ms, 0.5), pct(&ms, 0.99), lines)
}

fn main() {
    let smoke = std::env::var_os("GPUQ_BENCH_SMOKE").is_some();
    let jobs = env_u64("GPUQ_BENCH_SACCT_JOBS", if smoke { 2_000 } else { 100_000 });
    let reps = env_u64("GPUQ_BENCH_N", if smoke { 2 } else { 10 }) as usize;
    let batch = jobs.min(10_000) / 2 * 2;
    let dir = tempfile::tempdir().unwrap();
    let server = Server::bootstrap_with_config(dir.path(), 10, "history_retention_secs = 1");
    let socket = server.socket.clone();

    // The history: alternate calls of `--from` sweeps and arrays.
    let t0 = Instant::now();
    let sweep = dir.path().join("sweep.txt");
    let lines: String = (0..batch)
        .map(|i| format!("-J lr{i} -G 1 --time 1:00:00 -- python train.py --lr {i}\n"))
        .collect();
    std::fs::write(&sweep, lines).unwrap();
    let mut arrays = Vec::new();
    let mut sweeps = 0;
    let mut made = 0;
    while made < jobs {
        let n = batch.min(jobs - made);
        if arrays.len() <= sweeps {
            let range = format!("0-{}", n - 1);
            let out = run_clean(
                &socket,
                &[
                    "submit",
                    "--parsable",
                    "--hold",
                    "--array",
                    &range,
                    "-G",
                    "1",
                    "--wrap",
                    "true",
                ],
            );
            let id = String::from_utf8_lossy(&out.stdout).trim().to_string();
            run_clean(&socket, &["cancel", &id]);
            arrays.push(id);
        } else {
            let out = run_clean(
                &socket,
                &[
                    "submit",
                    "--parsable",
                    "--hold",
                    "--export",
                    "NONE",
                    "--from",
                    sweep.to_str().unwrap(),
                ],
            );
            let ids: Vec<String> = String::from_utf8_lossy(&out.stdout)
                .lines()
                .map(str::to_string)
                .collect();
            let mut args = vec!["cancel"];
            args.extend(ids.iter().map(String::as_str));
            run_clean(&socket, &args);
            sweeps += 1;
        }
        made += n;
    }
    // Archived: nothing finished is left in memory.
    let deadline = Instant::now() + Duration::from_secs(600);
    loop {
        let out = run_clean(&socket, &["queue", "--all", "--json"]);
        let left: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        if left.as_array().is_some_and(|a| a.is_empty()) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the history was not archived in time"
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    let build_s = t0.elapsed().as_secs_f64();

    let one_array = arrays[arrays.len() / 2].clone();
    let one_job = (jobs / 2 + 1).to_string();
    let queries: Vec<(&str, Vec<&str>, usize)> = vec![
        (
            "sacct -a -X -P (every job)",
            vec![
                "slurm",
                "sacct",
                "-a",
                "-X",
                "-n",
                "-P",
                "-S",
                "2020-01-01",
                "-o",
                "JobID,JobName,State,ExitCode,Elapsed",
            ],
            jobs as usize,
        ),
        (
            "sacct -j ID (one job)",
            vec!["slurm", "sacct", "-n", "-P", "-j", &one_job],
            1,
        ),
        (
            "sacct -j ARRAY (one array)",
            vec![
                "slurm",
                "sacct",
                "-n",
                "-P",
                "-j",
                &one_array,
                "-o",
                "JobID,State",
            ],
            batch as usize,
        ),
        ("gpuq acct --summary", vec!["acct", "--summary"], 0),
    ];
    let mut rows = Vec::new();
    println!("sacct over {jobs} archived jobs (built in {build_s:.1} s), {reps} runs each:");
    println!(
        "{:<30} {:>10} {:>10} {:>8}",
        "query", "p50 ms", "p99 ms", "rows"
    );
    for (name, args, want) in &queries {
        let (p50, p99, lines) = time(&socket, args, reps);
        if *want > 0 {
            assert_eq!(lines, *want, "{name}: rows");
        }
        println!("{name:<30} {p50:>10.1} {p99:>10.1} {lines:>8}");
        rows.push(serde_json::json!({
            "query": name, "p50_ms": p50, "p99_ms": p99, "rows": lines,
        }));
    }
    let out = serde_json::json!({ "jobs": jobs, "build_s": build_s, "queries": rows });
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/bench/sacct.json");
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(&path, serde_json::to_string_pretty(&out).unwrap()).unwrap();
}
