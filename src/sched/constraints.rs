//! Which nodes a job's placement allows (`--gpu-type`, `--constraint`,
//! `--nodelist`, `--exclude`), and the sentence a user gets when none does.

use crate::model::{NodeInventory, Placement};

/// Whether every GPU of the node has `gpu_type` in its model name, in any
/// case; a node without GPUs has no type.
pub(super) fn has_gpu_type(inventory: &NodeInventory, gpu_type: &str) -> bool {
    let want = gpu_type.to_lowercase();
    !inventory.gpus.is_empty()
        && inventory
            .gpus
            .iter()
            .all(|g| g.model.to_lowercase().contains(&want))
}

/// Whether the node `name` may run a job with placement `p`.
pub(super) fn allows(name: &str, inventory: &NodeInventory, p: &Placement) -> bool {
    mismatch(name, inventory, p).is_none()
}

/// Why the node `name` may not run a job with placement `p`, completing
/// "node NAME ...", or `None` when it may.
pub(super) fn mismatch(name: &str, inventory: &NodeInventory, p: &Placement) -> Option<String> {
    if !p.nodelist.is_empty() && !p.nodelist.iter().any(|n| n == name) {
        return Some("is not in the job's --nodelist".into());
    }
    if p.exclude.iter().any(|n| n == name) {
        return Some("is in the job's --exclude".into());
    }
    if let Some(t) = &p.gpu_type {
        if !has_gpu_type(inventory, t) {
            return Some(format!("has no GPUs of type {t}"));
        }
    }
    if let Some(profile) = &p.gpu_slice {
        if inventory.gpus_of(Some(profile)).next().is_none() {
            if crate::model::share::is_shared(profile) {
                return Some("has no shared GPUs".into());
            }
            return Some(format!("has no MIG slices of profile {profile}"));
        }
    }
    if let Some(f) = p
        .features
        .iter()
        .find(|f| !inventory.features.iter().any(|g| g == *f))
    {
        return Some(format!("lacks feature {f}"));
    }
    None
}

/// Which nodes a message speaks of.
#[derive(Clone, Copy)]
pub(super) enum Among {
    /// Every registered node (at submit).
    Cluster,
    /// The up nodes (in a pass).
    Up,
}

/// The sentence for a job whose placement `p` no node of `nodes` allows:
/// the first thing missing from all of them, else the whole request.
pub(super) fn none_matches(
    nodes: &[(&str, &NodeInventory)],
    p: &Placement,
    among: Among,
) -> String {
    let (no_node, they_have) = match among {
        Among::Cluster => ("no node", "the cluster has"),
        Among::Up => ("no up node", "the up nodes have"),
    };
    if let Some(t) = &p.gpu_type {
        if !nodes.iter().any(|(_, inv)| has_gpu_type(inv, t)) {
            let mut models: Vec<&str> = nodes
                .iter()
                .flat_map(|(_, inv)| inv.gpus.iter().map(|g| g.model.as_str()))
                .collect();
            models.sort_unstable();
            models.dedup();
            return if models.is_empty() {
                format!("{no_node} has GPUs of type {t}; {they_have} no GPUs")
            } else {
                format!(
                    "{no_node} has GPUs of type {t}; {they_have}: {}",
                    models.join(", ")
                )
            };
        }
    }
    if let Some(profile) = &p.gpu_slice {
        if !nodes
            .iter()
            .any(|(_, inv)| inv.gpus_of(Some(profile)).next().is_some())
        {
            let mut have: Vec<&str> = nodes
                .iter()
                .flat_map(|(_, inv)| inv.gpus.iter().filter_map(|g| g.slice_profile()))
                .collect();
            have.sort_unstable();
            have.dedup();
            if crate::model::share::is_shared(profile) {
                return format!(
                    "{no_node} has shared GPUs (ask for whole GPUs or MIG slices, or an admin \
                     shares some with `gpuq node share NODE --slots N`)"
                );
            }
            return if have.is_empty() {
                format!(
                    "{no_node} has MIG slices of profile {profile}; no GPU of {} is \
                     partitioned (ask for whole GPUs, or an admin partitions some)",
                    match among {
                        Among::Cluster => "the cluster",
                        Among::Up => "the up nodes",
                    }
                )
            } else {
                format!(
                    "{no_node} has MIG slices of profile {profile}; {they_have}: {}",
                    have.join(", ")
                )
            };
        }
    }
    let missing: Vec<&str> = p
        .features
        .iter()
        .filter(|f| {
            !nodes
                .iter()
                .any(|(_, inv)| inv.features.iter().any(|g| g == *f))
        })
        .map(String::as_str)
        .collect();
    match missing.as_slice() {
        [] => {}
        [one] => return format!("{no_node} has feature {one}"),
        many => return format!("{no_node} has features {}", many.join(", ")),
    }
    format!("{no_node} matches all of {}", describe(p))
}

/// `--nodelist` names that are not among `nodes`, in the order given.
pub(super) fn unknown_names<'p>(
    nodes: &[(&str, &NodeInventory)],
    p: &'p Placement,
) -> Vec<&'p str> {
    p.nodelist
        .iter()
        .filter(|n| !nodes.iter().any(|(name, _)| name == n))
        .map(String::as_str)
        .collect()
}

/// The placement as the flags that asked for it.
pub(super) fn describe(p: &Placement) -> String {
    let names = |list: &[String]| {
        if list.len() <= 6 {
            list.join(",")
        } else {
            format!("{},... ({} nodes)", list[..3].join(","), list.len())
        }
    };
    let mut parts = Vec::new();
    if let Some(t) = &p.gpu_type {
        parts.push(format!("--gpu-type {t}"));
    }
    if let Some(profile) = &p.gpu_slice {
        parts.push(format!("MIG profile {profile}"));
    }
    if !p.features.is_empty() {
        parts.push(format!("--constraint {}", p.features.join(",")));
    }
    if !p.nodelist.is_empty() {
        parts.push(format!("--nodelist {}", names(&p.nodelist)));
    }
    if !p.exclude.is_empty() {
        parts.push(format!("--exclude {}", names(&p.exclude)));
    }
    parts.join(", ")
}
