//! The wire: frames on the local socket (`LocalHello`, then `ApiRequest`s),
//! the agent sync protocol both ways, log requests, and Raft RPCs, as a peer
//! holding a valid certificate could send them. Inputs are streams of
//! frames read with the one frame codec (`net::frame::read_frame`) exactly
//! as the daemons read them; what decodes is re-encoded (it must decode to
//! the same encoding: a message the reader accepts but the writer cannot
//! reproduce is a bug) and handed to the receiving side's pure code where
//! it has some (the agent's `task_spec` for desired tasks). The leader's
//! handling of what decodes (apply, the scheduler) is in `cluster`.

use std::sync::OnceLock;

use gpuq::net::agent_proto::{AgentHello, AgentMsg, LogReply, LogRequest, ServerMsg};
use gpuq::net::frame::read_frame;
use gpuq::net::local::LocalHello;
use gpuq::net::proto::ApiRequest;
use gpuq::raft::network::RaftRequest;
use rand::rngs::StdRng;
use rand::Rng;
use serde::de::DeserializeOwned;
use serde::Serialize;

use super::{mutate, seeds, Target};

/// The cap the fuzzed readers use: small, so an honest length lie is cheap
/// to refuse, and large enough for every seed.
const MAX_FRAME: usize = 1 << 20;

pub fn targets() -> Vec<Target> {
    vec![
        Target {
            name: "frame-local",
            weight: 20,
            generate: gen_local,
            check: check_local,
        },
        Target {
            name: "frame-bytes",
            weight: 10,
            generate: gen_bytes,
            check: check_local,
        },
        Target {
            name: "agent-proto",
            weight: 15,
            generate: gen_agent,
            check: check_agent,
        },
        Target {
            name: "raft-proto",
            weight: 10,
            generate: gen_raft,
            check: check_raft,
        },
    ]
}

/// Encoded seeds of one message type.
pub struct Bodies(Vec<Vec<u8>>);

impl Bodies {
    pub fn of<T: Serialize>(values: &[T]) -> Bodies {
        Bodies(
            values
                .iter()
                .map(|v| rmp_serde::to_vec_named(v).expect("a seed encodes"))
                .collect(),
        )
    }

    /// A seed, mutated at the value level with probability `p`.
    pub fn pick(&self, rng: &mut StdRng, p: f64, words: &[&str]) -> Vec<u8> {
        let mut body = self.0[rng.gen_range(0..self.0.len())].clone();
        if rng.gen_bool(p) {
            mutate::msgpack(rng, &mut body, words);
        }
        body
    }
}

/// Words the protocols' strings are made of.
const WIRE_WORDS: &[&str] = &[
    "n1",
    "n4",
    "alice",
    "bob",
    "root",
    "gpu",
    "high",
    "normal",
    "physics",
    "/tmp",
    "s1:7420",
    "Submit",
    "Cancel",
    "Heartbeat",
    "Events",
    "Desired",
    "AppendEntries",
    "Vote",
];

/// Appends `body` as one frame; sometimes its length prefix lies.
fn push_frame(out: &mut Vec<u8>, body: &[u8], rng: &mut StdRng, lie: f64) {
    let honest = body.len() as u32;
    let len = if rng.gen_bool(lie) {
        match rng.gen_range(0..6) {
            0 => honest.wrapping_add(1),
            1 => honest.saturating_sub(1),
            2 => 0,
            3 => MAX_FRAME as u32 + 1,
            4 => u32::MAX,
            _ => rng.gen(),
        }
    } else {
        honest
    };
    out.extend_from_slice(&len.to_be_bytes());
    out.extend_from_slice(body);
}

fn local_seeds() -> &'static (Bodies, Bodies) {
    static S: OnceLock<(Bodies, Bodies)> = OnceLock::new();
    S.get_or_init(|| {
        (
            Bodies::of(&seeds::hellos()),
            Bodies::of(&seeds::api_requests()),
        )
    })
}

/// A hello and one to three requests, as the CLI sends them.
fn gen_local(rng: &mut StdRng) -> Vec<u8> {
    let (hellos, requests) = local_seeds();
    let mut out = Vec::new();
    push_frame(&mut out, &hellos.pick(rng, 0.1, WIRE_WORDS), rng, 0.02);
    for _ in 0..rng.gen_range(1..=3) {
        push_frame(&mut out, &requests.pick(rng, 0.9, WIRE_WORDS), rng, 0.05);
    }
    if rng.gen_bool(0.1) {
        mutate::bytes(rng, &mut out);
    }
    out
}

/// Bytes with no structure at all, sometimes behind a valid hello.
fn gen_bytes(rng: &mut StdRng) -> Vec<u8> {
    let (hellos, _) = local_seeds();
    let mut out = Vec::new();
    if rng.gen_bool(0.5) {
        push_frame(&mut out, &hellos.pick(rng, 0.0, &[]), rng, 0.0);
    }
    let n = rng.gen_range(0..64);
    let mut junk: Vec<u8> = (0..n).map(|_| rng.gen()).collect();
    if rng.gen_bool(0.5) {
        // A plausible length prefix, so the junk reaches the decoder.
        let prefix = (junk.len() as u32).to_be_bytes();
        junk.splice(0..0, prefix);
    }
    out.extend(junk);
    out
}

