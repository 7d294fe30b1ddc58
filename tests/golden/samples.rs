//! The golden samples: a release's store read back (state, history, log),
//! and one encoded value of every message and log command, built from the
//! jobs, nodes and commands of that store so they carry real data.

use std::path::Path;

use gpuq::model::{Job, JobState, Role, TaskEvent, TaskEventKind, TaskKey};
use gpuq::net::agent_proto::{AgentHello, AgentMsg, DesiredTask, LogReply, LogRequest, ServerMsg};
use gpuq::net::proto::{ApiRequest, ApiResponse, Caller, ErrorKind, Vouched};
use gpuq::raft::{LogEntry, RaftRequest, RaftResponse};
use gpuq::state::{Command, CommandResult, State};
use openraft::RaftLogReader;
use serde::Serialize;
use serde_json::{json, Value};

use super::Sample;

/// A release's store as this build reads it.
pub struct Store {
    pub state: State,
    pub history: Vec<Job>,
    pub entries: Vec<LogEntry>,
}

impl Store {
    /// `{state, history, log}` as JSON.
    pub fn json(&self) -> Value {
        json!({
            "state": serde_json::to_value(&self.state).unwrap(),
            "history": serde_json::to_value(&self.history).unwrap(),
            "log": serde_json::to_value(&self.entries).unwrap(),
        })
    }
}

/// Opens the redb file at `path` with this build's store and reads it all.
pub async fn read_store(path: &Path) -> Store {
    let (mut log, sm) = gpuq::raft::open_storage(path)
        .await
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let entries = log.try_get_log_entries(..).await.expect("log entries");
    let state = sm.state().read().unwrap().clone();
    let db = sm.db();
    let txn = db.begin_read().unwrap();
    let history =
        gpuq::state::history::query(&txn, &Default::default()).expect("history archive reads");
    Store {
        state,
        history,
        entries,
    }
}

fn sample<T: Serialize>(ty: &str, name: &str, v: &T) -> Sample {
    let bytes = rmp_serde::to_vec_named(v).expect("encode");
    Sample {
        ty: ty.into(),
        name: name.into(),
        msgpack_hex: hex::encode(&bytes),
        json: serde_json::to_value(v).expect("json"),
    }
}

/// The externally tagged variant name of a serialized enum value.
fn variant<T: Serialize>(v: &T) -> String {
    match serde_json::to_value(v).unwrap() {
        Value::String(s) => s,
        Value::Object(m) => m.keys().next().cloned().unwrap_or_default(),
        other => panic!("not an enum: {other}"),
    }
}

/// Every `Command` variant; a new one needs a sample here.
const COMMANDS: &[&str] = &[
    "InitCluster",
    "Submit",
    "Cancel",
    "Hold",
    "CreateToken",
    "RevokeToken",
    "TokenUsed",
    "RegisterNode",
    "Schedule",
    "NodeDown",
    "SetDrain",
    "GpuHealth",
    "Batch",
    "Archive",
    "Policy",
    "Preempt",
    "TaskEvents",
    "SubmitMany",
];

