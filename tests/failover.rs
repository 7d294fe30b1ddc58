//! Failover and faults: leader SIGKILLs under load, partitions in network
//! namespaces, whole-cluster restarts, agent failover; every client
//! operation goes into a history that `common::history` checks.

mod common;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::history::{FinalJob, History, Outcome};
use common::nemesis::RAFT_FAST;
use common::netns::{self, Net};
use common::workload::{jobs_on, submit};
use common::{cli, require_root, wait_for, Agent, Server, ServerSet};
use gpuq::model::{Job, JobState};

const LONG: Duration = Duration::from_secs(60);

/// A job program that records its start in `starts` (one line per start,
/// `JOB RESTART_COUNT`) and then runs `then`.
fn recording(starts: &Path, then: &str) -> String {
    format!(
        "echo \"$GPUQ_JOB_ID $GPUQ_RESTART_COUNT\" >> {}; {then}",
        starts.display()
    )
}

/// Starts recorded per job id.
fn start_counts(starts: &Path) -> std::collections::BTreeMap<u64, usize> {
    let mut out = std::collections::BTreeMap::new();
    for line in std::fs::read_to_string(starts).unwrap_or_default().lines() {
        if let Some(id) = line.split_whitespace().next().and_then(|w| w.parse().ok()) {
            *out.entry(id).or_default() += 1;
        }
    }
    out
}

fn assert_started_once(starts: &Path) {
    let twice: Vec<_> = start_counts(starts)
        .into_iter()
        .filter(|(_, n)| *n > 1)
        .collect();
    assert!(twice.is_empty(), "tasks started more than once: {twice:?}");
}

/// The server that leads now by its own view, among the running ones.
fn self_leader(servers: &[Server]) -> Option<usize> {
    servers.iter().position(|s| {
        s.pid().is_some() && {
            let v = s.status();
            v["leader"] == s.name.as_str() && v["answered_by"] == s.name.as_str()
        }
    })
}

