//! Scheduling pass cost: a 64-node × 8-GPU gang on 1,000 simulated DGX
//! nodes (10 spines × 5 leaves × 20 nodes, about a third of them partly
//! busy), with 1,000 small jobs queued behind it, and the gang restarting
//! in place after losing one node. Then backfill: the same 1,000 nodes nearly
//! full of running jobs with known ends, 10 blocked 16-node gangs at the head
//! and 10,000 or 100,000 mixed jobs behind them. Then 100,000 pending jobs
//! under the multifactor policy. Prints p50/p99 of `sched::plan`; asserts
//! nothing. Run: `cargo bench --bench place`
//! (GPUQ_BENCH_N sets the number of passes).

use gpuq::model::{Allocation, GpuInfo, JobId, NodeAllocation, NodeInventory, NumaNode};
use gpuq::sched::{plan, ClusterView, NodeState, NodeView, PendingJob, RunningJob};

#[path = "timing/mod.rs"]
mod timing;
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
                mig: None,
            })
            .collect(),
        gpu_links: gpuq::model::nvswitch_links(8),
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

fn main() {
    let passes = timing::passes(200);
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
        ..Default::default()
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
    let times = timing::Times::of(passes, || plan(&view, 0));
    let pct = |p: usize| times.pct(p);
    println!(
        "plan, 1,000 nodes, a 64x8 gang + 1,000 jobs: p50 {:?}, p99 {:?} over {passes} passes",
        pct(50),
        pct(99)
    );
    // The gang alone.
    let alone = ClusterView {
        nodes: view.nodes.clone(),
        pending: vec![job(1, 64, 8)],
        ..Default::default()
    };
    let times = timing::Times::of(passes, || plan(&alone, 0));
    let pct = |p: usize| times.pct(p);
    println!(
        "plan, 1,000 nodes, the 64x8 gang alone: p50 {:?}, p99 {:?}",
        pct(50),
        pct(99)
    );

    for queued in [10_000u64, 100_000] {
        backfill(
            queued,
            passes.clamp(1, if queued > 10_000 { 20 } else { 50 }),
        );
    }

    queue_100k(&view, passes);

    // The gang restarting in place: it ran where the first pass put it, one
    // of its nodes is down, the other 63 are kept and one spare is found.
    let Some(gang) = gang else { return };
    let mut restart = alone.clone();
    restart.pending[0].previous = gang.nodes.clone();
    let lost = gang.nodes[gang.nodes.len() / 2].node.clone();
    if let Some(v) = restart.nodes.iter_mut().find(|v| v.name == lost) {
        v.state = NodeState::Down;
    }
    let again = plan(&restart, 0);
    let kept = again.allocations.first().map_or(0, |a| {
        a.nodes
            .iter()
            .zip(&gang.nodes)
            .filter(|(new, old)| new.node == old.node)
            .count()
    });
    let times = timing::Times::of(passes, || plan(&restart, 0));
    let pct = |p: usize| times.pct(p);
    println!(
        "plan, 1,000 nodes, the 64x8 gang restarting after losing a node ({kept} of 64 nodes kept): \
         p50 {:?}, p99 {:?}",
        pct(50),
        pct(99)
    );
}

/// 1,000 nodes, each running 1-GPU jobs that end over the next 8 hours
/// (every tenth node with 2 GPUs free); 10 blocked 16x8 gangs, then
/// `queued` jobs of 1, 2, 4 or 8 GPUs with limits from 10 minutes to 8 hours.
fn backfill(queued: u64, passes: usize) {
    let now = 1_000_000_000;
    let mut nodes = Vec::new();
    let mut running = Vec::new();
    for i in 0..1000u32 {
        let path = format!("spine{}/leaf{}", i / 100, i / 20);
        let mut v = NodeView::new(dgx(format!("node{i:04}"), path), NodeState::Up);
        let busy = if i % 10 == 0 { 6 } else { 8 };
        for g in 0..busy {
            let na = NodeAllocation {
                node: v.name.clone(),
                gpus: vec![g],
                cpus: Vec::new(),
                cpu_count: 8,
                memory_mb: 32 * 1024,
            };
            v.used.charge(&na);
            let id = 10_000_000 + u64::from(i * 8 + g);
            running.push(RunningJob {
                id: JobId(id),
                allocation: Allocation {
                    job: JobId(id),
                    nodes: vec![na],
                }
                .into(),
                expected_end: Some(now + (u64::from(i * 8 + g) * 7919 % 480 + 1) * 60_000),
            });
        }
        nodes.push(v);
    }
    let mut pending: Vec<PendingJob> = (1..=10)
        .map(|id| {
            let mut j = job(id, 16, 8);
            j.time_limit_secs = Some(7200);
            j
        })
        .collect();
    pending.extend((11..11 + queued).map(|id| {
        let mut j = job(id, 1, [1, 2, 4, 8][id as usize % 4]);
        j.time_limit_secs = Some(600 * (1 + id % 48));
        j
    }));
    let view = ClusterView {
        nodes,
        pending,
        running,
        ..Default::default()
    };
    let first = plan(&view, now);
    println!(
        "backfill, 1,000 nodes, {queued} queued: {} reservations, {} backfilled in one pass",
        first.reservations.len(),
        first.allocations.len()
    );
    let times = timing::Times::of(passes, || plan(&view, now));
    let pct = |p: usize| times.pct(p);
    println!(
        "plan with backfill, 1,000 nodes, 10 blocked gangs + {queued} jobs: p50 {:?}, p99 {:?} over {passes} passes",
        pct(50),
        pct(99)
    );
}

