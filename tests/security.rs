//! What an ordinary local user, or the root of one node, can and cannot do
//! to the cluster, tried as an attacker would: read the servers' state,
//! become admin through a node's certificate, take a node's name, read
//! another user's secrets, or swell a daemon's memory through its socket.
//! Each test failed on the code before the fix it guards.

mod common;

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::time::Duration;

use common::{
    cli, cli_as, ensure_user, gpuq_command, require_root, shared_tempdir, stderr, Agent, Cluster,
    LoginAgent, Server,
};

const LONG: Duration = Duration::from_secs(60);

/// Every file and directory below `root`, with its mode.
fn tree(root: &Path) -> Vec<(std::path::PathBuf, u32, bool)> {
    let mut out = Vec::new();
    let mut todo = vec![root.to_path_buf()];
    while let Some(p) = todo.pop() {
        let meta = std::fs::symlink_metadata(&p).unwrap();
        out.push((p.clone(), meta.mode() & 0o7777, meta.is_dir()));
        if meta.is_dir() {
            for e in std::fs::read_dir(&p).unwrap() {
                todo.push(e.unwrap().path());
            }
        }
    }
    out
}

#[test]
fn a_servers_data_dir_and_state_are_closed_to_other_users() {
    if !require_root("a_servers_data_dir_and_state_are_closed_to_other_users") {
        return;
    }
    let dir = shared_tempdir();
    let server = Server::bootstrap(dir.path());
    let data = dir.path().join("data");
    let redb = data.join("gpuq.redb");
    assert_eq!(std::fs::metadata(&data).unwrap().mode() & 0o777, 0o700);
    assert_eq!(std::fs::metadata(&redb).unwrap().mode() & 0o777, 0o600);
    for (path, mode, _) in tree(&data) {
        assert_eq!(
            mode & 0o066,
            0,
            "{} is open to others ({mode:o})",
            path.display()
        );
    }
    // The replicated state holds the CA's key: `nobody` cannot even look.
    let out = std::process::Command::new("runuser")
        .args(["-u", "nobody", "--", "grep", "-ac", "BEGIN PRIVATE KEY"])
        .arg(&redb)
        .output()
        .expect("run runuser");
    assert!(!out.status.success(), "nobody read the state");
    assert!(
        stderr(&out).contains("Permission denied"),
        "{}",
        stderr(&out)
    );
    let mut server = server;
    server.kill();

    // A data dir left open is refused at start, naming it and the fix.
    std::fs::set_permissions(&data, std::fs::Permissions::from_mode(0o755)).unwrap();
    let (status, log) = server.run_to_exit();
    assert!(!status.success());
    assert!(
        log.contains(&format!("chmod 700 {}", data.display())),
        "{log}"
    );
}

#[test]
fn a_dev_cluster_keeps_its_secrets_closed_and_its_socket_reachable() {
    if !require_root("a_dev_cluster_keeps_its_secrets_closed_and_its_socket_reachable") {
        return;
    }
    let dir = shared_tempdir();
    let state = dir.path().join("dev");
    let _dev = common::KillOnDrop(
        gpuq_command()
            .args(["dev", "--nodes", "1", "--gpus-per-node", "2", "--dir"])
            .arg(&state)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("spawn gpuq dev"),
    );
    let socket = state.join("gpuq.sock");
    common::wait_for("gpuq dev to list its node", LONG, || {
        cli(&socket, &["nodes"]).status.success()
    });
    // Another user still reaches the socket (authorisation is by uid)...
    let alice = ensure_user("gpuqt-alice");
    let out = cli_as(&alice, &socket, &["queue"]);
    assert!(out.status.success(), "{}", stderr(&out));
    // ...and reads nothing of the server's or the agents' secrets.
    for (path, mode, _) in tree(&state) {
        // The socket is open by design; bin/ holds the Slurm command links
        // to the public binary.
        if path.ends_with("gpuq.sock") || path.starts_with(state.join("bin")) {
            continue;
        }
        assert_eq!(mode & 0o066, 0, "{} is open ({mode:o})", path.display());
    }
}

#[test]
fn root_on_a_login_or_compute_node_is_not_admin_of_the_cluster() {
    if !require_root("root_on_a_login_or_compute_node_is_not_admin_of_the_cluster") {
        return;
    }
    let dir = shared_tempdir();
    let server = Server::bootstrap(dir.path());
    let token = server.ok(&["token", "create"]).trim().to_string();
    let login = LoginAgent::join(&dir.path().join("login"), &server, &token)
        .unwrap_or_else(|o| panic!("join: {}", stderr(&o)));
    // Root on the login node: no server token, no drain, no policy change.
    for args in [
        &["token", "create", "--role", "server"][..],
        &["node", "drain", "n1", "--reason", "mine now"],
        &["admin", "qos", "add", "mine", "--priority", "100"],
    ] {
        let out = cli(&login.socket, args);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {}", stderr(&out));
        assert!(
            stderr(&out).contains("needs an admin"),
            "{args:?}: {}",
            stderr(&out)
        );
    }
    assert!(
        server.log().contains("refused"),
        "the refusal is logged with the peer's name"
    );
    // Root's ordinary requests still work from there.
    let out = cli(&login.socket, &["queue"]);
    assert!(out.status.success(), "{}", stderr(&out));
    // On the server itself root is admin.
    server.ok(&["token", "create", "--role", "server"]);
}

