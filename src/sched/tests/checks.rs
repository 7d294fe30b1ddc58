//! Re-validation of allocations, submit-time feasibility, and GPU picking.

use std::collections::BTreeSet;

use super::*;
use crate::sched::{feasible, pick_gpus};

type Mutation = fn(&mut Vec<NodeView>, &mut Allocation, &mut PendingJob);

/// Nodes a (GPU 0 held, GPU 3 faulty), b, c (drained), d (down); job 1 asks for
/// 2 nodes x (2 GPUs, 2 tasks x 4 CPUs, default 8 GiB); a fitting allocation.
fn base() -> (Vec<NodeView>, Allocation, PendingJob) {
    let sc = Scenario::new([
        dgx("a").unhealthy(3),
        dgx("b"),
        dgx("c").drained(),
        dgx("d").down(),
    ])
    .running(held(90, "a", &[0]));
    let job = job(1).nodes(2).gpus(2).tasks(2).cpus(4).build();
    let on = |node: &str, gpus: &[u32]| NodeAllocation {
        node: node.into(),
        gpus: gpus.to_vec(),
        cpus: Vec::new(),
        cpu_count: 8,
        memory_mb: 8 * 1024,
    };
    let alloc = Allocation {
        job: JobId(1),
        nodes: vec![on("a", &[1, 2]), on("b", &[0, 1])],
    };
    (sc.view.nodes, alloc, job)
}

#[test]
fn check_allocation_accepts_a_fitting_allocation() {
    let (nodes, mut alloc, mut job) = base();
    assert_eq!(check_allocation(&nodes, &alloc, &job), Ok(()));
    // With cpusets, and as a `--gpus 4` job.
    alloc.nodes[0].cpus = (0..8).collect();
    alloc.nodes[1].cpus = (64..72).collect();
    job.total_gpus = Some(4);
    assert_eq!(check_allocation(&nodes, &alloc, &job), Ok(()));
}

