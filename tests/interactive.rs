//! Interactive work as a user meets it: `gpuq exec` beside a running job's
//! rank, `srun --pty`/`gpuq run --pty` on a real terminal (a pty opened by
//! the test, as a terminal emulator would), `gpuq attach`, and the keepalive
//! that releases an allocation whose client vanished. Real servers, agents,
//! shims and QUIC on loopback.

mod common;

use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use common::{cli, cli_with_input, gpuq_command, stderr, stdout, Cluster};

const LONG: Duration = Duration::from_secs(60);

/// A value `NAME=...` from lines of `env` output.
fn var<'a>(env: &'a str, name: &str) -> Option<&'a str> {
    env.lines()
        .find_map(|l| l.strip_prefix(name).and_then(|r| r.strip_prefix('=')))
}

/// A 2-node job whose ranks record their environment and cgroup in `work`
/// and then sleep; its id, once both ranks run.
fn two_rank_sleeper(c: &Cluster, work: &Path) -> String {
    let script = "env > env.$RANK; cat /proc/self/cgroup > cgroup.$RANK; exec sleep 600";
    let id = c.submit(&[
        "-N",
        "2",
        "--gpus-per-node",
        "2",
        "-D",
        work.to_str().unwrap(),
        "--",
        "sh",
        "-c",
        script,
    ]);
    c.wait_started(&id, LONG);
    common::wait_for("both ranks to record themselves", LONG, || {
        (0..2).all(|r| {
            std::fs::read_to_string(work.join(format!("cgroup.{r}"))).is_ok_and(|s| !s.is_empty())
        })
    });
    id
}

