//! Constraints: `--gpu-type`, `--constraint`, `--nodelist`, `--exclude`, in a
//! pass and at submit.

use super::*;
use crate::model::TopologyRequirement::Leaf;
use crate::sched::feasible;

const A100: &str = "NVIDIA A100-SXM4-80GB";

fn cases() -> Vec<Case> {
    use Expect::{Nodes, Unsatisfiable};
    vec![
        Case {
            name: "--gpu-type matches a part of the model name, in any case",
            scenario: Scenario::new([dgx("a"), dgx("b").model(A100)])
                .running(held(90, "a", &[0]))
                .pending([
                    job(1).gpus(1).gpu_type("a100"),
                    job(2).gpus(1).gpu_type("H100"),
                    job(3).gpus(1).gpu_type("80GB"),
                ]),
            expect: vec![
                (1, Nodes(&["b"])),
                (2, Nodes(&["a"])),
                (3, Nodes(&["a"])),
            ],
        },
        Case {
            name: "--constraint needs every feature, over best fit",
            scenario: Scenario::new([
                dgx("a").features(&["ib"]),
                dgx("b").features(&["nvme", "ib"]),
            ])
            .running(held(90, "a", &[0, 1, 2]))
            .pending([job(1).gpus(1).constraint(&["ib", "nvme"])]),
            expect: vec![(1, Nodes(&["b"]))],
        },
        Case {
            name: "--nodelist and --exclude narrow the candidates",
            scenario: Scenario::new([dgx("a"), dgx("b"), dgx("c")])
                .running(held(90, "a", &[0, 1, 2]))
                .pending([
                    job(1).gpus(1).nodelist(&["b", "c"]),
                    job(2).gpus(1).exclude(&["a"]),
                    job(3).nodes(2).gpus(1).nodelist(&["a", "c"]),
                ]),
            expect: vec![
                (1, Nodes(&["b"])),
                (2, Nodes(&["b"])),
                (3, Nodes(&["a", "c"])),
            ],
        },
        Case {
            name: "a GPU type no up node has is unsatisfiable and names what there is",
            scenario: Scenario::new([dgx("a"), dgx("b").model(A100).down()])
                .pending([job(1).gpus(1).gpu_type("a100"), job(2).gpus(1)]),
            expect: vec![
                (
                    1,
                    Unsatisfiable(
                        "no up node has GPUs of type a100; the up nodes have: NVIDIA H100 80GB HBM3",
                    ),
                ),
                (2, Nodes(&["a"])),
            ],
        },
        Case {
            name: "too few matching nodes says matching",
            scenario: Scenario::new([
                dgx("a").features(&["ib"]),
                dgx("b").features(&["ib"]),
                dgx("c"),
            ])
            .pending([job(1).nodes(3).gpus(1).constraint(&["ib"])]),
            expect: vec![(1, Unsatisfiable("asks for 3 nodes; 2 matching nodes are up"))],
        },
        Case {
            name: "constraints and topology together",
            scenario: Scenario::new([
                dgx("a1").topo("s/l1").features(&["ib"]),
                dgx("a2").topo("s/l1"),
                dgx("b1").topo("s/l2").features(&["ib"]),
                dgx("b2").topo("s/l2").features(&["ib"]),
            ])
            .pending([job(1).nodes(2).gpus(8).constraint(&["ib"]).topology(Leaf)]),
            expect: vec![(1, Nodes(&["b1", "b2"]))],
        },
    ]
}

#[test]
fn constraints_table() {
    run_table(cases());
}

