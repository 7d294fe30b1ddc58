//! Config files: TOML text through `ServerConfig::from_toml` and
//! `AgentConfig::from_toml` (parse, unknown-key check, validation), starting
//! from the commented examples in `config/` with some of their settings
//! switched on, then mutated as text.

use std::path::Path;

use gpuq::config::{AgentConfig, ServerConfig};
use rand::rngs::StdRng;
use rand::Rng;

use super::{mutate, Target};

pub fn targets() -> Vec<Target> {
    vec![Target {
        name: "config",
        weight: 10,
        generate: gen_config,
        check: check_config,
    }]
}

const EXAMPLES: &[&str] = &[
    include_str!("../../config/server.toml"),
    include_str!("../../config/agent.toml"),
];

const CONFIG_WORDS: &[&str] = &[
    "[server]",
    "[agent]",
    "[server.raft]",
    "[server.bootstrap]",
    "[[server]]",
    "[agent.health]",
    "cluster_name = \"c\"",
    "node_name = \"n1\"",
    "data_dir = \"\"",
    "listen = \"0.0.0.0:0\"",
    "advertise = \"[::1]:7420\"",
    "servers = [\"a:1\", \"b\"]",
    "heartbeat_ms = 0",
    "election_timeout_min_ms = 18446744073709551615",
    "election_timeout_max_ms = 1",
    "master_port_range = \"30000-29999\"",
    "expect = -1",
    "peers = []",
    "features = [1]",
    "cpus = 4294967296",
    "gpus = \"fake:8\"",
    "gpus = 8",
    "kill_grace_secs = 1e99",
    "interval_secs = 0",
    "timeout_secs = 0",
    "admin_group = \"\"",
    "role = \"login\"",
    "socket = \"/\"",
    "= \"x\"",
    "a.b.c = 1",
    "\"\" = 1",
    "inf",
    "nan",
    "true",
    "[]",
    "{}",
    "'''",
    "\"\"\"",
    "0x10",
    "1_000",
    "1979-05-27T07:32:00Z",
];

/// An example with a random subset of its commented settings switched on.
fn gen_config(rng: &mut StdRng) -> Vec<u8> {
    let example = EXAMPLES[rng.gen_range(0..EXAMPLES.len())];
    let mut text = String::new();
    for line in example.lines() {
        match line.strip_prefix("# ") {
            Some(setting) if setting.contains(" = ") && rng.gen_bool(0.5) => {
                text.push_str(setting);
            }
            _ => text.push_str(line),
        }
        text.push('\n');
    }
    let mut bytes = text.into_bytes();
    if rng.gen_bool(0.9) {
        mutate::text(rng, &mut bytes, CONFIG_WORDS);
    }
    bytes
}

fn check_config(input: &[u8]) {
    let Ok(text) = std::str::from_utf8(input) else {
        return;
    };
    let origin = Path::new("fuzz.toml");
    if let Ok(server) = ServerConfig::from_toml(text, origin) {
        let _ = server.advertise_addr();
    }
    let _ = AgentConfig::from_toml(text, origin);
}
