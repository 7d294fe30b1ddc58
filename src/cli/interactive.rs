//! The caller's end of an interactive stream (`gpuq exec`, `gpuq attach`,
//! `gpuq run`, `srun --pty`): the request goes to the local daemon like any
//! other, and once it is answered `Attached` the connection carries
//! `net::stdio::StdioMsg` frames: this terminal's keys and size one way,
//! the task's output, notices and exit the other.
//!
//! With a terminal (`--pty`) this one is put in raw mode, so every key
//! (Ctrl-C, Ctrl-Z, Ctrl-D included) goes to the task's terminal as a byte
//! and its line discipline makes the signals there; the mode is restored
//! on every way out (the guard's drop; a signal to this process ends the
//! loop first). Without one, Ctrl-C and the other signals this process
//! gets are passed on to the task's process group.
//!
//! Standard input is read by one thread for the whole process (a blocking
//! read cannot be cancelled, and a reattach must not start a second
//! reader); the runtime never waits for it.

use std::io::Write;
use std::os::fd::AsRawFd;
use std::process::ExitCode;

use tokio::io::AsyncWriteExt;
use tokio::net::UnixStream;
use tokio::sync::mpsc;

use super::{unexpected, CliError};
use crate::net::frame::{read_frame, write_frame};
use crate::net::local::LocalClient;
use crate::net::proto::{ApiRequest, ApiResponse};
use crate::net::stdio::{OutputSeen, StdioMsg, MAX_STDIO_FRAME};

/// Opens the interactive stream `req` asks for: the node it reaches and
/// the connection, or the refusal as an error.
pub async fn open(req: &ApiRequest) -> Result<(String, UnixStream), CliError> {
    let path = super::socket_path();
    let client = LocalClient::connect(&path)
        .await
        .map_err(|e| CliError::unreachable(e.to_string()))?;
    let (resp, stream) = client
        .open_stream(req)
        .await
        .map_err(|e| CliError::unreachable(e.to_string()))?;
    match resp {
        ApiResponse::Attached { node } => Ok((node, stream)),
        ApiResponse::Error { kind, message, .. } => Err(CliError {
            code: kind.into(),
            message,
        }),
        other => Err(unexpected(other)),
    }
}

/// Whether stdin is a terminal (what `--pty` needs).
pub fn stdin_is_terminal() -> bool {
    nix::unistd::isatty(std::io::stdin().as_raw_fd()).unwrap_or(false)
}

/// The refusal of `--pty` without a terminal, before anything is sent.
pub fn needs_terminal(command: &str) -> CliError {
    CliError::input(format!(
        "--pty needs a terminal on stdin, and {command}'s stdin is not one: run it from a \
         terminal, or leave out --pty to run the command with pipes"
    ))
}

/// This terminal's size, rows and columns.
pub fn terminal_size() -> Option<(u16, u16)> {
    // SAFETY: TIOCGWINSZ writes a winsize into the valid struct given.
    let mut ws: libc::winsize = unsafe { std::mem::zeroed() };
    let fd = std::io::stdin().as_raw_fd();
    // SAFETY: as above.
    let ok = unsafe { libc::ioctl(fd, libc::TIOCGWINSZ, &mut ws) } == 0;
    (ok && ws.ws_row > 0 && ws.ws_col > 0).then_some((ws.ws_row, ws.ws_col))
}

/// This terminal in raw mode until dropped.
pub struct RawMode {
    saved: nix::sys::termios::Termios,
}

impl RawMode {
    /// Puts stdin's terminal in raw mode.
    pub fn enter() -> Result<RawMode, CliError> {
        use nix::sys::termios::{cfmakeraw, tcgetattr, tcsetattr, SetArg};
        let stdin = std::io::stdin();
        let saved = tcgetattr(&stdin)
            .map_err(|e| CliError::internal(format!("cannot read the terminal's mode: {e}")))?;
        let mut raw = saved.clone();
        cfmakeraw(&mut raw);
        tcsetattr(&stdin, SetArg::TCSADRAIN, &raw)
            .map_err(|e| CliError::internal(format!("cannot set the terminal's mode: {e}")))?;
        Ok(RawMode { saved })
    }
}

