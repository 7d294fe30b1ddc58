//! What earlier releases wrote, read by this build: the golden data under
//! `tests/golden/<commit>/` (made by `scripts/golden.sh` on that commit).
//!
//! Each release's directory holds a server's redb file (log and state), a
//! backup file, and MessagePack samples of every wire message and log
//! command, each with the JSON of what the release itself decoded. This
//! build must decode every one of them, and what it decodes must still hold
//! every field and value the release saw (added fields, filled by
//! `#[serde(default)]`, are allowed; a renamed field, a changed enum tag, a
//! new field without a default, or a changed meaning of a value fail here).
//! `tests/upgrade.rs` starts a real server on the golden data dir.

mod common;

use std::path::{Path, PathBuf};

use gpuq::net::agent_proto::{AgentHello, AgentMsg, LogReply, LogRequest, ServerMsg};
use gpuq::net::proto::{ApiRequest, ApiResponse, Vouched};
use gpuq::raft::{RaftRequest, RaftResponse};
use gpuq::state::{Command, CommandResult};
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::Value;

#[path = "golden/samples.rs"]
mod golden_samples;

use common::golden::releases;

/// Where `new` (today's reading) lost or changed something of `old` (the
/// release's reading): every key of every object in `old` must be in `new`
/// with a value that holds it in turn; arrays must match element for element.
fn lost(old: &Value, new: &Value, at: &str, out: &mut Vec<String>) {
    match (old, new) {
        (Value::Object(o), Value::Object(n)) => {
            for (k, ov) in o {
                match n.get(k) {
                    Some(nv) => lost(ov, nv, &format!("{at}.{k}"), out),
                    None => out.push(format!("{at}.{k}: gone (was {ov})")),
                }
            }
        }
        (Value::Array(o), Value::Array(n)) if o.len() == n.len() => {
            for (i, (ov, nv)) in o.iter().zip(n).enumerate() {
                lost(ov, nv, &format!("{at}[{i}]"), out);
            }
        }
        _ if old == new => {}
        _ => out.push(format!("{at}: was {old}, now {new}")),
    }
}

/// Asserts that `new` holds everything of `old`.
pub fn assert_holds(what: &str, old: &Value, new: &Value) {
    let mut diffs = Vec::new();
    lost(old, new, "", &mut diffs);
    assert!(
        diffs.is_empty(),
        "{what}: this build reads the release's data differently:\n{}",
        diffs.join("\n")
    );
}

fn json_of<T: DeserializeOwned + Serialize>(bytes: &[u8]) -> Result<Value, String> {
    let v: T = rmp_serde::from_slice(bytes).map_err(|e| e.to_string())?;
    serde_json::to_value(&v).map_err(|e| e.to_string())
}

/// Decodes a sample of the named type with today's code, as JSON.
pub fn decode(ty: &str, bytes: &[u8]) -> Result<Value, String> {
    match ty {
        "Command" => json_of::<Command>(bytes),
        "CommandResult" => json_of::<CommandResult>(bytes),
        "LogEntry" => json_of::<gpuq::raft::LogEntry>(bytes),
        "ApiRequest" => json_of::<ApiRequest>(bytes),
        "Vouched" => json_of::<Vouched>(bytes),
        "ApiResponse" => json_of::<ApiResponse>(bytes),
        "AgentHello" => json_of::<AgentHello>(bytes),
        "AgentMsg" => json_of::<AgentMsg>(bytes),
        "ServerMsg" => json_of::<ServerMsg>(bytes),
        "LogRequest" => json_of::<LogRequest>(bytes),
        "LogReply" => json_of::<LogReply>(bytes),
        "Hello" => json_of::<gpuq::net::hello::Hello>(bytes),
        "HelloReply" => json_of::<gpuq::net::hello::HelloReply>(bytes),
        "LocalHello" => json_of::<gpuq::net::local::LocalHello>(bytes),
        "JoinRequest" => json_of::<gpuq::net::join::JoinRequest>(bytes),
        "JoinResponse" => json_of::<gpuq::net::join::JoinResponse>(bytes),
        "RaftRequest" => json_of::<RaftRequest>(bytes),
        "RaftResponse" => json_of::<RaftResponse>(bytes),
        "Backup" => json_of::<gpuq::raft::backup::Backup>(bytes),
        other => Err(format!("no decoder for type {other} (add it to decode())")),
    }
}

/// One encoded sample: its type, a name, the bytes and the JSON of the value.
#[derive(serde::Serialize, serde::Deserialize)]
pub struct Sample {
    pub ty: String,
    pub name: String,
    pub msgpack_hex: String,
    pub json: Value,
}

