//! The nemesis (Jepsen's word for the fault injector): a control plane of
//! three servers and two compute agents, each in its own network namespace,
//! the servers' data dirs on size-limited tmpfs mounts, and a seeded
//! schedule of faults inflicted one at a time. Each fault heals before the
//! next starts (no overlap): a schedule then reads as a list of single
//! failures, each of which the cluster must survive without breaking a
//! promise, and its failover time means one thing. Healing waits until all
//! three servers agree on a leader with every voter healthy and both agents
//! connected to it.
//!
//! The fault kinds ([`Fault`]) and how each heals:
//! - `kill-leader`: SIGKILL the leader; restarted once a survivor took a write.
//! - `pause-follower`: SIGSTOP a follower for 3 s, then SIGCONT.
//! - `isolate-leader`: cut the leader's link (it is the minority of one);
//!   relinked 1 s after the majority took a write.
//! - `isolate-follower`: cut a follower's link (the leader keeps its
//!   majority) for 3 s.
//! - `one-way`: drop what the leader sends to the other servers (iptables in
//!   its namespace) while it still hears them, until the majority took a
//!   write and 1 s more; then the rules are flushed.
//! - `kill-agent`: SIGKILL a compute agent under running tasks (their shims
//!   live on), restarted after 1 s.
//! - `fill-disk`: fill a follower's tmpfs data dir with a file for 3 s, then
//!   delete it; a server that exited meanwhile is restarted (and noted).
//! - `power-cycle`: SIGKILL all three servers, start them again after 1 s.
//!
//! The failover time of a fault that takes the leader away is from the
//! fault to the first write a (new) leader acknowledged: a held probe job,
//! recorded in the history like any client's submission.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};

use super::history::History;
use super::netns::{self, Host, Net};
use super::workload::{cancel, jobs_on, submit};
use super::{cli_within, Agent, ServerSet};
use gpuq::model::{Job, JobState};

/// Fast Raft timings so that many elections stay quick, and finished jobs
/// kept in memory for the whole run: the history check reads `queue --all`,
/// which no longer shows jobs archived after the default 300 s. (The harness
/// writes these lines after its own `[server]` table.) tests/failover.rs
/// uses them too.
pub const RAFT_FAST: &str = "history_retention_secs = 86400\n\
     [server.raft]\nheartbeat_ms = 50\nelection_timeout_min_ms = 300\nelection_timeout_max_ms = 600\n";

/// The size of each server's tmpfs data dir.
const TMPFS_SIZE: &str = "256m";

/// How long the cluster may take to heal before the run fails.
const HEAL: Duration = Duration::from_secs(120);

/// One kind of fault; see the module comment for what each does.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Fault {
    KillLeader,
    PauseFollower,
    IsolateLeader,
    IsolateFollower,
    OneWay,
    KillAgent,
    FillDisk,
    PowerCycle,
}

impl Fault {
    pub const ALL: [Fault; 8] = [
        Fault::KillLeader,
        Fault::PauseFollower,
        Fault::IsolateLeader,
        Fault::IsolateFollower,
        Fault::OneWay,
        Fault::KillAgent,
        Fault::FillDisk,
        Fault::PowerCycle,
    ];

    /// The partitions, for a schedule that asks for "partitions".
    pub const PARTITIONS: [Fault; 3] =
        [Fault::IsolateLeader, Fault::IsolateFollower, Fault::OneWay];

    pub fn name(self) -> &'static str {
        match self {
            Fault::KillLeader => "kill-leader",
            Fault::PauseFollower => "pause-follower",
            Fault::IsolateLeader => "isolate-leader",
            Fault::IsolateFollower => "isolate-follower",
            Fault::OneWay => "one-way",
            Fault::KillAgent => "kill-agent",
            Fault::FillDisk => "fill-disk",
            Fault::PowerCycle => "power-cycle",
        }
    }
}

/// A schedule: `counts` of each kind, in an order drawn from `seed`.
pub fn schedule(seed: u64, counts: &[(Fault, usize)]) -> Vec<Fault> {
    let mut out: Vec<Fault> = counts
        .iter()
        .flat_map(|(f, n)| std::iter::repeat_n(*f, *n))
        .collect();
    out.shuffle(&mut StdRng::seed_from_u64(seed));
    out
}

/// A tmpfs mounted at the path, unmounted on drop: a disk that fills.
pub struct Tmpfs(pub PathBuf);

