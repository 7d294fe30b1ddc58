//! The shim's side of an interactive task (`TaskIo::Pipes` or `Pty`): it
//! makes the task's pipes or pseudo-terminal before the task starts, and
//! relays them to the clients that connect to `io.sock` in the task
//! directory (the agent, for each `gpuq attach`, `gpuq exec` or `srun
//! --pty` stream), as `net::stdio::StdioMsg` frames.
//!
//! Everything the task writes also goes to its output files, and a client
//! says how much it has seen when it connects ([`OutputSeen`]): it is sent
//! the rest from the files, then output as it comes, under one lock, so
//! nothing is lost or repeated across a lost stream. Nobody attached is not
//! a reason to stop: the output is still read (the task never blocks on a
//! full terminal) and kept.
//!
//! The relay is a few blocking threads started after the task's process
//! is forked (the shim must fork single-threaded): one per output stream,
//! one accepting clients, one reading each client's input. The shim's
//! main thread keeps waiting for signals as before; these threads inherit
//! its blocked signal mask, so signals still reach `sigtimedwait`.
//!
//! Only the shim's own user (root: the agent) may connect: the socket is
//! 0600 and each peer's uid is checked.

use std::fs::File;
use std::io::{self, Write};
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::fs::{FileExt, OpenOptionsExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::thread;
use std::time::{Duration, Instant};

use super::task::{Identity, TaskSpec, SOCKET_FILE};
use crate::model::TaskIo;
use crate::net::frame::{read_frame_blocking, write_frame_blocking};
use crate::net::stdio::{OutputSeen, StdioMsg, MAX_STDIO_FRAME, OUTPUT_CHUNK};

/// A client that takes longer than this to take a frame is dropped (it can
/// attach again and be sent what it missed).
const CLIENT_SEND_TIMEOUT: Duration = Duration::from_secs(10);
/// How long the output may keep coming after the task's processes are
/// gone (a terminal's last bytes) before the exit is sent.
const DRAIN_LIMIT: Duration = Duration::from_secs(2);
/// How long a task that ended before anyone attached keeps its exit for
/// the client that started it (`srun --pty true` ends before its client
/// is there), which then hears output and exit first-hand.
const FIRST_CLIENT_LINGER: Duration = Duration::from_secs(3);

/// The task's ends of its streams, given to its process as 0, 1 and 2.
pub(super) struct ChildEnds {
    pub fds: [RawFd; 3],
    /// A terminal: the process makes it its controlling terminal.
    pub tty: bool,
    /// Keeps them open until the process is forked.
    _owned: Vec<OwnedFd>,
}

/// The streams of an interactive task, made before it starts.
pub(super) struct Streams {
    listener: UnixListener,
    /// What the task reads: the terminal's master, or its stdin pipe.
    input: File,
    /// What it writes: (stderr?, the read end).
    outputs: Vec<(bool, File)>,
    /// The terminal's master, for its window size.
    master: Option<OwnedFd>,
    files: [Option<OutFile>; 2],
    child: Option<ChildEnds>,
    first: Option<UnixStream>,
    /// A file holding the pid of a process whose own terminal (a runtime's
    /// in a container) follows this one's window size, and the uid that
    /// process must have.
    inner: Option<(PathBuf, u32)>,
}

/// An output file and how much is in it.
struct OutFile {
    file: File,
    len: u64,
}

/// Opens `path` for appending and reading back, as `identity` when the shim
/// runs as root and `as_user` holds: the user's output is opened with the
/// user's rights, as the task's own would be, so a path the user shaped
/// (a symlink in their spool directory) reaches nothing they could not.
pub(super) fn open_output(path: &Path, identity: &Identity, as_user: bool) -> io::Result<File> {
    let open = || {
        std::fs::OpenOptions::new()
            .read(true)
            .append(true)
            .create(true)
            .mode(0o644)
            .custom_flags(libc::O_CLOEXEC | libc::O_NOCTTY | libc::O_NOFOLLOW)
            .open(path)
    };
    let root = nix::unistd::geteuid().is_root();
    if !(as_user && root && identity.uid != 0) {
        return open();
    }
    // The shim is single-threaded here, so its own ids may change for the
    // open and change back.
    // SAFETY: plain system calls; every change is undone below.
    unsafe {
        if libc::setgroups(identity.groups.len(), identity.groups.as_ptr()) < 0
            || libc::setegid(identity.gid) < 0
            || libc::seteuid(identity.uid) < 0
        {
            let e = io::Error::last_os_error();
            restore_root();
            return Err(e);
        }
    }
    let opened = open();
    restore_root();
    opened
}

/// Back to root after `open_output`; a shim that cannot must not go on.
fn restore_root() {
    // SAFETY: plain system calls on this process's own ids.
    unsafe {
        if libc::seteuid(0) < 0 || libc::setegid(0) < 0 || libc::setgroups(0, std::ptr::null()) < 0
        {
            eprintln!("gpuq shim: cannot become root again after opening the output");
            libc::_exit(1);
        }
    }
}

fn pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    Ok(nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)?)
}

