//! The README's quick start, run as written: `gpuq dev` in a clean HOME, then
//! the marked shell block from a clean directory, finding the dev socket with
//! no flags.

mod common;

use std::process::{Command, Stdio};
use std::time::Duration;

fn quickstart_block() -> String {
    let readme = include_str!("../README.md");
    let start = readme
        .find("<!-- quickstart")
        .expect("README has a quickstart marker");
    let rest = &readme[start..];
    let body = rest
        .split_once("```sh\n")
        .expect("a sh block after the marker")
        .1;
    body.split_once("\n```")
        .expect("the block ends")
        .0
        .to_string()
}

#[test]
fn the_readme_quick_start_works_as_written() {
    let home = tempfile::tempdir().unwrap();
    let work = tempfile::tempdir().unwrap();
    let bin_dir = common::gpuq_bin().parent().unwrap().to_path_buf();
    let path = format!(
        "{}:{}",
        bin_dir.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let dev_log = std::fs::File::create(home.path().join("dev.log")).unwrap();
    let mut dev = common::gpuq_command()
        .arg("dev")
        .env("HOME", home.path())
        .env_remove("XDG_STATE_HOME")
        .env_remove("GPUQ_SOCKET")
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(home.path().join("dev.out")).unwrap())
        .stderr(dev_log)
        .spawn()
        .unwrap();
    let run = |script: &str| {
        Command::new("sh")
            .args(["-ec", script])
            .current_dir(work.path())
            .env("HOME", home.path())
            .env("PATH", &path)
            .env_remove("XDG_STATE_HOME")
            .env_remove("GPUQ_SOCKET")
            .stdin(Stdio::null())
            .output()
            .unwrap()
    };
    let start = std::time::Instant::now();
    loop {
        let out = run("gpuq nodes --json");
        let ready = serde_json::from_slice::<serde_json::Value>(&out.stdout)
            .map(|v| v.as_array().is_some_and(|a| a.len() == 2))
            .unwrap_or(false);
        if ready {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "gpuq dev did not serve 2 nodes: {}\n--- dev ---\n{}",
            String::from_utf8_lossy(&out.stderr),
            std::fs::read_to_string(home.path().join("dev.log")).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let out = run(&quickstart_block());
    // The Slurm links `gpuq dev` made, through the PATH line it printed.
    let printed = std::fs::read_to_string(home.path().join("dev.out")).unwrap_or_default();
    let export = printed
        .lines()
        .find_map(|l| l.split_once("export PATH=").map(|(_, p)| p.to_string()))
        .unwrap_or_else(|| panic!("gpuq dev printed no PATH line for the links:\n{printed}"));
    let slurm = run(&format!("export PATH={export}; squeue -h -t all -o %T"));
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(dev.id() as i32),
        nix::sys::signal::Signal::SIGINT,
    );
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(
        out.status.success(),
        "the quick start failed:\n{stdout}\n{stderr}\n--- dev ---\n{}",
        std::fs::read_to_string(home.path().join("dev.log")).unwrap_or_default()
    );
    assert!(
        stdout.contains("node01") && stdout.contains("node02"),
        "{stdout}"
    );
    assert!(
        stdout.contains("rank 1 of 2 on node[01-02] sees GPUs 0,1,2,3,4,5,6,7"),
        "{stdout}"
    );
    assert!(stdout.contains("rank 0 of 2"), "{stdout}");
    assert!(stdout.contains("COMPLETED"), "{stdout}");
    assert_eq!(
        String::from_utf8_lossy(&slurm.stdout),
        "COMPLETED\n",
        "squeue through gpuq dev's link: {}",
        String::from_utf8_lossy(&slurm.stderr)
    );
    let waited = std::time::Instant::now();
    while dev.try_wait().unwrap().is_none() && waited.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(dev.try_wait().unwrap().is_some(), "Ctrl-C stops gpuq dev");
}
