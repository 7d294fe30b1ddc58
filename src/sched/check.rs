//! Checks outside a pass: whether a job could ever run (at submit, and for the
//! `Unsatisfiable` reason) and whether an allocation still fits the current
//! state (apply's re-validation, as Nomad's plan applier does).

use std::collections::{BTreeMap, BTreeSet};

use crate::model::{Allocation, NodeInventory, TopologyRequirement};

use super::constraints::{self, Among};
use super::topology::{self, Level};
use super::view::{
    cpu_layout, Capacity, NodeState, NodeView, PendingJob, Shape, DEFAULT_MEM_PER_CPU_MB,
};

/// Whether the cluster made of `nodes` (at their full size, whatever their
/// state) could ever run `job`; for refusing a job at submit instead of
/// queueing it forever. Counts every GPU, healthy or not: a faulty GPU is
/// repaired, a missing one is not. The error names what is missing: a GPU
/// type, a feature, a node of `--nodelist`, or the number that is short.
pub fn feasible<'a>(
    nodes: impl IntoIterator<Item = &'a NodeInventory>,
    job: &PendingJob,
) -> Result<(), String> {
    let cands: Vec<Candidate> = nodes
        .into_iter()
        .map(|n| Candidate {
            name: &n.name,
            inventory: n,
            cap: Capacity {
                gpus: n.gpus.len() as u64,
                cpus: u64::from(n.cpus),
                memory_mb: n.memory_mb,
            },
        })
        .collect();
    fits_some(&cands, job, Scope::Cluster).map(|_| ())
}

/// One node as a satisfiability check sees it.
#[derive(Clone, Copy)]
pub(super) struct Candidate<'a> {
    pub name: &'a str,
    pub inventory: &'a NodeInventory,
    /// What it could hold empty.
    pub cap: Capacity,
}

/// The shape a job runs in: `nodes` nodes, each with `per_node`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Resolved {
    pub nodes: u32,
    pub per_node: Shape,
}

/// Which nodes a capacity verdict speaks of, for its wording.
#[derive(Clone, Copy)]
pub(super) enum Scope {
    /// Every registered node, at full size (submit).
    Cluster,
    /// The up nodes, healthy GPUs only (a pass).
    Up,
}

/// How a verdict words the nodes it counted: all of them, or only those the
/// job's placement allows ("matching").
#[derive(Clone, Copy)]
struct Wording {
    scope: Scope,
    matching: bool,
}

impl Wording {
    fn node(self) -> &'static str {
        if self.matching {
            "matching node"
        } else {
            "node"
        }
    }

    fn largest(self) -> String {
        let matching = if self.matching { "matching " } else { "" };
        match self.scope {
            Scope::Cluster => format!("the largest {matching}node has"),
            Scope::Up => format!("the largest {matching}up node has"),
        }
    }

    fn gpus_word(self) -> &'static str {
        match self.scope {
            Scope::Cluster => "",
            Scope::Up => " healthy",
        }
    }

    /// "the cluster has 5", "the cluster has 5 matching nodes", "3 nodes are
    /// up", "2 such nodes are up".
    fn count(self, n: u64, such: bool) -> String {
        let noun = if such {
            format!("such {}", self.node())
        } else {
            self.node().to_string()
        };
        match self.scope {
            Scope::Cluster if !such && !self.matching => format!("the cluster has {n}"),
            Scope::Cluster => format!("the cluster has {}", plural(n, &noun)),
            Scope::Up => format!("{} up", plural_be(n, &noun)),
        }
    }
}

/// Whether the job's placement allows some of `cands` and `job.nodes` of
/// those could each hold its per-node shape (in one domain, under
/// `--topology`); the error says what is missing or which number is short.
/// For a `--gpus N` job, also chooses its shape ([`resolve_total`]).
pub(super) fn fits_some(
    cands: &[Candidate],
    job: &PendingJob,
    scope: Scope,
) -> Result<Resolved, String> {
    job.check_shape()?;
    if cands.is_empty() {
        return Err(match scope {
            Scope::Cluster => "the cluster has no nodes yet".into(),
            Scope::Up => "no node is up".into(),
        });
    }
    let p = &job.placement;
    let named: Vec<(&str, &NodeInventory)> = cands.iter().map(|c| (c.name, c.inventory)).collect();
    if let Scope::Cluster = scope {
        match constraints::unknown_names(&named, p).as_slice() {
            [] => {}
            [one] => {
                return Err(format!(
                    "--nodelist names {one}, which is not in the cluster"
                ))
            }
            many => {
                return Err(format!(
                    "--nodelist names {}, which are not in the cluster",
                    many.join(", ")
                ))
            }
        }
    }
    let matching: Vec<Candidate> = cands
        .iter()
        .filter(|c| constraints::allows(c.name, c.inventory, p))
        .copied()
        .collect();
    if matching.is_empty() {
        let among = match scope {
            Scope::Cluster => Among::Cluster,
            Scope::Up => Among::Up,
        };
        return Err(constraints::none_matches(&named, p, among));
    }
    let matching = of_kind(matching, job, scope)?;
    let wording = Wording {
        scope,
        matching: p.restricts_nodes(),
    };
    match job.total_gpus {
        None => {
            let per_node = job.per_node();
            fits_shape(&matching, job, job.nodes, per_node, wording)?;
            Ok(Resolved {
                nodes: job.nodes,
                per_node,
            })
        }
        Some(total) => resolve_total(&matching, job, total, wording),
    }
}

