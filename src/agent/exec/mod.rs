//! Running tasks on this node (being built): the task files, the task's
//! environment contract, cgroups and what /proc says about processes.

mod cgroup;
pub mod env;
mod process;
pub mod task;

pub use cgroup::CgroupMode;
