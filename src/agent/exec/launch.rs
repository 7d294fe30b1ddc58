//! Starting the user's process: everything is prepared in the shim (names
//! resolved, strings converted, files opened), then the forked child runs only
//! system calls (join the cgroup, new session, groups/gid/uid, chdir, open the
//! output files as the user, exec). A failing step writes which step and the
//! errno to a close-on-exec pipe, so the shim tells "could not start" (with the
//! path and the OS error) from a program that ran and exited 127.
//!
//! The shim is single-threaded, which is what makes the few allocations it
//! still does before the child execs harmless; keep it that way.

use std::ffi::{CString, OsStr};
use std::fs::File;
use std::io::{self, Read};
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::ptr;

use nix::fcntl::OFlag;
use nix::unistd::{pipe2, Pid};

use super::cgroup::Target;
use super::fork::{fork_into, Forked};
use super::task::{Identity, TaskSpec};

/// The PATH used to find a command when the task's environment has none.
const DEFAULT_PATH: &str = "/usr/local/bin:/usr/bin:/bin";

/// The steps the child takes, in order; the number travels through the pipe.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u32)]
enum Step {
    JoinCgroup = 1,
    NewSession,
    Groups,
    SetGid,
    SetUid,
    Chdir,
    Stdin,
    Stdout,
    Stderr,
    Affinity,
    Exec,
    Terminal,
    /// A container's mounts (`container_mounts`); the index says which.
    Container,
    /// Back to root, for the OCI runtime, after the user's files are open.
    Privileges,
}

impl Step {
    fn from_u32(n: u32) -> Option<Step> {
        use Step::*;
        [
            JoinCgroup, NewSession, Groups, SetGid, SetUid, Chdir, Stdin, Stdout, Stderr, Affinity,
            Exec, Terminal, Container, Privileges,
        ]
        .into_iter()
        .find(|s| *s as u32 == n)
    }
}

/// The user's process, ready to be forked.
pub struct Prepared {
    identity: Identity,
    argv: Vec<CString>,
    envp: Vec<CString>,
    /// Paths to try with execve, in order (one, or the PATH search).
    candidates: Vec<CString>,
    /// How the program was named, for messages.
    program: String,
    search_path: Option<String>,
    workdir: CString,
    stdout: CString,
    stderr: Option<CString>,
    /// The task's cgroup, which the child starts in.
    cgroup: Option<Target>,
    affinity: Option<(libc::cpu_set_t, String)>,
    /// Descriptors for 0, 1 and 2 instead of /dev/null and the output files
    /// (an interactive task's pipes or terminal), and whether they are a
    /// terminal to make the controlling one.
    stdio: Option<([RawFd; 3], bool)>,
    /// A task in a container: the child makes its mounts, takes only the
    /// user's file system identity (to open the output files as the user)
    /// and execs the OCI runtime as root.
    container: Option<super::container::Launch>,
}

fn cstring(s: impl AsRef<OsStr>, what: &str) -> Result<CString, String> {
    CString::new(s.as_ref().as_bytes())
        .map_err(|_| format!("{what} {:?} contains a NUL byte", s.as_ref()))
}

impl Prepared {
    /// Converts the spec into what the child needs. `script` is the written
    /// `script` file of a script job, `cgroup` the task cgroup's directory,
    /// `pin_cpus` whether the child pins itself to `spec.cpus`
    /// (when no cpuset did it). Errors are sentences for the user.
    pub fn new(
        spec: &TaskSpec,
        identity: Identity,
        script: Option<&Path>,
        cgroup: Option<&Path>,
        pin_cpus: bool,
    ) -> Result<Prepared, String> {
        let argv = task_argv(spec, script)?;
        let program = argv[0].clone();
        let (candidates, search_path) = if program.contains('/') {
            (vec![cstring(&program, "program")?], None)
        } else {
            let path = spec
                .env
                .iter()
                .rev()
                .find(|(k, _)| k == "PATH")
                .map_or(DEFAULT_PATH, |(_, v)| v.as_str())
                .to_string();
            let candidates = path
                .split(':')
                .map(|dir| {
                    let dir = if dir.is_empty() { "." } else { dir };
                    cstring(format!("{dir}/{program}"), "program")
                })
                .collect::<Result<_, _>>()?;
            (candidates, Some(path))
        };
        let mut envp: Vec<CString> = Vec::new();
        let has = |name: &str| spec.env.iter().any(|(k, _)| k == name);
        for (k, v) in &spec.env {
            envp.push(cstring(format!("{k}={v}"), "environment variable")?);
        }
        // A login sets these; fill them in from this node's user database
        // when the job did not bring them.
        for (name, value) in [("USER", &identity.name), ("LOGNAME", &identity.name)] {
            if !has(name) {
                envp.push(cstring(format!("{name}={value}"), "environment variable")?);
            }
        }
        let cgroup = cgroup
            .map(Target::open)
            .transpose()
            .map_err(|e| e.to_string())?;
        let affinity = (pin_cpus && !spec.cpus.is_empty()).then(|| {
            // SAFETY: cpu_set_t is a plain bit array; all zeroes is the empty set.
            let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
            for &cpu in &spec.cpus {
                if (cpu as usize) < libc::CPU_SETSIZE as usize {
                    // SAFETY: the index is below CPU_SETSIZE.
                    unsafe { libc::CPU_SET(cpu as usize, &mut set) };
                }
            }
            let list: Vec<String> = spec.cpus.iter().map(u32::to_string).collect();
            (set, list.join(","))
        });
        Ok(Prepared {
            argv: argv
                .iter()
                .map(|a| cstring(a, "argument"))
                .collect::<Result<_, _>>()?,
            envp,
            candidates,
            program,
            search_path,
            workdir: cstring(&spec.workdir, "working directory")?,
            stdout: cstring(&spec.stdout, "output path")?,
            stderr: if spec.stderr == spec.stdout {
                None
            } else {
                Some(cstring(&spec.stderr, "error path")?)
            },
            cgroup,
            affinity,
            identity,
            stdio: None,
            container: None,
        })
    }