impl Streams {
    /// Makes the task's streams and its socket in `dir`. The output goes to
    /// `spec.stdout` (and `spec.stderr` for pipes), opened as the user unless
    /// the task runs beside another (an exec's files are the agent's).
    pub fn open(dir: &Path, spec: &TaskSpec, identity: &Identity) -> Result<Streams, String> {
        let as_user = spec.beside.is_none();
        let out = |path: &Path| {
            open_output(path, identity, as_user)
                .map(|file| {
                    let len = file.metadata().map_or(0, |m| m.len());
                    OutFile { file, len }
                })
                .map_err(|e| format!("cannot open the output file {}: {e}", path.display()))
        };
        let stdout = out(&spec.stdout)?;
        let fail = |what: &str, e: io::Error| format!("cannot make the task's {what}: {e}");
        let (input, outputs, master, child, stderr) = match spec.io {
            TaskIo::Pty => {
                let size = spec.size.map(|(rows, cols)| nix::pty::Winsize {
                    ws_row: rows,
                    ws_col: cols,
                    ws_xpixel: 0,
                    ws_ypixel: 0,
                });
                let pty = nix::pty::openpty(size.as_ref(), None)
                    .map_err(|e| fail("terminal", e.into()))?;
                set_cloexec(pty.master.as_raw_fd());
                let reader = File::from(pty.master.try_clone().map_err(|e| fail("terminal", e))?);
                let writer = File::from(pty.master.try_clone().map_err(|e| fail("terminal", e))?);
                let slave = pty.slave.as_raw_fd();
                let child = ChildEnds {
                    fds: [slave; 3],
                    tty: true,
                    _owned: vec![pty.slave],
                };
                (writer, vec![(false, reader)], Some(pty.master), child, None)
            }
            _ => {
                let (in_r, in_w) = pipe().map_err(|e| fail("pipes", e))?;
                let (out_r, out_w) = pipe().map_err(|e| fail("pipes", e))?;
                let (err_r, err_w) = pipe().map_err(|e| fail("pipes", e))?;
                let child = ChildEnds {
                    fds: [in_r.as_raw_fd(), out_w.as_raw_fd(), err_w.as_raw_fd()],
                    tty: false,
                    _owned: vec![in_r, out_w, err_w],
                };
                let outputs = vec![(false, File::from(out_r)), (true, File::from(err_r))];
                let stderr = if spec.stderr == spec.stdout {
                    None
                } else {
                    Some(out(&spec.stderr)?)
                };
                (File::from(in_w), outputs, None, child, stderr)
            }
        };
        let listener = bind(dir)?;
        Ok(Streams {
            listener,
            input,
            outputs,
            master,
            files: [Some(stdout), stderr],
            child: Some(child),
            first: None,
            inner: None,
        })
    }

    /// Resizes also go to the terminal of the process whose pid `pid_file`
    /// holds, once it is written: the one a container runtime made for an
    /// exec (its process's stdin), which the runtime itself never resizes.
    /// Only a process of user `uid` is resized.
    pub fn follow_terminal(&mut self, pid_file: PathBuf, uid: u32) {
        self.inner = Some((pid_file, uid));
    }

