//! Following a step from `srun`: each task of a step without `-o` writes
//! to its node's spool, and this copies what is new from every task
//! through the leader (as `gpuq logs` reads), labelled with `-l`, until
//! the step ends; it passes signals on (`Interrupts`, also salloc's) and
//! stops the step when interrupted. The step's exit status is the highest
//! of its tasks'.

use std::io::Write;
use std::process::ExitCode;
use std::time::Duration;

use crate::cli::{call, unexpected, CliError};
use crate::model::{Job, JobId, Step};
use crate::net::proto::{ApiRequest, ApiResponse};

/// One task's stream of output being copied here.
struct Stream {
    rank: u32,
    stderr: bool,
    offset: u64,
    /// A line not yet ended (for `-l` labels).
    partial: Vec<u8>,
}

/// Who follows a step: `srun`, which stops it when interrupted and passes
/// signals on, or `sattach`, which only leaves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Follower {
    Srun,
    Sattach,
}

/// Streams the step's output until it ends; its exit status.
pub(super) async fn follow(
    label: bool,
    id: JobId,
    attempt: u32,
    step: u32,
    ntasks: u32,
    streamed: bool,
    by: Follower,
) -> Result<ExitCode, CliError> {
    let mut streams: Vec<Stream> = if streamed {
        (0..ntasks)
            .flat_map(|rank| {
                [false, true].map(|stderr| Stream {
                    rank,
                    stderr,
                    offset: 0,
                    partial: Vec::new(),
                })
            })
            .collect()
    } else {
        Vec::new()
    };
    let mut interrupt = Interrupts::new()?;
    let mut cancelled = false;
    loop {
        let job = show(id).await?;
        let current = job
            .run
            .as_ref()
            .filter(|r| r.attempt == attempt)
            .and_then(|r| r.steps.get(step as usize))
            .cloned();
        let Some(s) = current else {
            return Err(CliError::input(format!(
                "step {id}.{step} is gone: job {id} is {} (requeued or ended)",
                job.state
            )));
        };
        let over = s.is_over();
        for st in streams.iter_mut() {
            if s.started.contains(&st.rank) || s.ended.contains_key(&st.rank) {
                copy_new(label, id, step, st).await?;
            }
        }
        if over {
            // Whatever was written before the end.
            for st in streams.iter_mut() {
                copy_new(label, id, step, st).await?;
                flush_partial(label, st);
            }
            report_bad_tasks(id, &s);
            let code = s.exit_code().clamp(0, 255) as u8;
            return Ok(ExitCode::from(code));
        }
        if by == Follower::Sattach {
            if interrupt.poll() {
                eprintln!("sattach: detached from step {id}.{step}; it goes on");
                return Ok(ExitCode::SUCCESS);
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        }
        if interrupt.poll() && !cancelled {
            eprintln!("srun: interrupted: stopping step {id}.{step}");
            let _ = call(ApiRequest::StepCancel { job: id, step }).await;
            cancelled = true;
        }
        for signal in interrupt.passed_on_since() {
            let _ = call(ApiRequest::Signal {
                jobs: vec![crate::model::JobRef { id, task: None }],
                signal,
                scope: crate::net::proto::SignalScope::Steps,
                step: Some(step),
            })
            .await;
        }
        tokio::time::sleep(Duration::from_millis(if streamed { 100 } else { 50 })).await;
    }
}

/// Copies what task `st` wrote since the last call.
async fn copy_new(label: bool, id: JobId, step: u32, st: &mut Stream) -> Result<(), CliError> {
    loop {
        let reply = call(ApiRequest::StepLogs {
            job: id,
            step,
            rank: st.rank,
            stderr: st.stderr,
            offset: st.offset,
        })
        .await?;
        let data = match reply {
            ApiResponse::Logs {
                data, next_offset, ..
            } => {
                st.offset = next_offset;
                data
            }
            other => return Err(unexpected(other)),
        };
        if data.is_empty() {
            return Ok(());
        }
        write_out(label, st, &data);
        if data.len() < crate::net::agent_proto::MAX_LOG_CHUNK as usize {
            return Ok(());
        }
    }
}

fn write_out(label: bool, st: &mut Stream, data: &[u8]) {
    let mut out: Vec<u8> = Vec::with_capacity(data.len() + 16);
    if label {
        st.partial.extend_from_slice(data);
        while let Some(end) = st.partial.iter().position(|b| *b == b'\n') {
            let line: Vec<u8> = st.partial.drain(..=end).collect();
            out.extend_from_slice(format!("{}: ", st.rank).as_bytes());
            out.extend_from_slice(&line);
        }
    } else {
        out.extend_from_slice(data);
    }
    emit(st.stderr, &out);
}

fn flush_partial(label: bool, st: &mut Stream) {
    if label && !st.partial.is_empty() {
        let mut out = format!("{}: ", st.rank).into_bytes();
        out.append(&mut st.partial);
        out.push(b'\n');
        emit(st.stderr, &out);
    }
}

fn emit(stderr: bool, bytes: &[u8]) {
    if bytes.is_empty() {
        return;
    }
    if stderr {
        let mut e = std::io::stderr().lock();
        let _ = e.write_all(bytes);
        let _ = e.flush();
    } else {
        let mut o = std::io::stdout().lock();
        let _ = o.write_all(bytes);
        let _ = o.flush();
    }
}

/// Slurm's one line per task that did not exit 0.
fn report_bad_tasks(id: JobId, step: &Step) {
    for (rank, end) in &step.ended {
        if *end != crate::model::TaskEnd::Completed && *end != crate::model::TaskEnd::Cancelled {
            eprintln!(
                "srun: error: step {id}.{}: task {rank}: {}",
                step.id,
                end.describe()
            );
        }
    }
}

/// The job `id` as the cluster has it now.
pub(crate) async fn show(id: JobId) -> Result<Job, CliError> {
    match call(ApiRequest::Show { id, task: None }).await? {
        ApiResponse::Job { job, .. } => Ok(*job),
        other => Err(unexpected(other)),
    }
}

/// SIGINT and SIGTERM (which stop the step), and the signals srun passes
/// on to its tasks as Slurm's does (USR1, USR2, HUP, ALRM: submitit and
/// Lightning checkpoint on USR1/USR2), seen without stopping the process.
pub(crate) struct Interrupts {
    int: tokio::signal::unix::Signal,
    term: tokio::signal::unix::Signal,
    passed_on: Vec<(i32, tokio::signal::unix::Signal)>,
}

impl Interrupts {
    pub(crate) fn new() -> Result<Interrupts, CliError> {
        use tokio::signal::unix::{signal, SignalKind};
        let err = |e: std::io::Error| CliError::internal(format!("cannot watch signals: {e}"));
        let mut passed_on = Vec::new();
        for n in [libc::SIGUSR1, libc::SIGUSR2, libc::SIGHUP, libc::SIGALRM] {
            passed_on.push((n, signal(SignalKind::from_raw(n)).map_err(err)?));
        }
        Ok(Interrupts {
            int: signal(SignalKind::interrupt()).map_err(err)?,
            term: signal(SignalKind::terminate()).map_err(err)?,
            passed_on,
        })
    }

    /// The signals to pass on to the step that came since the last call.
    pub(crate) fn passed_on_since(&mut self) -> Vec<i32> {
        use std::task::{Context, Poll};
        let mut cx = Context::from_waker(std::task::Waker::noop());
        let mut came = Vec::new();
        for (n, s) in &mut self.passed_on {
            if matches!(s.poll_recv(&mut cx), Poll::Ready(Some(()))) {
                came.push(*n);
            }
        }
        came
    }

    /// Whether a signal came since the last call.
    pub(crate) fn poll(&mut self) -> bool {
        use std::task::{Context, Poll};
        let mut cx = Context::from_waker(std::task::Waker::noop());
        let int = matches!(self.int.poll_recv(&mut cx), Poll::Ready(Some(())));
        let term = matches!(self.term.poll_recv(&mut cx), Poll::Ready(Some(())));
        int || term
    }
}
