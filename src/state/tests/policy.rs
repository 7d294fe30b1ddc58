//! Policy through the state machine: admin changes validated whole,
//! submissions resolved and checked against the policy, usage charged from
//! the leader's timestamps, preemption to requeue with the same id.

use super::run::{cluster, ev, report, spec, start};
use crate::model::policy_change::{AccountPatch, Limit, PartitionPatch, QosPatch};
use crate::model::{PreemptMode, TaskEnd, TaskEventKind};
use crate::sched::Preemption;
use crate::state::*;

fn admin(s: &mut State, change: PolicyChange) -> CommandResult {
    s.apply(
        &Command::Policy {
            change,
            by: "root".into(),
            now: 1,
        },
        &mut Dirty::default(),
    )
}

fn account(op: Op, name: &str, patch: AccountPatch) -> PolicyChange {
    PolicyChange::Account {
        op,
        name: name.into(),
        patch,
    }
}

fn submit_as(s: &mut State, user: &str, spec: crate::model::JobSpec) -> CommandResult {
    s.apply(
        &Command::Submit {
            user: user.into(),
            spec: Box::new(spec),
            now: 2,
        },
        &mut Dirty::default(),
    )
}

fn refused(r: &CommandResult, text: &str) -> bool {
    matches!(r, CommandResult::Rejected(Rejection::Policy(m)) if m.contains(text))
}

#[test]
fn a_fresh_cluster_resolves_the_built_ins() {
    let (mut s, _) = cluster();
    let CommandResult::Submitted { id } = submit_as(&mut s, "alice", spec(1, 1)) else {
        panic!()
    };
    let j = s.job(id).unwrap();
    assert_eq!(j.spec.account.as_deref(), Some("default"));
    assert_eq!(j.spec.qos.as_deref(), Some("normal"));
    assert_eq!(j.spec.partition.as_deref(), Some("default"));
}

#[test]
fn admin_changes_are_validated_whole() {
    let (mut s, _) = cluster();
    let ok = |r: CommandResult| assert!(matches!(r, CommandResult::PolicyUpdated { .. }), "{r:?}");
    ok(admin(
        &mut s,
        account(
            Op::Add,
            "org",
            AccountPatch {
                shares: Some(2),
                ..Default::default()
            },
        ),
    ));
    let child = AccountPatch {
        parent: Some("org".into()),
        add_users: vec!["alice".into()],
        default_for: vec!["alice".into()],
        ..Default::default()
    };
    ok(admin(&mut s, account(Op::Add, "ml", child.clone())));
    let before = s.policy.clone();
    let cases: Vec<(&str, PolicyChange, &str)> = vec![
        ("add twice", account(Op::Add, "ml", child), "already exists"),
        (
            "modify a missing one",
            account(Op::Modify, "nope", AccountPatch::default()),
            "does not exist",
        ),
        (
            "unknown parent",
            account(
                Op::Add,
                "x",
                AccountPatch {
                    parent: Some("ghost".into()),
                    ..Default::default()
                },
            ),
            "parent account ghost does not exist",
        ),
        (
            "a cycle",
            account(
                Op::Modify,
                "org",
                AccountPatch {
                    parent: Some("ml".into()),
                    ..Default::default()
                },
            ),
            "is below org",
        ),
        (
            "remove a parent",
            account(Op::Remove, "org", AccountPatch::default()),
            "child account ml",
        ),
        (
            "remove a built-in",
            account(Op::Remove, "default", AccountPatch::default()),
            "built in",
        ),
        (
            "zero shares",
            account(
                Op::Modify,
                "ml",
                AccountPatch {
                    shares: Some(0),
                    ..Default::default()
                },
            ),
            "at least 1",
        ),
        (
            "guarantee over cap",
            account(
                Op::Modify,
                "ml",
                AccountPatch {
                    max_gpus: Some(Limit::Max(4)),
                    guaranteed_gpus: Some(8),
                    ..Default::default()
                },
            ),
            "over the cap",
        ),
        (
            "default for a non-member",
            account(
                Op::Modify,
                "ml",
                AccountPatch {
                    default_for: vec!["bob".into()],
                    ..Default::default()
                },
            ),
            "bob is not in account ml",
        ),
        (
            "preempts an unknown QoS",
            PolicyChange::Qos {
                op: Op::Add,
                name: "high".into(),
                patch: QosPatch {
                    preempts: Some(vec!["ghost".into()]),
                    ..Default::default()
                },
            },
            "QoS ghost",
        ),
        (
            "a bad host list",
            PolicyChange::Partition {
                op: Op::Add,
                name: "p".into(),
                patch: PartitionPatch {
                    nodes: Some("n[1-".into()),
                    ..Default::default()
                },
            },
            "--nodes",
        ),
    ];
    for (name, change, text) in cases {
        let r = admin(&mut s, change);
        assert!(refused(&r, text), "{name}: {r:?}");
        assert_eq!(
            s.policy, before,
            "{name}: a refused change changed the policy"
        );
    }
    assert_eq!(s.policy.default_account("alice"), "ml");
    // Removing an account with a job in it is refused until the job ends.
    let CommandResult::Submitted { id } = submit_as(&mut s, "alice", spec(1, 1)) else {
        panic!()
    };
    assert_eq!(s.job(id).unwrap().spec.account.as_deref(), Some("ml"));
    let r = admin(&mut s, account(Op::Remove, "ml", AccountPatch::default()));
    assert!(refused(&r, "1 pending or running"), "{r:?}");
}

