//! Starting a shim from the agent with `posix_spawn`. glibc implements it as a
//! vfork (`CLONE_VM | CLONE_VFORK`) followed by exec, so the agent's address
//! space (a whole cluster's in `gpuq dev`) is not copied: a `fork` would copy
//! its page tables, write-protect every private page for copy-on-write, make
//! the agent fault on its next write to each, and tear the copy down at exec.
//!
//! The shim starts in a new session with the signals it takes through
//! `sigtimedwait` already blocked, so a stop sent while it starts is queued
//! instead of killing it before it can record anything. It stays the agent's
//! child: `Executor::forget` reaps it once its task is over, and an agent that
//! restarts leaves its shims to the system's reaper.

use std::ffi::{CString, OsStr};
use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::ptr;

/// The signals the shim blocks before its first instruction (see `shim`).
const BLOCKED: [libc::c_int; 4] = [libc::SIGTERM, libc::SIGINT, libc::SIGHUP, libc::SIGCHLD];

fn check(rc: libc::c_int) -> io::Result<()> {
    match rc {
        0 => Ok(()),
        errno => Err(io::Error::from_raw_os_error(errno)),
    }
}

fn sigset(signals: &[libc::c_int]) -> libc::sigset_t {
    // SAFETY: sigset_t is plain data; sigemptyset initialises it.
    let mut set: libc::sigset_t = unsafe { std::mem::zeroed() };
    // SAFETY: `set` is a valid sigset_t; the signals are valid numbers.
    unsafe {
        libc::sigemptyset(&mut set);
        for &sig in signals {
            libc::sigaddset(&mut set, sig);
        }
    }
    set
}

struct FileActions(libc::posix_spawn_file_actions_t);

impl FileActions {
    fn new() -> io::Result<FileActions> {
        // SAFETY: zeroed memory is what _init expects to overwrite.
        let mut actions = FileActions(unsafe { std::mem::zeroed() });
        // SAFETY: a valid pointer to the structure.
        check(unsafe { libc::posix_spawn_file_actions_init(&mut actions.0) })?;
        Ok(actions)
    }
}

impl Drop for FileActions {
    fn drop(&mut self) {
        // SAFETY: initialised in `new`.
        unsafe { libc::posix_spawn_file_actions_destroy(&mut self.0) };
    }
}

struct Attributes(libc::posix_spawnattr_t);

impl Attributes {
    fn new() -> io::Result<Attributes> {
        // SAFETY: zeroed memory is what _init expects to overwrite.
        let mut attr = Attributes(unsafe { std::mem::zeroed() });
        // SAFETY: a valid pointer to the structure.
        check(unsafe { libc::posix_spawnattr_init(&mut attr.0) })?;
        Ok(attr)
    }
}

impl Drop for Attributes {
    fn drop(&mut self) {
        // SAFETY: initialised in `new`.
        unsafe { libc::posix_spawnattr_destroy(&mut self.0) };
    }
}

fn null_terminated(strings: &[CString]) -> Vec<*mut libc::c_char> {
    strings
        .iter()
        .map(|s| s.as_ptr().cast_mut())
        .chain(std::iter::once(ptr::null_mut()))
        .collect()
}

/// Starts `program args...` (looked up in PATH when it has no `/`, as
/// `std::process::Command` does) in a new session with the shim's signals
/// blocked, stdin from /dev/null and stdout/stderr to `log`, the agent's
/// environment and SIGPIPE back at its default. Returns the child's pid.
pub fn spawn_shim(program: &OsStr, args: &[&OsStr], log: &File) -> io::Result<u32> {
    let program = CString::new(program.as_bytes())?;
    let mut argv = vec![program.clone()];
    for arg in args {
        argv.push(CString::new(arg.as_bytes())?);
    }
    let envp: Vec<CString> = std::env::vars_os()
        .map(|(key, value)| {
            let mut pair = key.into_vec();
            pair.push(b'=');
            pair.extend(value.into_vec());
            CString::new(pair)
        })
        .collect::<Result<_, _>>()?;
    let (argv_ptrs, envp_ptrs) = (null_terminated(&argv), null_terminated(&envp));

    let mut actions = FileActions::new()?;
    let log_fd = log.as_raw_fd();
    // SAFETY: valid structures and a NUL-terminated path; dup2 onto 1 and 2
    // clears close-on-exec on the copies (std keeps 0-2 open, so the log's
    // own descriptor is never one of them).
    unsafe {
        check(libc::posix_spawn_file_actions_addopen(
            &mut actions.0,
            0,
            c"/dev/null".as_ptr(),
            libc::O_RDONLY,
            0,
        ))?;
        check(libc::posix_spawn_file_actions_adddup2(
            &mut actions.0,
            log_fd,
            1,
        ))?;
        check(libc::posix_spawn_file_actions_adddup2(
            &mut actions.0,
            log_fd,
            2,
        ))?;
    }
    let mut attr = Attributes::new()?;
    let blocked = sigset(&BLOCKED);
    let default = sigset(&[libc::SIGPIPE]);
    let flags = libc::POSIX_SPAWN_SETSID
        | (libc::POSIX_SPAWN_SETSIGMASK | libc::POSIX_SPAWN_SETSIGDEF) as libc::c_short;
    // SAFETY: valid, initialised structures and sets.
    unsafe {
        check(libc::posix_spawnattr_setsigmask(&mut attr.0, &blocked))?;
        check(libc::posix_spawnattr_setsigdefault(&mut attr.0, &default))?;
        check(libc::posix_spawnattr_setflags(&mut attr.0, flags))?;
    }
    let mut pid: libc::pid_t = 0;
    // SAFETY: every pointer is valid for the call; argv and envp are
    // NUL-terminated arrays of NUL-terminated strings that outlive it.
    check(unsafe {
        libc::posix_spawnp(
            &mut pid,
            program.as_ptr(),
            &actions.0,
            &attr.0,
            argv_ptrs.as_ptr(),
            envp_ptrs.as_ptr(),
        )
    })?;
    Ok(pid as u32)
}