#[test]
fn exec_joins_a_ranks_cgroup_gpus_and_environment_and_returns_its_status() {
    let dir = tempfile::tempdir().unwrap();
    let c = Cluster::start(dir.path(), 2, 4);
    let work = dir.path().join("work");
    std::fs::create_dir_all(&work).unwrap();
    let id = two_rank_sleeper(&c, &work);
    let sock = &c.server.socket;

    let out = cli(
        sock,
        &[
            "exec",
            &id,
            "--rank",
            "1",
            "--",
            "sh",
            "-c",
            "env; echo CGROUP; cat /proc/self/cgroup; echo to-stderr >&2",
        ],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    let (env, cgroup) = text.split_once("CGROUP\n").expect("both parts");
    let task_env = std::fs::read_to_string(work.join("env.1")).unwrap();
    for name in [
        "CUDA_VISIBLE_DEVICES",
        "RANK",
        "GPUQ_NODE_RANK",
        "GPUQ_JOB_ID",
    ] {
        assert_eq!(var(env, name), var(&task_env, name), "{name}\n{env}");
    }
    assert_eq!(var(env, "RANK"), Some("1"));
    assert_ne!(var(env, "CUDA_VISIBLE_DEVICES").unwrap_or(""), "");
    let task_cgroup = std::fs::read_to_string(work.join("cgroup.1")).unwrap();
    assert_eq!(cgroup, task_cgroup, "the exec runs in rank 1's cgroup");
    assert_eq!(stderr(&out), "to-stderr\n");

    // Its status, its stdin, and a command that does not exist.
    let failed = cli(sock, &["exec", &id, "--", "sh", "-c", "exit 7"]);
    assert_eq!(failed.status.code(), Some(7), "{}", stderr(&failed));
    let echoed = cli_with_input(sock, &["exec", &id, "--", "cat"], "typed in\n");
    assert_eq!(stdout(&echoed), "typed in\n", "{}", stderr(&echoed));
    let missing = cli(sock, &["exec", &id, "--", "no-such-command-here"]);
    assert_eq!(missing.status.code(), Some(1));
    assert!(
        stderr(&missing).contains("not found"),
        "{}",
        stderr(&missing)
    );

    // Through a compute agent's socket (its forwarder) as through the server's.
    let via_agent = cli(
        &c.agents[0].dir.join("agent.sock"),
        &["exec", &id, "--rank", "1", "--", "printenv", "RANK"],
    );
    assert_eq!(stdout(&via_agent), "1\n", "{}", stderr(&via_agent));

    // The job runs on, untouched.
    assert_eq!(c.job(&id)["state"], "RUNNING");
    c.server.ok(&["cancel", &id]);
}

#[test]
fn exec_is_refused_with_a_reason_for_bad_ranks_and_jobs_not_running() {
    let dir = tempfile::tempdir().unwrap();
    let c = Cluster::start(dir.path(), 1, 1);
    let sock = &c.server.socket;
    let w = dir.path().to_str().unwrap();
    let running = c.submit(&["-D", w, "--gpus-per-node", "1", "--", "sleep", "600"]);
    c.wait_started(&running, LONG);
    let cases: Vec<(Vec<String>, &str)> = vec![
        (
            vec![
                "exec".into(),
                running.clone(),
                "--rank".into(),
                "3".into(),
                "true".into(),
            ],
            "--rank 3 does not exist",
        ),
        (
            vec!["exec".into(), "999".into(), "true".into()],
            "does not exist",
        ),
        (
            vec![
                "exec".into(),
                running.clone(),
                "--pty".into(),
                "true".into(),
            ],
            "needs a terminal",
        ),
    ];
    for (args, why) in cases {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let out = cli(sock, &args);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {}", stderr(&out));
        assert!(stderr(&out).contains(why), "{args:?}: {}", stderr(&out));
    }
    // A job waiting behind the running one, and one that has finished.
    let pending = c.submit(&["-D", w, "--gpus-per-node", "1", "--", "true"]);
    let out = cli(sock, &["exec", &pending, "true"]);
    assert!(stderr(&out).contains("has not started"), "{}", stderr(&out));
    c.server.ok(&["cancel", &running]);
    c.wait_state(&running, "CANCELLED", LONG);
    let out = cli(sock, &["exec", &running, "true"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains("is CANCELLED"), "{}", stderr(&out));
}

#[test]
fn another_user_may_not_exec_into_a_job() {
    if !common::require_root("another_user_may_not_exec_into_a_job") {
        return;
    }
    let dir = common::shared_tempdir();
    let c = Cluster::start(dir.path(), 1, 1);
    let w = dir.path().to_str().unwrap();
    let id = c.submit(&["-D", w, "--", "sleep", "600"]);
    c.wait_started(&id, LONG);
    let mallory = common::ensure_user("gpuqexecother");
    let out = common::cli_as(&mallory, &c.server.socket, &["exec", &id, "--", "id"]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("only its owner or an admin"),
        "{}",
        stderr(&out)
    );
    assert!(out.stdout.is_empty());
    let out = common::cli_as(&mallory, &c.server.socket, &["attach", &id]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("only its owner or an admin"),
        "{}",
        stderr(&out)
    );
}

/// `gpuq ARGS` on a terminal of its own, against `socket`.
fn on_terminal(socket: &Path, args: &[&str], rows: u16, cols: u16) -> common::pty::Terminal {
    let mut cmd = gpuq_command();
    cmd.args(args)
        .env("GPUQ_SOCKET", socket)
        .env("TERM", "xterm")
        .env("PS1", "gpuq-prompt$ ");
    common::pty::Terminal::spawn(cmd, rows, cols)
}

#[test]
fn exec_with_a_pty_is_a_shell_on_the_ranks_node() {
    let dir = tempfile::tempdir().unwrap();
    let c = Cluster::start(dir.path(), 2, 4);
    let work = dir.path().join("work");
    std::fs::create_dir_all(&work).unwrap();
    let id = two_rank_sleeper(&c, &work);
    let mut t = on_terminal(
        &c.server.socket,
        &["exec", &id, "--rank", "1", "--pty", "--", "sh", "-i"],
        30,
        100,
    );
    t.send("tty; stty size; echo rank=$((RANK+10))\n");
    let shown = t.expect("rank=11", LONG);
    assert!(shown.contains("/dev/pts/"), "{shown}");
    assert!(shown.contains("30 100"), "{shown}");
    t.resize(40, 120);
    // The shell reads the new size once the resize has gone through.
    common::wait_for("the resize to reach the task", LONG, || {
        t.send("stty size\n");
        std::thread::sleep(Duration::from_millis(200));
        t.screen().contains("40 120")
    });
    // Ctrl-C is a byte the task's terminal turns into SIGINT for its
    // foreground job; the shell and the session live on.
    t.send("sleep 600\n");
    std::thread::sleep(Duration::from_millis(300));
    t.send("\x03");
    // (The typed line is echoed at once; only its output proves the shell.)
    t.send("echo interrupted-$((40+2))\n");
    t.expect("interrupted-42", LONG);
    t.send("exit 3\n");
    assert_eq!(t.wait(LONG).code(), Some(3), "{}", t.screen());
    assert!(t.is_cooked(), "the terminal was left in raw mode");
}

/// A directory of Slurm links (srun, salloc, ...) to the binary under test.
fn slurm_links(dir: &Path) -> std::path::PathBuf {
    let bin = dir.join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    for name in gpuq::compat::COMMANDS {
        std::os::unix::fs::symlink(common::gpuq_bin(), bin.join(name)).unwrap();
    }
    bin
}

/// A Slurm command on a terminal of its own, its links first on PATH.
fn slurm_on_terminal(
    bin: &Path,
    socket: &Path,
    command: &str,
    args: &[&str],
) -> common::pty::Terminal {
    let mut cmd = common::clean_command(bin.join(command));
    let path = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    cmd.args(args)
        .env("GPUQ_SOCKET", socket)
        .env("PATH", path)
        .env("TERM", "xterm")
        .env("PS1", "gpuq-prompt$ ")
        .current_dir(socket.parent().unwrap());
    common::pty::Terminal::spawn(cmd, 30, 100)
}

/// The GPU indices the job holds on its first node, as CUDA_VISIBLE_DEVICES
/// names them.
fn first_node_gpus(c: &Cluster, id: &str) -> String {
    let job = c.job(id);
    let gpus: Vec<String> = job["placement"][0]["gpus"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| g["index"].to_string())
        .collect();
    gpus.join(",")
}

#[test]
fn srun_pty_bash_is_a_shell_on_a_terminal_of_the_node() {
    let dir = tempfile::tempdir().unwrap();
    let c = Cluster::start(dir.path(), 1, 4);
    let bin = slurm_links(dir.path());
    let mut t = slurm_on_terminal(
        &bin,
        &c.server.socket,
        "srun",
        &[
            "--gpus-per-node",
            "2",
            "--pty",
            "bash",
            "--norc",
            "--noprofile",
            "-i",
        ],
    );
    t.expect("gpuq-prompt$ ", LONG);
    t.send("tty; stty size; echo done-$((1+1))\n");
    let shown = t.expect("done-2", LONG);
    assert!(shown.contains("/dev/pts/"), "{shown}");
    assert!(shown.contains("30 100"), "{shown}");
    t.resize(40, 120);
    common::wait_for("the resize to reach the shell", LONG, || {
        t.send("stty size\n");
        std::thread::sleep(Duration::from_millis(200));
        t.screen().contains("40 120")
    });
    t.send("echo job=$SLURM_JOB_ID gpus=$CUDA_VISIBLE_DEVICES end-$((1+2))\n");
    let shown = t.expect(" end-3", LONG);
    let job = shown
        .rsplit("job=")
        .next()
        .and_then(|s| s.split_whitespace().next())
        .unwrap()
        .to_string();
    let gpus = first_node_gpus(&c, &job);
    assert_eq!(gpus.split(',').count(), 2, "{gpus}");
    assert!(
        shown.contains(&format!("gpus={gpus} end-3")),
        "{shown} vs {gpus}"
    );
    // Ctrl-Z and Ctrl-C act on the shell's terminal there.
    t.send("sleep 600\n");
    std::thread::sleep(Duration::from_millis(300));
    t.send("\x1a");
    t.expect("Stopped", LONG);
    // `wait` alone may still see the job stopped (bash reaps it on its next
    // SIGCHLD), and then `exit` refuses with "There are stopped jobs".
    t.send("kill -9 %1; while [ -n \"$(jobs -p)\" ]; do sleep 0.1; done; echo killed-$((6*7))\n");
    t.expect("killed-42", LONG);
    t.send("exit 3\n");
    assert_eq!(t.wait(LONG).code(), Some(3), "{}", t.screen());
    assert!(t.is_cooked(), "the terminal was left in raw mode");
    // The allocation was released: its GPUs are free again.
    c.wait_state(&job, "COMPLETED", LONG);
}

#[test]
fn gpuq_run_pty_and_srun_pty_inside_salloc_return_the_tasks_status() {
    let dir = tempfile::tempdir().unwrap();
    let c = Cluster::start(dir.path(), 2, 2);
    let bin = slurm_links(dir.path());
    // A command that ends at once may end before the first attach: its
    // output and status still come back.
    let mut t = on_terminal(
        &c.server.socket,
        &[
            "run",
            "--pty",
            "--",
            "sh",
            "-c",
            "echo quick-$((2+2)); exit 4",
        ],
        24,
        80,
    );
    t.expect("quick-4", LONG);
    assert_eq!(t.wait(LONG).code(), Some(4), "{}", t.screen());
    assert!(t.is_cooked());

    // salloc's command owns the terminal; srun --pty inside runs on a node
    // of the allocation, one task on its first node.
    let script = "srun --pty sh -c 'echo on-$SLURM_STEP_ID-$SLURM_NTASKS; tty; exit 5'";
    let mut t = slurm_on_terminal(
        &bin,
        &c.server.socket,
        "salloc",
        &["-N", "2", "sh", "-c", script],
    );
    let shown = t.expect("/dev/pts/", LONG);
    assert!(shown.contains("on-0-1"), "{shown}");
    assert_eq!(t.wait(LONG).code(), Some(5), "{}", t.screen());

    // A command that cannot start says why.
    let mut t = on_terminal(
        &c.server.socket,
        &["run", "--pty", "--", "no-such-command-here"],
        24,
        80,
    );
    assert_eq!(t.wait(LONG).code(), Some(1), "{}", t.screen());
    assert!(t.screen().contains("not found"), "{}", t.screen());

    // Without a terminal, --pty is refused and nothing is queued.
    let before = c.server.ok(&["queue", "--all", "--json"]);
    let out = cli(&c.server.socket, &["run", "--pty", "--", "bash"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains("needs a terminal"),
        "{}",
        stderr(&out)
    );
    assert_eq!(c.server.ok(&["queue", "--all", "--json"]), before);
}

#[test]
fn gpuq_run_without_a_pty_streams_stdin_stdout_and_stderr() {
    let dir = tempfile::tempdir().unwrap();
    let c = Cluster::start(dir.path(), 1, 1);
    let out = cli_with_input(
        &c.server.socket,
        &["run", "--", "sh", "-c", "cat; echo to-err >&2; exit 2"],
        "line one\nline two\n",
    );
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert_eq!(stdout(&out), "line one\nline two\n");
    assert!(stderr(&out).contains("to-err"), "{}", stderr(&out));
}

#[test]
fn a_session_outlives_its_server_and_reconnects_with_nothing_lost_or_repeated() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = Cluster::start(dir.path(), 1, 1);
    let mut t = on_terminal(
        &c.server.socket,
        &["run", "--pty", "--", "sh", "-i"],
        24,
        80,
    );
    t.send("echo before-$((1+1))\n");
    t.expect("before-2", LONG);
    // The only server dies and comes back: no leader for a while, every
    // stream cut. The shell on the node is the shim's, not the stream's.
    c.server.kill();
    std::thread::sleep(Duration::from_millis(500));
    c.server.start();
    t.send("echo after-$((2+2))\n");
    t.expect("after-4", LONG);
    t.send("exit 6\n");
    assert_eq!(t.wait(LONG).code(), Some(6), "{}", t.screen());
    let screen = t.screen();
    assert_eq!(
        screen.matches("before-2").count(),
        1,
        "replayed twice:\n{screen}"
    );
}

#[test]
fn killing_the_salloc_client_releases_its_allocation_after_the_inactive_limit() {
    let dir = tempfile::tempdir().unwrap();
    let c = Cluster::start_with_config(dir.path(), 1, 2, 10, "inactive_limit_secs = 2");
    let bin = slurm_links(dir.path());
    let mut salloc = common::clean_command(bin.join("salloc"))
        .args(["--gpus-per-node", "2", "sleep", "600"])
        .env("GPUQ_SOCKET", &c.server.socket)
        .current_dir(dir.path())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .process_group(0)
        .spawn()
        .unwrap();
    let mut id = String::new();
    common::wait_for("the allocation to run", LONG, || {
        let jobs: serde_json::Value =
            serde_json::from_str(&c.server.ok(&["queue", "--json"])).unwrap();
        match jobs.as_array().and_then(|a| a.first()) {
            Some(j) if j["state"] == "RUNNING" => {
                id = j["id"].to_string();
                true
            }
            _ => false,
        }
    });
    // A live client keeps it past the limit, renewal after renewal.
    std::thread::sleep(Duration::from_secs(5));
    assert_eq!(
        c.job(&id)["state"],
        "RUNNING",
        "released while salloc lived"
    );
    // salloc and its command vanish without a word (SIGKILL).
    let group = nix::unistd::Pid::from_raw(-(salloc.id() as i32));
    nix::sys::signal::kill(group, nix::sys::signal::Signal::SIGKILL).unwrap();
    let _ = salloc.wait();
    let j = c.wait_state(&id, "TIMEOUT", LONG);
    assert!(
        j["reason"]
            .as_str()
            .unwrap_or("")
            .contains("stopped renewing"),
        "{j}"
    );
    let nodes: serde_json::Value =
        serde_json::from_str(&c.server.ok(&["nodes", "--json"])).unwrap();
    assert_eq!(nodes[0]["gpus_used"], 0, "{nodes}");
}

#[test]
fn attach_joins_a_running_terminal_session_and_detaches_leaving_it_running() {
    let dir = tempfile::tempdir().unwrap();
    let c = Cluster::start(dir.path(), 1, 1);
    let bin = slurm_links(dir.path());
    let sock = &c.server.socket;
    let mut a = on_terminal(sock, &["run", "--pty", "--", "sh", "-i"], 24, 80);
    a.send("echo one-$((0+1))\n");
    a.expect("one-1", LONG);
    let jobs: serde_json::Value = serde_json::from_str(&c.server.ok(&["queue", "--json"])).unwrap();
    let id = jobs[0]["id"].to_string();

    // A second terminal sees what was shown so far, then both see and type.
    let mut b = on_terminal(sock, &["attach", &id], 24, 80);
    b.expect("one-1", LONG);
    b.send("echo from-b-$((3+4))\n");
    b.expect("from-b-7", LONG);
    a.expect("from-b-7", LONG);
    // A watcher without a terminal follows the output (sattach JOB.STEP).
    let watcher = common::clean_command(bin.join("sattach"))
        .arg(format!("{id}.0"))
        .env("GPUQ_SOCKET", sock)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Ctrl-] detaches the second terminal; the session goes on.
    b.send("\x1d");
    assert_eq!(b.wait(LONG).code(), Some(0), "{}", b.screen());
    assert!(b.is_cooked());
    a.send("echo still-$((2*5))\n");
    a.expect("still-10", LONG);
    a.send("exit 9\n");
    assert_eq!(a.wait(LONG).code(), Some(9), "{}", a.screen());
    let watched = watcher.wait_with_output().unwrap();
    assert_eq!(watched.status.code(), Some(9), "{}", stderr(&watched));
    let seen = stdout(&watched);
    assert!(
        seen.contains("one-1") && seen.contains("still-10"),
        "{seen}"
    );
}

#[test]
fn sattach_follows_a_plain_step_and_refuses_what_it_cannot_follow() {
    let dir = tempfile::tempdir().unwrap();
    let c = Cluster::start(dir.path(), 1, 1);
    let bin = slurm_links(dir.path());
    let sock = &c.server.socket;
    let run = |cmd: &str, args: &[&str]| {
        let path = format!(
            "{}:{}",
            bin.display(),
            std::env::var("PATH").unwrap_or_default()
        );
        common::clean_command(bin.join(cmd))
            .args(args)
            .env("GPUQ_SOCKET", sock)
            .env("PATH", path)
            .current_dir(dir.path())
            .stdin(Stdio::null())
            .output()
            .unwrap()
    };
    let script = dir.path().join("ticks.sh");
    std::fs::write(
        &script,
        "#!/bin/sh\nsrun sh -c 'for i in 1 2 3 4 5 6 7 8; do echo tick-$i; sleep 0.3; done'\n",
    )
    .unwrap();
    let out = run("sbatch", &["--parsable", script.to_str().unwrap()]);
    let id = stdout(&out).trim().to_string();
    common::wait_for("the step to start", LONG, || {
        c.job(&id)["run"]["steps"]
            .as_array()
            .is_some_and(|s| !s.is_empty())
    });
    let watched = run("sattach", &["-l", &format!("{id}.0")]);
    assert!(watched.status.success(), "{}", stderr(&watched));
    assert!(
        stdout(&watched).contains("0: tick-8"),
        "{}",
        stdout(&watched)
    );

    for (args, why) in [
        (vec!["12"], "JOB.STEP"),
        (vec![&format!("{id}.5")[..]], "no running step"),
    ] {
        let out = run("sattach", &args);
        assert_eq!(out.status.code(), Some(1), "{args:?}");
        assert!(stderr(&out).contains(why), "{args:?}: {}", stderr(&out));
    }
}

#[test]
fn a_terminal_is_told_of_its_time_limit_before_the_task_is_stopped() {
    let dir = tempfile::tempdir().unwrap();
    let c = Cluster::start(dir.path(), 1, 1);
    // A 3-second limit: the early notice comes at once (a minute before
    // is before the start), the stop at the limit.
    let mut t = on_terminal(
        &c.server.socket,
        &["run", "--pty", "--time", "0:03", "--", "sleep", "600"],
        24,
        80,
    );
    t.expect("the time limit is reached in", LONG);
    t.expect("SIGTERM now", LONG);
    assert_eq!(t.wait(LONG).code(), Some(128 + 15), "{}", t.screen());
    assert!(t.is_cooked());
}

#[test]
fn a_task_that_ends_while_its_stream_is_down_still_shows_its_last_output_and_status() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = Cluster::start(dir.path(), 1, 1);
    let script = "echo first-$((1+0)); sleep 1; echo late-$((1+1)); exit 4";
    let mut t = on_terminal(
        &c.server.socket,
        &["run", "--pty", "--", "sh", "-c", script],
        24,
        80,
    );
    t.expect("first-1", LONG);
    // The task ends while no server is there to carry its stream: its end
    // and its last words come from the cluster's record and the node's
    // spool once a server is back.
    c.server.kill();
    std::thread::sleep(Duration::from_secs(3));
    c.server.start();
    t.expect("late-2", LONG);
    assert_eq!(t.wait(LONG).code(), Some(4), "{}", t.screen());
    assert_eq!(t.screen().matches("first-1").count(), 1, "{}", t.screen());
}