/// One sample of every message type and log command, from `store`.
pub fn samples(store: &Store, _dir: &Path) -> Vec<Sample> {
    let mut out = Vec::new();
    // Log commands as the release's leader proposed them: the first of each kind.
    let mut seen = std::collections::BTreeSet::new();
    for e in &store.entries {
        if let openraft::EntryPayload::Normal(cmd) = &e.payload {
            let mut add = |c: &Command| {
                let v = variant(c);
                if seen.insert(v.clone()) {
                    out.push(sample("Command", &v, c));
                }
            };
            add(cmd);
            if let Command::Batch(inner) = cmd {
                inner.iter().for_each(&mut add);
            }
        }
    }
    let jobs: Vec<&Job> = store.state.jobs.values().collect();
    let running = jobs
        .iter()
        .find(|j| j.state == JobState::Running)
        .expect("a running job in the golden state");
    let node = store.state.nodes.values().next().expect("a node");
    let spec = running.spec.clone();
    let hand = [
        Command::NodeDown {
            node: node.inventory.name.to_string(),
            reason: "no heartbeat for 10 s".into(),
            now: 1_700_000_000_000,
        },
        Command::GpuHealth {
            node: node.inventory.name.to_string(),
            gpus: node.inventory.gpus.clone(),
            now: 1_700_000_000_000,
        },
        Command::Archive {
            before: 1_700_000_000_000,
        },
        Command::Hold {
            by: "root".into(),
            admin: true,
            ids: vec![running.id],
            hold: false,
        },
    ];
    for c in &hand {
        let v = variant(c);
        if seen.insert(v.clone()) {
            out.push(sample("Command", &v, c));
        }
    }
    let missing: Vec<&&str> = COMMANDS.iter().filter(|c| !seen.contains(**c)).collect();
    assert!(missing.is_empty(), "no sample of Command {missing:?}");

    let results = [
        CommandResult::Noop,
        CommandResult::Submitted { id: running.id },
        CommandResult::Scheduled {
            started: vec![running.id],
            skipped: vec![(running.id, "no room".into())],
        },
        CommandResult::Rejected(gpuq::state::Rejection::NoSuchJob(running.id)),
        CommandResult::Batch(vec![CommandResult::TokenCreated]),
    ];
    for r in &results {
        out.push(sample("CommandResult", &variant(r), r));
    }

    // The client API.
    let requests = [
        ApiRequest::Submit {
            spec: Box::new(spec.clone()),
        },
        ApiRequest::Cancel {
            ids: vec![running.id],
            tasks: vec![],
        },
        ApiRequest::Queue {
            all: true,
            user: Some("root".into()),
            states: vec![JobState::Pending, JobState::Running],
            after: None,
        },
        ApiRequest::Show {
            id: running.id,
            task: Some(1),
        },
        ApiRequest::Cluster,
        ApiRequest::Nodes,
        ApiRequest::NodeDrain {
            node: "n1".into(),
            reason: "maintenance".into(),
            now: true,
        },
        ApiRequest::NodeResume { node: "n1".into() },
        ApiRequest::Logs {
            id: running.id,
            rank: 0,
            offset: 10,
        },
        ApiRequest::TokenCreate {
            role: Role::Agent,
            ttl_secs: 3600,
            uses: None,
        },
        ApiRequest::TokenList,
        ApiRequest::TokenRevoke { id: "abc".into() },
        ApiRequest::Acct {
            filter: Default::default(),
            summary: true,
        },
        ApiRequest::AddServer {
            id: 7,
            name: "s2".into(),
            addr: "10.0.0.2:7100".into(),
        },
        ApiRequest::RemoveServer { name: "s2".into() },
        ApiRequest::SnapshotSave {
            path: "/tmp/b.gpuq".into(),
        },
        ApiRequest::PolicyShow,
        ApiRequest::Share,
        ApiRequest::Priorities {
            ids: vec![running.id],
        },
        ApiRequest::SubmitMany {
            specs: vec![spec.clone()],
        },
    ];
    for r in &requests {
        out.push(sample("ApiRequest", &variant(r), r));
    }
    let caller = Caller {
        user: "root".into(),
        uid: 0,
        admin: true,
    };
    out.push(sample(
        "Vouched",
        "Submit",
        &Vouched {
            caller,
            request: requests[0].clone(),
        },
    ));
    let responses = [
        ApiResponse::Submitted { id: running.id },
        ApiResponse::Jobs {
            jobs: jobs.iter().take(4).map(|j| (*j).clone()).collect(),
            next: None,
        },
        ApiResponse::Job {
            job: Box::new((*running).clone()),
            placement: vec![],
        },
        ApiResponse::Policy {
            policy: Box::new((*store.state.policy).clone()),
            master_ports: store.state.master_ports(),
        },
        ApiResponse::error(ErrorKind::NotFound, "job 99 does not exist"),
        ApiResponse::SubmittedMany {
            ids: vec![running.id],
        },
    ];
    for r in &responses {
        out.push(sample("ApiResponse", &variant(r), r));
    }

    // The agent protocol.
    let run = running.run.as_ref().expect("a running job has a run");
    let hello = AgentHello {
        inventory: node.inventory.clone(),
        addr: node.addr.clone(),
        boot_id: 42,
        preflight: true,
    };
    out.push(sample("AgentHello", "AgentHello", &hello));
    let event = TaskEvent {
        key: TaskKey {
            job: running.id,
            attempt: run.attempt,
            rank: 0,
            step: None,
        },
        kind: TaskEventKind::Started,
    };
    let agent_msgs = [
        AgentMsg::Events {
            seq: 3,
            events: vec![event],
        },
        AgentMsg::Heartbeat,
        AgentMsg::Gpus {
            gpus: node.inventory.gpus.clone(),
        },
        AgentMsg::HealthCheck {
            ok: false,
            output: "nvidia-smi: failed".into(),
        },
    ];
    for m in &agent_msgs {
        out.push(sample("AgentMsg", &variant(m), m));
    }
    let task = DesiredTask {
        key: TaskKey {
            job: running.id,
            attempt: run.attempt,
            rank: 0,
            step: None,
        },
        node_rank: 0,
        local_rank: 0,
        ntasks_per_node: 1,
        num_nodes: 1,
        nodelist: vec![node.inventory.name.to_string()],
        user: running.user.clone(),
        job_name: spec.name.clone(),
        program: spec.program.clone(),
        workdir: spec.workdir.clone(),
        env: spec.env.clone(),
        output: spec.output.clone(),
        error: spec.error.clone(),
        gpus: vec![0, 1],
        cpus: vec![0, 1, 2],
        cpu_count: 3,
        memory_mb: 1024,
        time_limit_secs: spec.time_limit_secs,
        master_addr: run.master_addr.clone(),
        master_port: run.master_port,
        signal: None,
        array: None,
        kill_grace_secs: Some(5),
        facts: None,
        health: None,
        container: None,
        gpu_devices: Vec::new(),
    };
    let server_msgs = [
        ServerMsg::Welcome {
            node: "n1".into(),
            servers: vec!["127.0.0.1:7100".into()],
        },
        ServerMsg::Refused {
            reason: "not the leader".into(),
            leader_addr: Some("127.0.0.1:7101".into()),
        },
        ServerMsg::Desired {
            index: 9,
            tasks: vec![task],
            stopping: vec![],
            preempted: vec![],
        },
        ServerMsg::EventsCommitted { seq: 3 },
    ];
    for m in &server_msgs {
        out.push(sample("ServerMsg", &variant(m), m));
    }
    let log_req = LogRequest {
        job: running.id,
        job_name: spec.name.clone(),
        rank: 0,
        node_rank: 0,
        user: running.user.clone(),
        workdir: spec.workdir.clone(),
        output: None,
        offset: 0,
        max_bytes: 1 << 20,
        attempt: 0,
        step: None,
        stderr: false,
        array: None,
        node: String::new(),
    };
    out.push(sample("LogRequest", "LogRequest", &log_req));
    for r in [
        LogReply::Chunk {
            data: b"hello\n".to_vec(),
            size: 6,
        },
        LogReply::Missing {
            path: "/tmp/gpuq-1.out".into(),
        },
        LogReply::Refused {
            reason: "not yours".into(),
        },
    ] {
        out.push(sample("LogReply", &variant(&r), &r));
    }

    // Connection openings.
    let build = "0.1.0".to_string();
    out.push(sample(
        "Hello",
        "Hello",
        &gpuq::net::hello::Hello {
            protocol: 1,
            build: build.clone(),
        },
    ));
    for r in [
        gpuq::net::hello::HelloReply::HelloAck {
            protocol: 1,
            build: build.clone(),
        },
        gpuq::net::hello::HelloReply::Mismatch {
            protocol: 2,
            build: build.clone(),
        },
    ] {
        out.push(sample("HelloReply", &variant(&r), &r));
    }
    out.push(sample(
        "LocalHello",
        "LocalHello",
        &gpuq::net::local::LocalHello {
            protocol: 1,
            build: build.clone(),
        },
    ));
    out.push(sample(
        "JoinRequest",
        "JoinRequest",
        &gpuq::net::JoinRequest {
            token_id: "abc123".into(),
            secret: "s3cret".into(),
            role: Role::Server,
            name: "s2".into(),
            csr_pem: "-----BEGIN CERTIFICATE REQUEST-----".into(),
        },
    ));
    let ca = store
        .state
        .cluster
        .as_ref()
        .expect("cluster")
        .ca_cert_pem
        .clone();
    for r in [
        gpuq::net::JoinResponse::Ok {
            cert_pem: ca.clone(),
            ca_cert_pem: ca.clone(),
            proof: Some("proof".into()),
        },
        gpuq::net::JoinResponse::Refused {
            reason: "the token expired".into(),
        },
    ] {
        out.push(sample("JoinResponse", &variant(&r), &r));
    }

    // Raft between servers: the release's own entries, votes and a snapshot chunk.
    let last = store.entries.last().expect("log entries").log_id;
    let vote = openraft::Vote::new_committed(last.leader_id.term, last.leader_id.node_id);
    let append = RaftRequest::AppendEntries(openraft::raft::AppendEntriesRequest {
        vote,
        prev_log_id: None,
        entries: store.entries.iter().take(6).cloned().collect(),
        leader_commit: Some(last),
    });
    out.push(sample("RaftRequest", "AppendEntries", &append));
    let vote_req = RaftRequest::Vote(openraft::raft::VoteRequest {
        vote,
        last_log_id: Some(last),
    });
    out.push(sample("RaftRequest", "Vote", &vote_req));
    let meta = gpuq::raft::backup::read(&_dir.join("backup.gpuq"))
        .expect("backup")
        .meta;
    let chunk = RaftRequest::InstallSnapshot(openraft::raft::InstallSnapshotRequest {
        vote,
        meta: meta.clone(),
        offset: 0,
        data: b"chunk".to_vec(),
        done: false,
    });
    out.push(sample("RaftRequest", "InstallSnapshot", &chunk));
    let responses = [
        RaftResponse::AppendEntries(openraft::raft::AppendEntriesResponse::Success),
        RaftResponse::AppendEntries(openraft::raft::AppendEntriesResponse::Conflict),
        RaftResponse::Vote(openraft::raft::VoteResponse {
            vote,
            vote_granted: true,
            last_log_id: Some(last),
        }),
        RaftResponse::InstallSnapshot(openraft::raft::InstallSnapshotResponse { vote }),
        RaftResponse::Error("no".into()),
    ];
    for r in &responses {
        out.push(sample("RaftResponse", &variant(r), r));
    }
    out
}
