//! Node lifecycle in the replicated state: registration (a name belongs to
//! the certificate that first registered it), drain and resume, a node
//! going down, and GPU health reports. A node that fails, or drains with
//! `requeue_now`, or loses a GPU, takes the ranks it held with it: those
//! jobs end or are requeued as `runs` says.

use super::{CommandResult, Dirty, DrainSource, NodeRecord, NodeStatus, Rejection, State};
use crate::model::{JobId, JobState, Millis, NodeInventory, TaskEnd};

impl State {
    pub(super) fn register_node(
        &mut self,
        inventory: &NodeInventory,
        addr: &str,
        preflight: bool,
        cert_sha256: &str,
        now: Millis,
        dirty: &mut Dirty,
    ) -> Result<CommandResult, Rejection> {
        let name = inventory.name.clone();
        // A name belongs to the certificate that first registered it, until
        // an admin allows a replacement: another certificate for the name
        // (a second join with an agent token) cannot take the node over.
        if let Some(known) = self.nodes.get(&name) {
            let other = !known.cert_sha256.is_empty()
                && !cert_sha256.is_empty()
                && known.cert_sha256 != cert_sha256;
            if other && !known.replace_allowed {
                return Err(Rejection::NodeCertMismatch { node: name });
            }
        }
        let cert_sha256 = match self.nodes.get(&name) {
            // An older agent's registration carries none: keep what is known.
            Some(known) if cert_sha256.is_empty() => known.cert_sha256.clone(),
            _ => cert_sha256.to_string(),
        };
        let status = match self.nodes.get(&name).map(|n| &n.status) {
            // A drain survives re-registration (an admin's, a GPU fault's).
            Some(s @ NodeStatus::Drained { .. }) => s.clone(),
            None if preflight => NodeStatus::Drained {
                reason: "preflight: waiting for the first health check to pass".into(),
                by: DrainSource::HealthCheck,
                user: None,
                since: now,
            },
            _ => NodeStatus::Up,
        };
        let status = self.powered_up(&name, status, now);
        if self.power.contains_key(&name) {
            dirty.meta = true;
        }
        let mig_target = self.nodes.get(&name).and_then(|n| n.mig_target.clone());
        let gpu_shared = self.nodes.get(&name).and_then(|n| n.gpu_shared);
        let mut inventory = inventory.clone();
        inventory.gpus = super::share::shared_view(gpu_shared, &inventory.gpus);
        self.nodes.insert(
            name.clone(),
            NodeRecord {
                inventory,
                addr: addr.to_string(),
                status,
                registered_at: now,
                cert_sha256,
                replace_allowed: false,
                mig_target,
                gpu_shared,
            },
        );
        self.mig_reached(&name, dirty);
        self.group_layout(&name, now, dirty);
        dirty.nodes.insert(name);
        Ok(CommandResult::NodeRegistered)
    }

    /// Marks every unfinished rank of active jobs on `node` as lost and ends
    /// (or requeues) those jobs. With `only_gpus`, only jobs holding one of
    /// those GPUs there are affected.
    pub(super) fn lose_ranks_on(
        &mut self,
        node: &str,
        only_gpus: Option<&[u32]>,
        reason: &str,
        now: Millis,
        dirty: &mut Dirty,
    ) {
        let hit: Vec<JobId> = self
            .jobs
            .values()
            .filter(|j| j.state.is_active())
            .filter(|j| {
                j.run.as_ref().is_some_and(|r| {
                    r.allocation.nodes.iter().any(|n| {
                        n.node == node
                            && only_gpus.is_none_or(|g| n.gpus.iter().any(|x| g.contains(x)))
                    })
                })
            })
            .map(|j| j.id)
            .collect();
        for id in hit {
            let Some(job) = self.jobs.get_mut(&id) else {
                continue;
            };
            let per_node = job.spec.ntasks_per_node.max(1);
            let total = job.spec.launched_tasks() as u32;
            let Some(run) = job.run.as_mut() else {
                continue;
            };
            Self::lose_step_tasks(run, node, reason, now);
            for rank in 0..total {
                if run.node_of_rank(rank, per_node) == Some(node) && !run.ended.contains_key(&rank)
                {
                    run.ended.insert(
                        rank,
                        TaskEnd::Lost {
                            reason: reason.to_string(),
                        },
                    );
                }
            }
            dirty.jobs.insert(id);
            let why = format!("node {node} failed: {reason}");
            if !self.begin_ending(id, JobState::NodeFail, why, now, dirty) {
                self.finish_if_all_ended(id, now, dirty);
            }
        }
    }

