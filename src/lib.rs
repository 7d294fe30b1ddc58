//! gpuq: a GPU cluster workload manager in one binary.
//!
//! The binary (`main.rs`) maps subcommands onto these modules. Dependency
//! direction, from the bottom up: `model` and `sched` are pure; `spec` turns user
//! input into a `model::JobSpec`; `state` is the replicated state machine;
//! `net` carries typed frames over QUIC and unix sockets; `raft` glues openraft
//! to `state` and `net`; `server` and `agent` are the two daemon roles; `cli`
//! is the client side. Nothing imports `cli`.

pub mod agent;
pub mod cli;
pub mod config;
pub mod model;
pub mod net;
pub mod raft;
pub mod sched;
pub mod server;
pub mod spec;
pub mod state;
