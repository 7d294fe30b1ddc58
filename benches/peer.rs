//! gpuq side by side with a real Slurm on the same 8-node shape (issue 8,
//! item 3g). `bench/peer.sh` runs the Slurm half first (the peer's own
//! bench.sh, see ../shared/peers/slurm/README.md) and stops it, then this
//! bench: one `gpuq server` and 8 `gpuq agent`s, each in its own network
//! namespace on a bridge (10.88.150.0/24, names `gqp...`), 8 fake GPUs and as
//! many CPUs per node as the machine has (Slurm's nodes report the same), and
//! the same figures measured the way bench.sh measures them, through the real
//! CLI: one `gpuq submit` process per job, as sbatch is one per job.
//!
//! - seq / par: N `true` jobs from 1 and from 4 concurrent submitters while
//!   the agents run them: submit rate, and first submit -> queue empty
//!   (jobs/s, and CPU-ms per job: server, agents, and machine-wide from
//!   /proc/stat, as bench.sh reads it);
//! - held: N `submit --hold` (nothing runs: pure submit), then one `release`
//!   of them all -> queue empty;
//! - array: one `submit --array 0-(N-1)` -> queue empty;
//! - lat: idle cluster, submit -> the job's first instruction (it writes
//!   `$EPOCHREALTIME`, like bench.sh's stamp.sh), after a random 0-1 s pause;
//! - multi: one 8-node x 8-GPU job, submit -> last rank started;
//! - floor: N sequential starts of `/bin/true` and of `gpuq --version`,
//!   spawned as the submits are: the most one-process-per-job submitting can
//!   reach on this machine, before any work (processes/s).
//!
//! It prints one table, gpuq against the best Slurm profile per figure (the
//! summaries named in GPUQ_PEER_SLURM, comma-separated) with the issue's
//! targets, and writes target/bench/peer.json. Without Slurm summaries the
//! Slurm column is empty. Needs root (namespaces).
//!
//! Knobs: GPUQ_PEER_N (1000), GPUQ_PEER_REPS (3), GPUQ_PEER_PAR (4),
//! GPUQ_PEER_LAT_REPS (20), GPUQ_PEER_MN_REPS (5), GPUQ_PEER_NODES (8),
//! GPUQ_PEER_GPUS (8), GPUQ_PEER_TESTS ("lat multi seq par held array floor"),
//! GPUQ_PEER_SLURM (summary.txt paths), GPUQ_BENCH_SMOKE=1 (tiny sizes).

#[path = "../tests/common/mod.rs"]
mod common;
#[path = "peer/report.rs"]
mod report;

use std::path::{Path, PathBuf};
use std::process::Output;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use common::netns::{Host, Net};
use common::{Agent, AgentHw, Server};
use gpuq::model::JobState;
use gpuq::net::local::LocalClient;
use gpuq::net::proto::{ApiRequest, ApiResponse};
use report::{Figures, Stats};

/// The bench's knobs, read once.
struct Knobs {
    n: usize,
    reps: usize,
    par: usize,
    lat_reps: usize,
    mn_reps: usize,
    nodes: usize,
    gpus: u32,
    tests: Vec<String>,
    smoke: bool,
}

fn knob(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

impl Knobs {
    fn read() -> Knobs {
        let smoke = std::env::var_os("GPUQ_BENCH_SMOKE").is_some();
        let (n, reps, lat, mn) = if smoke {
            (20, 1, 3, 2)
        } else {
            (1000, 3, 20, 5)
        };
        Knobs {
            n: knob("GPUQ_PEER_N", n),
            reps: knob("GPUQ_PEER_REPS", reps),
            par: knob("GPUQ_PEER_PAR", 4),
            lat_reps: knob("GPUQ_PEER_LAT_REPS", lat),
            mn_reps: knob("GPUQ_PEER_MN_REPS", mn),
            nodes: knob("GPUQ_PEER_NODES", 8),
            gpus: knob("GPUQ_PEER_GPUS", 8) as u32,
            tests: std::env::var("GPUQ_PEER_TESTS")
                .unwrap_or_else(|_| "lat multi seq par held array floor".into())
                .split_whitespace()
                .map(str::to_string)
                .collect(),
            smoke,
        }
    }
}

/// Seconds since the epoch: the clock the jobs' `$EPOCHREALTIME` reads.
fn epoch() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
}

