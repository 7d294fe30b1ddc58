//! `gpuq shim --task-dir DIR`: the parent of one task's process. The agent
//! starts it in a new session and does not wait for it, so it outlives agent
//! restarts; everything it learns goes to files in the task directory, and
//! `status.json` is written once, atomically, at the end.
//!
//! The shim is a child subreaper: a task's orphaned descendants are
//! reparented to it, so even without cgroups it can find and stop every
//! process the task left behind, including ones that left the process group.
//! It finds them by walking the kernel's children lists down from itself (see
//! `process`), a few reads per process of the task rather than a scan of
//! every process on the node.
//! It waits on signals with `sigtimedwait` (SIGCHLD for exits, SIGTERM/SIGINT
//! for stop requests) with a short tick for the `stop` file and the clock, so
//! it has no handlers and no threads.

use std::fs;
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use nix::sys::signal::{SigSet, Signal};

use super::cgroup::{CgroupError, CgroupMode, Target, TaskCgroup};
use super::fork::{fork_into, Forked};
use super::launch::Prepared;
use super::process;
use super::stdio::{Relay, Streams};
use super::task::{
    now_ms, read_json, write_json, Durability, Identity, ProcessId, StopReason, TaskOutcome,
    TaskPid, TaskSpec, TaskStatus, LIMIT_FILE, PID_FILE, SCRIPT_FILE, SHIM_PID_FILE, STATUS_FILE,
    STOP_FILE, TASK_FILE,
};
use super::tree::{Exit, Tree};
use crate::model::{Millis, Program};
use crate::net::stdio::StdioMsg;

/// How often the shim looks at the stop file and the clock between signals.
const TICK: Duration = Duration::from_millis(100);

/// What a shim learns about its node before it detaches: the cgroup mode and,
/// with a cgroup2 mount, `gpuq/shims` open to start in. A shim started on its
/// own looks; the launcher looks once and its forks inherit it.
pub(super) struct Node {
    mode: CgroupMode,
    shims: Result<Option<Target>, CgroupError>,
}

impl Node {
    pub(super) fn detect() -> Node {
        let mode = CgroupMode::detect();
        let shims = mode.shims_target();
        Node { mode, shims }
    }

    /// Whether what was detected still stands: `gpuq/shims` was not removed
    /// since (one lookup). A failed set-up is retried.
    pub(super) fn still_holds(&self) -> bool {
        match &self.shims {
            Ok(Some(t)) => t.path().join("cgroup.procs").exists(),
            Ok(None) => true,
            Err(_) => false,
        }
    }
}

/// Runs one task from its directory; returns the shim's exit code (0 once
/// `status.json` is written).
pub fn shim_main(task_dir: &Path) -> i32 {
    shim_on(task_dir, &Node::detect())
}

/// `shim_main` on a node already looked at (the launcher's forks).
pub(super) fn shim_on(task_dir: &Path, node: &Node) -> i32 {
    // One name for every shim, however it was started: a forked shim's
    // command line is its launcher's, `gpuq shim --serve`.
    // SAFETY: sets this thread's name from a NUL-terminated static string.
    unsafe { libc::prctl(libc::PR_SET_NAME, c"gpuq-shim".as_ptr(), 0, 0, 0) };
    let Node { mode, shims } = node;
    let joined = match detach(
        &shim_signals(),
        shims.as_ref().ok().and_then(Option::as_ref),
    ) {
        Ok(joined) => joined,
        Err(e) => {
            eprintln!("gpuq shim: cannot detach from the agent: {e}");
            return 1;
        }
    };
    // Set already in a shim forked by the launcher.
    init_logging();
    if let Some(warning) = mode.degraded_warning() {
        tracing::info!("{warning}");
    }
    let moved = match shims {
        Ok(Some(t)) if !joined => t
            .join_self()
            .map_err(|e| format!("cannot move the shim into {}: {e}", t.path().display())),
        Ok(_) => Ok(()),
        Err(e) => Err(e.to_string()),
    };
    if let Err(e) = moved {
        tracing::warn!("{e}; the shim stays in the agent's cgroup");
    }
    let (outcome, start_ms) = run(task_dir, mode);
    let status = TaskStatus {
        outcome,
        start_ms,
        end_ms: now_ms(),
    };
    tracing::info!(dir = %task_dir.display(), outcome = ?status.outcome, "task ended");
    match write_json(&task_dir.join(STATUS_FILE), &status, Durability::Crash) {
        Ok(()) => 0,
        Err(e) => {
            tracing::error!("cannot write {}: {e}", task_dir.join(STATUS_FILE).display());
            1
        }
    }
}

