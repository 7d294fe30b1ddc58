//! The Slurm front end as a Slurm user meets it: links named sbatch, squeue,
//! scancel, scontrol and sinfo pointing at the gpuq binary, driving a real
//! cluster (a server and agents as processes, tasks as real processes).

mod common;

use std::io::Write;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};
use std::process::{Output, Stdio};
use std::time::Duration;

use common::{clean_command, gpuq_bin, stderr, Cluster};

const LONG: Duration = Duration::from_secs(60);

/// A directory of links, one per Slurm command, to the binary under test.
fn links(dir: &Path) -> PathBuf {
    let bin = dir.join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    for c in ["sbatch", "squeue", "scancel", "scontrol", "sinfo"] {
        symlink(gpuq_bin(), bin.join(c)).unwrap();
    }
    bin
}

struct Slurm {
    bin: PathBuf,
    socket: PathBuf,
    work: PathBuf,
}

impl Slurm {
    /// Runs the link `command` with `args` in the work dir, `stdin` fed in.
    fn run(&self, command: &str, args: &[&str], stdin: Option<&str>) -> Output {
        let mut child = clean_command(self.bin.join(command))
            .args(args)
            .env("GPUQ_SOCKET", &self.socket)
            .current_dir(&self.work)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("run {command}: {e}"));
        let mut input = child.stdin.take().unwrap();
        input.write_all(stdin.unwrap_or("").as_bytes()).unwrap();
        drop(input);
        child.wait_with_output().unwrap()
    }

    /// Like [`Slurm::run`]; the command must succeed. Its stdout.
    fn ok(&self, command: &str, args: &[&str], stdin: Option<&str>) -> String {
        let out = self.run(command, args, stdin);
        assert!(
            out.status.success(),
            "{command} {args:?} failed ({:?}): {}",
            out.status.code(),
            stderr(&out)
        );
        String::from_utf8(out.stdout).unwrap()
    }

    /// `squeue -h -o %i,%t -t all`: every job the cluster holds, with its code.
    fn codes(&self) -> Vec<String> {
        self.ok("squeue", &["-h", "-o", "%i,%t", "-t", "all"], None)
            .lines()
            .map(str::to_string)
            .collect()
    }
}

