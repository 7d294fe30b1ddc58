//! Every process of a task, as its shim sees them: its cgroup, its process
//! group and the shim's descendants (the shim is a child subreaper), and
//! how the main process ended. The shim signals them all, reaps them and,
//! once the main process has exited, kills what is left.

use std::time::{Duration, Instant};

use nix::sys::signal::{kill, killpg, Signal};
use nix::sys::wait::{waitpid, WaitPidFlag};
use nix::unistd::Pid;

use super::cgroup::TaskCgroup;
use super::process::{self, Snapshot};

/// How long the shim keeps killing leftovers (e.g. stuck in D state) before it
/// writes the status anyway.
const CLEANUP_LIMIT: Duration = Duration::from_secs(30);

/// How the main process ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Exit {
    Code(i32),
    Signal { signal: i32, core: bool },
}

/// Every process of the task: the cgroup, the process group (the child is a
/// session leader), and the shim's descendants.
///
/// The main child is left a zombie until the very end (its exit is seen with
/// `WNOWAIT`), so its pid, which is also the process group id, cannot be
/// reused while the shim still signals that group.
pub(super) struct Tree<'a> {
    pub child: Pid,
    pub cgroup: Option<&'a TaskCgroup>,
    /// The shim is a subreaper and the kernel lists children: every process
    /// of the task (its process group included, since that lives in the
    /// task's session) is below the shim, found by walking down. Otherwise
    /// all of `/proc` is scanned.
    pub walk: bool,
}

impl Tree<'_> {
    /// The task's live processes, as far as `/proc` shows them: the shim's
    /// descendants and, where they may have left the shim's tree, the members
    /// of the process group.
    pub(super) fn processes(&self) -> Vec<u32> {
        if self.walk {
            if let Ok(found) = process::own_descendants() {
                return found;
            }
        }
        let procs = Snapshot::take();
        let mut found = procs.descendants(std::process::id());
        for pid in procs.group_members(self.child.as_raw() as u32) {
            if !found.contains(&pid) {
                found.push(pid);
            }
        }
        found
    }

    pub(super) fn signal(&self, signal: Signal) {
        if let Some(cgroup) = self.cgroup {
            if signal == Signal::SIGKILL {
                cgroup.kill_all();
            } else {
                cgroup.signal(signal);
            }
        }
        let _ = killpg(self.child, signal);
        for pid in self.processes() {
            let _ = kill(Pid::from_raw(pid as i32), signal);
        }
    }

    pub(super) fn is_empty(&self) -> bool {
        self.cgroup.is_none_or(TaskCgroup::is_empty) && self.processes().is_empty()
    }

    /// The main child's exit, if it happened; leaves it unreaped.
    pub(super) fn main_exit(&self) -> Option<Exit> {
        // SAFETY: siginfo_t is plain data; waitid fills it or leaves it zeroed.
        let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
        let flags = libc::WEXITED | libc::WNOHANG | libc::WNOWAIT;
        let id = self.child.as_raw() as libc::id_t;
        // SAFETY: info is a valid siginfo_t for the kernel to write.
        if unsafe { libc::waitid(libc::P_PID, id, &mut info, flags) } != 0 {
            return None;
        }
        // SAFETY: after a successful waitid for WEXITED these fields are set
        // (si_pid stays 0 when the child has not exited).
        let (pid, status) = unsafe { (info.si_pid(), info.si_status()) };
        if pid == 0 {
            return None;
        }
        Some(match info.si_code {
            libc::CLD_EXITED => Exit::Code(status),
            code => Exit::Signal {
                signal: status,
                core: code == libc::CLD_DUMPED,
            },
        })
    }

    /// Reaps the task's orphans that ended (they are reparented to the shim),
    /// never the main child.
    pub(super) fn reap_orphans(&self) {
        let me = std::process::id();
        let children = match self.walk.then(process::own_children) {
            // WNOHANG leaves a live child be; only zombies are reaped.
            Some(Ok(children)) => children,
            _ => Snapshot::take().zombie_children(me),
        };
        for pid in children {
            if pid != self.child.as_raw() as u32 {
                let _ = waitpid(Pid::from_raw(pid as i32), Some(WaitPidFlag::WNOHANG));
            }
        }
    }

    /// After the main process exited: SIGKILL whatever is left, reap it, and
    /// finally the main child.
    pub(super) fn kill_leftovers(&self) {
        let give_up = Instant::now() + CLEANUP_LIMIT;
        loop {
            self.reap_orphans();
            if self.is_empty() {
                break;
            }
            self.signal(Signal::SIGKILL);
            if Instant::now() > give_up {
                tracing::warn!(
                    "processes of the task survive SIGKILL (stuck in the kernel?); giving up"
                );
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = waitpid(self.child, None);
    }
}
