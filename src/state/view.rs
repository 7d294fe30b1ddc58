//! Read views of the state for the scheduler and for dispatch: node capacity
//! and usage, pending jobs, and the tasks each node should be running. Each
//! reads the active-job indexes (`index`), so its cost follows what is
//! pending or running, not every job the state holds.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use super::{NodeStatus, State};
use crate::model::{Allocation, DependencyKind, Job, JobId, JobState};
use crate::sched::{
    ArrayThrottle, BackfillConfig, ClusterView, NodeState, NodeView, PendingJob, RunningJob, Usage,
};

/// Adds an allocation's resources to the usage of the nodes it names.
pub fn add_usage(views: &mut [NodeView], alloc: &Allocation) {
    for (rank, na) in alloc.nodes.iter().enumerate() {
        if let Some(v) = views.iter_mut().find(|v| v.name == na.node) {
            v.used.charge(na);
            if rank == 0 {
                v.used.master_ports += 1;
            }
        }
    }
}

impl State {
    /// Every node with what active jobs use on it, in name order.
    pub fn node_views(&self) -> Vec<NodeView> {
        let mut views: Vec<NodeView> = self
            .nodes
            .values()
            .map(|n| NodeView {
                name: n.inventory.name.clone(),
                inventory: n.inventory.clone(),
                state: match n.status {
                    NodeStatus::Up => NodeState::Up,
                    NodeStatus::Drained { .. } => NodeState::Drained,
                    NodeStatus::Down { .. } => NodeState::Down,
                },
                used: Usage::default(),
            })
            .collect();
        let at: HashMap<&str, usize> = self
            .nodes
            .values()
            .enumerate()
            .map(|(i, n)| (n.inventory.name.as_str(), i))
            .collect();
        for id in self.index.holding() {
            let Some(run) = self.jobs.get(&id).and_then(|j| j.run.as_ref()) else {
                continue;
            };
            for (rank, na) in run.allocation.nodes.iter().enumerate() {
                if let Some(&i) = at.get(na.node.as_str()) {
                    views[i].used.charge(na);
                    // Rank 0 holds one of the node's MASTER_PORTs.
                    if rank == 0 {
                        views[i].used.master_ports += 1;
                    }
                }
            }
        }
        views
    }

    /// What the scheduler needs for one pass: nodes, pending jobs with what
    /// keeps them back outside the scheduler (holds, dependencies, array
    /// throttles, singletons), and running jobs with their expected ends.
    pub fn cluster_view(&self) -> ClusterView {
        let backfill = BackfillConfig::default();
        let mut running = Vec::new();
        let mut names: BTreeSet<(&str, &str)> = BTreeSet::new();
        let mut array_running: BTreeMap<JobId, u32> = BTreeMap::new();
        // Jobs holding resources: RUNNING or COMPLETING.
        for job in self.index.holding().filter_map(|id| self.jobs.get(&id)) {
            names.insert((job.user.as_str(), job.spec.name.as_str()));
            if let Some(a) = job.array {
                *array_running.entry(a.array_job).or_default() += 1;
            }
            if let (Some(run), Some(start)) = (&job.run, job.start_time) {
                let limit = job
                    .spec
                    .time_limit_secs
                    .unwrap_or(backfill.default_time_limit_secs);
                running.push(RunningJob {
                    id: job.id,
                    allocation: run.allocation.clone(),
                    expected_end: Some(start.saturating_add(limit.saturating_mul(1000))),
                });
            }
        }
        let pending = self
            .index
            .pending
            .iter()
            .filter_map(|id| self.jobs.get(id))
            .map(|j| {
                let mut p = PendingJob::from(j);
                p.blocked = self.blocked_reason(j, &names);
                p.array_throttle = j.array.and_then(|a| {
                    let limit = a.throttle?;
                    let used = array_running.get(&a.array_job).copied().unwrap_or(0);
                    Some(ArrayThrottle {
                        array: a.array_job,
                        slots: limit.saturating_sub(used),
                    })
                });
                p.singleton = j
                    .spec
                    .queue
                    .dependency
                    .iter()
                    .any(|d| d.kind == DependencyKind::Singleton)
                    .then(|| j.spec.name.clone());
                p
            })
            .collect();
        ClusterView {
            nodes: self.node_views(),
            pending,
            running,
            backfill,
            master_ports: Some(self.master_ports().len()),
            policy: self.policy_view(),
        }
    }

    /// The jobs with ranks that `node` should be running now, with the node's
    /// rank in each. Only RUNNING jobs: ranks of a COMPLETING job are stopped.
    pub fn desired_on(&self, node: &str) -> Vec<(&Job, u32)> {
        self.jobs_on(node)
            .filter(|j| j.state == JobState::Running)
            .filter_map(|j| {
                let run = j.run.as_ref()?;
                let rank = run.allocation.nodes.iter().position(|n| n.node == node)?;
                Some((j, rank as u32))
            })
            .collect()
    }
}
