//! Upgrades: today's server on an earlier release's data dir (the golden one,
//! tests/golden) sees every job, node, token and policy as that release
//! showed them and goes on working; and a rolling restart of every server,
//! then every agent, under running jobs loses none and restarts none.

mod common;

use std::time::Duration;

use common::{Agent, Server, ServerSet};
use serde_json::Value;

fn json(s: &Server, args: &[&str]) -> Value {
    serde_json::from_str(&s.ok(args)).unwrap()
}

fn golden(rel: &std::path::Path, name: &str) -> Value {
    serde_json::from_str(&std::fs::read_to_string(rel.join("cli").join(name)).unwrap()).unwrap()
}

/// Drops what a pass or the clock computes afresh (pending reasons and
/// expected starts, node liveness), leaving what the release stored.
fn stored(mut v: Value, volatile: &[&str]) -> Value {
    if let Some(rows) = v.as_array_mut() {
        for row in rows {
            if let Some(o) = row.as_object_mut() {
                for k in volatile {
                    o.remove(*k);
                }
            }
        }
    }
    v
}

/// `now`'s rows with only the keys `then`'s rows have.
fn only_keys_of(mut now: Value, then: &Value) -> Value {
    if let (Some(rows), Some(old)) = (now.as_array_mut(), then.as_array()) {
        for (row, old) in rows.iter_mut().zip(old) {
            if let (Some(o), Some(keys)) = (row.as_object_mut(), old.as_object()) {
                o.retain(|k, _| keys.contains_key(k));
            }
        }
    }
    now
}

#[test]
fn todays_server_on_an_earlier_release_data_dir_shows_all_it_held_and_goes_on() {
    let rel = common::golden::releases().pop().unwrap();
    let dir = tempfile::tempdir().unwrap();
    common::golden::copy_data_dir(&dir.path().join("data"));
    let mut s = Server::joining(dir.path(), "s1", "", "");
    s.mode = vec!["--bootstrap".into()];
    s.node_ttl_secs = 3600;
    s.extra_config = common::golden::KEEP_HISTORY.into();
    s.start();

    let pending = ["reason", "reason_code", "expected_start"];
    let now = stored(json(&s, &["queue", "--all", "--json"]), &pending);
    let then = stored(golden(&rel, "queue.json"), &pending);
    assert_eq!(now, then, "the jobs differ from what the release showed");
    let node_volatile = ["connected"];
    assert_eq!(
        stored(json(&s, &["nodes", "--json"]), &node_volatile),
        stored(golden(&rel, "nodes.json"), &node_volatile)
    );
    assert_eq!(
        json(&s, &["token", "list", "--json"]),
        golden(&rel, "tokens.json")
    );
    // Every field the release printed, as it printed it; fields added since
    // (sacct's details) may follow.
    let then_acct = golden(&rel, "acct.json");
    assert_eq!(
        only_keys_of(json(&s, &["acct", "--json"]), &then_acct),
        then_acct
    );
    for what in ["account", "qos", "partition"] {
        assert_eq!(
            json(&s, &["admin", what, "list", "--json"]),
            golden(&rel, &format!("{what}.json")),
            "{what}"
        );
    }
    // It goes on: a held job is released and cancelled, a new job gets the next id.
    let ids = golden(&rel, "ids.json");
    let held = ids["held"].to_string();
    s.ok(&["cancel", &held]);
    let j = json(&s, &["show", &held, "--json"]);
    assert_eq!(j["state"], "CANCELLED", "{j}");
    let next = s.ok(&["submit", "--parsable", "-D", "/tmp", "--wrap", "true"]);
    let max = then
        .as_array()
        .unwrap()
        .iter()
        .map(|j| j["id"].as_u64().unwrap())
        .max();
    assert_eq!(next.trim().parse::<u64>().ok(), max.map(|m| m + 1));
}

/// Job `id` as the leader shows it.
fn show(set: &ServerSet, id: &str) -> Value {
    let s = &set.servers[set.leader()];
    serde_json::from_str(&s.ok(&["show", id, "--json"])).unwrap()
}

#[test]
fn a_rolling_restart_of_every_server_then_every_agent_loses_and_restarts_no_job() {
    let dir = tempfile::tempdir().unwrap();
    let mut set = ServerSet::start(&dir.path().join("servers"), 3);
    let token = set.servers[0].ok(&["token", "create"]).trim().to_string();
    let mut agents: Vec<Agent> = (1..=2)
        .map(|i| {
            let name = format!("n{i}");
            Agent::start(&set.servers[0], &dir.path().join(&name), &name, 2, &token)
        })
        .collect();
    let w = dir.path().join("w");
    std::fs::create_dir_all(&w).unwrap();
    let gate = w.join("go");
    let script = format!(
        "echo started >> {w}/starts_$GPUQ_JOB_ID; while [ ! -e {g} ]; do sleep 0.1; done",
        w = w.display(),
        g = gate.display()
    );
    let ids: Vec<String> = (0..4)
        .map(|_| {
            let s = &set.servers[set.leader()];
            let w = w.to_str().unwrap();
            let args = ["submit", "--parsable", "--gpus-per-node", "1", "-D", w];
            let mut args = args.to_vec();
            args.extend(["--wrap", &script]);
            s.ok(&args).trim().to_string()
        })
        .collect();
    let long = Duration::from_secs(60);
    for id in &ids {
        common::wait_for(&format!("job {id} to run"), long, || {
            show(&set, id)["run"]["started"].as_array().map(Vec::len) == Some(1)
        });
    }
    // Every server in turn, the leader too (SIGKILL: the harshest stop).
    for i in 0..set.servers.len() {
        set.servers[i].kill();
        set.wait_members(3);
        set.servers[i].start();
        set.wait_caught_up(i);
    }
    // Then every agent; the shims keep the tasks.
    for a in &mut agents {
        a.kill();
        a.spawn();
    }
    let leader = set.leader();
    common::wait_for("both agents to reconnect", long, || {
        let v = json(&set.servers[leader], &["nodes", "--json"]);
        v.as_array()
            .is_some_and(|ns| ns.iter().filter(|n| n["connected"] == true).count() == 2)
    });
    let mut through = 0;
    for id in &ids {
        let j = show(&set, id);
        assert_eq!(j["state"], "RUNNING", "job {id} after the upgrade: {j}");
        through += 1;
    }
    std::fs::write(&gate, "").unwrap();
    for id in &ids {
        common::wait_for(&format!("job {id} to complete"), long, || {
            show(&set, id)["state"] == "COMPLETED"
        });
        let j = show(&set, id);
        assert_eq!(j["restart_count"], 0, "job {id} was restarted: {j}");
        assert_eq!(j["run"]["attempt"], 0, "job {id}: {j}");
        let starts = std::fs::read_to_string(w.join(format!("starts_{id}"))).unwrap();
        assert_eq!(starts.lines().count(), 1, "job {id} started {starts:?}");
    }
    println!("upgrade: {through} jobs running through it, restarts caused 0");
}