#[test]
fn the_servers_admin_users_are_admins_from_any_host() {
    let dir = shared_tempdir();
    let me = nix::unistd::User::from_uid(nix::unistd::Uid::effective())
        .unwrap()
        .unwrap()
        .name;
    // With this user named, their admin word from a login node counts
    // (only root, or an admin_group member there, is admin at all).
    if !require_root("the_servers_admin_users_are_admins_from_any_host") {
        return;
    }
    let server =
        Server::bootstrap_with_config(dir.path(), 10, &format!("admin_users = [\"{me}\"]"));
    let token = server.ok(&["token", "create"]).trim().to_string();
    let login = LoginAgent::join(&dir.path().join("login"), &server, &token)
        .unwrap_or_else(|o| panic!("join: {}", stderr(&o)));
    let out = cli(&login.socket, &["token", "create", "--ttl", "1h"]);
    assert!(out.status.success(), "{}", stderr(&out));
}

#[test]
fn a_node_name_belongs_to_its_machine_until_an_admin_replaces_it() {
    if !require_root("a_node_name_belongs_to_its_machine_until_an_admin_replaces_it") {
        return;
    }
    let dir = shared_tempdir();
    let c = Cluster::start(dir.path(), 1, 2);
    let token = c.server.ok(&["token", "create"]).trim().to_string();
    // A second machine joining as n1 (a registered name) gets no certificate.
    let imp = dir.path().join("imp");
    std::fs::create_dir_all(&imp).unwrap();
    let out = gpuq_command()
        .args(["agent", "--node-name", "n1", "--join"])
        .arg(c.server.addr())
        .args(["--token", &token, "--data-dir"])
        .arg(imp.join("data"))
        .arg("--socket")
        .arg(imp.join("agent.sock"))
        .stdin(std::process::Stdio::null())
        .output()
        .expect("run gpuq agent");
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("gpuq node replace n1"),
        "{}",
        stderr(&out)
    );
    assert!(!imp.join("data/tls/node.crt").exists());

    // A single-use token admits one machine.
    let once = c
        .server
        .ok(&["token", "create", "--uses", "1"])
        .trim()
        .to_string();
    let n2 = Agent::start(&c.server, &dir.path().join("n2"), "n2", 2, &once);
    let out = gpuq_command()
        .args(["agent", "--node-name", "n3", "--join"])
        .arg(c.server.addr())
        .args(["--token", &once, "--data-dir"])
        .arg(dir.path().join("n3/data"))
        .arg("--socket")
        .arg(dir.path().join("n3/agent.sock"))
        .stdin(std::process::Stdio::null())
        .output()
        .expect("run gpuq agent");
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("used as many times"),
        "{}",
        stderr(&out)
    );
    let list = c.server.ok(&["token", "list"]);
    assert!(list.contains("1/1") && list.contains("used up"), "{list}");
    drop(n2);

    // An admin lets a new machine take n1: it joins and registers, and the
    // old machine's certificate is refused from then on.
    let mut agents = c.agents;
    let mut old = agents.remove(0);
    old.kill();
    c.server.ok(&["node", "replace", "n1"]);
    let new = Agent::start(&c.server, &dir.path().join("n1-new"), "n1", 2, &token);
    // (n1 is up already from the old machine: wait for the new one itself.)
    common::wait_for("the new n1 to register", LONG, || {
        new.log().contains("connected to the leader")
    });
    drop(new);
    old.spawn();
    let deadline = std::time::Instant::now() + LONG;
    while !old.log().contains("registered with another certificate") {
        assert!(
            std::time::Instant::now() < deadline,
            "the old n1 was not refused in {LONG:?}; its log:\n{}",
            old.log()
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    let nodes: serde_json::Value =
        serde_json::from_str(&c.server.ok(&["nodes", "--json"])).unwrap();
    let n1 = nodes
        .as_array()
        .unwrap()
        .iter()
        .find(|n| n["name"] == "n1")
        .unwrap()
        .clone();
    assert_eq!(n1["connected"], false, "{n1}");
}

#[test]
fn another_users_job_shows_no_environment_or_script() {
    if !require_root("another_users_job_shows_no_environment_or_script") {
        return;
    }
    let dir = shared_tempdir();
    let c = Cluster::start(dir.path(), 1, 2);
    let script = dir.path().join("job.sh");
    std::fs::write(
        &script,
        "#!/bin/sh\nexport DB_PASSWORD=hunter2-in-the-script\nsleep 30\n",
    )
    .unwrap();
    let out = common::cli_env(
        &c.server.socket,
        &[
            "submit",
            "--parsable",
            "-D",
            dir.path().to_str().unwrap(),
            script.to_str().unwrap(),
        ],
        &[("API_KEY", "sk-secret-in-the-env")],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let id = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let secrets = ["hunter2-in-the-script", "sk-secret-in-the-env"];
    // The owner (and admins) see both.
    let own = c.server.ok(&["show", &id, "--json"]);
    for s in secrets {
        assert!(own.contains(s), "the owner sees {s}");
    }
    // Another user sees the job, but neither.
    let alice = ensure_user("gpuqt-alice");
    for args in [
        &["show", id.as_str(), "--json"][..],
        &["show", id.as_str()],
        &["queue", "--all", "--json"],
    ] {
        let out = cli_as(&alice, &c.server.socket, args);
        assert!(out.status.success(), "{args:?}: {}", stderr(&out));
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(text.contains(&id), "{args:?}: alice sees the job: {text}");
        for s in secrets {
            assert!(!text.contains(s), "{args:?}: alice saw {s}");
        }
    }
    c.server.ok(&["cancel", &id]);
}

#[test]
fn private_jobs_hides_other_users_jobs() {
    if !require_root("private_jobs_hides_other_users_jobs") {
        return;
    }
    let dir = shared_tempdir();
    let c = Cluster::start_with_config(dir.path(), 1, 2, 10, "private_jobs = true");
    let id = c.submit(&["-D", dir.path().to_str().unwrap(), "--", "true"]);
    c.wait_state(&id, "COMPLETED", LONG);
    let alice = ensure_user("gpuqt-alice");
    let out = cli_as(&alice, &c.server.socket, &["queue", "--all", "--json"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let jobs: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(jobs.as_array().unwrap().len(), 0, "{jobs}");
    let out = cli_as(&alice, &c.server.socket, &["show", &id]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(stderr(&out).contains("does not exist"), "{}", stderr(&out));
    let out = cli_as(&alice, &c.server.socket, &["acct", "--json"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(!String::from_utf8_lossy(&out.stdout).contains(&format!("\"id\":{id}")));
    // The owner still sees it.
    assert!(c.server.ok(&["queue", "--all"]).contains(&id));
}

#[test]
fn a_fifo_or_directory_as_output_is_refused_at_submit() {
    let dir = tempfile::tempdir().unwrap();
    let c = Cluster::start(dir.path(), 1, 2);
    let fifo = dir.path().join("pipe");
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o644)).unwrap();
    for (out, what) in [("pipe", "named pipe"), (".", "directory")] {
        let res = c.server.cli(&[
            "submit",
            "-D",
            dir.path().to_str().unwrap(),
            "--output",
            out,
            "--",
            "true",
        ]);
        assert_eq!(res.status.code(), Some(1), "{}", stderr(&res));
        assert!(stderr(&res).contains(what), "{}", stderr(&res));
    }
    // /dev/null is a fine place to drop output.
    let id = c.submit(&["--output", "/dev/null", "--", "true"]);
    c.wait_state(&id, "COMPLETED", LONG);
}

/// The daemon's resident memory in KiB.
fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap()
}

#[test]
fn sixty_oversized_requests_from_one_user_leave_the_daemons_memory_flat() {
    if !require_root("sixty_oversized_requests_from_one_user_leave_the_daemons_memory_flat") {
        return;
    }
    let dir = shared_tempdir();
    let server = Server::bootstrap(dir.path());
    let pid = server.pid().unwrap();
    let before = rss_kib(pid);
    // `nobody` opens 60 connections, each announcing 16 MiB and sending
    // 15 MiB, and holds them open.
    let flood = r#"
import socket, struct, sys, time
path = sys.argv[1]
# LocalHello { protocol, build } as MessagePack with named fields.
hello = bytes([0x82, 0xa8]) + b"protocol" + bytes([int(sys.argv[2])]) + bytes([0xa5]) + b"build" + bytes([0xa0])
conns = []
for i in range(60):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(path)
    s.sendall(struct.pack(">I", len(hello)) + hello)
    s.settimeout(0.5)
    try:
        s.sendall(struct.pack(">I", 16 << 20) + b"\x90" * (15 << 20))
    except OSError:
        pass
    conns.append(s)
print("sent", flush=True)
time.sleep(3)
"#;
    let out = std::process::Command::new("runuser")
        .args(["-u", "nobody", "--", "python3", "-c", flood])
        .arg(&server.socket)
        .arg(gpuq::net::hello::PROTOCOL_VERSION.to_string())
        .output()
        .expect("run python3 as nobody");
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("sent"),
        "{}",
        stderr(&out)
    );
    let after = rss_kib(pid);
    let grown_mib = after.saturating_sub(before) / 1024;
    // Without the limits this grew by about 900 MiB; one user may hold at
    // most 24 MiB of arriving requests.
    assert!(grown_mib < 100, "the daemon grew by {grown_mib} MiB");
    assert!(
        server.log().contains("of requests arriving at once"),
        "the refusal is logged"
    );
    // The daemon still answers.
    server.ok(&["queue"]);
}
