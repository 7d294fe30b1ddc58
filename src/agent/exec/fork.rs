//! Forking a child straight into a cgroup.
//!
//! Moving a running process into a cgroup (writing to `cgroup.procs`) takes
//! the kernel's cgroup-wide threadgroup lock for writing, and that waits for
//! an RCU grace period unless another move happened just before: 6 to 14 ms
//! on an idle 2-core VM, paid on the path of every task start (the shim moves
//! itself to `gpuq/shims`, then its task joins the task cgroup). `clone3`
//! with `CLONE_INTO_CGROUP` (Linux 5.7) creates the child in the cgroup
//! instead, in about 0.2 ms. Where the kernel or a seccomp filter refuses
//! `clone3`, this falls back to `fork` and the child joins by writing
//! `cgroup.procs`, as before.
//!
//! A `clone3` child is a fork child in all that matters here (no shared
//! memory, `SIGCHLD` to the parent), but glibc's fork handlers do not run.
//! Both callers are single-threaded, which is what makes that safe.

use std::io;

use super::cgroup::Target;

/// `CLONE_INTO_CGROUP` from linux/sched.h (not in every libc target).
const CLONE_INTO_CGROUP: u64 = 0x2_0000_0000;

/// `struct clone_args` from linux/sched.h, up to `cgroup` (its size tells the
/// kernel which fields it has).
#[repr(C)]
#[derive(Default)]
struct CloneArgs {
    flags: u64,
    pidfd: u64,
    child_tid: u64,
    parent_tid: u64,
    exit_signal: u64,
    stack: u64,
    stack_size: u64,
    tls: u64,
    set_tid: u64,
    set_tid_size: u64,
    cgroup: u64,
}

/// What `fork_into` returns in each process.
pub enum Forked {
    Parent(libc::pid_t),
    /// `joined`: the child already is in the target (or there was none);
    /// otherwise it must call [`Target::join_self`].
    Child {
        joined: bool,
    },
}

/// Forks, with the child born in `target` when the kernel allows it.
///
/// # Safety
/// As `fork`: the caller is single-threaded, or the child only makes
/// async-signal-safe calls before it execs or exits.
pub unsafe fn fork_into(target: Option<&Target>) -> io::Result<Forked> {
    if let Some(t) = target {
        let args = CloneArgs {
            flags: CLONE_INTO_CGROUP,
            exit_signal: libc::SIGCHLD as u64,
            cgroup: t.dir_fd() as u64,
            ..CloneArgs::default()
        };
        let ret = libc::syscall(
            libc::SYS_clone3,
            &args as *const CloneArgs,
            std::mem::size_of::<CloneArgs>(),
        );
        match ret {
            0 => return Ok(Forked::Child { joined: true }),
            pid if pid > 0 => return Ok(Forked::Parent(pid as libc::pid_t)),
            // Refused (an old kernel, a seccomp filter, a cgroup clone3 may
            // not enter): fork, and the child joins the old way, which
            // reports its own error if the cgroup really is unusable.
            _ => {}
        }
    }
    match libc::fork() {
        -1 => Err(io::Error::last_os_error()),
        0 => Ok(Forked::Child {
            joined: target.is_none(),
        }),
        pid => Ok(Forked::Parent(pid)),
    }
}

#[cfg(test)]
mod tests {
    use std::fs;
    use std::os::fd::AsRawFd;

    use super::*;

    #[test]
    fn without_a_target_it_is_a_plain_fork() {
        // SAFETY: the child exits at once.
        match unsafe { fork_into(None) }.unwrap() {
            Forked::Child { joined } => unsafe { libc::_exit(if joined { 0 } else { 1 }) },
            Forked::Parent(pid) => {
                let pid = nix::unistd::Pid::from_raw(pid);
                let status = nix::sys::wait::waitpid(pid, None).unwrap();
                assert_eq!(status, nix::sys::wait::WaitStatus::Exited(pid, 0));
            }
        }
    }

    /// Whether this kernel has `CLONE_INTO_CGROUP` (Linux 5.7).
    fn kernel_has_clone_into_cgroup() -> bool {
        let release = fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
        let mut parts = release
            .split(['.', '-'])
            .map(|p| p.trim().parse::<u32>().unwrap_or(0));
        let (major, minor) = (parts.next().unwrap_or(0), parts.next().unwrap_or(0));
        (major, minor) >= (5, 7)
    }

    /// As root on a host with a cgroup2 mount (CI), the child starts in the
    /// target cgroup; on a kernel that has it, by clone3 (the fallback would
    /// hide a broken `clone_args` and bring back the slow move).
    #[test]
    fn the_child_starts_in_the_target_cgroup() {
        let mode = super::super::CgroupMode::detect();
        let Some(gpuq) = mode.gpuq_dir() else {
            assert!(
                !nix::unistd::Uid::effective().is_root(),
                "root with no cgroup2 mount: {mode:?}"
            );
            return;
        };
        let path = gpuq.join(format!("fork-test-{}", std::process::id()));
        fs::create_dir_all(&path).unwrap();
        let target = Target::open(&path).unwrap();
        let (read, write) = nix::unistd::pipe().unwrap();
        // SAFETY: the test harness has other threads, so the child makes
        // only system calls on memory it has: join, copy /proc/self/cgroup
        // into the pipe, exit.
        match unsafe { fork_into(Some(&target)) }.unwrap() {
            Forked::Child { joined } => unsafe {
                let flag: &[u8; 1] = match (joined, joined || target.join_self().is_ok()) {
                    (true, _) => b"c",
                    (false, true) => b"f",
                    (false, false) => b"0",
                };
                let w = write.as_raw_fd();
                libc::write(w, flag.as_ptr().cast(), 1);
                let fd = libc::open(c"/proc/self/cgroup".as_ptr(), libc::O_RDONLY);
                let mut buf = [0u8; 4096];
                let n = libc::read(fd, buf.as_mut_ptr().cast(), buf.len());
                if n > 0 {
                    libc::write(w, buf.as_ptr().cast(), n as usize);
                }
                libc::_exit(0)
            },
            Forked::Parent(pid) => {
                drop(write);
                nix::sys::wait::waitpid(nix::unistd::Pid::from_raw(pid), None).unwrap();
                let mut said = String::new();
                io::Read::read_to_string(&mut fs::File::from(read), &mut said).unwrap();
                let _ = fs::remove_dir(&path);
                let name = path.file_name().unwrap().to_str().unwrap();
                let unified = said[1..].lines().find_map(|l| l.strip_prefix("0::"));
                assert!(!said.starts_with('0'), "the child could not join: {said}");
                if kernel_has_clone_into_cgroup() {
                    assert!(
                        said.starts_with('c'),
                        "clone3 was refused and the child fell back to a move: {said}"
                    );
                }
                assert_eq!(unified, Some(format!("/gpuq/{name}").as_str()), "{said}");
            }
        }
    }
}