/// 100,000 pending jobs (four accounts with usage, two QoS, one of which may
/// preempt the other) on the same 1,000 nodes, under the default
/// multifactor weights: the whole pass, priority and fair-share included.
fn queue_100k(base: &ClusterView, passes: usize) {
    use gpuq::model::{Account, Policy, Qos, UsageCell};
    use gpuq::sched::{ActiveJob, PolicyView};
    let mut policy = Policy::default();
    for (i, name) in ["a", "b", "c", "d"].iter().enumerate() {
        let mut a = Account::new(name);
        a.shares = 1 + i as u32;
        policy.accounts.insert(name.to_string(), a);
    }
    let mut hi = Qos::new("high");
    hi.priority = 10;
    hi.preempts.insert("normal".into());
    policy.qos.insert("high".into(), hi);
    let mut usage = std::collections::BTreeMap::new();
    for (i, name) in ["a", "b", "c", "d"].iter().enumerate() {
        usage.insert(
            name.to_string(),
            [(
                "bench".to_string(),
                UsageCell {
                    gpu_ms: 3_600_000 * 100 * (i as u64 + 1),
                    at: 0,
                    total_gpu_ms: 0,
                },
            )]
            .into(),
        );
    }
    let running: Vec<ActiveJob> = base
        .nodes
        .iter()
        .enumerate()
        .filter(|(_, n)| !n.used.gpus.is_empty())
        .map(|(i, n)| ActiveJob {
            id: JobId(1_000_000 + i as u64),
            user: "bench".into(),
            account: ["a", "b", "c", "d"][i % 4].into(),
            qos: Default::default(),
            gpus: n.used.gpus.len() as u64,
            start_time: 0,
            allocation: Allocation {
                job: JobId(1_000_000 + i as u64),
                nodes: vec![NodeAllocation {
                    node: n.name.clone(),
                    gpus: n.used.gpus.iter().copied().collect(),
                    cpus: n.used.cpu_ids.iter().copied().collect(),
                    cpu_count: n.used.cpus,
                    memory_mb: n.used.memory_mb,
                }],
            }
            .into(),
            completing: false,
            preempted_for: None,
            elastic: None,
        })
        .collect();
    let pending: Vec<PendingJob> = (1..=100_000u64)
        .map(|id| {
            let mut j = job(id, 1, [1, 2, 4, 8][id as usize % 4]);
            j.account = ["a", "b", "c", "d"][id as usize % 4].into();
            if id % 1000 == 0 {
                j.qos = "high".into();
            }
            j
        })
        .collect();
    let view = ClusterView {
        nodes: base.nodes.clone(),
        pending,
        policy: PolicyView {
            policy: std::sync::Arc::new(policy),
            usage,
            running,
        },
        ..Default::default()
    };
    let n = (passes / 10).max(10);
    let first = plan(&view, 3_600_000);
    let times = timing::Times::of(n, || plan(&view, 3_600_000));
    let pct = |p: usize| times.pct(p);
    println!(
        "plan, 1,000 nodes, 100,000 pending, multifactor + fair-share + quotas: p50 {:?}, \
         p99 {:?} over {n} passes ({} placed, {} preemptions in a pass)",
        pct(50),
        pct(99),
        first.allocations.len(),
        first.preemptions.len()
    );
}
