//! How the agent starts a shim without copying itself.
//!
//! The agent is a large multi-threaded process; forking it (even only to
//! exec) copies its page tables, twice for a double fork, and the copy-on-write
//! faults that follow land on the agent. So the agent `posix_spawn`s
//! `gpuq shim --task-dir DIR` (the standard library uses it when no closure
//! runs before exec), and the freshly started, small, single-threaded shim
//! detaches itself (`shim::detach`, its first step):
//!
//! 1. it blocks the signals the shim waits on with `sigtimedwait`, so a stop
//!    sent while it starts is queued instead of killing it;
//! 2. it forks, the child born in `gpuq/shims` where the node has a cgroup2
//!    mount (see `fork`); the parent writes the child's pid to its stdout (a
//!    pipe the agent reads) and exits, so the agent reaps it at once and the
//!    shim is nobody's zombie;
//! 3. the child starts a new session (the task's own, away from the agent's
//!    terminal and process group) and points its stdout at its log, off the
//!    agent's pipe.
//!
//! Starting the binary is most of a short task's cost, though: the loader,
//! glibc's CPU probe (each `CPUID` traps to the hypervisor on a VM), the
//! runtime's start and the page faults of a fresh image, paid per task. So the
//! agent keeps one `gpuq shim --serve` process (the [`Launcher`], a fork
//! server: started once, single-threaded, small) and writes each task
//! directory to its stdin; it forks, and the fork runs the steps above as if
//! it had just been started, with its stdout on a pipe to the launcher and its
//! stderr on the task's log; what a shim would learn about the node's cgroups
//! the launcher looked at once, and looks again only when `gpuq/shims` is
//! gone. The launcher answers with the shim's pid. If the
//! launcher cannot be started or dies, the agent logs it, starts that task's
//! shim directly, and starts a new launcher for the next one.

use std::fs::{File, OpenOptions};
use std::io::{self, BufRead, BufReader, Read, Write};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, ExitStatus, Stdio};
use std::sync::{Mutex, PoisonError};

use super::fork::{fork_into, Forked};
use super::shim::Node;

/// Starts the shim for the task in `dir`, its stderr going to `log`, and
/// returns the detached shim's pid once the intermediate process is reaped.
pub fn spawn_shim(program: &Path, dir: &Path, log: std::fs::File) -> io::Result<u32> {
    let mut intermediate = Command::new(program)
        .arg("shim")
        .arg("--task-dir")
        .arg(dir)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(log)
        .spawn()?;
    let mut said = String::new();
    if let Some(mut out) = intermediate.stdout.take() {
        out.read_to_string(&mut said)?;
    }
    let status = intermediate.wait()?;
    reported_pid(&said, status, dir)
}

/// The shim's pid from what the intermediate process wrote before it exited.
fn reported_pid(said: &str, status: ExitStatus, dir: &Path) -> io::Result<u32> {
    said.trim().parse().map_err(|_| {
        io::Error::other(format!(
            "the shim did not report its pid (it said {said:?}, {status}); see its log in {}",
            dir.display()
        ))
    })
}

/// The agent's end of its shim launcher (see the module documentation).
#[derive(Debug)]
pub struct Launcher {
    program: PathBuf,
    served: Mutex<Option<Served>>,
}

/// A running `gpuq shim --serve` and its pipes.
#[derive(Debug)]
struct Served {
    child: Child,
    requests: Option<ChildStdin>,
    answers: BufReader<ChildStdout>,
}

impl Served {
    fn start(program: &Path) -> io::Result<Served> {
        let mut child = Command::new(program)
            .args(["shim", "--serve"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()?;
        let (Some(requests), Some(answers)) = (child.stdin.take(), child.stdout.take()) else {
            return Err(io::Error::other("the launcher's pipes are missing"));
        };
        Ok(Served {
            child,
            requests: Some(requests),
            answers: BufReader::new(answers),
        })
    }

    /// One request: `Err` when the launcher itself failed (it is not used
    /// again), `Ok(Err)` when it started no shim for this task.
    fn ask(&mut self, request: &str) -> io::Result<io::Result<u32>> {
        let requests = self
            .requests
            .as_mut()
            .ok_or_else(|| io::Error::other("closed"))?;
        requests.write_all(format!("{request}\n").as_bytes())?;
        requests.flush()?;
        let mut answer = String::new();
        if self.answers.read_line(&mut answer)? == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "it exited without an answer",
            ));
        }
        Ok(parse_answer(answer.trim_end()))
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        // End of input makes it exit (one that failed was killed first).
        drop(self.requests.take());
        let _ = self.child.wait();
    }
}

/// An answer line: `pid N` or `error MESSAGE`.
fn parse_answer(line: &str) -> io::Result<u32> {
    match line.split_once(' ') {
        Some(("pid", pid)) => pid
            .parse()
            .map_err(|_| io::Error::other(format!("the shim launcher said {line:?}"))),
        Some(("error", message)) => Err(io::Error::other(message.to_string())),
        _ => Err(io::Error::other(format!("the shim launcher said {line:?}"))),
    }
}

impl Launcher {
    /// A launcher for `program` (the gpuq binary); its process starts with
    /// the first task.
    pub fn new(program: PathBuf) -> Launcher {
        Launcher {
            program,
            served: Mutex::new(None),
        }
    }

