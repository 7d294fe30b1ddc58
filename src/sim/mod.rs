//! Simulation: a fleet of virtual compute agents in one process and a
//! workload driver, so the control plane can be measured at fleet scale on
//! one machine. To the servers a simulated agent is a real one (its own
//! identity from a join token, its own QUIC connection, heartbeats, an
//! inventory of fake GPUs); only its tasks are not processes: `SimRunner`
//! ends each after the time its job declares, compressed by a factor.
//!
//! - [`runner`]: the simulated executor (a `TaskRunner`).

pub mod runner;

pub use runner::SimRunner;