impl Drop for RawMode {
    fn drop(&mut self) {
        use nix::sys::termios::{tcsetattr, SetArg};
        let _ = tcsetattr(std::io::stdin(), SetArg::TCSADRAIN, &self.saved);
    }
}

/// This process's standard input, read by one thread: chunks, then `None`
/// at its end.
pub struct Input {
    rx: mpsc::Receiver<Option<Vec<u8>>>,
    ended: bool,
}

impl Input {
    /// Starts the reader thread (once per process).
    pub fn start() -> Input {
        let (tx, rx) = mpsc::channel(64);
        std::thread::spawn(move || {
            let mut buf = vec![0u8; 16 << 10];
            loop {
                // SAFETY: reads into a buffer this thread owns.
                let n = unsafe { libc::read(0, buf.as_mut_ptr().cast(), buf.len()) };
                if n < 0
                    && std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted
                {
                    continue;
                }
                let chunk = (n > 0).then(|| buf[..n as usize].to_vec());
                let end = chunk.is_none();
                if tx.blocking_send(chunk).is_err() || end {
                    return;
                }
            }
        });
        Input { rx, ended: false }
    }

    /// No input at all (a caller with nothing to type).
    pub fn none() -> Input {
        let (_, rx) = mpsc::channel(1);
        Input { rx, ended: false }
    }
}

/// How a stream ended.
#[derive(Debug)]
pub enum Ended {
    /// The task exited (`StdioMsg::Exit`).
    Exit(StdioMsg),
    /// The node or the leader refused, or nothing is there now.
    Refused(String),
    /// The stream broke before the exit came (a failover, a lost link);
    /// the task itself goes on.
    Lost(String),
    /// This process was asked to stop (SIGTERM, SIGHUP) while attached.
    Interrupted,
    /// The person typed the detach key; the task goes on.
    Detached,
}

/// The key that detaches `gpuq attach` from a terminal (Ctrl-]), as telnet's.
pub const DETACH_KEY: u8 = 0x1d;

/// What the relay does with this end's signals and terminal.
#[derive(Clone, Copy, Debug)]
pub struct Mode {
    /// A terminal in raw mode: keys go as bytes, the size as `Resize`.
    pub pty: bool,
    /// Standard input is sent (else the task's stdin ends at once).
    pub input: bool,
    /// [`DETACH_KEY`] leaves the stream (and is not sent).
    pub detach: bool,
}

