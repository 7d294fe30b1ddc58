//! What the leader and the servers do with decoded input: log entries
//! applied to the replicated state (`State::apply`, which every server runs,
//! so one panic there stops the whole control plane at once), the scheduling
//! pass that follows, an agent's session turned into commands as
//! `server/agents.rs` turns it, and a snapshot installed from a peer.
//!
//! The state is a small fixture cluster (three nodes, the seed jobs, some of
//! them running) built once and cloned per input. Besides "no panic", apply
//! owes one more promise that is checked here: a rejected command changes
//! nothing.

use std::sync::OnceLock;

use gpuq::net::agent_proto::{AgentHello, AgentMsg};
use gpuq::raft::network::RaftRequest;
use gpuq::raft::{LogEntry, ServerNode, TypeConfig};
use gpuq::state::{Command, CommandResult, Dirty, DrainSource, NodeStatus, State};
use openraft::raft::{AppendEntriesRequest, InstallSnapshotRequest, VoteRequest};
use openraft::{
    CommittedLeaderId, EntryPayload, LogId, Membership, SnapshotMeta, StoredMembership,
};
use rand::rngs::StdRng;
use rand::Rng;

use super::wire::{read_one, Bodies};
use super::{mutate, seeds, Target};

/// The leader's clock in the fixture.
const NOW: u64 = 2_000_000;

pub fn targets() -> Vec<Target> {
    vec![
        Target {
            name: "apply",
            weight: 15,
            generate: gen_commands,
            check: check_commands,
        },
        Target {
            name: "agent-session",
            weight: 10,
            generate: gen_session,
            check: check_session,
        },
        Target {
            name: "snapshot",
            weight: 5,
            generate: gen_snapshot,
            check: check_snapshot,
        },
    ]
}

fn apply(state: &mut State, cmd: &Command) -> CommandResult {
    state.apply(cmd, &mut Dirty::default())
}

/// Three nodes, the seed policy, the seed jobs; a scheduling pass has
/// started what fits and its tasks have reported in.
pub fn fixture() -> &'static State {
    static S: OnceLock<State> = OnceLock::new();
    S.get_or_init(|| {
        let mut s = State::default();
        let init = Command::InitCluster {
            name: "fuzz".into(),
            ca_cert_pem: "-----BEGIN CERTIFICATE-----".into(),
            ca_key_pem: "-----BEGIN PRIVATE KEY-----".into(),
            master_ports: Default::default(),
            now: 1,
        };
        let mut setup = vec![init];
        for hello in seeds::agent_hellos() {
            setup.push(register(&hello, 2));
        }
        setup.extend(
            seeds::policy_changes()
                .into_iter()
                .map(|change| Command::Policy {
                    change,
                    by: "root".into(),
                    now: 3,
                }),
        );
        // Array seeds stay out: a hundred task jobs would make every clone
        // of the fixture, and so every input, ten times slower.
        for spec in seeds::specs()
            .into_iter()
            .filter(|s| s.queue.array.is_none())
        {
            setup.push(Command::Submit {
                user: "alice".into(),
                spec: Box::new(spec),
                now: 4,
            });
        }
        for cmd in &setup {
            apply(&mut s, cmd);
        }
        schedule(&mut s, 5);
        let started: Vec<(String, gpuq::model::TaskEvent)> = s
            .active_jobs()
            .filter_map(|j| Some((j, j.run.as_ref()?)))
            .flat_map(|(j, run)| {
                run.allocation.nodes.iter().map(move |n| {
                    let ev = gpuq::model::TaskEvent {
                        key: gpuq::model::TaskKey {
                            job: j.id,
                            attempt: run.attempt,
                            rank: 0,
                            step: None,
                        },
                        kind: gpuq::model::TaskEventKind::Started,
                    };
                    (n.node.clone(), ev)
                })
            })
            .collect();
        for (node, ev) in started {
            apply(
                &mut s,
                &Command::TaskEvents {
                    node,
                    events: vec![ev],
                    now: 6,
                    gpu_use: Vec::new(),
                },
            );
        }
        s
    })
}