    /// Runs the task in a container: the child execs the OCI runtime with
    /// `launch`'s command line instead of the task's own.
    pub fn with_container(
        mut self,
        launch: Option<super::container::Launch>,
    ) -> Result<Prepared, String> {
        if let Some(launch) = &launch {
            self.argv = launch
                .argv
                .iter()
                .map(|a| cstring(a, "argument"))
                .collect::<Result<_, _>>()?;
            self.program = launch.argv[0].clone();
            self.candidates = vec![cstring(&self.program, "program")?];
            self.search_path = None;
            self.envp = vec![cstring(format!("PATH={DEFAULT_PATH}"), "environment")?];
        }
        self.container = launch;
        Ok(self)
    }

    /// The task's container, if it runs in one.
    pub fn container(&self) -> Option<&super::container::Launch> {
        self.container.as_ref()
    }

    /// Gives the process these ends as its stdin, stdout and stderr.
    pub fn with_stdio(mut self, ends: Option<&super::stdio::ChildEnds>) -> Prepared {
        self.stdio = ends.map(|e| (e.fds, e.tty));
        self
    }

    /// Forks the child. The returned report is read once the child has exited:
    /// it says whether the exec happened.
    pub fn spawn(&self) -> io::Result<(Pid, LaunchReport)> {
        let (read, write) = pipe2(OFlag::O_CLOEXEC)?;
        let argv = null_terminated(&self.argv);
        let envp = null_terminated(&self.envp);
        // SAFETY: the shim is single-threaded; the child only makes system
        // calls on memory prepared above and then execs or exits.
        match unsafe { fork_into(self.cgroup.as_ref()) }? {
            Forked::Child { joined } => unsafe {
                self.child(write.as_raw_fd(), joined, &argv, &envp)
            },
            Forked::Parent(pid) => {
                drop(write);
                Ok((Pid::from_raw(pid), LaunchReport { pipe: read }))
            }
        }
    }

