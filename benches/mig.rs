//! Scheduling pass cost with MIG: 1,000 nodes whose 8 GPUs are each
//! partitioned into seven 1g.10gb instances (56,000 slices), and 50,000
//! pending one-slice jobs: once on an idle fleet (every job fits: a pass
//! places 50,000), once on a fleet with 55 of each node's 56 slices in use
//! (1,000 start, 49,000 wait). For comparison, the idle case again with
//! 56 whole GPUs a node and one-GPU jobs (the same entries, no MIG).
//! Prints p50/p99 of `sched::plan`; asserts nothing. Run: `cargo bench
//! --bench mig` (GPUQ_BENCH_N sets the passes).

use gpuq::model::{GpuInfo, JobId, MigSlice, NodeAllocation, NodeInventory, NumaNode, Placement};
use gpuq::sched::{plan, ClusterView, NodeState, NodeView, PendingJob};

#[path = "timing/mod.rs"]
mod timing;
const GPUS: u32 = 8;
const SLICES: u32 = 7;

fn partitioned(name: String) -> NodeInventory {
    let gpus = (0..GPUS * SLICES)
        .map(|k| {
            let parent = k / SLICES;
            GpuInfo {
                index: GPUS + k,
                uuid: format!("MIG-{name}-{k}"),
                model: "NVIDIA H100 80GB HBM3".into(),
                memory_mb: 9_856,
                pci_bus_id: format!("00000000:{:02x}:00.0", 0x18 + parent),
                numa_node: Some(parent / 4),
                healthy: true,
                fault: None,
                mig: Some(MigSlice {
                    profile: "1g.10gb".into(),
                    parent,
                    compute_slices: 1,
                    placement: (k % SLICES) as u8,
                    slots: 0,
                }),
            }
        })
        .collect();
    NodeInventory {
        gpus,
        gpu_links: gpuq::model::nvswitch_links(GPUS as usize),
        numa: (0..2)
            .map(|n| NumaNode {
                id: n,
                cpus: (n * 64..n * 64 + 64).collect(),
                memory_mb: 512 * 1024,
            })
            .collect(),
        cpus: 128,
        memory_mb: 1024 * 1024,
        topology: String::new(),
        features: Vec::new(),
        name,
    }
}

fn slice_job(id: u64) -> PendingJob {
    PendingJob {
        id: JobId(id),
        user: "bench".into(),
        nodes: 1,
        ntasks_per_node: 1,
        gpus_per_node: 1,
        cpus_per_task: 1,
        mem_per_node_mb: Some(4 * 1024),
        submit_time: id,
        priority: 0,
        total_gpus: None,
        placement: Placement {
            gpu_slice: Some("1g.10gb".into()),
            ..Placement::default()
        },
        time_limit_secs: None,
        begin_time: None,
        blocked: None,
        array_throttle: None,
        singleton: None,
        previous: Vec::new(),
        account: Default::default(),
        qos: Default::default(),
        partition: Default::default(),
        nice: 0,
        exclusive: false,
    }
}

fn measure(what: &str, view: &ClusterView, passes: usize) {
    let first = plan(view, 0);
    let times = timing::Times::of(passes, || plan(view, 0));
    let pct = |p: usize| times.pct(p);
    println!(
        "plan, {what}: {} started, {} waiting; p50 {:?}, p99 {:?} over {passes} passes",
        first.allocations.len(),
        first.pending.len(),
        pct(50),
        pct(99)
    );
}

fn main() {
    let passes = timing::passes(10);
    let idle: Vec<NodeView> = (0..1000u32)
        .map(|i| NodeView::new(partitioned(format!("node{i:04}")), NodeState::Up))
        .collect();
    let pending: Vec<PendingJob> = (1..=50_000).map(slice_job).collect();
    let view = ClusterView {
        nodes: idle.clone(),
        pending: pending.clone(),
        ..Default::default()
    };
    measure(
        "1,000 nodes x 56 1g.10gb slices idle, 50,000 slice jobs",
        &view,
        passes,
    );
    // 55 of each node's 56 slices in use: one place left per node.
    let busy: Vec<NodeView> = idle
        .into_iter()
        .map(|mut v| {
            v.used.charge(&NodeAllocation {
                node: v.name.clone(),
                gpus: (GPUS..GPUS + 55).collect(),
                cpus: Vec::new(),
                cpu_count: 55,
                memory_mb: 55 * 4 * 1024,
            });
            v
        })
        .collect();
    let view = ClusterView {
        nodes: busy,
        pending,
        ..Default::default()
    };
    measure(
        "1,000 nodes x 56 1g.10gb slices, 55 in use each, 50,000 slice jobs",
        &view,
        passes,
    );
    // The baseline: the same entries as whole GPUs, one-GPU jobs.
    let whole: Vec<NodeView> = (0..1000u32)
        .map(|i| {
            let mut inv = partitioned(format!("node{i:04}"));
            for (k, g) in inv.gpus.iter_mut().enumerate() {
                g.index = k as u32;
                g.mig = None;
            }
            inv.gpu_links = gpuq::model::nvswitch_links(inv.gpus.len());
            NodeView::new(inv, NodeState::Up)
        })
        .collect();
    let view = ClusterView {
        nodes: whole,
        pending: (1..=50_000)
            .map(|id| {
                let mut j = slice_job(id);
                j.placement = Placement::default();
                j
            })
            .collect(),
        ..Default::default()
    };
    measure(
        "baseline: 1,000 nodes x 56 whole GPUs idle, 50,000 one-GPU jobs",
        &view,
        passes,
    );
}
