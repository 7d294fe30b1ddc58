//! submitit, unchanged from PyPI, drives a real gpuq cluster through the
//! Slurm links: a function's result, a 2-node x 2-task job's ranks,
//! map_array, a failing function's traceback, cancel, and a timeout that
//! checkpoints, requeues itself with `scontrol requeue` and resumes under
//! the same id. The checks are `tests/submitit/check.py`; this gives them a
//! virtualenv (made once under `target/`, from PyPI) and a cluster.

mod common;

use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};
use std::process::Command;

use common::{clean_command, gpuq_bin, Cluster};

/// The submitit release the checks were written against.
const SUBMITIT: &str = "submitit==1.5.4";

/// A virtualenv with submitit; made on first use.
fn venv() -> PathBuf {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/submitit-venv");
    let python = dir.join("bin/python");
    let ready = dir.join(".installed");
    if std::fs::read_to_string(&ready).is_ok_and(|v| v == SUBMITIT) {
        return python;
    }
    let run = |cmd: &mut Command, what: &str| {
        let out = cmd.output().unwrap_or_else(|e| panic!("{what}: {e}"));
        assert!(
            out.status.success(),
            "{what} failed: {}{}\n(needs python3 with venv, e.g. apt-get install python3-venv, \
             and PyPI reachable)",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    };
    let _ = std::fs::remove_dir_all(&dir);
    run(
        Command::new("python3").args(["-m", "venv"]).arg(&dir),
        "python3 -m venv",
    );
    run(
        Command::new(dir.join("bin/pip")).args(["install", "--quiet", SUBMITIT]),
        "pip install submitit",
    );
    std::fs::write(&ready, SUBMITIT).unwrap();
    python
}

#[test]
fn submitit_runs_unchanged() {
    let python = venv();
    let dir = common::shared_tempdir();
    let c = Cluster::start(dir.path(), 2, 2);
    let bin = dir.path().join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    for cmd in gpuq::compat::COMMANDS {
        symlink(gpuq_bin(), bin.join(cmd)).unwrap();
    }
    let folder = dir.path().join("submitit");
    std::fs::create_dir_all(&folder).unwrap();
    let path = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let check = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/submitit/check.py");
    let out = clean_command(&python)
        .arg(&check)
        .arg(&folder)
        .env("PATH", path)
        .env("GPUQ_SOCKET", &c.server.socket)
        .current_dir(dir.path())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    println!("{stdout}");
    assert!(
        out.status.success(),
        "check.py failed:\n{stdout}\n{}\n--- server ---\n{}",
        String::from_utf8_lossy(&out.stderr),
        c.server.log()
    );
    for line in [
        "result: ok",
        "2 nodes x 2 tasks: ok",
        "map_array: ok",
        "traceback: ok",
        "cancel: ok",
        "same id resumes: ok",
    ] {
        assert!(stdout.contains(line), "{line} missing:\n{stdout}");
    }
    // submitit reads every state through sacct; it warns when sacct fails.
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !stderr.contains("sacct error"),
        "submitit could not read sacct:\n{stderr}"
    );
}