    /// The ends the task's process gets.
    pub fn child_ends(&self) -> Option<&ChildEnds> {
        self.child.as_ref()
    }

    /// Waits up to `limit` for a first client, before the task starts (an
    /// exec exists for the client that asked for it: a command that ends at
    /// once must not end before anyone hears of it).
    pub fn await_first_client(&mut self, limit: Duration) -> Result<(), String> {
        let deadline = Instant::now() + limit;
        self.listener
            .set_nonblocking(true)
            .map_err(|e| e.to_string())?;
        let accepted = loop {
            match self.listener.accept() {
                Ok((s, _)) => match admit(&s) {
                    Ok(_) => break s,
                    Err(e) => tracing::warn!("refused a client: {e}"),
                },
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) => return Err(format!("cannot accept a client: {e}")),
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "nobody attached within {} s; the command was not started",
                    limit.as_secs()
                ));
            }
            thread::sleep(Duration::from_millis(5));
        };
        self.listener
            .set_nonblocking(false)
            .map_err(|e| e.to_string())?;
        self.first = Some(accepted);
        Ok(())
    }

    /// When the task will not start: tells the client already attached.
    pub fn refuse(mut self, exit: &StdioMsg) {
        if let Some(mut first) = self.first.take() {
            let _ = write_frame_blocking(&mut first, exit);
        }
    }

    /// After the task's process is forked: closes the shim's copies of its
    /// ends and starts relaying. `group` is the task's process group.
    pub fn start(mut self, group: i32) -> Relay {
        drop(self.child.take());
        let [stdout, stderr] = std::mem::take(&mut self.files);
        let shared = Arc::new(Shared {
            hub: Mutex::new(Hub {
                clients: Vec::new(),
                next_id: 0,
                stdout,
                stderr,
                over: None,
            }),
            input: Mutex::new(Some(self.input)),
            master: self.master,
            inner: self.inner,
            group,
            draining: (Mutex::new(self.outputs.len()), Condvar::new()),
            joined: Condvar::new(),
        });
        for (stderr, file) in self.outputs {
            let shared = shared.clone();
            thread::spawn(move || read_output(&shared, file, stderr));
        }
        if let Some(first) = self.first.take() {
            shared.add_client(first, OutputSeen::default());
        }
        let listener = self.listener;
        let acceptor = shared.clone();
        thread::spawn(move || accept_clients(&acceptor, &listener));
        Relay { shared }
    }
}

/// Binds `io.sock` in `dir`, open to the shim's user only. The path is
/// reached through a descriptor of the directory, so a deep task root
/// never meets the 108-byte limit of a socket path.
fn bind(dir: &Path) -> Result<UnixListener, String> {
    let fail = |e: io::Error| format!("cannot listen on {}: {e}", dir.join(SOCKET_FILE).display());
    let handle = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC)
        .open(dir)
        .map_err(fail)?;
    let path = format!("/proc/self/fd/{}/{SOCKET_FILE}", handle.as_raw_fd());
    let _ = std::fs::remove_file(&path);
    let listener = UnixListener::bind(&path).map_err(fail)?;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).map_err(fail)?;
    Ok(listener)
}

fn set_cloexec(fd: RawFd) {
    // SAFETY: fcntl on a descriptor this process owns.
    unsafe { libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC) };
}

/// Checks that a client runs as the shim's user and reads what it has seen.
fn admit(s: &UnixStream) -> Result<OutputSeen, String> {
    s.set_nonblocking(false).map_err(|e| e.to_string())?;
    let cred = nix::sys::socket::getsockopt(s, nix::sys::socket::sockopt::PeerCredentials)
        .map_err(|e| format!("no peer credentials: {e}"))?;
    if cred.uid() != nix::unistd::geteuid().as_raw() {
        return Err(format!("uid {} may not attach", cred.uid()));
    }
    s.set_read_timeout(Some(Duration::from_secs(5)))
        .map_err(|e| e.to_string())?;
    let mut reader = s;
    let seen = read_frame_blocking::<_, OutputSeen>(&mut reader, 4096)
        .map_err(|e| e.to_string())?
        .ok_or("the client left before saying hello")?;
    s.set_read_timeout(None).map_err(|e| e.to_string())?;
    s.set_write_timeout(Some(CLIENT_SEND_TIMEOUT))
        .map_err(|e| e.to_string())?;
    Ok(seen)
}

