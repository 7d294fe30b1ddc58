//! The output of a pass: what to start, and why the rest waits.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::model::{Allocation, JobId, Millis, TopologyRequirement};

/// What one pass decided. The leader proposes it as one `Command::Schedule`;
/// apply re-checks each allocation with [`super::check_allocation`].
///
/// Preemptions go out as `Command::Preempt`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Plan {
    /// Jobs to start, in queue order; a gang job is one entry, whole.
    pub allocations: Vec<Allocation>,
    /// Every other pending job, in queue order, with why it waits.
    pub pending: Vec<(JobId, PendingReason)>,
    /// Backfill's reservations for the top blocked jobs: when and where each
    /// is expected to start. Jobs started by this plan delay none of them.
    #[serde(default)]
    pub reservations: Vec<Reservation>,
    /// Running jobs to stop so that pending ones fit (`Command::Preempt`).
    #[serde(default)]
    pub preemptions: Vec<Preemption>,
    /// Running elastic jobs to grow into free nodes (`Command::Resize`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub growths: Vec<super::elastic::Growth>,
}

/// Where and when a blocked job is expected to start (backfill).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Reservation {
    pub job: JobId,
    /// The expected start: the earliest time its resources are free.
    pub start: Millis,
    /// Start plus time limit; `None`: unlimited.
    pub end: Option<Millis>,
    /// The resources set aside for it from `start` to `end`.
    pub allocation: Allocation,
}

/// Victims to stop for one pending job: whole jobs, each chosen because the
/// job fits once they have stopped (see `sched::preempt`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Preemption {
    /// The job they make room for.
    pub job: JobId,
    pub victims: Vec<JobId>,
    /// Why, per victim (a QoS preemption or a quota reclaim).
    #[serde(default)]
    pub why: Vec<String>,
    /// Elastic jobs that shrink instead: the nodes each keeps, in rank
    /// order (each gives back the rest).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub shrinks: Vec<Allocation>,
}

/// What the leader keeps of a pass for `gpuq queue` and `gpuq show`: why
/// each pending job waits and the expected starts backfill worked out. Kept
/// as the pass gave them, sorted by id once: a reason becomes text only when
/// a job is shown, not 100,000 strings a pass.
#[derive(Clone, Debug, Default)]
pub struct PendingReasons {
    by_id: Vec<(JobId, PendingReason)>,
    starts: Vec<(JobId, Millis)>,
}

impl PendingReasons {
    /// The reasons of `plan`, which it takes.
    pub fn take(plan: &mut Plan) -> PendingReasons {
        let mut by_id = std::mem::take(&mut plan.pending);
        by_id.sort_unstable_by_key(|(id, _)| *id);
        let mut starts: Vec<(JobId, Millis)> =
            plan.reservations.iter().map(|r| (r.job, r.start)).collect();
        starts.sort_unstable();
        PendingReasons { by_id, starts }
    }

    /// Why `job` waited in the pass, and its expected start if known.
    pub fn get(&self, job: JobId) -> Option<(&PendingReason, Option<Millis>)> {
        let i = self.by_id.binary_search_by_key(&job, |(id, _)| *id).ok()?;
        let start = self
            .starts
            .binary_search_by_key(&job, |(id, _)| *id)
            .ok()
            .map(|k| self.starts[k].1);
        Some((&self.by_id[i].1, start))
    }
}

impl Plan {
    /// The expected start of `job`, if backfill reserved one.
    pub fn expected_start(&self, job: JobId) -> Option<Millis> {
        self.reservations
            .iter()
            .find(|r| r.job == job)
            .map(|r| r.start)
    }
}

/// Why a job is still pending (Slurm's `REASON` column). New variants are added
/// as policies arrive; the ones the planner does not produce yet are here so the
/// state, CLI and API speak one vocabulary.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum PendingReason {
    /// It fits the cluster but not the resources free now.
    Resources,
    /// A job ahead of it in the queue waits, and it may not overtake.
    Priority,
    /// No set of up nodes could hold it even if they were empty.
    Unsatisfiable(String),
    /// It waits for other jobs (`--dependency`).
    Dependency,
    /// Its account or user is at a quota.
    QuotaExceeded,
    /// A user or admin holds it.
    Held,
    /// Its `--begin` time has not come.
    BeginTime,
    /// Enough nodes are free, but not within one domain of the level its
    /// `--topology` requires.
    Topology(TopologyRequirement),
    /// It would fit the free resources, but they are reserved for
    /// higher-priority jobs it would delay (backfill).
    ReservedForOthers,
    /// A dependency can never be met (e.g. `afterok` on a job that failed);
    /// the job stays pending until cancelled.
    DependencyNeverSatisfied(String),
    /// Its array already runs as many tasks as its `%N` throttle allows.
    JobArrayTaskLimit,
    /// It fits, but every node it could have as rank 0 already is rank 0 of
    /// as many running jobs as the cluster's MASTER_PORT range has ports.
    NoMasterPort,
    /// Its partition is down.
    PartitionDown,
    /// Jobs were preempted to make room for it; it starts once they stopped.
    Preempting,
    /// It runs in a reservation (`--reservation`) that has not started.
    ReservationNotStarted(String),
    /// It would fit, but the nodes it could use are held by an advance
    /// reservation its time limit would overlap.
    ReservedNodes { reservation: String, maint: bool },
    /// Nodes of this node group that would hold it are starting (set by
    /// the leader's autoscaler, not by a pass).
    NodesStarting(String),
}

