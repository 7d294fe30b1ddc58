//! Properties over random clusters and queues (with topology paths,
//! features, GPU models, cpusets, placements and `--gpus` jobs): plans never
//! oversubscribe, always re-validate, keep FIFO, and call a job
//! unsatisfiable exactly when an empty cluster could not run it either.

use std::collections::BTreeSet;

use proptest::prelude::*;

use super::*;
use crate::model::{Placement, TopologyRequirement};
use crate::sched::pick_gpus;

const LINKS: [GpuLink; 6] = [
    GpuLink::NvLink(4),
    GpuLink::NvLink(18),
    GpuLink::PcieSwitch,
    GpuLink::HostBridge,
    GpuLink::SameNuma,
    GpuLink::CrossNuma,
];

const PATHS: [&str; 5] = ["", "s1/l1", "s1/l2", "s2/l3", "s2/l3"];

/// A node with some GPUs faulty and some GPUs, CPUs (some in cpusets) and
/// memory already held, a topology path, features and a GPU model.
fn arb_node(i: usize) -> impl Strategy<Value = NodeView> {
    (
        (0u32..=8, 0usize..3, 1u32..=64, 1u64..=64),
        prop_oneof![6 => Just(NodeState::Up), 1 => Just(NodeState::Drained), 1 => Just(NodeState::Down)],
        (any::<u8>(), any::<u8>(), 0u32..=100, 0u64..=100),
        (0usize..PATHS.len(), 0u8..4, any::<bool>()),
    )
        .prop_map(move |((gpus, topo, cpus, mem_gb), state, (faulty, used, cpu_pct, mem_pct), (path, features, a100))| {
            let topo = [Topo::NvSwitch, Topo::NvLinkPairs, Topo::Pcie][topo];
            let names: Vec<&str> = [(1, "ib"), (2, "nvme")]
                .iter()
                .filter(|(bit, _)| features & bit != 0)
                .map(|(_, f)| *f)
                .collect();
            let mut b = node(&format!("n{i}"))
                .gpus(gpus, topo)
                .cpus(cpus)
                .mem_gb(mem_gb)
                .state(state)
                .topo(PATHS[path])
                .features(&names);
            if a100 {
                b = b.model("NVIDIA A100-SXM4-80GB");
            }
            for g in 0..gpus {
                if faulty & (1 << g) != 0 && g % 3 == 0 {
                    b = b.unhealthy(g);
                }
            }
            let mut v = b.build();
            v.used.gpus = (0..gpus).filter(|g| used & (1 << g) != 0).collect();
            v.used.cpus = cpus * cpu_pct / 100;
            // Half of what is held is in cpusets (the lowest ids), half a count.
            v.used.cpu_ids = (0..v.used.cpus / 2).collect();
            v.used.memory_mb = v.inventory.memory_mb * mem_pct / 100;
            v
        })
}

/// Sometimes a placement: a GPU type, features, a node list, a topology level.
fn arb_placement() -> impl Strategy<Value = Placement> {
    (
        prop_oneof![4 => Just(None), 1 => Just(Some("h100")), 1 => Just(Some("A100"))],
        0u8..4,
        prop::option::of(prop::collection::vec(0usize..6, 1..4)),
        prop_oneof![4 => Just(None), 1 => Just(Some(TopologyRequirement::Leaf)), 1 => Just(Some(TopologyRequirement::Spine))],
    )
        .prop_map(|(gpu_type, features, list, topology)| Placement {
            gpu_type: gpu_type.map(str::to_string),
            features: [(1, "ib"), (2, "nvme")]
                .iter()
                .filter(|(bit, _)| features & bit != 0)
                .map(|(_, f)| f.to_string())
                .collect(),
            nodelist: list
                .clone()
                .filter(|_| features != 3)
                .unwrap_or_default()
                .into_iter()
                .map(|i| format!("n{i}"))
                .collect(),
            exclude: list
                .filter(|_| features == 3)
                .unwrap_or_default()
                .into_iter()
                .map(|i| format!("n{i}"))
                .collect(),
            topology,
            ..Placement::default()
        })
}

