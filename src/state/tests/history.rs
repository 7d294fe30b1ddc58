//! The history archive: `Archive` moves only finished jobs past the cut-off out
//! of memory, the store writes them with their indexes, queries use them, and
//! snapshots carry the archive to another server.

use super::run::{alloc, cluster, spec};
use crate::model::acct::{AcctFilter, AcctRecord};
use crate::model::{TaskEnd, TaskEvent, TaskEventKind, TaskKey};
use crate::state::*;

fn submit_as(s: &mut State, d: &mut Dirty, user: &str, account: Option<&str>, now: u64) -> JobId {
    let mut sp = spec(1, 2);
    sp.account = account.map(str::to_string);
    match s.apply(
        &Command::Submit {
            user: user.into(),
            spec: Box::new(sp),
            now,
        },
        d,
    ) {
        CommandResult::Submitted { id } => id,
        other => panic!("{other:?}"),
    }
}

fn run_to_end(s: &mut State, d: &mut Dirty, id: JobId, start: u64, end: u64, end_as: TaskEnd) {
    s.apply(
        &Command::Schedule {
            allocations: vec![alloc(id.0, &[("n1", &[0, 1])])],
            now: start,
        },
        d,
    );
    let ev = |kind| TaskEvent {
        key: TaskKey {
            job: id,
            attempt: 0,
            rank: 0,
            step: None,
        },
        kind,
    };
    s.apply(
        &Command::TaskEvents {
            node: "n1".into(),
            events: vec![ev(TaskEventKind::Started), ev(TaskEventKind::Ended(end_as))],
            now: end,
            gpu_use: Vec::new(),
        },
        d,
    );
}

fn commit(db: &redb::Database, s: &mut State, d: &Dirty) {
    let txn = db.begin_write().unwrap();
    store::create_tables(&txn).unwrap();
    store::write_dirty(&txn, s, d).unwrap();
    txn.commit().unwrap();
    // What the state machine does once the transaction is committed.
    s.archiving.clear();
}

#[test]
fn archive_moves_only_finished_jobs_past_the_cutoff_to_disk() {
    let dir = tempfile::tempdir().unwrap();
    let db = redb::Database::create(dir.path().join("s.redb")).unwrap();
    let (mut s, mut d) = cluster();
    // Submit refuses an account that does not exist or does not list the user.
    let vision = crate::model::policy_change::PolicyChange::Account {
        op: crate::model::policy_change::Op::Add,
        name: "vision".into(),
        patch: crate::model::policy_change::AccountPatch {
            add_users: vec!["alice".into()],
            ..Default::default()
        },
    };
    let added = s.apply(
        &Command::Policy {
            change: vision,
            by: "root".into(),
            now: 1,
        },
        &mut d,
    );
    assert!(
        matches!(added, CommandResult::PolicyUpdated { .. }),
        "{added:?}"
    );
    let a = submit_as(&mut s, &mut d, "alice", Some("vision"), 10);
    run_to_end(&mut s, &mut d, a, 1_000, 3_601_000, TaskEnd::Completed);
    let b = submit_as(&mut s, &mut d, "bob", None, 20);
    s.apply(
        &Command::Cancel {
            by: "bob".into(),
            admin: false,
            ids: vec![b],
            now: 5_000_000,
        },
        &mut d,
    );
    let pending = submit_as(&mut s, &mut d, "alice", None, 30);
    assert_eq!(s.jobs[&a].state, JobState::Completed);
    assert_eq!(s.jobs[&b].state, JobState::Cancelled);
    commit(&db, &mut s, &d);

    // Only `a` ended at or before the cut-off; b ended later, the third runs never.
    let mut d = Dirty::default();
    let r = s.apply(&Command::Archive { before: 4_000_000 }, &mut d);
    assert_eq!(r, CommandResult::Archived { count: 1 });
    assert!(!s.jobs.contains_key(&a), "archived jobs leave memory");
    assert!(s.jobs.contains_key(&b) && s.jobs.contains_key(&pending));
    assert_eq!(s.archiving_job(a).map(|j| j.id), Some(a));
    commit(&db, &mut s, &d);
    assert!(s.archiving.is_empty());

    let txn = db.begin_read().unwrap();
    let loaded = store::load(&txn).unwrap();
    assert!(!loaded.jobs.contains_key(&a), "the active row is deleted");
    let archived = history::get(&txn, a).unwrap().expect("a is in the archive");
    assert_eq!(archived.state, JobState::Completed);
    let rec = AcctRecord::from_job(&archived);
    assert_eq!((rec.gpus, rec.elapsed_secs), (2, 3600));
    assert!((rec.gpu_hours - 2.0).abs() < 1e-9);
    assert_eq!(rec.account, "vision");
    drop(txn);

    // Archiving everything finished: b too; the pending job stays.
    let mut d = Dirty::default();
    s.apply(&Command::Archive { before: u64::MAX }, &mut d);
    commit(&db, &mut s, &d);
    assert_eq!(s.jobs.keys().copied().collect::<Vec<_>>(), vec![pending]);
    let again = s.apply(
        &Command::Archive { before: u64::MAX },
        &mut Dirty::default(),
    );
    assert_eq!(again, CommandResult::Archived { count: 0 });

    let txn = db.begin_read().unwrap();
    assert_eq!(history::len(&txn).unwrap(), 2);
    let q = |f: AcctFilter| -> Vec<JobId> {
        history::query(&txn, &f)
            .unwrap()
            .iter()
            .map(|j| j.id)
            .collect()
    };
    assert_eq!(q(AcctFilter::default()), vec![a, b]);
    let user = |u: &str| AcctFilter {
        user: Some(u.into()),
        ..Default::default()
    };
    assert_eq!(q(user("bob")), vec![b]);
    assert_eq!(q(user("carol")), Vec::<JobId>::new());
    let account = AcctFilter {
        account: Some("default".into()),
        ..Default::default()
    };
    assert_eq!(q(account), vec![b]);
    let since = AcctFilter {
        since: Some(4_000_000),
        ..Default::default()
    };
    assert_eq!(q(since), vec![b], "-S: ended at or after");
    let until = AcctFilter {
        until: Some(15),
        ..Default::default()
    };
    assert_eq!(q(until), vec![a], "-E: submitted at or before");
    let failed = AcctFilter {
        states: vec![JobState::Failed],
        ..Default::default()
    };
    assert_eq!(q(failed), Vec::<JobId>::new());
    let ids = |ids: Vec<JobId>| AcctFilter {
        ids,
        ..Default::default()
    };
    assert_eq!(q(ids(vec![b])), vec![b], "-j reads the named row");
    assert_eq!(q(ids(vec![b, a])), vec![a, b]);
    assert_eq!(q(ids(vec![JobId(999)])), Vec::<JobId>::new());
    let page = |after: Option<JobId>| AcctFilter {
        after,
        limit: Some(1),
        ..Default::default()
    };
    assert_eq!(q(page(None)), vec![a], "a page: the lowest ids");
    assert_eq!(
        q(page(Some(a))),
        vec![b],
        "the next page starts after the last"
    );
    assert_eq!(q(page(Some(b))), Vec::<JobId>::new());
    let user_page = AcctFilter {
        user: Some("bob".into()),
        after: Some(b),
        ..Default::default()
    };
    assert_eq!(q(user_page), Vec::<JobId>::new(), "an index read pages too");
    let named = AcctFilter {
        names: vec!["nope".into()],
        ..Default::default()
    };
    assert_eq!(q(named), Vec::<JobId>::new());

    // A snapshot carries the archive: a new server answers for old jobs.
    let bytes = store::snapshot_of(&txn).unwrap();
    let other = tempfile::tempdir().unwrap();
    let db2 = redb::Database::create(other.path().join("s.redb")).unwrap();
    let (snap, hist) = store::from_snapshot_bytes(&bytes).unwrap();
    assert_eq!(snap, s);
    let w = db2.begin_write().unwrap();
    store::replace_all(&w, &snap, hist).unwrap();
    w.commit().unwrap();
    let txn2 = db2.begin_read().unwrap();
    assert_eq!(
        history::get(&txn2, b).unwrap().map(|j| j.state),
        Some(JobState::Cancelled)
    );
    assert_eq!(
        history::query(&txn2, &user("alice")).unwrap().len(),
        1,
        "indexes are rebuilt on install"
    );
}

