//! gpuq: a GPU cluster workload manager in one binary.
//!
//! The binary (`main.rs`) maps subcommands onto these modules. Dependency
//! direction, from the bottom up: `model` and `sched` are pure; `spec` turns user
//! input into a `model::JobSpec`; `state` is the replicated state machine;
//! `net` carries typed frames over QUIC and unix sockets; `raft` glues openraft
//! to `state` and `net`; `server` and `agent` are the two daemon roles; `cli`
//! is the client side; `http` is the daemons' HTTP port (metrics, the JSON
//! API, the web page); `compat` is the Slurm front end (sbatch, squeue, ...)
//! over `spec` and `cli`'s request path. Nothing but `compat` imports `cli`. Helpers every role needs live
//! once, low in the house: `clock` (the time in ms), `socket_path` (where
//! the daemon's unix socket is), `suggest` ("did you mean" for flags and
//! config keys), `owner_only` (files only their owner may open) and `metric`
//! (latency histograms any room may fill); the
//! hostlist syntax is in `model::hostlist`. `scripts/imports.py` checks the
//! direction.

pub mod agent;
pub mod cli;
pub mod clock;
pub mod compat;
pub mod config;
pub mod dev;
pub mod hostname;
pub mod http;
pub mod metric;
pub mod model;
pub mod net;
pub mod owner_only;
pub mod raft;
pub mod sched;
pub mod server;
pub mod sim;
pub mod socket_path;
pub mod spec;
pub mod state;
pub mod suggest;

/// Resolves when the process receives SIGINT or SIGTERM.
pub async fn shutdown_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = match signal(SignalKind::terminate()) {
        Ok(s) => s,
        Err(_) => {
            let _ = tokio::signal::ctrl_c().await;
            return;
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
}