fn register(hello: &AgentHello, now: u64) -> Command {
    Command::RegisterNode {
        inventory: hello.inventory.clone(),
        addr: hello.addr.clone(),
        preflight: hello.preflight,
        now,
        cert_sha256: format!("cert of {}", hello.inventory.name),
    }
}

/// One pass of the leader's scheduling loop (`server/scheduler.rs`): plan,
/// then commit the preemptions and the starts; then what every node's agent
/// would be sent.
fn schedule(state: &mut State, now: u64) {
    if !state.has_pending() {
        return;
    }
    let plan = {
        let input = state.sched_input();
        gpuq::sched::plan_ref(&input.view(), now, gpuq::sched::Packing::BestFit)
    };
    if !plan.preemptions.is_empty() {
        apply(
            state,
            &Command::Preempt {
                preemptions: plan.preemptions,
                now,
            },
        );
    }
    if !plan.allocations.is_empty() {
        apply(
            state,
            &Command::Schedule {
                allocations: plan.allocations,
                now,
            },
        );
    }
    // What the leader sends each node (its `desired_tasks` is private to
    // the server; the state's part of it is this).
    for node in state.nodes.keys() {
        for (job, node_rank) in state.desired_on(node) {
            let _ = job
                .run
                .as_ref()
                .map(|r| r.allocation.nodes.get(node_rank as usize));
        }
    }
}

/// Applies `cmd` and checks that a rejection left the state as it was.
fn apply_checked(state: &mut State, cmd: &Command) {
    let before = state.clone();
    let result = apply(state, cmd);
    if let CommandResult::Rejected(why) = &result {
        assert!(
            *state == before,
            "a rejected command ({why}) changed the state"
        );
    }
}

fn command_seeds() -> &'static Bodies {
    static S: OnceLock<Bodies> = OnceLock::new();
    S.get_or_init(|| Bodies::of(&seeds::commands()))
}

const STATE_WORDS: &[&str] = &[
    "n1", "n2", "n3", "n4", "alice", "bob", "root", "gpu", "high", "normal", "physics", "t1",
];

/// One to four log entries (as frames of `Command`s), mostly mutated.
fn gen_commands(rng: &mut StdRng) -> Vec<u8> {
    let mut out = Vec::new();
    for _ in 0..rng.gen_range(1..=4) {
        let body = command_seeds().pick(rng, 0.85, STATE_WORDS);
        out.extend_from_slice(&(body.len() as u32).to_be_bytes());
        out.extend_from_slice(&body);
    }
    out
}

/// The entries in order on the fixture, then a scheduling pass.
fn check_commands(input: &[u8]) {
    let mut state = fixture().clone();
    let mut r = input;
    while let Some(cmd) = read_one::<Command>(&mut r) {
        apply_checked(&mut state, &cmd);
    }
    schedule(&mut state, NOW);
}

fn session_seeds() -> &'static (Bodies, Bodies) {
    static S: OnceLock<(Bodies, Bodies)> = OnceLock::new();
    S.get_or_init(|| {
        (
            Bodies::of(&seeds::agent_hellos()),
            Bodies::of(&seeds::agent_msgs()),
        )
    })
}

/// An agent's sync stream: a hello, then messages.
fn gen_session(rng: &mut StdRng) -> Vec<u8> {
    let (hellos, msgs) = session_seeds();
    let mut out = Vec::new();
    let body = hellos.pick(rng, 0.5, STATE_WORDS);
    out.extend_from_slice(&(body.len() as u32).to_be_bytes());
    out.extend_from_slice(&body);
    for _ in 0..rng.gen_range(1..=4) {
        let body = msgs.pick(rng, 0.8, STATE_WORDS);
        out.extend_from_slice(&(body.len() as u32).to_be_bytes());
        out.extend_from_slice(&body);
    }
    out
}

