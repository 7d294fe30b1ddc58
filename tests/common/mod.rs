//! The one harness every integration test uses: real `gpuq` processes in
//! temp dirs on loopback, driven through the real CLI.

#![allow(dead_code)]

pub mod browser;
pub mod cpu;
pub mod golden;
pub mod history;
pub mod nemesis;
pub mod netns;
pub mod pty;
mod servers;
pub mod workload;
#[allow(unused_imports)]
pub use servers::ServerSet;

use std::net::UdpSocket;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// The gpuq binary under test: this build's, or `GPUQ_BIN` (benchmarks use
/// it to measure another build with the same driver).
pub fn gpuq_bin() -> PathBuf {
    std::env::var_os("GPUQ_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_gpuq")))
}

/// A command for `program` without the caller's `GPUQ_*` variables: a
/// harness sets every one its children need, and one left in the shell
/// (a `GPUQ_SOCKET`, say) must not hand every daemon the same socket.
pub fn clean_command(program: impl AsRef<std::ffi::OsStr>) -> Command {
    let mut c = Command::new(program);
    for (key, _) in std::env::vars_os() {
        if key.to_string_lossy().starts_with("GPUQ_") {
            c.env_remove(key);
        }
    }
    c
}

/// [`clean_command`] for the gpuq binary under test. Its daemons take any
/// free HTTP port (`GPUQ_HTTP_LISTEN`), since tests run many side by side;
/// [`http_url_in`] finds it in their logs.
pub fn gpuq_command() -> Command {
    let mut c = clean_command(gpuq_bin());
    c.env("GPUQ_HTTP_LISTEN", "127.0.0.1:0");
    c
}

/// The HTTP base URL a daemon logged as it became ready (`http=URL`).
pub fn http_url_in(log: &str) -> Option<String> {
    log.lines()
        .filter(|l| l.contains(" ready"))
        .find_map(|l| l.split_whitespace().find_map(|w| w.strip_prefix("http=")))
        .map(|u| u.trim_matches('"').to_string())
}

/// A free UDP port on 127.0.0.1 (bound and released; good enough for tests).
pub fn free_port() -> u16 {
    UdpSocket::bind("127.0.0.1:0")
        .and_then(|s| s.local_addr())
        .map(|a| a.port())
        .expect("a free UDP port")
}

/// True when running as root (CI always is).
pub fn is_root() -> bool {
    nix::unistd::Uid::effective().is_root()
}

/// Tests that need root must run in CI; elsewhere they say loudly that they did not.
pub fn require_root(test: &str) -> bool {
    if is_root() {
        return true;
    }
    assert!(
        std::env::var_os("CI").is_none(),
        "{test} needs root and CI runs as root"
    );
    eprintln!("NOT RUN: {test} needs root (run the tests as root, as CI does)");
    false
}

