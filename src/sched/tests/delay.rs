//! The backfill invariant every scenario and simulation checks: no job a
//! plan starts delays the reservation of a job ahead of it.

use super::*;

/// No job the plan starts delays a reservation of a job ahead of it: it ends
/// (by its time limit, from `now`) before the reservation starts, or shares
/// no GPU with it and leaves room for both on every shared node.
pub fn assert_no_delay(view: &ClusterView, plan: &Plan, now: Millis) {
    let job = |id: JobId| view.pending.iter().find(|j| j.id == id).expect("pending");
    let rank = queue_rank(view, now);
    for alloc in &plan.allocations {
        let started = job(alloc.job);
        let end = started
            .time_limit_secs
            .map(|s| now.saturating_add(s * 1000));
        for r in &plan.reservations {
            if rank[&r.job] > rank[&started.id] {
                continue;
            }
            if end.is_some_and(|e| e <= r.start) {
                continue;
            }
            for na in &alloc.nodes {
                for rn in r.allocation.nodes.iter().filter(|rn| rn.node == na.node) {
                    let shared: Vec<_> = na.gpus.iter().filter(|g| rn.gpus.contains(g)).collect();
                    assert!(
                        shared.is_empty(),
                        "job {} takes GPUs {shared:?} of {} reserved for job {} from {}",
                        alloc.job,
                        na.node,
                        r.job,
                        r.start
                    );
                    let node = view.nodes.iter().find(|n| n.name == na.node).expect("node");
                    assert!(
                        u64::from(na.cpu_count) + u64::from(rn.cpu_count)
                            <= u64::from(node.inventory.cpus),
                        "job {} and reservation {} overfill the CPUs of {}",
                        alloc.job,
                        r.job,
                        na.node
                    );
                }
            }
        }
    }
}