    /// The launcher process's pid, while one runs.
    pub fn pid(&self) -> Option<u32> {
        let served = self.served.lock().unwrap_or_else(PoisonError::into_inner);
        served.as_ref().map(|s| s.child.id())
    }

    /// Starts the shim for the task in `dir`, its stderr going to the file
    /// `log_path` (created by whichever process starts it), and returns the
    /// detached shim's pid.
    pub fn spawn(&self, dir: &Path, log_path: &Path) -> io::Result<u32> {
        let request = dir
            .to_str()
            .zip(log_path.to_str())
            .filter(|(d, l)| !(d.contains(['\n', '\t']) || l.contains(['\n', '\t'])))
            .map(|(d, l)| format!("{d}\t{l}"));
        if let Some(request) = request {
            let mut served = self.served.lock().unwrap_or_else(PoisonError::into_inner);
            if served.is_none() {
                match Served::start(&self.program) {
                    Ok(s) => *served = Some(s),
                    Err(e) => tracing::warn!(
                        "cannot start the shim launcher {} shim --serve: {e}; shims are started one by one",
                        self.program.display()
                    ),
                }
            }
            if let Some(s) = served.as_mut() {
                match s.ask(&request) {
                    Ok(answer) => return answer,
                    Err(e) => {
                        tracing::warn!(
                            "the shim launcher failed ({e}); this task's shim is started \
                             directly and a new launcher with the next task"
                        );
                        let _ = s.child.kill();
                        *served = None;
                    }
                }
            }
        }
        let log = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(log_path)?;
        spawn_shim(&self.program, dir, log)
    }
}

/// `gpuq shim --serve`: the launcher's loop. Each line on stdin is a task
/// directory and its shim log, separated by a tab; for each it forks, the
/// child becomes that task's shim (as `gpuq shim --task-dir DIR` would), and
/// it answers on stdout with `pid N` or `error MESSAGE`. Ends at end of input.
/// Single-threaded, so its forks may run any code.
pub fn serve() -> i32 {
    // Once here rather than in every shim: the forks inherit it, writing to
    // their own stderr.
    super::shim::init_logging();
    // The node's cgroups, looked at once rather than by every shim.
    let mut node = Node::detect();
    let stdin = io::stdin();
    let mut line = String::new();
    loop {
        line.clear();
        match stdin.lock().read_line(&mut line) {
            Ok(0) => return 0,
            Ok(_) => {}
            Err(e) => {
                eprintln!("gpuq shim --serve: cannot read a request: {e}");
                return 1;
            }
        }
        let request = line.trim_end_matches('\n');
        if !node.still_holds() {
            node = Node::detect();
        }
        let answer = match request.split_once('\t') {
            Some((dir, log)) => match serve_one(Path::new(dir), Path::new(log), &node) {
                Ok(pid) => format!("pid {pid}"),
                Err(e) => format!("error {}", e.to_string().replace('\n', " ")),
            },
            None => format!("error bad request {request:?}"),
        };
        let mut out = io::stdout().lock();
        if writeln!(out, "{answer}")
            .and_then(|()| out.flush())
            .is_err()
        {
            return 1;
        }
    }
}

/// Forks the shim of the task in `dir` and waits for the fork to report the
/// detached shim's pid and exit, as `spawn_shim` waits for the process it
/// starts.
fn serve_one(dir: &Path, log_path: &Path, node: &Node) -> io::Result<u32> {
    let log: OwnedFd = OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o600)
        .open(log_path)?
        .into();
    let null: OwnedFd = File::open("/dev/null")?.into();
    let (from_child, to_parent) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)?;
    // SAFETY: this process is single-threaded (see `serve`).
    match unsafe { fork_into(None) }? {
        Forked::Child { .. } => {
            // stdin, stdout and stderr as the agent gives them to a shim it
            // starts itself; the launcher's own pipes are replaced.
            let fds = [(&null, 0), (&to_parent, 1), (&log, 2)];
            // SAFETY: dup2 on descriptors this process owns.
            let moved = fds
                .iter()
                .all(|(fd, to)| unsafe { libc::dup2(fd.as_raw_fd(), *to) } == *to);
            drop((log, null, from_child, to_parent));
            if !moved {
                // SAFETY: ends this fork without running the launcher's exit.
                unsafe { libc::_exit(1) }
            }
            std::process::exit(super::shim::shim_on(dir, node))
        }
        Forked::Parent(pid) => {
            drop((log, null, to_parent));
            // The pid's line, without waiting for the shim to let go of the
            // pipe (end of file).
            let mut said = String::new();
            let read = BufReader::new(File::from(from_child)).read_line(&mut said);
            let mut status = 0;
            // SAFETY: waits for this process's own child.
            if unsafe { libc::waitpid(pid, &mut status, 0) } < 0 {
                return Err(io::Error::last_os_error());
            }
            read?;
            reported_pid(&said, ExitStatus::from_raw(status), dir)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_answer_is_a_pid_or_the_reason_there_is_none() {
        assert_eq!(parse_answer("pid 4242").unwrap(), 4242);
        let failed = parse_answer("error the shim did not report its pid").unwrap_err();
        assert_eq!(failed.to_string(), "the shim did not report its pid");
        for junk in ["", "pid", "pid x", "hello there"] {
            let err = parse_answer(junk).unwrap_err();
            assert!(err.to_string().contains("launcher said"), "{junk:?}: {err}");
        }
    }
}
