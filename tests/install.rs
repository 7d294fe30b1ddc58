//! `packaging/install.sh`, the `curl | sh` installer, run for real into a temp
//! root (`--root`): what each role writes, that the files are what the daemons
//! and systemd read, that a second run keeps an edited config, and that every
//! bad input exits 2 with a message and writes nothing.
//!
//! `--root` never starts anything, so these tests are the same on a host with
//! systemd; only the printed start hint differs, and each test that checks it
//! says which branch ran.

mod common;

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

use common::{gpuq_bin, wait_for, Server};
use gpuq::config::{AgentConfig, AgentRole, ServerConfig};

const TOKEN: &str = "gpuq1-abc123.0123456789abcdefABCDEF0123456789.fp";

fn repo(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(path)
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()))
}

/// Runs the installer as `sh` would from `curl | sh`, with no ambient
/// defaults (`GPUQ_URL`, `PREFIX`) leaking in.
fn run_installer(args: &[&str], path_env: Option<&Path>) -> Output {
    let mut cmd = Command::new("/bin/sh");
    cmd.arg(repo("packaging/install.sh"))
        .args(args)
        .env_remove("GPUQ_URL")
        .env_remove("PREFIX")
        .stdin(Stdio::null());
    if let Some(p) = path_env {
        cmd.env("PATH", p);
    }
    cmd.output().expect("run sh packaging/install.sh")
}

