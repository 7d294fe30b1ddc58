//! Replay in virtual time: a job trace driven through the real scheduler
//! (`sched::plan_ref`) and the real state machine (`state::State::apply`)
//! with a simulated clock, no network, no agents and no sleeping, so a month
//! of a real trace is minutes of CPU and a policy can be judged on it.
//!
//! - [`input`]: the trace (CSV with named columns, the ITP trace built in).
//! - [`engine`]: the discrete-event loop (arrivals, the leader's passes,
//!   ends at start + duration).
//! - [`policy`]: what a replay is judged under (`--policy`).
//! - [`report`]: the figures of a run (JSON summary) and the HTML report.
//! - [`command`]: `gpuq sim replay`.

pub mod command;
pub mod engine;
pub mod input;
pub mod policy;
pub mod report;

use serde::{Deserialize, Serialize};

use crate::model::Millis;

/// One job of a trace, as the replay submits it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TraceJob {
    /// The trace's own id (or its line number when it has none).
    pub id: String,
    /// When it arrives, ms after the trace's first arrival.
    pub arrival: Millis,
    /// GPUs in all; the shape on the replayed nodes is derived from it.
    pub gpus: u32,
    /// How long it runs once started, ms.
    pub duration: Millis,
    /// Who submitted it (`user` column; the ITP trace's cluster); empty when
    /// the trace has none.
    pub user: String,
    /// The time limit the trace gives, ms, when it has one.
    pub limit: Option<Millis>,
    /// The 1-based line of the trace it came from (for messages).
    pub line: usize,
}

/// What became of one job in a replay.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Outcome {
    pub id: String,
    pub user: String,
    pub gpus: u32,
    pub arrival: Millis,
    /// When it (last) started; `None`: never did before the replay ended.
    pub start: Option<Millis>,
    /// When it ended; `None`: still running or pending at the end.
    pub end: Option<Millis>,
    /// How many times it was preempted or requeued.
    pub restarts: u32,
}

/// A change of the cluster's load at virtual time `t` (the engine records
/// one each time a count changes; the report integrates them).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Sample {
    pub t: Millis,
    /// GPUs held by running jobs.
    pub busy_gpus: u32,
    /// Jobs waiting.
    pub pending: u32,
    pub running: u32,
}

/// A finished replay: what the report is made from.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Run {
    /// The policy's name (its file stem, or `default`).
    pub policy: String,
    pub nodes: u32,
    pub gpus_per_node: u32,
    pub jobs: Vec<Outcome>,
    pub samples: Vec<Sample>,
    /// Jobs of the trace larger than the cluster, not replayed.
    pub skipped: Vec<String>,
    /// Scheduling passes the replay ran.
    pub passes: u64,
    /// An autoscaled fleet's GPU-time powered (asked for, up or stopping),
    /// ms; `None`: a fixed fleet, all of it powered all the time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provisioned_gpu_ms: Option<u64>,
}
