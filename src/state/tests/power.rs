//! Node groups and their nodes' power states through the state machine:
//! groups validated whole, nodes asked for becoming up when they register,
//! given up on, suspended (drained) and up again on their next register.

use super::run::{cluster, inventory};
use crate::model::policy_change::NodeGroupPatch;
use crate::model::{PowerChange, PowerState};
use crate::state::*;

fn admin(s: &mut State, op: Op, name: &str, patch: NodeGroupPatch) -> CommandResult {
    s.apply(
        &Command::Policy {
            change: PolicyChange::NodeGroup {
                op,
                name: name.into(),
                patch,
            },
            by: "root".into(),
            now: 1,
        },
        &mut Dirty::default(),
    )
}

fn burst() -> NodeGroupPatch {
    NodeGroupPatch {
        gpus: Some(8),
        cpus: Some(64),
        memory_mb: Some(512 * 1024),
        max: Some(4),
        resume_command: Some("/bin/true".into()),
        suspend_command: Some("/bin/true".into()),
        ..Default::default()
    }
}

fn power(s: &mut State, change: PowerChange, now: u64) -> CommandResult {
    s.apply(
        &Command::Power {
            changes: vec![change],
            now,
        },
        &mut Dirty::default(),
    )
}

fn register(s: &mut State, name: &str, now: u64) {
    let r = s.apply(
        &Command::RegisterNode {
            inventory: inventory(name, 8),
            addr: "10.2.0.1:7421".into(),
            preflight: false,
            now,
            cert_sha256: String::new(),
        },
        &mut Dirty::default(),
    );
    assert_eq!(r, CommandResult::NodeRegistered);
}

fn refused(r: &CommandResult, text: &str) {
    assert!(
        matches!(r, CommandResult::Rejected(Rejection::Policy(m)) if m.contains(text)),
        "expected a refusal with {text:?}, got {r:?}"
    );
}

#[test]
fn bad_groups_are_refused_and_change_nothing() {
    let (mut s, _) = cluster();
    let before = s.policy.clone();
    let cases = [
        (
            NodeGroupPatch {
                resume_command: None,
                ..burst()
            },
            "--resume-command",
        ),
        (
            NodeGroupPatch {
                resume_command: Some(" ".into()),
                ..burst()
            },
            "--resume-command is empty",
        ),
        (
            NodeGroupPatch {
                max: None,
                ..burst()
            },
            "--max",
        ),
        (
            NodeGroupPatch {
                max: Some(0),
                ..burst()
            },
            "--max 0 is out of range",
        ),
        (
            NodeGroupPatch {
                min: Some(5),
                ..burst()
            },
            "--min 5 is over --max 4",
        ),
        (
            NodeGroupPatch {
                gpus: None,
                ..burst()
            },
            "--gpus",
        ),
        (
            NodeGroupPatch {
                cpus: Some(0),
                ..burst()
            },
            "must be positive",
        ),
    ];
    for (patch, text) in cases {
        refused(&admin(&mut s, Op::Add, "burst", patch), text);
        assert_eq!(s.policy, before, "{text}");
    }
    refused(
        &admin(&mut s, Op::Modify, "burst", burst()),
        "does not exist",
    );
    // n1 and n2 exist outside any group: a group "n" would not name them,
    // but one whose names collide is refused.
    assert!(matches!(
        admin(&mut s, Op::Add, "burst", burst()),
        CommandResult::PolicyUpdated { .. }
    ));
    refused(&admin(&mut s, Op::Add, "burst", burst()), "already exists");
}

#[test]
fn a_node_asked_for_is_up_when_it_registers_and_drained_while_suspended() {
    let (mut s, _) = cluster();
    admin(&mut s, Op::Add, "burst", burst());
    let r = power(
        &mut s,
        PowerChange::Resume {
            group: "burst".into(),
            nodes: vec![
                "burst-001".into(),
                "burst-002".into(),
                "burst-009".into(),
                "n1".into(),
            ],
        },
        10,
    );
    // Names the group does not own are ignored.
    assert_eq!(
        r,
        CommandResult::PowerChanged {
            nodes: vec!["burst-001".into(), "burst-002".into()]
        }
    );
    assert_eq!(s.power["burst-001"].state, PowerState::Resuming);
    // Asking again for a node on its way changes nothing.
    let again = power(
        &mut s,
        PowerChange::Resume {
            group: "burst".into(),
            nodes: vec!["burst-001".into()],
        },
        11,
    );
    assert_eq!(again, CommandResult::PowerChanged { nodes: vec![] });

    register(&mut s, "burst-001", 20);
    assert_eq!(s.power["burst-001"].state, PowerState::Up);
    assert!(matches!(s.nodes["burst-001"].status, NodeStatus::Up));

    // burst-002 never came: failed, and may be asked for again.
    let fail = |s: &mut State, now| {
        power(
            s,
            PowerChange::Failed {
                nodes: vec!["burst-002".into()],
                why: "late".into(),
            },
            now,
        )
    };
    fail(&mut s, 30);
    assert_eq!(s.power["burst-002"].state, PowerState::Failed);
    power(
        &mut s,
        PowerChange::Resume {
            group: "burst".into(),
            nodes: vec!["burst-002".into()],
        },
        31,
    );
    assert_eq!(s.power["burst-002"].state, PowerState::Resuming);
    fail(&mut s, 32);

    // Removing a group with a node up is refused.
    refused(
        &admin(&mut s, Op::Remove, "burst", NodeGroupPatch::default()),
        "burst-001",
    );

    power(
        &mut s,
        PowerChange::Suspend {
            nodes: vec!["burst-001".into()],
        },
        40,
    );
    assert_eq!(s.power["burst-001"].state, PowerState::Suspending);
    assert!(matches!(
        s.nodes["burst-001"].status,
        NodeStatus::Drained {
            by: DrainSource::Power,
            ..
        }
    ));
    power(
        &mut s,
        PowerChange::Suspended {
            nodes: vec!["burst-001".into()],
        },
        50,
    );
    assert_eq!(s.power["burst-001"].state, PowerState::Suspended);

    // Asked for again, it registers: up, and the drain is lifted.
    power(
        &mut s,
        PowerChange::Resume {
            group: "burst".into(),
            nodes: vec!["burst-001".into()],
        },
        60,
    );
    assert_eq!(s.power["burst-001"].state, PowerState::Resuming);
    register(&mut s, "burst-001", 70);
    assert_eq!(s.power["burst-001"].state, PowerState::Up);
    assert!(matches!(s.nodes["burst-001"].status, NodeStatus::Up));
}

#[test]
fn an_admin_drain_survives_a_group_node_s_register() {
    let (mut s, _) = cluster();
    admin(&mut s, Op::Add, "burst", burst());
    power(
        &mut s,
        PowerChange::Resume {
            group: "burst".into(),
            nodes: vec!["burst-001".into()],
        },
        10,
    );
    register(&mut s, "burst-001", 20);
    s.apply(
        &Command::SetDrain {
            node: "burst-001".into(),
            drain: Some("bad DIMM".into()),
            by: DrainSource::Admin,
            user: Some("root".into()),
            requeue_now: false,
            now: 30,
        },
        &mut Dirty::default(),
    );
    register(&mut s, "burst-001", 40);
    assert!(matches!(
        s.nodes["burst-001"].status,
        NodeStatus::Drained {
            by: DrainSource::Admin,
            ..
        }
    ));
}