/// The commands the leader proposes for an agent's session, in the order
/// `server/agents.rs` does: register, then one per message.
fn check_session(input: &[u8]) {
    let mut r = input;
    let Some(hello) = read_one::<AgentHello>(&mut r) else {
        return;
    };
    let mut state = fixture().clone();
    let node = hello.inventory.name.clone();
    apply_checked(&mut state, &register(&hello, NOW));
    while let Some(msg) = read_one::<AgentMsg>(&mut r) {
        let cmd = match msg {
            // Leader memory only (`gpuq show`'s GPU use): no command.
            AgentMsg::Heartbeat
            | AgentMsg::GpuUse { .. }
            | AgentMsg::ReplicaHealth { healthy: true, .. } => continue,
            // The leader stops a replica found unhealthy (as `agents.rs`).
            AgentMsg::ReplicaHealth { job, detail, .. } => Command::Cancel {
                by: format!("its health check ({detail})"),
                admin: true,
                ids: vec![job],
                now: NOW,
            },
            AgentMsg::Gpus { gpus } => Command::GpuHealth {
                node: node.clone(),
                gpus,
                now: NOW,
            },
            AgentMsg::MigFailed { error, .. } => Command::MigFailed {
                node: node.clone(),
                error,
                now: NOW,
            },
            AgentMsg::Events { events, .. } => Command::TaskEvents {
                node: node.clone(),
                events,
                now: NOW,
                gpu_use: Vec::new(),
            },
            AgentMsg::HealthCheck { ok, output } => {
                let status = state.nodes.get(&node).map(|n| &n.status);
                let up = matches!(status, Some(NodeStatus::Up));
                let by_check = matches!(
                    status,
                    Some(NodeStatus::Drained {
                        by: DrainSource::HealthCheck,
                        ..
                    })
                );
                let drain = match (ok, up, by_check) {
                    (false, true, _) => Some(format!("health check failed: {}", output.trim())),
                    (true, _, true) => None,
                    _ => continue,
                };
                Command::SetDrain {
                    node: node.clone(),
                    drain,
                    by: DrainSource::HealthCheck,
                    user: None,
                    requeue_now: false,
                    now: NOW,
                }
            }
        };
        apply_checked(&mut state, &cmd);
    }
    schedule(&mut state, NOW);
}

fn log_id(term: u64, index: u64) -> LogId<u64> {
    LogId::new(CommittedLeaderId::new(term, 1), index)
}

/// Raft RPCs a leader sends: entries carrying the seed commands, a vote
/// request, a snapshot chunk.
pub fn raft_requests() -> Vec<RaftRequest> {
    let members = Membership::new(
        vec![std::collections::BTreeSet::from([1, 2])],
        std::collections::BTreeMap::from([
            (
                1,
                ServerNode {
                    name: "s1".into(),
                    addr: "10.0.0.1:7420".into(),
                },
            ),
            (
                2,
                ServerNode {
                    name: "s2".into(),
                    addr: "10.0.0.2:7420".into(),
                },
            ),
        ]),
    );
    let mut entries: Vec<LogEntry> = vec![LogEntry {
        log_id: log_id(1, 1),
        payload: EntryPayload::Membership(members.clone()),
    }];
    for (i, cmd) in seeds::commands().into_iter().enumerate() {
        entries.push(LogEntry {
            log_id: log_id(1, i as u64 + 2),
            payload: EntryPayload::Normal(cmd),
        });
    }
    let vote = openraft::Vote::new(1, 1);
    let mut out: Vec<RaftRequest> = entries
        .chunks(3)
        .map(|chunk| {
            RaftRequest::AppendEntries(AppendEntriesRequest::<TypeConfig> {
                vote,
                prev_log_id: Some(log_id(1, chunk[0].log_id.index.saturating_sub(1))),
                entries: chunk.to_vec(),
                leader_commit: Some(log_id(1, 1)),
            })
        })
        .collect();
    out.push(RaftRequest::Vote(VoteRequest {
        vote,
        last_log_id: Some(log_id(1, 9)),
    }));
    out.push(RaftRequest::InstallSnapshot(InstallSnapshotRequest::<
        TypeConfig,
    > {
        vote,
        meta: SnapshotMeta {
            last_log_id: Some(log_id(1, 20)),
            last_membership: StoredMembership::new(Some(log_id(1, 1)), members),
            snapshot_id: "1-20".into(),
        },
        offset: 0,
        data: snapshot_seed(),
        done: true,
    }));
    out
}