/// `matching` with each node's GPUs counted as those of the kind the job
/// takes (whole GPUs, or its MIG profile's slices); an error when the job
/// asks for whole GPUs and every matching GPU is partitioned.
fn of_kind<'a>(
    mut matching: Vec<Candidate<'a>>,
    job: &PendingJob,
    scope: Scope,
) -> Result<Vec<Candidate<'a>>, String> {
    let slice = job.placement.gpu_slice.as_deref();
    let mut sliced: Vec<&str> = Vec::new();
    for c in &mut matching {
        if slice.is_some() || c.inventory.has_slices() {
            c.cap.gpus = c
                .inventory
                .gpus_of(slice)
                .filter(|g| matches!(scope, Scope::Cluster) || g.healthy)
                .count() as u64;
            sliced.extend(c.inventory.gpus.iter().filter_map(|g| g.slice_profile()));
        }
    }
    let asks_gpus = job.gpus_per_node > 0 || job.total_gpus.is_some();
    if slice.is_none()
        && asks_gpus
        && !sliced.is_empty()
        && matching.iter().all(|c| c.cap.gpus == 0)
    {
        sliced.sort_unstable();
        sliced.dedup();
        let how = if sliced == [crate::model::share::SHARED] {
            "time-shared"
        } else {
            "partitioned into MIG slices"
        };
        return Err(format!(
            "asks for whole GPUs; every GPU of the {}nodes is {how} \
             ({}); ask for a slice instead, e.g. --gpus-per-node {}:1",
            if job.placement.restricts_nodes() {
                "matching "
            } else {
                ""
            },
            sliced.join(", "),
            sliced[0]
        ));
    }
    Ok(matching)
}

/// The shape of a `--gpus N` job: one node when N fits on one, else whole
/// nodes (N a multiple of a node size, largest size first); the first of
/// those shapes the nodes could hold. It depends only on what the nodes could
/// hold empty, not on what is free now, so a waiting job keeps its shape.
fn resolve_total(
    matching: &[Candidate],
    job: &PendingJob,
    total: u32,
    wording: Wording,
) -> Result<Resolved, String> {
    let mut sizes: Vec<u64> = matching
        .iter()
        .map(|c| c.cap.gpus)
        .filter(|&g| g > 0)
        .collect();
    sizes.sort_unstable_by(|a, b| b.cmp(a));
    sizes.dedup();
    let largest = sizes.first().copied().unwrap_or(0);
    let mut shapes: Vec<(u32, u32)> = Vec::new();
    if u64::from(total) <= largest {
        shapes.push((1, total));
    }
    for &g in &sizes {
        if u64::from(total) > g && u64::from(total) % g == 0 {
            if let (Ok(nodes), Ok(g)) = (u32::try_from(u64::from(total) / g), u32::try_from(g)) {
                shapes.push((nodes, g));
            }
        }
    }
    if shapes.is_empty() {
        let whole: Vec<String> = sizes.iter().map(u64::to_string).collect();
        return Err(format!(
            "asks for {} in total (--gpus), which fit on no single node ({} {largest}{}) and \
             fill no whole nodes of {}; give the shape with --nodes and --gpus-per-node",
            plural(u64::from(total), "GPU"),
            wording.largest(),
            wording.gpus_word(),
            if whole.is_empty() {
                "any size".to_string()
            } else {
                whole.join(" or ") + " GPUs"
            },
        ));
    }
    let mut first_error = None;
    for (nodes, gpus) in shapes {
        let per_node = job.with_gpus(gpus);
        match fits_shape(matching, job, nodes, per_node, wording) {
            Ok(()) => return Ok(Resolved { nodes, per_node }),
            Err(why) => {
                first_error.get_or_insert_with(|| {
                    format!(
                        "--gpus {total} as {} × {}: {why}",
                        plural(u64::from(nodes), "node"),
                        plural(u64::from(gpus), "GPU")
                    )
                });
            }
        }
    }
    Err(first_error.unwrap_or_default())
}