fn arb_job(id: u64) -> impl Strategy<Value = PendingJob> {
    (
        prop_oneof![4 => Just(1u32), 1 => 2u32..=3],
        prop_oneof![2 => Just(0u32), 4 => 1u32..=4, 1 => 5u32..=9],
        1u32..=4,
        1u32..=16,
        prop::option::of(1u64..=48),
        -1i64..=1,
        0u64..5,
        (
            prop_oneof![5 => Just(None), 1 => (1u32..=16).prop_map(Some)],
            arb_placement(),
        ),
    )
        .prop_map(
            move |(nodes, gpus, tasks, cpus, mem_gb, prio, submit, (total, placement))| {
                let mut j = job(id)
                    .nodes(nodes)
                    .gpus(gpus)
                    .tasks(tasks)
                    .cpus(cpus)
                    .prio(prio)
                    .submit(submit);
                if let Some(gb) = mem_gb {
                    j = j.mem_gb(gb);
                }
                let mut j = j.build();
                // `nodes` and `gpus_per_node` stay as drawn: a `--gpus` job's
                // shape is the pass's, whatever they say.
                j.total_gpus = total;
                j.placement = placement;
                j
            },
        )
}

fn arb_view() -> impl Strategy<Value = ClusterView> {
    let nodes = (0usize..=5).prop_flat_map(|n| (0..n).map(arb_node).collect::<Vec<_>>());
    let jobs = (0u64..=10).prop_flat_map(|n| (1..=n).map(arb_job).collect::<Vec<_>>());
    (nodes, jobs).prop_map(|(nodes, pending)| ClusterView {
        nodes,
        pending,
        ..Default::default()
    })
}

proptest! {
    #[test]
    fn plans_are_sound(view in arb_view(), now in 0u64..1_000_000) {
        let plan = plan(&view, now);
        // Exactly once each, re-validates in order (no GPU, CPU or memory
        // oversubscribed, only up nodes and healthy GPUs), FIFO.
        assert_sound(&view, &plan, now);
        // And the same plan whatever the input order.
        let mut flipped = view.clone();
        flipped.nodes.reverse();
        flipped.pending.reverse();
        prop_assert_eq!(&plan, &super::plan(&flipped, now));
    }

    #[test]
    fn unsatisfiable_means_an_empty_cluster_could_not_run_it(view in arb_view()) {
        let plan = plan(&view, 0);
        let mut empty = view.clone();
        for n in &mut empty.nodes {
            n.used = Usage::default();
        }
        for job in &view.pending {
            empty.pending = vec![job.clone()];
            let alone = super::plan(&empty, 0);
            let unsat = matches!(
                plan.pending.iter().find(|p| p.0 == job.id),
                Some((_, PendingReason::Unsatisfiable(_)))
            );
            prop_assert_eq!(alone.allocations.is_empty(), unsat, "job {:?}", job);
        }
    }

    #[test]
    fn pick_gpus_finds_a_closest_set(
        n in 2u32..=8,
        seed in prop::collection::vec(0usize..LINKS.len(), 28),
        free_mask in any::<u8>(),
        want in 0u32..=8,
    ) {
        let mut inv = node("a").gpus(n, Topo::NvSwitch).build().inventory;
        // A random symmetric link matrix.
        let mut k = 0;
        for i in 0..n as usize {
            for j in i + 1..n as usize {
                let l = LINKS[seed[k]];
                inv.gpu_links[i][j] = l;
                inv.gpu_links[j][i] = l;
                k += 1;
            }
        }
        let free: BTreeSet<u32> = (0..n).filter(|g| free_mask & (1 << g) != 0).collect();
        let got = pick_gpus(&inv, &free, want);
        if (want as usize) > free.len() {
            prop_assert_eq!(got, None);
            return Ok(());
        }
        let got = got.expect("enough free GPUs");
        prop_assert_eq!(got.len(), want as usize);
        prop_assert!(got.windows(2).all(|w| w[0] < w[1]), "sorted, distinct");
        prop_assert!(got.iter().all(|g| free.contains(g)));
        // Brute force over every subset: no set has a closer farthest pair.
        let free: Vec<u32> = free.into_iter().collect();
        let best = (0u32..1 << free.len())
            .filter(|m| m.count_ones() == want)
            .map(|m| {
                let set: Vec<u32> = (0..free.len()).filter(|i| m & (1 << i) != 0).map(|i| free[i]).collect();
                crate::sched::gpus::spread_for_tests(&inv, &set).0
            })
            .min()
            .unwrap_or(0);
        prop_assert_eq!(crate::sched::gpus::spread_for_tests(&inv, &got).0, best);
        // The greedy fallback is valid too, if not always optimal.
        if want < 2 {
            return Ok(());
        }
        let greedy = crate::sched::gpus::greedy_for_tests(&inv, &free, want as usize);
        prop_assert_eq!(greedy.len(), want as usize);
        prop_assert!(greedy.iter().all(|g| free.contains(g)));
    }
}
