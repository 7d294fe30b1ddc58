//! `gpuq show`'s per-rank placement: a job's allocation joined with the node
//! inventories (GPU UUIDs, topology), for the text table and `--json`.

use crate::model::{format_cpulist, Job};
use crate::net::proto::{GpuSlot, RankPlacement};
use crate::state::State;

/// Where `job`'s current (or last) attempt runs, one entry per node rank;
/// empty for a job that never started.
pub fn placement(state: &State, job: &Job) -> Vec<RankPlacement> {
    let Some(run) = &job.run else {
        return Vec::new();
    };
    let per_node = job.spec.ntasks_per_node.max(1);
    run.allocation
        .nodes
        .iter()
        .enumerate()
        .map(|(i, na)| {
            let inventory = state.nodes.get(&na.node).map(|n| &n.inventory);
            let uuid = |index: u32| {
                inventory
                    .and_then(|inv| inv.gpus.iter().find(|g| g.index == index))
                    .map(|g| g.uuid.clone())
                    .unwrap_or_default()
            };
            let node_rank = i as u32;
            RankPlacement {
                node_rank,
                first_rank: node_rank * per_node,
                last_rank: node_rank * per_node + per_node - 1,
                node: na.node.clone(),
                gpus: na
                    .gpus
                    .iter()
                    .map(|&index| GpuSlot {
                        index,
                        uuid: uuid(index),
                    })
                    .collect(),
                cpus: format_cpulist(&na.cpus),
                cpu_count: na.cpu_count,
                memory_mb: na.memory_mb,
                topology: inventory
                    .map(|inv| inv.topology.clone())
                    .unwrap_or_default(),
            }
        })
        .collect()
}
