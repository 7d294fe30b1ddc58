//! How the agent starts a shim without copying itself.
//!
//! The agent is a large multi-threaded process; forking it (even only to
//! exec) copies its page tables, twice for a double fork, and the copy-on-write
//! faults that follow land on the agent. So the agent `posix_spawn`s
//! `gpuq shim --task-dir DIR` (the standard library uses it when no closure
//! runs before exec), and the freshly started, small, single-threaded shim
//! detaches itself:
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

use std::io::{self, Read, Write};
use std::path::Path;
use std::process::{Command, Stdio};

use super::fork::{fork_into, Forked, Target};

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
    said.trim().parse().map_err(|_| {
        io::Error::other(format!(
            "the shim did not report its pid (it said {said:?}, {status}); see its log in {}",
            dir.display()
        ))
    })
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