impl Tmpfs {
    /// Mounts a tmpfs of `size` (e.g. `64m`) on `path`, mode 0700 as a
    /// server wants its data dir (a tmpfs root is 1777 otherwise, and the
    /// server refuses a data dir others can open).
    pub fn mount(path: &Path, size: &str) -> Tmpfs {
        std::fs::create_dir_all(path).unwrap();
        let size = format!("size={size},mode=0700");
        let st = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", &size, "tmpfs"])
            .arg(path)
            .status()
            .expect("run mount");
        assert!(st.success(), "cannot mount a tmpfs on {}", path.display());
        Tmpfs(path.to_path_buf())
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg("-l")
            .arg(&self.0)
            .status();
    }
}

/// The cluster under the nemesis. Fields drop in order: agents (and their
/// tasks), servers, then the mounts and the network they used.
pub struct Chaos {
    pub agents: Vec<Agent>,
    pub set: ServerSet,
    mounts: Vec<Tmpfs>,
    net: Net,
    hosts: Vec<Host>,
    history: Arc<History>,
    rng: StdRng,
    probes: usize,
    /// Per fault that took the leader away, ms to the next acknowledged write.
    pub failovers: Vec<(Fault, f64)>,
    /// What happened that is no violation but worth saying (a server exit).
    pub notes: Vec<String>,
    /// Where the jobs run.
    pub work: PathBuf,
}

impl Chaos {
    /// Three servers and two agents with four fake GPUs each under `root`,
    /// on bridge 10.88.`subnet`.0/24 with names `prefix`+`tag`.
    pub fn start(
        root: &Path,
        prefix: &str,
        tag: &str,
        subnet: u8,
        seed: u64,
        history: Arc<History>,
    ) -> Chaos {
        netns::require_iptables();
        let work = root.join("work");
        std::fs::create_dir_all(&work).unwrap();
        let mut net = Net::with_prefix(prefix, tag, subnet);
        let hosts: Vec<Host> = (0..5).map(|_| net.add_host()).collect();
        let servers = root.join("servers");
        let mounts: Vec<Tmpfs> = (1..=3)
            .map(|i| Tmpfs::mount(&servers.join(format!("s{i}/data")), TMPFS_SIZE))
            .collect();
        let set = netns::server_set(&servers, &hosts[..3], RAFT_FAST);
        let li = set.leader();
        let token = set.servers[li].ok(&["token", "create"]).trim().to_string();
        let agents = (0..2)
            .map(|i| {
                let name = format!("n{}", i + 1);
                netns::agent(
                    &set.servers[li],
                    &hosts[3 + i],
                    &root.join(&name),
                    &name,
                    4,
                    &token,
                )
            })
            .collect();
        Chaos {
            agents,
            set,
            mounts,
            net,
            hosts,
            history,
            rng: StdRng::seed_from_u64(seed),
            probes: 0,
            failovers: Vec::new(),
            notes: Vec::new(),
            work,
        }
    }

    /// The servers' sockets, s1..s3.
    pub fn sockets(&self) -> Vec<PathBuf> {
        self.set.servers.iter().map(|s| s.socket.clone()).collect()
    }

    /// `gpuq cluster --json` of server `i`, Null when it does not answer soon.
    fn status(&self, i: usize) -> serde_json::Value {
        let s = &self.set.servers[i];
        cli_within(&s.socket, &["cluster", "--json"], Duration::from_secs(3))
            .and_then(|o| serde_json::from_slice(&o.stdout).ok())
            .unwrap_or_default()
    }

    /// Which of `among` leads by its own view, if any.
    fn self_leader(&self, among: &[usize]) -> Option<usize> {
        among.iter().copied().find(|i| {
            let v = self.status(*i);
            let name = self.set.servers[*i].name.as_str();
            v["leader"] == name && v["answered_by"] == name
        })
    }

