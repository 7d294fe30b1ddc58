//! The executor with real shims and real processes: the `gpuq` binary built
//! from this crate runs `gpuq shim`. These tests need root (they switch users
//! and create a system user `gpuqt-exec`), as CI has.

use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use gpuq::agent::exec::{
    CgroupMode, ExecError, Executor, Identity, LimitSignal, ProcessId, StopReason, TaskObserved,
    TaskOutcome, TaskSpec, TaskStatus,
};
use gpuq::model::{JobId, Program, TaskKey};

const GPUQ: &str = env!("CARGO_BIN_EXE_gpuq");
const TEST_USER: &str = "gpuqt-exec";
/// Set in the environment of this test binary when it is re-run as the
/// short-lived agent of `shim_outlives_its_spawner_and_is_re_adopted`.
const SPAWNER_ENV: &str = "GPUQ_TEST_SPAWNER_ROOT";
/// Generous: the machine may be busy; nothing here asserts a duration.
const PATIENCE: Duration = Duration::from_secs(60);

/// A task root and a work directory in a fresh temporary directory that other
/// users may traverse.
struct Fixture {
    _tmp: tempfile::TempDir,
    exec: Executor,
    work: PathBuf,
}

fn fixture() -> Fixture {
    let tmp = tempfile::tempdir().unwrap();
    fs::set_permissions(tmp.path(), fs::Permissions::from_mode(0o755)).unwrap();
    let work = tmp.path().join("work");
    fs::create_dir(&work).unwrap();
    fs::set_permissions(&work, fs::Permissions::from_mode(0o755)).unwrap();
    let exec = Executor::new(tmp.path().join("tasks"), PathBuf::from(GPUQ));
    Fixture {
        _tmp: tmp,
        exec,
        work,
    }
}

fn command(job: u64, argv: &[&str], workdir: &Path) -> TaskSpec {
    TaskSpec {
        key: TaskKey {
            job: JobId(job),
            attempt: 0,
            rank: 0,
            step: None,
        },
        node_rank: 0,
        local_rank: 0,
        user: "root".to_string(),
        allow_root: true,
        program: Program::Command {
            argv: argv.iter().map(|s| s.to_string()).collect(),
        },
        workdir: workdir.to_path_buf(),
        env: vec![("PATH".to_string(), "/usr/bin:/bin".to_string())],
        stdout: workdir.join(format!("gpuq-{job}.out")),
        stderr: workdir.join(format!("gpuq-{job}.out")),
        cpus: Vec::new(),
        cpu_count: 1,
        memory_mb: None,
        pids_max: None,
        time_limit_secs: None,
        kill_grace_secs: 2,
        signal_before_limit: None,
        identity: None,
        io: Default::default(),
        size: None,
        beside: None,
        container: None,
    }
}

fn sh(job: u64, script: &str, workdir: &Path) -> TaskSpec {
    command(job, &["/bin/sh", "-c", script], workdir)
}

/// The uid of the test user, created on first use.
fn test_user() -> u32 {
    static UID: OnceLock<u32> = OnceLock::new();
    *UID.get_or_init(|| {
        let lookup = || nix::unistd::User::from_name(TEST_USER).unwrap();
        if lookup().is_none() {
            let status = Command::new("useradd")
                .args(["--system", "--no-create-home", TEST_USER])
                .status()
                .expect("useradd must be installed");
            assert!(status.success() || lookup().is_some(), "useradd failed");
        }
        lookup().unwrap().uid.as_raw()
    })
}

/// A directory owned by the test user.
fn user_dir(parent: &Path, name: &str) -> PathBuf {
    let dir = parent.join(name);
    fs::create_dir(&dir).unwrap();
    std::os::unix::fs::chown(&dir, Some(test_user()), None).unwrap();
    dir
}