/// What a follower does with an RPC it decoded, as far as it is gpuq's own
/// code: applies the commands of appended entries, installs a snapshot.
pub fn receive_raft(req: &RaftRequest) {
    match req {
        RaftRequest::AppendEntries(append) => {
            let mut state = fixture().clone();
            for entry in &append.entries {
                if let EntryPayload::Normal(cmd) = &entry.payload {
                    apply_checked(&mut state, cmd);
                }
            }
        }
        RaftRequest::InstallSnapshot(snap) if snap.done => install(&snap.data),
        _ => {}
    }
}

/// A snapshot of the fixture with two archived jobs in its history section.
fn snapshot_seed() -> Vec<u8> {
    let state = fixture();
    let mut history = Vec::new();
    for (i, job) in state.jobs.values().take(2).enumerate() {
        let bytes = rmp_serde::to_vec_named(job).expect("a job encodes");
        history.extend_from_slice(&(1000 + i as u64).to_le_bytes());
        history.extend_from_slice(&(bytes.len() as u32).to_le_bytes());
        history.extend_from_slice(&bytes);
    }
    gpuq::state::store::to_snapshot_bytes(state, &history).expect("the fixture encodes")
}

/// The snapshot with its active section mutated as MessagePack (the header
/// mostly kept honest), or its bytes mutated anywhere.
fn gen_snapshot(rng: &mut StdRng) -> Vec<u8> {
    static S: OnceLock<Vec<u8>> = OnceLock::new();
    let seed = S.get_or_init(snapshot_seed);
    let mut data = seed.clone();
    if rng.gen_bool(0.6) && data.len() > 16 {
        let len = u64::from_le_bytes(data[8..16].try_into().unwrap_or([0; 8])) as usize;
        let end = (16 + len).min(data.len());
        let mut active = data[16..end].to_vec();
        mutate::msgpack(rng, &mut active, STATE_WORDS);
        let rest = data[end..].to_vec();
        data.truncate(8);
        data.extend_from_slice(&(active.len() as u64).to_le_bytes());
        data.extend(active);
        data.extend(rest);
    } else {
        mutate::bytes(rng, &mut data);
    }
    data
}

fn check_snapshot(input: &[u8]) {
    install(input);
}

/// Installs snapshot bytes as a follower does (`raft/state_machine.rs`):
/// decode, write everything to the store, then schedule over the result.
fn install(data: &[u8]) {
    let Ok((mut state, history)) = gpuq::state::store::from_snapshot_bytes(data) else {
        return;
    };
    DB.with(|db| {
        let txn = db.begin_write().expect("an in-memory write transaction");
        let _ = gpuq::state::store::replace_all(&txn, &state, history);
        txn.abort().expect("an in-memory abort");
    });
    schedule(&mut state, NOW);
}

std::thread_local! {
    /// One in-memory store per thread; each install is rolled back.
    static DB: redb::Database = {
        let db = redb::Database::builder()
            .create_with_backend(redb::backends::InMemoryBackend::new())
            .expect("an in-memory redb");
        let txn = db.begin_write().expect("a write transaction");
        gpuq::state::store::create_tables(&txn).expect("tables");
        txn.commit().expect("commit");
        db
    };
}