/// The shim's first step, before any thread exists: block the shim's
/// signals, fork (the child into `cgroup` if given), and return in the
/// detached child whether it is in `cgroup` already. The parent never
/// returns: it reports the child's pid and exits.
pub fn detach(signals: &nix::sys::signal::SigSet, cgroup: Option<&Target>) -> io::Result<bool> {
    signals.thread_block().map_err(io::Error::from)?;
    // SAFETY: the process is single-threaded here (the shim subcommand
    // calls this before anything that could start a thread), so the child
    // may run any code.
    match unsafe { fork_into(cgroup) }? {
        Forked::Child { joined } => {
            // SAFETY: plain system calls on this process's own descriptors.
            unsafe {
                if libc::setsid() < 0 {
                    return Err(io::Error::last_os_error());
                }
                // stdout was the agent's pipe; the log is stderr.
                if libc::dup2(2, 1) < 0 {
                    return Err(io::Error::last_os_error());
                }
            }
            Ok(joined)
        }
        Forked::Parent(child) => {
            let mut out = io::stdout().lock();
            let code = match writeln!(out, "{child}").and_then(|()| out.flush()) {
                Ok(()) => 0,
                Err(_) => 1,
            };
            // SAFETY: _exit skips atexit handlers and buffers we do not need.
            unsafe { libc::_exit(code) }
        }
    }
}

/// The shim's log lines go to its stderr, the task's `shim.log`.
pub(super) fn init_logging() {
    let _ = tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .try_init();
}

fn launch_failed(reason: String) -> (TaskOutcome, Option<Millis>) {
    tracing::warn!("launch failed: {reason}");
    (TaskOutcome::LaunchFailed { reason }, None)
}

/// The time limit the agent has set since the start, if it has: `Some(None)`
/// for none at all. An unreadable file is no change.
fn limit_changed(dir: &Path) -> Option<Option<u64>> {
    let text = fs::read_to_string(dir.join(LIMIT_FILE)).ok()?;
    match text.trim() {
        "none" => Some(None),
        secs => secs.parse().ok().map(Some),
    }
}

/// When a task that started at `started` must end, and when it gets its
/// `--signal` warning first (the signal, batch script only).
struct Deadline {
    secs: Option<u64>,
    at: Option<Instant>,
    warning: Option<(Instant, Signal, bool)>,
}

impl Deadline {
    fn new(spec: &TaskSpec, started: Instant, secs: Option<u64>) -> Deadline {
        let at = secs.map(|secs| started + Duration::from_secs(secs));
        let warning = spec.signal_before_limit.as_ref().and_then(|w| {
            let when = at?.checked_sub(Duration::from_secs(w.secs_before))?;
            Some((
                when.max(started),
                Signal::try_from(w.signal).ok()?,
                w.batch_only,
            ))
        });
        Deadline { secs, at, warning }
    }
}

/// Reads the stop file's reason, if a stop was requested.
fn stop_requested(dir: &Path) -> Option<StopReason> {
    fs::read_to_string(dir.join(STOP_FILE))
        .ok()
        .map(|word| StopReason::parse(&word))
}

