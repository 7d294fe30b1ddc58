//! MIG slices: a profile's instances are GPUs only to jobs asking for that
//! profile, a whole-GPU job never gets one, partitioned GPUs fill up before
//! a fresh one is broken into, and what no node has is refused naming what
//! there is.

use super::*;
use crate::model::{MigLayout, MigSlice};
use crate::sched::feasible;

/// `b` with its GPU `i` partitioned as `layouts[i]` (`None`: whole): whole
/// GPUs keep their index, instances are numbered from the GPU count on, as
/// agents report them.
fn mig(mut b: NodeBuilder, layouts: &[Option<&str>]) -> NodeBuilder {
    let physical = std::mem::take(&mut b.view.inventory.gpus);
    let mut next = physical.len() as u32;
    let mut slices = Vec::new();
    for g in &physical {
        match layouts.get(g.index as usize).copied().flatten() {
            None => b.view.inventory.gpus.push(g.clone()),
            Some(text) => {
                for (p, at) in MigLayout::parse(text).unwrap().placed() {
                    slices.push(GpuInfo {
                        index: next,
                        uuid: format!("MIG-{}-{next}", g.index),
                        memory_mb: p.memory_mb,
                        mig: Some(MigSlice {
                            profile: p.name.into(),
                            parent: g.index,
                            compute_slices: p.compute_slices,
                            placement: at,
                            slots: 0,
                        }),
                        ..g.clone()
                    });
                    next += 1;
                }
            }
        }
    }
    b.view.inventory.gpus.extend(slices);
    b
}

/// Every GPU of `b` partitioned as `layout`.
fn mig_all(b: NodeBuilder, layout: &str) -> NodeBuilder {
    let n = b.view.inventory.gpus.len();
    mig(b, &vec![Some(layout); n])
}

fn slice(j: JobBuilder, profile: &str) -> JobBuilder {
    let mut j = j.gpus(1);
    j.job.placement.gpu_slice = Some(profile.into());
    j
}

fn slices(j: JobBuilder, profile: &str, n: u32) -> JobBuilder {
    slice(j, profile).gpus(n)
}

const SEVEN: &str = "1g.10gb:7";

fn cases() -> Vec<Case> {
    use Expect::{On, Unsatisfiable, Waits};
    vec![
        Case {
            name: "seven 1g.10gb jobs share one partitioned GPU, an eighth waits, \
                   a whole-GPU job takes a whole GPU",
            scenario: Scenario::new([mig(dgx("a"), &[Some(SEVEN)])]).pending([
                job(1).gpus(1),
                slice(job(2), "1g.10gb"),
                slice(job(3), "1g.10gb"),
                slice(job(4), "1g.10gb"),
                slice(job(5), "1g.10gb"),
                slice(job(6), "1g.10gb"),
                slice(job(7), "1g.10gb"),
                slice(job(8), "1g.10gb"),
                slice(job(9), "1g.10gb"),
            ]),
            expect: vec![
                (2, On(&[("a", &[8])])),
                (3, On(&[("a", &[9])])),
                (8, On(&[("a", &[14])])),
                (9, Waits(PendingReason::Resources)),
            ],
        },
        Case {
            name: "a slice goes to the GPU with slices in use before a fresh one",
            scenario: Scenario::new([mig_all(node("a").gpus(2, Topo::NvSwitch), SEVEN)])
                .running(held(90, "a", &[9, 10]))
                .pending([slice(job(1), "1g.10gb"), slices(job(2), "1g.10gb", 2)]),
            // GPU 0's slices are 2..8, GPU 1's 9..15.
            expect: vec![(1, On(&[("a", &[11])])), (2, On(&[("a", &[12, 13])]))],
        },
        Case {
            name: "of two nodes, a slice goes to the one with fewer slices free",
            scenario: Scenario::new([
                mig_all(node("a").gpus(1, Topo::NvSwitch), SEVEN),
                mig_all(node("b").gpus(1, Topo::NvSwitch), SEVEN),
            ])
            .running(held(90, "b", &[1, 2, 3]))
            .pending([slice(job(1), "1g.10gb")]),
            expect: vec![(1, On(&[("b", &[4])]))],
        },
        Case {
            name: "a profile's instances only: 3g.40gb on a mixed layout",
            scenario: Scenario::new([mig_all(
                node("a").gpus(1, Topo::NvSwitch),
                "3g.40gb,2g.20gb,1g.10gb:2",
            )])
            .pending([slice(job(1), "3g.40gb"), slice(job(2), "3g.40gb")]),
            // Instances: 1 = 3g.40gb, 2 = 2g.20gb, 3 and 4 = 1g.10gb.
            expect: vec![
                (1, On(&[("a", &[1])])),
                (2, Waits(PendingReason::Resources)),
            ],
        },
        Case {
            name: "whole GPUs on a cluster where every GPU is partitioned are unsatisfiable",
            scenario: Scenario::new([mig_all(dgx("a"), SEVEN)]).pending([job(1).gpus(1)]),
            expect: vec![(
                1,
                Unsatisfiable(
                    "asks for whole GPUs; every GPU of the nodes is partitioned into MIG \
                     slices (1g.10gb); ask for a slice instead, e.g. --gpus-per-node 1g.10gb:1",
                ),
            )],
        },
        Case {
            name: "a profile no up node has is unsatisfiable and names what there is",
            scenario: Scenario::new([mig(dgx("a"), &[Some("3g.40gb:2")]), dgx("b")])
                .pending([slice(job(1), "1g.10gb"), slice(job(2), "3g.40gb")]),
            expect: vec![
                (
                    1,
                    Unsatisfiable(
                        "no up node has MIG slices of profile 1g.10gb; the up nodes have: 3g.40gb",
                    ),
                ),
                (2, On(&[("a", &[8])])),
            ],
        },
        Case {
            name: "more slices per node than any node has",
            scenario: Scenario::new([mig(dgx("a"), &[Some(SEVEN)])]).pending([slices(
                job(1),
                "1g.10gb",
                8,
            )]),
            expect: vec![(
                1,
                Unsatisfiable("asks for 8 GPUs per node; the largest matching up node has 7"),
            )],
        },
        Case {
            name: "a CPU-only job runs beside slices",
            scenario: Scenario::new([mig_all(dgx("a"), SEVEN)]).pending([job(1).cpus(4)]),
            expect: vec![(1, On(&[("a", &[])]))],
        },
    ]
}

