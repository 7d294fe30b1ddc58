//! Scheduling pass cost with elastic jobs (`--nodes MIN-MAX`) on 1,000
//! nodes of 8 GPUs, against the same jobs at a fixed size:
//! - idle fleet, 5,000 pending 8-GPU-a-node jobs, fixed at 2 nodes vs
//!   elastic 2-8 (each placed elastic job is tried at 8 nodes down);
//! - full fleet (every job waits), the same two queues: a blocked elastic
//!   job costs what a fixed one does (tried at its minimum only);
//! - growth: 500 running elastic 1-2 jobs, 500 free nodes, nothing pending.
//!
//! Prints p50/p99 of `sched::plan`; asserts nothing. Run: `cargo bench
//! --bench elastic` (GPUQ_BENCH_N sets the passes).

use std::sync::Arc;

use gpuq::model::{Allocation, JobId, NodeAllocation, NodeInventory, NodeRange, Placement};
use gpuq::sched::{plan, ActiveJob, ClusterView, ElasticRun, NodeState, NodeView, PendingJob};

#[path = "timing/mod.rs"]
mod timing;
const NODES: u32 = 1000;

/// A DGX-like node of 8 GPUs, as the simulated fleet has.
fn inventory(name: String) -> NodeInventory {
    gpuq::sim::fleet::sim_inventory(&name, 8, "").expect("a simulated node")
}

fn job(id: u64, nodes: u32, elastic: Option<NodeRange>) -> PendingJob {
    PendingJob {
        id: JobId(id),
        user: "bench".into(),
        nodes,
        ntasks_per_node: 1,
        gpus_per_node: 8,
        cpus_per_task: 8,
        mem_per_node_mb: Some(64 * 1024),
        submit_time: id,
        priority: 0,
        total_gpus: None,
        placement: Placement {
            elastic,
            ..Placement::default()
        },
        time_limit_secs: Some(3600),
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

fn whole(node: &str) -> NodeAllocation {
    NodeAllocation {
        node: node.to_string(),
        gpus: (0..8).collect(),
        cpus: Vec::new(),
        cpu_count: 8,
        memory_mb: 64 * 1024,
    }
}

fn measure(what: &str, view: &ClusterView, passes: usize) {
    let first = plan(view, 1_000_000);
    let nodes: usize = first.allocations.iter().map(|a| a.nodes.len()).sum();
    let times = timing::Times::of(passes, || plan(view, 1_000_000));
    let pct = |p: usize| times.pct(p);
    println!(
        "plan, {what}: {} started on {nodes} nodes, {} waiting, {} grown; p50 {:?}, p99 {:?} \
         over {passes} passes",
        first.allocations.len(),
        first.pending.len(),
        first.growths.len(),
        pct(50),
        pct(99)
    );
}

fn main() {
    let passes = timing::passes(10);
    let idle: Vec<NodeView> = (0..NODES)
        .map(|i| NodeView::new(inventory(format!("node{i:04}")), NodeState::Up))
        .collect();
    let range = Some(NodeRange { min: 2, max: 8 });
    let queue = |elastic| -> Vec<PendingJob> { (1..=5000).map(|i| job(i, 2, elastic)).collect() };
    let full: Vec<NodeView> = idle
        .iter()
        .cloned()
        .map(|mut v| {
            v.used.charge(&whole(&v.name));
            v
        })
        .collect();
    for (fleet, nodes) in [("idle", &idle), ("full", &full)] {
        for (kind, elastic) in [("fixed 2 nodes", None), ("elastic 2-8", range)] {
            let view = ClusterView {
                nodes: nodes.clone(),
                pending: queue(elastic),
                ..Default::default()
            };
            measure(&format!("{fleet} fleet, 5,000 jobs {kind}"), &view, passes);
        }
    }
    // Growth: 500 elastic 1-2 jobs on the first 500 nodes, the rest free.
    let mut view = ClusterView {
        nodes: idle.clone(),
        ..Default::default()
    };
    for i in 0..500u32 {
        let name = format!("node{i:04}");
        view.nodes[i as usize].used.charge(&whole(&name));
        let id = JobId(u64::from(i) + 1);
        let alloc = Allocation {
            job: id,
            nodes: vec![whole(&name)],
        };
        view.policy.running.push(ActiveJob {
            id,
            user: "bench".into(),
            account: Default::default(),
            qos: Default::default(),
            gpus: 8,
            start_time: 0,
            allocation: Arc::new(alloc),
            completing: false,
            preempted_for: None,
            elastic: Some(Box::new(ElasticRun {
                shape: job(id.0, 1, Some(NodeRange { min: 1, max: 2 })),
                range: NodeRange { min: 1, max: 2 },
                end: None,
                since: 0,
                resizing_to: None,
            })),
        });
    }
    measure(
        "500 running elastic 1-2 jobs, 500 free nodes",
        &view,
        passes,
    );
}