    /// The leader, once the cluster has healed.
    fn leader(&self) -> usize {
        let start = Instant::now();
        loop {
            if let Some(l) = self.self_leader(&[0, 1, 2]) {
                return l;
            }
            assert!(
                start.elapsed() < HEAL,
                "no leader in {HEAL:?}\n{}",
                self.dump()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Polls `among` until one leads and acknowledges a held probe job; the
    /// time since `since` in ms.
    fn first_write(&mut self, among: &[usize], since: Instant, fault: Fault) -> f64 {
        loop {
            assert!(
                since.elapsed() < HEAL,
                "no leader took a write {HEAL:?} after {}\n{}",
                fault.name(),
                self.dump()
            );
            let Some(l) = self.self_leader(among) else {
                std::thread::sleep(Duration::from_millis(20));
                continue;
            };
            self.probes += 1;
            let key = format!("probe-{}", self.probes);
            let socket = self.set.servers[l].socket.clone();
            let args = ["--hold", "--", "true"];
            if matches!(
                submit(&self.history, &socket, &key, &args),
                super::history::Outcome::Ok(_)
            ) {
                let ms = since.elapsed().as_secs_f64() * 1000.0;
                self.failovers.push((fault, ms));
                return ms;
            }
        }
    }

    /// Inflicts `fault`, heals it and waits until the cluster is whole;
    /// returns what was done, for the printed schedule.
    pub fn inflict(&mut self, fault: Fault) -> String {
        let l = self.leader();
        let followers: Vec<usize> = (0..3).filter(|i| *i != l).collect();
        let f = followers[self.rng.gen_range(0..2)];
        let (ln, fname) = (
            self.set.servers[l].name.clone(),
            self.set.servers[f].name.clone(),
        );
        let at = Instant::now();
        let what = match fault {
            Fault::KillLeader => {
                self.set.servers[l].kill();
                let ms = self.first_write(&followers, at, fault);
                self.set.servers[l].spawn();
                format!("SIGKILL leader {ln}: a write after {ms:.0} ms; restarted")
            }
            Fault::PauseFollower => {
                self.set.servers[f].freeze(true);
                std::thread::sleep(Duration::from_secs(3));
                self.set.servers[f].freeze(false);
                format!("SIGSTOP follower {fname} for 3 s")
            }
            Fault::IsolateLeader => {
                self.net.cut(&self.hosts[l]);
                let ms = self.first_write(&followers, at, fault);
                std::thread::sleep(Duration::from_secs(1));
                self.net.heal(&self.hosts[l]);
                format!("cut leader {ln} off: the majority wrote after {ms:.0} ms")
            }
            Fault::IsolateFollower => {
                self.net.cut(&self.hosts[f]);
                std::thread::sleep(Duration::from_secs(3));
                self.net.heal(&self.hosts[f]);
                format!("cut follower {fname} off for 3 s")
            }
            Fault::OneWay => {
                let others: Vec<&Host> = followers.iter().map(|i| &self.hosts[*i]).collect();
                self.net.cut_outgoing(&self.hosts[l], &others);
                let ms = self.first_write(&followers, at, fault);
                std::thread::sleep(Duration::from_secs(1));
                self.net.heal_outgoing(&self.hosts[l]);
                format!("dropped what leader {ln} sends to the servers: a write after {ms:.0} ms")
            }
            Fault::KillAgent => {
                let a = self.rng.gen_range(0..self.agents.len());
                self.agents[a].kill();
                std::thread::sleep(Duration::from_secs(1));
                self.agents[a].spawn();
                format!("SIGKILL agent {}; restarted after 1 s", self.agents[a].name)
            }
            Fault::FillDisk => {
                let filled = fill(&self.mounts[f].0.join("chaos-fill"));
                std::thread::sleep(Duration::from_secs(3));
                std::fs::remove_file(self.mounts[f].0.join("chaos-fill")).unwrap();
                format!("filled follower {fname}'s disk ({filled} MiB) for 3 s")
            }
            Fault::PowerCycle => {
                for s in self.set.servers.iter_mut() {
                    s.kill();
                }
                std::thread::sleep(Duration::from_secs(1));
                for s in self.set.servers.iter_mut() {
                    s.spawn();
                }
                let ms = self.first_write(&[0, 1, 2], at, fault);
                format!("power-cycled all servers: a write {ms:.0} ms after the kill")
            }
        };
        self.heal(fault);
        what
    }

    /// Restarts any server that exited, then waits until all three agree on
    /// a leader that sees every voter healthy and both agents connected.
    fn heal(&mut self, fault: Fault) {
        for s in self.set.servers.iter_mut() {
            if let Some(st) = s.exited() {
                let log = s.log();
                let tail: Vec<&str> = log.lines().rev().take(5).collect();
                self.notes.push(format!(
                    "{} exited ({st}) during {}; restarted. Its last words: {}",
                    s.name,
                    fault.name(),
                    tail.into_iter().rev().collect::<Vec<_>>().join(" | ")
                ));
                s.spawn();
            }
        }
        let start = Instant::now();
        loop {
            let views: Vec<serde_json::Value> = (0..3).map(|i| self.status(i)).collect();
            let leader = &views[0]["leader"];
            let agree = !leader.is_null() && views.iter().all(|v| v["leader"] == *leader);
            let li = views.iter().position(|v| v["answered_by"] == *leader);
            let healthy = li.is_some_and(|li| {
                views[li]["members"].as_array().is_some_and(|ms| {
                    // A voter whose Raft core died still shows no problem;
                    // its lag grows, and one that catches up has a small one.
                    ms.iter().filter(|m| m["voter"] == true).count() == 3
                        && ms.iter().all(|m| {
                            m["problem"].is_null() && m["lag"].as_u64().is_some_and(|l| l <= 20)
                        })
                })
            });
            if agree && healthy && self.agents_connected(li.unwrap()) {
                return;
            }
            assert!(
                start.elapsed() < HEAL,
                "the cluster did not heal in {HEAL:?} after {}\n{}",
                fault.name(),
                self.dump()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Whether server `l` sees every agent connected.
    fn agents_connected(&self, l: usize) -> bool {
        let s = &self.set.servers[l];
        let Some(out) = cli_within(&s.socket, &["nodes", "--json"], Duration::from_secs(3)) else {
            return false;
        };
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
        self.agents.iter().all(|a| {
            v.as_array().is_some_and(|ns| {
                ns.iter()
                    .any(|n| n["name"] == a.name.as_str() && n["connected"] == true)
            })
        })
    }

    /// Cancels every unfinished job through the leader (recorded in the
    /// history like a client's), waits until all are final and the three
    /// servers agree, and returns the jobs.
    pub fn finish(&mut self) -> Vec<Job> {
        let start = Instant::now();
        loop {
            let l = self.leader();
            let socket = self.set.servers[l].socket.clone();
            let jobs = jobs_on(&socket).unwrap_or_default();
            let open: Vec<&Job> = jobs.iter().filter(|j| !j.state.is_final()).collect();
            if open.is_empty() {
                break;
            }
            for j in open.iter().filter(|j| j.state != JobState::Completing) {
                cancel(&self.history, &socket, j.id.0);
            }
            if start.elapsed() > HEAL {
                let mut why = String::new();
                for j in &open {
                    why += &format!(
                        "--- job {}: {}\n",
                        j.id.0,
                        serde_json::to_string(j).unwrap()
                    );
                    let id = j.id.0.to_string();
                    let mentions = |l: &&str| {
                        l.contains("job") && l.split(|c: char| !c.is_ascii_digit()).any(|t| t == id)
                    };
                    for a in &self.agents {
                        for l in a.log().lines().filter(mentions) {
                            why += &format!("{}: {l}\n", a.name);
                        }
                    }
                }
                panic!(
                    "jobs still unfinished {HEAL:?} after the last fault:\n{why}\n{}",
                    self.dump()
                );
            }
            std::thread::sleep(Duration::from_millis(500));
        }
        loop {
            let views: Vec<Option<Vec<(u64, JobState, u32)>>> = self
                .sockets()
                .iter()
                .map(|s| {
                    jobs_on(s).map(|js| {
                        js.iter()
                            .map(|j| (j.id.0, j.state, j.restart_count))
                            .collect()
                    })
                })
                .collect();
            if views.iter().all(|v| v.is_some()) && views.windows(2).all(|w| w[0] == w[1]) {
                return jobs_on(&self.set.servers[0].socket).unwrap();
            }
            assert!(
                start.elapsed() < HEAL,
                "the servers do not converge: {views:?}"
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// Each server's view and the end of its log, for a failure message.
    pub fn dump(&self) -> String {
        let mut out = String::new();
        for (i, s) in self.set.servers.iter().enumerate() {
            let log = s.log();
            let tail: Vec<&str> = log.lines().rev().take(20).collect();
            out += &format!(
                "--- {} status {}\n{}\n",
                s.name,
                self.status(i),
                tail.into_iter().rev().collect::<Vec<_>>().join("\n")
            );
        }
        for a in &self.agents {
            let log = a.log();
            let tail: Vec<&str> = log.lines().rev().take(10).collect();
            out += &format!(
                "--- agent {}\n{}\n",
                a.name,
                tail.into_iter().rev().collect::<Vec<_>>().join("\n")
            );
        }
        out
    }
}

/// The figures of a run, printed as a table and returned as JSON.
pub fn report(
    schedule: &[Fault],
    chaos: &Chaos,
    history: &History,
    runs: &[super::history::TaskRun],
    bad: &super::history::Violations,
) -> (String, serde_json::Value) {
    use super::history::{count, Outcome, Violation};
    let mut out = String::new();
    let mut faults = serde_json::Map::new();
    out += &format!(
        "{:<18} {:>6} {:>14} {:>14}\n",
        "fault", "count", "failover p50", "failover p99"
    );
    for f in Fault::ALL {
        let n = schedule.iter().filter(|g| **g == f).count();
        let ms: Vec<f64> = chaos
            .failovers
            .iter()
            .filter(|(g, _)| *g == f)
            .map(|(_, m)| *m)
            .collect();
        let (p50, p99) = (pct(&ms, 0.5), pct(&ms, 0.99));
        if ms.is_empty() {
            out += &format!("{:<18} {n:>6} {:>14} {:>14}\n", f.name(), "-", "-");
        } else {
            out += &format!("{:<18} {n:>6} {p50:>11.0} ms {p99:>11.0} ms\n", f.name());
        }
        faults.insert(
            f.name().into(),
            serde_json::json!({ "count": n, "failover_ms": { "p50": p50, "p99": p99, "all": ms } }),
        );
    }
    let all_ms: Vec<f64> = chaos
        .failovers
        .iter()
        .filter(|(f, _)| *f != Fault::PowerCycle)
        .map(|(_, m)| *m)
        .collect();
    let (ok, fail, unknown) = history.counts();
    let cancels = history.cancels();
    let cancelled = cancels
        .iter()
        .filter(|c| matches!(c.outcome, Some(Outcome::Ok(_))))
        .count();
    let counts = [
        ("lost", count(bad, Violation::Lost)),
        ("duplicated", count(bad, Violation::Duplicated)),
        ("double-booked", count(bad, Violation::DoubleBooked)),
        (
            "cancelled-then-started",
            count(bad, Violation::CancelledThenStarted),
        ),
        ("ids-went-back", count(bad, Violation::IdWentBack)),
        ("other violations", bad.len()),
    ];
    out += &format!(
        "failover (leader gone to a write, all but power-cycle): p50 {:.0} ms, p99 {:.0} ms over {}\n",
        pct(&all_ms, 0.5),
        pct(&all_ms, 0.99),
        all_ms.len()
    );
    out += &format!(
        "submissions: {ok} acknowledged, {fail} failed, {unknown} unknown; cancels: {} sent, {cancelled} acknowledged; tasks run: {}\n",
        cancels.len(),
        runs.len()
    );
    let mut json_counts = serde_json::Map::new();
    let others = bad.len() - counts[..5].iter().map(|(_, n)| n).sum::<usize>();
    for (name, n) in counts {
        let n = if name == "other violations" {
            others
        } else {
            n
        };
        out += &format!("{name:<24} {n}\n");
        json_counts.insert(name.into(), n.into());
    }
    let json = serde_json::json!({
        "faults": faults,
        "failover_ms": { "p50": pct(&all_ms, 0.5), "p99": pct(&all_ms, 0.99), "n": all_ms.len() },
        "submissions": { "acknowledged": ok, "failed": fail, "unknown": unknown },
        "cancels": { "sent": cancels.len(), "acknowledged": cancelled },
        "tasks": runs.len(),
        "violations": json_counts,
        "notes": chaos.notes,
    });
    (out, json)
}

/// Writes zeros to `path` until the disk is full; the MiB written.
pub fn fill(path: &Path) -> usize {
    use std::io::Write;
    let mut f = std::fs::File::create(path).expect("create the fill file");
    let chunk = vec![0u8; 1 << 20];
    let mut n = 0;
    while f.write_all(&chunk).is_ok() {
        n += 1;
    }
    n
}

/// Percentile `p` (0..1) of `v`, 0 when empty.
pub fn pct(v: &[f64], p: f64) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    let mut v = v.to_vec();
    v.sort_by(|a, b| a.total_cmp(b));
    v[((v.len() as f64 - 1.0) * p).round() as usize]
}
