//! Running tasks on this node (being built): the task files and the task's
//! environment contract.

pub mod env;
pub mod task;
