//! Valid values of every message the targets decode: the starting points
//! that the mutators bend. They are built with gpuq's own code where it has
//! some (job specs come from `spec::build_spec` over real flag lines, node
//! inventories from the simulator's fake GPUs), so they look like what a
//! real peer sends, extra fields and all.

use clap::Parser;
use gpuq::model::{
    Allocation, GpuInfo, JobId, JobRef, JobSpec, JobState, NodeAllocation, NodeInventory, Role,
    TaskEnd, TaskEvent, TaskEventKind, TaskKey, TokenRecord,
};
use gpuq::net::agent_proto::{AgentHello, AgentMsg, DesiredTask, LogReply, LogRequest, ServerMsg};
use gpuq::net::local::LocalHello;
use gpuq::net::proto::ApiRequest;
use gpuq::state::{AccountPatch, Command, Limit, Op, PartitionPatch, PolicyChange, QosPatch};

/// The nodes of the fixture cluster, as `(name, GPUs)`.
pub const NODES: &[(&str, u32)] = &[("n1", 8), ("n2", 8), ("n3", 4)];

/// Flag lines of `gpuq submit`, from the plainest to one that sets nearly
/// everything; also the vocabulary of the spec targets.
pub const FLAG_LINES: &[&[&str]] = &[
    &["--", "true"],
    &[
        "-N",
        "2",
        "--gpus-per-node",
        "4",
        "--ntasks-per-node",
        "4",
        "-t",
        "1:00:00",
        "--",
        "python",
        "train.py",
    ],
    &[
        "--gres",
        "gpu:h100:8",
        "--mem",
        "64G",
        "-c",
        "8",
        "-J",
        "big",
        "--",
        "run",
    ],
    &[
        "-G",
        "16",
        "--gpu-type",
        "h100",
        "-C",
        "ib,nvme",
        "--topology",
        "leaf",
        "--wrap",
        "echo hi",
    ],
    &[
        "--array",
        "0-99%8",
        "--dependency",
        "afterok:1:2,singleton",
        "--begin",
        "now+10min",
        "--hold",
        "--wrap",
        "x",
    ],
    &[
        "-w",
        "n[1-4]",
        "-x",
        "n5",
        "--signal",
        "B:USR1@60",
        "-t",
        "10",
        "--requeue",
        "--max-restarts",
        "5",
        "-o",
        "out-%j-%t.log",
        "-e",
        "err-%x.log",
        "--export",
        "NONE,FOO=bar",
        "-A",
        "acct",
        "-p",
        "gpu",
        "-q",
        "high",
        "--nice",
        "10",
        "-D",
        "sub",
        "--",
        "cmd",
        "arg",
    ],
    &[
        "--gpus-per-node",
        "2",
        "--no-requeue",
        "--mem",
        "1T",
        "-t",
        "2-00:00:00",
        "--",
        "sleep",
        "9",
    ],
];

/// The `gpuq submit` flags as a parser of their own (the spec module's
/// directive parser is private; this is the same `SubmitArgs`).
#[derive(Parser, Debug)]
#[command(name = "submit", no_binary_name = true)]
pub struct Flags {
    #[command(flatten)]
    pub args: gpuq::spec::SubmitArgs,
}

/// The job specs `build_spec` makes of [`FLAG_LINES`].
pub fn specs() -> Vec<JobSpec> {
    let env = [("PATH".to_string(), "/usr/bin:/bin".to_string())];
    FLAG_LINES
        .iter()
        .map(|line| {
            let flags = Flags::try_parse_from(*line).expect("a seed flag line parses");
            gpuq::spec::build_spec(&flags.args, &env, std::path::Path::new("/tmp"))
                .unwrap_or_else(|e| panic!("seed flag line {line:?}: {e}"))
        })
        .collect()
}

/// A node's inventory as an agent with fake GPUs reports it.
pub fn inventory(name: &str, gpus: u32) -> NodeInventory {
    gpuq::sim::fleet::sim_inventory(name, gpus, "spine1/leaf1").expect("a fake inventory")
}

