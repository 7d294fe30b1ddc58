//! The store passes openraft's storage suite, survives drops and crash images,
//! a three-server cluster replicates and brings a late learner up by snapshot,
//! and concurrent writes share log transactions and apply exactly once.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use async_trait::async_trait;
use openraft::storage::RaftStateMachine;
use openraft::testing::{StoreBuilder, Suite};
use openraft::{
    CommittedLeaderId, Config, EntryPayload, LogId, Membership, RaftLogReader, SnapshotPolicy,
    StorageError, StorageIOError,
};
use tempfile::TempDir;

use super::*;
use crate::model::{ExportMode, JobId, JobSpec, Program};
use crate::state::{Command, CommandResult, Dirty, State};

const WAIT: Duration = Duration::from_secs(30);

fn spec(name: &str) -> JobSpec {
    JobSpec {
        qos: None,
        nice: 0,
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
        requeue: Default::default(),
        max_restarts: 3,
        total_gpus: None,
        placement: Default::default(),
        queue: Default::default(),
        signal: None,
        program: Program::Command {
            argv: vec!["true".into()],
        },
        launch: Default::default(),
        submit_host: None,
        first_step: None,
        exclusive: false,
        container: None,
    }
}

fn submit(i: u64) -> Command {
    Command::Submit {
        user: "alice".into(),
        spec: Box::new(spec(&format!("job-{i}"))),
        now: 1_000 + i,
    }
}

fn log_id(term: u64, index: u64) -> LogId<u64> {
    LogId::new(CommittedLeaderId::new(term, 1), index)
}