#[test]
fn submissions_are_checked_against_the_policy() {
    let (mut s, _) = cluster();
    admin(
        &mut s,
        account(
            Op::Add,
            "ml",
            AccountPatch {
                add_users: vec!["alice".into()],
                max_gpus: Some(Limit::Max(8)),
                ..Default::default()
            },
        ),
    );
    admin(
        &mut s,
        PolicyChange::Partition {
            op: Op::Add,
            name: "short".into(),
            patch: PartitionPatch {
                default_time_secs: Some(Limit::Max(600)),
                max_time_secs: Some(Limit::Max(3600)),
                default: Some(true),
                ..Default::default()
            },
        },
    );
    let with = |f: &dyn Fn(&mut crate::model::JobSpec)| {
        let mut sp = spec(1, 1);
        f(&mut sp);
        sp
    };
    let r = submit_as(&mut s, "bob", with(&|sp| sp.account = Some("ml".into())));
    assert!(refused(&r, "user bob is not in account ml"), "{r:?}");
    let r = submit_as(&mut s, "bob", with(&|sp| sp.qos = Some("gold".into())));
    assert!(refused(&r, "QoS \"gold\" does not exist"), "{r:?}");
    let r = submit_as(&mut s, "bob", with(&|sp| sp.partition = Some("x".into())));
    assert!(refused(&r, "partition \"x\" does not exist"), "{r:?}");
    let r = submit_as(&mut s, "bob", with(&|sp| sp.time_limit_secs = Some(7200)));
    assert!(refused(&r, "over partition short's maximum"), "{r:?}");
    let r = submit_as(&mut s, "alice", spec(2, 8));
    assert!(refused(&r, "at most 8 at once"), "{r:?}");
    // The default partition's default time fills in.
    let CommandResult::Submitted { id } = submit_as(&mut s, "bob", spec(1, 1)) else {
        panic!()
    };
    let j = s.job(id).unwrap();
    assert_eq!(j.spec.partition.as_deref(), Some("short"));
    assert_eq!(j.spec.time_limit_secs, Some(600));
}

#[test]
fn a_qos_is_open_only_to_the_accounts_and_users_it_lists() {
    let (mut s, _) = cluster();
    let ok = |r: CommandResult| assert!(matches!(r, CommandResult::PolicyUpdated { .. }), "{r:?}");
    ok(admin(
        &mut s,
        account(
            Op::Add,
            "ml",
            AccountPatch {
                add_users: vec!["alice".into()],
                ..Default::default()
            },
        ),
    ));
    ok(admin(
        &mut s,
        PolicyChange::Qos {
            op: Op::Add,
            name: "urgent".into(),
            patch: QosPatch {
                priority: Some(100),
                allowed_accounts: Some(vec!["ml".into()]),
                allowed_users: Some(vec!["carol".into()]),
                ..Default::default()
            },
        },
    ));
    let urgent = |account: Option<&str>| {
        let mut sp = spec(1, 1);
        sp.qos = Some("urgent".into());
        sp.account = account.map(String::from);
        sp
    };
    // bob's default account is not listed, nor is bob.
    let r = submit_as(&mut s, "bob", urgent(None));
    assert!(refused(&r, "QoS urgent is not open to user bob"), "{r:?}");
    // alice in the listed account; carol by name, from her default account.
    assert!(matches!(
        submit_as(&mut s, "alice", urgent(Some("ml"))),
        CommandResult::Submitted { .. }
    ));
    assert!(matches!(
        submit_as(&mut s, "carol", urgent(None)),
        CommandResult::Submitted { .. }
    ));
    // The same user outside the listed account is refused.
    let r = submit_as(&mut s, "alice", urgent(Some("default")));
    assert!(refused(&r, "in account default"), "{r:?}");
    // A listed account must exist.
    let r = admin(
        &mut s,
        PolicyChange::Qos {
            op: Op::Modify,
            name: "urgent".into(),
            patch: QosPatch {
                allowed_accounts: Some(vec!["nope".into()]),
                ..Default::default()
            },
        },
    );
    assert!(matches!(r, CommandResult::Rejected(_)), "{r:?}");
}

