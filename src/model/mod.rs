//! Domain types used everywhere: ids, job specs, jobs and their states, users,
//! tokens. Pure data plus the invariants that belong to the data itself (such as
//! which job state may follow which). Nothing here does I/O or reads a clock.

pub mod acct;
mod bulk_submit;
mod container;
pub mod elastic;
mod gpu_use;
pub mod hostlist;
mod job;
pub mod mig;
mod node;
pub mod nodegroup;
pub mod policy;
pub mod policy_change;
mod ports;
mod queue;
pub mod reservation;
mod run;
mod service;
pub mod share;
mod step;
mod task;
mod token;
mod update;

pub use bulk_submit::BatchEntryError;
pub use container::{
    containers_summary, runtime_feature, ContainerMount, ContainerSpec, OCI_CDI_FEATURE,
    OCI_FEATURE, OCI_PULL_FEATURE, OCI_ROOTLESS_FEATURE, REGISTRY_SCHEME,
};
pub use elastic::{NodeRange, Resize, ResizeRecord};
pub use gpu_use::GpuUse;
pub use hostlist::{expand_hostlist, HostlistError};
pub use job::*;
pub use mig::{MigLayout, MigSlice};
pub use node::*;
pub use nodegroup::{NodeGroup, PowerChange, PowerRecord, PowerState};
pub use policy::{
    Account, Partition, PartitionState, Policy, PreemptMode, PreemptionRecord, PriorityFactors,
    PriorityWeights, Qos, ShareRow, UsageCell,
};
pub use ports::{PortRange, PortRangeError};
pub use queue::*;
pub use reservation::AdvanceReservation;
pub use run::JobRun;
pub use service::*;
pub use step::*;
pub use task::*;
pub use token::*;
pub use update::JobUpdate;

/// Milliseconds since the Unix epoch. The leader stamps it into commands; apply
/// never reads a clock.
pub type Millis = u64;

/// The name of a server or agent node, as it appears in certificates and tables.
pub type NodeName = String;
