//! (being built)
pub mod proto;
