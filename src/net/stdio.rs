//! Interactive streams (`gpuq exec`, `gpuq attach`, `srun --pty`): a task's
//! standard streams carried between the caller's terminal and the task's
//! node, over the same hops as any request: CLI -> local daemon (unix
//! socket) -> leader (QUIC, forwarded by a follower or an agent) -> the
//! node's agent (a stream the leader opens on the agent's own connection)
//! -> the task's shim (a unix socket in the task directory).
//!
//! Each hop opens with its own request and answer (`ApiRequest::Exec` or
//! `Attach` answered `Attached`; the leader's `StdioRequest`; the agent's
//! [`OutputSeen`] to the shim). From then on the ends, the CLI and the
//! shim, speak [`StdioMsg`] frames both ways, and every hop in between
//! copies bytes without decoding them ([`splice`]): one relay type for
//! input, output, window sizes, signals and the exit.
//!
//! The shim owns the task's terminal or pipes and keeps the output in the
//! task's output file, so a lost stream (a client gone, a server failover)
//! loses neither the task nor its output: a new attach says how much it
//! has seen and the shim replays the rest.

use serde::{Deserialize, Serialize};
use tokio::io::{AsyncRead, AsyncWrite};

/// The largest frame on an interactive stream (a chunk of output or input
/// is far smaller; an `Exit` reason is a sentence).
pub const MAX_STDIO_FRAME: usize = 1 << 20;

/// The most bytes of output one `Output` frame carries.
pub const OUTPUT_CHUNK: usize = 64 << 10;

/// One message of an interactive stream, either way.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum StdioMsg {
    /// Client -> task: bytes for its stdin (its terminal's input under a
    /// pty: Ctrl-C is the byte 0x03, which the terminal turns into SIGINT).
    Input {
        #[serde(with = "serde_bytes")]
        data: Vec<u8>,
    },
    /// Client -> task: the client's stdin ended; the task's stdin pipe is
    /// closed (a terminal has no end: its client sends Ctrl-D as a byte).
    InputEnd,
    /// Client -> task: the client's terminal has this many rows and columns.
    Resize { rows: u16, cols: u16 },
    /// Client -> task: send this signal to the task's process group.
    Signal { signal: i32 },
    /// Task -> client: output, stdout (or the terminal's) unless `stderr`.
    Output {
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        stderr: bool,
        #[serde(with = "serde_bytes")]
        data: Vec<u8>,
    },
    /// Task -> client: something to tell the person at the terminal that
    /// is not the task's output (its time limit is near, say).
    Notice { message: String },
    /// Task -> client: the process ended: its exit code, or the signal
    /// that killed it; neither when it never started (`reason` says why).
    Exit {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        code: Option<i32>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        signal: Option<i32>,
        #[serde(default)]
        reason: String,
    },
    /// Task -> client: the stream cannot go on, and why (nothing runs, or
    /// the node refused).
    Error { message: String },
}

impl StdioMsg {
    /// The status a shell would give for this exit: the code, or 128 + the
    /// signal; `None` for a process that never ran.
    pub fn exit_status(&self) -> Option<i32> {
        match self {
            StdioMsg::Exit { code: Some(c), .. } => Some(*c),
            StdioMsg::Exit {
                signal: Some(s), ..
            } => Some(128 + s),
            _ => None,
        }
    }
}

/// How much of a task's output a client already has: an attach replays
/// the rest from the task's output files, so a reattach after a lost
/// stream neither repeats nor drops a byte.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct OutputSeen {
    #[serde(default)]
    pub stdout: u64,
    #[serde(default)]
    pub stderr: u64,
}

impl OutputSeen {
    /// Counts an output message's bytes.
    pub fn count(&mut self, msg: &StdioMsg) {
        if let StdioMsg::Output { stderr, data } = msg {
            let n = data.len() as u64;
            if *stderr {
                self.stderr += n;
            } else {
                self.stdout += n;
            }
        }
    }
}

/// A new process to start beside a running task (`gpuq exec`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExecSpec {
    pub argv: Vec<String>,
    /// On a pseudo-terminal rather than pipes.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub pty: bool,
    /// The caller's `TERM`, for a terminal.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub term: Option<String>,
    /// The caller's terminal size, rows and columns.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size: Option<(u16, u16)>,
}

/// Either end of a hop, as the hop in between sees it: bytes both ways.
pub trait ByteStream: AsyncRead + AsyncWrite + Send + Unpin {}
impl<T: AsyncRead + AsyncWrite + Send + Unpin> ByteStream for T {}

/// The next hop of an interactive stream.
pub type Upstream = Box<dyn ByteStream>;

/// A QUIC stream's two halves as one [`ByteStream`].
pub fn quic_stream(send: quinn::SendStream, recv: quinn::RecvStream) -> Upstream {
    Box::new(tokio::io::join(recv, send))
}

/// Copies bytes both ways between two hops until both directions have
/// ended (an end one way is passed on as an end of writing, so a client's
/// last input still arrives after the task's last output). Returns the
/// bytes carried each way.
pub async fn splice<A: ByteStream + ?Sized, B: ByteStream + ?Sized>(
    a: &mut A,
    b: &mut B,
) -> std::io::Result<(u64, u64)> {
    tokio::io::copy_bidirectional(a, b).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exit_status_is_the_code_or_128_plus_the_signal() {
        let exit = |code, signal| StdioMsg::Exit {
            code,
            signal,
            reason: String::new(),
        };
        assert_eq!(exit(Some(3), None).exit_status(), Some(3));
        assert_eq!(exit(None, Some(9)).exit_status(), Some(137));
        assert_eq!(exit(None, None).exit_status(), None);
    }

    #[test]
    fn seen_counts_each_stream() {
        let mut seen = OutputSeen::default();
        seen.count(&StdioMsg::Output {
            stderr: false,
            data: b"abc".to_vec(),
        });
        seen.count(&StdioMsg::Output {
            stderr: true,
            data: b"de".to_vec(),
        });
        seen.count(&StdioMsg::Input {
            data: b"zzzz".to_vec(),
        });
        assert_eq!(
            seen,
            OutputSeen {
                stdout: 3,
                stderr: 2
            }
        );
    }
}
