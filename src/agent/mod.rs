//! (being built)

pub mod exec;