/// The local socket as a daemon reads it: the hello, then requests until
/// the stream ends or a frame is refused.
fn check_local(input: &[u8]) {
    let mut r = input;
    if read_one::<LocalHello>(&mut r).is_none() {
        return;
    }
    while let Some(req) = read_one::<ApiRequest>(&mut r) {
        match &req {
            ApiRequest::Submit { spec } => {
                let _ = spec.check_invariants();
            }
            ApiRequest::SubmitMany { specs } => {
                for spec in specs {
                    let _ = spec.check_invariants();
                }
            }
            _ => {}
        }
    }
}

/// Reads one frame; `None` at the end or on any error (the daemons drop the
/// stream then). A decoded message must survive a re-encoding.
pub fn read_one<T: Serialize + DeserializeOwned>(r: &mut &[u8]) -> Option<T> {
    let value: T = futures::executor::block_on(read_frame(r, MAX_FRAME))
        .ok()
        .flatten()?;
    round_trips(&value);
    Some(value)
}

/// Panics if `value` does not decode from its own encoding to the same
/// encoding.
pub fn round_trips<T: Serialize + DeserializeOwned>(value: &T) {
    let Ok(once) = rmp_serde::to_vec_named(value) else {
        panic!("a decoded message could not be encoded again");
    };
    let again: T = match rmp_serde::from_slice(&once) {
        Ok(v) => v,
        Err(e) => panic!("a decoded message, encoded again, does not decode: {e}"),
    };
    let twice = rmp_serde::to_vec_named(&again).ok();
    assert!(
        twice.as_deref() == Some(&once[..]),
        "a decoded message changes when encoded and decoded again"
    );
}

struct AgentSeeds {
    hellos: Bodies,
    msgs: Bodies,
    server: Bodies,
    log_req: Bodies,
    log_reply: Bodies,
}

fn agent_seeds() -> &'static AgentSeeds {
    static S: OnceLock<AgentSeeds> = OnceLock::new();
    S.get_or_init(|| AgentSeeds {
        hellos: Bodies::of(&seeds::agent_hellos()),
        msgs: Bodies::of(&seeds::agent_msgs()),
        server: Bodies::of(&seeds::server_msgs()),
        log_req: Bodies::of(&seeds::log_requests()),
        log_reply: Bodies::of(&seeds::log_replies()),
    })
}

/// The first byte says which stream the frames after it are: 0 an agent's
/// sync stream to the leader, 1 the leader's to an agent, 2 a log request,
/// 3 a log reply.
fn gen_agent(rng: &mut StdRng) -> Vec<u8> {
    let s = agent_seeds();
    let kind: u8 = rng.gen_range(0..4);
    let mut out = vec![kind];
    match kind {
        0 => {
            push_frame(&mut out, &s.hellos.pick(rng, 0.5, WIRE_WORDS), rng, 0.02);
            for _ in 0..rng.gen_range(1..=3) {
                push_frame(&mut out, &s.msgs.pick(rng, 0.8, WIRE_WORDS), rng, 0.02);
            }
        }
        1 => {
            for _ in 0..rng.gen_range(1..=3) {
                push_frame(&mut out, &s.server.pick(rng, 0.8, WIRE_WORDS), rng, 0.02);
            }
        }
        2 => push_frame(&mut out, &s.log_req.pick(rng, 0.9, WIRE_WORDS), rng, 0.02),
        _ => push_frame(&mut out, &s.log_reply.pick(rng, 0.9, WIRE_WORDS), rng, 0.02),
    }
    out
}

fn check_agent(input: &[u8]) {
    let Some((&kind, mut r)) = input.split_first() else {
        return;
    };
    match kind {
        0 => {
            if read_one::<AgentHello>(&mut r).is_some() {
                while read_one::<AgentMsg>(&mut r).is_some() {}
            }
        }
        1 => {
            while let Some(msg) = read_one::<ServerMsg>(&mut r) {
                if let ServerMsg::Desired { tasks, .. } = msg {
                    // What the agent builds before it starts each task.
                    for task in &tasks {
                        let _ = gpuq::agent::runner::task_spec(
                            task,
                            false,
                            10,
                            std::path::Path::new("/nonexistent/spool"),
                        );
                    }
                }
            }
        }
        2 => {
            let _ = read_one::<LogRequest>(&mut r);
        }
        _ => {
            let _ = read_one::<LogReply>(&mut r);
        }
    }
}

fn raft_seeds() -> &'static Bodies {
    static S: OnceLock<Bodies> = OnceLock::new();
    S.get_or_init(|| Bodies::of(&super::cluster::raft_requests()))
}

fn gen_raft(rng: &mut StdRng) -> Vec<u8> {
    let mut out = Vec::new();
    for _ in 0..rng.gen_range(1..=2) {
        push_frame(
            &mut out,
            &raft_seeds().pick(rng, 0.9, WIRE_WORDS),
            rng,
            0.02,
        );
    }
    out
}

/// Raft RPCs as a server reads them off a `gpuq-raft/1` stream; the log
/// entries they carry are applied by the `raft-apply` target.
fn check_raft(input: &[u8]) {
    let mut r = input;
    while let Some(req) = read_one::<RaftRequest>(&mut r) {
        super::cluster::receive_raft(&req);
    }
}