fn run(dir: &Path, mode: &CgroupMode) -> (TaskOutcome, Option<Millis>) {
    // First, so that a stop request arriving now is queued, not fatal.
    let signals = shim_signals();
    if let Err(e) = signals.thread_block() {
        return launch_failed(format!("cannot block signals in the shim: {e}"));
    }
    let spec: TaskSpec = match read_json(&dir.join(TASK_FILE)) {
        Ok(Some(spec)) => spec,
        Ok(None) => return launch_failed(format!("{} is missing", dir.join(TASK_FILE).display())),
        Err(e) => {
            return launch_failed(format!(
                "cannot read {}: {e}",
                dir.join(TASK_FILE).display()
            ))
        }
    };
    // The agent writes this file as soon as it learns the shim's pid, usually
    // before the shim gets here; the shim writes it only when the agent did
    // not (it died in between).
    let recorded = read_json::<ProcessId>(&dir.join(SHIM_PID_FILE));
    if let Some(me) = process::identify(std::process::id())
        .filter(|me| !matches!(recorded, Ok(Some(r)) if r == *me))
    {
        if let Err(e) = write_json(&dir.join(SHIM_PID_FILE), &me, Durability::Crash) {
            tracing::warn!("cannot write {}: {e}", dir.join(SHIM_PID_FILE).display());
        }
    }
    // SAFETY: prctl with these arguments only sets a flag on this process.
    let subreaper = unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) } == 0;
    if !subreaper {
        tracing::warn!(
            "cannot become a child subreaper: {}; orphaned processes of the task are tracked \
             only through its cgroup and process group",
            std::io::Error::last_os_error()
        );
    }
    if let Some(reason) = stop_requested(dir) {
        return (TaskOutcome::Cancelled { reason }, None);
    }
    // The agent looked the user up; the shim does so only when it could not.
    let identity = match spec
        .identity
        .clone()
        .map_or_else(|| Identity::lookup(&spec.user), Ok)
        .and_then(|identity| identity.allowed(spec.allow_root))
    {
        Ok(identity) => identity,
        Err(reason) => return launch_failed(reason),
    };
    let script = match &spec.program {
        Program::Script { content, .. } => match write_script(dir, content, &identity) {
            Ok(path) => Some(path),
            Err(reason) => return launch_failed(reason),
        },
        Program::Command { .. } => None,
    };
    // A process beside a task joins that task's cgroup and makes none.
    let beside_cgroup = spec.beside.as_ref().and_then(|b| b.cgroup.clone());
    let cgroup = match mode.create_task_cgroup(&spec, dir) {
        _ if spec.beside.is_some() => None,
        Ok(cgroup) => cgroup,
        Err(e) if mode.enforces_limits() => return launch_failed(e.to_string()),
        Err(e) => {
            tracing::warn!("{e}; the task runs without a cgroup");
            None
        }
    };
    // A task in a container: its image made ready (unpacked once per node)
    // and its bundle written, before anything of the task runs.
    let mut exec_failure = None;
    let container = match (&spec.container, &spec.beside) {
        // Beside a task in a container: its runtime runs the command there.
        (Some(c), Some(beside)) => {
            let prepared = super::launch::task_argv(&spec, script.as_deref()).and_then(|argv| {
                super::container_exec::prepare_exec(dir, &spec, c, beside, &identity, &argv)
            });
            // Told to the exec's client once it has connected, below.
            match prepared {
                Ok(launch) => Some(launch),
                Err(reason) => {
                    exec_failure = Some(reason);
                    None
                }
            }
        }
        (Some(c), None) => {
            let prepared = super::launch::task_argv(&spec, script.as_deref()).and_then(|argv| {
                let rel = cgroup
                    .as_ref()
                    .zip(mode.gpuq_dir())
                    .and_then(|(c, g)| Some(c.path().strip_prefix(g.parent()?).ok()?.to_owned()))
                    .map(|p| format!("/{}", p.display()));
                super::container::prepare(dir, &spec, c, &identity, &argv, script.as_deref(), rel)
            });
            match prepared {
                Ok(launch) => Some(launch),
                Err(reason) => {
                    remove_cgroup(cgroup.as_ref());
                    return launch_failed(reason);
                }
            }
        }
        (None, _) => None,
    };
    // Preparing an image may take a while; a stop asked meanwhile wins.
    if let Some(reason) = container.as_ref().and_then(|_| stop_requested(dir)) {
        remove_cgroup(cgroup.as_ref());
        return (TaskOutcome::Cancelled { reason }, None);
    }
    let mut streams = match spec.io.is_interactive() {
        true => match Streams::open(dir, &spec, &identity) {
            Ok(s) => Some(s),
            Err(reason) => {
                remove_cgroup(cgroup.as_ref());
                return launch_failed(reason);
            }
        },
        false => None,
    };
    // An exec on a terminal in a container: the runtime's own terminal
    // there follows the client's size.
    if let (Some(s), Some(launch), crate::model::TaskIo::Pty) =
        (streams.as_mut(), container.as_ref(), spec.io)
    {
        if launch.is_exec() {
            s.follow_terminal(launch.pid_file.clone(), identity.uid);
        }
    }
    if let (Some(s), Some(_)) = (streams.as_mut(), &spec.beside) {
        if let Err(reason) = s.await_first_client(FIRST_CLIENT_LIMIT) {
            return launch_failed(reason);
        }
    }
    if let Some(reason) = exec_failure {
        if let Some(s) = streams {
            s.refuse(&never_ran(&reason));
        }
        return launch_failed(reason);
    }
    let pin_cpus =
        spec.beside.is_some() || !cgroup.as_ref().is_some_and(TaskCgroup::cpuset_applied);
    let joins = cgroup
        .as_ref()
        .map(|c| c.path().to_path_buf())
        .or(beside_cgroup);
    let prepared = match Prepared::new(
        &spec,
        identity.clone(),
        script.as_deref(),
        joins.as_deref(),
        pin_cpus,
    )
    .and_then(|p| p.with_container(container))
    {
        Ok(prepared) => prepared.with_stdio(streams.as_ref().and_then(Streams::child_ends)),
        Err(reason) => {
            remove_cgroup(cgroup.as_ref());
            if let Some(s) = streams {
                s.refuse(&never_ran(&reason));
            }
            return launch_failed(reason);
        }
    };
    let (child, report) = match prepared.spawn() {
        Ok(spawned) => spawned,
        Err(e) => {
            remove_cgroup(cgroup.as_ref());
            let reason = format!("cannot fork the task: {e}");
            if let Some(s) = streams {
                s.refuse(&never_ran(&reason));
            }
            return launch_failed(reason);
        }
    };
    // A container's runtime starts it detached and exits: the container's
    // process, reparented to this subreaper, is the task from here on.
    let (child, report) = match prepared.container() {
        None => (child, Some(report)),
        // The runtime's exec stays in the foreground: it is the process.
        Some(c) if c.is_exec() => (child, Some(report)),
        Some(c) => {
            let started = c.await_runtime(child);
            match (report.failure(&prepared), started) {
                (None, Ok(main)) => (main, None),
                (Some(reason), _) | (None, Err(reason)) => {
                    let tree = Tree {
                        child,
                        cgroup: cgroup.as_ref(),
                        walk: subreaper && process::has_children_lists(),
                    };
                    tree.kill_leftovers();
                    remove_cgroup(cgroup.as_ref());
                    if let Some(s) = streams {
                        s.refuse(&never_ran(&reason));
                    }
                    return launch_failed(reason);
                }
            }
        }
    };
    let relay = streams.map(|s| s.start(child.as_raw()));
    let start_ms = now_ms();
    if let Some(process) = process::identify(child.as_raw() as u32) {
        let pid = TaskPid {
            process,
            cgroup: cgroup.as_ref().map(|c| c.path().to_path_buf()),
            start_ms,
        };
        if let Err(e) = write_json(&dir.join(PID_FILE), &pid, Durability::Crash) {
            tracing::warn!("cannot write {}: {e}", dir.join(PID_FILE).display());
        }
    }
    tracing::info!(pid = child.as_raw(), user = %spec.user, "task started");
    let tree = Tree {
        child,
        cgroup: cgroup.as_ref(),
        walk: subreaper && process::has_children_lists(),
    };
    let (exit, ending) = supervise(dir, &spec, &tree, &signals, relay.as_ref());
    tree.kill_leftovers();
    let oom_kills = cgroup.as_ref().map_or(0, TaskCgroup::oom_kills);
    remove_cgroup(cgroup.as_ref());
    if let Some(reason) = report.and_then(|r| r.failure(&prepared)) {
        if let Some(relay) = relay {
            relay.finish(never_ran(&reason));
        }
        return launch_failed(reason);
    }
    let mut outcome = match ending {
        Some(Ending::Stop(reason)) => TaskOutcome::Cancelled { reason },
        Some(Ending::Timeout) => TaskOutcome::Timeout,
        Some(Ending::Beside) => TaskOutcome::Cancelled {
            reason: StopReason::Cancel,
        },
        None if oom_kills > 0 => TaskOutcome::OutOfMemory,
        None => exit_outcome(exit),
    };
    // --container-save, once the task has completed: a failed save fails it.
    let save = prepared.container().and_then(|c| c.save.as_ref());
    if let (Some((rootfs, to)), TaskOutcome::Completed) = (save, &outcome) {
        let create = |p: &Path| super::container::open_as(&identity, p);
        if let Err(reason) = super::named::save(rootfs, to, dir, &create) {
            // The job's error output says why (the leader hears "failed").
            if spec.io == crate::model::TaskIo::Files {
                let told = super::stdio::open_output(&spec.stderr, &identity, true)
                    .and_then(|mut f| writeln!(f, "gpuq: {reason}"));
                if let Err(e) = told {
                    tracing::warn!("cannot tell the job's error output: {e}");
                }
            }
            outcome = TaskOutcome::Failed {
                code: None,
                signal: None,
                reason,
            };
        }
    }
    if let Some(relay) = relay {
        relay.finish(exit_message(exit, ending, &outcome));
    }
    (outcome, Some(start_ms))
}