#[test]
fn usage_is_charged_at_the_end_and_decays_by_the_half_life() {
    let (mut s, mut d) = cluster();
    let CommandResult::Submitted { id } = submit_as(&mut s, "alice", spec(1, 4)) else {
        panic!()
    };
    start(&mut s, &mut d, id, &[("n1", &[0, 1, 2, 3])]);
    // Started at 5, ended at 10 (report's `now`): 4 GPUs × 5 ms.
    report(
        &mut s,
        &mut d,
        "n1",
        vec![ev(id, 0, TaskEventKind::Ended(TaskEnd::Completed))],
    );
    let cell = s.usage["default"]["alice"];
    assert_eq!((cell.gpu_ms, cell.at), (20, 10));
    let mut later = cell;
    let hl = s.policy.half_life_secs;
    later.charge(0, 10 + hl * 1000, hl);
    assert_eq!(later.gpu_ms, 10, "one half-life halves it");
    // Apply is deterministic: the same log gives the same usage.
    let (mut t, mut e) = cluster();
    submit_as(&mut t, "alice", spec(1, 4));
    start(&mut t, &mut e, id, &[("n1", &[0, 1, 2, 3])]);
    report(
        &mut t,
        &mut e,
        "n1",
        vec![ev(id, 0, TaskEventKind::Ended(TaskEnd::Completed))],
    );
    assert_eq!(s.usage, t.usage);
}

#[test]
fn a_preempted_job_stops_and_requeues_with_its_id() {
    let (mut s, mut d) = cluster();
    admin(
        &mut s,
        PolicyChange::Qos {
            op: Op::Add,
            name: "high".into(),
            patch: QosPatch {
                preempts: Some(vec!["normal".into()]),
                grace_secs: Some(Limit::Max(30)),
                ..Default::default()
            },
        },
    );
    let CommandResult::Submitted { id: victim } = submit_as(&mut s, "bob", spec(1, 8)) else {
        panic!()
    };
    start(&mut s, &mut d, victim, &[("n1", &[0, 1, 2, 3, 4, 5, 6, 7])]);
    let mut hi = spec(1, 8);
    hi.qos = Some("high".into());
    let CommandResult::Submitted { id: by } = submit_as(&mut s, "alice", hi) else {
        panic!()
    };
    let r = s.apply(
        &Command::Preempt {
            preemptions: vec![Preemption {
                job: by,
                victims: vec![victim],
                why: vec!["QoS high preempts QoS normal".into()],
                shrinks: Vec::new(),
            }],
            now: 7,
        },
        &mut d,
    );
    assert_eq!(
        r,
        CommandResult::Preempted {
            stopped: vec![victim],
            skipped: vec![]
        }
    );
    let j = s.job(victim).unwrap();
    assert_eq!(j.state, JobState::Completing);
    assert_eq!(j.preemptions[0].by, by);
    assert_eq!(j.preemptions[0].mode, PreemptMode::Requeue);
    // A second preemption of the same victim is skipped whole.
    let again = s.apply(
        &Command::Preempt {
            preemptions: vec![Preemption {
                job: by,
                victims: vec![victim],
                why: vec![],
                shrinks: Vec::new(),
            }],
            now: 8,
        },
        &mut d,
    );
    assert!(matches!(again, CommandResult::Preempted { ref stopped, .. } if stopped.is_empty()));
    report(
        &mut s,
        &mut d,
        "n1",
        vec![ev(victim, 0, TaskEventKind::Ended(TaskEnd::Cancelled))],
    );
    let j = s.job(victim).unwrap();
    assert_eq!((j.state, j.restart_count), (JobState::Pending, 1));
    // The high job's ranks get its QoS's grace when it runs.
    start(&mut s, &mut d, by, &[("n1", &[0, 1, 2, 3, 4, 5, 6, 7])]);
    assert_eq!(
        s.job(by).unwrap().run.as_ref().unwrap().kill_grace_secs,
        Some(30)
    );
}