/// Relays `stream` until the task exits or the stream ends, counting the
/// output into `seen` (what a reattach then does not repeat).
pub async fn pump(
    stream: UnixStream,
    mode: Mode,
    input: &mut Input,
    seen: &mut OutputSeen,
) -> Ended {
    use tokio::signal::unix::{signal, SignalKind};
    let (mut from, mut to) = stream.into_split();
    let (tx, mut frames) = mpsc::channel::<Result<StdioMsg, String>>(64);
    let reader = tokio::spawn(async move {
        loop {
            let got = read_frame::<_, StdioMsg>(&mut from, MAX_STDIO_FRAME).await;
            let (msg, last) = match got {
                Ok(Some(m)) => (Ok(m), false),
                Ok(None) => (Err("the stream ended".to_string()), true),
                Err(e) => (Err(e.to_string()), true),
            };
            if tx.send(msg).await.is_err() || last {
                return;
            }
        }
    });
    let mut winch = signal(SignalKind::window_change()).ok();
    // Without a terminal these are the task's to get (Ctrl-C is SIGINT here).
    let mut passed: Vec<(i32, tokio::signal::unix::Signal)> = Vec::new();
    let mut stops: Vec<tokio::signal::unix::Signal> = Vec::new();
    for n in [libc::SIGINT, libc::SIGQUIT, libc::SIGUSR1, libc::SIGUSR2] {
        if let Ok(s) = signal(SignalKind::from_raw(n)) {
            passed.push((n, s));
        }
    }
    for n in [libc::SIGTERM, libc::SIGHUP] {
        if let Ok(s) = signal(SignalKind::from_raw(n)) {
            stops.push(s);
        }
    }
    let mut hello = Vec::new();
    if mode.pty {
        if let Some((rows, cols)) = terminal_size() {
            hello.push(StdioMsg::Resize { rows, cols });
        }
    }
    if !mode.input {
        hello.push(StdioMsg::InputEnd);
    }
    for msg in &hello {
        if let Err(e) = write_frame(&mut to, msg).await {
            reader.abort();
            return Ended::Lost(e.to_string());
        }
    }
    let ended = loop {
        let send = tokio::select! {
            got = frames.recv() => match got {
                Some(Ok(msg)) => {
                    if let Some(end) = show(&msg, mode, seen) {
                        break end;
                    }
                    None
                }
                Some(Err(why)) => break Ended::Lost(why),
                None => break Ended::Lost("the stream ended".into()),
            },
            chunk = input.rx.recv(), if mode.input && !input.ended => match chunk {
                Some(Some(data)) if mode.detach && data.contains(&DETACH_KEY) => {
                    let before: Vec<u8> = data.split(|b| *b == DETACH_KEY).next().unwrap_or(&[]).to_vec();
                    if !before.is_empty() {
                        let _ = write_frame(&mut to, &StdioMsg::Input { data: before }).await;
                    }
                    break Ended::Detached;
                }
                Some(Some(data)) => Some(StdioMsg::Input { data }),
                Some(None) | None => {
                    input.ended = true;
                    (!mode.pty).then_some(StdioMsg::InputEnd)
                }
            },
            Some(()) = async { winch.as_mut()?.recv().await } => {
                terminal_size().map(|(rows, cols)| StdioMsg::Resize { rows, cols })
            }
            // A watcher's Ctrl-C leaves; a runner's reaches the task.
            n = first_signal(&mut passed) => match mode.detach {
                true => break Ended::Detached,
                false => Some(StdioMsg::Signal { signal: n }),
            },
            () = first_stop(&mut stops) => break Ended::Interrupted,
        };
        if let Some(msg) = send {
            if let Err(e) = write_frame(&mut to, &msg).await {
                break Ended::Lost(e.to_string());
            }
        }
    };
    let _ = to.shutdown().await;
    reader.abort();
    ended
}

async fn first_signal(signals: &mut [(i32, tokio::signal::unix::Signal)]) -> i32 {
    if signals.is_empty() {
        return std::future::pending().await;
    }
    let futures = signals
        .iter_mut()
        .map(|(n, s)| Box::pin(async move { s.recv().await.map(|()| *n) }));
    match futures::future::select_all(futures).await.0 {
        Some(n) => n,
        None => std::future::pending().await,
    }
}

async fn first_stop(signals: &mut [tokio::signal::unix::Signal]) {
    if signals.is_empty() {
        return std::future::pending().await;
    }
    let futures = signals.iter_mut().map(|s| Box::pin(s.recv()));
    let _ = futures::future::select_all(futures).await;
}

/// Shows one message from the task; `Some` when it ends the stream.
fn show(msg: &StdioMsg, mode: Mode, seen: &mut OutputSeen) -> Option<Ended> {
    seen.count(msg);
    match msg {
        StdioMsg::Output { stderr, data } => {
            emit(*stderr, data);
            None
        }
        StdioMsg::Notice { message } => {
            let line = if mode.pty {
                format!("\r\n{message}\r\n")
            } else {
                format!("{message}\n")
            };
            emit(true, line.as_bytes());
            None
        }
        StdioMsg::Exit { .. } => Some(Ended::Exit(msg.clone())),
        StdioMsg::Error { message } => Some(Ended::Refused(message.clone())),
        _ => None,
    }
}

pub(crate) fn emit(stderr: bool, bytes: &[u8]) {
    if stderr {
        let mut e = std::io::stderr().lock();
        let _ = e.write_all(bytes).and_then(|()| e.flush());
    } else {
        let mut o = std::io::stdout().lock();
        let _ = o.write_all(bytes).and_then(|()| o.flush());
    }
}

/// The exit status for the caller: the task's code, or 128 + its signal;
/// a process that never ran is an error naming why.
pub fn exit_code(exit: &StdioMsg) -> Result<ExitCode, CliError> {
    match exit.exit_status() {
        Some(code) => Ok(ExitCode::from(code.clamp(0, 255) as u8)),
        None => Err(CliError::input(match exit {
            StdioMsg::Exit { reason, .. } if !reason.is_empty() => reason.clone(),
            _ => "the command did not start".to_string(),
        })),
    }
}
