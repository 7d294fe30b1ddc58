//! The agent role. A compute agent runs tasks (coming with the agents issue);
//! a login agent runs none and only vouches for the users of its host, so
//! `gpuq submit` works from a login node without cluster keys in the CLI.

pub mod compute;
mod identity;
mod login;

pub use identity::ensure_identity;
pub use login::{run_login, start_login, LoginAgent};
