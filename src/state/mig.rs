//! MIG repartitioning in the replicated state (`gpuq node mig set`, the
//! role of the GPU operator's mig-manager). The state holds the layout an
//! admin asked for (`NodeRecord::mig_target`) and keeps the node drained
//! (`DrainSource::Mig`) while it has one: no job lands on GPUs about to
//! change. The leader hands the layout to the node's agent once nothing
//! runs there; the agent applies it and reports its GPUs (`GpuHealth`).
//! When they show the layout, the target is cleared and the node resumes;
//! when the agent says it failed (`MigFailed`), the target is cleared and
//! the node stays drained with the failure as its reason. Either way a
//! node is never schedulable half-configured.

use super::{CommandResult, Dirty, DrainSource, NodeStatus, Rejection, State};
use crate::model::mig::{parse_target, NO_MIG};
use crate::model::{MigLayout, Millis, NodeInventory};

/// Whether every physical GPU of `inv` is partitioned as `target` (`None`:
/// every GPU whole).
pub fn has_layout(inv: &NodeInventory, target: Option<&MigLayout>) -> bool {
    let Some(layout) = target else {
        // Time-shared slots are whole GPUs as far as MIG goes.
        return !inv
            .gpus
            .iter()
            .any(|g| g.mig.as_ref().is_some_and(|m| m.slots == 0));
    };
    let mut want: Vec<&str> = layout.0.iter().map(|p| p.name).collect();
    want.sort_unstable();
    let physical = inv.gpu_links.len() as u32;
    (0..physical).all(|gpu| {
        let mut have: Vec<&str> = inv
            .gpus
            .iter()
            .filter(|g| g.mig.as_ref().is_some_and(|m| m.parent == gpu))
            .filter_map(|g| g.slice_profile())
            .collect();
        have.sort_unstable();
        have == want
    })
}

impl State {
    /// An admin asked for `layout` on `node`: drain it for the change
    /// (requeueing its jobs with `requeue_now`) and record the target.
    pub(super) fn set_mig(
        &mut self,
        node: &str,
        layout: &str,
        user: Option<&str>,
        requeue_now: bool,
        now: Millis,
        dirty: &mut Dirty,
    ) -> Result<CommandResult, Rejection> {
        let rec = self
            .nodes
            .get_mut(node)
            .ok_or_else(|| Rejection::NoSuchNode(node.to_string()))?;
        let target = parse_target(layout).map_err(|e| Rejection::Mig(e.to_string()))?;
        if rec.gpu_shared.is_some()
            || rec
                .inventory
                .gpus
                .iter()
                .any(|g| crate::model::share::slots_of(g).is_some())
        {
            return Err(Rejection::Mig(format!(
                "node {node}'s GPUs are time-shared ({}); stop sharing first: `gpuq node share \
                 {node} --off`",
                rec.inventory.slice_summary()
            )));
        }
        if let Some(layout) = &target {
            if rec.inventory.gpus.is_empty() {
                return Err(Rejection::Mig(format!(
                    "node {node} has no GPUs to partition"
                )));
            }
            for g in &rec.inventory.gpus {
                let Some(model) = crate::model::mig::model_of(&g.model) else {
                    return Err(Rejection::Mig(format!(
                        "node {node}'s GPU {} is a {}, which cannot hold MIG instances (MIG \
                         runs on H200, H100, A100 and A30 GPUs); time-share it with `gpuq node \
                         share {node} --slots N` instead",
                        g.physical_index(),
                        g.model
                    )));
                };
                if let Err(why) = model.check(layout) {
                    return Err(Rejection::Mig(format!(
                        "node {node}'s GPU {} is a {}: {why}",
                        g.physical_index(),
                        g.model
                    )));
                }
            }
        }
        let text = target
            .as_ref()
            .map_or(NO_MIG.to_string(), MigLayout::to_text);
        if has_layout(&rec.inventory, target.as_ref()) && rec.mig_target.is_none() {
            return Ok(CommandResult::NodeUpdated);
        }
        let reason = format!("MIG repartition to {text}: waiting for its jobs to end");
        if !matches!(rec.status, NodeStatus::Down { .. }) {
            rec.status = NodeStatus::Drained {
                reason: reason.clone(),
                by: DrainSource::Mig,
                user: user.map(str::to_string),
                since: now,
            };
        }
        rec.mig_target = Some(text);
        dirty.nodes.insert(node.to_string());
        if requeue_now {
            let why = format!("drained now: {reason}");
            self.lose_ranks_on(node, None, &why, now, dirty);
        }
        Ok(CommandResult::NodeUpdated)
    }

