//! The agent role. A compute agent discovers its node (`gpu`, `host`), keeps
//! one connection to the leader and runs the tasks it is given (`compute`); a
//! login agent runs none and only vouches for the users of its host, so
//! `gpuq submit` works from a login node without cluster keys in the CLI.

pub mod compute;
pub mod exec;
pub mod gpu;
pub mod health;
pub mod host;
mod identity;
mod ledger;
mod login;
pub mod logs;
mod node;
mod probe;
pub mod runner;
pub mod servers;
mod spool;
pub mod streams;
pub mod telemetry;

pub use identity::ensure_identity;
pub use login::{run_login, start_login, Forwarder};
pub use node::{data_dirs, exec_runner, run_compute, start_compute, RunningAgent};