#[test]
fn mig_table() {
    run_table(cases());
}

#[test]
fn exclusive_slice_job_takes_every_instance_of_its_profile_only() {
    let s = Scenario::new([mig(node("a").gpus(2, Topo::NvSwitch), &[Some("3g.40gb:2")])])
        .pending([slice(job(1), "3g.40gb").exclusive()]);
    let out = s.run();
    // GPU 1 is whole (index 1); GPU 0's instances are 2 and 3.
    assert_eq!(out.placement(1), Some(vec![("a".to_string(), vec![2, 3])]));
}

#[test]
fn apply_refuses_an_allocation_of_the_wrong_kind() {
    let nodes = vec![mig(dgx("a"), &[Some(SEVEN)]).build()];
    let whole = job(1).gpus(1).build();
    let err = check_allocation(&nodes, &held(1, "a", &[8]), &whole).unwrap_err();
    assert!(
        err.contains("GPU 8 on node a is a 1g.10gb MIG slice; job 1 asks for whole GPUs"),
        "{err}"
    );
    let sliced = slice(job(2), "1g.10gb").build();
    let err = check_allocation(&nodes, &held(2, "a", &[1]), &sliced).unwrap_err();
    assert!(
        err.contains("is a whole GPU; job 2 asks for 1g.10gb MIG slices"),
        "{err}"
    );
    assert!(check_allocation(&nodes, &held(2, "a", &[8]), &sliced).is_ok());
}

/// A case name, the cluster, the job and what `feasible` should say.
type Row<'a> = (
    &'a str,
    &'a [NodeInventory],
    JobBuilder,
    Result<(), &'a str>,
);

#[test]
fn feasible_at_submit_names_the_profiles_the_cluster_has() {
    let cluster: Vec<NodeInventory> = [mig(dgx("n1"), &[Some("3g.40gb:2")]), dgx("n2")]
        .into_iter()
        .map(|n| n.build().inventory)
        .collect();
    let plain: Vec<NodeInventory> = vec![dgx("n1").build().inventory];
    let rows: Vec<Row> =
        vec![
        ("a profile some node has", &cluster, slice(job(1), "3g.40gb"), Ok(())),
        ("whole GPUs beside partitioned ones", &cluster, job(1).gpus(8), Ok(())),
        (
            "a profile no node has",
            &cluster,
            slice(job(1), "1g.10gb"),
            Err("no node has MIG slices of profile 1g.10gb; the cluster has: 3g.40gb"),
        ),
        (
            "a profile on a cluster with no partitioned GPU",
            &plain,
            slice(job(1), "1g.10gb"),
            Err("no node has MIG slices of profile 1g.10gb; no GPU of the cluster is partitioned"),
        ),
        (
            "more instances than a node has",
            &cluster,
            slices(job(1), "3g.40gb", 3),
            Err("asks for 3 GPUs per node; the largest matching node has 2"),
        ),
    ];
    let mut failures = Vec::new();
    for (name, nodes, j, want) in rows {
        let got = feasible(nodes.iter(), &j.build());
        let ok = match (&got, want) {
            (Ok(()), Ok(())) => true,
            (Err(e), Err(w)) => e.contains(w),
            _ => false,
        };
        if !ok {
            failures.push(format!("{name}: expected {want:?}, got {got:?}"));
        }
    }
    assert!(failures.is_empty(), "\n{}", failures.join("\n"));
}