impl PendingReason {
    /// A short word for tables (Slurm's reason names).
    pub fn as_str(&self) -> &'static str {
        match self {
            PendingReason::Resources => "Resources",
            PendingReason::Priority => "Priority",
            PendingReason::Unsatisfiable(_) => "Unsatisfiable",
            PendingReason::Dependency => "Dependency",
            PendingReason::QuotaExceeded => "QuotaExceeded",
            PendingReason::Held => "Held",
            PendingReason::BeginTime => "BeginTime",
            PendingReason::Topology(_) => "Topology",
            PendingReason::ReservedForOthers => "ReservedForOthers",
            PendingReason::DependencyNeverSatisfied(_) => "DependencyNeverSatisfied",
            PendingReason::JobArrayTaskLimit => "JobArrayTaskLimit",
            PendingReason::NoMasterPort => "MasterPort",
            PendingReason::PartitionDown => "PartitionDown",
            PendingReason::Preempting => "Preempting",
            PendingReason::ReservationNotStarted(_) => "Reservation",
            PendingReason::ReservedNodes { maint: true, .. } => "ReservedForMaintenance",
            PendingReason::ReservedNodes { maint: false, .. } => "ReservedNodes",
            PendingReason::NodesStarting(_) => "NodesStarting",
        }
    }
}

impl fmt::Display for PendingReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PendingReason::Resources => {
                f.write_str("waiting for resources: not enough free GPUs, CPUs or memory now")
            }
            PendingReason::Priority => {
                f.write_str("waiting behind a higher-priority job that cannot start yet")
            }
            PendingReason::Unsatisfiable(why) => {
                write!(f, "cannot run on the nodes that are up: {why}")
            }
            PendingReason::Dependency => f.write_str("waiting for its dependencies"),
            PendingReason::QuotaExceeded => f.write_str("its account is at its quota"),
            PendingReason::Held => f.write_str("held; release it to let it start"),
            PendingReason::BeginTime => f.write_str("its begin time has not come"),
            PendingReason::Topology(level) => write!(
                f,
                "waiting for enough free nodes under one {level} (--topology {level}); \
                 enough are free now only across several {}",
                level.plural()
            ),
            PendingReason::ReservedForOthers => f.write_str(
                "the free resources are reserved for higher-priority jobs it would delay",
            ),
            PendingReason::DependencyNeverSatisfied(why) => write!(
                f,
                "its dependency can never be met: {why}; cancel it (gpuq cancel)"
            ),
            PendingReason::JobArrayTaskLimit => {
                f.write_str("its array runs as many tasks as its %N throttle allows")
            }
            PendingReason::NoMasterPort => f.write_str(
                "waiting for a free MASTER_PORT: every port of the cluster's master_port_range \
                 is taken on the nodes it fits on (by running jobs whose rank 0 is there)",
            ),
            PendingReason::PartitionDown => f.write_str("its partition is down"),
            PendingReason::Preempting => {
                f.write_str("waiting for the jobs preempted for it to stop")
            }
            PendingReason::ReservationNotStarted(name) => {
                write!(f, "waiting for its reservation {name} to start")
            }
            PendingReason::ReservedNodes { reservation, maint } => write!(
                f,
                "the nodes it could use are reserved{} (reservation {reservation}) before its \
                 time limit would end; a shorter --time may let it run before the window",
                if *maint { " for maintenance" } else { "" }
            ),
            PendingReason::NodesStarting(group) => write!(
                f,
                "waiting for nodes of group {group} that are starting for it (gpuq nodes)"
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pending_reasons_are_found_by_id_with_their_expected_start() {
        let mut plan = Plan {
            pending: vec![
                (JobId(9), PendingReason::Priority),
                (JobId(3), PendingReason::Resources),
                (JobId(5), PendingReason::QuotaExceeded),
            ],
            reservations: vec![Reservation {
                job: JobId(3),
                start: 42,
                end: None,
                allocation: Allocation {
                    job: JobId(3),
                    nodes: vec![],
                },
            }],
            ..Default::default()
        };
        let r = PendingReasons::take(&mut plan);
        assert!(plan.pending.is_empty());
        assert_eq!(r.get(JobId(3)), Some((&PendingReason::Resources, Some(42))));
        assert_eq!(r.get(JobId(9)), Some((&PendingReason::Priority, None)));
        assert_eq!(
            r.get(JobId(5)).map(|x| x.0),
            Some(&PendingReason::QuotaExceeded)
        );
        assert_eq!(r.get(JobId(4)), None);
    }
}
