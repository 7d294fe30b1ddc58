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
        ("1g.5gb:7", "unknown MIG profile"),
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