#[test]
fn check_allocation_rejects_every_kind_of_conflict() {
    let rows: Vec<(&str, Mutation, &str)> = vec![
        (
            "another job's allocation",
            |_, a, _| a.job = JobId(2),
            "the allocation is for job 2, not job 1",
        ),
        (
            "too few nodes",
            |_, a, _| a.nodes.truncate(1),
            "job 1 asks for 2 nodes; the allocation has 1",
        ),
        (
            "a node twice",
            |_, a, _| {
                a.nodes[1].node = "a".into();
                a.nodes[1].gpus = vec![4, 5];
            },
            "node a appears twice in the allocation",
        ),
        (
            "an unknown node",
            |_, a, _| a.nodes[1].node = "z".into(),
            "node z is not in the cluster",
        ),
        (
            "a drained node",
            |_, a, _| a.nodes[1].node = "c".into(),
            "node c is drained",
        ),
        (
            "a down node",
            |_, a, _| a.nodes[1].node = "d".into(),
            "node d is down",
        ),
        (
            "too few GPUs",
            |_, a, _| a.nodes[0].gpus = vec![1],
            "job 1 asks for 2 GPUs per node; the allocation gives node a 1",
        ),
        (
            "a GPU twice",
            |_, a, _| a.nodes[0].gpus = vec![1, 1],
            "GPU 1 is listed twice on node a",
        ),
        (
            "a GPU that does not exist",
            |_, a, _| a.nodes[0].gpus = vec![1, 8],
            "GPU 8 does not exist on node a",
        ),
        (
            "a faulty GPU",
            |_, a, _| a.nodes[0].gpus = vec![1, 3],
            "GPU 3 on node a is unhealthy",
        ),
        (
            "a GPU in use",
            |_, a, _| a.nodes[0].gpus = vec![0, 1],
            "GPU 0 on node a is in use",
        ),
        (
            "a different CPU count",
            |_, a, _| a.nodes[0].cpu_count = 7,
            "job 1 asks for 8 CPUs per node; the allocation gives node a 7",
        ),
        (
            "a cpuset that does not match the count",
            |_, a, _| a.nodes[0].cpus = vec![0, 0, 1, 2, 3, 4, 5, 6],
            "the cpuset on node a does not list 8 distinct CPUs",
        ),
        (
            "a CPU in another job's cpuset",
            |n, a, _| {
                n[1].used.cpu_ids.insert(3);
                a.nodes[1].cpus = (0..8).collect();
            },
            "CPU 3 on node b is in another job's cpuset",
        ),
        (
            "a CPU the node does not give to jobs",
            |_, a, _| a.nodes[1].cpus = (200..208).collect(),
            "CPU 200 is not one node b gives to jobs",
        ),
        (
            "another total with --gpus",
            |_, _, j| j.total_gpus = Some(6),
            "job 1 asks for 6 GPUs in total, the same number on each node; the allocation gives 2 + 2",
        ),
        (
            "an excluded node",
            |_, _, j| j.placement.exclude = vec!["b".into()],
            "node b is in the job's --exclude",
        ),
        (
            "a different memory size",
            |_, a, _| a.nodes[0].memory_mb = 4096,
            "job 1 asks for 8 GiB of memory per node; the allocation gives node a 4 GiB",
        ),
        (
            "CPUs taken meanwhile",
            |n, _, _| n[1].used.cpus = 125,
            "node b has 3 CPUs free; the allocation needs 8",
        ),
        (
            "memory taken meanwhile",
            |n, _, _| n[1].used.memory_mb = 1020 * 1024,
            "node b has 4 GiB of memory free; the allocation needs 8 GiB",
        ),
        (
            "GPUs taken meanwhile",
            |n, a, _| n[1].used.charge(&a.nodes[1]),
            "GPU 0 on node b is in use",
        ),
        (
            "a node that went down",
            |n, _, _| n[1].state = NodeState::Down,
            "node b is down",
        ),
        (
            "a malformed job",
            |_, _, j| j.cpus_per_task = 0,
            "job 1 asks for 0 CPUs per task",
        ),
    ];
    let mut failures = Vec::new();
    for (name, mutate, want) in rows {
        let (mut nodes, mut alloc, mut job) = base();
        mutate(&mut nodes, &mut alloc, &mut job);
        match check_allocation(&nodes, &alloc, &job) {
            Err(why) if why.contains(want) => {}
            other => failures.push(format!(
                "{name}: expected an error with {want:?}, got {other:?}"
            )),
        }
    }
    assert!(failures.is_empty(), "\n{}", failures.join("\n"));
}

#[test]
fn feasible_refuses_at_submit_with_clear_numbers() {
    let cluster: Vec<NodeInventory> = [
        dgx("a"),
        dgx("b"),
        dgx("c").unhealthy(0).unhealthy(1),
        dgx("d").drained(),
        node("e").gpus(4, Topo::Pcie).cpus(32).mem_gb(64),
    ]
    .into_iter()
    .map(|n| n.build().inventory)
    .collect();
    let odd: Vec<NodeInventory> = [
        node("x").gpus(8, Topo::NvSwitch).cpus(16),
        node("y").gpus(1, Topo::Pcie).cpus(128),
    ]
    .into_iter()
    .map(|n| n.build().inventory)
    .collect();

    let rows: Vec<(&str, &[NodeInventory], JobBuilder, Option<&str>)> = vec![
        ("fits", &cluster, job(1).nodes(4).gpus(8), None),
        ("faulty GPUs still count at submit", &cluster, job(1).nodes(4).gpus(8).cpus(64), None),
        ("CPU-only on every node", &cluster, job(1).nodes(5), None),
        (
            "too many GPUs per node",
            &cluster,
            job(1).gpus(9),
            Some("asks for 9 GPUs per node; the largest node has 8"),
        ),
        (
            "too few nodes of the shape",
            &cluster,
            job(1).nodes(5).gpus(8),
            Some("asks for 5 nodes with 8 GPUs; the cluster has 4 such nodes"),
        ),
        ("too many nodes", &cluster, job(1).nodes(6), Some("asks for 6 nodes; the cluster has 5")),
        (
            "too many CPUs per node",
            &cluster,
            job(1).tasks(4).cpus(64).mem_gb(1),
            Some("asks for 256 CPUs per node (4 tasks × 64 CPUs per task); the largest node has 128"),
        ),
        (
            "too much memory per node",
            &cluster,
            job(1).mem_gb(2048),
            Some("asks for 2048 GiB of memory per node; the largest node has 1024 GiB"),
        ),
        (
            "too few nodes with enough CPUs",
            &cluster,
            job(1).nodes(5).gpus(4).cpus(48).mem_gb(8),
            Some("asks for 5 nodes with 48 CPUs; the cluster has 4 such nodes"),
        ),
        (
            "every part fits some node, no node fits all",
            &odd,
            job(1).gpus(8).cpus(128).mem_gb(16),
            Some("asks for 1 node with 8 GPUs, 128 CPUs and 16 GiB of memory; the cluster has 0 such nodes"),
        ),
        ("no nodes", &[], job(1), Some("the cluster has no nodes yet")),
    ];
    let mut failures = Vec::new();
    for (name, nodes, j, want) in rows {
        let got = feasible(nodes, &j.build());
        let ok = match (want, &got) {
            (None, Ok(())) => true,
            (Some(w), Err(e)) => e == w,
            _ => false,
        };
        if !ok {
            failures.push(format!("{name}: expected {want:?}, got {got:?}"));
        }
    }
    assert!(failures.is_empty(), "\n{}", failures.join("\n"));
}