pub fn api_requests() -> Vec<ApiRequest> {
    let mut out: Vec<ApiRequest> = specs()
        .into_iter()
        .map(|spec| ApiRequest::Submit {
            spec: Box::new(spec),
        })
        .collect();
    out.extend([
        ApiRequest::SubmitMany { specs: specs() },
        ApiRequest::Cancel {
            ids: vec![JobId(1), JobId(2)],
            tasks: vec![JobRef {
                id: JobId(3),
                task: Some(4),
            }],
        },
        ApiRequest::Hold {
            jobs: vec![JobRef {
                id: JobId(1),
                task: None,
            }],
            hold: true,
        },
        ApiRequest::Queue {
            all: true,
            user: Some("alice".into()),
            states: vec![JobState::Pending, JobState::Running],
            after: None,
        },
        ApiRequest::Show {
            id: JobId(1),
            task: Some(0),
        },
        ApiRequest::NodeDrain {
            node: "n1".into(),
            reason: "maintenance".into(),
            now: true,
        },
        ApiRequest::Logs {
            id: JobId(1),
            rank: 0,
            offset: 0,
        },
        ApiRequest::TokenCreate {
            role: Role::Agent,
            ttl_secs: 3600,
            uses: Some(1),
        },
        ApiRequest::NodeReplace {
            node: "node01".into(),
        },
        ApiRequest::UseToken { id: "t1".into() },
        ApiRequest::Acct {
            filter: gpuq::model::acct::AcctFilter {
                user: Some("alice".into()),
                account: None,
                states: vec![JobState::Completed],
                since: Some(1),
                until: Some(2),
                ids: vec![JobId(3)],
                names: vec!["train".into()],
                active: true,
                after: Some(JobId(2)),
                limit: Some(100),
            },
            summary: true,
        },
        ApiRequest::Update {
            jobs: vec![JobRef {
                id: JobId(4),
                task: None,
            }],
            change: gpuq::model::JobUpdate {
                time_limit_secs: Some(Some(600)),
                name: Some("renamed".into()),
                ..Default::default()
            },
        },
        ApiRequest::AddServer {
            id: 2,
            name: "s2".into(),
            addr: "10.0.0.2:7420".into(),
        },
        ApiRequest::SnapshotSave {
            path: "/tmp/snap".into(),
        },
        ApiRequest::Priorities {
            ids: vec![JobId(1)],
        },
    ]);
    out.extend(
        policy_changes()
            .into_iter()
            .map(|change| ApiRequest::Admin { change }),
    );
    out
}

pub fn policy_changes() -> Vec<PolicyChange> {
    vec![
        PolicyChange::Account {
            op: Op::Add,
            name: "physics".into(),
            patch: AccountPatch {
                parent: Some("root".into()),
                shares: Some(10),
                add_users: vec!["alice".into()],
                max_gpus: Some(Limit::Max(16)),
                guaranteed_gpus: Some(4),
                default_for: vec!["alice".into()],
                ..Default::default()
            },
        },
        PolicyChange::Qos {
            op: Op::Add,
            name: "high".into(),
            patch: QosPatch {
                priority: Some(100),
                preempts: Some(vec!["normal".into()]),
                grace_secs: Some(Limit::Max(30)),
                max_gpus_per_user: Some(Limit::Unlimited),
                max_gpus_per_job: Some(Limit::Max(64)),
                ..Default::default()
            },
        },
        PolicyChange::Partition {
            op: Op::Add,
            name: "gpu".into(),
            patch: PartitionPatch {
                nodes: Some("n[1-2]".into()),
                default_time_secs: Some(Limit::Max(3600)),
                max_time_secs: Some(Limit::Max(86_400)),
                priority: Some(5),
                default: Some(false),
                state: None,
            },
        },
        PolicyChange::Priority(gpuq::state::PriorityPatch {
            age: Some(1000),
            fairshare: Some(10_000),
            max_age_secs: Some(604_800),
            half_life_secs: Some(86_400),
            ..Default::default()
        }),
        PolicyChange::MasterPorts {
            range: "29500-29999".into(),
        },
    ]
}

