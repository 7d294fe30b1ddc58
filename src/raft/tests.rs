//! The store passes openraft's storage suite, survives drops and crash images,
//! and queued appends are readable at once and share log transactions.

use std::collections::BTreeSet;
use std::sync::atomic::Ordering;

use openraft::storage::RaftStateMachine;
use openraft::testing::{StoreBuilder, Suite};
use openraft::{
    CommittedLeaderId, EntryPayload, LogId, Membership, RaftLogReader, StorageError, StorageIOError,
};
use tempfile::TempDir;

use super::*;
use crate::model::{ExportMode, JobId, JobSpec, Program};
use crate::state::{Command, CommandResult, Dirty, State};

fn spec(name: &str) -> JobSpec {
    JobSpec {
        name: name.into(),
        nodes: 1,
        ntasks_per_node: 1,
        gpus_per_node: 1,
        cpus_per_task: 1,
        mem_per_node_mb: None,
        time_limit_secs: Some(60),
        account: None,
        partition: None,
        output: None,
        error: None,
        workdir: "/tmp".into(),
        env: Vec::new(),
        export: ExportMode::All,
        program: Program::Command {
            argv: vec!["true".into()],
        },
    }
}

fn submit(i: u64) -> Command {
    Command::Submit {
        user: "alice".into(),
        spec: spec(&format!("job-{i}")),
        now: 1_000 + i,
    }
}

fn log_id(term: u64, index: u64) -> LogId<u64> {
    LogId::new(CommittedLeaderId::new(term, 1), index)
}

/// A membership entry for server 1 at index 1, then `n` submits.
fn sample_log(n: u64) -> Vec<LogEntry> {
    let mut log = vec![LogEntry {
        log_id: log_id(1, 1),
        payload: EntryPayload::Membership(Membership::new(vec![BTreeSet::from([1])], None)),
    }];
    for i in 0..n {
        log.push(LogEntry {
            log_id: log_id(1, i + 2),
            payload: EntryPayload::Normal(submit(i)),
        });
    }
    log
}

/// The state a fresh `State` reaches by applying the commands of `entries`.
fn replay(entries: &[LogEntry]) -> State {
    let mut state = State::default();
    let mut dirty = Dirty::default();
    for e in entries {
        if let EntryPayload::Normal(cmd) = &e.payload {
            state.apply(cmd, &mut dirty);
        }
    }
    state
}

/// Appends and waits until the entries are durable.
async fn append_durably(log: &LogStore, entries: &[LogEntry]) {
    let (tx, rx) = tokio::sync::oneshot::channel();
    log.append_with(
        entries.to_vec(),
        Box::new(move |res| {
            let _ = tx.send(res);
        }),
    )
    .expect("append");
    rx.await.expect("writer answered").expect("append flushed");
}

fn db_path(dir: &TempDir) -> std::path::PathBuf {
    dir.path().join("raft.redb")
}

struct TempStore;

impl StoreBuilder<TypeConfig, LogStore, StateMachine, TempDir> for TempStore {
    async fn build(&self) -> Result<(TempDir, LogStore, StateMachine), StorageError<u64>> {
        let dir = TempDir::new().map_err(|e| StorageIOError::write(&e))?;
        let (log, sm) = open_storage(&db_path(&dir)).await.map_err(|e| match e {
            RaftError::Storage(e) => e,
            other => StorageIOError::write(&other).into(),
        })?;
        Ok((dir, log, sm))
    }
}

#[test]
fn passes_the_openraft_storage_suite() {
    Suite::<TypeConfig, LogStore, StateMachine, TempStore, TempDir>::test_all(TempStore)
        .expect("storage suite");
}

