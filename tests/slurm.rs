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
    for c in gpuq::compat::COMMANDS {
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
    /// A cluster of `agents` nodes with `gpus` GPUs each, and the Slurm
    /// links to drive it from a work dir under `dir`.
    fn start(dir: &Path, agents: usize, gpus: u32) -> (Cluster, Slurm) {
        let c = Cluster::start(dir, agents, gpus);
        let work = dir.join("work");
        std::fs::create_dir_all(&work).unwrap();
        let s = Slurm {
            bin: links(dir),
            socket: c.server.socket.clone(),
            work,
        };
        (c, s)
    }

    /// Runs the link `command` with `args` in the work dir, `stdin` fed in.
    fn run(&self, command: &str, args: &[&str], stdin: Option<&str>) -> Output {
        // The links come first on PATH, so a job's script finds srun and
        // scontrol as a Slurm user's would.
        let path = format!(
            "{}:{}",
            self.bin.display(),
            std::env::var("PATH").unwrap_or_default()
        );
        let mut child = clean_command(self.bin.join(command))
            .args(args)
            .env("GPUQ_SOCKET", &self.socket)
            .env("PATH", path)
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
    let (c, s) = Slurm::start(dir.path(), 2, 2);
    let work = s.work.clone();

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
    // sacct: pending is PENDING with its reason; cancelled names the uid.
    let me = nix::unistd::Uid::current();
    assert_eq!(
        s.ok(
            "sacct",
            &["-j", &held, "-n", "-P", "-o", "JobID,State,Start,NodeList"],
            None
        ),
        format!("{held}|CANCELLED by {me}|Unknown|None assigned\n")
    );
    let bad = s.run("sacct", &["-o", "JobID,Sate"], None);
    assert_eq!(bad.status.code(), Some(1), "{}", stderr(&bad));
    assert!(
        stderr(&bad).contains("did you mean State?"),
        "{}",
        stderr(&bad)
    );
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

/// The lines of `text` that start with `prefix`, sorted.
fn sorted_lines(text: &str, prefix: &str) -> Vec<String> {
    let mut lines: Vec<String> = text
        .lines()
        .filter(|l| l.starts_with(prefix))
        .map(str::to_string)
        .collect();
    lines.sort();
    lines
}

#[test]
fn a_batch_script_runs_once_and_srun_runs_steps_in_its_allocation() {
    let dir = tempfile::tempdir().unwrap();
    let (c, s) = Slurm::start(dir.path(), 2, 2);
    let work = s.work.clone();
    // The torchrun-in-Slurm glue: the script once, then steps on all the
    // nodes, on one named node, and one that fails.
    let script = r#"#!/bin/sh
#SBATCH --nodes=2 --ntasks-per-node=2 --gres=gpu:2 --cpus-per-task=1
#SBATCH --time=5:00 --output=logs-%j.txt
echo "batch procid=$SLURM_PROCID nnodes=$SLURM_NNODES ntasks=$SLURM_NTASKS tpn=$SLURM_TASKS_PER_NODE gpus=$CUDA_VISIBLE_DEVICES step=${SLURM_STEP_ID:-none}"
srun --mpi=pmix_v3 sh -c 'echo "task rank=$SLURM_PROCID local=$SLURM_LOCALID node=$SLURM_NODEID host=$SLURMD_NODENAME gpus=$CUDA_VISIBLE_DEVICES step=$SLURM_STEP_ID world=$WORLD_SIZE"'
head=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
srun --nodes=1 --ntasks=1 -w "$head" sh -c 'echo "head on $SLURMD_NODENAME ntasks=$SLURM_NTASKS"'
srun -l -n 3 sh -c 'echo labelled; echo oops >&2'
srun sh -c 'exit 3'
echo "srun exit=$?"
"#;
    let id = s
        .ok("sbatch", &["--parsable"], Some(script))
        .trim()
        .to_string();
    c.wait_state(&id, "COMPLETED", LONG);
    let out = std::fs::read_to_string(work.join(format!("logs-{id}.txt"))).unwrap();

    // The batch script ran once, on the first node, seeing the node's GPUs.
    let batch = sorted_lines(&out, "batch ");
    assert_eq!(
        batch,
        ["batch procid=0 nnodes=2 ntasks=4 tpn=2(x2) gpus=0,1 step=none"],
        "{out}"
    );
    // The default step: every node, the job's tasks per node, distinct
    // ranks, each seeing all of its node's GPUs.
    let tasks = sorted_lines(&out, "task ");
    assert_eq!(tasks.len(), 4, "{out}");
    for (rank, line) in tasks.iter().enumerate() {
        let node = rank / 2;
        let expect = format!(
            "task rank={rank} local={} node={node} host=n{} gpus=0,1 step=0 world=4",
            rank % 2,
            node + 1
        );
        assert_eq!(*line, expect, "{out}");
    }
    assert_eq!(
        sorted_lines(&out, "head "),
        ["head on n1 ntasks=1"],
        "{out}"
    );
    // -l labels each line with the task's rank; stderr is streamed too.
    assert_eq!(
        sorted_lines(&out, "0: ")
            .into_iter()
            .chain(sorted_lines(&out, "1: "))
            .chain(sorted_lines(&out, "2: "))
            .collect::<Vec<_>>(),
        [
            "0: labelled",
            "0: oops",
            "1: labelled",
            "1: oops",
            "2: labelled",
            "2: oops"
        ],
        "{out}"
    );
    assert!(out.contains("srun exit=3"), "{out}");
    assert!(
        out.contains("gpuq offers no PMIx"),
        "one note about --mpi: {out}"
    );

    // Every step is in the job's record, with how it ended.
    let job = c.job(&id);
    let steps = job["run"]["steps"].as_array().expect("steps recorded");
    assert_eq!(steps.len(), 4, "{job}");
    assert!(steps.iter().all(|s| s["end_time"].is_u64()), "{job}");

    // sacct lists the job, its batch step and each srun step.
    let acct = s.ok(
        "sacct",
        &[
            "-j",
            &id,
            "-n",
            "-P",
            "-o",
            "JobID,State,ExitCode,NodeList,NTasks",
        ],
        None,
    );
    assert_eq!(
        acct,
        format!(
            "{id}|COMPLETED|0:0|n[1-2]|\n\
             {id}.batch|COMPLETED|0:0|n1|1\n\
             {id}.0|COMPLETED|0:0|n[1-2]|4\n\
             {id}.1|COMPLETED|0:0|n1|1\n\
             {id}.2|COMPLETED|0:0|n[1-2]|3\n\
             {id}.3|FAILED|3:0|n[1-2]|4\n"
        )
    );
    // The default view: today's jobs of this user, steps under their job.
    let table = s.ok("sacct", &[], None);
    let lines: Vec<&str> = table.lines().collect();
    assert!(
        lines[0].starts_with("JobID           JobName  Partition"),
        "{table}"
    );
    assert!(
        lines.iter().any(|l| l.starts_with(&format!("{id}.3 "))),
        "{table}"
    );
}

#[test]
fn srun_outside_an_allocation_gets_one_streams_and_returns_the_exit_code() {
    let dir = tempfile::tempdir().unwrap();
    let (_c, s) = Slurm::start(dir.path(), 2, 2);
    let out = s.ok(
        "srun",
        &[
            "-N",
            "2",
            "-n",
            "3",
            "-l",
            "sh",
            "-c",
            "echo $SLURM_PROCID of $SLURM_NTASKS on $SLURM_NODEID",
        ],
        None,
    );
    let mut lines: Vec<&str> = out.lines().collect();
    lines.sort();
    assert_eq!(
        lines,
        ["0: 0 of 3 on 0", "1: 1 of 3 on 0", "2: 2 of 3 on 1"],
        "{out}"
    );

    let failed = s.run("srun", &["sh", "-c", "echo before; exit 7"], None);
    assert_eq!(failed.status.code(), Some(7), "{}", stderr(&failed));
    assert_eq!(String::from_utf8_lossy(&failed.stdout), "before\n");
    assert!(stderr(&failed).contains("task 0"), "{}", stderr(&failed));

    // Both allocations were released and ended COMPLETED.
    let codes = s.codes();
    assert_eq!(codes.len(), 2, "{codes:?}");
    assert!(codes.iter().all(|c| c.ends_with(",CD")), "{codes:?}");

    // Bad shapes are refused before anything is queued.
    let out = s.run("srun", &["-N", "3", "hostname"], None);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let out = s.run("srun", &["--pty", "bash"], None);
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains("--pty"), "{}", stderr(&out));
    let out = s.run("srun", &[], None);
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains("no command"), "{}", stderr(&out));
    assert_eq!(s.codes().len(), 2, "nothing more was queued");
}

