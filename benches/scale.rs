//! Control-plane cost at fleet scale, in-process: the leader's replicated
//! state for 1,000 / 5,000 / 10,000 simulated 8-GPU nodes with 100,000 and
//! 1,000,000 jobs (100,000 pending, the rest finished and archived in the
//! redb history tables), built through `State::apply` and the store exactly
//! as a server builds it. The nodes are busy: all but one in 100 run an
//! 8-GPU job, so a pass decides for every pending job and places a few.
//!
//! Prints per configuration: the scheduling pass (`sched_input`, `plan_ref`
//! and the pending reasons kept from it: what the leader's loop does per pass
//! before it proposes) p50/p99, CPU ms per pass, the
//! time to apply the `Schedule` of one such pass (what every server does with
//! the plan: re-check and start its allocations), the
//! process's peak RSS (VmHWM: state + redb cache; each configuration runs in
//! its own child process so the peaks do not mix), and an `acct` query over
//! the archive. Asserts nothing. Results go to target/bench/scale.json.
//!
//! The "cpu%" column is the server CPU the pass costs at the leader's
//! periodic rate of one pass a second (CPU ms per pass / 10); event-driven
//! passes come on top, one per burst of state changes.
//!
//! Then agent heartbeat load (benches/scale/heartbeat.rs): a real server and
//! GPUQ_BENCH_SCALE_AGENTS (1000,2000,5000) simulated agents over QUIC,
//! connected and idle for GPUQ_BENCH_SCALE_AGENT_WINDOW_S (10) seconds:
//! server and fleet CPU, RSS, datagrams/s and the cost per agent.
//!
//! Run: `cargo bench --bench scale`. Knobs: GPUQ_BENCH_SCALE_NODES
//! (1000,5000,10000), GPUQ_BENCH_SCALE_JOBS (100000,1000000),
//! GPUQ_BENCH_SCALE_PENDING (100000), GPUQ_BENCH_N (passes, 20);
//! GPUQ_BENCH_SMOKE=1 shrinks it to seconds.

use std::path::Path;
use std::process::Command as Process;
use std::time::Instant;

#[path = "../tests/common/mod.rs"]
mod common;
#[path = "scale/heartbeat.rs"]
mod heartbeat;

use gpuq::model::acct::AcctFilter;
use gpuq::model::policy_change::{AccountPatch, Op, PolicyChange};
use gpuq::model::{Allocation, JobId, JobSpec, NodeAllocation, Program};
use gpuq::state::{history, store, Command, Dirty, State};

fn env_list(key: &str, default: &[u64]) -> Vec<u64> {
    match std::env::var(key) {
        Ok(v) => v.split(',').filter_map(|x| x.trim().parse().ok()).collect(),
        Err(_) => default.to_vec(),
    }
}

fn spec(gpus: u32, user: u64) -> JobSpec {
    JobSpec {
        gpus_per_node: gpus,
        cpus_per_task: 4,
        mem_per_node_mb: Some(16 * 1024),
        time_limit_secs: Some(3600),
        account: Some(format!("acct{}", user % 10)),
        program: Program::Command {
            argv: vec!["python".into(), "train.py".into()],
        },
        ..common::trivial_spec("train")
    }
}

/// Applies `cmds` as the state machine does one batch: apply, then write the
/// touched records in one redb transaction.
fn apply_batch(db: &redb::Database, s: &mut State, cmds: Vec<Command>) {
    let mut dirty = Dirty::default();
    for c in &cmds {
        s.apply(c, &mut dirty);
    }
    let mut txn = db.begin_write().unwrap();
    txn.set_durability(redb::Durability::None);
    store::write_dirty(&txn, s, &dirty).unwrap();
    txn.commit().unwrap();
    s.archiving.clear();
}

fn submit(user: u64, gpus: u32, now: u64) -> Command {
    Command::Submit {
        user: format!("user{user}"),
        spec: Box::new(spec(gpus, user)),
        now,
    }
}

fn proc_status(key: &str) -> u64 {
    let text = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    text.lines()
        .find(|l| l.starts_with(key))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// utime + stime of this process in clock ticks (100 per second on Linux).
fn cpu_ticks() -> u64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let after = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
    let f: Vec<u64> = after
        .split_whitespace()
        .map(|x| x.parse().unwrap_or(0))
        .collect();
    f.get(11).copied().unwrap_or(0) + f.get(12).copied().unwrap_or(0)
}

