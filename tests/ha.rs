//! The control plane's membership with real `gpuq server` processes on
//! loopback: servers join with a server token, restart without flags, are
//! refused under a name in use, are removed and rejoin after a wipe, catching
//! up by snapshot.

mod common;

use common::{stderr, Server, ServerSet};

/// Submits a job that waits (no agents) and returns its id.
fn submit(s: &Server, name: &str) -> u64 {
    let out = s.ok(&["submit", "--parsable", "--job-name", name, "--", "true"]);
    out.trim()
        .parse()
        .unwrap_or_else(|_| panic!("submit printed {out:?}"))
}

/// The ids of all jobs as `s` sees them.
fn job_ids(s: &Server) -> Vec<u64> {
    let v: serde_json::Value = serde_json::from_str(&s.ok(&["queue", "--all", "--json"])).unwrap();
    let mut ids: Vec<u64> = v
        .as_array()
        .unwrap()
        .iter()
        .map(|j| j["id"].as_u64().unwrap())
        .collect();
    ids.sort();
    ids
}

#[test]
fn servers_join_restart_without_flags_and_forward_writes() {
    let dir = tempfile::tempdir().unwrap();
    let mut set = ServerSet::start(dir.path(), 3);
    let a = submit(&set.servers[0], "on-s1");
    // A write on a follower is forwarded to the leader.
    let b = submit(&set.servers[2], "on-s3");
    assert_ne!(a, b);
    common::wait_for(
        "every server to hold both jobs",
        std::time::Duration::from_secs(20),
        || set.servers.iter().all(|s| job_ids(s) == vec![a, b]),
    );

    // A joined server restarts from its data dir alone.
    set.servers[1].kill();
    set.servers[1].start();
    assert!(set.servers[1].mode.is_empty());
    set.wait_members(3);
    common::wait_for(
        "the restarted server to hold both jobs",
        std::time::Duration::from_secs(20),
        || job_ids(&set.servers[1]) == vec![a, b],
    );
    // The leader hears from every member, and all are healthy.
    let leader = set.leader();
    let v = set.servers[leader].status();
    for m in v["members"].as_array().unwrap() {
        assert!(m["last_contact_ms"].is_u64(), "{v}");
        assert!(m["problem"].is_null(), "{v}");
    }
    let status = set.servers[1].status();
    let names: Vec<&str> = status["members"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["name"].as_str().unwrap())
        .collect();
    assert_eq!(names.len(), 3, "{status}");
    for n in ["s1", "s2", "s3"] {
        assert!(names.contains(&n), "{status}");
    }
}

#[test]
fn joins_that_cannot_work_are_refused_with_a_reason() {
    let dir = tempfile::tempdir().unwrap();
    let s1 = Server::bootstrap(&dir.path().join("s1"));
    let token = s1.server_token();

    // A second server under the name the bootstrap server has.
    let mut dup = Server::joining(&dir.path().join("dup"), "s1", &s1.addr(), &token);
    let (st, log) = dup.run_to_exit();
    assert!(!st.success());
    assert!(
        log.contains("already a member") && log.contains("gpuq cluster remove s1"),
        "{log}"
    );

    // An agent token does not make a server.
    let agent_token = s1
        .ok(&["token", "create", "--role", "agent"])
        .trim()
        .to_string();
    let mut wrong = Server::joining(&dir.path().join("wrong"), "s9", &s1.addr(), &agent_token);
    let (st, log) = wrong.run_to_exit();
    assert!(!st.success());
    assert!(log.contains("for agent daemons"), "{log}");

    // A token cut when copied.
    let mut cut = Server::joining(
        &dir.path().join("cut"),
        "s8",
        &s1.addr(),
        &token[..token.len() - 3],
    );
    let (st, log) = cut.run_to_exit();
    assert!(!st.success());
    assert!(log.contains("--token is not usable"), "{log}");

    // An expired server token.
    let short = s1
        .ok(&["token", "create", "--role", "server", "--ttl", "1s"])
        .trim()
        .to_string();
    std::thread::sleep(std::time::Duration::from_millis(1500));
    let mut late = Server::joining(&dir.path().join("late"), "s7", &s1.addr(), &short);
    let (st, log) = late.run_to_exit();
    assert!(!st.success());
    assert!(log.contains("expired"), "{log}");

    // Nothing of these attempts entered the membership.
    let members = s1.status()["members"].as_array().unwrap().len();
    assert_eq!(members, 1);

    // --join is not a HOST:PORT.
    let out = common::gpuq_command()
        .args(["server", "--join", "nowhere", "--token", &token])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(stderr(&out).contains("--join"), "{}", stderr(&out));
}

