//! Checks outside a pass: whether a job could ever run (at submit, and for the
//! `Unsatisfiable` reason) and whether an allocation still fits the current
//! state (apply's re-validation, as Nomad's plan applier does).

use std::collections::BTreeSet;

use crate::model::{Allocation, NodeInventory};

use super::view::{Capacity, NodeState, NodeView, PendingJob, Shape, DEFAULT_MEM_PER_CPU_MB};

/// Whether the cluster made of `nodes` (at their full size, whatever their
/// state) could ever run `job`; for refusing a job at submit instead of
/// queueing it forever. Counts every GPU, healthy or not: a faulty GPU is
/// repaired, a missing one is not.
pub fn feasible(nodes: &[NodeInventory], job: &PendingJob) -> Result<(), String> {
    let caps: Vec<Capacity> = nodes
        .iter()
        .map(|n| Capacity {
            gpus: n.gpus.len() as u64,
            cpus: u64::from(n.cpus),
            memory_mb: n.memory_mb,
        })
        .collect();
    fits_some(&caps, job, Scope::Cluster)
}

/// Which nodes a capacity verdict speaks of, for its wording.
#[derive(Clone, Copy)]
pub(super) enum Scope {
    /// Every registered node, at full size (submit).
    Cluster,
    /// The up nodes, healthy GPUs only (a pass).
    Up,
}

impl Scope {
    fn largest(self) -> &'static str {
        match self {
            Scope::Cluster => "the largest node has",
            Scope::Up => "the largest up node has",
        }
    }

    fn gpus_word(self) -> &'static str {
        match self {
            Scope::Cluster => "",
            Scope::Up => " healthy",
        }
    }
}

/// Whether `job.nodes` distinct nodes of `caps` could each hold the job's
/// per-node shape; the error says which number is short.
pub(super) fn fits_some(caps: &[Capacity], job: &PendingJob, scope: Scope) -> Result<(), String> {
    job.check_shape()?;
    let shape = job.per_node();
    if caps.is_empty() {
        return Err(match scope {
            Scope::Cluster => "the cluster has no nodes yet".into(),
            Scope::Up => "no node is up".into(),
        });
    }
    let max_gpus = caps.iter().map(|c| c.gpus).max().unwrap_or(0);
    if u64::from(shape.gpus) > max_gpus {
        return Err(format!(
            "asks for {} per node; {} {max_gpus}{}",
            plural(u64::from(shape.gpus), "GPU"),
            scope.largest(),
            scope.gpus_word(),
        ));
    }
    let max_cpus = caps.iter().map(|c| c.cpus).max().unwrap_or(0);
    if shape.cpus > max_cpus {
        return Err(format!(
            "asks for {} per node{}; {} {max_cpus}",
            plural(shape.cpus, "CPU"),
            cpus_detail(job),
            scope.largest(),
        ));
    }
    let max_mem = caps.iter().map(|c| c.memory_mb).max().unwrap_or(0);
    if shape.memory_mb > max_mem {
        return Err(format!(
            "asks for {} of memory per node{}; {} {}",
            fmt_mb(shape.memory_mb),
            memory_detail(job),
            scope.largest(),
            fmt_mb(max_mem),
        ));
    }
    let wanted = u64::from(job.nodes);
    if (caps.len() as u64) < wanted {
        return Err(format!(
            "asks for {}; {}",
            plural(wanted, "node"),
            match scope {
                Scope::Cluster => format!("the cluster has {}", caps.len()),
                Scope::Up => plural_be(caps.len() as u64, "node") + " up",
            }
        ));
    }
    let such = caps.iter().filter(|c| c.holds(&shape)).count() as u64;
    if such < wanted {
        return Err(format!(
            "asks for {} with {}; {}",
            plural(wanted, "node"),
            limiting(caps, &shape, wanted),
            match scope {
                Scope::Cluster => format!("the cluster has {}", plural(such, "such node")),
                Scope::Up => format!("{} up", plural_be(such, "such node")),
            }
        ));
    }
    Ok(())
}

/// The parts of the shape too few nodes have, e.g. "8 GPUs"; all of it when
/// only the combination is short.
fn limiting(caps: &[Capacity], shape: &Shape, nodes: u64) -> String {
    let count = |f: &dyn Fn(&Capacity) -> bool| caps.iter().filter(|c| f(c)).count() as u64;
    let gpus = plural(u64::from(shape.gpus), "GPU");
    let cpus = plural(shape.cpus, "CPU");
    let mem = format!("{} of memory", fmt_mb(shape.memory_mb));
    let mut parts = Vec::new();
    if shape.gpus > 0 && count(&|c| c.gpus >= u64::from(shape.gpus)) < nodes {
        parts.push(gpus.clone());
    }
    if count(&|c| c.cpus >= shape.cpus) < nodes {
        parts.push(cpus.clone());
    }
    if count(&|c| c.memory_mb >= shape.memory_mb) < nodes {
        parts.push(mem.clone());
    }
    if parts.is_empty() {
        if shape.gpus > 0 {
            parts.push(gpus);
        }
        parts.push(cpus);
        parts.push(mem);
    }
    join_and(&parts)
}