/// The relay, running: what the shim's main thread keeps of it.
pub(super) struct Relay {
    shared: Arc<Shared>,
}

struct Shared {
    hub: Mutex<Hub>,
    /// The task's stdin (or terminal), until a client ends it.
    input: Mutex<Option<File>>,
    master: Option<OwnedFd>,
    /// See [`Streams::follow_terminal`].
    inner: Option<(PathBuf, u32)>,
    group: i32,
    /// Output streams still open, and a signal when one closes.
    draining: (Mutex<usize>, Condvar),
    /// Signalled when a client joins.
    joined: Condvar,
}

/// The clients and the output, changed together: a client joins between
/// two chunks, never inside one.
struct Hub {
    clients: Vec<(u64, UnixStream)>,
    next_id: u64,
    stdout: Option<OutFile>,
    stderr: Option<OutFile>,
    /// The exit, once sent: a late client gets it after its replay.
    over: Option<StdioMsg>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Hub {
    fn file(&mut self, stderr: bool) -> Option<&mut OutFile> {
        // Pipes joined into one file (stderr not split off) share stdout's.
        match (stderr, self.stderr.is_some()) {
            (true, true) => self.stderr.as_mut(),
            _ => self.stdout.as_mut(),
        }
    }

    /// Sends `msg` to every client, dropping those that cannot take it.
    fn broadcast(&mut self, msg: &StdioMsg) {
        self.clients
            .retain_mut(|(_, s)| write_frame_blocking(s, msg).is_ok());
    }
}

impl Shared {
    /// Replays what `seen` lacks to a new client, then adds it.
    fn add_client(self: &Arc<Self>, stream: UnixStream, seen: OutputSeen) {
        let mut hub = lock(&self.hub);
        let mut out = match stream.try_clone() {
            Ok(s) => s,
            Err(_) => return,
        };
        let split = hub.stderr.is_some();
        for (stderr, from) in [(false, seen.stdout), (true, seen.stderr)] {
            if stderr && !split {
                continue;
            }
            let Some(f) = hub.file(stderr) else { continue };
            if replay(&f.file, from, f.len, stderr, &mut out).is_err() {
                return;
            }
        }
        if let Some(over) = &hub.over {
            let _ = write_frame_blocking(&mut out, over);
            return;
        }
        let id = hub.next_id;
        hub.next_id += 1;
        hub.clients.push((id, out));
        drop(hub);
        self.joined.notify_all();
        let shared = self.clone();
        thread::spawn(move || read_input(&shared, stream, id));
    }

    fn output(&self, stderr: bool, data: &[u8]) {
        let mut hub = lock(&self.hub);
        if let Some(f) = hub.file(stderr) {
            if f.file.write_all(data).is_ok() {
                f.len += data.len() as u64;
            }
        }
        hub.broadcast(&StdioMsg::Output {
            stderr,
            data: data.to_vec(),
        });
    }

