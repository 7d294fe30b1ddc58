//! Simulation: a fleet of virtual compute agents in one process and a
//! workload driver, so the control plane can be measured at fleet scale on
//! one machine. To the servers a simulated agent is a real one (its own
//! identity from a join token, its own QUIC connection, heartbeats, an
//! inventory of fake GPUs); only its tasks are not processes: `SimRunner`
//! ends each after the time its job declares, compressed by a factor.
//!
//! - [`runner`]: the simulated executor (a `TaskRunner`).
//! - [`fleet`]: `gpuq sim agents`, N agents in one process.
//! - [`trace`]: the ITP trace and the job shapes it maps to.
//! - [`workload`]: trace replay and synthetic mixes through the real API,
//!   with the figures they produce ([`report`]).

pub mod fleet;
pub mod replay;
pub mod report;
pub mod runner;
pub mod trace;
pub mod workload;

pub use fleet::{run_agents, start_fleet, FleetOptions};
pub use runner::SimRunner;