fn server(id: u64) -> ServerNode {
    ServerNode {
        name: format!("s{id}"),
        addr: format!("127.0.0.1:{}", 7420 + id),
    }
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

/// Compares two states, naming the first difference instead of dumping both.
fn assert_same_state(who: &str, got: &State, want: &State) {
    assert_eq!(got.counters, want.counters, "{who}: counters differ");
    let got_ids: Vec<_> = got.jobs.keys().collect();
    let want_ids: Vec<_> = want.jobs.keys().collect();
    assert_eq!(got_ids, want_ids, "{who}: job ids differ");
    for (id, job) in &want.jobs {
        assert_eq!(&got.jobs[id], job, "{who}: job {id} differs");
    }
    assert!(
        got == want,
        "{who}: states differ outside jobs and counters"
    );
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

/// The committed index as the database holds it (what a read transaction
/// sees, durable or not).
fn stored_committed(db: &redb::Database) -> Option<LogId<u64>> {
    let txn = db.begin_read().unwrap();
    let meta = txn.open_table(log_store::LOG_META).unwrap();
    let value = meta.get(log_store::COMMITTED).unwrap()?;
    rmp_serde::from_slice::<Option<LogId<u64>>>(value.value()).unwrap()
}

#[tokio::test]
async fn a_committed_hint_rides_with_a_later_write_and_is_saved_on_the_way_out() {
    use openraft::storage::RaftLogStorage;
    let dir = TempDir::new().unwrap();
    let path = db_path(&dir);
    let entries = sample_log(1200);
    let (mut log, sm) = open_storage(&path).await.unwrap();
    let db = sm.db();
    append_durably(&log, &entries[..1000]).await;
    log.save_committed(Some(log_id(1, 1000))).await.unwrap();
    // Time for the writer to write it, were it to.
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(
        stored_committed(&db),
        None,
        "a hint alone costs no transaction"
    );
    assert_eq!(log.read_committed().await.unwrap(), Some(log_id(1, 1000)));
    append_durably(&log, &entries[1000..1050]).await;
    assert_eq!(
        stored_committed(&db),
        None,
        "it waits until it is HINT_EVERY (1024) ahead of the one on disk"
    );
    log.save_committed(Some(log_id(1, 1050))).await.unwrap();
    append_durably(&log, &entries[1050..1101]).await;
    assert_eq!(
        stored_committed(&db),
        Some(log_id(1, 1050)),
        "then it rides along"
    );

    log.save_committed(Some(log_id(1, 1101))).await.unwrap();
    drop((log, sm, db));
    let (mut log, sm) = open_storage(&path).await.unwrap();
    let db = sm.db();
    assert_eq!(
        log.read_committed().await.unwrap(),
        Some(log_id(1, 1101)),
        "the last hint is written when the store closes"
    );
    log.save_committed(Some(log_id(1, 1150))).await.unwrap();
    append_durably(&log, &entries[1101..1150]).await;
    assert_eq!(
        stored_committed(&db),
        Some(log_id(1, 1101)),
        "after a restart, HINT_EVERY counts from the hint on disk"
    );
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

/// An in-process transport: each call goes through the MessagePack codec, as
/// it will on the wire, to the target's `handle`.
#[derive(Default)]
struct LocalTransport {
    nodes: RwLock<BTreeMap<u64, GpuqRaft>>,
    snapshot_chunks: AtomicU64,
}

impl LocalTransport {
    fn add(&self, id: u64, raft: GpuqRaft) {
        self.nodes.write().unwrap().insert(id, raft);
    }

    fn remove(&self, id: u64) {
        self.nodes.write().unwrap().remove(&id);
    }
}

fn roundtrip<T: serde::Serialize + serde::de::DeserializeOwned>(v: &T) -> Result<T, String> {
    let bytes = rmp_serde::to_vec_named(v).map_err(|e| e.to_string())?;
    rmp_serde::from_slice(&bytes).map_err(|e| e.to_string())
}

#[async_trait]
impl RaftTransport for LocalTransport {
    async fn call(
        &self,
        target: u64,
        _node: &ServerNode,
        req: RaftRequest,
    ) -> Result<RaftResponse, String> {
        let raft = self.nodes.read().unwrap().get(&target).cloned();
        let raft = raft.ok_or_else(|| format!("no server {target} is listening"))?;
        if matches!(req, RaftRequest::InstallSnapshot(_)) {
            self.snapshot_chunks.fetch_add(1, Ordering::Relaxed);
        }
        let req = roundtrip(&req)?;
        let resp = handle(&raft, req).await;
        roundtrip(&resp)
    }
}

fn test_config() -> Config {
    Config {
        heartbeat_interval: 100,
        election_timeout_min: 500,
        election_timeout_max: 1000,
        ..Default::default()
    }
}

async fn start(dir: &Path, id: u64, config: Config, transport: &Arc<LocalTransport>) -> RaftNode {
    let node = open(
        &dir.join(format!("s{id}.redb")),
        id,
        config,
        Network::new(transport.clone()),
    )
    .await
    .expect("open raft node");
    transport.add(id, node.raft.clone());
    node
}

async fn wait_for_leader(node: &RaftNode) -> u64 {
    let m = node
        .raft
        .wait(Some(WAIT))
        .metrics(|m| m.current_leader.is_some(), "a leader is elected")
        .await
        .expect("leader");
    m.current_leader.unwrap()
}

async fn wait_applied(node: &RaftNode, index: u64) {
    node.raft
        .wait(Some(WAIT))
        .applied_index_at_least(Some(index), "entries applied")
        .await
        .expect("applied");
}

/// Proposes `cmd`; returns its result and log index (metrics may lag behind).
async fn write(node: &RaftNode, cmd: Command) -> (CommandResult, u64) {
    let resp = node.raft.client_write(cmd).await.expect("client write");
    (resp.data, resp.log_id.index)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_restarted_node_has_the_state_its_log_replays_to() {
    let dir = TempDir::new().unwrap();
    let path = dir.path().join("s1.redb");
    let transport = Arc::new(LocalTransport::default());
    let node = start(dir.path(), 1, test_config(), &transport).await;
    node.initialize_single(1, server(1)).await.unwrap();
    wait_for_leader(&node).await;
    let mut last = 0;
    for i in 0..30 {
        last = write(&node, submit(i)).await.1;
    }
    let before = node.state.read().unwrap().clone();
    assert_eq!(before.jobs.len(), 30);

    // No shutdown: drop every handle and wait until openraft has let go of the file.
    transport.remove(1);
    drop(node);
    let deadline = tokio::time::Instant::now() + WAIT;
    let (mut log, _sm) = loop {
        match open_storage(&path).await {
            Ok(s) => break s,
            Err(RaftError::InUse { .. }) if tokio::time::Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Err(e) => panic!("reopen: {e}"),
        }
    };
    let entries = log.try_get_log_entries(0..).await.unwrap();
    assert_eq!(
        replay(&entries),
        before,
        "the log replays to the state it had"
    );
    drop((log, _sm));

    let node = start(dir.path(), 1, test_config(), &transport).await;
    node.initialize_single(1, server(1)).await.unwrap();
    wait_for_leader(&node).await;
    wait_applied(&node, last).await;
    assert_eq!(*node.state.read().unwrap(), before);
    assert_eq!(
        write(&node, submit(30)).await.0,
        CommandResult::Submitted { id: JobId(31) },
        "ids continue after a restart"
    );
    node.raft.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn three_servers_replicate_and_a_late_learner_catches_up_by_snapshot() {
    let dir = TempDir::new().unwrap();
    let transport = Arc::new(LocalTransport::default());
    let config = Config {
        snapshot_policy: SnapshotPolicy::LogsSinceLast(40),
        max_in_snapshot_log_to_keep: 0,
        purge_batch_size: 1,
        ..test_config()
    };
    let mut nodes = Vec::new();
    for id in 1..=3 {
        nodes.push(start(dir.path(), id, config.clone(), &transport).await);
    }
    nodes[0]
        .raft
        .initialize(BTreeMap::from([
            (1, server(1)),
            (2, server(2)),
            (3, server(3)),
        ]))
        .await
        .unwrap();
    let leader_id = wait_for_leader(&nodes[0]).await;
    let leader = nodes[(leader_id - 1) as usize].clone();
    let leader = &leader;

    let mut last = 0;
    for i in 0..100 {
        let (result, index) = write(leader, submit(i)).await;
        assert_eq!(result, CommandResult::Submitted { id: JobId(i + 1) });
        last = index;
    }
    for n in &nodes {
        wait_applied(n, last).await;
    }
    let want = leader.state.read().unwrap().clone();
    assert_eq!(want.jobs.len(), 100);
    for n in &nodes {
        let who = format!("server {}", n.raft.metrics().borrow().id);
        assert_same_state(&who, &n.state.read().unwrap(), &want);
    }

    // Snapshot and purge everything behind it, so a new server cannot get logs.
    leader.raft.trigger().snapshot().await.unwrap();
    leader
        .raft
        .wait(Some(WAIT))
        .metrics(
            |m| m.purged.map(|p| p.index) >= Some(last),
            "the leader purged its log up to its snapshot",
        )
        .await
        .expect("purged");

    let learner = start(dir.path(), 4, config.clone(), &transport).await;
    leader.raft.add_learner(4, server(4), true).await.unwrap();
    wait_applied(&learner, last).await;
    assert!(
        transport.snapshot_chunks.load(Ordering::Relaxed) > 0,
        "the learner was sent a snapshot"
    );
    let m = learner.raft.metrics().borrow().clone();
    assert!(
        m.snapshot.map(|s| s.index) >= Some(last),
        "learner metrics: {m:?}"
    );
    assert_same_state("learner", &learner.state.read().unwrap(), &want);

    // It becomes a voter and keeps up with new writes like the others.
    leader
        .raft
        .change_membership(BTreeSet::from([1, 2, 3, 4]), false)
        .await
        .unwrap();
    for i in 100..105 {
        last = write(leader, submit(i)).await.1;
    }
    nodes.push(learner);
    for n in &nodes {
        wait_applied(n, last).await;
    }
    let want = leader.state.read().unwrap().clone();
    assert_eq!(want.jobs.len(), 105);
    for n in &nodes {
        let who = format!("server {}", n.raft.metrics().borrow().id);
        assert_same_state(&who, &n.state.read().unwrap(), &want);
    }
    for n in &nodes {
        n.raft.shutdown().await.unwrap();
    }
}

/// Prints the log's batch figures; under openraft 0.9 they stay at one entry
/// per transaction, because RaftCore awaits each append's flush before the
/// next (see `log_store`).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_client_writes_apply_exactly_once() {
    let dir = TempDir::new().unwrap();
    let transport = Arc::new(LocalTransport::default());
    let node = start(dir.path(), 1, test_config(), &transport).await;
    node.initialize_single(1, server(1)).await.unwrap();
    wait_for_leader(&node).await;
    let txns0 = node.stats.appends_txns.load(Ordering::Relaxed);
    let entries0 = node.stats.entries.load(Ordering::Relaxed);
    let calls0 = node.stats.append_calls.load(Ordering::Relaxed);

    const TOTAL: u64 = 200;
    const TASKS: u64 = 16;
    let mut tasks = Vec::new();
    for t in 0..TASKS {
        let raft = node.raft.clone();
        tasks.push(tokio::spawn(async move {
            let mut got = Vec::new();
            for i in (t..TOTAL).step_by(TASKS as usize) {
                let resp = raft.client_write(submit(i)).await.expect("client write");
                got.push((i, resp.data));
            }
            got
        }));
    }
    let mut id_of = BTreeMap::new();
    for t in tasks {
        for (i, result) in t.await.unwrap() {
            match result {
                CommandResult::Submitted { id } => {
                    id_of.insert(i, id);
                }
                other => panic!("submit {i} answered {other:?}"),
            }
        }
    }
    let ids: BTreeSet<JobId> = id_of.values().copied().collect();
    assert_eq!(id_of.len() as u64, TOTAL);
    assert_eq!(ids.len() as u64, TOTAL, "every submit got its own job id");

    let state = node.state.read().unwrap().clone();
    assert_eq!(
        state.jobs.len() as u64,
        TOTAL,
        "each submit applied exactly once"
    );
    for (i, id) in &id_of {
        assert_eq!(state.jobs[id].spec.name, format!("job-{i}"));
    }

    let txns = node.stats.appends_txns.load(Ordering::Relaxed) - txns0;
    let entries = node.stats.entries.load(Ordering::Relaxed) - entries0;
    let calls = node.stats.append_calls.load(Ordering::Relaxed) - calls0;
    let mean = entries as f64 / txns as f64;
    println!(
        "group commit: {entries} entries in {txns} log transactions (mean batch {mean:.2} entries, {:.2} append calls per transaction)",
        calls as f64 / txns as f64
    );
    assert!(txns > 0 && mean >= 1.0);
    node.raft.shutdown().await.unwrap();
}