#[test]
fn a_wiped_server_is_removed_and_rejoins_by_snapshot() {
    let dir = tempfile::tempdir().unwrap();
    // Snapshots often, and keep little log behind them: a rejoining server
    // cannot catch up from the log.
    let raft = "[server.raft]\nsnapshot_after_logs = 40\nlogs_kept_after_snapshot = 5\n";
    let mut set = ServerSet::start_with(dir.path(), 3, raft);
    let mut ids = Vec::new();
    for i in 0..150 {
        ids.push(submit(&set.servers[i % 3], &format!("j{i}")));
    }
    ids.sort();

    // s3's disk is lost; the leader flags it.
    set.servers[2].kill();
    let leader = set.leader();
    common::wait_for(
        "the leader to flag s3 unreachable",
        std::time::Duration::from_secs(20),
        || {
            set.servers[leader].status()["members"]
                .as_array()
                .unwrap()
                .iter()
                .any(|m| {
                    m["name"] == "s3"
                        && m["problem"]
                            .as_str()
                            .is_some_and(|p| p.contains("unreachable"))
                })
        },
    );
    let table = set.servers[leader].ok(&["cluster"]);
    assert!(table.contains("UNHEALTHY: unreachable"), "{table}");
    std::fs::remove_dir_all(set.servers[2].dir.join("data")).unwrap();

    // Its name is still a member: a fresh join under it is refused.
    let token = set.servers[0].server_token();
    let wiped = set.servers.pop().unwrap();
    let mut again = Server::joining(&wiped.dir, "s3", &set.servers[0].addr(), &token);
    again.extra_config = raft.into();
    let (st, log) = again.run_to_exit();
    assert!(!st.success());
    assert!(log.contains("gpuq cluster remove s3"), "{log}");
    std::fs::remove_dir_all(wiped.dir.join("data")).unwrap();

    // Removing it: unknown names and the last voter are refused.
    let out = set.servers[0].cli(&["cluster", "remove", "nosuch"]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("no server named nosuch"),
        "{}",
        stderr(&out)
    );
    // Through a follower, forwarded to the leader.
    set.servers[1].ok(&["cluster", "remove", "s3"]);
    set.wait_members(2);

    // More work while it is away, then it rejoins with a fresh token.
    for i in 150..200 {
        ids.push(submit(&set.servers[i % 2], &format!("j{i}")));
    }
    ids.sort();
    // The log it would need is gone: only a snapshot can bring it back.
    let leader = set.leader();
    common::wait_for(
        "the leader to purge its log behind a snapshot",
        std::time::Duration::from_secs(20),
        || set.servers[leader].status()["purged_index"].as_u64() > Some(0),
    );
    let token = set.servers[1].server_token();
    let s3 = Server::join_with(&wiped.dir, "s3", &set.servers[1], &token, raft);
    drop(wiped);
    common::wait_for(
        "the rejoined server to hold every job",
        std::time::Duration::from_secs(30),
        || job_ids(&s3) == ids,
    );
    let v = s3.status();
    assert!(
        v["snapshot_index"].as_u64().is_some(),
        "it caught up without a snapshot: {v}"
    );
    set.servers.push(s3);
    set.wait_members(3);

    // The last voter cannot be removed.
    set.servers[0].ok(&["cluster", "remove", "s3"]);
    set.servers[2].kill();
    set.servers[0].ok(&["cluster", "remove", "s2"]);
    set.servers[1].kill();
    set.wait_members(1);
    let out = set.servers[0].cli(&["cluster", "remove", "s1"]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(stderr(&out).contains("last voter"), "{}", stderr(&out));
}

#[test]
fn servers_started_at_once_form_one_cluster() {
    let dir = tempfile::tempdir().unwrap();
    let set = ServerSet::form(dir.path(), 3);
    let a = submit(&set.servers[2], "formed");
    common::wait_for(
        "every server to hold the job",
        std::time::Duration::from_secs(20),
        || set.servers.iter().all(|s| job_ids(s) == vec![a]),
    );
    // One cluster: every server's data dir holds the same CA.
    let ca: Vec<String> = set
        .servers
        .iter()
        .map(|s| std::fs::read_to_string(s.dir.join("data/tls/ca.crt")).unwrap())
        .collect();
    assert!(ca.iter().all(|c| c == &ca[0]));
    let seed = set
        .servers
        .iter()
        .min_by_key(|s| s.addr().parse::<std::net::SocketAddr>().unwrap())
        .unwrap();
    assert!(seed.dir.join("data/tls/ca.key").exists());

    // Once formed, the seed admits no more servers by the secret.
    let secret = dir.path().join("bootstrap.secret");
    let mut peers: Vec<String> = set.servers.iter().map(|s| s.addr()).collect();
    let mut s4 = Server::joining(&dir.path().join("s4"), "s4", "", "");
    while s4.port < seed.port {
        s4.port = common::free_port();
    }
    peers.push(s4.addr());
    s4.mode = ServerSet::form_args(4, &peers.join(","), &secret);
    let (st, log) = s4.run_to_exit();
    assert!(!st.success());
    assert!(
        log.contains("refused") && log.contains("has formed"),
        "{log}"
    );

    // Plans that cannot form a cluster.
    let mut bad = Server::joining(&dir.path().join("bad"), "bad", "", "");
    bad.mode = ServerSet::form_args(3, &peers[..2].join(","), &secret);
    let (st, log) = bad.run_to_exit();
    assert!(!st.success());
    assert!(
        log.contains("--bootstrap-expect 3 but --peers lists 2"),
        "{log}"
    );
    bad.mode = ServerSet::form_args(2, &peers[..2].join(","), &secret);
    let (st, log) = bad.run_to_exit();
    assert!(!st.success());
    assert!(
        log.contains("does not contain this server's address"),
        "{log}"
    );
    let out = common::gpuq_command()
        .args(["server", "--bootstrap-expect", "3", "--peers", "a:7420"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(stderr(&out).contains("--peers"), "{}", stderr(&out));
}

#[test]
fn a_saved_snapshot_restores_into_a_new_cluster() {
    let dir = tempfile::tempdir().unwrap();
    let mut set = ServerSet::start(dir.path(), 3);
    let mut ids: Vec<u64> = (0..5)
        .map(|i| submit(&set.servers[i % 3], &format!("b{i}")))
        .collect();
    set.servers[0].ok(&["cancel", &ids[0].to_string()]);
    common::wait_for(
        "a follower to hold every job",
        std::time::Duration::from_secs(20),
        || job_ids(&set.servers[1]) == ids,
    );
    // Saved on a follower.
    let file = dir.path().join("backup.gpuq");
    let out = set.servers[1].ok(&[
        "cluster",
        "snapshot",
        "save",
        file.to_str().unwrap(),
        "--json",
    ]);
    let saved: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(saved["jobs"], 5, "{out}");
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(&file).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);

    // The whole cluster is lost.
    for s in &mut set.servers {
        s.kill();
    }
    let mut r = Server::joining(&dir.path().join("r1"), "r1", "", "");
    let restore = |file: &std::path::Path, data: &std::path::Path, addr: &str| {
        common::gpuq_command()
            .args(["cluster", "snapshot", "restore"])
            .arg(file)
            .arg("--data-dir")
            .arg(data)
            .args(["--node-name", "r1", "--advertise", addr])
            .output()
            .unwrap()
    };
    // Garbage and truncated files are refused, and nothing is created.
    let garbage = dir.path().join("garbage");
    std::fs::write(&garbage, "hello").unwrap();
    let out = restore(&garbage, &r.dir.join("data"), &r.addr());
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains("not a gpuq backup"),
        "{}",
        stderr(&out)
    );
    let cut = dir.path().join("cut");
    let bytes = std::fs::read(&file).unwrap();
    std::fs::write(&cut, &bytes[..bytes.len() / 2]).unwrap();
    let out = restore(&cut, &r.dir.join("data"), &r.addr());
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains("truncated"), "{}", stderr(&out));
    assert!(!r.dir.join("data").join("node_id").exists());

    let out = restore(&file, &r.dir.join("data"), &r.addr());
    assert!(out.status.success(), "{}", stderr(&out));
    // Not over an existing data dir.
    let again = restore(&file, &r.dir.join("data"), &r.addr());
    assert_eq!(again.status.code(), Some(1));
    assert!(stderr(&again).contains("not empty"), "{}", stderr(&again));

    r.mode.clear();
    r.start();
    assert_eq!(job_ids(&r), ids);
    let v: serde_json::Value =
        serde_json::from_str(&r.ok(&["show", &ids[0].to_string(), "--json"])).unwrap();
    assert_eq!(v["state"], "CANCELLED", "{v}");
    let next = submit(&r, "after-restore");
    assert_eq!(next, ids.iter().max().unwrap() + 1);
    ids.push(next);
    // A one-voter cluster that others can join.
    let token = r.server_token();
    let r2 = Server::join(&dir.path().join("r2"), "r2", &r, &token);
    common::wait_for(
        "the joined server to hold every job",
        std::time::Duration::from_secs(20),
        || job_ids(&r2) == ids,
    );
}