#[tokio::test]
async fn log_and_state_survive_a_drop_without_shutdown() {
    let dir = TempDir::new().unwrap();
    let path = db_path(&dir);
    let entries = sample_log(30);
    {
        let (log, mut sm) = open_storage(&path).await.unwrap();
        append_durably(&log, &entries[..11]).await;
        sm.apply(entries[..11].to_vec()).await.unwrap();
        append_durably(&log, &entries[11..]).await;
        let results = sm.apply(entries[11..].to_vec()).await.unwrap();
        assert_eq!(
            results.last(),
            Some(&CommandResult::Submitted { id: JobId(30) })
        );
        // Dropped here, with no shutdown of any kind.
    }
    let (mut log, mut sm) = open_storage(&path).await.unwrap();
    let stored = log.try_get_log_entries(0..).await.unwrap();
    assert_eq!(stored, entries);
    let (applied, membership) = sm.applied_state().await.unwrap();
    assert_eq!(applied, Some(log_id(1, 31)));
    assert_eq!(membership.log_id(), &Some(log_id(1, 1)));
    let state = sm.state().read().unwrap().clone();
    assert_eq!(state.jobs.len(), 30);
    assert_eq!(state, replay(&entries));
}

#[tokio::test]
async fn a_crash_image_holds_the_log_and_a_state_the_log_completes() {
    let dir = TempDir::new().unwrap();
    let path = db_path(&dir);
    let crashed = dir.path().join("crashed.redb");
    let entries = sample_log(40);
    let (log, mut sm) = open_storage(&path).await.unwrap();
    append_durably(&log, &entries[..21]).await;
    sm.apply(entries[..21].to_vec()).await.unwrap();
    // This fsync also makes the first apply batch durable.
    append_durably(&log, &entries[21..]).await;
    // This batch is committed but never made durable.
    sm.apply(entries[21..].to_vec()).await.unwrap();
    let full = sm.state().read().unwrap().clone();

    // What the disk holds if the process died now: redb has written the header
    // of its last durable commit only.
    std::fs::copy(&path, &crashed).unwrap();

    let (mut log2, mut sm2) = open_storage(&crashed).await.unwrap();
    let stored = log2.try_get_log_entries(0..).await.unwrap();
    assert_eq!(stored, entries, "every flushed entry survives the crash");
    let (applied, _) = sm2.applied_state().await.unwrap();
    assert_eq!(
        applied,
        Some(log_id(1, 21)),
        "the state is at its last durable batch, behind the log"
    );
    assert_eq!(*sm2.state().read().unwrap(), replay(&entries[..21]));

    // openraft re-applies what the state has not covered; do the same here.
    let rest = log2.try_get_log_entries(22..).await.unwrap();
    sm2.apply(rest).await.unwrap();
    let recovered = sm2.state().read().unwrap().clone();
    assert_eq!(recovered, replay(&entries));
    assert_eq!(recovered, full);
    drop((log, sm));
}

#[tokio::test]
async fn queued_appends_are_readable_at_once_and_share_commits() {
    let dir = TempDir::new().unwrap();
    let path = db_path(&dir);
    let entries = sample_log(199);
    let (mut log, _sm) = open_storage(&path).await.unwrap();
    let mut flushed = Vec::new();
    for e in &entries {
        // Issued the way openraft issues appends: the next one before the
        // previous is flushed.
        let (tx, rx) = tokio::sync::oneshot::channel();
        log.append_with(
            vec![e.clone()],
            Box::new(move |res| {
                let _ = tx.send(res);
            }),
        )
        .unwrap();
        let visible = log
            .try_get_log_entries(e.log_id.index..=e.log_id.index)
            .await
            .unwrap();
        assert_eq!(
            visible,
            vec![e.clone()],
            "readable as soon as append returns"
        );
        flushed.push(rx);
    }
    for rx in flushed {
        rx.await.unwrap().unwrap();
    }
    let stats = log.stats();
    let txns = stats.appends_txns.load(Ordering::Relaxed);
    println!(
        "writer: 200 queued appends in {txns} transactions (mean batch {:.1})",
        stats.mean_batch()
    );
    assert!((1..=200).contains(&txns));
    assert_eq!(stats.entries.load(Ordering::Relaxed), 200);
    drop((log, _sm));

    let (mut log, _sm) = open_storage(&path).await.unwrap();
    assert_eq!(
        log.try_get_log_entries(0..).await.unwrap(),
        entries,
        "all durable"
    );
}