#[test]
fn feasible_refuses_what_no_node_could_satisfy_and_names_it() {
    let cluster: Vec<NodeInventory> = [
        dgx("n1").features(&["ib", "nvme"]),
        dgx("n2").features(&["ib"]),
        dgx("n3"),
        node("n4").gpus(4, Topo::Pcie).model("NVIDIA L40S"),
    ]
    .into_iter()
    .map(|n| n.build().inventory)
    .collect();
    let rows: Vec<(&str, JobBuilder, Result<(), &str>)> = vec![
        ("a type some node has", job(1).gpus(8).gpu_type("h100"), Ok(())),
        (
            "a type no node has",
            job(1).gpus(1).gpu_type("a100"),
            Err("no node has GPUs of type a100; the cluster has: NVIDIA H100 80GB HBM3, NVIDIA L40S"),
        ),
        ("features one node has", job(1).constraint(&["ib", "nvme"]), Ok(())),
        ("a feature no node has", job(1).constraint(&["ib", "gds"]), Err("no node has feature gds")),
        (
            "features no node has",
            job(1).constraint(&["x", "ib", "y"]),
            Err("no node has features x, y"),
        ),
        (
            "each exists, never together",
            job(1).gpus(1).gpu_type("l40s").constraint(&["ib"]),
            Err("no node matches all of --gpu-type l40s, --constraint ib"),
        ),
        (
            "a node list with a name not in the cluster",
            job(1).nodelist(&["n1", "n9"]),
            Err("--nodelist names n9, which is not in the cluster"),
        ),
        (
            "a node list with names not in the cluster",
            job(1).nodelist(&["n10", "n1", "n9"]),
            Err("--nodelist names n10, n9, which are not in the cluster"),
        ),
        (
            "too few matching nodes",
            job(1).nodes(3).gpus(1).constraint(&["ib"]),
            Err("asks for 3 nodes; the cluster has 2 matching nodes"),
        ),
        (
            "the shape on the matching nodes",
            job(1).gpus(8).nodelist(&["n4"]),
            Err("asks for 8 GPUs per node; the largest matching node has 4"),
        ),
        (
            "an excluded node is not counted",
            job(1).nodes(3).gpus(8).exclude(&["n9", "n2"]),
            Err("asks for 3 nodes with 8 GPUs; the cluster has 2 such matching nodes"),
        ),
        ("--gpus 16: two whole nodes", job(1).total(16), Ok(())),
        ("--gpus 12: three whole 4-GPU nodes' worth", job(1).total(12), Ok(())),
        (
            "--gpus 13",
            job(1).total(13),
            Err(
                "asks for 13 GPUs in total (--gpus), which fit on no single node (the largest \
                 node has 8) and fill no whole nodes of 8 or 4 GPUs; give the shape with --nodes \
                 and --gpus-per-node",
            ),
        ),
        (
            "--gpus 40",
            job(1).total(40),
            Err("--gpus 40 as 5 nodes × 8 GPUs: asks for 5 nodes; the cluster has 4"),
        ),
        (
            "--topology leaf without paths",
            job(1).nodes(2).gpus(8).topology(Leaf),
            Err(
                "asks for 2 nodes under one leaf (--topology leaf); the largest leaf has 1 such \
                 node (a node without a topology path is a domain of its own)",
            ),
        ),
    ];
    let mut failures = Vec::new();
    for (name, j, want) in rows {
        let got = feasible(&cluster, &j.build());
        if got.as_ref().map_err(String::as_str) != want.as_ref().map_err(|e| *e) {
            failures.push(format!("{name}: expected {want:?}, got {got:?}"));
        }
    }
    assert!(failures.is_empty(), "\n{}", failures.join("\n"));
}

#[test]
fn check_allocation_refuses_a_node_the_placement_rules_out() {
    let nodes: Vec<NodeView> = [dgx("a").features(&["ib"]), dgx("b").model(A100)]
        .into_iter()
        .map(NodeBuilder::build)
        .collect();
    let on = |node: &str| Allocation {
        job: JobId(1),
        nodes: vec![NodeAllocation {
            node: node.into(),
            gpus: vec![0],
            cpus: Vec::new(),
            cpu_count: 1,
            memory_mb: 1024,
        }],
    };
    let rows: Vec<(JobBuilder, &str, Result<(), &str>)> = vec![
        (
            job(1).gpus(1).gpu_type("a100"),
            "a",
            Err("node a has no GPUs of type a100"),
        ),
        (job(1).gpus(1).gpu_type("a100"), "b", Ok(())),
        (
            job(1).gpus(1).constraint(&["ib"]),
            "b",
            Err("node b lacks feature ib"),
        ),
        (
            job(1).gpus(1).nodelist(&["a"]),
            "b",
            Err("node b is not in the job's --nodelist"),
        ),
        (
            job(1).gpus(1).exclude(&["a"]),
            "a",
            Err("node a is in the job's --exclude"),
        ),
    ];
    for (j, node, want) in rows {
        let got = check_allocation(&nodes, &on(node), &j.build());
        assert_eq!(
            got.as_ref().map_err(String::as_str),
            want.map(|_| &()),
            "{node}"
        );
    }
}
