//! MIG repartitioning in the state: a target drains the node until the
//! agent reports the layout; a failure or a GPU the profiles do not fit
//! never leaves the node schedulable half-configured.

use super::run::{cluster, inventory};
use crate::model::{GpuInfo, MigLayout, MigSlice};
use crate::state::*;

fn set(s: &mut State, d: &mut Dirty, node: &str, layout: &str) -> CommandResult {
    s.apply(
        &Command::SetMig {
            node: node.into(),
            layout: layout.into(),
            user: Some("root".into()),
            requeue_now: false,
            now: 10,
        },
        d,
    )
}

/// `inventory(name, n)` with every GPU in `layout`'s instances, numbered
/// from `n`, as an agent reports them.
fn partitioned(name: &str, n: u32, layout: &str) -> Vec<GpuInfo> {
    let layout = MigLayout::parse(layout).unwrap();
    let whole = inventory(name, n).gpus;
    let mut next = n;
    let mut out = Vec::new();
    for g in &whole {
        for (p, at) in layout.placed() {
            out.push(GpuInfo {
                index: next,
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
    out
}

#[test]
fn a_target_drains_until_the_gpus_show_it_then_the_node_resumes() {
    let (mut s, mut d) = cluster();
    assert_eq!(
        set(&mut s, &mut d, "n1", "3g.40gb:2"),
        CommandResult::NodeUpdated
    );
    assert!(matches!(
        &s.nodes["n1"].status,
        NodeStatus::Drained { by: DrainSource::Mig, reason, .. } if reason.starts_with("MIG repartition to 3g.40gb:2")
    ));
    assert_eq!(s.mig_to_apply("n1"), Some("3g.40gb:2"));
    // A report of other GPUs (half the GPUs partitioned) changes nothing.
    let mut half = partitioned("n1", 8, "3g.40gb:2");
    half.truncate(8);
    half.extend(inventory("n1", 8).gpus.into_iter().skip(4));
    s.apply(
        &Command::GpuHealth {
            node: "n1".into(),
            gpus: half,
            now: 11,
        },
        &mut d,
    );
    assert_eq!(s.nodes["n1"].status.word(), "drained");
    assert!(s.nodes["n1"].mig_target.is_some());
    // The layout reported: the target is done, the node takes work again.
    s.apply(
        &Command::GpuHealth {
            node: "n1".into(),
            gpus: partitioned("n1", 8, "3g.40gb:2"),
            now: 12,
        },
        &mut d,
    );
    assert_eq!(s.nodes["n1"].status, NodeStatus::Up);
    assert_eq!(s.nodes["n1"].mig_target, None);
    assert_eq!(s.mig_to_apply("n1"), None);
    // Asking for the layout it has is a no-op that drains nothing.
    assert_eq!(
        set(&mut s, &mut d, "n1", "3g.40gb:2"),
        CommandResult::NodeUpdated
    );
    assert_eq!(s.nodes["n1"].status, NodeStatus::Up);
}

#[test]
fn a_failure_keeps_the_node_drained_with_the_reason() {
    let (mut s, mut d) = cluster();
    set(&mut s, &mut d, "n2", "1g.10gb:7");
    s.apply(
        &Command::MigFailed {
            node: "n2".into(),
            error: "NVML: in use".into(),
            now: 12,
        },
        &mut d,
    );
    let n = &s.nodes["n2"];
    assert_eq!(n.mig_target, None);
    assert!(matches!(
        &n.status,
        NodeStatus::Drained { reason, .. }
            if reason.starts_with("MIG repartition to 1g.10gb:7 failed: NVML: in use")
    ));
    assert_eq!(s.mig_to_apply("n2"), None);
}

#[test]
fn layouts_no_gpu_of_the_node_can_hold_are_refused_whole() {
    let (mut s, mut d) = cluster();
    let before = s.nodes["n1"].clone();
    for (layout, want) in [
        ("4g.40gb:2", "needs 8 compute slices"),
        ("1g.7gb:7", "unknown MIG profile"),
        (
            "1g.5gb:7",
            "node n1's GPU 0 is a H100: the H100 80GB has no MIG profile 1g.5gb; it supports \
             1g.10gb, 1g.20gb",
        ),
    ] {
        match set(&mut s, &mut d, "n1", layout) {
            CommandResult::Rejected(Rejection::Mig(why)) => assert!(why.contains(want), "{why}"),
            other => panic!("{layout}: {other:?}"),
        }
    }
    s.nodes.get_mut("n2").unwrap().inventory.gpus[0].model = "NVIDIA L40S".into();
    match set(&mut s, &mut d, "n2", "1g.10gb:7") {
        CommandResult::Rejected(Rejection::Mig(why)) => {
            assert!(
                why.contains("GPU 0 is a NVIDIA L40S, which cannot hold"),
                "{why}"
            )
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(s.nodes["n1"], before);
    assert_eq!(
        set(&mut s, &mut d, "n9", "1g.10gb:7"),
        CommandResult::Rejected(Rejection::NoSuchNode("n9".into()))
    );
}

fn register(s: &mut State, d: &mut Dirty, inventory: crate::model::NodeInventory) {
    let r = s.apply(
        &Command::RegisterNode {
            inventory,
            addr: "10.2.0.1:7421".into(),
            preflight: false,
            now: 20,
            cert_sha256: String::new(),
        },
        d,
    );
    assert_eq!(r, CommandResult::NodeRegistered);
}

fn group(s: &mut State, d: &mut Dirty, op: Op, layout: &str) -> CommandResult {
    use crate::model::policy_change::NodeGroupPatch;
    s.apply(
        &Command::Policy {
            change: PolicyChange::NodeGroup {
                op,
                name: "burst".into(),
                patch: NodeGroupPatch {
                    gpus: Some(2),
                    cpus: Some(64),
                    memory_mb: Some(512 * 1024),
                    max: Some(4),
                    resume_command: Some("/bin/true".into()),
                    mig_layout: Some(layout.into()),
                    ..Default::default()
                },
            },
            by: "root".into(),
            now: 1,
        },
        d,
    )
}

#[test]
fn a_group_node_that_joins_with_other_gpus_is_repartitioned_to_the_groups_layout() {
    let (mut s, mut d) = cluster();
    match group(&mut s, &mut d, Op::Add, "1g.10gb:8") {
        CommandResult::Rejected(why) => assert!(
            why.to_string()
                .contains("--mig-layout 1g.10gb:8: MIG layout \"1g.10gb:8\" does not fit one GPU"),
            "{why}"
        ),
        other => panic!("{other:?}"),
    }
    assert!(s.policy.node_groups.is_empty());
    assert!(matches!(
        group(&mut s, &mut d, Op::Add, "1g.10gb:7"),
        CommandResult::PolicyUpdated { .. }
    ));
    // `modify` changes the layout ("" takes it away).
    for (layout, want) in [
        ("", None),
        ("none", Some("none")),
        ("1g.10gb:7", Some("1g.10gb:7")),
    ] {
        let r = group(&mut s, &mut d, Op::Modify, layout);
        assert!(matches!(r, CommandResult::PolicyUpdated { .. }), "{r:?}");
        assert_eq!(s.policy.node_groups["burst"].mig_layout.as_deref(), want);
    }

    // Whole GPUs join: drained for the repartition, handed to the agent.
    register(&mut s, &mut d, inventory("burst-001", 2));
    assert!(matches!(
        &s.nodes["burst-001"].status,
        NodeStatus::Drained { by: DrainSource::Mig, reason, .. }
            if reason == "MIG repartition to 1g.10gb:7: waiting for its jobs to end"
    ));
    assert_eq!(s.mig_to_apply("burst-001"), Some("1g.10gb:7"));
    // The agent reports the layout: the node takes work.
    s.apply(
        &Command::GpuHealth {
            node: "burst-001".into(),
            gpus: partitioned("burst-001", 2, "1g.10gb:7"),
            now: 21,
        },
        &mut d,
    );
    assert_eq!(s.nodes["burst-001"].status, NodeStatus::Up);
    assert_eq!(s.nodes["burst-001"].mig_target, None);
    // Joining again in the layout changes nothing.
    let in_layout = crate::model::NodeInventory {
        gpus: partitioned("burst-001", 2, "1g.10gb:7"),
        ..inventory("burst-001", 2)
    };
    register(&mut s, &mut d, in_layout);
    assert_eq!(s.nodes["burst-001"].status, NodeStatus::Up);
    assert_eq!(s.mig_to_apply("burst-001"), None);

    // GPUs that cannot hold it: drained, saying why; nothing handed over.
    let mut l40s = inventory("burst-002", 2);
    for g in &mut l40s.gpus {
        g.model = "NVIDIA L40S".into();
    }
    register(&mut s, &mut d, l40s);
    match &s.nodes["burst-002"].status {
        NodeStatus::Drained { reason, .. } => assert!(
            reason.starts_with(
                "node group burst's MIG layout 1g.10gb:7 cannot be applied: node burst-002's \
                 GPU 0 is a NVIDIA L40S, which cannot hold MIG instances"
            ),
            "{reason}"
        ),
        other => panic!("{other:?}"),
    }
    assert_eq!(s.mig_to_apply("burst-002"), None);
    // Nodes outside the group are left alone.
    register(&mut s, &mut d, inventory("n1", 8));
    assert_eq!(s.nodes["n1"].status, NodeStatus::Up);
}