/// Whether `nodes` distinct nodes of `matching` could each hold `shape`,
/// and, under `--topology`, within one domain of that level.
fn fits_shape(
    matching: &[Candidate],
    job: &PendingJob,
    nodes: u32,
    shape: Shape,
    wording: Wording,
) -> Result<(), String> {
    let caps: Vec<Capacity> = matching.iter().map(|c| c.cap).collect();
    let max_gpus = caps.iter().map(|c| c.gpus).max().unwrap_or(0);
    if u64::from(shape.gpus) > max_gpus {
        return Err(format!(
            "asks for {} per node; {} {max_gpus}{}",
            plural(u64::from(shape.gpus), "GPU"),
            wording.largest(),
            wording.gpus_word(),
        ));
    }
    let max_cpus = caps.iter().map(|c| c.cpus).max().unwrap_or(0);
    if shape.cpus > max_cpus {
        return Err(format!(
            "asks for {} per node{}; {} {max_cpus}",
            plural(shape.cpus, "CPU"),
            cpus_detail(job),
            wording.largest(),
        ));
    }
    let max_mem = caps.iter().map(|c| c.memory_mb).max().unwrap_or(0);
    if shape.memory_mb > max_mem {
        return Err(format!(
            "asks for {} of memory per node{}; {} {}",
            fmt_mb(shape.memory_mb),
            memory_detail(job),
            wording.largest(),
            fmt_mb(max_mem),
        ));
    }
    let wanted = u64::from(nodes);
    if (caps.len() as u64) < wanted {
        return Err(format!(
            "asks for {}; {}",
            plural(wanted, "node"),
            wording.count(caps.len() as u64, false)
        ));
    }
    let such = caps.iter().filter(|c| c.holds(&shape)).count() as u64;
    if such < wanted {
        return Err(format!(
            "asks for {} with {}; {}",
            plural(wanted, "node"),
            limiting(&caps, &shape, wanted),
            wording.count(such, true)
        ));
    }
    if let (Some(level), true) = (job.placement.topology, wanted > 1) {
        let holding: Vec<&Candidate> = matching.iter().filter(|c| c.cap.holds(&shape)).collect();
        let biggest = largest_domain(&holding, level);
        if biggest < wanted {
            return Err(format!(
                "asks for {} under one {level} (--topology {level}); the largest {level} has {}{}",
                plural(wanted, "node"),
                plural(biggest, "such node"),
                if holding.iter().any(|c| c.inventory.topology.is_empty()) {
                    " (a node without a topology path is a domain of its own)"
                } else {
                    ""
                }
            ));
        }
    }
    Ok(())
}