/// How long before its time limit a task on a terminal is told.
const LIMIT_NOTICE: Duration = Duration::from_secs(60);

/// How long an exec's shim waits for the client that asked for it.
const FIRST_CLIENT_LIMIT: Duration = Duration::from_secs(10);

/// The exit sent to clients of a process that never ran.
fn never_ran(reason: &str) -> StdioMsg {
    StdioMsg::Exit {
        code: None,
        signal: None,
        reason: reason.to_string(),
    }
}

/// The exit sent to clients: how the process ended, and why in words.
fn exit_message(exit: Exit, ending: Option<Ending>, outcome: &TaskOutcome) -> StdioMsg {
    let (code, signal) = match exit {
        Exit::Code(c) => (Some(c), None),
        Exit::Signal { signal, .. } => (None, Some(signal)),
    };
    let reason = match (ending, outcome) {
        (Some(Ending::Timeout), _) => "the time limit was reached".to_string(),
        (Some(Ending::Beside), _) => "the task it ran beside ended".to_string(),
        (Some(Ending::Stop(_)), _) => "it was stopped (cancelled or preempted)".to_string(),
        (None, TaskOutcome::OutOfMemory) => "it ran out of memory".to_string(),
        (None, TaskOutcome::Failed { reason, .. }) => reason.clone(),
        _ => String::new(),
    };
    StdioMsg::Exit {
        code,
        signal,
        reason,
    }
}