    /// The agent could not apply the layout: the target is dropped and the
    /// node stays drained, saying why.
    pub(super) fn mig_failed(
        &mut self,
        node: &str,
        error: &str,
        now: Millis,
        dirty: &mut Dirty,
    ) -> Result<CommandResult, Rejection> {
        let rec = self
            .nodes
            .get_mut(node)
            .ok_or_else(|| Rejection::NoSuchNode(node.to_string()))?;
        let Some(target) = rec.mig_target.take() else {
            return Ok(CommandResult::Noop);
        };
        rec.status = NodeStatus::Drained {
            reason: format!(
                "MIG repartition to {target} failed: {error}; fix the GPU, then run \
                 `gpuq node mig set` again or `gpuq node resume`"
            ),
            by: DrainSource::Mig,
            user: None,
            since: now,
        };
        dirty.nodes.insert(node.to_string());
        Ok(CommandResult::NodeUpdated)
    }

    /// After the node's GPUs were reported: a target they now show is done,
    /// and the node resumes (unless something else drained it meanwhile).
    pub(super) fn mig_reached(&mut self, node: &str, dirty: &mut Dirty) {
        let Some(rec) = self.nodes.get_mut(node) else {
            return;
        };
        let Some(target) = rec.mig_target.as_deref() else {
            return;
        };
        let Ok(layout) = parse_target(target) else {
            return;
        };
        if !has_layout(&rec.inventory, layout.as_ref()) {
            return;
        }
        rec.mig_target = None;
        if matches!(
            rec.status,
            NodeStatus::Drained {
                by: DrainSource::Mig,
                ..
            }
        ) && rec.inventory.gpus.iter().all(|g| g.healthy)
        {
            rec.status = NodeStatus::Up;
        }
        dirty.nodes.insert(node.to_string());
    }

    /// A node of a group with a MIG layout (`gpuq admin nodegroup
    /// --mig-layout`) registered: when its GPUs are not in that layout, it
    /// is repartitioned as `gpuq node mig set` would (drained until its
    /// agent reports the layout). A layout its GPUs cannot hold leaves it
    /// drained, saying why. Only an up node is touched (not one an admin,
    /// a health check or a fault drained).
    pub(super) fn group_layout(&mut self, node: &str, now: Millis, dirty: &mut Dirty) {
        let Some((group, layout)) = self
            .policy
            .node_groups
            .values()
            .find(|g| g.owns(node))
            .and_then(|g| Some((g.name.clone(), g.mig_layout.clone()?)))
        else {
            return;
        };
        let Some(rec) = self.nodes.get(node) else {
            return;
        };
        if rec.mig_target.is_some() || !matches!(rec.status, NodeStatus::Up) {
            return;
        }
        let Ok(target) = parse_target(&layout) else {
            return;
        };
        if has_layout(&rec.inventory, target.as_ref()) {
            return;
        }
        if let Err(why) = self.set_mig(node, &layout, None, false, now, dirty) {
            if let Some(rec) = self.nodes.get_mut(node) {
                rec.status = NodeStatus::Drained {
                    reason: format!(
                        "node group {group}'s MIG layout {layout} cannot be applied: {why}"
                    ),
                    by: DrainSource::Mig,
                    user: None,
                    since: now,
                };
            }
        }
    }

    /// The layout the leader should hand `node`'s agent now: its target,
    /// once no job holds anything there (cheap: the leader asks on every
    /// applied entry, for every agent).
    pub fn mig_to_apply(&self, node: &str) -> Option<&str> {
        let target = self.nodes.get(node)?.mig_target.as_deref()?;
        self.index.jobs_on(node).next().is_none().then_some(target)
    }
}