/// Waits until every running server holds the same jobs in the same states.
fn wait_converged(servers: &[Server]) -> Vec<Job> {
    let start = Instant::now();
    loop {
        let views: Vec<Option<Vec<(u64, JobState, u32)>>> = servers
            .iter()
            .filter(|s| s.pid().is_some())
            .map(|s| {
                jobs_on(&s.socket).map(|js| {
                    js.iter()
                        .map(|j| (j.id.0, j.state, j.restart_count))
                        .collect()
                })
            })
            .collect();
        if views.iter().all(|v| v.is_some()) && views.windows(2).all(|w| w[0] == w[1]) {
            return jobs_on(&servers[0].socket).unwrap();
        }
        assert!(
            start.elapsed() < LONG,
            "the servers do not converge: {views:?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Each server's view and the end of its log, for a failure message.
fn dump(servers: &[Server]) -> String {
    servers
        .iter()
        .map(|s| {
            let log = s.log();
            let tail: Vec<&str> = log.lines().rev().take(25).collect();
            format!(
                "--- {} (pid {:?}) status {}\n{}",
                s.name,
                s.pid(),
                s.status(),
                tail.into_iter().rev().collect::<Vec<_>>().join("\n")
            )
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// Polls every running server's view into `history` until `stop`.
fn observer(
    servers: Arc<Mutex<Vec<(PathBuf, String)>>>,
    history: Arc<History>,
    stop: Arc<AtomicBool>,
) {
    while !stop.load(Ordering::Relaxed) {
        let targets = servers.lock().unwrap().clone();
        for (socket, who) in targets {
            if let Some(jobs) = jobs_on(&socket) {
                for j in jobs {
                    history.observe(&who, j.id.0, j.state);
                }
            }
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Observer names: a server and its process, so a restarted server (which
/// may briefly show an older applied state) counts as a new observer.
fn observers(servers: &[Server]) -> Vec<(PathBuf, String)> {
    servers
        .iter()
        .filter_map(|s| {
            s.pid()
                .map(|p| (s.socket.clone(), format!("{}#{p}", s.name)))
        })
        .collect()
}

#[test]
fn twenty_leader_kills_under_load_lose_nothing_and_start_nothing_twice() {
    if !require_root("twenty_leader_kills_under_load_lose_nothing_and_start_nothing_twice") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let work = dir.path().join("work");
    std::fs::create_dir_all(&work).unwrap();
    let w = work.to_str().unwrap().to_string();
    let starts = work.join("starts");
    let mut set = ServerSet::start_with(&dir.path().join("servers"), 3, RAFT_FAST);
    let li = set.leader();
    let token = set.servers[li].ok(&["token", "create"]).trim().to_string();
    let _agents: Vec<Agent> = (1..=2)
        .map(|i| {
            let name = format!("n{i}");
            Agent::start(&set.servers[li], &dir.path().join(&name), &name, 4, &token)
        })
        .collect();
    let history = Arc::new(History::new());

    // Long-running tasks that must survive every failover untouched.
    let mut sleepers = Vec::new();
    for i in 0..4 {
        let prog = recording(&starts, "exec sleep 600");
        let o = submit(
            &history,
            &set.servers[li].socket,
            &format!("sleeper-{i}"),
            &["--gpus-per-node", "1", "-D", &w, "--", "sh", "-c", &prog],
        );
        let Outcome::Ok(id) = o else {
            panic!("sleeper not acknowledged: {o:?}")
        };
        sleepers.push(id);
    }
    for id in &sleepers {
        wait_for("the sleepers to start", LONG, || {
            start_counts(&starts).contains_key(id)
        });
    }

    // A steady stream of short jobs from a client that picks a live server.
    let sockets: Arc<Mutex<Vec<(PathBuf, String)>>> = Arc::new(Mutex::new(observers(&set.servers)));
    let stop = Arc::new(AtomicBool::new(false));
    let submitted = Arc::new(AtomicUsize::new(0));
    let stream = {
        let (sockets, history, stop, submitted) = (
            sockets.clone(),
            history.clone(),
            stop.clone(),
            submitted.clone(),
        );
        let (w, prog) = (w.clone(), recording(&starts, "true"));
        std::thread::spawn(move || {
            let mut n = 0usize;
            while !stop.load(Ordering::Relaxed) {
                let targets = sockets.lock().unwrap().clone();
                let (socket, _) = &targets[n % targets.len()];
                let key = format!("stream-{n}");
                submit(
                    &history,
                    socket,
                    &key,
                    &["--gpus-per-node", "1", "-D", &w, "--", "sh", "-c", &prog],
                );
                submitted.fetch_add(1, Ordering::Relaxed);
                n += 1;
                // About what two debug-build agents with four GPUs each run
                // while their leader is killed again and again: a faster
                // stream only grows a backlog that the history check waits on.
                std::thread::sleep(Duration::from_millis(100));
            }
        })
    };
    let watcher = {
        let (sockets, history, stop) = (sockets.clone(), history.clone(), stop.clone());
        std::thread::spawn(move || observer(sockets, history, stop))
    };

    let began = Instant::now();
    for kill in 0..20 {
        let old = set.leader();
        let round = Instant::now();
        set.servers[old].kill();
        *sockets.lock().unwrap() = observers(&set.servers);
        // A new leader takes writes, and schedules: a job submitted to it
        // directly leaves PENDING.
        let mut probe = None;
        let mut attempt = 0;
        let since = Instant::now();
        let mut last = None;
        wait_for(&format!("a new leader after kill {kill}"), LONG, || {
            if since.elapsed() > LONG - Duration::from_secs(1) {
                panic!(
                    "no leader took a write after kill {kill} (last: {last:?})\n{}",
                    dump(&set.servers)
                );
            }
            let Some(l) = self_leader(&set.servers) else {
                return false;
            };
            attempt += 1;
            // Every attempt is its own submission: a refused one must stay absent.
            let key = format!("probe-{kill}-{attempt}");
            let o = submit(
                &history,
                &set.servers[l].socket,
                &key,
                &[
                    "--gpus-per-node",
                    "1",
                    // Ahead of the stream's backlog: the new leader schedules
                    // it as soon as a GPU is free.
                    "--nice",
                    "-10000",
                    "-D",
                    &w,
                    "--",
                    "sh",
                    "-c",
                    &recording(&starts, "true"),
                ],
            );
            match o {
                Outcome::Ok(id) => {
                    probe = Some((l, id));
                    true
                }
                other => {
                    last = Some(other);
                    false
                }
            }
        });
        let (l, id) = probe.unwrap();
        let written = round.elapsed();
        wait_for(
            &format!("probe {id} to be scheduled after kill {kill}"),
            LONG,
            || {
                jobs_on(&set.servers[l].socket)
                    .and_then(|js| js.into_iter().find(|j| j.id.0 == id))
                    .is_some_and(|j| j.state != JobState::Pending)
            },
        );
        let scheduled = round.elapsed();
        set.servers[old].start();
        set.wait_members(3);
        *sockets.lock().unwrap() = observers(&set.servers);
        eprintln!(
            "kill {kill}: {} down, a write after {written:.2?}, it was scheduled after \
             {scheduled:.2?}, all three members after {:.2?}",
            set.servers[old].name,
            round.elapsed()
        );
    }
    stop.store(true, Ordering::Relaxed);
    eprintln!("20 kills in {:.1?}", began.elapsed());
    stream.join().unwrap();
    watcher.join().unwrap();

    // Everything acknowledged runs to its end once the dust settles.
    let leader = set.leader();
    let drain = Instant::now();
    wait_for(
        "every acknowledged short job to complete",
        Duration::from_secs(180),
        || {
            jobs_on(&set.servers[leader].socket).is_some_and(|js| {
                js.iter()
                    .filter(|j| !sleepers.contains(&j.id.0))
                    .all(|j| j.state.is_final())
            })
        },
    );
    eprintln!(
        "the short jobs completed {:.1?} after the last kill",
        drain.elapsed()
    );
    let jobs = wait_converged(&set.servers);
    let (ok, fail, unknown) = history.counts();
    eprintln!(
        "{} submissions: {ok} acknowledged, {fail} refused, {unknown} unknown",
        submitted.load(Ordering::Relaxed)
    );
    assert!(
        ok >= 30,
        "too few acknowledged submissions to mean anything: {ok}"
    );
    if let Err(bad) = history.check(&FinalJob::all(&jobs)) {
        panic!("history violations:\n{}", bad.join("\n"));
    }
    for j in jobs.iter().filter(|j| !sleepers.contains(&j.id.0)) {
        assert_eq!(
            j.state,
            JobState::Completed,
            "job {} ended {}",
            j.id.0,
            j.state
        );
    }
    for id in &sleepers {
        let j = jobs.iter().find(|j| j.id.0 == *id).unwrap();
        assert_eq!(j.state, JobState::Running, "sleeper {id} is {}", j.state);
        if j.restart_count != 0 {
            let why: Vec<String> = set
                .servers
                .iter()
                .flat_map(|s| {
                    s.log()
                        .lines()
                        .filter(|l| {
                            l.contains("down") || l.contains("requeue") || l.contains("leader")
                        })
                        .map(|l| format!("{}: {l}", s.name))
                        .collect::<Vec<_>>()
                })
                .collect();
            panic!("sleeper {id} was restarted: {j:?}\n{}", why.join("\n"));
        }
    }
    assert_started_once(&starts);
}

#[test]
fn a_follower_answers_when_the_leader_it_forwarded_to_stops_answering() {
    let dir = tempfile::tempdir().unwrap();
    let set = ServerSet::start_with(&dir.path().join("servers"), 3, RAFT_FAST);
    let li = set.leader();
    let f = (li + 1) % 3;
    set.servers[li].freeze(true);
    // The frozen leader holds the forwarded request and never answers; its
    // QUIC connection would stay open for the default 10 s idle timeout.
    let began = Instant::now();
    let out = set.servers[f].cli(&["submit", "--parsable", "--hold", "--", "true"]);
    let took = began.elapsed();
    set.servers[li].freeze(false);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("went away") || stderr.contains("cannot reach the leader"),
        "{stderr}"
    );
    assert!(
        took < Duration::from_secs(8),
        "the follower held the client {took:?}, as long as QUIC's idle timeout: {stderr}"
    );
}

#[test]
fn a_follower_far_behind_catches_up_in_batches_that_fit_a_heartbeat() {
    let dir = tempfile::tempdir().unwrap();
    let set = ServerSet::start_with(&dir.path().join("servers"), 3, RAFT_FAST);
    let li = set.leader();
    let f = (li + 1) % 3;
    set.servers[f].freeze(true);
    // 400 entries of a few KB each (a submission carries its environment):
    // sent at once they take longer than the 50 ms heartbeat in a debug
    // build, and openraft would cancel and resend them forever.
    std::thread::scope(|s| {
        for k in 0..4 {
            let socket = set.servers[li].socket.clone();
            s.spawn(move || {
                for i in 0..100 {
                    let out = cli(
                        &socket,
                        &["submit", "--hold", "-J", &format!("j{k}-{i}"), "--", "true"],
                    );
                    assert!(out.status.success(), "{out:?}");
                }
            });
        }
    });
    set.servers[f].freeze(false);
    let end = set.servers[li].status()["last_log_index"].clone();
    wait_for("the stopped follower to catch up", LONG, || {
        set.servers[f].status()["applied_index"].as_u64() >= end.as_u64()
    });
}

#[test]
fn all_three_servers_killed_at_once_come_back_with_all_state() {
    if !require_root("all_three_servers_killed_at_once_come_back_with_all_state") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let work = dir.path().join("work");
    std::fs::create_dir_all(&work).unwrap();
    let w = work.to_str().unwrap().to_string();
    let starts = work.join("starts");
    let mut set = ServerSet::start_with(&dir.path().join("servers"), 3, RAFT_FAST);
    let li = set.leader();
    let token = set.servers[li].ok(&["token", "create"]).trim().to_string();
    let _agent = Agent::start(&set.servers[li], &dir.path().join("n1"), "n1", 4, &token);
    let history = History::new();
    let sock = set.servers[li].socket.clone();
    let mut running = Vec::new();
    for i in 0..2 {
        let prog = recording(&starts, "exec sleep 600");
        let args = ["--gpus-per-node", "1", "-D", &w, "--", "sh", "-c", &prog];
        let Outcome::Ok(id) = submit(&history, &sock, &format!("sleeper-{i}"), &args) else {
            panic!("not acknowledged")
        };
        running.push(id);
    }
    // With a time limit: the big job below sorts first (job size counts in
    // the default priority), and only jobs that end before its reservation
    // may start ahead of it (backfill).
    for i in 0..30 {
        let args = [
            "--gpus-per-node",
            "1",
            "--time",
            "5:00",
            "-D",
            &w,
            "--",
            "true",
        ];
        let o = submit(&history, &sock, &format!("short-{i}"), &args);
        assert!(matches!(o, Outcome::Ok(_)), "{o:?}");
    }
    // Something that stays pending: more GPUs than free.
    let args = ["--gpus-per-node", "4", "-D", &w, "--", "true"];
    let Outcome::Ok(pending) = submit(&history, &sock, "big", &args) else {
        panic!()
    };
    for id in &running {
        wait_for("the sleepers to start", LONG, || {
            start_counts(&starts).contains_key(id)
        });
    }
    wait_for("the short jobs to complete", LONG, || {
        jobs_on(&sock).is_some_and(|js| {
            js.iter()
                .filter(|j| j.spec.name.starts_with("short-"))
                .all(|j| j.state == JobState::Completed)
        })
    });
    let before = wait_converged(&set.servers);

    for s in set.servers.iter_mut() {
        s.kill();
    }
    std::thread::sleep(Duration::from_secs(3));
    for s in set.servers.iter_mut() {
        s.spawn();
    }
    set.wait_members(3);
    let leader = set.leader();
    // The agent reconnects and the state returns whole.
    wait_for("the agent to reconnect", LONG, || {
        let out = set.servers[leader].cli(&["nodes", "--json"]);
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
        v.as_array().is_some_and(|ns| {
            ns.iter()
                .any(|n| n["name"] == "n1" && n["connected"] == true)
        })
    });
    let after = wait_converged(&set.servers);
    let key = |js: &[Job]| -> Vec<(u64, String, JobState, u32)> {
        js.iter()
            .map(|j| (j.id.0, j.spec.name.clone(), j.state, j.restart_count))
            .collect()
    };
    assert_eq!(
        key(&before),
        key(&after),
        "the state after the restart differs"
    );
    for id in &running {
        let j = after.iter().find(|j| j.id.0 == *id).unwrap();
        assert_eq!(j.state, JobState::Running);
        assert_eq!(j.restart_count, 0, "sleeper {id} was restarted");
    }
    assert_eq!(
        after.iter().find(|j| j.id.0 == pending).unwrap().state,
        JobState::Pending
    );
    // New work is accepted and runs (once the big job no longer holds the
    // queue's head with its reservation).
    set.servers[leader].ok(&["cancel", &pending.to_string()]);
    let args = ["--gpus-per-node", "1", "-D", &w, "--", "true"];
    let Outcome::Ok(id) = submit(&history, &set.servers[leader].socket, "after", &args) else {
        panic!("no write after the restart")
    };
    wait_for("the new job to complete", LONG, || {
        jobs_on(&set.servers[leader].socket)
            .and_then(|js| js.into_iter().find(|j| j.id.0 == id))
            .is_some_and(|j| j.state == JobState::Completed)
    });
    let jobs = jobs_on(&set.servers[leader].socket).unwrap();
    if let Err(bad) = history.check(&FinalJob::all(&jobs)) {
        panic!("history violations:\n{}", bad.join("\n"));
    }
    assert_started_once(&starts);
}

#[test]
fn a_partitioned_leader_stops_writing_and_the_majority_carries_on() {
    if !require_root("a_partitioned_leader_stops_writing_and_the_majority_carries_on") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let work = dir.path().join("work");
    std::fs::create_dir_all(&work).unwrap();
    let w = work.to_str().unwrap().to_string();
    let starts = work.join("starts");
    let mut net = Net::new("part", 141);
    let hosts: Vec<_> = (0..4).map(|_| net.add_host()).collect();
    let set = netns::server_set(&dir.path().join("servers"), &hosts[..3], RAFT_FAST);
    let li = set.leader();
    let token = set.servers[li].ok(&["token", "create"]).trim().to_string();
    let _agent = netns::agent(
        &set.servers[li],
        &hosts[3],
        &dir.path().join("n1"),
        "n1",
        4,
        &token,
    );
    let history = History::new();
    let prog = recording(&starts, "exec sleep 600");
    let args = ["--gpus-per-node", "1", "-D", &w, "--", "sh", "-c", &prog];
    let Outcome::Ok(sleeper) = submit(&history, &set.servers[li].socket, "sleeper", &args) else {
        panic!("not acknowledged")
    };
    wait_for("the sleeper to start", LONG, || {
        start_counts(&starts).contains_key(&sleeper)
    });

    let old = &set.servers[li];
    net.cut(&hosts[li]);
    // A write that reaches the old leader just after the cut cannot commit:
    // it is refused, or times out as unknown, but never acknowledged.
    let short = ["--gpus-per-node", "1", "-D", &w, "--", "true"];
    let o = submit(&history, &old.socket, "during-cut-0", &short);
    assert!(
        !matches!(o, Outcome::Ok(_)),
        "the cut-off leader acknowledged a write: {o:?}"
    );
    // Once its lease has run out it says it is not the leader.
    let mut n = 1;
    wait_for(
        "the old leader to refuse writes as not leader",
        LONG,
        || {
            n += 1;
            match submit(&history, &old.socket, &format!("during-cut-{n}"), &short) {
                Outcome::Fail(why) => why.contains("not leader"),
                Outcome::Ok(id) => panic!("the cut-off leader acknowledged job {id}"),
                Outcome::Unknown(_) => false,
            }
        },
    );
    // The majority elects a leader and keeps scheduling, with the agent
    // (which only ever dialled the old leader) now connected to it.
    let others: Vec<usize> = (0..3).filter(|i| *i != li).collect();
    let mut new_leader = None;
    wait_for("a leader among the majority", LONG, || {
        new_leader = others.iter().copied().find(|i| {
            let s = &set.servers[*i];
            s.status()["leader"] == s.name.as_str()
        });
        new_leader.is_some()
    });
    let nl = new_leader.unwrap();
    let prog2 = recording(&starts, "true");
    let args2 = ["--gpus-per-node", "1", "-D", &w, "--", "sh", "-c", &prog2];
    let Outcome::Ok(after) = submit(&history, &set.servers[nl].socket, "majority", &args2) else {
        panic!("the majority's leader did not take a write")
    };
    wait_for("the majority to schedule and run a job", LONG, || {
        jobs_on(&set.servers[nl].socket)
            .and_then(|js| js.into_iter().find(|j| j.id.0 == after))
            .is_some_and(|j| j.state == JobState::Completed)
    });

    net.heal(&hosts[li]);
    let new_name = set.servers[nl].name.clone();
    wait_for("the old leader to follow the new one", LONG, || {
        old.status()["leader"] == new_name.as_str()
    });
    let jobs = wait_converged(&set.servers);
    if let Err(bad) = history.check(&FinalJob::all(&jobs)) {
        panic!("history violations:\n{}", bad.join("\n"));
    }
    let s = jobs.iter().find(|j| j.id.0 == sleeper).unwrap();
    assert_eq!((s.state, s.restart_count), (JobState::Running, 0));
    assert_started_once(&starts);
}

#[test]
fn an_agent_follows_the_leader_when_it_dies_and_finds_it_again_after_a_restart() {
    if !require_root("an_agent_follows_the_leader_when_it_dies_and_finds_it_again_after_a_restart")
    {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let work = dir.path().join("work");
    std::fs::create_dir_all(&work).unwrap();
    let w = work.to_str().unwrap().to_string();
    let starts = work.join("starts");
    let mut net = Net::new("agent", 142);
    let hosts: Vec<_> = (0..4).map(|_| net.add_host()).collect();
    let mut set = netns::server_set(&dir.path().join("servers"), &hosts[..3], RAFT_FAST);
    let li = set.leader();
    let token = set.servers[li].ok(&["token", "create"]).trim().to_string();
    // The agent is only ever told the leader's address; it learns the rest.
    let mut agent = netns::agent(
        &set.servers[li],
        &hosts[3],
        &dir.path().join("n1"),
        "n1",
        4,
        &token,
    );
    let history = History::new();
    let prog = recording(&starts, "exec sleep 600");
    let args = ["--gpus-per-node", "1", "-D", &w, "--", "sh", "-c", &prog];
    let Outcome::Ok(sleeper) = submit(&history, &set.servers[li].socket, "sleeper", &args) else {
        panic!("not acknowledged")
    };
    wait_for("the sleeper to start", LONG, || {
        start_counts(&starts).contains_key(&sleeper)
    });

    set.servers[li].kill();
    let connected_to_new_leader = |set: &ServerSet| {
        let Some(l) = self_leader(&set.servers) else {
            return false;
        };
        let out = set.servers[l].cli(&["nodes", "--json"]);
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
        v.as_array().is_some_and(|ns| {
            ns.iter()
                .any(|n| n["name"] == "n1" && n["connected"] == true)
        })
    };
    wait_for("the agent to connect to the new leader", LONG, || {
        connected_to_new_leader(&set)
    });
    // Restarted while the only server it was configured with is dead, the
    // agent finds the cluster from the servers it saved.
    agent.kill();
    agent.spawn();
    std::thread::sleep(Duration::from_secs(2));
    wait_for("the restarted agent to connect", LONG, || {
        connected_to_new_leader(&set)
    });
    let l = self_leader(&set.servers).unwrap();
    let j = jobs_on(&set.servers[l].socket)
        .unwrap()
        .into_iter()
        .find(|j| j.id.0 == sleeper)
        .unwrap();
    assert_eq!((j.state, j.restart_count), (JobState::Running, 0));
    assert_started_once(&starts);
    let args2 = ["--gpus-per-node", "1", "-D", &w, "--", "true"];
    let Outcome::Ok(id) = submit(&history, &set.servers[l].socket, "after", &args2) else {
        panic!("no write on the new leader")
    };
    wait_for("a job to run on the failed-over agent", LONG, || {
        jobs_on(&set.servers[l].socket)
            .and_then(|js| js.into_iter().find(|j| j.id.0 == id))
            .is_some_and(|j| j.state == JobState::Completed)
    });
}

/// The history checker's own tests: histories that must pass and must fail.
mod history_checker {
    use super::common::history::*;
    use gpuq::model::JobState::{self, *};

    fn op(key: &str, outcome: Option<Outcome>) -> Op {
        Op {
            key: key.into(),
            outcome,
            ..Op::default()
        }
    }

    fn job(id: u64, name: &str, state: JobState) -> FinalJob {
        FinalJob::new(id, name, state)
    }

    fn seen(observer: &str, job: u64, state: JobState) -> Observation {
        Observation {
            observer: observer.into(),
            job,
            state,
        }
    }

    fn fails_with(r: Result<(), Vec<String>>, needle: &str) {
        let errs = r.expect_err("the checker must refuse this history");
        assert!(
            errs.iter().any(|e| e.contains(needle)),
            "expected a violation mentioning {needle:?}, got {errs:?}"
        );
    }

    #[test]
    fn a_clean_history_passes() {
        let ops = [
            op("a", Some(Outcome::Ok(1))),
            op("b", Some(Outcome::Unknown("timeout".into()))),
            op("c", Some(Outcome::Unknown("timeout".into()))),
            op("d", Some(Outcome::Fail("not leader".into()))),
            op("e", None),
        ];
        let obs = [
            seen("s1#0", 1, Pending),
            seen("s1#0", 1, Running),
            // Another observer lags: it may see an older state later.
            seen("s2#0", 1, Pending),
            seen("s2#0", 1, Completed),
        ];
        let jobs = [job(1, "a", Completed), job(2, "b", Pending)];
        check(&ops, &obs, &jobs).unwrap();
    }

    #[test]
    fn a_lost_acknowledged_job_fails() {
        let ops = [op("a", Some(Outcome::Ok(1)))];
        fails_with(check(&ops, &[], &[]), "was lost");
    }

    #[test]
    fn an_acknowledged_job_present_twice_fails() {
        let ops = [op("a", Some(Outcome::Ok(1)))];
        let jobs = [job(1, "a", Pending), job(2, "a", Pending)];
        fails_with(check(&ops, &[], &jobs), "exists 2 times");
    }

    #[test]
    fn an_id_given_twice_fails() {
        let ops = [op("a", Some(Outcome::Ok(7))), op("b", Some(Outcome::Ok(7)))];
        let jobs = [job(7, "a", Pending)];
        fails_with(check(&ops, &[], &jobs), "given to two submissions");
    }

    #[test]
    fn an_unknown_submission_present_twice_fails() {
        let ops = [op("u", Some(Outcome::Unknown("lost answer".into())))];
        let jobs = [job(1, "u", Pending), job(2, "u", Running)];
        fails_with(check(&ops, &[], &jobs), "exists 2 times");
    }

    #[test]
    fn a_failed_submission_that_exists_fails() {
        let ops = [op("f", Some(Outcome::Fail("not leader".into())))];
        fails_with(
            check(&ops, &[], &[job(3, "f", Pending)]),
            "failed (not leader) yet exists",
        );
    }

    #[test]
    fn a_forbidden_transition_fails() {
        let obs = [seen("s1#0", 1, Completed), seen("s1#0", 1, Running)];
        fails_with(
            check(&[], &obs, &[job(1, "a", Completed)]),
            "COMPLETED -> RUNNING",
        );
        // Requeue (RUNNING -> PENDING) is allowed; leaving a final state is not.
        let obs = [
            seen("s1#0", 2, Running),
            seen("s1#0", 2, Pending),
            seen("s1#0", 2, Cancelled),
        ];
        check(&[], &obs, &[job(2, "b", Cancelled)]).unwrap();
        let obs = [seen("s3#1", 4, Cancelled)];
        fails_with(check(&[], &obs, &[job(4, "c", Pending)]), "ended PENDING");
    }
}