/// The signals the shim takes through `sigtimedwait` rather than handlers.
fn shim_signals() -> SigSet {
    let mut set = SigSet::empty();
    for sig in [
        Signal::SIGCHLD,
        Signal::SIGTERM,
        Signal::SIGINT,
        Signal::SIGHUP,
    ] {
        set.add(sig);
    }
    set
}

/// Writes a script job's content as `script`, owned by the user and readable
/// by nobody else (the task directory is traversable, not listable). The
/// file is created with that mode and handed to the user before a byte is
/// written: a script holds secrets, and is never readable by others, not
/// even for a moment.
fn write_script(dir: &Path, content: &str, identity: &Identity) -> Result<PathBuf, String> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let path = dir.join(SCRIPT_FILE);
    let result = (|| {
        let mut f = fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o700)
            .open(&path)?;
        std::os::unix::fs::fchown(&f, Some(identity.uid), Some(identity.gid))?;
        f.write_all(content.as_bytes())
    })();
    result
        .map(|()| path.clone())
        .map_err(|e| format!("cannot write the job script {}: {e}", path.display()))
}

fn remove_cgroup(cgroup: Option<&TaskCgroup>) {
    let Some(cgroup) = cgroup else { return };
    for _ in 0..50 {
        match cgroup.remove() {
            Ok(()) => return,
            Err(_) => std::thread::sleep(Duration::from_millis(20)),
        }
    }
    if let Err(e) = cgroup.remove() {
        tracing::warn!("cannot remove cgroup {}: {e}", cgroup.path().display());
    }
}