fn pct(sorted: &[f64], p: f64) -> f64 {
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

/// One configuration, in this (child) process; prints one JSON line.
fn one(nodes: u64, jobs: u64, pending: u64, passes: usize) {
    // The allocator settings a server makes as it starts.
    gpuq::server::keep_freed_memory();
    let dir = tempfile::tempdir().unwrap();
    let db = redb::Database::create(dir.path().join("state.redb")).unwrap();
    let txn = db.begin_write().unwrap();
    store::create_tables(&txn).unwrap();
    txn.commit().unwrap();
    let mut s = State::default();
    let t0 = Instant::now();
    let names: Vec<String> = (0..nodes).map(|i| format!("node{i:05}")).collect();
    let regs = names
        .iter()
        .enumerate()
        .map(|(i, n)| Command::RegisterNode {
            inventory: gpuq::sim::fleet::sim_inventory(
                n,
                8,
                &format!("spine{}/leaf{}", i / 400, i / 20),
            )
            .unwrap(),
            addr: format!("10.0.{}.{}:7421", i / 250, i % 250),
            preflight: false,
            now: 1,
            cert_sha256: String::new(),
        })
        .collect();
    apply_batch(&db, &mut s, regs);
    // The accounts jobs are charged to (user N in accountN % 10); submit
    // refuses an account that does not exist or does not list the user.
    let accounts = (0..10u64)
        .map(|a| Command::Policy {
            change: PolicyChange::Account {
                op: Op::Add,
                name: format!("acct{a}"),
                patch: AccountPatch {
                    add_users: (0..1000u64)
                        .filter(|u| u % 10 == a)
                        .map(|u| format!("user{u}"))
                        .collect(),
                    ..Default::default()
                },
            },
            by: "root".into(),
            now: 1,
        })
        .collect();
    apply_batch(&db, &mut s, accounts);

    // Busy nodes: one 8-GPU job on all but one node in 100.
    let busy: Vec<&String> = names
        .iter()
        .enumerate()
        .filter(|(i, _)| i % 100 != 99)
        .map(|(_, n)| n)
        .collect();
    for chunk in busy.chunks(1000) {
        let first = s.counters.next_job_id;
        let mut cmds: Vec<Command> = (0..chunk.len() as u64).map(|u| submit(u, 8, 2)).collect();
        cmds.push(Command::Schedule {
            allocations: chunk
                .iter()
                .enumerate()
                .map(|(k, n)| Allocation {
                    job: JobId(first + k as u64),
                    nodes: vec![NodeAllocation {
                        node: (*n).clone(),
                        gpus: (0..8).collect(),
                        cpus: vec![],
                        cpu_count: 4,
                        memory_mb: 16 * 1024,
                    }],
                })
                .collect(),
            now: 3,
        });
        apply_batch(&db, &mut s, cmds);
    }

    // History: finished jobs, archived in slices as the leader would.
    let history_jobs = jobs.saturating_sub(pending);
    let mut left = history_jobs;
    while left > 0 {
        let n = left.min(10_000);
        let first = s.counters.next_job_id;
        let mut cmds: Vec<Command> = (0..n).map(|u| submit(u % 500, 1, 4)).collect();
        cmds.push(Command::Cancel {
            by: "root".into(),
            admin: true,
            ids: (first..first + n).map(JobId).collect(),
            now: 5,
        });
        cmds.push(Command::Archive { before: 5 });
        apply_batch(&db, &mut s, cmds);
        left -= n;
    }

    // The queue: 90% 1-GPU jobs, 10% whole-node jobs.
    let mut left = pending;
    while left > 0 {
        let n = left.min(10_000);
        let cmds = (0..n)
            .map(|u| submit(u % 500, if u % 10 == 0 { 8 } else { 1 }, 6))
            .collect();
        apply_batch(&db, &mut s, cmds);
        left -= n;
    }
    let build_s = t0.elapsed().as_secs_f64();

    // Scheduling passes over the same state.
    let mut times = Vec::with_capacity(passes);
    let mut placed = 0;
    let ticks0 = cpu_ticks();
    for _ in 0..passes {
        let t = Instant::now();
        let input = s.sched_input();
        let mut plan = gpuq::sched::plan_ref(&input.view(), 7, gpuq::sched::Packing::BestFit);
        let reasons = gpuq::sched::PendingReasons::take(&mut plan);
        times.push(t.elapsed().as_secs_f64() * 1e3);
        drop(reasons);
        placed = plan.allocations.len();
    }
    let cpu_ms_per_pass = (cpu_ticks() - ticks0) as f64 * 10.0 / passes as f64;
    times.sort_by(|a, b| a.total_cmp(b));

    // What every server then does with such a plan: apply its `Schedule`
    // (re-check each allocation against current usage, start the jobs).
    let input = s.sched_input();
    let plan = gpuq::sched::plan_ref(&input.view(), 7, gpuq::sched::Packing::BestFit);
    drop(input);
    let t = Instant::now();
    let applied = s.apply(
        &Command::Schedule {
            allocations: plan.allocations,
            now: 8,
        },
        &mut Dirty::default(),
    );
    let apply_ms = t.elapsed().as_secs_f64() * 1e3;
    let started = match applied {
        gpuq::state::CommandResult::Scheduled { started, .. } => started.len(),
        _ => 0,
    };

    // acct over the archive: one user's jobs.
    let t = Instant::now();
    let txn = db.begin_read().unwrap();
    let archived = history::len(&txn).unwrap();
    let found = history::query(
        &txn,
        &AcctFilter {
            user: Some("user7".into()),
            ..Default::default()
        },
    )
    .unwrap()
    .len();
    let acct_ms = t.elapsed().as_secs_f64() * 1e3;
    drop(txn);

    let row = serde_json::json!({
        "nodes": nodes,
        "jobs": jobs,
        "pending": s.index.pending.len(),
        "in_memory_jobs": s.jobs.len(),
        "archived": archived,
        "build_s": build_s,
        "pass_p50_ms": pct(&times, 0.5),
        "pass_p99_ms": pct(&times, 0.99),
        "pass_cpu_ms": cpu_ms_per_pass,
        "placed_per_pass": placed,
        "apply_schedule_ms": apply_ms,
        "apply_schedule_started": started,
        "vm_hwm_mib": proc_status("VmHWM:") as f64 / 1024.0,
        "vm_rss_mib": proc_status("VmRSS:") as f64 / 1024.0,
        "acct_user_ms": acct_ms,
        "acct_user_rows": found,
    });
    println!("{row}");
}

fn main() {
    if let Ok(one_cfg) = std::env::var("GPUQ_SCALE_ONE") {
        let v: Vec<u64> = one_cfg.split(',').map(|x| x.parse().unwrap()).collect();
        one(v[0], v[1], v[2], v[3] as usize);
        return;
    }
    let smoke = std::env::var_os("GPUQ_BENCH_SMOKE").is_some();
    let (nodes, jobs, pending, passes) = if smoke {
        (vec![200], vec![3_000], 1_000, 3)
    } else {
        (
            env_list("GPUQ_BENCH_SCALE_NODES", &[1000, 5000, 10000]),
            env_list("GPUQ_BENCH_SCALE_JOBS", &[100_000, 1_000_000]),
            env_list("GPUQ_BENCH_SCALE_PENDING", &[100_000])[0],
            env_list("GPUQ_BENCH_N", &[20])[0],
        )
    };
    let me = std::env::current_exe().unwrap();
    println!(
        "{:>6} {:>8} {:>8} {:>9} {:>9} {:>9} {:>8} {:>7} {:>9} {:>8} {:>8} {:>6} {:>9}",
        "nodes",
        "jobs",
        "pending",
        "in_mem",
        "archived",
        "p50_ms",
        "p99_ms",
        "cpu_ms",
        "hwm_MiB",
        "acct_ms",
        "build_s",
        "cpu%",
        "apply_ms"
    );
    let mut rows = Vec::new();
    for &n in &nodes {
        for &j in &jobs {
            let p = pending.min(j);
            let out = Process::new(&me)
                .env("GPUQ_SCALE_ONE", format!("{n},{j},{p},{passes}"))
                .output()
                .expect("run one configuration");
            let text = String::from_utf8_lossy(&out.stdout);
            let Some(row) = text
                .lines()
                .rev()
                .find_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            else {
                println!(
                    "{n:>6} {j:>8}  failed: {}",
                    String::from_utf8_lossy(&out.stderr)
                );
                continue;
            };
            let f = |k: &str| row[k].as_f64().unwrap_or(f64::NAN);
            println!(
                "{:>6} {:>8} {:>8} {:>9} {:>9} {:>9.1} {:>8.1} {:>7.1} {:>9.0} {:>8.1} {:>8.1} {:>6.1} {:>9.1}",
                n,
                j,
                row["pending"],
                row["in_memory_jobs"],
                row["archived"],
                f("pass_p50_ms"),
                f("pass_p99_ms"),
                f("pass_cpu_ms"),
                f("vm_hwm_mib"),
                f("acct_user_ms"),
                f("build_s"),
                f("pass_cpu_ms") / 10.0,
                f("apply_schedule_ms"),
            );
            rows.push(row);
        }
    }
    let (agents, window) = if smoke {
        (vec![20], 1)
    } else {
        (
            env_list("GPUQ_BENCH_SCALE_AGENTS", &[1000, 2000, 5000]),
            env_list("GPUQ_BENCH_SCALE_AGENT_WINDOW_S", &[10])[0],
        )
    };
    rows.extend(heartbeat::run(
        &agents,
        std::time::Duration::from_secs(window),
    ));
    let out = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/bench");
    std::fs::create_dir_all(&out).unwrap();
    let path = out.join("scale.json");
    std::fs::write(&path, serde_json::to_string_pretty(&rows).unwrap()).unwrap();
    println!("wrote {}", path.display());
}