/// Installs into `root` with the binary under test; the install must succeed.
fn install(root: &Path, args: &[&str]) -> String {
    let bin = gpuq_bin();
    let mut full = vec![
        "--root",
        root.to_str().unwrap(),
        "--binary",
        bin.to_str().unwrap(),
    ];
    full.extend_from_slice(args);
    let out = run_installer(&full, None);
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "install.sh {args:?} failed ({:?}):\n{stdout}{}",
        out.status.code(),
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

fn mode(path: &Path) -> u32 {
    std::fs::metadata(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .permissions()
        .mode()
        & 0o7777
}

/// The lines where `written` differs from the example it was made from; both
/// must have the same number of lines (the installer edits lines in place).
fn edited_lines(example: &str, written: &str) -> Vec<String> {
    let (a, b): (Vec<_>, Vec<_>) = (example.lines().collect(), written.lines().collect());
    assert_eq!(a.len(), b.len(), "line count differs:\n{written}");
    a.iter()
        .zip(&b)
        .filter(|(x, y)| x != y)
        .map(|(_, y)| y.to_string())
        .collect()
}

/// The printed way to start the daemon: the full command line when systemd is
/// not running (this machine, CI), else the systemctl line.
fn assert_start_hint(stdout: &str, unit: &str, by_hand: &str) {
    assert!(stdout.contains("not started"), "{stdout}");
    if Path::new("/run/systemd/system").is_dir() {
        eprintln!("branch: systemd is running; checking the systemctl hint");
        let line = format!("systemctl daemon-reload && systemctl enable --now {unit}");
        assert!(stdout.contains(&line), "expected {line:?} in:\n{stdout}");
    } else {
        eprintln!("branch: systemd is not running; checking the by-hand command");
        assert!(stdout.contains("systemd is not running here"), "{stdout}");
        assert!(
            stdout.lines().any(|l| l.trim() == by_hand),
            "expected the line {by_hand:?} in:\n{stdout}"
        );
    }
}

/// The `KEY=value` lines of an env file, quotes stripped (as systemd and sh do).
fn env_value(text: &str, key: &str) -> Option<String> {
    text.lines()
        .find_map(|l| l.strip_prefix(&format!("{key}=")))
        .map(|v| v.trim_matches('"').to_string())
}

fn assert_binary_installed(path: &Path) {
    assert_eq!(
        mode(path) & 0o111,
        0o111,
        "{} is executable",
        path.display()
    );
    let out = Command::new(path).arg("--version").output().unwrap();
    assert!(out.status.success(), "{} runs", path.display());
    assert_eq!(
        read_bytes(path),
        read_bytes(&gpuq_bin()),
        "the binary given"
    );
}

fn read_bytes(path: &Path) -> Vec<u8> {
    std::fs::read(path).unwrap()
}

#[test]
fn compute_agent_gets_binary_config_env_file_unit_and_dirs() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let out = install(
        root,
        &["--agent", "--join", "10.0.0.1:7420", "--token", TOKEN],
    );

    assert_binary_installed(&root.join("usr/local/bin/gpuq"));

    let conf = root.join("etc/gpuq/gpuq.toml");
    let cfg = AgentConfig::load(Some(&conf), &[]).expect("the written config loads");
    assert_eq!(cfg.role, AgentRole::Compute);
    assert_eq!(cfg.servers, vec!["10.0.0.1:7420".to_string()]);
    assert_eq!(
        edited_lines(&read(&repo("config/agent.toml")), &read(&conf)),
        vec![r#"servers = ["10.0.0.1:7420"]"#],
        "the config is config/agent.toml with the servers line set"
    );
    assert_eq!(mode(&conf), 0o644);

    let env = root.join("etc/gpuq/agent.env");
    assert_eq!(mode(&env), 0o600, "the token file is private");
    let text = read(&env);
    assert_eq!(env_value(&text, "GPUQ_TOKEN").as_deref(), Some(TOKEN));
    assert_eq!(
        env_value(&text, "GPUQ_AGENT_ARGS").as_deref(),
        Some("--role compute --join 10.0.0.1:7420")
    );

    let unit = read(&root.join("etc/systemd/system/gpuq-agent.service"));
    assert_eq!(unit, read(&repo("systemd/gpuq-agent.service")));
    for line in [
        "KillMode=process",
        "Delegate=yes",
        "StateDirectory=gpuq/agent",
        "StateDirectoryMode=0711",
        "UMask=0077",
        "EnvironmentFile=-/etc/gpuq/agent.env",
        "ExecStart=/usr/local/bin/gpuq agent --config /etc/gpuq/gpuq.toml $GPUQ_AGENT_ARGS",
    ] {
        assert!(unit.lines().any(|l| l == line), "unit has {line}");
    }
    assert!(!root.join("etc/systemd/system/gpuq-server.service").exists());

    assert_eq!(mode(&root.join("var/lib/gpuq/agent")), 0o711);
    assert!(root.join("run/gpuq").is_dir());

    assert_start_hint(
        &out,
        "gpuq-agent",
        "sh -c '. /etc/gpuq/agent.env && export GPUQ_TOKEN && exec /usr/local/bin/gpuq agent --config /etc/gpuq/gpuq.toml --role compute --join 10.0.0.1:7420'",
    );
}

#[test]
fn login_node_sets_the_role_and_resolves_a_host_name_for_join() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let out = install(
        root,
        &[
            "--login",
            "--join",
            "localhost:7420",
            "--token",
            TOKEN,
            "--no-start",
        ],
    );
    let conf = root.join("etc/gpuq/gpuq.toml");
    let cfg = AgentConfig::load(Some(&conf), &[]).unwrap();
    assert_eq!(cfg.role, AgentRole::Login);
    assert_eq!(cfg.servers, vec!["localhost:7420".to_string()]);
    // gpuq agent --join parses an address, so the name is resolved once.
    let env = read(&root.join("etc/gpuq/agent.env"));
    assert_eq!(
        env_value(&env, "GPUQ_AGENT_ARGS").as_deref(),
        Some("--role login --join 127.0.0.1:7420")
    );
    assert_start_hint(
        &out,
        "gpuq-agent",
        "sh -c '. /etc/gpuq/agent.env && export GPUQ_TOKEN && exec /usr/local/bin/gpuq agent --config /etc/gpuq/gpuq.toml --role login --join 127.0.0.1:7420'",
    );
}

#[test]
fn first_server_bootstraps_and_advertises_the_given_address() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let out = install(
        root,
        &["--server", "--bootstrap", "--advertise", "10.1.2.3:7420"],
    );
    assert_binary_installed(&root.join("usr/local/bin/gpuq"));

    let conf = root.join("etc/gpuq/gpuq.toml");
    let cfg = ServerConfig::load(Some(&conf), &[]).expect("the written config loads");
    assert_eq!(
        cfg.advertise_addr().unwrap(),
        "10.1.2.3:7420".parse().unwrap()
    );
    assert_eq!(
        edited_lines(&read(&repo("config/server.toml")), &read(&conf)),
        vec![r#"advertise = "10.1.2.3:7420""#]
    );

    let env = root.join("etc/gpuq/server.env");
    assert_eq!(mode(&env), 0o600);
    let text = read(&env);
    assert_eq!(
        env_value(&text, "GPUQ_SERVER_ARGS").as_deref(),
        Some("--bootstrap")
    );
    assert_eq!(
        env_value(&text, "GPUQ_TOKEN"),
        None,
        "a bootstrap needs no token"
    );

    let unit = read(&root.join("etc/systemd/system/gpuq-server.service"));
    assert_eq!(unit, read(&repo("systemd/gpuq-server.service")));
    assert!(unit.lines().any(|l| l
        == "ExecStart=/usr/local/bin/gpuq server --config /etc/gpuq/gpuq.toml $GPUQ_SERVER_ARGS"));
    assert!(unit
        .lines()
        .any(|l| l == "EnvironmentFile=-/etc/gpuq/server.env"));
    // The state (the CA's key among it) is closed to everyone else.
    for line in [
        "StateDirectory=gpuq/server",
        "StateDirectoryMode=0700",
        "UMask=0077",
    ] {
        assert!(unit.lines().any(|l| l == line), "unit has {line}");
    }
    assert_eq!(mode(&root.join("var/lib/gpuq/server")), 0o700);
    assert!(!root.join("var/lib/gpuq/agent").exists());

    assert_start_hint(
        &out,
        "gpuq-server",
        "/usr/local/bin/gpuq server --config /etc/gpuq/gpuq.toml --bootstrap",
    );
}

#[test]
fn a_server_without_advertise_is_written_but_not_started() {
    // Under --root no address is guessed: the image is not the host.
    let dir = tempfile::tempdir().unwrap();
    let out = install(dir.path(), &["--server", "--bootstrap"]);
    let cfg = ServerConfig::load(Some(&dir.path().join("etc/gpuq/gpuq.toml")), &[]).unwrap();
    assert_eq!(cfg.advertise, None);
    assert!(out.contains("not started: advertise is not set"), "{out}");
    assert!(out.contains("set advertise"), "{out}");
}

#[test]
fn a_later_server_gets_join_and_token_passed_through() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let out = install(
        root,
        &["--server", "--join", "10.0.0.1:7420", "--token", TOKEN],
    );
    let text = read(&root.join("etc/gpuq/server.env"));
    assert_eq!(mode(&root.join("etc/gpuq/server.env")), 0o600);
    assert_eq!(
        env_value(&text, "GPUQ_SERVER_ARGS").as_deref(),
        Some("--join 10.0.0.1:7420")
    );
    assert_eq!(env_value(&text, "GPUQ_TOKEN").as_deref(), Some(TOKEN));

    let help = Command::new(gpuq_bin())
        .args(["server", "--help"])
        .output()
        .unwrap();
    let can_join = String::from_utf8_lossy(&help.stdout).contains("--join");
    eprintln!("this binary's server has --join: {can_join}");
    assert_eq!(
        out.contains("has no --join yet"),
        !can_join,
        "the installer warns exactly when the server cannot join:\n{out}"
    );
}