/// Why the shim ended the task itself.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Ending {
    Timeout,
    Stop(StopReason),
    /// The task an exec ran beside ended.
    Beside,
}

/// Waits up to `timeout` for one of the blocked `signals`.
fn wait_signal(signals: &SigSet, timeout: Duration) -> Option<Signal> {
    let ts = libc::timespec {
        tv_sec: timeout.as_secs() as libc::time_t,
        tv_nsec: timeout.subsec_nanos() as libc::c_long,
    };
    // SAFETY: both pointers are valid for the call; no siginfo is requested.
    let sig = unsafe { libc::sigtimedwait(signals.as_ref(), std::ptr::null_mut(), &ts) };
    Signal::try_from(sig).ok()
}

/// Runs until the main process exits, enforcing the time limit and stop
/// requests: the signal, `kill_grace_secs`, then SIGKILL.
fn supervise(
    dir: &Path,
    spec: &TaskSpec,
    tree: &Tree<'_>,
    signals: &SigSet,
    relay: Option<&Relay>,
) -> (Exit, Option<Ending>) {
    let started = Instant::now();
    let mut deadline = Deadline::new(spec, started, spec.time_limit_secs);
    let grace = Duration::from_secs(spec.kill_grace_secs);
    // A preempted task first gets its `--signal` signal and the grace to
    // checkpoint, then SIGTERM and the grace again (as Slurm's
    // send_user_signal): submitit and Lightning checkpoint on USR1/USR2.
    let preempt_signal = spec
        .signal_before_limit
        .as_ref()
        .and_then(|w| Some((Signal::try_from(w.signal).ok()?, w.batch_only)));
    let mut preempt_warned: Option<Instant> = None;
    let mut warned = false;
    let mut ending: Option<(Ending, Instant)> = None;
    let mut killed = false;
    // Someone at a terminal is told a minute before the limit, and at it.
    let mut told_early = false;
    loop {
        if let Some(exit) = tree.main_exit() {
            return (exit, ending.map(|(e, _)| e));
        }
        let signal = wait_signal(signals, TICK);
        if signal == Some(Signal::SIGCHLD) {
            tree.reap_orphans();
        }
        let now = Instant::now();
        if let Some((_, since)) = ending {
            if killed || now >= since + grace {
                tree.signal(Signal::SIGKILL);
                killed = true;
            }
            continue;
        }
        // A limit raised or lowered while it runs: the warning comes again
        // if the new one is still ahead.
        if let Some(secs) = limit_changed(dir).filter(|&s| s != deadline.secs) {
            tracing::info!(?secs, "the time limit changed");
            deadline = Deadline::new(spec, started, secs);
            warned = deadline.warning.is_none_or(|(at, _, _)| now >= at) && warned;
            told_early = deadline.at.is_none_or(|d| now + LIMIT_NOTICE >= d) && told_early;
        }
        let stop = match signal {
            Some(Signal::SIGTERM | Signal::SIGINT) => {
                Some(stop_requested(dir).unwrap_or(StopReason::Cancel))
            }
            _ => stop_requested(dir),
        };
        let end = match stop {
            Some(StopReason::Preempt) if preempt_warned.is_none() && preempt_signal.is_some() => {
                if let Some((sig, batch_only)) = preempt_signal {
                    tracing::info!(signal = %sig, "preempted; signalling the task before SIGTERM");
                    if batch_only {
                        let _ = nix::sys::signal::kill(tree.child, sig);
                    } else {
                        tree.signal(sig);
                    }
                }
                preempt_warned = Some(now);
                None
            }
            Some(StopReason::Preempt) if preempt_warned.is_some_and(|at| now < at + grace) => None,
            Some(reason) => Some(Ending::Stop(reason)),
            None if deadline.at.is_some_and(|d| now >= d) => Some(Ending::Timeout),
            None if spec.beside.as_ref().is_some_and(|b| {
                b.dir.join(STATUS_FILE).exists() || !b.dir.join(TASK_FILE).exists()
            }) =>
            {
                Some(Ending::Beside)
            }
            None => None,
        };
        if let Some(relay) = relay {
            let why = match end {
                Some(Ending::Timeout) => Some("the time limit is reached"),
                Some(Ending::Stop(StopReason::Preempt)) => Some("the job is preempted"),
                Some(Ending::Stop(StopReason::Cancel)) => {
                    Some("the task is stopped (cancelled, or its job ended)")
                }
                _ => None,
            };
            if let Some(why) = why {
                relay.notice(format!(
                    "gpuq: {why}: the task gets SIGTERM now and SIGKILL in {} s",
                    grace.as_secs()
                ));
            } else if let Some(d) = deadline.at.filter(|_| !told_early) {
                let early = d.checked_sub(LIMIT_NOTICE).unwrap_or(started).max(started);
                if now >= early {
                    let left = d.saturating_duration_since(now).as_secs();
                    relay.notice(format!("gpuq: the time limit is reached in {left} s"));
                    told_early = true;
                }
            }
        }
        if let Some(end) = end {
            tracing::info!(?end, "ending the task; sending SIGTERM");
            ending = Some((end, now));
            tree.signal(Signal::SIGTERM);
            // A process stopped by SIGSTOP would not see SIGTERM until resumed.
            tree.signal(Signal::SIGCONT);
        } else if let Some((_, sig, batch_only)) =
            deadline.warning.filter(|&(at, _, _)| !warned && now >= at)
        {
            tracing::info!(signal = %sig, batch_only, "time limit is near; signalling the task");
            if batch_only {
                let _ = nix::sys::signal::kill(tree.child, sig);
            } else {
                tree.signal(sig);
            }
            warned = true;
        }
    }
}

/// The outcome of a process that ended on its own.
fn exit_outcome(exit: Exit) -> TaskOutcome {
    match exit {
        Exit::Code(0) => TaskOutcome::Completed,
        Exit::Code(code) => TaskOutcome::Failed {
            code: Some(code),
            signal: None,
            reason: format!("exited with code {code}"),
        },
        Exit::Signal { signal, core } => TaskOutcome::Failed {
            code: None,
            signal: Some(signal),
            reason: format!(
                "killed by signal {} ({signal}){}",
                Signal::try_from(signal).map_or("unknown", Signal::as_str),
                if core { ", core dumped" } else { "" }
            ),
        },
    }
}