fn set(ids: &[u32]) -> BTreeSet<u32> {
    ids.iter().copied().collect()
}

/// Name, node, free GPUs, how many, expected pick.
type PickRow<'a> = (
    &'static str,
    &'a NodeInventory,
    &'static [u32],
    u32,
    Option<Vec<u32>>,
);

#[test]
fn pick_gpus_prefers_close_sets_then_low_indices() {
    let switch = dgx("a").build().inventory;
    let pairs = dgx_pairs("a").build().inventory;
    let pcie = node("a").gpus(8, Topo::Pcie).build().inventory;
    let rows: Vec<PickRow> = vec![
        ("nothing asked", &switch, &[3], 0, Some(vec![])),
        ("too few free", &switch, &[1, 2], 3, None),
        (
            "NVSwitch: all equal, lowest win",
            &switch,
            &[1, 2, 5, 6],
            3,
            Some(vec![1, 2, 5]),
        ),
        (
            "pairs: a whole pair over two loose ends",
            &pairs,
            &[1, 2, 3, 5, 6],
            2,
            Some(vec![2, 3]),
        ),
        (
            "pairs: stay in one NUMA node",
            &pairs,
            &[1, 3, 4, 5, 6, 7],
            4,
            Some(vec![4, 5, 6, 7]),
        ),
        (
            "pairs: two pairs in a NUMA node",
            &pairs,
            ALL8,
            4,
            Some(vec![0, 1, 2, 3]),
        ),
        (
            "PCIe: one switch",
            &pcie,
            &[0, 2, 3, 4],
            2,
            Some(vec![2, 3]),
        ),
        (
            "PCIe: one NUMA node over two",
            &pcie,
            &[3, 4, 6, 7],
            3,
            Some(vec![4, 6, 7]),
        ),
        ("all free asked", &pairs, &[1, 4, 6], 3, Some(vec![1, 4, 6])),
    ];
    for (name, inv, free, n, want) in rows {
        assert_eq!(pick_gpus(inv, &set(free), n), want, "{name}");
    }
}

#[test]
fn pick_gpus_survives_a_missing_link_matrix() {
    let mut inv = dgx_pairs("a").build().inventory;
    inv.gpu_links.clear();
    // Every link unknown is equally far; the NUMA nodes still tell.
    assert_eq!(pick_gpus(&inv, &set(&[2, 5, 7]), 2), Some(vec![5, 7]));
}

#[test]
fn pick_gpus_on_a_large_node_stays_in_one_numa_node() {
    // 16 GPUs, 8 asked: C(16, 8) is past the exhaustive limit, so greedy runs.
    let inv = node("big").gpus(16, Topo::NvLinkPairs).build().inventory;
    let free: BTreeSet<u32> = (0..16).collect();
    assert_eq!(pick_gpus(&inv, &free, 8), Some((0..8).collect()));
    let free: BTreeSet<u32> = (1..16).filter(|g| g % 2 == 1 || *g >= 8).collect();
    assert_eq!(pick_gpus(&inv, &free, 8), Some((8..16).collect()));
}