    /// A node stopped answering: it is down, its tasks are lost.
    pub(super) fn node_down(
        &mut self,
        node: &str,
        reason: &str,
        now: Millis,
        dirty: &mut Dirty,
    ) -> CommandResult {
        let Some(rec) = self.nodes.get_mut(node) else {
            return CommandResult::Rejected(Rejection::NoSuchNode(node.to_string()));
        };
        rec.status = NodeStatus::Down {
            reason: reason.to_string(),
            since: now,
        };
        dirty.nodes.insert(node.to_string());
        self.lose_ranks_on(node, None, reason, now, dirty);
        CommandResult::NodeUpdated
    }

    /// Drains a node (no new work; `requeue_now` also requeues its jobs) or
    /// resumes it. A health check may only resume a drain it made itself.
    pub(super) fn set_drain(
        &mut self,
        node: &str,
        drain: Option<(&str, Option<&str>)>,
        by: DrainSource,
        requeue_now: bool,
        now: Millis,
        dirty: &mut Dirty,
    ) -> CommandResult {
        let Some(rec) = self.nodes.get_mut(node) else {
            return CommandResult::Rejected(Rejection::NoSuchNode(node.to_string()));
        };
        match drain {
            Some((reason, user)) => {
                if matches!(rec.status, NodeStatus::Down { .. }) {
                    return CommandResult::Rejected(Rejection::NodeIsDown(node.to_string()));
                }
                rec.status = NodeStatus::Drained {
                    reason: reason.to_string(),
                    by,
                    user: user.map(str::to_string),
                    since: now,
                };
                dirty.nodes.insert(node.to_string());
                if requeue_now {
                    let why = format!("drained now: {reason}");
                    self.lose_ranks_on(node, None, &why, now, dirty);
                }
            }
            None => match &rec.status {
                NodeStatus::Drained { by: was, .. } if *was == by || by == DrainSource::Admin => {
                    rec.status = NodeStatus::Up;
                    // A resumed node keeps the GPUs it has: a pending MIG
                    // repartition is called off.
                    rec.mig_target = None;
                    dirty.nodes.insert(node.to_string());
                }
                NodeStatus::Drained { .. } | NodeStatus::Up => {}
                NodeStatus::Down { .. } => {
                    return CommandResult::Rejected(Rejection::NodeIsDown(node.to_string()))
                }
            },
        }
        CommandResult::NodeUpdated
    }

    /// An agent reported its GPUs' health. A GPU that turned unhealthy drains
    /// the node with the fault as the reason, and the job on it is failed or
    /// requeued per its policy.
    pub(super) fn gpu_health(
        &mut self,
        node: &str,
        gpus: &[crate::model::GpuInfo],
        now: Millis,
        dirty: &mut Dirty,
    ) -> CommandResult {
        let Some(rec) = self.nodes.get_mut(node) else {
            return CommandResult::Rejected(Rejection::NoSuchNode(node.to_string()));
        };
        let gpus = &super::share::shared_view(rec.gpu_shared, gpus);
        let newly_bad: Vec<&crate::model::GpuInfo> = gpus
            .iter()
            .filter(|g| !g.healthy)
            .filter(|g| {
                rec.inventory
                    .gpus
                    .iter()
                    .any(|old| old.index == g.index && old.healthy)
            })
            .collect();
        let reason = newly_bad
            .iter()
            .map(|g| {
                format!(
                    "GPU {} ({}) unhealthy: {}",
                    g.index,
                    g.uuid,
                    g.fault.as_deref().unwrap_or("fault")
                )
            })
            .collect::<Vec<_>>()
            .join("; ");
        let bad: Vec<u32> = newly_bad.iter().map(|g| g.index).collect();
        rec.inventory.gpus = gpus.to_vec();
        dirty.nodes.insert(node.to_string());
        if !bad.is_empty() {
            if !matches!(rec.status, NodeStatus::Down { .. }) {
                rec.status = NodeStatus::Drained {
                    reason: reason.clone(),
                    by: DrainSource::Gpu,
                    user: None,
                    since: now,
                };
            }
            self.lose_ranks_on(node, Some(&bad), &reason, now, dirty);
        }
        self.mig_reached(node, dirty);
        CommandResult::NodeUpdated
    }
}
