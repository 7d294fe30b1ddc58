//! Time-sliced GPU sharing in the replicated state (`gpuq node share`; see
//! `model::share`). The node record keeps the slot count; the inventory
//! holds the slots, and each report of the node's GPUs (registration, GPU
//! health) is shared the same way, so slots survive an agent restart.
//!
//! Sharing changes which entries the node's GPUs are, so it is refused
//! while a job holds GPUs there (drain the node and let them end first),
//! and on MIG-partitioned GPUs (whole GPUs only): nothing half-applied.

use super::{CommandResult, Dirty, Rejection, State};
use crate::model::share;
use crate::model::GpuInfo;

/// `gpus` as the agent reported them, shared into `slots` (or unshared).
pub(super) fn shared_view(slots: Option<u8>, gpus: &[GpuInfo]) -> Vec<GpuInfo> {
    match slots {
        Some(n) => share::expand(&share::physical(gpus), n),
        None => gpus.to_vec(),
    }
}

/// What the GPU entries of `alloc` count as, in thousandths of a GPU: a
/// slot of a GPU shared N ways 1/N, any other entry a whole GPU.
pub(super) fn milli_gpus(
    nodes: &std::collections::BTreeMap<String, super::NodeRecord>,
    alloc: &crate::model::Allocation,
) -> u64 {
    alloc
        .nodes
        .iter()
        .flat_map(|na| {
            let inv = nodes.get(&na.node).map(|n| &n.inventory);
            na.gpus.iter().map(move |&i| {
                let entry = inv.and_then(|inv| inv.gpus.iter().find(|g| g.index == i));
                1000 / u64::from(entry.and_then(share::slots_of).unwrap_or(1))
            })
        })
        .sum()
}

impl State {
    /// An admin shares `node`'s whole GPUs into `slots` (`None`: stops).
    pub(super) fn set_share(
        &mut self,
        node: &str,
        slots: Option<u8>,
        dirty: &mut Dirty,
    ) -> Result<CommandResult, Rejection> {
        let rec = self
            .nodes
            .get(node)
            .ok_or_else(|| Rejection::NoSuchNode(node.to_string()))?;
        if let Some(n) = slots {
            share::check_slots(u32::from(n)).map_err(Rejection::Mig)?;
            if rec.inventory.gpus.is_empty() {
                return Err(Rejection::Mig(format!("node {node} has no GPUs to share")));
            }
            let mig = rec
                .inventory
                .gpus
                .iter()
                .any(|g| g.mig.as_ref().is_some_and(|m| m.slots == 0));
            if mig || rec.mig_target.is_some() {
                return Err(Rejection::Mig(format!(
                    "node {node}'s GPUs are MIG-partitioned ({}); only whole GPUs are shared: \
                     run `gpuq node mig set {node} --layout none` first",
                    rec.inventory.slice_summary()
                )));
            }
        }
        let busy: Vec<String> = self
            .jobs_on(node)
            .filter(|j| j.state.is_active())
            .filter(|j| {
                j.run.as_ref().is_some_and(|r| {
                    r.allocation
                        .nodes
                        .iter()
                        .any(|n| n.node == node && !n.gpus.is_empty())
                })
            })
            .map(|j| j.id.to_string())
            .collect();
        if !busy.is_empty() {
            return Err(Rejection::Mig(format!(
                "node {node} has jobs on its GPUs ({}); drain it (`gpuq node drain {node}`) \
                 and let them end, then share it",
                busy.join(", ")
            )));
        }
        let rec = self.nodes.get_mut(node).expect("checked above");
        let gpus = match slots {
            Some(_) => shared_view(slots, &rec.inventory.gpus),
            None => share::physical(&rec.inventory.gpus),
        };
        if rec.gpu_shared == slots && gpus == rec.inventory.gpus {
            return Ok(CommandResult::NodeUpdated);
        }
        rec.inventory.gpus = gpus;
        rec.gpu_shared = slots;
        dirty.nodes.insert(node.to_string());
        Ok(CommandResult::NodeUpdated)
    }
}
