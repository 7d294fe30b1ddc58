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
use super::view::{ClusterView, NodeState, PendingJob};
use crate::model::{JobId, Millis, PriorityFactors as Factors};

/// Priorities of every pending job at `now`.
pub fn priorities(view: &ClusterView, now: Millis) -> BTreeMap<JobId, Factors> {
    let fs = super::fairshare::compute(&view.policy, now);
    view.pending
        .iter()
        .map(|j| (j.id, factors(view, &fs, j, now)))
        .collect()
}

/// The pending jobs in queue order, with their priorities.
pub fn order(view: &ClusterView, now: Millis) -> Vec<(&PendingJob, i64)> {
    let prios = priorities(view, now);
    let mut queue: Vec<(&PendingJob, i64)> = view
        .pending
        .iter()
        .map(|j| (j, prios.get(&j.id).map_or(j.priority, |f| f.total)))
        .collect();
    // A restarting gang (requeued after a failure, `PendingJob::previous`)
    // goes ahead of others of its priority: back to the head of the queue.
    queue.sort_by_key(|(j, p)| {
        (
            std::cmp::Reverse(*p),
            j.previous.is_empty(),
            j.submit_time,
            j.id,
        )
    });
    queue
}

fn factors(view: &ClusterView, fs: &FairShare, job: &PendingJob, now: Millis) -> Factors {
    let policy = &view.policy.policy;
    let w = &policy.weights;
    let age = if w.max_age_secs == 0 {
        1.0
    } else {
        (now.saturating_sub(job.submit_time) as f64 / (w.max_age_secs as f64 * 1000.0)).min(1.0)
    };
    let cluster_gpus: u64 = view
        .nodes
        .iter()
        .filter(|n| n.state == NodeState::Up)
        .map(|n| n.capacity().gpus)
        .sum();
    let job_gpus = match job.total_gpus {
        Some(n) => u64::from(n),
        None => u64::from(job.nodes) * u64::from(job.gpus_per_node),
    };
    let job_size = if cluster_gpus == 0 {
        0.0
    } else {
        (job_gpus as f64 / cluster_gpus as f64).min(1.0)
    };
    let all_qos = policy.all_qos();
    let max_qos = all_qos.values().map(|q| q.priority).max().unwrap_or(0);
    let qos = match all_qos.get(qos_of(&job.qos)) {
        Some(q) if max_qos > 0 => f64::from(q.priority) / f64::from(max_qos),
        _ => 0.0,
    };
    let parts = policy.all_partitions();
    let max_part = parts.values().map(|p| p.priority).max().unwrap_or(0);
    let part_name = if job.partition.is_empty() {
        policy.default_partition()
    } else {
        job.partition.clone()
    };
    let partition = match parts.get(&part_name) {
        Some(p) if max_part > 0 => f64::from(p.priority) / f64::from(max_part),
        _ => 0.0,
    };
    let fairshare = fs.of(&job.account);
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