/// The most of `nodes` that share one domain at `level`.
fn largest_domain(nodes: &[&Candidate], level: TopologyRequirement) -> u64 {
    let mut sizes: BTreeMap<topology::Domain, u64> = BTreeMap::new();
    for c in nodes {
        let d = topology::domain(&c.inventory.topology, c.name, Level::Up(level.levels_up()));
        *sizes.entry(d).or_default() += 1;
    }
    sizes.values().copied().max().unwrap_or(0)
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
/// `job` asked for (its shape, placement and topology). Apply runs it on each
/// allocation of a `Schedule` command and charges the accepted ones
/// ([`super::Usage::charge`]) before checking the next, so allocations of
/// one plan are checked against each other too.
pub fn check_allocation(
    nodes: &[NodeView],
    alloc: &Allocation,
    job: &PendingJob,
) -> Result<(), String> {
    check_allocation_by(|name| nodes.iter().find(|n| n.name == name), alloc, job)
}

/// [`check_allocation`] with each node found by name through `node` (apply
/// looks them up in the state's index instead of scanning every node).
pub fn check_allocation_by<'n>(
    node: impl Fn(&str) -> Option<&'n NodeView>,
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
    let shape = match job.total_gpus {
        None => {
            let sized = match job.placement.elastic {
                Some(r) => r.holds(alloc.nodes.len() as u32),
                None => alloc.nodes.len() == job.nodes as usize,
            };
            if !sized {
                return Err(format!(
                    "job {} asks for {}; the allocation has {}",
                    job.id,
                    plural(u64::from(job.nodes), "node"),
                    alloc.nodes.len()
                ));
            }
            job.per_node()
        }
        Some(total) => total_shape(alloc, job, total)?,
    };
    let mut seen = BTreeSet::new();
    let mut domains = BTreeSet::new();
    for na in &alloc.nodes {
        if !seen.insert(na.node.as_str()) {
            return Err(format!("node {} appears twice in the allocation", na.node));
        }
        let Some(node) = node(&na.node) else {
            return Err(format!("node {} is not in the cluster", na.node));
        };
        if node.state != NodeState::Up {
            return Err(format!("node {} is {}", na.node, node.state));
        }
        if let Some(why) = constraints::mismatch(&node.name, &node.inventory, &job.placement) {
            return Err(format!("node {} {why}", na.node));
        }
        if let Some(level) = job.placement.topology {
            let up = Level::Up(level.levels_up());
            domains.insert(topology::domain(&node.inventory.topology, &node.name, up));
        }
        let shape = if job.exclusive {
            exclusive_shape(node, &shape, job.placement.gpu_slice.as_deref())
                .map_err(|why| format!("job {} {why}", job.id))?
        } else {
            shape
        };
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
            let slice = job.placement.gpu_slice.as_deref();
            if !info.is_kind(slice) {
                return Err(format!(
                    "GPU {g} on node {} is {}; job {} asks for {}",
                    na.node,
                    info.slice_profile()
                        .map_or("a whole GPU".to_string(), |p| format!("a {p} MIG slice")),
                    job.id,
                    slice.map_or("whole GPUs".to_string(), crate::model::share::noun),
                ));
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
        check_cpuset(node, na)?;
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
    if let Some(level) = job.placement.topology {
        let alone = domains.iter().any(|d| !d.is_shared());
        if alloc.nodes.len() > 1 && (domains.len() > 1 || alone) {
            return Err(format!(
                "job {} must stay under one {level} (--topology {level}); the allocation spans {} {}",
                job.id,
                domains.len(),
                level.plural()
            ));
        }
    }
    Ok(())
}

/// What an `--exclusive` job holds on `node`: the whole of it, which must
/// run nothing else and hold at least `asked`.
fn exclusive_shape(node: &NodeView, asked: &Shape, slice: Option<&str>) -> Result<Shape, String> {
    let whole = Shape {
        gpus: node.inventory.gpus_of(slice).filter(|g| g.healthy).count() as u32,
        cpus: u64::from(node.inventory.cpus),
        memory_mb: node.inventory.memory_mb,
    };
    let idle = node.used.gpus.is_empty()
        && node.free_cpus() == whole.cpus
        && node.free_memory_mb() == whole.memory_mb;
    if !idle {
        return Err(format!(
            "runs alone (--exclusive); node {} runs other work",
            node.name
        ));
    }
    if whole.gpus < asked.gpus || whole.cpus < asked.cpus || whole.memory_mb < asked.memory_mb {
        return Err(format!("does not fit on node {} even whole", node.name));
    }
    Ok(whole)
}

/// The per-node shape an allocation gives a `--gpus N` job: equal GPUs on
/// every node, N in all.
fn total_shape(alloc: &Allocation, job: &PendingJob, total: u32) -> Result<Shape, String> {
    let per = alloc.nodes.first().map_or(0, |n| n.gpus.len());
    let sum: usize = alloc.nodes.iter().map(|n| n.gpus.len()).sum();
    if per == 0 || alloc.nodes.iter().any(|n| n.gpus.len() != per) || sum != total as usize {
        return Err(format!(
            "job {} asks for {} in total, the same number on each node; the allocation gives {}",
            job.id,
            plural(u64::from(total), "GPU"),
            alloc
                .nodes
                .iter()
                .map(|n| n.gpus.len().to_string())
                .collect::<Vec<_>>()
                .join(" + ")
        ));
    }
    Ok(job.with_gpus(per as u32))
}

/// A cpuset, when the allocation has one, names `cpu_count` distinct CPUs
/// of the node that no other job's cpuset holds.
fn check_cpuset(node: &NodeView, na: &crate::model::NodeAllocation) -> Result<(), String> {
    if na.cpus.is_empty() {
        return Ok(());
    }
    let ids: BTreeSet<u32> = na.cpus.iter().copied().collect();
    if ids.len() != na.cpus.len() || na.cpus.len() != na.cpu_count as usize {
        return Err(format!(
            "the cpuset on node {} does not list {} distinct CPUs",
            na.node, na.cpu_count
        ));
    }
    let layout = cpu_layout(&node.inventory).unwrap_or_default();
    if let Some(c) = ids.iter().find(|c| layout.binary_search(c).is_err()) {
        return Err(format!("CPU {c} is not one node {} gives to jobs", na.node));
    }
    if let Some(c) = ids.iter().find(|c| node.used.cpu_ids.contains(c)) {
        return Err(format!(
            "CPU {c} on node {} is in another job's cpuset",
            na.node
        ));
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
