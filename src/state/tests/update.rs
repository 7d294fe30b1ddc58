//! `scontrol update`: who may change what, pending-only fields checked by
//! the policy, all or none, and a running job's changed limit kept by the
//! leader too (older agents' shims keep the old one).

use super::run::{cluster, start, submit};
use crate::model::JobUpdate;
use crate::state::*;

fn update(
    s: &mut State,
    by: &str,
    admin: bool,
    ids: Vec<JobId>,
    change: JobUpdate,
) -> CommandResult {
    s.apply(
        &Command::Update {
            by: by.into(),
            admin,
            ids,
            change,
        },
        &mut Dirty::default(),
    )
}

fn limit(secs: Option<u64>) -> JobUpdate {
    JobUpdate {
        time_limit_secs: Some(secs),
        ..JobUpdate::default()
    }
}

fn refused(r: &CommandResult) -> String {
    match r {
        CommandResult::Rejected(why) => why.to_string(),
        other => panic!("expected a refusal, got {other:?}"),
    }
}

#[test]
fn owners_lower_limits_and_rename_admins_also_raise() {
    let (mut s, mut d) = cluster();
    let id = submit(&mut s, &mut d, 1, 1);
    let r = update(&mut s, "alice", false, vec![id], limit(Some(600)));
    assert_eq!(r, CommandResult::Updated { ids: vec![id] });
    assert_eq!(s.jobs[&id].spec.time_limit_secs, Some(600));
    let why = refused(&update(&mut s, "alice", false, vec![id], limit(Some(900))));
    assert!(why.contains("only an admin may raise"), "{why}");
    let why = refused(&update(&mut s, "bob", false, vec![id], limit(Some(60))));
    assert!(why.contains("belongs to alice"), "{why}");
    update(&mut s, "root", true, vec![id], limit(None));
    assert_eq!(
        s.jobs[&id].spec.time_limit_secs, None,
        "UNLIMITED, by an admin"
    );

    // Added to and taken from the current limit, under the same rules.
    let by = |secs: i64| JobUpdate {
        time_limit_change_secs: Some(secs),
        ..JobUpdate::default()
    };
    let why = refused(&update(&mut s, "root", true, vec![id], by(60)));
    assert!(why.contains("no time limit to add to"), "{why}");
    update(&mut s, "root", true, vec![id], limit(Some(600)));
    update(&mut s, "alice", false, vec![id], by(-60));
    assert_eq!(s.jobs[&id].spec.time_limit_secs, Some(540));
    let why = refused(&update(&mut s, "alice", false, vec![id], by(60)));
    assert!(why.contains("only an admin may raise"), "{why}");
    update(&mut s, "root", true, vec![id], by(1800));
    assert_eq!(s.jobs[&id].spec.time_limit_secs, Some(2340));
    let why = refused(&update(&mut s, "alice", false, vec![id], by(-9999)));
    assert!(why.contains("no time at all"), "{why}");

    let rename = JobUpdate {
        name: Some("better".into()),
        nice: Some(50),
        ..JobUpdate::default()
    };
    update(&mut s, "alice", false, vec![id], rename);
    assert_eq!(
        (s.jobs[&id].spec.name.as_str(), s.jobs[&id].spec.nice),
        ("better", 50)
    );
    let boost = JobUpdate {
        nice: Some(-5),
        ..JobUpdate::default()
    };
    let why = refused(&update(&mut s, "alice", false, vec![id], boost));
    assert!(why.contains("below 0"), "{why}");
    let why = refused(&update(
        &mut s,
        "alice",
        false,
        vec![id],
        JobUpdate::default(),
    ));
    assert!(why.contains("nothing to change"), "{why}");
    let why = refused(&update(&mut s, "alice", false, vec![id], limit(Some(0))));
    assert!(why.contains("0"), "{why}");
}

#[test]
fn pending_only_fields_are_checked_all_or_none() {
    let (mut s, mut d) = cluster();
    let a = submit(&mut s, &mut d, 1, 1);
    let b = submit(&mut s, &mut d, 1, 1);
    let to = |account: &str| JobUpdate {
        account: Some(account.into()),
        ..JobUpdate::default()
    };
    let why = refused(&update(&mut s, "alice", false, vec![a, b], to("nosuch")));
    assert!(
        why.contains("nosuch") && why.contains("gpuq share"),
        "{why}"
    );
    assert_eq!(s.jobs[&a].spec.account, s.jobs[&b].spec.account);
    start(&mut s, &mut d, b, &[("n1", &[0])]);
    let before = s.jobs[&a].spec.clone();
    let qos = JobUpdate {
        qos: Some("normal".into()),
        ..JobUpdate::default()
    };
    let why = refused(&update(&mut s, "alice", false, vec![a, b], qos));
    assert!(why.contains("only while it is pending"), "{why}");
    assert_eq!(
        s.jobs[&a].spec, before,
        "nothing of a refused update applies"
    );
}

#[test]
fn a_running_jobs_changed_limit_is_kept_by_the_leader_and_an_admin_may_raise_it() {
    let (mut s, mut d) = cluster();
    let id = submit(&mut s, &mut d, 1, 1);
    start(&mut s, &mut d, id, &[("n1", &[0])]);
    let job = &s.jobs[&id];
    assert!(
        !past_limit_unwatched(job, u64::MAX),
        "no limit, nothing to keep"
    );
    update(&mut s, "alice", false, vec![id], limit(Some(30)));
    let why = refused(&update(&mut s, "alice", false, vec![id], limit(Some(90))));
    assert!(why.contains("only an admin may raise"), "{why}");
    // An admin raises it while it runs: the leader's deadline moves too.
    let r = update(&mut s, "root", true, vec![id], limit(Some(60)));
    assert_eq!(r, CommandResult::Updated { ids: vec![id] });
    let job = &s.jobs[&id];
    assert!(job.run.as_ref().unwrap().limit_changed);
    let start_ms = job.start_time.unwrap();
    assert!(!past_limit_unwatched(job, start_ms + 59_000));
    assert!(past_limit_unwatched(job, start_ms + 60_000));
    let r = s.apply(
        &Command::Expire {
            jobs: vec![id],
            now: start_ms + 60_000,
        },
        &mut d,
    );
    assert_eq!(r, CommandResult::Expired { ids: vec![id] });
    assert_eq!(
        s.jobs[&id].run.as_ref().unwrap().final_state,
        Some(JobState::Timeout)
    );
}
