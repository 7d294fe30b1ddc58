//! (being built)

pub mod gpu;