/// Waits until `path` contains `text`; its content.
fn wait_for_text(path: &Path, text: &str) -> String {
    let start = std::time::Instant::now();
    loop {
        let content = std::fs::read_to_string(path).unwrap_or_default();
        if content.contains(text) {
            return content;
        }
        assert!(
            start.elapsed() < LONG,
            "{} never said {text:?}: {content}",
            path.display()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn scancel_signal_reaches_the_steps_or_the_batch_script() {
    let dir = tempfile::tempdir().unwrap();
    let (c, s) = Slurm::start(dir.path(), 1, 2);
    let work = s.work.clone();
    // The step checkpoints on USR1; the batch script notes USR2 (-b) and
    // carries on.
    let script = r#"#!/bin/bash
trap 'echo "batch got USR2"' USR2
srun bash -c 'trap "echo step got USR1; exit 0" USR1; trap "echo step got USR2" USR2; echo ready; while :; do sleep 0.1; done' &
wait
wait
echo "batch done"
"#;
    let id = s
        .ok("sbatch", &["--parsable"], Some(script))
        .trim()
        .to_string();
    let out = work.join(format!("slurm-{id}.out"));
    wait_for_text(&out, "ready");
    s.ok("scancel", &["--signal", "USR2", "-b", &id], None);
    wait_for_text(&out, "batch got USR2");
    // srun passed it on to its step, as Slurm's does.
    wait_for_text(&out, "step got USR2");
    s.ok("scancel", &["-s", "SIGUSR1", &id], None);
    c.wait_state(&id, "COMPLETED", LONG);
    let text = std::fs::read_to_string(&out).unwrap();
    assert!(text.contains("step got USR1"), "{text}");
    assert!(text.contains("batch done"), "{text}");

    // Bad input: an unknown signal, and a finished job.
    let bad = s.run("scancel", &["--signal", "BOGUS", &id], None);
    assert_eq!(bad.status.code(), Some(1));
    assert!(stderr(&bad).contains("BOGUS"), "{}", stderr(&bad));
    let done = s.run("scancel", &["--signal", "USR1", &id], None);
    assert_eq!(done.status.code(), Some(1), "{}", stderr(&done));
}

#[test]
fn salloc_runs_a_command_in_an_allocation_whose_sruns_use_it() {
    let dir = tempfile::tempdir().unwrap();
    let (_c, s) = Slurm::start(dir.path(), 2, 2);
    let out = s.run(
        "salloc",
        &[
            "-N",
            "2",
            "--gres=gpu:1",
            "sh",
            "-c",
            "echo nodes=$SLURM_JOB_NUM_NODES; srun -l hostname; exit 4",
        ],
        None,
    );
    assert_eq!(out.status.code(), Some(4), "{}", stderr(&out));
    let text = String::from_utf8_lossy(&out.stdout);
    let mut lines: Vec<&str> = text.lines().collect();
    lines.sort();
    assert_eq!(lines.len(), 3, "{text}");
    assert_eq!(lines[2], "nodes=2", "{text}");
    assert!(
        lines[0].starts_with("0: ") && lines[1].starts_with("1: "),
        "{text}"
    );
    let err = stderr(&out);
    assert!(err.contains("salloc: Granted job allocation"), "{err}");
    assert!(
        err.contains("salloc: Relinquishing job allocation"),
        "{err}"
    );
    // The allocation was released: nothing holds its GPUs.
    let codes = s.codes();
    assert_eq!(codes.len(), 1, "{codes:?}");
    assert!(codes[0].ends_with(",CD"), "{codes:?}");
}

#[test]
fn scontrol_updates_a_jobs_limit_drains_a_node_and_shows_nodes_and_partitions() {
    let dir = tempfile::tempdir().unwrap();
    let (c, s) = Slurm::start(dir.path(), 1, 2);
    let id = s
        .ok(
            "sbatch",
            &["--parsable", "--time=10:00", "--wrap", "sleep 300"],
            None,
        )
        .trim()
        .to_string();
    c.wait_state(&id, "RUNNING", LONG);
    // Bad input first: nothing changes.
    let bad = s.run(
        "scontrol",
        &["update", &format!("JobId={id}"), "Partition=x"],
        None,
    );
    assert_eq!(bad.status.code(), Some(1), "{}", stderr(&bad));
    assert!(
        stderr(&bad).contains("only while it is pending"),
        "{}",
        stderr(&bad)
    );
    let bad = s.run(
        "scontrol",
        &["update", &format!("JobId={id}"), "Color=red"],
        None,
    );
    assert_eq!(bad.status.code(), Some(1));
    assert!(stderr(&bad).contains("color"), "{}", stderr(&bad));
    // A lower limit on a running job: the leader ends it there.
    s.ok(
        "scontrol",
        &[
            "update",
            &format!("JobId={id}"),
            "TimeLimit=0:03",
            "JobName=short",
        ],
        None,
    );
    let shown = s.ok("scontrol", &["show", "job", &id], None);
    assert!(
        shown.contains("JobName=short") && shown.contains("TimeLimit=00:00:03"),
        "{shown}"
    );
    c.wait_state(&id, "TIMEOUT", LONG);

    // An admin raises a running job's limit: its shim keeps the new one, so
    // it runs on past the old one.
    let raised = s
        .ok(
            "sbatch",
            &["--parsable", "--time=0:06", "--wrap", "sleep 300"],
            None,
        )
        .trim()
        .to_string();
    c.wait_state(&raised, "RUNNING", LONG);
    let seen_running = std::time::Instant::now();
    s.ok(
        "scontrol",
        &["update", &format!("JobId={raised}"), "TimeLimit=+5"],
        None,
    );
    std::thread::sleep(Duration::from_secs(9).saturating_sub(seen_running.elapsed()));
    assert_eq!(c.job(&raised)["state"], "RUNNING", "past its old 6 s limit");
    s.ok("scancel", &[&raised], None);
    c.wait_state(&raised, "CANCELLED", LONG);

    let node = s.ok("scontrol", &["show", "node", "n1"], None);
    for key in [
        "NodeName=n1",
        "CPUTot=",
        "Gres=gpu",
        "State=IDLE",
        "Partitions=",
    ] {
        assert!(node.contains(key), "{key} in\n{node}");
    }
    let part = s.ok("scontrol", &["-o", "show", "partition"], None);
    assert!(
        part.starts_with("PartitionName=") && part.contains("TotalNodes=1"),
        "{part}"
    );
    let missing = s.run("scontrol", &["show", "node", "n9"], None);
    assert_eq!(missing.status.code(), Some(1));
    assert!(stderr(&missing).contains("n9"), "{}", stderr(&missing));

    s.ok(
        "scontrol",
        &["update", "NodeName=n1", "State=DRAIN", "Reason=bad fan"],
        None,
    );
    let node = s.ok("scontrol", &["show", "node", "n1"], None);
    assert!(
        node.contains("State=DRAIN") && node.contains("Reason=bad fan [root@20"),
        "{node}"
    );
    assert_eq!(
        s.ok("sinfo", &["-h", "-o", "%N|%t|%E|%u"], None),
        "n1|drain|bad fan|root\n"
    );
    // sinfo -R: why, who, when, which nodes; the up one is not listed.
    let reasons = s.ok("sinfo", &["-R", "-h"], None);
    let words: Vec<&str> = reasons.split_whitespace().collect();
    assert_eq!(words.len(), 5, "{reasons}");
    assert_eq!(
        [words[0], words[1], words[2], words[4]],
        ["bad", "fan", "root", "n1"]
    );
    assert!(
        words[3].starts_with("20") && words[3].contains('T'),
        "{reasons}"
    );
    s.ok("scontrol", &["update", "NodeName=n1", "State=RESUME"], None);
    assert!(s.ok("sinfo", &["-N", "-h"], None).contains("idle"));
    let q = s.ok(
        "squeue",
        &["-t", "all", "-h", "-O", "JobID:8,State:.10", "-j", &id],
        None,
    );
    assert_eq!(q, format!("{id:<8}{:>10}\n", "TIMEOUT"));
}

#[test]
fn an_exclusive_job_holds_its_node_whole() {
    let dir = tempfile::tempdir().unwrap();
    let (c, s) = Slurm::start(dir.path(), 1, 2);
    let script = "#!/bin/sh\n#SBATCH --exclusive --gres=gpu:1\necho \"gpus=$CUDA_VISIBLE_DEVICES n=$SLURM_GPUS_ON_NODE\"\nsleep 30\n";
    let id = s
        .ok("sbatch", &["--parsable"], Some(script))
        .trim()
        .to_string();
    c.wait_state(&id, "RUNNING", LONG);
    let out = s.work.join(format!("slurm-{id}.out"));
    assert_eq!(
        wait_for_text(&out, "gpus="),
        "gpus=0,1 n=2\n",
        "both GPUs, not one"
    );
    // A one-GPU job finds the node taken, though a GPU sits idle there.
    let other = s
        .ok("sbatch", &["--parsable", "-G", "1", "--wrap", "true"], None)
        .trim()
        .to_string();
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(
        s.ok("squeue", &["-h", "-o", "%t %r", "-j", &other], None),
        "PD Resources\n"
    );
    s.ok("scancel", &[&id], None);
    c.wait_state(&other, "COMPLETED", LONG);
}