#[test]
fn every_wire_sample_and_log_command_of_an_earlier_release_decodes_to_what_it_was() {
    for rel in releases() {
        let text = std::fs::read_to_string(rel.join("wire.json")).expect("wire.json");
        let samples: Vec<Sample> = serde_json::from_str(&text).expect("wire.json parses");
        assert!(samples.len() > 50, "{}: too few samples", rel.display());
        let mut failed = Vec::new();
        for s in &samples {
            let bytes = hex::decode(&s.msgpack_hex).expect("hex");
            match decode(&s.ty, &bytes) {
                Ok(now) => {
                    let mut diffs = Vec::new();
                    lost(&s.json, &now, "", &mut diffs);
                    if !diffs.is_empty() {
                        failed.push(format!("{} {}: {}", s.ty, s.name, diffs.join("; ")));
                    }
                }
                Err(e) => failed.push(format!("{} {}: does not decode: {e}", s.ty, s.name)),
            }
        }
        assert!(
            failed.is_empty(),
            "{}: {} of {} samples read differently:\n{}",
            rel.display(),
            failed.len(),
            samples.len(),
            failed.join("\n")
        );
    }
}

/// A copy of a release's data dir under `to`.
fn copy_data(rel: &Path, to: &Path) -> PathBuf {
    let data = to.join("data");
    common::golden::copy_release_data(rel, &data);
    data
}

#[tokio::test]
async fn the_log_state_and_history_of_an_earlier_release_decode_to_what_they_were() {
    for rel in releases() {
        let dir = tempfile::tempdir().unwrap();
        let data = copy_data(&rel, dir.path());
        let read = golden_samples::read_store(&data.join("gpuq.redb"))
            .await
            .json();
        let golden: Value =
            serde_json::from_str(&std::fs::read_to_string(rel.join("state.json")).unwrap())
                .unwrap();
        assert_holds("state", &golden["state"], &read["state"]);
        assert_holds("history", &golden["history"], &read["history"]);
        let log: Value =
            serde_json::from_str(&std::fs::read_to_string(rel.join("log.json")).unwrap()).unwrap();
        assert_holds("log", &log, &read["log"]);
        let jobs = read["state"]["jobs"].as_object().map_or(0, |j| j.len());
        assert!(jobs >= 10, "the golden state holds {jobs} jobs");
    }
}

#[test]
fn the_backup_of_an_earlier_release_reads_with_its_state_and_membership() {
    for rel in releases() {
        let backup = gpuq::raft::backup::read(&rel.join("backup.gpuq")).expect("backup reads");
        let saved: Value =
            serde_json::from_str(&std::fs::read_to_string(rel.join("cli/snapshot.json")).unwrap())
                .unwrap();
        let last = backup.meta.last_log_id.expect("a last log id");
        assert_eq!(Some(last.index), saved["index"].as_u64());
        assert_eq!(Some(last.leader_id.term), saved["term"].as_u64());
        let golden: Value =
            serde_json::from_str(&std::fs::read_to_string(rel.join("state.json")).unwrap())
                .unwrap();
        assert_holds(
            "backup meta",
            &golden["backup_meta"],
            &serde_json::to_value(&backup.meta).unwrap(),
        );
    }
}

/// Round-trips this build's samples (and, with `GPUQ_GOLDEN_WRITE=DIR`, after
/// `scripts/golden.sh` has put a data dir there, writes DIR's wire.json,
/// state.json and log.json).
#[tokio::test]
async fn this_build_round_trips_its_samples() {
    let (dir, write) = match std::env::var_os("GPUQ_GOLDEN_WRITE") {
        Some(d) => (PathBuf::from(d), true),
        None => (releases().pop().unwrap(), false),
    };
    let tmp = tempfile::tempdir().unwrap();
    let data = copy_data(&dir, tmp.path());
    let store = golden_samples::read_store(&data.join("gpuq.redb")).await;
    let samples = golden_samples::samples(&store, &dir);
    for s in &samples {
        let bytes = hex::decode(&s.msgpack_hex).unwrap();
        let now = decode(&s.ty, &bytes).unwrap_or_else(|e| panic!("{} {}: {e}", s.ty, s.name));
        assert_eq!(now, s.json, "{} {} does not round-trip", s.ty, s.name);
    }
    if write {
        let backup = gpuq::raft::backup::read(&dir.join("backup.gpuq")).expect("backup");
        let read = store.json();
        let state = serde_json::json!({
            "state": read["state"],
            "history": read["history"],
            "backup_meta": serde_json::to_value(&backup.meta).unwrap(),
        });
        let put = |name: &str, v: &Value| {
            let text = serde_json::to_string_pretty(v).unwrap() + "\n";
            std::fs::write(dir.join(name), text).unwrap();
        };
        put("state.json", &state);
        put("log.json", &read["log"]);
        put("wire.json", &serde_json::to_value(&samples).unwrap());
    }
}
