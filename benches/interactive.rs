//! Interactive work's latency, end to end on a real cluster (a server and
//! an agent as processes on loopback, real QUIC, real shims and ptys), as a
//! user at a terminal meets it: each client runs on a pty this bench opens,
//! as a terminal emulator would.
//!
//! - `srun --pty true`: spawn to exit (submit, allocation, the step's task
//!   on a pty on the node, its exit back, the allocation released);
//! - `srun --pty sh -i`: spawn to prompt, and spawn to exit after `exit`;
//! - keystroke echo: one key typed into a running `gpuq run --pty -- cat`,
//!   until its echo (made by the node's pty) is shown here: this terminal
//!   -> CLI -> daemon -> leader -> agent -> shim -> pty and all the way back.
//!
//! Prints p50/p99 to stdout and target/bench/interactive.json.
//!
//! Run: `cargo bench --bench interactive`. Knobs: GPUQ_BENCH_N (sessions
//! per kind, 30), GPUQ_BENCH_KEYS (keystrokes, 300); GPUQ_BENCH_SMOKE=1
//! shrinks it to seconds.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

#[path = "../tests/common/mod.rs"]
mod common;

use common::pty::Terminal;
use common::{clean_command, env_u64, gpuq_bin, pct, Cluster};

const LONG: Duration = Duration::from_secs(60);

fn summary(mut ms: Vec<f64>) -> (f64, f64) {
    ms.sort_by(|a, b| a.total_cmp(b));
    (pct(&ms, 0.5), pct(&ms, 0.99))
}

/// `command` (a link to gpuq, or gpuq itself) on a terminal of its own.
fn on_terminal(program: &Path, socket: &Path, args: &[&str]) -> Terminal {
    let mut cmd = clean_command(program);
    cmd.args(args)
        .env("GPUQ_SOCKET", socket)
        .env("TERM", "xterm")
        .env("PS1", "bench-prompt$ ")
        .current_dir(socket.parent().unwrap());
    Terminal::spawn(cmd, 24, 80)
}

fn main() {
    let smoke = std::env::var_os("GPUQ_BENCH_SMOKE").is_some();
    let n = env_u64("GPUQ_BENCH_N", if smoke { 3 } else { 30 }) as usize;
    let keys = env_u64("GPUQ_BENCH_KEYS", if smoke { 20 } else { 300 }) as usize;
    let dir = tempfile::tempdir().unwrap();
    let c = Cluster::start(dir.path(), 1, 4);
    let socket = c.server.socket.clone();
    let bin = dir.path().join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    let srun: PathBuf = bin.join("srun");
    std::os::unix::fs::symlink(gpuq_bin(), &srun).unwrap();

    let mut true_ms = Vec::new();
    for _ in 0..n {
        let t = Instant::now();
        let mut term = on_terminal(&srun, &socket, &["--pty", "true"]);
        let st = term.wait(LONG);
        assert!(st.success(), "srun --pty true: {st}\n{}", term.screen());
        true_ms.push(t.elapsed().as_secs_f64() * 1e3);
    }

    let (mut prompt_ms, mut shell_ms) = (Vec::new(), Vec::new());
    for _ in 0..n {
        let t = Instant::now();
        let mut term = on_terminal(&srun, &socket, &["--pty", "sh", "-i"]);
        term.expect("bench-prompt$ ", LONG);
        prompt_ms.push(t.elapsed().as_secs_f64() * 1e3);
        term.send("exit\n");
        let st = term.wait(LONG);
        assert!(st.success(), "srun --pty sh: {st}\n{}", term.screen());
        shell_ms.push(t.elapsed().as_secs_f64() * 1e3);
    }

    // One session; each key waits for its echo before the next is typed.
    let gpuq = gpuq_bin();
    let mut term = on_terminal(&gpuq, &socket, &["run", "--pty", "--", "cat"]);
    term.send("ready\n");
    term.expect("ready\r\nready\r\n", LONG);
    let mut echo_us = Vec::with_capacity(keys);
    for i in 0..keys {
        let before = term.shown_len();
        let t = Instant::now();
        term.send(if i % 60 == 59 { "\n" } else { "x" });
        while term.shown_len() == before {
            assert!(t.elapsed() < LONG, "no echo of key {i}");
            std::thread::sleep(Duration::from_micros(50));
        }
        echo_us.push(t.elapsed().as_secs_f64() * 1e6);
    }
    term.send("\n\x04");
    let st = term.wait(LONG);
    assert!(st.success(), "gpuq run --pty cat: {st}\n{}", term.screen());

    let (true_p50, true_p99) = summary(true_ms);
    let (prompt_p50, prompt_p99) = summary(prompt_ms);
    let (shell_p50, shell_p99) = summary(shell_ms);
    let (echo_p50, echo_p99) = summary(echo_us);
    println!("interactive work on a 1-server, 1-agent cluster ({n} sessions, {keys} keys):");
    println!("{:<44} {:>10} {:>10}", "", "p50", "p99");
    println!(
        "{:<44} {:>7.1} ms {:>7.1} ms",
        "srun --pty true (spawn -> exit)", true_p50, true_p99
    );
    println!(
        "{:<44} {:>7.1} ms {:>7.1} ms",
        "srun --pty sh -i (spawn -> prompt)", prompt_p50, prompt_p99
    );
    println!(
        "{:<44} {:>7.1} ms {:>7.1} ms",
        "srun --pty sh -i (spawn -> prompt -> exit)", shell_p50, shell_p99
    );
    println!(
        "{:<44} {:>7.0} us {:>7.0} us",
        "keystroke echo through the pty path", echo_p50, echo_p99
    );
    let out = serde_json::json!({
        "sessions": n,
        "keys": keys,
        "srun_pty_true_ms": {"p50": true_p50, "p99": true_p99},
        "srun_pty_prompt_ms": {"p50": prompt_p50, "p99": prompt_p99},
        "srun_pty_shell_round_trip_ms": {"p50": shell_p50, "p99": shell_p99},
        "keystroke_echo_us": {"p50": echo_p50, "p99": echo_p99},
    });
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/bench/interactive.json");
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(&path, serde_json::to_string_pretty(&out).unwrap()).unwrap();
}