pub fn hellos() -> Vec<LocalHello> {
    vec![LocalHello {
        protocol: gpuq::net::PROTOCOL_VERSION,
        build: "0.1.0".into(),
    }]
}

pub fn task_events() -> Vec<TaskEvent> {
    let ev = |job, rank, kind| TaskEvent {
        key: TaskKey {
            job: JobId(job),
            attempt: 1,
            rank,
            step: None,
        },
        kind,
    };
    vec![
        ev(1, 0, TaskEventKind::Started),
        ev(1, 1, TaskEventKind::Ended(TaskEnd::Completed)),
        ev(
            2,
            0,
            TaskEventKind::Ended(TaskEnd::Failed {
                exit_code: Some(3),
                signal: None,
            }),
        ),
        ev(
            3,
            2,
            TaskEventKind::Ended(TaskEnd::Lost {
                reason: "gone".into(),
            }),
        ),
    ]
}

pub fn gpus() -> Vec<GpuInfo> {
    let mut gpus = inventory("n1", 2).gpus;
    if let Some(g) = gpus.first_mut() {
        g.healthy = false;
        g.fault = Some("Xid 79".into());
    }
    gpus
}

pub fn agent_hellos() -> Vec<AgentHello> {
    NODES
        .iter()
        .map(|&(name, n)| AgentHello {
            inventory: inventory(name, n),
            addr: format!("{name}:7421"),
            boot_id: 7,
            preflight: name == "n3",
        })
        .collect()
}

pub fn agent_msgs() -> Vec<AgentMsg> {
    vec![
        AgentMsg::Events {
            seq: 1,
            events: task_events(),
        },
        AgentMsg::Heartbeat,
        AgentMsg::Gpus { gpus: gpus() },
        AgentMsg::HealthCheck {
            ok: false,
            output: "ib0 down".into(),
        },
    ]
}

pub fn desired_task() -> DesiredTask {
    DesiredTask {
        key: TaskKey {
            job: JobId(1),
            attempt: 1,
            rank: 1,
            step: None,
        },
        node_rank: 0,
        local_rank: 1,
        ntasks_per_node: 2,
        num_nodes: 1,
        nodelist: vec!["n1".into()],
        user: "alice".into(),
        job_name: "train".into(),
        program: gpuq::model::Program::Command {
            argv: vec!["python".into(), "train.py".into()],
        },
        workdir: "/tmp".into(),
        env: vec![("PATH".into(), "/usr/bin".into())],
        output: Some("out-%j-%t.log".into()),
        error: None,
        gpus: vec![0, 1, 2, 3],
        cpus: vec![0, 1, 2, 3],
        cpu_count: 4,
        memory_mb: 1024,
        time_limit_secs: Some(600),
        master_addr: "n1".into(),
        master_port: 29500,
        signal: None,
        array: None,
        kill_grace_secs: Some(10),
        facts: None,
        health: None,
        container: None,
        gpu_devices: Vec::new(),
    }
}

pub fn server_msgs() -> Vec<ServerMsg> {
    vec![
        ServerMsg::Welcome {
            node: "n1".into(),
            servers: vec!["s1:7420".into(), "s2:7420".into()],
        },
        ServerMsg::Refused {
            reason: "not the leader".into(),
            leader_addr: Some("s2:7420".into()),
        },
        ServerMsg::Desired {
            index: 9,
            tasks: vec![desired_task(), desired_task()],
            stopping: vec![],
            preempted: vec![],
        },
        ServerMsg::Desired {
            index: 10,
            tasks: vec![desired_task()],
            stopping: vec![gpuq::model::TaskKey {
                job: JobId(7),
                attempt: 1,
                rank: 3,
                step: None,
            }],
            preempted: vec![JobId(7)],
        },
        ServerMsg::EventsCommitted { seq: 3 },
    ]
}

pub fn log_requests() -> Vec<LogRequest> {
    vec![LogRequest {
        job: JobId(1),
        job_name: "train".into(),
        rank: 0,
        node_rank: 0,
        user: "alice".into(),
        workdir: "/tmp".into(),
        output: Some("out-%j-%t.log".into()),
        offset: 0,
        max_bytes: gpuq::net::agent_proto::MAX_LOG_CHUNK,
        attempt: 0,
        step: None,
        stderr: false,
        array: None,
        node: String::new(),
    }]
}