/// Waits for `cond` to hold, polling, up to `timeout`.
pub fn wait_for(what: &str, timeout: Duration, mut cond: impl FnMut() -> bool) {
    let start = Instant::now();
    while !cond() {
        assert!(
            start.elapsed() < timeout,
            "timed out after {timeout:?} waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A `gpuq server` process with its own data dir, port and socket.
pub struct Server {
    pub dir: PathBuf,
    pub port: u16,
    pub socket: PathBuf,
    /// Seconds of agent silence before a node is down.
    pub node_ttl_secs: u64,
    /// The address it listens on: 127.0.0.1, or its namespace's address.
    pub host: String,
    /// The network namespace it runs in (see `netns`), if any.
    pub netns: Option<String>,
    /// The server's node name.
    pub name: String,
    /// How it enters the cluster on its next start (`--bootstrap`, or
    /// `--join ADDR --token T` until it has joined, then nothing).
    pub mode: Vec<String>,
    /// More config lines after `[server]`'s node_ttl_secs: `key = value`
    /// lines, then tables (e.g. `[server.raft]`).
    pub extra_config: String,
    child: Option<Child>,
}

impl Server {
    /// Bootstraps a one-server cluster in `dir` and waits until it accepts writes.
    pub fn bootstrap(dir: &Path) -> Server {
        Server::bootstrap_with_ttl(dir, 10)
    }

    /// Bootstraps with `extra` config lines (e.g. a `[server.raft]` table).
    pub fn bootstrap_with(dir: &Path, extra: &str) -> Server {
        let mut s = Server::joining(dir, "s1", "", "");
        s.mode = vec!["--bootstrap".into()];
        s.extra_config = extra.into();
        s.start();
        s
    }

    /// Bootstraps with a node TTL of `node_ttl_secs`.
    pub fn bootstrap_with_ttl(dir: &Path, node_ttl_secs: u64) -> Server {
        Server::bootstrap_with_config(dir, node_ttl_secs, "")
    }

    /// Bootstraps with a node TTL and more `[server]` keys (`key = value` lines).
    pub fn bootstrap_with_config(dir: &Path, node_ttl_secs: u64, extra: &str) -> Server {
        std::fs::create_dir_all(dir).expect("server dir");
        let mut s = Server {
            dir: dir.to_path_buf(),
            port: free_port(),
            socket: dir.join("gpuq.sock"),
            node_ttl_secs,
            host: "127.0.0.1".into(),
            netns: None,
            name: "s1".into(),
            mode: vec!["--bootstrap".into()],
            extra_config: extra.to_string(),
            child: None,
        };
        s.start();
        s
    }

    /// A server that will join through `via` with `token` under `name`; not
    /// started yet (see [`Server::start`] and [`Server::run_to_exit`]).
    pub fn joining(dir: &Path, name: &str, via: &str, token: &str) -> Server {
        std::fs::create_dir_all(dir).expect("server dir");
        Server {
            dir: dir.to_path_buf(),
            port: free_port(),
            socket: dir.join("gpuq.sock"),
            node_ttl_secs: 10,
            name: name.into(),
            mode: vec!["--join".into(), via.into(), "--token".into(), token.into()],
            extra_config: String::new(),
            host: "127.0.0.1".into(),
            netns: None,
            child: None,
        }
    }

    /// Joins the cluster of `via` with `token` as `name` and waits until this
    /// server is a voter.
    pub fn join(dir: &Path, name: &str, via: &Server, token: &str) -> Server {
        Server::join_with(dir, name, via, token, &via.extra_config)
    }

    /// Like [`Server::join`], with `extra` config lines.
    pub fn join_with(dir: &Path, name: &str, via: &Server, token: &str, extra: &str) -> Server {
        let mut s = Server::joining(dir, name, &via.addr(), token);
        s.extra_config = extra.into();
        s.start();
        s.wait_voter(name);
        // The data dir holds the identity and the membership now.
        s.mode.clear();
        s
    }

    /// Starts the process and waits for it to exit (a refused start): its
    /// exit status and log.
    pub fn run_to_exit(&mut self) -> (std::process::ExitStatus, String) {
        self.spawn();
        let mut child = self.child.take().expect("spawned");
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Ok(Some(st)) = child.try_wait() {
                return (st, self.log());
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                panic!("gpuq server did not exit in 60 s\n{}", self.log());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// `gpuq cluster --json` from this server, parsed (Null when it fails).
    pub fn status(&self) -> serde_json::Value {
        let out = self.cli(&["cluster", "--json"]);
        serde_json::from_slice(&out.stdout).unwrap_or_default()
    }

    /// Waits until this server's view lists `name` as a voter.
    pub fn wait_voter(&self, name: &str) {
        let start = Instant::now();
        loop {
            let v = self.status();
            let voter = v["members"]
                .as_array()
                .is_some_and(|ms| ms.iter().any(|m| m["name"] == name && m["voter"] == true));
            if voter && !v["leader"].is_null() {
                return;
            }
            assert!(
                start.elapsed() < Duration::from_secs(120),
                "{name} did not become a voter in 120 s: {v}\n--- log of {} ---\n{}",
                self.name,
                self.log()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Starts the process without waiting for it to lead.
    pub fn spawn(&mut self) {
        let cfg = self.dir.join("server.toml");
        std::fs::write(
            &cfg,
            format!(
                "[server]\nnode_ttl_secs = {}\n{}\n",
                self.node_ttl_secs, self.extra_config
            ),
        )
        .expect("server config");
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join("server.log"))
            .expect("log file");
        let child = in_netns(self.netns.as_deref())
            .args(["server", "--node-name", &self.name])
            .args(&self.mode)
            .arg("--config")
            .arg(&cfg)
            .arg("--data-dir")
            .arg(self.dir.join("data"))
            .args(["--listen", &self.addr()])
            .arg("--socket")
            .arg(&self.socket)
            .env(
                "GPUQ_LOG",
                std::env::var("GPUQ_SERVER_LOG").unwrap_or_else(|_| "info".into()),
            )
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("spawn gpuq server");
        self.child = Some(child);
    }

    /// (Re)starts the process on the same dir and port and waits for a leader
    /// with the cluster initialised.
    pub fn start(&mut self) {
        self.spawn();
        self.wait_ready();
    }

    /// Waits until this server sees a leader and an initialised cluster.
    pub fn wait_ready(&self) {
        let sock = self.socket.clone();
        wait_for(
            "the server to lead an initialised cluster",
            Duration::from_secs(30),
            || {
                let out = cli(&sock, &["cluster", "--json"]);
                out.status.success()
                    && serde_json::from_slice::<serde_json::Value>(&out.stdout)
                        .map(|v| !v["leader"].is_null() && v["cluster_name"].is_string())
                        .unwrap_or(false)
                    && String::from_utf8_lossy(&cli(&sock, &["token", "list"]).stderr).is_empty()
            },
        );
    }

    /// The server process's pid, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(|c| c.id())
    }

    /// The exit status, when the process has exited by itself (e.g. a
    /// server that gave up on a full disk); `None` while it runs.
    pub fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.child
            .as_mut()
            .and_then(|c| c.try_wait().ok().flatten())
    }

    /// SIGKILL: no shutdown path runs.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// SIGSTOP (`true`) or SIGCONT (`false`): a server that holds its
    /// connections and answers nothing, or one that goes on.
    pub fn freeze(&self, frozen: bool) {
        use nix::sys::signal::{kill, Signal};
        let pid = nix::unistd::Pid::from_raw(self.pid().expect("a running server") as i32);
        kill(
            pid,
            if frozen {
                Signal::SIGSTOP
            } else {
                Signal::SIGCONT
            },
        )
        .unwrap();
    }

    /// The server's log so far (for failure messages).
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("server.log")).unwrap_or_default()
    }

    pub fn addr(&self) -> String {
        format!("{}:{}", self.host, self.port)
    }

    /// Runs a client command against this server's socket.
    pub fn cli(&self, args: &[&str]) -> Output {
        cli(&self.socket, args)
    }

    /// Runs a client command and returns its stdout, panicking on failure.
    pub fn ok(&self, args: &[&str]) -> String {
        let out = self.cli(args);
        assert!(
            out.status.success(),
            "gpuq {args:?} failed: {}\n--- server log ---\n{}",
            String::from_utf8_lossy(&out.stderr),
            self.log()
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// `gpuq show ID --json`.
    pub fn job(&self, id: &str) -> serde_json::Value {
        serde_json::from_str(&self.ok(&["show", id, "--json"])).unwrap()
    }

    /// Waits up to `timeout` until job `id` is in `state`; returns it.
    pub fn wait_job(&self, id: &str, state: &str, timeout: Duration) -> serde_json::Value {
        let mut last = serde_json::Value::Null;
        wait_for(&format!("job {id} {state}"), timeout, || {
            last = self.job(id);
            let ended = ["COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"]
                .contains(&last["state"].as_str().unwrap_or_default());
            assert!(
                !ended || last["state"] == state,
                "job {id} ended {}, not {state}: {last}",
                last["state"]
            );
            last["state"] == state
        });
        last
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(c.id() as i32),
                nix::sys::signal::Signal::SIGTERM,
            );
            let deadline = Instant::now() + Duration::from_secs(5);
            while Instant::now() < deadline {
                if let Ok(Some(_)) = c.try_wait() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// A command for the gpuq binary, run inside network namespace `netns` when
/// one is given.
pub fn in_netns(netns: Option<&str>) -> Command {
    match netns {
        Some(ns) => netns::Net::command(ns, &gpuq_bin()),
        None => gpuq_command(),
    }
}

/// Runs `gpuq ARGS` with GPUQ_SOCKET set, from the socket's directory (the
/// test's own), so a job's default output files land there, not in the repo.
pub fn cli(socket: &Path, args: &[&str]) -> Output {
    gpuq_command()
        .args(args)
        .env("GPUQ_SOCKET", socket)
        .current_dir(
            socket
                .parent()
                .filter(|d| d.is_dir())
                .unwrap_or(Path::new("/")),
        )
        .stdin(Stdio::null())
        .output()
        .expect("run gpuq")
}

/// Like [`cli`], killed after `timeout`: `None` then (a frozen server holds
/// the connection and answers nothing, and the CLI would wait for it).
pub fn cli_within(socket: &Path, args: &[&str], timeout: Duration) -> Option<Output> {
    let child = Command::new(gpuq_bin())
        .args(args)
        .env("GPUQ_SOCKET", socket)
        .current_dir(
            socket
                .parent()
                .filter(|d| d.is_dir())
                .unwrap_or(Path::new("/")),
        )
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run gpuq");
    let pid = nix::unistd::Pid::from_raw(child.id() as i32);
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    match rx.recv_timeout(timeout) {
        Ok(out) => Some(out.expect("wait for gpuq")),
        Err(_) => {
            let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL);
            let _ = rx.recv();
            None
        }
    }
}

/// A one-GPU `true` job named `name` (10-minute limit, workdir /tmp): the
/// spec the benchmarks submit through the API.
#[allow(dead_code)]
pub fn trivial_spec(name: &str) -> gpuq::model::JobSpec {
    gpuq::model::JobSpec {
        name: name.into(),
        nodes: 1,
        ntasks_per_node: 1,
        gpus_per_node: 1,
        cpus_per_task: 1,
        mem_per_node_mb: None,
        time_limit_secs: Some(600),
        account: None,
        partition: None,
        output: None,
        error: None,
        workdir: "/tmp".into(),
        env: vec![("PATH".into(), "/usr/bin:/bin".into())],
        export: Default::default(),
        requeue: Default::default(),
        max_restarts: 3,
        total_gpus: None,
        placement: Default::default(),
        queue: Default::default(),
        signal: None,
        qos: None,
        nice: 0,
        program: gpuq::model::Program::Command {
            argv: vec!["true".into()],
        },
        launch: Default::default(),
        submit_host: None,
        first_step: None,
        exclusive: false,
        container: None,
    }
}

/// Runs `gpuq ARGS` with GPUQ_SOCKET and `env` set.
pub fn cli_env(socket: &Path, args: &[&str], env: &[(&str, &str)]) -> Output {
    gpuq_command()
        .args(args)
        .env("GPUQ_SOCKET", socket)
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .output()
        .expect("run gpuq")
}

/// Stderr of an output as a string.
pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

pub fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// Jobs that print one line and then hold their resources until the test
/// opens a gate (a file); their output files land in `out`.
pub struct Gated {
    pub out: PathBuf,
    gate: PathBuf,
    script: String,
}

impl Gated {
    /// In `dir`: jobs that `echo` the shell words `echo` first.
    pub fn new(dir: &Path, echo: &str) -> Gated {
        let out = dir.join("out");
        std::fs::create_dir_all(&out).unwrap();
        let gate = dir.join("gate");
        let script = format!(
            "echo {echo}; while [ ! -e {} ]; do sleep 0.1; done",
            gate.display()
        );
        Gated { out, gate, script }
    }

    /// Submits one with `flags` (and `-D out`); its id.
    pub fn submit(&self, server: &Server, flags: &[&str]) -> String {
        let mut args = vec!["submit", "--parsable", "-D", self.out.to_str().unwrap()];
        args.extend_from_slice(flags);
        args.extend_from_slice(&["--", "sh", "-c", &self.script]);
        server.ok(&args).trim().to_string()
    }

    /// The line job `id` printed, once it has.
    pub fn said(&self, id: &str) -> String {
        let path = self.out.join(format!("gpuq-{id}.out"));
        let mut text = String::new();
        wait_for(
            &format!("job {id}'s output"),
            Duration::from_secs(60),
            || {
                text = std::fs::read_to_string(&path).unwrap_or_default();
                !text.trim().is_empty()
            },
        );
        text.trim().to_string()
    }

    /// Lets every job waiting at the gate end.
    pub fn open(&self) {
        std::fs::write(&self.gate, "").unwrap();
    }

    /// Makes later jobs wait again.
    pub fn close(&self) {
        std::fs::remove_file(&self.gate).unwrap();
    }
}

/// Runs `gpuq ARGS` against `socket` with `input` on its stdin.
pub fn cli_with_input(socket: &Path, args: &[&str], input: &str) -> Output {
    use std::io::Write;
    let mut child = gpuq_command()
        .args(args)
        .env("GPUQ_SOCKET", socket)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run gpuq");
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(input.as_bytes()).unwrap();
    drop(stdin);
    child.wait_with_output().unwrap()
}

/// A local test user (created once, as root), for tests that switch users.
pub struct TestUser {
    pub name: String,
    pub uid: u32,
    pub gid: u32,
}

/// Creates (if needed) and returns a system user `name`. Needs root.
pub fn ensure_user(name: &str) -> TestUser {
    use nix::unistd::User;
    if User::from_name(name).ok().flatten().is_none() {
        let st = Command::new("useradd")
            .args([
                "--system",
                "--no-create-home",
                "--shell",
                "/usr/sbin/nologin",
                name,
            ])
            .status()
            .expect("run useradd");
        // Another test may have created it meanwhile.
        assert!(
            st.success() || User::from_name(name).ok().flatten().is_some(),
            "useradd {name} failed"
        );
    }
    let u = User::from_name(name).unwrap().unwrap();
    TestUser {
        name: name.to_string(),
        uid: u.uid.as_raw(),
        gid: u.gid.as_raw(),
    }
}

/// Makes a temp dir that other users can traverse (tempfile makes them 0700).
pub fn shared_tempdir() -> tempfile::TempDir {
    use std::os::unix::fs::PermissionsExt;
    let d = tempfile::tempdir().expect("tempdir");
    std::fs::set_permissions(d.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    d
}

/// A copy of the binary that every user can execute (the build dir may sit
/// under a private home directory).
pub fn shared_bin() -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    static BIN: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    BIN.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("gpuq-test-bin-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        let dst = dir.join("gpuq");
        std::fs::copy(gpuq_bin(), &dst).unwrap();
        std::fs::set_permissions(&dst, std::fs::Permissions::from_mode(0o755)).unwrap();
        dst
    })
    .clone()
}

/// `gpuq submit --parsable ARGS` as `user`, which must succeed; the job's id.
pub fn submit_as(user: &TestUser, socket: &Path, args: &[&str]) -> String {
    let mut full = vec!["submit", "--parsable"];
    full.extend_from_slice(args);
    let out = cli_as(user, socket, &full);
    assert!(out.status.success(), "submit {args:?}: {}", stderr(&out));
    stdout(&out).trim().to_string()
}

/// Makes `path` (and what leads to it) and gives it to `user`.
pub fn user_dir(user: &TestUser, path: &Path) -> PathBuf {
    std::fs::create_dir_all(path).unwrap();
    nix::unistd::chown(path, Some(user.uid.into()), Some(user.gid.into())).unwrap();
    path.to_path_buf()
}

/// Runs `gpuq ARGS` as another user.
pub fn cli_as(user: &TestUser, socket: &Path, args: &[&str]) -> Output {
    use std::os::unix::process::CommandExt;
    clean_command(shared_bin())
        .args(args)
        .env("GPUQ_SOCKET", socket)
        .current_dir("/")
        .uid(user.uid)
        .gid(user.gid)
        .stdin(Stdio::null())
        .output()
        .expect("run gpuq as another user")
}

/// A `gpuq agent --role login` process.
pub struct LoginAgent {
    pub socket: PathBuf,
    child: Child,
}

impl LoginAgent {
    /// Runs the agent's join to completion or failure: returns the running
    /// agent, or the output of the failed process.
    pub fn join(dir: &Path, server: &Server, token: &str) -> Result<LoginAgent, Output> {
        let socket = dir.join("login.sock");
        let mut child = gpuq_command()
            .args(["agent", "--role", "login", "--node-name", "login1"])
            .args(["--join", &server.addr(), "--token", token])
            .arg("--data-dir")
            .arg(dir.join("agent"))
            .arg("--socket")
            .arg(&socket)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn gpuq agent");
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Ok(Some(_)) = child.try_wait() {
                return Err(child.wait_with_output().unwrap());
            }
            if cli(&socket, &["cluster"]).status.success() {
                return Ok(LoginAgent { socket, child });
            }
            assert!(
                Instant::now() < deadline,
                "login agent neither served nor failed"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for LoginAgent {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// What a test agent reports as its hardware (`cpus`, `memory_mb` and fake
/// GPUs in its config).
#[derive(Clone, Copy, Debug)]
pub struct AgentHw {
    pub gpus: u32,
    pub cpus: u32,
    pub memory_mb: u64,
    /// The fake GPUs' MIG layouts, TOML (`mig = "1g.10gb:7"`,
    /// `mig_per_gpu = ["1g.10gb:7"]`); empty: whole GPUs.
    pub mig: &'static str,
}

impl Default for AgentHw {
    /// Plenty of CPUs and memory, so that only GPUs bound what runs.
    fn default() -> AgentHw {
        AgentHw {
            gpus: 8,
            cpus: 64,
            memory_mb: 524288,
            mig: "",
        }
    }
}

/// A `gpuq agent` (compute) process with fake GPUs.
pub struct Agent {
    pub name: String,
    pub dir: PathBuf,
    child: Option<Child>,
    join: String,
    token: String,
    /// The network namespace it runs in, if any.
    pub netns: Option<String>,
}

impl Agent {
    /// Writes the agent's config and starts it; waits until the leader lists it.
    pub fn start(server: &Server, dir: &Path, name: &str, gpus: u32, token: &str) -> Agent {
        Agent::start_with(server, dir, name, gpus, token, "")
    }

    /// Like `start`, with extra `[agent]` config lines (after the defaults).
    pub fn start_with(
        server: &Server,
        dir: &Path,
        name: &str,
        gpus: u32,
        token: &str,
        extra: &str,
    ) -> Agent {
        Agent::start_in(server, dir, name, gpus, token, extra, None)
    }

    /// Like `start_with`, inside network namespace `netns` when given.
    pub fn start_in(
        server: &Server,
        dir: &Path,
        name: &str,
        gpus: u32,
        token: &str,
        extra: &str,
        netns: Option<&str>,
    ) -> Agent {
        let hw = AgentHw {
            gpus,
            ..AgentHw::default()
        };
        Agent::start_hw(server, dir, name, hw, token, extra, netns)
    }

    /// Like `start_in`, reporting the hardware `hw`.
    pub fn start_hw(
        server: &Server,
        dir: &Path,
        name: &str,
        hw: AgentHw,
        token: &str,
        extra: &str,
        netns: Option<&str>,
    ) -> Agent {
        std::fs::create_dir_all(dir).unwrap();
        let cfg = format!(
            "[agent]\nnode_name = \"{name}\"\ndata_dir = \"{d}/data\"\nsocket = \"{d}/agent.sock\"\n\
             allow_root = true\nkill_grace_secs = 1\ncpus = {cpus}\nmemory_mb = {mem}\n\
             gpus = {{ fake = {{ count = {gpus}, fault_file = \"{d}/faults\"{mig} }} }}\n{extra}\n",
            d = dir.display(),
            cpus = hw.cpus,
            mem = hw.memory_mb,
            gpus = hw.gpus,
            mig = if hw.mig.is_empty() {
                String::new()
            } else {
                format!(", {}", hw.mig)
            },
        );
        std::fs::write(dir.join("agent.toml"), cfg).unwrap();
        let mut a = Agent {
            name: name.to_string(),
            dir: dir.to_path_buf(),
            child: None,
            join: server.addr(),
            token: token.to_string(),
            netns: netns.map(str::to_string),
        };
        a.spawn();
        let name = a.name.clone();
        let start = Instant::now();
        loop {
            let out = server.cli(&["nodes", "--json"]);
            let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
            let up = v.as_array().is_some_and(|ns| {
                ns.iter()
                    .any(|n| n["name"] == name.as_str() && n["connected"] == true)
            });
            if up {
                return a;
            }
            assert!(
                start.elapsed() < Duration::from_secs(60),
                "agent {name} did not register in 60 s\n--- agent ---\n{}\n--- server ---\n{}",
                a.log(),
                server.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Starts the process (again) with the same config.
    pub fn spawn(&mut self) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join("agent.log"))
            .unwrap();
        let child = in_netns(self.netns.as_deref())
            .arg("agent")
            .arg("--config")
            .arg(self.dir.join("agent.toml"))
            .args(["--join", &self.join, "--token", &self.token])
            .env(
                "GPUQ_LOG",
                std::env::var("GPUQ_AGENT_LOG").unwrap_or_else(|_| "info".into()),
            )
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("spawn gpuq agent");
        self.child = Some(child);
    }

    /// The agent process's pid, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(|c| c.id())
    }

    /// SIGKILL the agent (its tasks keep running under their shims).
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("agent.log")).unwrap_or_default()
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        self.kill();
        // Tasks outlive their agent by design; a test's must not outlive it.
        let Ok(tasks) = std::fs::read_dir(self.dir.join("data/tasks")) else {
            return;
        };
        for task in tasks.flatten() {
            for file in ["pid", "shim.pid"] {
                let Ok(text) = std::fs::read_to_string(task.path().join(file)) else {
                    continue;
                };
                let v: serde_json::Value = serde_json::from_str(&text).unwrap_or_default();
                let pid = v["pid"].as_i64().or(v["process"]["pid"].as_i64());
                if let Some(pid) = pid.filter(|p| *p > 1) {
                    let sig = nix::sys::signal::Signal::SIGKILL;
                    let _ = nix::sys::signal::killpg(nix::unistd::Pid::from_raw(pid as i32), sig);
                    let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), sig);
                }
            }
        }
    }
}

/// A server and `n` agents with `gpus` fake GPUs each, named n1..nN.
pub struct Cluster {
    pub server: Server,
    pub agents: Vec<Agent>,
    pub dir: PathBuf,
}

impl Cluster {
    pub fn start(dir: &Path, n: usize, gpus: u32) -> Cluster {
        Cluster::start_with_ttl(dir, n, gpus, 10)
    }

    /// A cluster whose nodes are declared down after `ttl` seconds of silence.
    pub fn start_with_ttl(dir: &Path, n: usize, gpus: u32, ttl: u64) -> Cluster {
        Cluster::start_with_config(dir, n, gpus, ttl, "")
    }

    /// A cluster whose server gets more `[server]` keys (`key = value` lines).
    pub fn start_with_config(dir: &Path, n: usize, gpus: u32, ttl: u64, extra: &str) -> Cluster {
        let server = Server::bootstrap_with_config(&dir.join("server"), ttl, extra);
        let token = server.ok(&["token", "create"]).trim().to_string();
        let agents = (1..=n)
            .map(|i| {
                let name = format!("n{i}");
                Agent::start(&server, &dir.join(&name), &name, gpus, &token)
            })
            .collect();
        Cluster {
            server,
            agents,
            dir: dir.to_path_buf(),
        }
    }

    /// `gpuq show ID --json`.
    pub fn job(&self, id: &str) -> serde_json::Value {
        self.server.job(id)
    }

    /// Waits until job `id` is in `state`; panics with the job and logs if not.
    pub fn wait_state(&self, id: &str, state: &str, timeout: Duration) -> serde_json::Value {
        let start = Instant::now();
        loop {
            let j = self.job(id);
            if j["state"] == state {
                return j;
            }
            if start.elapsed() > timeout {
                let logs: Vec<String> = self.agents.iter().map(|a| a.log()).collect();
                panic!(
                    "job {id} is {} after {timeout:?}, expected {state}: {j}\n--- server ---\n{}\n--- agents ---\n{}",
                    j["state"],
                    self.server.log(),
                    logs.join("\n")
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Waits until every rank of job `id` was reported started.
    pub fn wait_started(&self, id: &str, timeout: Duration) -> serde_json::Value {
        let start = Instant::now();
        loop {
            let j = self.job(id);
            // A batch script is one task; an allocation runs none by itself.
            let ranks = match j["spec"]["launch"].as_str() {
                Some("batch") => 1,
                Some("allocation") => 0,
                _ => {
                    j["spec"]["nodes"].as_u64().unwrap_or(1)
                        * j["spec"]["ntasks_per_node"].as_u64().unwrap_or(1)
                }
            };
            let started = j["run"]["started"].as_array().map_or(0, |a| a.len() as u64);
            if j["state"] == "RUNNING" && started == ranks {
                return j;
            }
            assert!(start.elapsed() < timeout, "job {id} did not start: {j}");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Submits and returns the job id.
    pub fn submit(&self, args: &[&str]) -> String {
        let mut full = vec!["submit", "--parsable"];
        full.extend_from_slice(args);
        self.server.ok(&full).trim().to_string()
    }
}

/// A `gpuq sim agents` process: `count` simulated agents joined to `server`.
pub struct SimAgents {
    pub count: u32,
    pub dir: PathBuf,
    child: Option<Child>,
}

impl SimAgents {
    /// Starts the process with `extra` flags, in the server's network
    /// namespace if it has one; returns at once (see
    /// [`SimAgents::wait_connected`]).
    pub fn spawn(
        server: &Server,
        dir: &Path,
        count: u32,
        token: &str,
        extra: &[&str],
    ) -> SimAgents {
        std::fs::create_dir_all(dir).unwrap();
        let log = std::fs::File::create(dir.join("sim.log")).expect("sim log");
        let child = in_netns(server.netns.as_deref())
            .args(["sim", "agents", "--count", &count.to_string()])
            .args(["--join", &server.addr(), "--token", token])
            .args(extra)
            .env(
                "GPUQ_LOG",
                std::env::var("GPUQ_SIM_LOG").unwrap_or_else(|_| "warn".into()),
            )
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("spawn gpuq sim agents");
        SimAgents {
            count,
            dir: dir.to_path_buf(),
            child: Some(child),
        }
    }

    /// Waits until the leader sees every agent connected; panics with the
    /// logs after `timeout`.
    pub fn wait_connected(&mut self, server: &Server, timeout: Duration) {
        let start = Instant::now();
        loop {
            let out = server.cli(&["nodes", "--json"]);
            let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
            let up = v
                .as_array()
                .map_or(0, |ns| ns.iter().filter(|n| n["connected"] == true).count());
            if up >= self.count as usize {
                return;
            }
            if let Some(Ok(Some(status))) = self.child.as_mut().map(|c| c.try_wait()) {
                panic!("gpuq sim agents exited with {status}:\n{}", self.log());
            }
            assert!(
                start.elapsed() < timeout,
                "{up} of {} simulated agents connected after {timeout:?}\n--- sim ---\n{}\n--- server ---\n{}",
                self.count,
                self.log(),
                server.log()
            );
            // `nodes` costs the leader O(nodes); at thousands, poll less.
            std::thread::sleep(Duration::from_millis(
                (u64::from(self.count) / 5).clamp(100, 1000),
            ));
        }
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(|c| c.id())
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("sim.log")).unwrap_or_default()
    }
}

impl Drop for SimAgents {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// A child process killed (and reaped) when the guard drops, so a test that
/// fails half-way leaves no daemon behind.
pub struct KillOnDrop(pub std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A bench knob from the environment, or `default`.
pub fn env_u64(key: &str, default: u64) -> u64 {
    std::env::var(key)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Runs the gpuq binary with a clean environment against `socket`,
/// panicking (naming its first words) when it fails: what a user's shell
/// would run, for the benches.
pub fn run_clean(socket: &Path, args: &[&str]) -> Output {
    let out = clean_command(gpuq_bin())
        .args(args)
        .env("GPUQ_SOCKET", socket)
        .output()
        .expect("run gpuq");
    assert!(
        out.status.success(),
        "gpuq {:?} ({} words): {}",
        &args[..args.len().min(4)],
        args.len(),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// The `p` quantile (0..=1) of `sorted`, nearest rank.
pub fn pct(sorted: &[f64], p: f64) -> f64 {
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}