#[test]
fn a_second_run_keeps_an_edited_config_and_an_upgrade_keeps_the_env_file() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    install(
        root,
        &["--agent", "--join", "10.0.0.1:7420", "--token", TOKEN],
    );
    let conf = root.join("etc/gpuq/gpuq.toml");
    let edited = format!("{}features = [\"ib\"]\n", read(&conf));
    std::fs::write(&conf, &edited).unwrap();

    let out = install(
        root,
        &["--agent", "--join", "10.0.0.2:7420", "--token", TOKEN],
    );
    assert!(out.contains(&format!("kept {}", conf.display())), "{out}");
    assert_eq!(read(&conf), edited, "the edited config is untouched");
    let cfg = AgentConfig::load(Some(&conf), &[]).unwrap();
    assert_eq!(cfg.features, vec!["ib".to_string()]);
    let env = root.join("etc/gpuq/agent.env");
    assert_eq!(
        env_value(&read(&env), "GPUQ_AGENT_ARGS").as_deref(),
        Some("--role compute --join 10.0.0.2:7420"),
        "new join flags replace the old"
    );

    // The role alone is an upgrade: binary and unit again, flags kept.
    let before = read(&env);
    let out = install(root, &["--agent"]);
    assert!(out.contains("kept"), "{out}");
    assert_eq!(read(&env), before);
    assert_eq!(mode(&env), 0o600);
    assert_binary_installed(&root.join("usr/local/bin/gpuq"));

    // ...but not into another role.
    let out = run_installer(
        &[
            "--root",
            root.to_str().unwrap(),
            "--binary",
            gpuq_bin().to_str().unwrap(),
            "--login",
        ],
        None,
    );
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("another role"));
}

