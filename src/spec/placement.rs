//! The flags that say where a job may run and in what shape: `--gpus` (total
//! GPUs, the shape left to the scheduler), `--gpu-type`, `--constraint`,
//! `--nodelist`, `--exclude` and `--topology`; their value parsers and the
//! step of `build_spec` that turns them into the spec's shape and
//! [`Placement`].

use crate::model::{expand_hostlist, Placement, TopologyRequirement};

use super::{GpuRequest, SpecError, SubmitArgs};

/// Node names from a hostlist (`n[1-4],gpu7`), expanded.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct HostList(pub Vec<String>);

/// Node features, all required.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct Features(pub Vec<String>);

/// Parses `--nodelist` / `--exclude`.
pub fn parse_hostlist(input: &str) -> Result<HostList, String> {
    expand_hostlist(input)
        .map(HostList)
        .map_err(|e| e.to_string())
}

/// Parses `--nodes`: a count `N`, or an elastic range `MIN-MAX` (`MIN:MAX`
/// as torchrun's `--nnodes`). A count is the range `N-N`.
pub fn parse_nodes(input: &str) -> Result<crate::model::NodeRange, String> {
    let t = input.trim();
    if let Ok(n) = t.parse::<i64>() {
        return match u32::try_from(n) {
            Ok(n) if n >= 1 => Ok(crate::model::NodeRange::fixed(n)),
            _ => Err(format!(
                "{n} is not in 1..={}: give a node count, or a range MIN-MAX such as 2-4",
                u32::MAX
            )),
        };
    }
    if let Some(r) = crate::model::NodeRange::parse(t)? {
        return Ok(r);
    }
    Err(format!(
        "invalid digit in {input:?}: give a node count, or a range MIN-MAX such as 2-4"
    ))
}

/// Parses `--constraint`: features joined by `,` or `&`, all required.
/// Slurm's OR forms (`|`, `[...]`, counts with `*`) are refused by name.
pub fn parse_constraint(input: &str) -> Result<Features, String> {
    if let Some(op) = ['|', '[', ']', '*', '(', ')']
        .into_iter()
        .find(|c| input.contains(*c))
    {
        return Err(format!(
            "--constraint {input:?} uses {op:?}; only features that are all required are \
             supported: list them with commas, e.g. ib,nvme"
        ));
    }
    let mut features = Vec::new();
    for f in input.split([',', '&']).map(str::trim) {
        if f.is_empty() {
            return Err(format!(
                "--constraint {input:?} has an empty feature; list features with commas, e.g. ib,nvme"
            ));
        }
        if f.chars().any(|c| c.is_whitespace() || c.is_control()) {
            return Err(format!(
                "--constraint {input:?}: feature {f:?} has spaces; features are single words"
            ));
        }
        if !features.iter().any(|g| g == f) {
            features.push(f.to_string());
        }
    }
    Ok(Features(features))
}

/// Parses `--topology`: `leaf` or `spine`.
pub fn parse_topology(input: &str) -> Result<TopologyRequirement, String> {
    TopologyRequirement::parse(input).ok_or_else(|| {
        format!(
            "unknown topology level {input:?}; use leaf (all nodes under one leaf switch) \
             or spine (all under one spine)"
        )
    })
}

/// Parses `--gpu-type`: one word.
pub fn parse_gpu_type(input: &str) -> Result<String, String> {
    let t = input.trim();
    if t.is_empty() || t.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(format!(
            "GPU type {input:?} is not one word; use a part of the model name, e.g. h100"
        ));
    }
    Ok(t.to_string())
}

/// Parses `--gpus`: total GPUs, `N` or `TYPE:N`.
pub fn parse_gpus_total(input: &str) -> Result<GpuRequest, String> {
    match super::values::parse_gpus_per_node(input) {
        Ok(r) if r.count == 0 => Err(format!(
            "--gpus {input:?} asks for no GPUs; leave --gpus out for a CPU-only job"
        )),
        Ok(r) => Ok(r),
        Err(_) => Err(format!(
            "GPU count {input:?} is not a number; use N or TYPE:N GPUs in total, e.g. 16 or h100:16"
        )),
    }
}

