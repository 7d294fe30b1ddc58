//! Advance reservations through the state machine: each change validated
//! whole against the nodes and the other reservations, nodes picked for
//! `--gpus` the same on every server, and jobs naming one checked at submit.

use super::run::{cluster, spec};
use crate::model::policy_change::ReservationPatch;
use crate::state::*;

const HOUR: u64 = 3_600_000;
const NOW: u64 = 1_000 * HOUR;

fn change(s: &mut State, op: Op, name: &str, patch: ReservationPatch) -> CommandResult {
    s.apply(
        &Command::Policy {
            change: PolicyChange::Reservation {
                op,
                name: name.into(),
                patch,
            },
            by: "root".into(),
            now: NOW,
        },
        &mut Dirty::default(),
    )
}

fn window(nodes: &str, start: u64, hours: u64) -> ReservationPatch {
    ReservationPatch {
        nodes: Some(nodes.into()),
        start: Some(start),
        duration_secs: Some(hours * 3600),
        ..Default::default()
    }
}

fn refused(r: &CommandResult, text: &str) {
    assert!(
        matches!(r, CommandResult::Rejected(Rejection::Policy(m)) if m.contains(text)),
        "expected a refusal with {text:?}, got {r:?}"
    );
}

#[test]
fn a_reservation_is_made_changed_and_deleted() {
    let (mut s, _) = cluster();
    let r = change(
        &mut s,
        Op::Add,
        "maint",
        ReservationPatch {
            maint: Some(true),
            ..window("n1", NOW + HOUR, 2)
        },
    );
    assert!(
        matches!(&r, CommandResult::PolicyUpdated { what } if what.contains("1 node (n1)")),
        "{r:?}"
    );
    let m = &s.policy.reservations["maint"];
    assert_eq!(
        (m.start, m.end, m.maint),
        (NOW + HOUR, NOW + 3 * HOUR, true)
    );
    assert_eq!(m.nodes, vec!["n1".to_string()]);

    // A new start keeps the length.
    change(
        &mut s,
        Op::Modify,
        "maint",
        ReservationPatch {
            start: Some(NOW + 5 * HOUR),
            ..Default::default()
        },
    );
    let m = &s.policy.reservations["maint"];
    assert_eq!((m.start, m.end), (NOW + 5 * HOUR, NOW + 7 * HOUR));

    change(&mut s, Op::Remove, "maint", ReservationPatch::default());
    assert!(s.policy.reservations.is_empty());
    refused(
        &change(&mut s, Op::Remove, "maint", ReservationPatch::default()),
        "does not exist",
    );
}

#[test]
fn bad_reservations_are_refused_and_change_nothing() {
    let (mut s, _) = cluster();
    change(&mut s, Op::Add, "a", window("n1", NOW + HOUR, 2));
    let before = s.policy.clone();
    let cases: Vec<(&str, ReservationPatch, &str)> = vec![
        ("a", window("n2", NOW, 1), "already exists"),
        (
            "b",
            window("n[1-2]", NOW + 2 * HOUR, 1),
            "would overlap reservation a on node n1",
        ),
        (
            "b",
            window("n9", NOW, 1),
            "node n9 (in --nodes) is not a node",
        ),
        ("b", window("n[", NOW, 1), "--nodes"),
        (
            "b",
            window("n2", NOW - 5 * HOUR, 1),
            "would be over already",
        ),
        (
            "b",
            ReservationPatch {
                duration_secs: None,
                ..window("n2", NOW, 1)
            },
            "needs a length",
        ),
        (
            "b",
            ReservationPatch {
                start: None,
                ..window("n2", NOW, 1)
            },
            "needs a start",
        ),
        (
            "b",
            ReservationPatch {
                nodes: None,
                ..window("n2", NOW, 1)
            },
            "needs nodes",
        ),
        (
            "b",
            ReservationPatch {
                duration_secs: Some(0),
                ..window("n2", NOW, 1)
            },
            "must be positive",
        ),
        (
            "b",
            ReservationPatch {
                end: Some(NOW),
                duration_secs: None,
                ..window("n2", NOW + HOUR, 1)
            },
            "before it starts",
        ),
        (
            "b",
            ReservationPatch {
                gpus: Some(8),
                ..window("n2", NOW, 1)
            },
            "not both",
        ),
        (
            "b",
            ReservationPatch {
                accounts: Some(vec!["nope".into()]),
                ..window("n2", NOW, 1)
            },
            "account nope",
        ),
        ("b c", window("n2", NOW, 1), "name"),
        (
            "b",
            ReservationPatch {
                nodes: None,
                gpus: Some(17),
                ..window("", NOW + HOUR, 1)
            },
            "have 8 GPUs",
        ),
    ];
    for (name, patch, text) in cases {
        refused(&change(&mut s, Op::Add, name, patch), text);
        assert_eq!(s.policy, before, "{name}: {text}");
    }
}

#[test]
fn gpus_pick_whole_nodes_clear_of_other_reservations() {
    let (mut s, _) = cluster();
    change(&mut s, Op::Add, "a", window("n1", NOW + HOUR, 2));
    let r = change(
        &mut s,
        Op::Add,
        "b",
        ReservationPatch {
            nodes: None,
            gpus: Some(4),
            ..window("", NOW, 2)
        },
    );
    assert!(matches!(r, CommandResult::PolicyUpdated { .. }), "{r:?}");
    assert_eq!(s.policy.reservations["b"].nodes, vec!["n2".to_string()]);
    // After a's window, both are free: the first by name.
    change(
        &mut s,
        Op::Add,
        "c",
        ReservationPatch {
            nodes: None,
            gpus: Some(9),
            ..window("", NOW + 10 * HOUR, 1)
        },
    );
    assert_eq!(s.policy.reservations["c"].nodes.len(), 2);
}

#[test]
fn jobs_name_reservations_that_exist_and_admit_them() {
    let (mut s, _) = cluster();
    change(
        &mut s,
        Op::Add,
        "team",
        ReservationPatch {
            users: Some(vec!["bob".into()]),
            ..window("n2", NOW + HOUR, 2)
        },
    );
    let submit = |s: &mut State, user: &str, resv: &str| {
        let mut sp = spec(1, 8);
        sp.placement.reservation = Some(resv.into());
        s.apply(
            &Command::Submit {
                user: user.into(),
                spec: Box::new(sp),
                now: NOW,
            },
            &mut Dirty::default(),
        )
    };
    refused(
        &submit(&mut s, "bob", "nope"),
        "reservation \"nope\" does not exist",
    );
    refused(
        &submit(&mut s, "alice", "team"),
        "may not use reservation team",
    );
    assert!(matches!(
        submit(&mut s, "bob", "team"),
        CommandResult::Submitted { .. }
    ));
}

#[test]
fn ended_reservations_are_dropped_by_the_next_change() {
    let (mut s, _) = cluster();
    change(&mut s, Op::Add, "old", window("n1", NOW, 1));
    let later = Command::Policy {
        change: PolicyChange::Reservation {
            op: Op::Add,
            name: "new".into(),
            patch: window("n1", NOW + 3 * HOUR, 1),
        },
        by: "root".into(),
        now: NOW + 2 * HOUR,
    };
    s.apply(&later, &mut Dirty::default());
    assert_eq!(
        s.policy.reservations.keys().collect::<Vec<_>>(),
        vec!["new"]
    );
}