fn wait_for<T>(what: &str, mut probe: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + PATIENCE;
    loop {
        if let Some(value) = probe() {
            return value;
        }
        assert!(Instant::now() < deadline, "gave up waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn wait_ended(exec: &Executor, key: TaskKey) -> TaskStatus {
    wait_for(&format!("task {key} to end"), || match exec.observe(key) {
        TaskObserved::Ended(status) => Some(status),
        TaskObserved::Running { .. } => None,
        TaskObserved::Unknown { reason } => {
            let log = fs::read_to_string(exec.task_dir(key).join("shim.log")).unwrap_or_default();
            // A shim that has not yet recorded its pid is still starting.
            assert!(reason.contains("never recorded"), "{reason}\n{log}");
            None
        }
    })
}

fn wait_running(exec: &Executor, key: TaskKey) -> u32 {
    wait_for(&format!("task {key} to run"), || match exec.observe(key) {
        TaskObserved::Running { pid, .. } => pid,
        TaskObserved::Ended(status) => panic!("task {key} ended early: {status:?}"),
        TaskObserved::Unknown { .. } => None,
    })
}

/// A JSON file of the task's directory.
fn task_file<T: serde::de::DeserializeOwned>(exec: &Executor, key: TaskKey, name: &str) -> T {
    serde_json::from_slice(&fs::read(exec.task_dir(key).join(name)).unwrap()).unwrap()
}

fn cancel_and_wait(exec: &Executor, key: TaskKey) -> TaskStatus {
    exec.stop(key, StopReason::Cancel).unwrap();
    wait_ended(exec, key)
}

fn launch_failure(status: &TaskStatus) -> &str {
    match &status.outcome {
        TaskOutcome::LaunchFailed { reason } => reason,
        other => panic!("expected a launch failure, got {other:?}"),
    }
}

fn process_gone(pid: u32) -> bool {
    match fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(stat) => stat
            .rsplit(')')
            .next()
            .unwrap()
            .trim_start()
            .starts_with('Z'),
    }
}

#[test]
fn a_command_completes_with_its_output_and_only_its_environment() {
    let f = fixture();
    let mut spec = sh(
        1,
        "echo out; echo err >&2; echo \"$GREETING ${HOME:-no-home} $USER\"",
        &f.work,
    );
    spec.env.push(("GREETING".into(), "hello".into()));
    spec.stderr = f.work.join("gpuq-1.err");
    f.exec.start(&spec).unwrap();
    let status = wait_ended(&f.exec, spec.key);
    assert_eq!(status.outcome, TaskOutcome::Completed);
    assert!(status.start_ms.is_some_and(|s| s <= status.end_ms));
    assert_eq!(
        fs::read_to_string(&spec.stdout).unwrap(),
        "out\nhello no-home root\n"
    );
    assert_eq!(fs::read_to_string(&spec.stderr).unwrap(), "err\n");
}

#[test]
fn a_non_zero_exit_is_failed_with_its_code() {
    let f = fixture();
    let spec = sh(2, "exit 3", &f.work);
    f.exec.start(&spec).unwrap();
    let status = wait_ended(&f.exec, spec.key);
    match &status.outcome {
        TaskOutcome::Failed { code, reason, .. } => {
            assert_eq!(*code, Some(3));
            assert!(reason.contains('3'), "{reason}");
        }
        other => panic!("expected Failed, got {other:?}"),
    }
    assert_eq!(status.outcome.exit_code(), Some(3));
}

#[test]
fn a_task_is_not_started_twice() {
    let f = fixture();
    let spec = sh(3, "exit 0", &f.work);
    f.exec.start(&spec).unwrap();
    assert!(matches!(
        f.exec.start(&spec),
        Err(ExecError::AlreadyStarted { .. })
    ));
    wait_ended(&f.exec, spec.key);
}

#[test]
fn a_shim_that_cannot_be_started_leaves_nothing_behind() {
    let f = fixture();
    let broken = Executor::new(f.exec.root.clone(), f.work.join("no-such-gpuq"));
    let spec = sh(30, "exit 0", &f.work);
    let err = broken.start(&spec).unwrap_err();
    assert!(matches!(err, ExecError::SpawnShim { .. }), "{err}");
    assert!(err.to_string().contains("no-such-gpuq"), "{err}");
    assert!(broken.scan().is_empty());
    // The same key can be started once the shim is there.
    f.exec.start(&spec).unwrap();
    assert_eq!(
        wait_ended(&f.exec, spec.key).outcome,
        TaskOutcome::Completed
    );
}

#[test]
fn an_unknown_user_is_a_launch_failure_naming_the_user() {
    let f = fixture();
    let mut spec = sh(4, "exit 0", &f.work);
    spec.user = "gpuq-nobody-by-this-name".into();
    f.exec.start(&spec).unwrap();
    let status = wait_ended(&f.exec, spec.key);
    let reason = launch_failure(&status);
    assert!(
        reason.contains("user gpuq-nobody-by-this-name not found on node"),
        "{reason}"
    );
    assert_eq!(status.start_ms, None);
}

#[test]
fn the_identity_the_agent_resolved_is_used_as_given() {
    let f = fixture();
    let uid = test_user();
    let out = user_dir(&f.work, "ident");
    let mut spec = sh(40, "id -u; id -g", &out);
    spec.stdout = out.join("out");
    spec.stderr = out.join("out");
    // The name says root; the ids the agent looked up win (no second lookup).
    spec.identity = Some(Identity {
        name: "root".into(),
        uid,
        gid: uid,
        groups: vec![uid],
    });
    f.exec.start(&spec).unwrap();
    assert_eq!(
        wait_ended(&f.exec, spec.key).outcome,
        TaskOutcome::Completed
    );
    assert_eq!(
        fs::read_to_string(out.join("out")).unwrap(),
        format!("{uid}\n{uid}\n")
    );
}

#[test]
fn the_agent_writes_the_users_identity_into_the_task() {
    let f = fixture();
    let spec = sh(41, "sleep 30", &f.work);
    f.exec.start(&spec).unwrap();
    let written: TaskSpec = task_file(&f.exec, spec.key, "task.json");
    let identity = written.identity.expect("the agent resolved root");
    assert_eq!(
        (identity.name.as_str(), identity.uid, identity.gid),
        ("root", 0, 0)
    );
    cancel_and_wait(&f.exec, spec.key);
}

#[test]
fn a_shim_is_named_gpuq_shim() {
    let f = fixture();
    let spec = sh(45, "sleep 30", &f.work);
    f.exec.start(&spec).unwrap();
    wait_running(&f.exec, spec.key);
    let shim: ProcessId = task_file(&f.exec, spec.key, "shim.pid");
    let comm = fs::read_to_string(format!("/proc/{}/comm", shim.pid)).unwrap();
    assert_eq!(comm, "gpuq-shim\n");
    cancel_and_wait(&f.exec, spec.key);
}

#[test]
fn a_launcher_that_died_is_replaced() {
    let f = fixture();
    let first = sh(42, "exit 0", &f.work);
    f.exec.start(&first).unwrap();
    assert_eq!(
        wait_ended(&f.exec, first.key).outcome,
        TaskOutcome::Completed
    );
    let launcher = f
        .exec
        .shim_launcher()
        .expect("the first task started a launcher");
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(launcher as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    // The next task notices, starts its own shim directly; the one after
    // gets a new launcher.
    for job in [43, 44] {
        let spec = sh(job, "exit 0", &f.work);
        f.exec.start(&spec).unwrap();
        assert_eq!(
            wait_ended(&f.exec, spec.key).outcome,
            TaskOutcome::Completed
        );
    }
    let again = f.exec.shim_launcher().expect("a new launcher");
    assert_ne!(again, launcher);
    assert!(process_gone(launcher));
}

#[test]
fn root_is_refused_unless_allowed() {
    let f = fixture();
    let mut spec = sh(5, "exit 0", &f.work);
    spec.allow_root = false;
    f.exec.start(&spec).unwrap();
    let status = wait_ended(&f.exec, spec.key);
    assert!(launch_failure(&status).contains("uid 0"));
}

#[test]
fn a_missing_workdir_is_a_launch_failure_naming_it() {
    let f = fixture();
    let missing = f.work.join("no-such-dir");
    let mut spec = sh(6, "exit 0", &f.work);
    spec.workdir = missing.clone();
    f.exec.start(&spec).unwrap();
    let status = wait_ended(&f.exec, spec.key);
    let reason = launch_failure(&status);
    assert!(reason.contains(missing.to_str().unwrap()), "{reason}");
    assert!(reason.contains("No such file or directory"), "{reason}");
}

#[test]
fn a_program_that_cannot_be_executed_is_a_launch_failure_naming_it() {
    let f = fixture();
    let program = f.work.join("not-executable");
    fs::write(&program, "#!/bin/sh\nexit 0\n").unwrap();
    fs::set_permissions(&program, fs::Permissions::from_mode(0o644)).unwrap();
    let spec = command(7, &[program.to_str().unwrap()], &f.work);
    f.exec.start(&spec).unwrap();
    let reason = launch_failure(&wait_ended(&f.exec, spec.key)).to_string();
    assert!(reason.contains(program.to_str().unwrap()), "{reason}");
    assert!(reason.contains("Permission denied"), "{reason}");

    // A program that exits 127 on its own is not a launch failure.
    let spec = sh(8, "exit 127", &f.work);
    f.exec.start(&spec).unwrap();
    let status = wait_ended(&f.exec, spec.key);
    assert_eq!(status.outcome.exit_code(), Some(127));

    let spec = command(9, &["gpuq-no-such-command"], &f.work);
    f.exec.start(&spec).unwrap();
    let reason = launch_failure(&wait_ended(&f.exec, spec.key)).to_string();
    assert!(
        reason.contains("\"gpuq-no-such-command\" not found in PATH /usr/bin:/bin"),
        "{reason}"
    );
}

#[test]
fn an_output_file_the_user_cannot_write_is_a_launch_failure_naming_it() {
    let f = fixture();
    test_user();
    // `work` belongs to root (0755): the user may enter it, not write in it.
    let mut spec = sh(10, "exit 0", &f.work);
    spec.user = TEST_USER.into();
    spec.allow_root = false;
    f.exec.start(&spec).unwrap();
    let reason = launch_failure(&wait_ended(&f.exec, spec.key)).to_string();
    assert!(reason.contains(spec.stdout.to_str().unwrap()), "{reason}");
    assert!(reason.contains("Permission denied"), "{reason}");
    assert!(
        !spec.stdout.exists(),
        "root must not create it for the user"
    );
}

#[test]
fn a_script_runs_as_the_user_and_what_it_writes_is_theirs() {
    let f = fixture();
    let uid = test_user();
    let home = user_dir(&f.work, "home");
    let mut spec = sh(11, "", &home);
    spec.user = TEST_USER.into();
    spec.allow_root = false;
    spec.program = Program::Script {
        path: "job.sh".into(),
        content: "#!/bin/sh\nid -un\nid -u\ntouch made-by-task\n".into(),
        args: Vec::new(),
    };
    f.exec.start(&spec).unwrap();
    let status = wait_ended(&f.exec, spec.key);
    assert_eq!(status.outcome, TaskOutcome::Completed, "{status:?}");
    assert_eq!(
        fs::read_to_string(&spec.stdout).unwrap(),
        format!("{TEST_USER}\n{uid}\n")
    );
    assert_eq!(fs::metadata(&spec.stdout).unwrap().uid(), uid);
    assert_eq!(fs::metadata(home.join("made-by-task")).unwrap().uid(), uid);
}

#[test]
fn the_time_limit_ends_the_task_and_its_whole_tree() {
    let f = fixture();
    // TERM is ignored by all of them, so only the SIGKILL after the grace
    // time ends them; one child left the process group and the session.
    let mut spec = sh(
        12,
        "trap '' TERM; sleep 1000 & echo $! > bg.pid; setsid sleep 1000 & echo $! > away.pid; sleep 1000",
        &f.work,
    );
    spec.time_limit_secs = Some(1);
    spec.kill_grace_secs = 1;
    f.exec.start(&spec).unwrap();
    let status = wait_ended(&f.exec, spec.key);
    assert_eq!(status.outcome, TaskOutcome::Timeout);
    for file in ["bg.pid", "away.pid"] {
        let pid: u32 = fs::read_to_string(f.work.join(file))
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        wait_for(&format!("{file} ({pid}) to be gone"), || {
            process_gone(pid).then_some(())
        });
    }
}

#[test]
fn a_signal_warns_the_task_before_its_time_limit() {
    let f = fixture();
    let mut spec = sh(
        13,
        "trap 'echo warned; exit 0' USR1; while true; do sleep 0.1; done",
        &f.work,
    );
    spec.time_limit_secs = Some(300);
    spec.signal_before_limit = Some(LimitSignal {
        signal: libc::SIGUSR1,
        secs_before: 299,
        batch_only: false,
    });
    f.exec.start(&spec).unwrap();
    let status = wait_ended(&f.exec, spec.key);
    assert_eq!(status.outcome, TaskOutcome::Completed, "{status:?}");
    assert!(fs::read_to_string(&spec.stdout).unwrap().contains("warned"));
}

#[test]
fn stop_cancels_a_running_task_with_its_reason() {
    let f = fixture();
    let spec = sh(14, "sleep 1000", &f.work);
    f.exec.start(&spec).unwrap();
    let pid = wait_running(&f.exec, spec.key);
    f.exec.stop(spec.key, StopReason::Preempt).unwrap();
    let status = wait_ended(&f.exec, spec.key);
    assert_eq!(
        status.outcome,
        TaskOutcome::Cancelled {
            reason: StopReason::Preempt
        }
    );
    assert!(process_gone(pid));
    // Stopping an ended task changes nothing.
    assert_eq!(cancel_and_wait(&f.exec, spec.key), status);
    f.exec.forget(spec.key).unwrap();
    assert!(!f.exec.task_dir(spec.key).exists());
    assert!(f.exec.scan().is_empty());
}

#[test]
fn a_task_whose_shim_died_is_unknown_and_forget_kills_it() {
    let f = fixture();
    let spec = sh(15, "sleep 1000", &f.work);
    f.exec.start(&spec).unwrap();
    let pid = wait_running(&f.exec, spec.key);
    let TaskObserved::Running { shim_pid, .. } = f.exec.observe(spec.key) else {
        panic!("not running");
    };
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(shim_pid as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    let reason = wait_for("the shim to be seen dead", || {
        match f.exec.observe(spec.key) {
            TaskObserved::Unknown { reason } => Some(reason),
            _ => None,
        }
    });
    assert!(reason.contains("still runs"), "{reason}");
    f.exec.forget(spec.key).unwrap();
    wait_for("the orphaned task to be killed", || {
        process_gone(pid).then_some(())
    });
}

/// The short-lived agent of the test below: only acts when re-run with
/// `SPAWNER_ENV` set; it starts a task, then waits to be killed.
#[test]
fn spawner_process() {
    let Ok(root) = std::env::var(SPAWNER_ENV) else {
        return;
    };
    let root = PathBuf::from(root);
    let work = root.parent().unwrap().join("work");
    let exec = Executor::new(root, PathBuf::from(GPUQ));
    let spec = sh(
        16,
        "while [ ! -e release ]; do sleep 0.1; done; exit 7",
        &work,
    );
    exec.start(&spec).unwrap();
    std::thread::sleep(PATIENCE);
}

#[test]
fn shim_outlives_its_spawner_and_is_re_adopted() {
    let f = fixture();
    let key = TaskKey {
        job: JobId(16),
        attempt: 0,
        rank: 0,
        step: None,
    };
    let mut spawner = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "spawner_process", "--nocapture"])
        .env(SPAWNER_ENV, &f.exec.root)
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let pid_file = f.exec.task_dir(key).join("pid");
    wait_for("the spawner to start the task", || {
        pid_file.exists().then_some(())
    });
    spawner.kill().unwrap();
    spawner.wait().unwrap();

    // A fresh executor, as after an agent restart.
    let fresh = Executor::new(f.exec.root.clone(), PathBuf::from(GPUQ));
    let seen = fresh.scan();
    assert_eq!(seen.len(), 1, "{seen:?}");
    assert_eq!(seen[0].0, key);
    assert!(
        matches!(seen[0].1, TaskObserved::Running { pid: Some(_), .. }),
        "{seen:?}"
    );
    fs::write(f.work.join("release"), "").unwrap();
    let status = wait_ended(&fresh, key);
    assert_eq!(status.outcome.exit_code(), Some(7), "{status:?}");
    assert!(matches!(
        fresh.scan().as_slice(),
        [(k, TaskObserved::Ended(_))] if *k == key
    ));
}

#[test]
fn a_task_over_its_memory_limit_is_out_of_memory() {
    if !matches!(CgroupMode::detect(), CgroupMode::Limits { .. }) {
        eprintln!("NOT RUN: out-of-memory detection needs the cgroup v2 memory controller, which this node lacks");
        return;
    }
    let f = fixture();
    // `tail` keeps a line in memory until it ends, and /dev/zero has no end
    // of line.
    let mut spec = sh(
        17,
        "head -c 1000000000 /dev/zero | tail > /dev/null",
        &f.work,
    );
    spec.memory_mb = Some(32);
    f.exec.start(&spec).unwrap();
    let status = wait_ended(&f.exec, spec.key);
    assert_eq!(status.outcome, TaskOutcome::OutOfMemory, "{status:?}");
}