/// The shape and placement the merged flags ask for: `(nodes, gpus per node,
/// total GPUs left to the scheduler, placement)`.
pub(super) fn resolve(
    merged: &SubmitArgs,
) -> Result<(u32, u32, Option<u32>, Placement), SpecError> {
    let invalid = |s: String| Err(SpecError::Invalid(s));
    let elastic = merged.nodes.filter(|r| r.min < r.max);
    let mut nodes = merged.nodes.map_or(1, |r| r.min);
    let mut gpus_per_node = merged.gpus().map_or(0, |g| g.count);
    let mut total_gpus = None;
    if let Some(total) = &merged.total_gpus {
        if let Some(r) = elastic {
            return invalid(format!(
                "--gpus {} with --nodes {r}: an elastic job's GPUs are per node; use \
                 --gpus-per-node with --nodes {r}",
                total.count
            ));
        }
        match merged.nodes.map(|r| r.min) {
            // Told the node count: the shape is fixed here.
            Some(n) if total.count % n != 0 => {
                return invalid(format!(
                    "--gpus {} does not split evenly over --nodes {n}; ask for a multiple of {n} \
                     GPUs, or leave --nodes out and let the scheduler choose the shape",
                    total.count
                ))
            }
            Some(n) => gpus_per_node = total.count / n,
            None => {
                nodes = 1;
                gpus_per_node = total.count;
                total_gpus = Some(total.count);
            }
        }
    }

    let typed = merged
        .gpus()
        .or(merged.total_gpus.as_ref())
        .and_then(|g| g.gpu_type.clone());
    // `1g.10gb:2` names a MIG profile, not a GPU type.
    let (gpu_slice, typed) = match typed {
        // `shared:1` asks for a slot of a time-sliced GPU (`model::share`).
        Some(t) if crate::model::share::is_shared(&t) => {
            (Some(crate::model::share::SHARED.to_string()), None)
        }
        Some(t) if crate::model::mig::looks_like_profile(&t) => {
            let p = crate::model::mig::find_profile(&t)
                .map_err(|e| SpecError::Invalid(format!("GPU request {t}: {e}")))?;
            (Some(p.name.to_string()), None)
        }
        other => (None, other),
    };
    let slices = |p: &str| {
        if crate::model::share::is_shared(p) {
            "shared GPU slots".to_string()
        } else {
            format!("MIG slices of {p}")
        }
    };
    if let (Some(r), Some(p)) = (elastic, &gpu_slice) {
        return invalid(format!(
            "--nodes {r} with {}: an elastic job takes whole GPUs; ask for whole GPUs \
             (--gpus-per-node N), or give a fixed --nodes",
            slices(p)
        ));
    }
    let gpu_type = match (&merged.gpu_type, typed) {
        (Some(a), Some(b)) if !a.eq_ignore_ascii_case(&b) => {
            return invalid(format!(
                "--gpu-type {a} and the GPU request's type {b} differ; give the type once"
            ))
        }
        (Some(a), _) => Some(a.clone()),
        (None, b) => b,
    };
    if let (Some(p), 0) = (&gpu_slice, gpus_per_node) {
        return invalid(format!(
            "the GPU request asks for 0 {}; ask for at least 1, e.g. {p}:1",
            slices(p)
        ));
    }
    if let Some(t) = &gpu_type {
        if gpus_per_node == 0 {
            return invalid(format!(
                "--gpu-type {t} is set but no GPUs are asked for; add --gpus-per-node N or --gpus N"
            ));
        }
    }

    let nodelist = merged.nodelist.clone().unwrap_or_default().0;
    let exclude = merged.exclude.clone().unwrap_or_default().0;
    if let Some(both) = nodelist.iter().find(|n| exclude.contains(n)) {
        return invalid(format!(
            "node {both} is both in --nodelist and in --exclude; name it in one of them"
        ));
    }
    if !nodelist.is_empty() && (nodelist.len() as u64) < u64::from(nodes) {
        return invalid(format!(
            "--nodelist names {} but the job asks for {} nodes; list at least as many nodes \
             as --nodes",
            plural_nodes(nodelist.len()),
            nodes
        ));
    }
    let placement = Placement {
        gpu_type,
        features: merged.constraint.clone().unwrap_or_default().0,
        nodelist,
        exclude,
        topology: merged.topology,
        reservation: merged.reservation.clone(),
        gpu_slice,
        elastic,
    };
    Ok((nodes, gpus_per_node, total_gpus, placement))
}

fn plural_nodes(n: usize) -> String {
    if n == 1 {
        "1 node".into()
    } else {
        format!("{n} nodes")
    }
}
