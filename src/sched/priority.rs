//! Multifactor priority (Slurm's priority/multifactor): each factor is in
//! 0..1 and counts times its weight from the policy; `--nice` is subtracted
//! and the job's own `priority` added as is.
//!
//! - age: time queued over `max_age_secs`, capped at 1;
//! - fair-share: the account's factor ([`super::fairshare`]);
//! - job size: the job's GPUs over the up nodes' GPUs (large jobs wait
//!   longest for room, so they get a little ahead);
//! - QoS and partition: their priority over the largest configured.
//!
//! The queue is ordered by the total (higher first), then submit time, then id.

use std::collections::BTreeMap;

use super::fairshare::FairShare;
use super::policy::qos_of;
use super::view::{ClusterView, NodeView, PendingJob};
use super::ViewRef;
use crate::model::{JobId, Millis, PriorityFactors as Factors};

/// Priorities of every pending job at `now`.
pub fn priorities(view: &ClusterView, now: Millis) -> BTreeMap<JobId, Factors> {
    let v = view.by_ref();
    let ranker = Ranker::new(&v, now, up_gpus(&super::up_nodes(&v.nodes)));
    view.pending
        .iter()
        .map(|j| (j.id, ranker.factors(j, now)))
        .collect()
}

/// A job's place in queue order, by its total priority: ids are unique, so
/// the order is total.
pub(super) type Key = (std::cmp::Reverse<i64>, bool, Millis, JobId);

/// The [`Key`] of `job` with priority `total`. A restarting gang (requeued
/// after a failure, `PendingJob::previous`) goes ahead of others of its
/// priority: back to the head of the queue.
pub(super) fn key(job: &PendingJob, total: i64) -> Key {
    (
        std::cmp::Reverse(total),
        job.previous.is_empty(),
        job.submit_time,
        job.id,
    )
}

/// A job's fair-share, QoS and partition factors.
#[derive(Clone, Copy, Debug)]
pub(super) struct ByName {
    pub fairshare: f64,
    pub qos: f64,
    pub partition: f64,
}

/// What every job's factors share in one pass, worked out once: the
/// fair-share of each account, the up nodes' GPUs, the QoS and partition
/// factors by name. Computing them per job made ordering a large queue
/// O(jobs × nodes) with a clone of the policy's maps per job.
pub struct Ranker<'v> {
    weights: &'v crate::model::PriorityWeights,
    fs: FairShare,
    cluster_gpus: u64,
    /// Factor by QoS name (only the configured and built-in ones).
    qos: BTreeMap<String, f64>,
    /// Factor by partition name, and the partition of a job naming none.
    partitions: BTreeMap<String, f64>,
    default_partition: String,
}

/// The healthy GPUs of the `up` nodes: what the job-size factor is a share
/// of.
pub(super) fn up_gpus(up: &[&NodeView]) -> u64 {
    up.iter().map(|n| n.capacity().gpus).sum()
}

/// Each name's priority as a share of the highest (all 0 when none is set).
fn share_of_highest(priorities: impl Iterator<Item = (String, u32)>) -> BTreeMap<String, f64> {
    let priorities: Vec<(String, u32)> = priorities.collect();
    let max = priorities.iter().map(|(_, p)| *p).max().unwrap_or(0);
    priorities
        .into_iter()
        .map(|(name, p)| {
            let f = if max > 0 {
                f64::from(p) / f64::from(max)
            } else {
                0.0
            };
            (name, f)
        })
        .collect()
}

impl<'v> Ranker<'v> {
    /// `cluster_gpus`: [`up_gpus`] of the view's nodes.
    pub fn new(view: &ViewRef<'v>, now: Millis, cluster_gpus: u64) -> Ranker<'v> {
        let policy = &view.rest.policy.policy;
        let qos = share_of_highest(
            policy
                .all_qos()
                .into_iter()
                .map(|(name, q)| (name, q.priority)),
        );
        let partitions = share_of_highest(
            policy
                .all_partitions()
                .into_iter()
                .map(|(name, p)| (name, p.priority)),
        );
        Ranker {
            weights: &policy.weights,
            fs: super::fairshare::compute(&view.rest.policy, now),
            cluster_gpus,
            qos,
            partitions,
            default_partition: policy.default_partition(),
        }
    }

    /// The job's factors at `now`.
    pub fn factors(&self, job: &PendingJob, now: Millis) -> Factors {
        self.factors_with(job, now, self.by_name(job))
    }

    /// The factors that depend only on the job's account, QoS and partition
    /// names (jobs sharing those share them: a pass works them out once).
    pub(super) fn by_name(&self, job: &PendingJob) -> ByName {
        let part_name = if job.partition.is_empty() {
            self.default_partition.as_str()
        } else {
            job.partition.as_str()
        };
        ByName {
            fairshare: self.fs.of(&job.account),
            qos: self.qos.get(qos_of(&job.qos)).copied().unwrap_or(0.0),
            partition: self.partitions.get(part_name).copied().unwrap_or(0.0),
        }
    }

    /// [`Ranker::factors`] given the job's [`Ranker::by_name`].
    pub(super) fn factors_with(&self, job: &PendingJob, now: Millis, names: ByName) -> Factors {
        let ByName {
            fairshare,
            qos,
            partition,
        } = names;
        let w = self.weights;
        let age = if w.max_age_secs == 0 {
            1.0
        } else {
            (now.saturating_sub(job.submit_time) as f64 / (w.max_age_secs as f64 * 1000.0)).min(1.0)
        };
        let job_gpus = match job.total_gpus {
            Some(n) => u64::from(n),
            None => u64::from(job.nodes) * u64::from(job.gpus_per_node),
        };
        let job_size = if self.cluster_gpus == 0 {
            0.0
        } else {
            (job_gpus as f64 / self.cluster_gpus as f64).min(1.0)
        };
        let weighted = f64::from(w.age) * age
            + f64::from(w.fairshare) * fairshare
            + f64::from(w.job_size) * job_size
            + f64::from(w.qos) * qos
            + f64::from(w.partition) * partition;
        Factors {
            total: (weighted.round() as i64)
                .saturating_sub(i64::from(job.nice))
                .saturating_add(job.priority),
            age,
            fairshare,
            job_size,
            qos,
            partition,
            nice: job.nice,
        }
    }
}