    /// The child: never returns.
    unsafe fn child(
        &self,
        report: RawFd,
        joined: bool,
        argv: &[*const libc::c_char],
        envp: &[*const libc::c_char],
    ) -> ! {
        let fail = |step: Step, index: usize| -> ! {
            let errno = *libc::__errno_location();
            let mut msg = [0u8; 12];
            msg[..4].copy_from_slice(&(step as u32).to_ne_bytes());
            msg[4..8].copy_from_slice(&errno.to_ne_bytes());
            msg[8..].copy_from_slice(&(index as u32).to_ne_bytes());
            libc::write(report, msg.as_ptr().cast(), msg.len());
            libc::_exit(127)
        };
        // Inherited: the shim's blocked signals and ignored dispositions.
        let mut empty: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut empty);
        libc::sigprocmask(libc::SIG_SETMASK, &empty, ptr::null_mut());
        for sig in 1..32 {
            if sig != libc::SIGKILL && sig != libc::SIGSTOP {
                libc::signal(sig, libc::SIG_DFL);
            }
        }
        // Nothing the shim holds leaks into the task (the kernel may lack
        // close_range; everything the shim opens is close-on-exec anyway).
        libc::syscall(
            libc::SYS_close_range,
            3 as libc::c_uint,
            libc::c_uint::MAX,
            libc::CLOSE_RANGE_CLOEXEC,
        );
        if let Some(cgroup) = self.cgroup.as_ref().filter(|_| !joined) {
            if cgroup.join_self().is_err() {
                fail(Step::JoinCgroup, 0);
            }
        }
        if libc::setsid() < 0 {
            fail(Step::NewSession, 0);
        }
        if let Some(mounts) = self.container.as_ref().and_then(|c| c.mounts.as_ref()) {
            if let Err(code) = mounts.enter() {
                fail(Step::Container, code as usize);
            }
        }
        let id = &self.identity;
        // An unprivileged shim (gpuq dev run by a user) can only run tasks as
        // that same user, and then has no identity to switch.
        let already = libc::geteuid() == id.uid && id.uid != 0;
        if self.container.is_some() && !already {
            // The files are opened as the user; the runtime runs as root,
            // or as the user where it is rootless (below).
            if libc::setgroups(id.groups.len(), id.groups.as_ptr()) < 0 {
                fail(Step::Groups, 0);
            }
            libc::setfsgid(id.gid);
            if libc::setfsgid(u32::MAX) as u32 != id.gid {
                fail(Step::SetGid, 0);
            }
            libc::setfsuid(id.uid);
            if libc::setfsuid(u32::MAX) as u32 != id.uid {
                fail(Step::SetUid, 0);
            }
        } else if !already {
            if libc::setgroups(id.groups.len(), id.groups.as_ptr()) < 0 {
                fail(Step::Groups, 0);
            }
            if libc::setgid(id.gid) < 0 {
                fail(Step::SetGid, 0);
            }
            if libc::setuid(id.uid) < 0 {
                fail(Step::SetUid, 0);
            }
        }
        if libc::chdir(self.workdir.as_ptr()) < 0 {
            fail(Step::Chdir, 0);
        }
        // The daemons run with umask 077 (their own files are secrets); a
        // task gets the usual 022, as after a login.
        libc::umask(0o022);
        if let Some(([stdin, stdout, stderr], tty)) = self.stdio {
            for (fd, to, step) in [
                (stdin, 0, Step::Stdin),
                (stdout, 1, Step::Stdout),
                (stderr, 2, Step::Stderr),
            ] {
                if libc::dup2(fd, to) < 0 {
                    fail(step, 0);
                }
            }
            // A session leader opening no terminal yet: this one becomes
            // its controlling terminal, so Ctrl-C and job control work.
            if tty && libc::ioctl(0, libc::TIOCSCTTY, 0) < 0 {
                fail(Step::Terminal, 0);
            }
        } else {
            let null = libc::open(c"/dev/null".as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC);
            if null < 0 || libc::dup2(null, 0) < 0 {
                fail(Step::Stdin, 0);
            }
            let flags = libc::O_WRONLY | libc::O_CREAT | libc::O_APPEND | libc::O_CLOEXEC;
            let out = libc::open(self.stdout.as_ptr(), flags, 0o644 as libc::c_uint);
            if out < 0 || libc::dup2(out, 1) < 0 {
                fail(Step::Stdout, 0);
            }
            let err = match &self.stderr {
                Some(path) => libc::open(path.as_ptr(), flags, 0o644 as libc::c_uint),
                None => out,
            };
            if err < 0 || libc::dup2(err, 2) < 0 {
                fail(Step::Stderr, 0);
            }
        }
        match self
            .container
            .as_ref()
            .filter(|_| !already)
            .map(|c| c.as_user)
        {
            // A rootless runtime: the user's own process, with the user's
            // groups (already set above), which its container keeps.
            Some(true) => {
                if libc::setgid(id.gid) < 0 {
                    fail(Step::SetGid, 0);
                }
                if libc::setuid(id.uid) < 0 {
                    fail(Step::SetUid, 0);
                }
            }
            Some(false) => {
                libc::setfsuid(0);
                libc::setfsgid(0);
                if libc::setgroups(0, ptr::null()) < 0 {
                    fail(Step::Privileges, 0);
                }
            }
            None => {}
        }
        if let Some((set, _)) = &self.affinity {
            if libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), set) < 0 {
                fail(Step::Affinity, 0);
            }
        }
        // execvp's rules: skip missing candidates, remember a permission
        // error, stop at any other error.
        let mut denied = None;
        for (i, path) in self.candidates.iter().enumerate() {
            libc::execve(path.as_ptr(), argv.as_ptr(), envp.as_ptr());
            match *libc::__errno_location() {
                libc::ENOENT | libc::ENOTDIR | libc::ESTALE => {}
                libc::EACCES => {
                    denied.get_or_insert(i);
                }
                _ => fail(Step::Exec, i),
            }
        }
        if let Some(i) = denied {
            *libc::__errno_location() = libc::EACCES;
            fail(Step::Exec, i);
        }
        *libc::__errno_location() = libc::ENOENT;
        fail(Step::Exec, usize::MAX)
    }

    /// The sentence for a failed step, naming the path and the OS error.
    fn describe(&self, step: Step, errno: i32, index: u32) -> String {
        let err = io::Error::from_raw_os_error(errno);
        let id = &self.identity;
        let show = |c: &CString| c.to_string_lossy().into_owned();
        match step {
            Step::JoinCgroup => format!(
                "cannot join cgroup {}: {err}",
                self.cgroup
                    .as_ref()
                    .map_or(String::new(), |c| c.path().display().to_string())
            ),
            Step::NewSession => format!("cannot start a new session: {err}"),
            Step::Groups => format!(
                "cannot set the supplementary groups {:?} of user {}: {err}",
                id.groups, id.name
            ),
            Step::SetGid => format!("cannot switch to gid {} of user {}: {err}", id.gid, id.name),
            Step::SetUid => format!("cannot switch to uid {} of user {}: {err}", id.uid, id.name),
            Step::Chdir => format!(
                "cannot use working directory {} as user {}: {err}",
                show(&self.workdir),
                id.name
            ),
            Step::Stdin if self.stdio.is_some() => format!("cannot set up stdin: {err}"),
            Step::Stdout | Step::Stderr if self.stdio.is_some() => {
                format!("cannot set up stdout and stderr: {err}")
            }
            Step::Terminal => format!("cannot make the pty the controlling terminal: {err}"),
            Step::Container => match self.container.as_ref().and_then(|c| c.mounts.as_ref()) {
                Some(mounts) => mounts.describe(index, errno),
                None => format!("cannot set up the container: {err}"),
            },
            Step::Privileges => format!("cannot return to root to start the OCI runtime: {err}"),
            Step::Exec if self.container.is_some() => {
                format!("cannot execute the OCI runtime {}: {err}", self.program)
            }
            Step::Stdin => format!("cannot open /dev/null for stdin: {err}"),
            Step::Stdout => format!(
                "cannot open output file {} as user {}: {err}",
                show(&self.stdout),
                id.name
            ),
            Step::Stderr => format!(
                "cannot open error file {} as user {}: {err}",
                show(self.stderr.as_ref().unwrap_or(&self.stdout)),
                id.name
            ),
            Step::Affinity => format!(
                "cannot pin the task to CPUs {}: {err}",
                self.affinity.as_ref().map_or("", |(_, l)| l.as_str())
            ),
            Step::Exec => match self.candidates.get(index as usize) {
                Some(path) => {
                    let path = show(path);
                    if errno == libc::ENOENT && Path::new(&path).exists() {
                        format!(
                            "cannot execute {path}: the interpreter on its #! line was not found"
                        )
                    } else {
                        format!("cannot execute {path} as user {}: {err}", id.name)
                    }
                }
                None => match &self.search_path {
                    Some(search) => {
                        format!("command {:?} not found in PATH {search}", self.program)
                    }
                    None => format!("cannot execute {}: {err}", self.program),
                },
            },
        }
    }
}