fn cpus_detail(job: &PendingJob) -> String {
    if job.ntasks_per_node > 1 {
        format!(
            " ({} × {} per task)",
            plural(u64::from(job.ntasks_per_node), "task"),
            plural(u64::from(job.cpus_per_task), "CPU")
        )
    } else {
        String::new()
    }
}

fn memory_detail(job: &PendingJob) -> String {
    if job.mem_per_node_mb.is_none() {
        format!(
            " (the default, {} per CPU; set --mem to ask for less)",
            fmt_mb(DEFAULT_MEM_PER_CPU_MB)
        )
    } else {
        String::new()
    }
}

/// Checks that `alloc` still fits `nodes` as they are now, and matches what
/// `job` asked for. Apply runs it on each allocation of a `Schedule` command
/// and charges the accepted ones ([`super::Usage::charge`]) before checking
/// the next, so allocations of one plan are checked against each other too.
pub fn check_allocation(
    nodes: &[NodeView],
    alloc: &Allocation,
    job: &PendingJob,
) -> Result<(), String> {
    if alloc.job != job.id {
        return Err(format!(
            "the allocation is for job {}, not job {}",
            alloc.job, job.id
        ));
    }
    job.check_shape()
        .map_err(|why| format!("job {} {why}", job.id))?;
    if alloc.nodes.len() != job.nodes as usize {
        return Err(format!(
            "job {} asks for {}; the allocation has {}",
            job.id,
            plural(u64::from(job.nodes), "node"),
            alloc.nodes.len()
        ));
    }
    let shape = job.per_node();
    let mut seen = BTreeSet::new();
    for na in &alloc.nodes {
        if !seen.insert(na.node.as_str()) {
            return Err(format!("node {} appears twice in the allocation", na.node));
        }
        let Some(node) = nodes.iter().find(|n| n.name == na.node) else {
            return Err(format!("node {} is not in the cluster", na.node));
        };
        if node.state != NodeState::Up {
            return Err(format!("node {} is {}", na.node, node.state));
        }
        if na.gpus.len() != shape.gpus as usize {
            return Err(format!(
                "job {} asks for {} per node; the allocation gives node {} {}",
                job.id,
                plural(u64::from(shape.gpus), "GPU"),
                na.node,
                na.gpus.len()
            ));
        }
        let mut gpus = BTreeSet::new();
        for &g in &na.gpus {
            if !gpus.insert(g) {
                return Err(format!("GPU {g} is listed twice on node {}", na.node));
            }
            let Some(info) = node.inventory.gpus.iter().find(|i| i.index == g) else {
                return Err(format!("GPU {g} does not exist on node {}", na.node));
            };
            if !info.healthy {
                return Err(format!("GPU {g} on node {} is unhealthy", na.node));
            }
            if node.used.gpus.contains(&g) {
                return Err(format!("GPU {g} on node {} is in use", na.node));
            }
        }
        if u64::from(na.cpu_count) != shape.cpus {
            return Err(format!(
                "job {} asks for {} per node; the allocation gives node {} {}",
                job.id,
                plural(shape.cpus, "CPU"),
                na.node,
                na.cpu_count
            ));
        }
        if !na.cpus.is_empty() {
            let ids: BTreeSet<u32> = na.cpus.iter().copied().collect();
            if ids.len() != na.cpus.len() || na.cpus.len() != na.cpu_count as usize {
                return Err(format!(
                    "the cpuset on node {} does not list {} distinct CPUs",
                    na.node, na.cpu_count
                ));
            }
        }
        if na.memory_mb != shape.memory_mb {
            return Err(format!(
                "job {} asks for {} of memory per node; the allocation gives node {} {}",
                job.id,
                fmt_mb(shape.memory_mb),
                na.node,
                fmt_mb(na.memory_mb)
            ));
        }
        if u64::from(na.cpu_count) > node.free_cpus() {
            return Err(format!(
                "node {} has {} free; the allocation needs {}",
                na.node,
                plural(node.free_cpus(), "CPU"),
                na.cpu_count
            ));
        }
        if na.memory_mb > node.free_memory_mb() {
            return Err(format!(
                "node {} has {} of memory free; the allocation needs {}",
                na.node,
                fmt_mb(node.free_memory_mb()),
                fmt_mb(na.memory_mb)
            ));
        }
    }
    Ok(())
}

/// "1 GPU", "8 GPUs".
fn plural(n: u64, word: &str) -> String {
    if n == 1 {
        format!("1 {word}")
    } else {
        format!("{n} {word}s")
    }
}

/// "1 such node is", "4 such nodes are".
fn plural_be(n: u64, word: &str) -> String {
    if n == 1 {
        format!("1 {word} is")
    } else {
        format!("{n} {word}s are")
    }
}

fn join_and(parts: &[String]) -> String {
    match parts {
        [] => String::new(),
        [one] => one.clone(),
        [init @ .., last] => format!("{} and {last}", init.join(", ")),
    }
}

/// MiB as people read it: "16 GiB", "1536 MiB".
pub(super) fn fmt_mb(mb: u64) -> String {
    if mb > 0 && mb % 1024 == 0 {
        format!("{} GiB", mb / 1024)
    } else {
        format!("{mb} MiB")
    }
}