pub fn log_replies() -> Vec<LogReply> {
    vec![
        LogReply::Chunk {
            data: b"epoch 1 loss 0.3\n".to_vec(),
            size: 17,
        },
        LogReply::Missing {
            path: "/tmp/out-1-0.log".into(),
        },
        LogReply::Refused {
            reason: "not yours".into(),
        },
    ]
}

/// Commands that make sense on the fixture cluster (jobs 1.. exist once
/// the submits are applied), the raw material of the log-entry targets.
pub fn commands() -> Vec<Command> {
    let now = 1_000_000;
    let mut out: Vec<Command> = specs()
        .into_iter()
        .map(|spec| Command::Submit {
            user: "alice".into(),
            spec: Box::new(spec),
            now,
        })
        .collect();
    out.extend([
        Command::SubmitMany {
            user: "bob".into(),
            specs: specs(),
            now,
        },
        Command::Schedule {
            allocations: vec![Allocation {
                job: JobId(1),
                nodes: vec![NodeAllocation {
                    node: "n1".into(),
                    gpus: vec![0, 1, 2, 3],
                    cpus: vec![0, 1],
                    cpu_count: 2,
                    memory_mb: 1024,
                }],
            }],
            now: now + 1,
        },
        Command::TaskEvents {
            node: "n1".into(),
            events: task_events(),
            now: now + 2,
            gpu_use: Vec::new(),
        },
        Command::Cancel {
            by: "alice".into(),
            admin: false,
            ids: vec![JobId(2)],
            now: now + 3,
        },
        Command::Hold {
            by: "root".into(),
            admin: true,
            ids: vec![JobId(3)],
            hold: true,
        },
        Command::SetDrain {
            node: "n2".into(),
            drain: Some("maintenance".into()),
            by: gpuq::state::DrainSource::default(),
            user: Some("root".into()),
            requeue_now: true,
            now: now + 4,
        },
        Command::NodeDown {
            node: "n3".into(),
            reason: "silent".into(),
            now: now + 5,
        },
        Command::GpuHealth {
            node: "n1".into(),
            gpus: gpus(),
            now: now + 6,
        },
        Command::Preempt {
            preemptions: vec![gpuq::sched::Preemption {
                job: JobId(4),
                victims: vec![JobId(1)],
                why: vec!["qos".into()],
                shrinks: Vec::new(),
            }],
            now: now + 7,
        },
        Command::Resize {
            growths: vec![gpuq::sched::Growth {
                job: JobId(1),
                added: Allocation {
                    job: JobId(1),
                    nodes: vec![NodeAllocation {
                        node: "n2".into(),
                        gpus: vec![0, 1, 2, 3],
                        cpus: vec![0, 1],
                        cpu_count: 2,
                        memory_mb: 1024,
                    }],
                },
            }],
            now: now + 7,
        },
        Command::SetShare {
            node: "n2".into(),
            slots: Some(4),
            now: now + 7,
        },
        Command::Archive { before: now + 8 },
        Command::CreateToken {
            record: TokenRecord {
                id: "t1".into(),
                secret_sha256: "00".repeat(32),
                role: Role::Agent,
                created_at: now,
                expires_at: now + 10_000,
                created_by: "root".into(),
                revoked: false,
                uses: 0,
                max_uses: Some(2),
            },
        },
        Command::RevokeToken {
            id: "t1".into(),
            now: now + 9,
        },
        Command::RegisterNode {
            inventory: inventory("n4", 2),
            addr: "n4:7421".into(),
            preflight: false,
            now: now + 10,
            cert_sha256: "ab".repeat(32),
        },
        Command::AllowReplace {
            node: "n4".into(),
            now: now + 11,
        },
    ]);
    out.extend(policy_changes().into_iter().map(|change| Command::Policy {
        change,
        by: "root".into(),
        now: now + 11,
    }));
    let batch = Command::Batch(out[..3].to_vec());
    out.push(batch);
    out
}