/// The task's own command line: a script (written to `script`) with its
/// arguments, or the command.
pub fn task_argv(spec: &TaskSpec, script: Option<&Path>) -> Result<Vec<String>, String> {
    Ok(match (&spec.program, script) {
        (crate::model::Program::Script { args, .. }, Some(path)) => {
            std::iter::once(path.to_string_lossy().into_owned())
                .chain(args.iter().cloned())
                .collect()
        }
        (_, Some(path)) => vec![path.to_string_lossy().into_owned()],
        (crate::model::Program::Command { argv }, None) if !argv.is_empty() => argv.clone(),
        _ => return Err("the task has no command to run".to_string()),
    })
}

fn null_terminated(strings: &[CString]) -> Vec<*const libc::c_char> {
    strings
        .iter()
        .map(|s| s.as_ptr())
        .chain(std::iter::once(ptr::null()))
        .collect()
}

/// The read end of the child's report pipe.
pub struct LaunchReport {
    pipe: OwnedFd,
}

impl LaunchReport {
    /// After the child exited: `Some(reason)` when it never reached exec.
    pub fn failure(self, prepared: &Prepared) -> Option<String> {
        let mut file = File::from(self.pipe);
        let mut msg = Vec::new();
        if file.read_to_end(&mut msg).is_err() || msg.len() < 12 {
            return None;
        }
        let word = |i: usize| u32::from_ne_bytes([msg[i], msg[i + 1], msg[i + 2], msg[i + 3]]);
        let step = Step::from_u32(word(0))?;
        Some(prepared.describe(step, word(4) as i32, word(8)))
    }
}
