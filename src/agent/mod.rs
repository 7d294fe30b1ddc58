//! (being built)

pub mod gpu;
pub mod host;
