//! Read views of the state for the scheduler and for dispatch: node capacity
//! and usage, pending jobs, and the tasks each node should be running.

use super::{NodeStatus, State};
use crate::model::{Allocation, Job, JobState};
use crate::sched::{ClusterView, NodeState, NodeView, PendingJob, Usage};

/// Adds an allocation's resources to the usage of the nodes it names.
pub fn add_usage(views: &mut [NodeView], alloc: &Allocation) {
    for na in &alloc.nodes {
        if let Some(v) = views.iter_mut().find(|v| v.name == na.node) {
            v.used.charge(na);
        }
    }
}

impl State {
    /// Every node with what active jobs use on it.
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
        for job in self.jobs.values().filter(|j| j.state.is_active()) {
            if let Some(run) = &job.run {
                add_usage(&mut views, &run.allocation);
            }
        }
        views
    }

    /// What the scheduler needs for one pass.
    pub fn cluster_view(&self) -> ClusterView {
        ClusterView {
            nodes: self.node_views(),
            pending: self
                .jobs
                .values()
                .filter(|j| j.state == JobState::Pending)
                .map(PendingJob::from)
                .collect(),
            policy: self.policy_view(),
        }
    }

    /// The jobs with ranks that `node` should be running now, with the node's
    /// rank in each. Only RUNNING jobs: ranks of a COMPLETING job are stopped.
    pub fn desired_on(&self, node: &str) -> Vec<(&Job, u32)> {
        self.jobs
            .values()
            .filter(|j| j.state == JobState::Running)
            .filter_map(|j| {
                let run = j.run.as_ref()?;
                let rank = run.allocation.nodes.iter().position(|n| n.node == node)?;
                Some((j, rank as u32))
            })
            .collect()
    }
}
