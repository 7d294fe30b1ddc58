//! Running tasks on this node (being built): the task files, the task's
//! environment contract, cgroups, and `gpuq shim`, the parent of each task.

mod cgroup;
pub mod env;
mod launch;
mod process;
mod shim;
pub mod task;

pub use cgroup::CgroupMode;
pub use shim::shim_main;