fn clk_tck() -> f64 {
    // SAFETY: sysconf has no preconditions.
    (unsafe { libc::sysconf(libc::_SC_CLK_TCK) }) as f64
}

/// utime+stime+cutime+cstime of `pid`, in ticks.
fn proc_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let after = stat.rsplit_once(')').map_or("", |(_, r)| r);
    // Fields after the comm: state is field 3, utime 14 .. cstime 17.
    after
        .split_whitespace()
        .skip(11)
        .take(4)
        .filter_map(|f| f.parse::<u64>().ok())
        .sum()
}

/// (busy, total) ticks of the whole machine, as bench.sh counts them.
fn machine_ticks() -> (u64, u64) {
    let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let v: Vec<u64> = stat
        .lines()
        .next()
        .unwrap_or("")
        .split_whitespace()
        .skip(1)
        .filter_map(|f| f.parse().ok())
        .collect();
    let at = |i: usize| v.get(i).copied().unwrap_or(0);
    let busy = at(0) + at(1) + at(2) + at(5) + at(6);
    (busy, busy + at(3) + at(4))
}

/// The gpuq cluster under test and what the phases need of it.
struct Peer {
    dir: PathBuf,
    socket: PathBuf,
    client: LocalClient,
    server_pid: u32,
    agent_pids: Vec<u32>,
    cores: f64,
    // Dropped in this order: agents, then the server, then the namespaces.
    agents: Vec<Agent>,
    server: Server,
    _net: Net,
}

/// CPU and wall clock over one phase.
struct Phase {
    t0: Instant,
    server: u64,
    agents: u64,
    machine: (u64, u64),
}

/// What one phase cost per job: ms of CPU for the server, the agents and the
/// whole machine, and the machine's utilisation.
#[derive(Clone, Copy, Debug, Default)]
pub struct Cost {
    pub server_ms: f64,
    pub agents_ms: f64,
    pub machine_ms: f64,
    pub machine_util: f64,
    pub wall_s: f64,
}

impl Peer {
    fn start(dir: &Path, k: &Knobs) -> Peer {
        let mut net = Net::with_prefix("gqp", "peer", 150);
        let hosts: Vec<Host> = (0..=k.nodes).map(|_| net.add_host()).collect();
        let mut set = common::netns::server_set(&dir.join("server"), &hosts[..1], "");
        let server = set.servers.remove(0);
        let token = server.ok(&["token", "create"]).trim().to_string();
        let cpus = std::thread::available_parallelism().map_or(2, |n| n.get()) as u32;
        let hw = AgentHw {
            gpus: k.gpus,
            cpus,
            ..AgentHw::default()
        };
        let agents: Vec<Agent> = hosts[1..]
            .iter()
            .enumerate()
            .map(|(i, h)| {
                let name = format!("node{}", i + 1);
                common::netns::agent_hw(&server, h, &dir.join(&name), &name, hw, &token)
            })
            .collect();
        let socket = server.socket.clone();
        let client = tokio_block(LocalClient::connect(&socket)).expect("server socket");
        Peer {
            dir: dir.to_path_buf(),
            socket,
            client,
            server_pid: server.pid().expect("server runs"),
            agent_pids: agents.iter().filter_map(Agent::pid).collect(),
            cores: f64::from(cpus),
            agents,
            server,
            _net: net,
        }
    }

    fn cli(&self, args: &[&str]) -> Output {
        common::cli(&self.socket, args)
    }