    fn resize(&self, rows: u16, cols: u16) {
        let Some(master) = &self.master else { return };
        let size = libc::winsize {
            ws_row: rows,
            ws_col: cols,
            ws_xpixel: 0,
            ws_ypixel: 0,
        };
        // SAFETY: TIOCSWINSZ reads a winsize from a valid pointer; the
        // kernel then sends SIGWINCH to the terminal's foreground group.
        unsafe { libc::ioctl(master.as_raw_fd(), libc::TIOCSWINSZ, &size) };
        let inner = self.inner.as_ref().and_then(|f| {
            // The runtime's file (the user's where it is rootless): only
            // a process of the task's user is resized.
            let (file, uid) = f;
            let pid: u32 = super::task::read_untrusted(file, 64)
                .ok()?
                .trim()
                .parse()
                .ok()?;
            let owner = std::os::unix::fs::MetadataExt::uid(
                &std::fs::metadata(format!("/proc/{pid}")).ok()?,
            );
            if owner != *uid {
                return None;
            }
            std::fs::OpenOptions::new()
                .read(true)
                .custom_flags(libc::O_NOCTTY | libc::O_NONBLOCK | libc::O_CLOEXEC)
                .open(format!("/proc/{pid}/fd/0"))
                .ok()
        });
        if let Some(tty) = inner {
            // SAFETY: as above, on the inner terminal; a file that is not
            // a terminal refuses the ioctl, which changes nothing.
            unsafe { libc::ioctl(tty.as_raw_fd(), libc::TIOCSWINSZ, &size) };
        }
    }
}

/// Sends `file`'s bytes from `from` to `len` as output frames.
fn replay(file: &File, from: u64, len: u64, stderr: bool, to: &mut UnixStream) -> io::Result<()> {
    let mut at = from.min(len);
    let mut buf = vec![0u8; OUTPUT_CHUNK];
    while at < len {
        let want = ((len - at) as usize).min(buf.len());
        let n = file.read_at(&mut buf[..want], at)?;
        if n == 0 {
            break;
        }
        let msg = StdioMsg::Output {
            stderr,
            data: buf[..n].to_vec(),
        };
        write_frame_blocking(to, &msg).map_err(io::Error::other)?;
        at += n as u64;
    }
    Ok(())
}

fn read_output(shared: &Shared, mut file: File, stderr: bool) {
    use std::io::Read;
    let mut buf = vec![0u8; OUTPUT_CHUNK];
    loop {
        match file.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => shared.output(stderr, &buf[..n]),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            // A terminal whose last holder closed it reads EIO.
            Err(_) => break,
        }
    }
    let (count, closed) = &shared.draining;
    *lock(count) -= 1;
    closed.notify_all();
}

fn accept_clients(shared: &Arc<Shared>, listener: &UnixListener) {
    for stream in listener.incoming() {
        let Ok(stream) = stream else { continue };
        match admit(&stream) {
            Ok(seen) => shared.add_client(stream, seen),
            Err(e) => tracing::warn!("refused a client: {e}"),
        }
    }
}

fn read_input(shared: &Shared, mut stream: UnixStream, id: u64) {
    while let Ok(Some(msg)) = read_frame_blocking::<_, StdioMsg>(&mut stream, MAX_STDIO_FRAME) {
        match msg {
            StdioMsg::Input { data } => {
                let mut input = lock(&shared.input);
                if let Some(f) = input.as_mut() {
                    if f.write_all(&data).is_err() {
                        *input = None;
                    }
                }
            }
            StdioMsg::InputEnd if shared.master.is_none() => *lock(&shared.input) = None,
            StdioMsg::Resize { rows, cols } => shared.resize(rows, cols),
            StdioMsg::Signal { signal } => {
                // SAFETY: kill has no memory effects.
                unsafe { libc::kill(-shared.group, signal) };
            }
            _ => {}
        }
    }
    lock(&shared.hub).clients.retain(|(c, _)| *c != id);
}

impl Relay {
    /// Tells every client something (not the task's output).
    pub fn notice(&self, message: String) {
        lock(&self.shared.hub).broadcast(&StdioMsg::Notice { message });
    }

    /// After the task's processes are gone: lets the output drain (for at
    /// most `DRAIN_LIMIT`), sends `exit` to every client and closes them.
    pub fn finish(self, exit: StdioMsg) {
        let deadline = Instant::now() + DRAIN_LIMIT;
        let (count, closed) = &self.shared.draining;
        let mut open = lock(count);
        while *open > 0 {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            open = closed
                .wait_timeout(open, left)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
        drop(open);
        let mut hub = lock(&self.shared.hub);
        let linger = Instant::now() + FIRST_CLIENT_LINGER;
        while hub.next_id == 0 {
            let left = linger.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            hub = self
                .shared
                .joined
                .wait_timeout(hub, left)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
        hub.broadcast(&exit);
        for (_, s) in hub.clients.drain(..) {
            let _ = s.shutdown(std::net::Shutdown::Both);
        }
        hub.over = Some(exit);
    }
}