#[test]
fn prefix_moves_the_binary_and_the_unit_follows() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    install(
        root,
        &[
            "--agent",
            "--join",
            "10.0.0.1:7420",
            "--token",
            TOKEN,
            "--prefix",
            "/opt/gpuq",
        ],
    );
    assert_binary_installed(&root.join("opt/gpuq/bin/gpuq"));
    assert!(!root.join("usr/local/bin/gpuq").exists());
    let unit = read(&root.join("etc/systemd/system/gpuq-agent.service"));
    assert!(
        unit.contains("ExecStart=/opt/gpuq/bin/gpuq agent --config /etc/gpuq/gpuq.toml"),
        "{unit}"
    );
}

/// The Slurm commands the binary speaks: the installer links each one.
const SLURM_COMMANDS: &[&str] = &gpuq::compat::COMMANDS;

#[test]
fn slurm_command_links_sit_beside_the_binary_unless_skipped() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let bin = root.join("usr/local/bin");
    std::fs::create_dir_all(&bin).unwrap();
    // A real Slurm's sinfo is not replaced.
    std::fs::write(bin.join("sinfo"), "#!/bin/sh\necho real slurm\n").unwrap();
    let out = install(
        root,
        &["--agent", "--join", "10.0.0.1:7420", "--token", TOKEN],
    );
    assert!(out.contains("sinfo exists and is not a link"), "{out}");
    assert_eq!(read(&bin.join("sinfo")), "#!/bin/sh\necho real slurm\n");
    for cmd in SLURM_COMMANDS.iter().filter(|c| **c != "sinfo") {
        let link = bin.join(cmd);
        assert_eq!(
            std::fs::read_link(&link).unwrap_or_else(|e| panic!("{}: {e}", link.display())),
            Path::new("gpuq"),
            "{cmd} links to the binary beside it"
        );
    }
    let help = Command::new(bin.join("sbatch"))
        .arg("--help")
        .output()
        .unwrap();
    assert!(help.status.success());
    assert!(
        String::from_utf8_lossy(&help.stdout).contains("as Slurm's sbatch"),
        "the link speaks sbatch"
    );

    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    install(
        root,
        &[
            "--agent",
            "--join",
            "10.0.0.1:7420",
            "--token",
            TOKEN,
            "--no-slurm-links",
        ],
    );
    assert_binary_installed(&root.join("usr/local/bin/gpuq"));
    for cmd in SLURM_COMMANDS {
        assert!(
            std::fs::symlink_metadata(root.join("usr/local/bin").join(cmd)).is_err(),
            "--no-slurm-links made no {cmd}"
        );
    }
}