    /// Jobs per state, from the leader.
    fn counts(&mut self) -> Vec<(String, u64)> {
        match tokio_block(self.client.call(&ApiRequest::Cluster)) {
            Ok(ApiResponse::Cluster { status }) => status.jobs,
            other => panic!("cluster status: {other:?}"),
        }
    }

    fn active(&mut self) -> u64 {
        self.counts()
            .iter()
            .filter(|(s, _)| JobState::parse(s).is_none_or(|s| !s.is_final()))
            .map(|(_, n)| n)
            .sum()
    }

    fn finished_not_completed(&mut self) -> u64 {
        self.counts()
            .iter()
            .filter(|(s, _)| JobState::parse(s).is_some_and(|s| s.is_final()))
            .filter(|(s, _)| s != JobState::Completed.as_str())
            .map(|(_, n)| n)
            .sum()
    }

    /// Waits until no job is pending or running; the moment it saw that.
    fn wait_empty(&mut self, timeout: Duration) -> Instant {
        let start = Instant::now();
        loop {
            if self.active() == 0 {
                return Instant::now();
            }
            assert!(
                start.elapsed() < timeout,
                "jobs still active after {timeout:?}: {:?}\n--- server ---\n{}",
                self.counts(),
                self.server.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn settle(&mut self) {
        self.wait_empty(Duration::from_secs(600));
        std::thread::sleep(Duration::from_millis(500));
    }

    fn phase(&self) -> Phase {
        Phase {
            t0: Instant::now(),
            server: proc_ticks(self.server_pid),
            agents: self.agent_pids.iter().map(|p| proc_ticks(*p)).sum(),
            machine: machine_ticks(),
        }
    }

    fn cost(&self, p: &Phase, jobs: usize) -> Cost {
        let hz = clk_tck();
        let (b, t) = machine_ticks();
        let server = proc_ticks(self.server_pid) - p.server;
        let agents: u64 = self.agent_pids.iter().map(|p| proc_ticks(*p)).sum::<u64>() - p.agents;
        let busy = (b - p.machine.0) as f64;
        let total = (t - p.machine.1) as f64;
        let wall_s = p.t0.elapsed().as_secs_f64();
        let util = if total > 0.0 { busy / total } else { 0.0 };
        let per = |ticks: f64| ticks / hz * 1e3 / jobs.max(1) as f64;
        Cost {
            server_ms: per(server as f64),
            agents_ms: per(agents as f64),
            // As bench.sh: utilisation of all cores times the wall clock.
            machine_ms: util * self.cores * wall_s * 1e3 / jobs.max(1) as f64,
            machine_util: util,
            wall_s,
        }
    }
}

/// Runs a future to completion from synchronous code (the bench is
/// synchronous: it drives CLI processes).
fn tokio_block<F: std::future::Future>(f: F) -> F::Output {
    static RT: std::sync::OnceLock<tokio::runtime::Runtime> = std::sync::OnceLock::new();
    RT.get_or_init(|| {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
    })
    .block_on(f)
}

/// `gpuq submit --parsable -o /dev/null ARGS`: the job id, or None when the
/// CLI failed (counted, like bench.sh counts sbatch failures).
fn submit(socket: &Path, args: &[&str]) -> Option<String> {
    let mut full = vec!["submit", "--parsable", "-o", "/dev/null"];
    full.extend_from_slice(args);
    let out = common::cli(socket, &full);
    if !out.status.success() {
        eprintln!("submit failed: {}", common::stderr(&out).trim());
        return None;
    }
    Some(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// Waits until `path` holds a line; its first word as a number.
fn wait_stamp(path: &Path, timeout: Duration) -> Option<Vec<f64>> {
    let start = Instant::now();
    loop {
        if let Ok(s) = std::fs::read_to_string(path) {
            if s.ends_with('\n') {
                return Some(
                    s.split_whitespace()
                        .filter_map(|w| w.parse().ok())
                        .collect(),
                );
            }
        }
        if start.elapsed() > timeout {
            return None;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// A random pause of up to `max`, so that a submit is not phase-locked to a
/// periodic loop (bench.sh does the same before each latency sample).
fn jitter(max: Duration) {
    std::thread::sleep(max.mul_f64(rand::random::<f64>()));
}

fn t_lat(p: &mut Peer, k: &Knobs, f: &mut Figures) {
    let jit = if k.smoke {
        Duration::from_millis(100)
    } else {
        Duration::from_secs(1)
    };
    let (mut run, mut ret, mut done) = (Vec::new(), Vec::new(), Vec::new());
    for i in 0..k.lat_reps {
        p.settle();
        jitter(jit);
        let stamp = p.dir.join(format!("lat.{i}"));
        let cmd = format!("echo $EPOCHREALTIME > {}", stamp.display());
        let t0 = epoch();
        let i0 = Instant::now();
        if submit(&p.socket, &["--", "/bin/bash", "-c", &cmd]).is_none() {
            continue;
        }
        ret.push(i0.elapsed().as_secs_f64());
        let Some(ts) = wait_stamp(&stamp, Duration::from_secs(60)) else {
            eprintln!("lat {i}: the job did not start in 60 s");
            continue;
        };
        run.push(ts[0] - t0);
        let end = p.wait_empty(Duration::from_secs(60));
        done.push((end - i0).as_secs_f64());
    }
    f.gpuq_lat = Stats::of(&run);
    f.detail
        .insert("lat.submit_to_running_s".into(), report::stats_json(&run));
    f.detail
        .insert("lat.cli_return_s".into(), report::stats_json(&ret));
    f.detail.insert(
        "lat.submit_to_completed_s".into(),
        report::stats_json(&done),
    );
}

fn t_multi(p: &mut Peer, k: &Knobs, f: &mut Figures) {
    let jit = if k.smoke {
        Duration::from_millis(100)
    } else {
        Duration::from_secs(1)
    };
    let (nodes, gpus) = (k.nodes.to_string(), k.gpus.to_string());
    let (mut first, mut last, mut done) = (Vec::new(), Vec::new(), Vec::new());
    for i in 0..k.mn_reps {
        p.settle();
        jitter(jit);
        let prefix = p.dir.join(format!("mn.{i}"));
        let cmd = format!(
            "echo \"$EPOCHREALTIME $(hostname) $GPUQ_NODE_RANK\" > {}.$GPUQ_NODE_RANK",
            prefix.display()
        );
        let t0 = epoch();
        let i0 = Instant::now();
        let args = [
            "-N",
            &nodes,
            "--gpus-per-node",
            &gpus,
            "--",
            "/bin/bash",
            "-c",
            &cmd,
        ];
        if submit(&p.socket, &args).is_none() {
            continue;
        }
        let mut ranks = Vec::new();
        for r in 0..k.nodes {
            let path = PathBuf::from(format!("{}.{r}", prefix.display()));
            match wait_stamp(&path, Duration::from_secs(60)) {
                Some(ts) => ranks.push(ts[0] - t0),
                None => eprintln!("multi {i}: rank {r} did not start in 60 s"),
            }
        }
        if ranks.len() == k.nodes {
            first.push(ranks.iter().cloned().fold(f64::MAX, f64::min));
            last.push(ranks.iter().cloned().fold(f64::MIN, f64::max));
        }
        let end = p.wait_empty(Duration::from_secs(60));
        done.push((end - i0).as_secs_f64());
    }
    f.gpuq_gang = Stats::of(&last);
    f.detail.insert(
        "multi.submit_to_first_rank_s".into(),
        report::stats_json(&first),
    );
    f.detail.insert(
        "multi.submit_to_last_rank_s".into(),
        report::stats_json(&last),
    );
    f.detail.insert(
        "multi.submit_to_completed_s".into(),
        report::stats_json(&done),
    );
}

/// One `srun -N<nodes> --ntasks-per-node=1` whose ranks stamp their first
/// instruction into `prefix.RANK`, with `env` added: (first rank, last
/// rank, srun's return), seconds after it was started.
fn srun_once(p: &Peer, k: &Knobs, prefix: &Path, env: &[(&str, &str)]) -> Option<(f64, f64, f64)> {
    let (nodes, gres) = (k.nodes.to_string(), format!("gpu:{}", k.gpus));
    let cmd = format!("echo $EPOCHREALTIME > {}.$SLURM_PROCID", prefix.display());
    let args = [
        "slurm",
        "srun",
        "-N",
        &nodes,
        "--ntasks-per-node=1",
        "--gres",
        &gres,
        "bash",
        "-c",
        &cmd,
    ];
    let t0 = epoch();
    let out = common::cli_env(&p.socket, &args, env);
    let wall = epoch() - t0;
    if !out.status.success() {
        eprintln!("srun failed: {}", common::stderr(&out).trim());
        return None;
    }
    let mut ranks = Vec::new();
    for r in 0..k.nodes {
        let path = PathBuf::from(format!("{}.{r}", prefix.display()));
        ranks.push(wait_stamp(&path, Duration::from_secs(10))?[0] - t0);
    }
    let first = ranks.iter().cloned().fold(f64::MAX, f64::min);
    let last = ranks.iter().cloned().fold(f64::MIN, f64::max);
    Some((first, last, wall))
}

/// `srun -N8` as a Slurm user runs it: outside an allocation (it gets one,
/// as Slurm's `d.srun_all_*` figures do), and as a step inside a running
/// one (what a batch script's srun costs).
fn t_srun(p: &mut Peer, k: &Knobs, f: &mut Figures) {
    let jit = if k.smoke {
        Duration::from_millis(100)
    } else {
        Duration::from_secs(1)
    };
    let (mut last, mut wall) = (Vec::new(), Vec::new());
    for i in 0..k.mn_reps {
        p.settle();
        jitter(jit);
        if let Some((_, l, w)) = srun_once(p, k, &p.dir.join(format!("srun.{i}")), &[]) {
            last.push(l);
            wall.push(w);
        }
    }
    f.gpuq_srun = Stats::of(&last);
    f.detail.insert(
        "srun.new_allocation_to_last_rank_s".into(),
        report::stats_json(&last),
    );
    f.detail.insert(
        "srun.new_allocation_wall_s".into(),
        report::stats_json(&wall),
    );

    // A held allocation: a batch job whose script only waits.
    p.settle();
    let gres = format!("gpu:{}", k.gpus);
    let nodes = k.nodes.to_string();
    let held = common::cli(
        &p.socket,
        &[
            "slurm",
            "sbatch",
            "--parsable",
            "-N",
            &nodes,
            "--gres",
            &gres,
            "-o",
            "/dev/null",
            "--wrap",
            "sleep 3600",
        ],
    );
    let id = String::from_utf8_lossy(&held.stdout).trim().to_string();
    let start = Instant::now();
    let running = || {
        let out = common::cli(&p.socket, &["show", &id, "--json"]);
        serde_json::from_slice::<serde_json::Value>(&out.stdout)
            .is_ok_and(|j| j["state"] == "RUNNING")
    };
    while !running() {
        if start.elapsed() > Duration::from_secs(60) {
            eprintln!("srun: the allocation {id} did not start in 60 s");
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let (mut step_last, mut step_wall) = (Vec::new(), Vec::new());
    for i in 0..k.lat_reps {
        jitter(Duration::from_millis(100));
        let prefix = p.dir.join(format!("step.{i}"));
        if let Some((_, l, w)) = srun_once(p, k, &prefix, &[("SLURM_JOB_ID", &id)]) {
            step_last.push(l);
            step_wall.push(w);
        }
    }
    let _ = common::cli(&p.socket, &["cancel", &id]);
    let _ = p.wait_empty(Duration::from_secs(60));
    f.gpuq_step = Stats::of(&step_last);
    f.detail.insert(
        "srun.step_to_last_rank_s".into(),
        report::stats_json(&step_last),
    );
    f.detail
        .insert("srun.step_wall_s".into(), report::stats_json(&step_wall));
}

/// N `true` jobs from `np` concurrent submitters, REPS times: (submit rates,
/// end-to-end rates, costs).
fn throughput(p: &mut Peer, k: &Knobs, np: usize) -> (Vec<f64>, Vec<f64>, Vec<Cost>) {
    throughput_of(
        p,
        k,
        np,
        &["submit", "--parsable", "-o", "/dev/null", "--", "true"],
    )
}

/// N `true` jobs submitted with the CLI words `cmd`, from `np` concurrent
/// submitters, REPS times: (submit rates, end-to-end rates, costs).
fn throughput_of(
    p: &mut Peer,
    k: &Knobs,
    np: usize,
    cmd: &[&str],
) -> (Vec<f64>, Vec<f64>, Vec<Cost>) {
    let per = k.n / np;
    let (mut sub, mut e2e, mut cost) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..k.reps {
        p.settle();
        let bad0 = p.finished_not_completed();
        let ph = p.phase();
        let fails: usize = std::thread::scope(|s| {
            let socket = &p.socket;
            let hs: Vec<_> = (0..np)
                .map(|_| {
                    s.spawn(move || {
                        (0..per)
                            .filter(|_| !common::cli(socket, cmd).status.success())
                            .count()
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).sum()
        });
        let submitted = ph.t0.elapsed().as_secs_f64();
        let end = p.wait_empty(Duration::from_secs(1800));
        let tot = per * np;
        sub.push(tot as f64 / submitted);
        e2e.push(tot as f64 / (end - ph.t0).as_secs_f64());
        cost.push(p.cost(&ph, tot));
        let bad = p.finished_not_completed().saturating_sub(bad0);
        if fails > 0 || bad > 0 {
            eprintln!("{np} submitter(s): {fails} submit failures, {bad} jobs not COMPLETED");
        }
    }
    (sub, e2e, cost)
}

fn t_held(p: &mut Peer, k: &Knobs, f: &mut Figures) {
    let (mut sub, mut drain) = (Vec::new(), Vec::new());
    for _ in 0..k.reps {
        p.settle();
        let t0 = Instant::now();
        let ids: Vec<String> = (0..k.n)
            .filter_map(|_| submit(&p.socket, &["--hold", "--", "true"]))
            .collect();
        sub.push(k.n as f64 / t0.elapsed().as_secs_f64());
        let t2 = Instant::now();
        let mut args = vec!["release"];
        args.extend(ids.iter().map(String::as_str));
        let out = p.cli(&args);
        assert!(out.status.success(), "release: {}", common::stderr(&out));
        let end = p.wait_empty(Duration::from_secs(1800));
        drain.push(ids.len() as f64 / (end - t2).as_secs_f64());
    }
    f.gpuq_held = report::median(&sub);
    f.gpuq_held_drain = report::median(&drain);
}

/// Sequential starts of a program that does nothing (`/bin/true`), and of
/// gpuq doing nothing (`--version`): processes per second, the ceiling of any
/// one-process-per-job submit rate here.
fn t_floor(k: &Knobs, f: &mut Figures) {
    let gpuq = common::gpuq_bin();
    let rate = |program: &Path, arg: Option<&str>| {
        let mut rates = Vec::new();
        for _ in 0..k.reps {
            let t0 = Instant::now();
            for _ in 0..k.n {
                let status = std::process::Command::new(program)
                    .args(arg)
                    .stdout(std::process::Stdio::null())
                    .status()
                    .expect("start a process");
                assert!(status.success(), "{}: {status}", program.display());
            }
            rates.push(k.n as f64 / t0.elapsed().as_secs_f64());
        }
        report::median(&rates)
    };
    f.floor_true = rate(Path::new("/bin/true"), None);
    f.floor_gpuq = rate(&gpuq, Some("--version"));
}

fn t_array(p: &mut Peer, k: &Knobs, f: &mut Figures) {
    let mut e2e = Vec::new();
    let range = format!("0-{}", k.n - 1);
    for _ in 0..k.reps {
        p.settle();
        let ph = p.phase();
        submit(&p.socket, &["--array", &range, "--", "true"]).expect("array submit");
        let end = p.wait_empty(Duration::from_secs(1800));
        e2e.push(k.n as f64 / (end - ph.t0).as_secs_f64());
    }
    f.gpuq_array = report::median(&e2e);
}

fn main() {
    if !common::require_root("benches/peer.rs (network namespaces)") {
        return;
    }
    let k = Knobs::read();
    let mut f = Figures {
        slurm: report::read_slurm(),
        ..Figures::default()
    };
    let work = std::env::var_os("GPUQ_PEER_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| std::env::temp_dir().join("gpuq-peer"));
    let _ = std::fs::remove_dir_all(&work);
    std::fs::create_dir_all(&work).unwrap();
    let t = Instant::now();
    let mut p = Peer::start(&work, &k);
    eprintln!(
        "gpuq: server + {} agents up in {:.1} s",
        p.agents.len(),
        t.elapsed().as_secs_f64()
    );
    let _ = std::fs::write(format!("/proc/{}/clear_refs", p.server_pid), "5");
    for test in &k.tests {
        let t = Instant::now();
        match test.as_str() {
            "lat" => t_lat(&mut p, &k, &mut f),
            "multi" => {
                t_multi(&mut p, &k, &mut f);
                t_srun(&mut p, &k, &mut f);
            }
            "seq" => {
                let (s, e, c) = throughput(&mut p, &k, 1);
                f.gpuq_seq = report::median(&s);
                f.gpuq_seq_e2e = report::median(&e);
                f.gpuq_seq_cost = report::median_cost(&c);
            }
            "par" => {
                let (s, e, c) = throughput(&mut p, &k, k.par);
                f.gpuq_par = report::median(&s);
                f.gpuq_par_e2e = report::median(&e);
                f.gpuq_par_cost = report::median_cost(&c);
            }
            "held" => t_held(&mut p, &k, &mut f),
            "sbatch" => {
                // The same trivial jobs through the Slurm front end.
                let cmd = [
                    "slurm",
                    "sbatch",
                    "--parsable",
                    "-o",
                    "/dev/null",
                    "--wrap",
                    "true",
                ];
                let (s, _, _) = throughput_of(&mut p, &k, 1, &cmd);
                f.gpuq_sbatch_seq = report::median(&s);
                let (s, _, _) = throughput_of(&mut p, &k, k.par, &cmd);
                f.gpuq_sbatch_par = report::median(&s);
            }
            "array" => t_array(&mut p, &k, &mut f),
            "floor" => t_floor(&k, &mut f),
            other => {
                panic!(
                    "GPUQ_PEER_TESTS: unknown test {other:?} (lat multi seq par held array sbatch floor)"
                )
            }
        }
        eprintln!("gpuq: {test} done in {:.1} s", t.elapsed().as_secs_f64());
    }
    f.gpuq_peak_rss_mb = common::cpu::status_kb(p.server_pid, "VmHWM:") / 1024.0;
    f.shape = format!(
        "{} nodes x {} fake GPUs, {} CPUs/node; N={} REPS={} PAR={} LAT_REPS={} MN_REPS={}",
        k.nodes, k.gpus, p.cores, k.n, k.reps, k.par, k.lat_reps, k.mn_reps
    );
    drop(p);
    report::print_and_write(&f);
}