#[test]
fn slurm_commands_through_links_submit_list_run_cancel_and_describe() {
    let dir = tempfile::tempdir().unwrap();
    let c = Cluster::start(dir.path(), 2, 2);
    let work = dir.path().join("work");
    std::fs::create_dir_all(&work).unwrap();
    let s = Slurm {
        bin: links(dir.path()),
        socket: c.server.socket.clone(),
        work: work.clone(),
    };

    // A script file with #SBATCH lines runs to completion, its output where
    // its directive says.
    std::fs::write(
        work.join("job.sh"),
        "#!/bin/sh\n#SBATCH -J from-file\n#SBATCH --ntasks=1 --time=5:00\n\
         #SBATCH -o file-%j.out --mail-type=END\necho \"hello from $GPUQ_JOB_ID\"\n",
    )
    .unwrap();
    let out = s.run("sbatch", &["job.sh"], None);
    assert!(out.status.success(), "{}", stderr(&out));
    let printed = String::from_utf8_lossy(&out.stdout).into_owned();
    let id = printed
        .trim()
        .strip_prefix("Submitted batch job ")
        .unwrap_or_else(|| panic!("sbatch printed {printed:?}"))
        .to_string();
    assert!(
        stderr(&out).contains("--mail-type is accepted and ignored"),
        "one warning for the mail flag: {}",
        stderr(&out)
    );
    c.wait_state(&id, "COMPLETED", LONG);
    let text = std::fs::read_to_string(work.join(format!("file-{id}.out"))).unwrap();
    assert_eq!(text.trim(), format!("hello from {id}"));
    let shown = s.ok("scontrol", &["show", "job", &id], None);
    for key in [
        format!("JobId={id} JobName=from-file"),
        "JobState=COMPLETED".into(),
        format!("StdOut={}/file-{id}.out", work.display()),
    ] {
        assert!(shown.contains(&key), "{key} in:\n{shown}");
    }

    // From stdin with --parsable: the id alone; squeue sees it running.
    let gate = work.join("gate");
    let script = format!(
        "#!/bin/sh\n#SBATCH --job-name=gated --gres=gpu:1\nwhile [ ! -e {} ]; do sleep 0.1; done\n",
        gate.display()
    );
    let gated = s.ok("sbatch", &["--parsable"], Some(&script));
    let gated = gated.trim().to_string();
    assert!(gated.parse::<u64>().is_ok(), "--parsable printed {gated:?}");
    c.wait_state(&gated, "RUNNING", LONG);
    let listed = s.ok("squeue", &["-h", "-o", "%i,%t"], None);
    assert!(
        listed.lines().any(|l| l == format!("{gated},R")),
        "{listed}"
    );
    assert_eq!(
        s.ok(
            "squeue",
            &["--noheader", "--format=%j,%A", "--name=gated"],
            None
        ),
        format!("gated,{gated}\n")
    );
    let table = s.ok("squeue", &[], None);
    assert!(
        table
            .lines()
            .next()
            .is_some_and(|h| h.split_whitespace().eq([
                "JOBID",
                "PARTITION",
                "NAME",
                "USER",
                "ST",
                "TIME",
                "NODES",
                "NODELIST(REASON)"
            ])),
        "{table}"
    );
    std::fs::write(&gate, "").unwrap();
    c.wait_state(&gated, "COMPLETED", LONG);
    assert!(
        s.codes().contains(&format!("{gated},CD")),
        "{:?}",
        s.codes()
    );

    // Another, held, waits as PD and is cancelled.
    let held = s.ok("sbatch", &["--parsable", "-H", "--wrap", "sleep 100"], None);
    let held = held.trim().to_string();
    assert_eq!(
        s.ok("squeue", &["-h", "-o", "%i %t %R", "-j", &held], None),
        format!("{held} PD (JobHeldUser)\n")
    );
    let out = s.run("scancel", &[&held], None);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(out.stdout.is_empty(), "scancel is silent");
    c.wait_state(&held, "CANCELLED", LONG);
    let out = s.run("scancel", &["999999"], None);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(
        stderr(&out).starts_with("scancel: error: "),
        "{}",
        stderr(&out)
    );

    // sbatch --wait exits with the job's exit code.
    let out = s.run("sbatch", &["--wait", "--wrap", "exit 3"], None);
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));

    assert_eq!(
        s.ok("scontrol", &["show", "hostnames", "n[1-3]"], None),
        "n1\nn2\nn3\n"
    );
    let nodes = s.ok("sinfo", &["-N"], None);
    let rows: Vec<Vec<&str>> = nodes
        .lines()
        .map(|l| l.split_whitespace().collect())
        .collect();
    assert_eq!(
        rows[0],
        ["NODELIST", "NODES", "PARTITION", "STATE"],
        "{nodes}"
    );
    assert_eq!(rows.len(), 3, "{nodes}");
    assert_eq!(rows[1][..3], ["n1", "1", "default*"], "{nodes}");
    assert_eq!(rows[2][..3], ["n2", "1", "default*"], "{nodes}");
    let summary = s.ok("sinfo", &["-h"], None);
    assert!(summary.starts_with("default*"), "{summary}");

    // An unknown flag is refused, naming it, and nothing is submitted.
    let before = s.codes();
    let out = s.run("sbatch", &["--no-such-flag", "job.sh"], None);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains("sbatch: error: unrecognized option '--no-such-flag'"),
        "{}",
        stderr(&out)
    );
    let out = s.run(
        "sbatch",
        &[],
        Some("#!/bin/sh\n#SBATCH --frobnicate\ntrue\n"),
    );
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains("line 2") && stderr(&out).contains("--frobnicate"),
        "{}",
        stderr(&out)
    );
    assert_eq!(s.codes(), before, "nothing was submitted");

    // Every job here is the caller's.
    let mine = s.ok("squeue", &["--me", "-h", "-o", "%i", "-t", "all"], None);
    assert_eq!(mine.lines().count(), before.len(), "{mine}");

    // `gpuq slurm squeue` is the same command.
    let out = clean_command(gpuq_bin())
        .args(["slurm", "squeue", "-h", "-o", "%i,%t", "-t", "all"])
        .env("GPUQ_SOCKET", &s.socket)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(
        String::from_utf8(out.stdout).unwrap().lines().count(),
        before.len()
    );
}