#[test]
fn an_older_snapshot_without_history_still_installs() {
    let (s, _) = cluster();
    let old = rmp_serde::to_vec_named(&s).unwrap();
    let (snap, hist) = store::from_snapshot_bytes(&old).unwrap();
    assert_eq!(snap, s);
    assert!(hist.is_empty());
}

#[test]
fn the_active_index_follows_every_change_and_matches_a_rebuild() {
    let (mut s, mut d) = cluster();
    let a = submit_as(&mut s, &mut d, "alice", None, 10);
    let b = submit_as(&mut s, &mut d, "bob", None, 11);
    assert_eq!(
        s.index.pending.iter().copied().collect::<Vec<_>>(),
        vec![a, b]
    );
    let before = s.index.node_version("n1");
    s.apply(
        &Command::Schedule {
            allocations: vec![alloc(a.0, &[("n1", &[0, 1])])],
            now: 20,
        },
        &mut d,
    );
    assert!(s.index.node_version("n1") > before, "a start changes n1");
    let n2 = s.index.node_version("n2");
    assert_eq!(s.jobs_on("n1").map(|j| j.id).collect::<Vec<_>>(), vec![a]);
    assert_eq!(s.index.pending.iter().copied().collect::<Vec<_>>(), vec![b]);
    assert_eq!(s.node_views()[0].used.gpus.len(), 2);
    // A batch of commands keeps the index in step too.
    s.apply(
        &Command::Batch(vec![Command::Cancel {
            by: "alice".into(),
            admin: false,
            ids: vec![a],
            now: 30,
        }]),
        &mut d,
    );
    assert_eq!(s.index.node_version("n2"), n2, "nothing changed on n2");
    let mut rebuilt = s.clone();
    rebuilt.rebuild_index();
    for n in ["n1", "n2"] {
        let ids = |st: &State| st.jobs_on(n).map(|j| j.id).collect::<Vec<_>>();
        assert_eq!(ids(&s), ids(&rebuilt), "{n}");
    }
    assert_eq!(s.index.pending, rebuilt.index.pending);
    assert_eq!(s.node_views(), rebuilt.node_views());
}