#[test]
fn url_downloads_the_binary() {
    if !Path::new("/usr/bin/curl").exists() && !Path::new("/bin/curl").exists() {
        eprintln!("NOT RUN: url_downloads_the_binary needs curl (for a file:// URL)");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let url = format!("file://{}", gpuq_bin().display());
    let out = run_installer(
        &[
            "--root",
            root.to_str().unwrap(),
            "--url",
            &url,
            "--server",
            "--bootstrap",
        ],
        None,
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_binary_installed(&root.join("usr/local/bin/gpuq"));
}

/// A daemon started by a test, killed when the test ends however it ends.
struct Daemon(Child);

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn the_installed_unit_command_joins_a_real_cluster() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::bootstrap(&dir.path().join("server"));
    let token = server
        .ok(&["token", "create", "--role", "agent"])
        .trim()
        .to_string();
    let root = dir.path().join("root");
    install(
        &root,
        &["--login", "--join", &server.addr(), "--token", &token],
    );

    // What systemd would run: the unit's ExecStart with its EnvironmentFile,
    // `$GPUQ_AGENT_ARGS` split into words. Paths point into the root; the
    // data dir and socket move there through the GPUQ_* overrides.
    let unit = read(&root.join("etc/systemd/system/gpuq-agent.service"));
    let field = |key: &str| {
        unit.lines()
            .find_map(|l| l.strip_prefix(key))
            .unwrap_or_else(|| panic!("unit has {key}"))
            .to_string()
    };
    let in_root = |s: &str| {
        s.replace(
            "/usr/local/bin/",
            &format!("{}/usr/local/bin/", root.display()),
        )
        .replace("/etc/gpuq/", &format!("{}/etc/gpuq/", root.display()))
    };
    let env_file = in_root(field("EnvironmentFile=").trim_start_matches('-'));
    let exec = in_root(&field("ExecStart="));
    let socket = root.join("run/gpuq/gpuq.sock");
    let log = std::fs::File::create(dir.path().join("agent.log")).unwrap();
    let _agent = Daemon(
        Command::new("/bin/sh")
            .arg("-c")
            .arg(format!("set -a && . {env_file} && exec {exec}"))
            .env("GPUQ_DATA_DIR", root.join("var/lib/gpuq/agent"))
            .env("GPUQ_SOCKET", &socket)
            .env("GPUQ_NODE_NAME", "login1")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap(),
    );
    wait_for(
        "the installed login agent to join and serve its socket",
        Duration::from_secs(30),
        || common::cli(&socket, &["cluster"]).status.success(),
    );
    assert!(root.join("var/lib/gpuq/agent/tls/node.crt").exists());
}

#[test]
fn bad_input_exits_2_names_the_flag_and_writes_nothing() {
    let bin = gpuq_bin();
    let bin = bin.to_str().unwrap();
    let agent = ["--agent", "--join", "10.0.0.1:7420", "--token", TOKEN];
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (
            vec!["--binary", bin, "--agent", "--frobnicate"],
            "--frobnicate",
        ),
        (vec!["--binary", bin], "no role"),
        (
            [&["--binary", bin, "--login"][..], &agent[..]].concat(),
            "two roles",
        ),
        (
            vec!["--binary", bin, "--agent"],
            "--join HOST:PORT --token T",
        ),
        (
            vec!["--binary", bin, "--login"],
            "--join HOST:PORT --token T",
        ),
        (
            vec!["--binary", bin, "--agent", "--join", "10.0.0.1:7420"],
            "--token",
        ),
        (vec!["--binary", bin, "--agent", "--token", TOKEN], "--join"),
        (
            vec!["--binary", bin, "--agent", "--join", "--token", TOKEN],
            "--join needs a value",
        ),
        (
            vec![
                "--binary", bin, "--agent", "--join", "10.0.0.1", "--token", TOKEN,
            ],
            "not HOST:PORT",
        ),
        (vec!["--binary", bin, "--server"], "--bootstrap"),
        (
            vec![
                "--binary",
                bin,
                "--server",
                "--bootstrap",
                "--join",
                "10.0.0.1:7420",
                "--token",
                TOKEN,
            ],
            "exclude each other",
        ),
        (
            [&["--binary", bin, "--bootstrap"][..], &agent[..]].concat(),
            "--bootstrap is only for --server",
        ),
        (
            vec![
                "--binary",
                bin,
                "--server",
                "--bootstrap",
                "--advertise",
                "gpu1:7420",
            ],
            "--advertise",
        ),
        (
            vec![
                "--binary",
                bin,
                "--agent",
                "--join",
                "10.0.0.1:7420",
                "--token",
                "a b",
            ],
            "--token",
        ),
        (
            [&["--binary", bin, "--no-start=yes"][..], &agent[..]].concat(),
            "--no-start takes no value",
        ),
        (
            [&["--binary", bin, "--prefix", "usr"][..], &agent[..]].concat(),
            "--prefix",
        ),
        (
            [&["--binary", "/nonexistent/gpuq"][..], &agent[..]].concat(),
            "--binary /nonexistent/gpuq",
        ),
        (agent.to_vec(), "--binary PATH or --url URL"),
        (
            [
                &["--binary", bin, "--url", "https://example.com/gpuq"][..],
                &agent[..],
            ]
            .concat(),
            "give one",
        ),
    ];
    for (args, needle) in cases {
        let dir = tempfile::tempdir().unwrap();
        let mut full = vec!["--root", dir.path().to_str().unwrap()];
        full.extend(&args);
        refused(&run_installer(&full, None), &args, needle, dir.path());
    }

    // --url with neither curl nor wget on PATH.
    let dir = tempfile::tempdir().unwrap();
    let empty_path = tempfile::tempdir().unwrap();
    let mut full = vec![
        "--root",
        dir.path().to_str().unwrap(),
        "--url",
        "https://example.com/gpuq",
    ];
    full.extend(&agent);
    refused(
        &run_installer(&full, Some(empty_path.path())),
        &full,
        "curl or wget",
        dir.path(),
    );
}

fn refused(out: &Output, args: &[&str], needle: &str, root: &Path) {
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        out.status.code(),
        Some(2),
        "{args:?} should exit 2, got {:?}: {err}",
        out.status.code()
    );
    assert!(
        err.contains(needle),
        "{args:?}: expected {needle:?} in {err:?}"
    );
    assert_eq!(err.trim_end().lines().count(), 1, "one line: {err:?}");
    assert!(out.stdout.is_empty(), "{args:?} printed progress");
    let left: Vec<_> = std::fs::read_dir(root).unwrap().collect();
    assert!(left.is_empty(), "{args:?} wrote {left:?}");
}
