//! Scheduling pass cost: a 64-node × 8-GPU gang on 1,000 simulated DGX
//! nodes (10 spines × 5 leaves × 20 nodes, about a third of them partly
//! busy), with 1,000 small jobs queued behind it. Prints p50/p99 of
//! `sched::plan`; asserts nothing. Run: `cargo bench --bench place`
//! (GPUQ_BENCH_N sets the number of passes).

use std::time::{Duration, Instant};

use gpuq::model::{Allocation, GpuInfo, GpuLink, JobId, NodeAllocation, NodeInventory, NumaNode};
use gpuq::sched::{plan, ClusterView, NodeState, NodeView, PendingJob};

fn dgx(name: String, topology: String) -> NodeInventory {
    NodeInventory {
        gpus: (0..8)
            .map(|i| GpuInfo {
                index: i,
                uuid: format!("GPU-{name}-{i}"),
                model: "NVIDIA H100 80GB HBM3".into(),
                memory_mb: 80 * 1024,
                pci_bus_id: format!("00000000:{:02x}:00.0", 0x18 + i),
                numa_node: Some(i / 4),
                healthy: true,
                fault: None,
            })
            .collect(),
        gpu_links: (0..8)
            .map(|i| {
                (0..8)
                    .map(|j| {
                        if i == j {
                            GpuLink::SelfLink
                        } else {
                            GpuLink::NvLink(18)
                        }
                    })
                    .collect()
            })
            .collect(),
        numa: (0..2)
            .map(|n| NumaNode {
                id: n,
                cpus: (n * 64..n * 64 + 64).collect(),
                memory_mb: 512 * 1024,
            })
            .collect(),
        cpus: 128,
        memory_mb: 1024 * 1024,
        topology,
        features: vec!["ib".into()],
        name,
    }
}

fn job(id: u64, nodes: u32, gpus: u32) -> PendingJob {
    PendingJob {
        id: JobId(id),
        user: "bench".into(),
        nodes,
        ntasks_per_node: 1,
        gpus_per_node: gpus,
        cpus_per_task: 8,
        mem_per_node_mb: Some(64 * 1024),
        submit_time: id,
        priority: 0,
        total_gpus: None,
        placement: Default::default(),
        account: String::new(),
        qos: String::new(),
        partition: String::new(),
        nice: 0,
    }
}

fn main() {
    let passes: usize = std::env::var("GPUQ_BENCH_N")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(200);
    let mut nodes = Vec::new();
    for i in 0..1000u32 {
        let path = format!("spine{}/leaf{}", i / 100, i / 20);
        let mut v = NodeView::new(dgx(format!("node{i:04}"), path), NodeState::Up);
        // A third partly busy, spread so that no leaf is wholly free.
        if i % 3 == 0 {
            v.used.charge(&NodeAllocation {
                node: v.name.clone(),
                gpus: (0..(1 + i % 4)).collect(),
                cpus: (0..8).collect(),
                cpu_count: 8,
                memory_mb: 64 * 1024,
            });
        }
        nodes.push(v);
    }
    let mut pending = vec![job(1, 64, 8)];
    pending.extend((2..=1001).map(|id| job(id, 1, [1, 2, 4][id as usize % 3])));
    let view = ClusterView {
        nodes,
        pending,
        policy: Default::default(),
    };

    let first = plan(&view, 0);
    let gang: Option<&Allocation> = first.allocations.iter().find(|a| a.job == JobId(1));
    println!(
        "the gang: {}; {} jobs placed in one pass",
        gang.map_or("not placed".to_string(), |a| {
            let leaves: std::collections::BTreeSet<String> = a
                .nodes
                .iter()
                .map(|n| n.node.clone())
                .filter_map(|n| view.nodes.iter().find(|v| v.name == n))
                .map(|v| v.inventory.topology.clone())
                .collect();
            format!("{} nodes over {} leaves", a.nodes.len(), leaves.len())
        }),
        first.allocations.len()
    );
    let mut times: Vec<Duration> = (0..passes)
        .map(|_| {
            let t = Instant::now();
            std::hint::black_box(plan(&view, 0));
            t.elapsed()
        })
        .collect();
    times.sort();
    let pct = |p: usize| times[(times.len() * p / 100).min(times.len() - 1)];
    println!(
        "plan, 1,000 nodes, a 64x8 gang + 1,000 jobs: p50 {:?}, p99 {:?} over {passes} passes",
        pct(50),
        pct(99)
    );
    // The gang alone.
    let alone = ClusterView {
        nodes: view.nodes.clone(),
        pending: vec![job(1, 64, 8)],
        policy: Default::default(),
    };
    let mut times: Vec<Duration> = (0..passes)
        .map(|_| {
            let t = Instant::now();
            std::hint::black_box(plan(&alone, 0));
            t.elapsed()
        })
        .collect();
    times.sort();
    let pct = |p: usize| times[(times.len() * p / 100).min(times.len() - 1)];
    println!(
        "plan, 1,000 nodes, the 64x8 gang alone: p50 {:?}, p99 {:?}",
        pct(50),
        pct(99)
    );
}
