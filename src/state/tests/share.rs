//! Time-shared GPUs in the state: `gpuq node share` replaces a node's whole
//! GPUs by slots, keeps them across the agent's reports, refuses busy
//! nodes and MIG GPUs, and fair-share charges a slot 1 / its slots.

use super::run::{alloc, cluster, ev, inventory, spec};
use crate::model::{share, TaskEnd, TaskEventKind};
use crate::state::*;

fn share_cmd(s: &mut State, d: &mut Dirty, node: &str, slots: Option<u8>) -> CommandResult {
    s.apply(
        &Command::SetShare {
            node: node.into(),
            slots,
            now: 3,
        },
        d,
    )
}

#[test]
fn sharing_replaces_whole_gpus_by_slots_and_survives_the_agents_reports() {
    let (mut s, mut d) = cluster();
    assert_eq!(
        share_cmd(&mut s, &mut d, "n1", Some(4)),
        CommandResult::NodeUpdated
    );
    let gpus = &s.nodes["n1"].inventory.gpus;
    assert_eq!(gpus.len(), 32);
    assert!(gpus.iter().all(|g| share::slots_of(g) == Some(4)));
    assert_eq!(s.nodes["n1"].inventory.slice_summary(), "8x shared/4");
    assert_eq!(s.nodes["n1"].gpu_shared, Some(4));
    // The agent re-registers with its whole GPUs: they are shared again.
    s.apply(
        &Command::RegisterNode {
            inventory: inventory("n1", 8),
            addr: "10.1.0.1:7421".into(),
            preflight: false,
            now: 4,
            cert_sha256: String::new(),
        },
        &mut d,
    );
    assert_eq!(s.nodes["n1"].inventory.gpus.len(), 32);
    // A GPU fault reported on the whole GPU reaches its four slots.
    let mut report = inventory("n1", 8).gpus;
    report[2].healthy = false;
    report[2].fault = Some("Xid 79".into());
    s.apply(
        &Command::GpuHealth {
            node: "n1".into(),
            gpus: report,
            now: 5,
        },
        &mut d,
    );
    let sick: Vec<u32> = s.nodes["n1"]
        .inventory
        .gpus
        .iter()
        .filter(|g| !g.healthy)
        .map(|g| g.physical_index())
        .collect();
    assert_eq!(sick, [2, 2, 2, 2]);
    // Off: the whole GPUs are back, and stay so.
    share_cmd(&mut s, &mut d, "n1", None);
    assert_eq!(s.nodes["n1"].inventory.gpus.len(), 8);
    assert!(s.nodes["n1"].inventory.gpus.iter().all(|g| g.mig.is_none()));
    assert_eq!(s.nodes["n1"].gpu_shared, None);
}

#[test]
fn busy_nodes_mig_gpus_and_bad_counts_are_refused_with_nothing_changed() {
    let (mut s, mut d) = cluster();
    let refused = |r: CommandResult, want: &str| match r {
        CommandResult::Rejected(Rejection::Mig(why)) => assert!(why.contains(want), "{why}"),
        other => panic!("{other:?}"),
    };
    refused(share_cmd(&mut s, &mut d, "n1", Some(0)), "1 to 64 slots");
    refused(share_cmd(&mut s, &mut d, "n1", Some(65)), "1 to 64 slots");
    let id = super::run::submit(&mut s, &mut d, 1, 1);
    super::run::start(&mut s, &mut d, id, &[("n1", &[3])]);
    refused(
        share_cmd(&mut s, &mut d, "n1", Some(2)),
        &format!("node n1 has jobs on its GPUs ({id}); drain it"),
    );
    assert_eq!(s.nodes["n1"].inventory.gpus.len(), 8);
    assert!(matches!(
        share_cmd(&mut s, &mut d, "n9", Some(2)),
        CommandResult::Rejected(Rejection::NoSuchNode(_))
    ));
}

#[test]
fn fair_share_charges_a_slot_one_over_its_gpus_slots() {
    let (mut s, mut d) = cluster();
    share_cmd(&mut s, &mut d, "n1", Some(4));
    let mut sp = spec(1, 1);
    sp.placement.gpu_slice = Some(share::SHARED.into());
    let id = match s.apply(
        &Command::Submit {
            user: "alice".into(),
            spec: Box::new(sp),
            now: 2,
        },
        &mut d,
    ) {
        CommandResult::Submitted { id } => id,
        other => panic!("{other:?}"),
    };
    let slot = s.nodes["n1"].inventory.gpus[0].index;
    s.apply(
        &Command::Schedule {
            allocations: vec![alloc(id.0, &[("n1", &[slot])])],
            now: 5,
        },
        &mut d,
    );
    s.apply(
        &Command::TaskEvents {
            node: "n1".into(),
            events: vec![
                ev(id, 0, TaskEventKind::Started),
                ev(id, 0, TaskEventKind::Ended(TaskEnd::Completed)),
            ],
            now: 40_005,
            gpu_use: Vec::new(),
        },
        &mut d,
    );
    assert_eq!(s.jobs[&id].state, crate::model::JobState::Completed);
    assert_eq!(s.usage["default"]["alice"].total_gpu_ms, 10_000);
    // The accounting record charges the same quarter GPU: 40 s of 1/4.
    let rec = crate::model::acct::AcctRecord::from_job(&s.jobs[&id]);
    assert_eq!(rec.gpus, 1);
    assert!(
        (rec.gpu_hours - 10.0 / 3600.0).abs() < 1e-12,
        "{}",
        rec.gpu_hours
    );
    // Sharing the node another way later leaves the record as it ran.
    share_cmd(&mut s, &mut d, "n1", Some(2));
    let again = crate::model::acct::AcctRecord::from_job(&s.jobs[&id]);
    assert_eq!(again.gpu_hours, rec.gpu_hours);
}
