//! The chaos workload: client threads that drive the real `gpuq` CLI, each
//! against its own server's socket, and record every submission and
//! cancellation with its answer (ok, fail, unknown) in a shared
//! [`History`]. Jobs run [`recording_script`], so the agents' reality (which
//! task held which GPU when) can be checked against what clients were told.
//! Every CLI call has a deadline: a frozen or cut-off server may hold a
//! request for ever, and a call that never answered is unknown, not failed.

use std::path::{Path, PathBuf};
use std::process::Output;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::cli_within;
use super::history::{recording_script, History, Outcome};
use gpuq::model::Job;

/// How long a client waits for one answer before calling it unknown.
pub const DEADLINE: Duration = Duration::from_secs(15);

/// How a CLI call ended, as a client must read it: refused before anything
/// was proposed (no daemon on the socket, not the leader, no leader yet, or
/// a refusal by apply such as "already ended") is a failure; anything else
/// without a success is unknown.
pub fn outcome(out: Option<&Output>, ok: impl Fn(&str) -> Option<u64>) -> Outcome {
    let Some(out) = out else {
        return Outcome::Unknown(format!("no answer in {DEADLINE:?}"));
    };
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    if out.status.success() {
        return match ok(stdout.trim()) {
            Some(id) => Outcome::Ok(id),
            None => Outcome::Unknown(format!("unparsable answer {stdout:?}")),
        };
    }
    let definite = [
        "cannot connect to the gpuq daemon",
        "not leader",
        "no leader is elected",
        "already ended",
        "does not exist",
    ];
    if definite.iter().any(|d| stderr.contains(d)) {
        Outcome::Fail(stderr)
    } else {
        Outcome::Unknown(stderr)
    }
}

/// Submits `args` as job `key` through `socket`, recording it in `history`.
pub fn submit(history: &History, socket: &Path, key: &str, args: &[&str]) -> Outcome {
    let op = history.invoke(key);
    let mut full = vec!["submit", "--parsable", "-J", key];
    full.extend_from_slice(args);
    let out = cli_within(socket, &full, DEADLINE);
    let o = outcome(out.as_ref(), |s| s.parse().ok());
    history.complete(op, o.clone());
    o
}

/// Cancels `job` through `socket`, recording it in `history`.
pub fn cancel(history: &History, socket: &Path, job: u64) -> Outcome {
    let op = history.invoke_cancel(job);
    let id = job.to_string();
    let out = cli_within(socket, &["cancel", &id], DEADLINE);
    let o = outcome(out.as_ref(), |_| Some(job));
    history.complete_cancel(op, o.clone());
    o
}

/// Every job a server's applied state holds (None when it does not answer).
pub fn jobs_on(socket: &Path) -> Option<Vec<Job>> {
    let out = cli_within(socket, &["queue", "--all", "--json"], DEADLINE)?;
    if !out.status.success() {
        return None;
    }
    serde_json::from_slice(&out.stdout).ok()
}

/// The clients, and an observer that polls every server's view into the
/// history, running until [`Workload::stop`].
pub struct Workload {
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
}

impl Workload {
    /// One client per socket in `sockets`, each seeded from `seed`; jobs
    /// run in `work` and record their tasks in `records`.
    pub fn start(
        history: Arc<History>,
        sockets: &[PathBuf],
        work: &Path,
        records: &Path,
        seed: u64,
    ) -> Workload {
        let stop = Arc::new(AtomicBool::new(false));
        let mut threads = Vec::new();
        for (i, socket) in sockets.iter().enumerate() {
            let (history, stop, socket) = (history.clone(), stop.clone(), socket.clone());
            let (work, records) = (work.to_path_buf(), records.to_path_buf());
            threads.push(std::thread::spawn(move || {
                let mut rng = StdRng::seed_from_u64(seed.wrapping_add(i as u64 + 1));
                client(i, &history, &socket, &work, &records, &mut rng, &stop)
            }));
        }
        let (h, st, socks) = (history.clone(), stop.clone(), sockets.to_vec());
        threads.push(std::thread::spawn(move || {
            while !st.load(Ordering::Relaxed) {
                for s in &socks {
                    // One observer per server process: a restarted server
                    // may show an older applied state for a while, and
                    // its socket is a new file.
                    let before = incarnation(s);
                    let jobs = jobs_on(s).unwrap_or_default();
                    if before.is_none() || incarnation(s) != before {
                        continue;
                    }
                    let who = format!("{}#{:?}", s.display(), before.unwrap());
                    for j in jobs {
                        h.observe(&who, j.id.0, j.state);
                    }
                }
                std::thread::sleep(Duration::from_secs(2));
            }
        }));
        Workload { stop, threads }
    }

    /// Stops the clients after their operation in flight.
    pub fn stop(self) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads {
            t.join().expect("a client thread panicked");
        }
    }
}

/// Which process serves `socket`: the socket file's inode and change time.
fn incarnation(socket: &Path) -> Option<(u64, i64, i64)> {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata(socket).ok()?;
    Some((m.ino(), m.ctime(), m.ctime_nsec()))
}

/// One client: short jobs of one or two GPUs, some long ones (to be running
/// under the faults), some held ones (pending for sure, to be cancelled),
/// and cancellations of its own acknowledged jobs, at random.
fn client(
    me: usize,
    history: &History,
    socket: &Path,
    work: &Path,
    records: &Path,
    rng: &mut StdRng,
    stop: &AtomicBool,
) {
    let w = work.display().to_string();
    let mut mine: Vec<u64> = Vec::new();
    let mut n = 0;
    while !stop.load(Ordering::Relaxed) {
        let r: f64 = rng.gen();
        if r < 0.8 || mine.is_empty() {
            let (gpus, body, hold) = if r < 0.55 {
                let secs = rng.gen_range(0.2..2.0);
                (rng.gen_range(1..=2), format!("sleep {secs:.1}"), false)
            } else if r < 0.65 {
                (1, "sleep 30".to_string(), false)
            } else {
                (1, "sleep 1".to_string(), true)
            };
            let g = gpus.to_string();
            let script = recording_script(records, &body);
            let mut args = vec!["--gpus-per-node", &g, "-D", &w];
            if hold {
                args.push("--hold");
            }
            args.extend(["--", "sh", "-c", &script]);
            let key = format!("c{me}-{n}");
            n += 1;
            if let Outcome::Ok(id) = submit(history, socket, &key, &args) {
                mine.push(id);
            }
        } else {
            let job = mine.swap_remove(rng.gen_range(0..mine.len()));
            cancel(history, socket, job);
        }
        std::thread::sleep(Duration::from_millis(rng.gen_range(150..300)));
    }
}
