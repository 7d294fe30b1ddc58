//! Config loading, checked from the text a user writes to the error they see.

use std::collections::BTreeSet;
use std::fs;

use tempfile::TempDir;

use super::*;

const SERVER_EXAMPLE: &str = include_str!("../../../config/server.toml");
const AGENT_EXAMPLE: &str = include_str!("../../../config/agent.toml");

fn origin() -> &'static Path {
    Path::new("/etc/gpuq/gpuq.toml")
}

fn server(text: &str) -> Result<ServerConfig, ConfigError> {
    ServerConfig::from_toml(text, origin())
}

fn agent(text: &str) -> Result<AgentConfig, ConfigError> {
    AgentConfig::from_toml(text, origin())
}

fn server_err(text: &str) -> String {
    server(text).expect_err(text).to_string()
}

fn env(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// Turns `# key = value` and `# [table]` lines into live ones; prose stays.
fn uncomment(example: &str) -> String {
    example
        .lines()
        .map(|line| {
            let body = line.strip_prefix("# ").unwrap_or(line);
            let is_key = body.split_once(" = ").is_some_and(|(k, _)| {
                !k.is_empty() && k.chars().all(|c| c.is_ascii_lowercase() || c == '_')
            });
            // A commented-out optional table: `# [agent.health_check]`.
            let is_table = body.starts_with('[')
                && body.ends_with(']')
                && body[1..body.len() - 1]
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c == '_' || c == '.');
            if line.starts_with("# ") && (is_key || is_table) {
                body.to_string()
            } else {
                line.to_string()
            }
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// Dotted paths of every leaf key in a TOML value.
fn key_paths(value: &toml::Value, prefix: &str, out: &mut BTreeSet<String>) {
    if let toml::Value::Table(table) = value {
        for (k, v) in table {
            let path = if prefix.is_empty() {
                k.clone()
            } else {
                format!("{prefix}.{k}")
            };
            if v.is_table() {
                key_paths(v, &path, out);
            } else {
                out.insert(path);
            }
        }
    }
}

fn paths_of<T: Serialize>(section: &str, config: &T) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    key_paths(&toml::Value::try_from(config).unwrap(), section, &mut out);
    out
}

fn paths_in_text(text: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    key_paths(&toml::from_str(text).unwrap(), "", &mut out);
    out
}

/// A config with every optional key set, so serializing it lists every key.
fn full_server() -> ServerConfig {
    ServerConfig {
        advertise: Some("10.0.0.1:7420".parse().unwrap()),
        admin_group: Some("wheel".into()),
        bootstrap: BootstrapConfig {
            secret_file: Some("/etc/gpuq/bootstrap.secret".into()),
            ..Default::default()
        },
        ..ServerConfig::default()
    }
}

fn full_agent() -> AgentConfig {
    AgentConfig {
        servers: vec!["a:1".into()],
        admin_group: Some("wheel".into()),
        cpus: Some(64),
        memory_mb: Some(1024),
        health_check: Some(Default::default()),
        dcgm_job_map_dir: Some("/run/dcgm-job-map".into()),
        containers: Containers {
            runtime: Some("/usr/bin/crun".into()),
            registry_auth_file: Some("/etc/gpuq/registry-auth.json".into()),
            ..Default::default()
        },
        ..AgentConfig::default()
    }
}

#[test]
fn the_examples_parse_as_shipped_and_mean_the_defaults() {
    assert_eq!(server(SERVER_EXAMPLE).unwrap(), ServerConfig::default());
    assert_eq!(agent(AGENT_EXAMPLE).unwrap(), AgentConfig::default());
    let both = format!("{SERVER_EXAMPLE}\n{AGENT_EXAMPLE}");
    assert_eq!(server(&both).unwrap(), ServerConfig::default());
    assert_eq!(agent(&both).unwrap(), AgentConfig::default());
}

#[test]
fn the_examples_document_every_key_with_its_default() {
    let text = uncomment(SERVER_EXAMPLE);
    let parsed = server(&text).unwrap_or_else(|e| panic!("uncommented server.toml: {e}"));
    assert_eq!(paths_in_text(&text), paths_of("server", &full_server()));
    // Keys with a fixed default must show that default.
    let defaults = ServerConfig {
        node_name: parsed.node_name.clone(),
        advertise: parsed.advertise,
        admin_group: parsed.admin_group.clone(),
        admin_users: parsed.admin_users.clone(),
        bootstrap: BootstrapConfig {
            peers: parsed.bootstrap.peers.clone(),
            secret_file: parsed.bootstrap.secret_file.clone(),
            ..Default::default()
        },
        ..ServerConfig::default()
    };
    assert_eq!(parsed, defaults);

    let text = uncomment(AGENT_EXAMPLE);
    let parsed = agent(&text).unwrap_or_else(|e| panic!("uncommented agent.toml: {e}"));
    assert_eq!(paths_in_text(&text), paths_of("agent", &full_agent()));
    let defaults = AgentConfig {
        node_name: parsed.node_name.clone(),
        servers: parsed.servers.clone(),
        admin_group: parsed.admin_group.clone(),
        cpus: parsed.cpus,
        memory_mb: parsed.memory_mb,
        health_check: parsed.health_check.clone(),
        dcgm_job_map_dir: parsed.dcgm_job_map_dir.clone(),
        containers: parsed.containers.clone(),
        ..AgentConfig::default()
    };
    assert_eq!(parsed, defaults);
}

#[test]
fn the_key_check_knows_every_field() {
    assert_eq!(
        field_names::<RaftConfig>(),
        [
            "heartbeat_ms",
            "election_timeout_min_ms",
            "election_timeout_max_ms",
            "snapshot_after_logs",
            "logs_kept_after_snapshot",
            "max_payload_entries"
        ]
    );
    assert_eq!(field_names::<ConfigFile>(), ["server", "agent"]);
    let serialized: BTreeSet<String> = paths_of("", &full_server())
        .into_iter()
        .filter(|p| !p.contains('.'))
        .collect();
    let known: BTreeSet<String> = field_names::<ServerConfig>()
        .iter()
        .filter(|f| **f != "raft" && **f != "bootstrap")
        .map(|f| f.to_string())
        .collect();
    assert_eq!(serialized, known);
}

#[test]
fn values_are_read() {
    let c = server(
        "[server]\ncluster_name = \"lab\"\nnode_name = \"s1\"\ndata_dir = \"/srv/gpuq\"\n\
         listen = \"10.1.2.3:9000\"\nadvertise = \"[fd00::1]:9000\"\nsocket = \"/tmp/g.sock\"\n\
         admin_group = \"ops\"\n[server.raft]\nheartbeat_ms = 50\nelection_timeout_min_ms = 300\n",
    )
    .unwrap();
    assert_eq!(c.cluster_name, "lab");
    assert_eq!(c.node_name, "s1");
    assert_eq!(c.data_dir, Path::new("/srv/gpuq"));
    assert_eq!(c.listen, "10.1.2.3:9000".parse().unwrap());
    assert_eq!(c.advertise, Some("[fd00::1]:9000".parse().unwrap()));
    assert_eq!(c.socket, Path::new("/tmp/g.sock"));
    assert_eq!(c.admin_group.as_deref(), Some("ops"));
    assert_eq!(
        (c.raft.heartbeat_ms, c.raft.election_timeout_min_ms),
        (50, 300)
    );
    assert_eq!(
        c.raft.election_timeout_max_ms, 1200,
        "unset keys keep defaults"
    );

    let a = agent(
        "[agent]\nservers = [\"s1:7420\", \"10.0.0.2:7420\"]\nrole = \"login\"\nlisten = \"127.0.0.1:1\"\n",
    )
    .unwrap();
    assert_eq!(a.servers, ["s1:7420", "10.0.0.2:7420"]);
    assert_eq!(a.role, AgentRole::Login);
    assert_eq!(a.listen, "127.0.0.1:1".parse().unwrap());
    let inline = server("server = { raft = { heartbeat_ms = 100 } }").unwrap();
    assert_eq!(inline.raft.heartbeat_ms, 100);
}

#[test]
fn unknown_keys_name_the_key_the_line_and_the_nearest() {
    assert_eq!(
        server_err("[server]\n\n[server.raft]\nhearbeat_ms = 100\n"),
        "config file /etc/gpuq/gpuq.toml line 4: unknown key server.raft.hearbeat_ms; did you mean heartbeat_ms?"
    );
    assert_eq!(
        server_err("[sever]\nlisten = \"0.0.0.0:1\"\n"),
        "config file /etc/gpuq/gpuq.toml line 1: unknown key sever; did you mean server?"
    );
    let msg = server_err("[server]\nfrobnicate = 1\n");
    assert!(
        msg.contains(
            "line 2: unknown key server.frobnicate; known keys here: cluster_name, node_name"
        ),
        "{msg}"
    );
    let msg = server_err("[agent]\nserver = [\"a:1\"]\n");
    assert!(
        msg.contains("unknown key agent.server; did you mean servers?"),
        "{msg}"
    );
    let msg = server_err("server = { raft = { election_timeout_min = 1 } }");
    assert!(
        msg.contains("server.raft.election_timeout_min; did you mean election_timeout_min_ms?"),
        "{msg}"
    );
}

#[test]
fn wrong_types_name_the_key_and_the_expected_type() {
    let msg = server_err("[server.raft]\nheartbeat_ms = \"fast\"\n");
    assert_eq!(
        msg,
        "config file /etc/gpuq/gpuq.toml line 2: server.raft.heartbeat_ms: invalid type: string \"fast\", expected u64"
    );
    let msg = server_err("[server]\nlisten = \"localhost\"\n");
    assert!(
        msg.contains(
            "line 2: server.listen: \"localhost\" is not an IP:PORT address; use e.g. 0.0.0.0:7420"
        ),
        "{msg}"
    );
    let msg = server_err("[server]\nadvertise = 7420\n");
    assert!(
        msg.contains("line 2: server.advertise: invalid type: integer"),
        "{msg}"
    );
    let msg = server_err("[agent]\nrole = \"comput\"\n");
    assert!(
        msg.contains("agent.role: unknown variant `comput`, expected `compute` or `login`"),
        "{msg}"
    );
    let msg = server_err("[agent]\nservers = [\"a:1\", 3]\n");
    assert!(
        msg.contains("line 2: agent.servers[1]: invalid type: integer"),
        "{msg}"
    );
    let msg = server_err("[server]\nraft = 5\n");
    assert!(msg.contains("server.raft: invalid type: integer"), "{msg}");
    let msg = server_err("[server]\ncluster_name = 1979-05-27\n");
    assert!(msg.contains("server.cluster_name: invalid type"), "{msg}");
}

#[test]
fn syntax_errors_name_the_file() {
    let msg = server_err("[server\n");
    assert!(
        msg.starts_with(
            "config file /etc/gpuq/gpuq.toml is not valid TOML: TOML parse error at line 1"
        ),
        "{msg}"
    );
    let msg = server_err("[server]\nlisten = \"a\"\nlisten = \"b\"\n");
    assert!(msg.contains("duplicate key"), "{msg}");
}

#[test]
fn explicit_paths_must_exist_and_the_default_is_optional() {
    let dir = TempDir::new().unwrap();
    let missing = dir.path().join("nope.toml");
    let msg = ServerConfig::load(Some(&missing), &[])
        .unwrap_err()
        .to_string();
    assert!(
        msg.contains(missing.to_str().unwrap()) && msg.contains("does not exist"),
        "{msg}"
    );
    let msg = AgentConfig::load(Some(dir.path()), &[])
        .unwrap_err()
        .to_string();
    assert!(
        msg.starts_with(&format!("cannot read config file {}", dir.path().display())),
        "{msg}"
    );

    let absent = ServerConfig::load_from(None, &missing, &[]).unwrap();
    assert_eq!(absent, ServerConfig::default());

    let file = dir.path().join("gpuq.toml");
    fs::write(
        &file,
        "[server]\ncluster_name = \"from-file\"\n[agent]\nrole = \"login\"\n",
    )
    .unwrap();
    assert_eq!(
        ServerConfig::load_from(None, &file, &[])
            .unwrap()
            .cluster_name,
        "from-file"
    );
    assert_eq!(
        AgentConfig::load_from(None, &missing, &[]).unwrap().role,
        AgentRole::Compute
    );
    assert_eq!(
        AgentConfig::load(Some(&file), &[]).unwrap().role,
        AgentRole::Login
    );

    fs::write(&file, "[server.raft]\nhearbeat_ms = 1\n").unwrap();
    let msg = AgentConfig::load(Some(&file), &[]).unwrap_err().to_string();
    assert!(
        msg.contains("server.raft.hearbeat_ms"),
        "the agent checks the whole file: {msg}"
    );
}

#[test]
fn env_overrides_the_file() {
    let dir = TempDir::new().unwrap();
    let file = dir.path().join("gpuq.toml");
    fs::write(&file, "[server]\ndata_dir = \"/from/file\"\nadmin_group = \"ops\"\nadvertise = \"10.0.0.9:7420\"\n").unwrap();
    let c = ServerConfig::load(
        Some(&file),
        &env(&[
            ("GPUQ_DATA_DIR", "/from/env"),
            ("GPUQ_LISTEN", "127.0.0.1:9999"),
            ("GPUQ_SOCKET", "/tmp/s.sock"),
            ("GPUQ_NODE_NAME", "n1"),
            ("GPUQ_CLUSTER_NAME", "c1"),
            ("GPUQ_ADMIN_GROUP", ""),
            ("GPUQ_ADVERTISE", ""),
            ("GPUQ_JOB_ID", "7"),
            ("GPUQ_NODE_NAME", "n2"),
        ]),
    )
    .unwrap();
    assert_eq!(c.data_dir, Path::new("/from/env"));
    assert_eq!(c.listen, "127.0.0.1:9999".parse().unwrap());
    assert_eq!(c.socket, Path::new("/tmp/s.sock"));
    assert_eq!(c.node_name, "n2", "the last occurrence wins");
    assert_eq!(c.cluster_name, "c1");
    assert_eq!(c.admin_group, None, "empty clears");
    assert_eq!(c.advertise, None, "empty clears");

    let mut c = ServerConfig::default();
    c.apply_env(&env(&[
        ("GPUQ_ADVERTISE", "10.0.0.1:7420"),
        ("GPUQ_ADMIN_GROUP", "wheel"),
    ]))
    .unwrap();
    assert_eq!(c.advertise, Some("10.0.0.1:7420".parse().unwrap()));
    assert_eq!(c.admin_group.as_deref(), Some("wheel"));

    let mut a = AgentConfig::default();
    a.apply_env(&env(&[
        ("GPUQ_SERVERS", "s1:7420, s2:7420,"),
        ("GPUQ_DATA_DIR", "/d"),
    ]))
    .unwrap();
    assert_eq!(a.servers, ["s1:7420", "s2:7420"]);
    assert_eq!(a.data_dir, Path::new("/d"));
}

#[test]
fn bad_env_values_name_the_variable() {
    let msg = ServerConfig::load_from(
        None,
        Path::new("/nonexistent"),
        &env(&[("GPUQ_LISTEN", "7420")]),
    )
    .unwrap_err()
    .to_string();
    assert_eq!(
        msg,
        "environment variable GPUQ_LISTEN=\"7420\" is not an IP:PORT address; use e.g. 0.0.0.0:7420 or [::]:7420"
    );
    let mut c = ServerConfig::default();
    let msg = c
        .apply_env(&env(&[("GPUQ_ADVERTISE", "x")]))
        .unwrap_err()
        .to_string();
    assert!(
        msg.starts_with("environment variable GPUQ_ADVERTISE=\"x\""),
        "{msg}"
    );
    let msg = c
        .apply_env(&env(&[("GPUQ_DATA_DIR", "")]))
        .unwrap_err()
        .to_string();
    assert!(
        msg.starts_with("environment variable GPUQ_DATA_DIR=\"\" is empty"),
        "{msg}"
    );
    let mut a = AgentConfig::default();
    let msg = a
        .apply_env(&env(&[("GPUQ_SERVERS", "s1:7420,s2")]))
        .unwrap_err()
        .to_string();
    assert!(
        msg.contains("GPUQ_SERVERS") && msg.contains("\"s2\", which is not HOST:PORT"),
        "{msg}"
    );
    let msg = ServerConfig::load_from(
        None,
        Path::new("/nonexistent"),
        &env(&[("GPUQ_CLUSTER_NAME", "my lab")]),
    )
    .unwrap_err()
    .to_string();
    assert!(
        msg.starts_with("server.cluster_name \"my lab\" must be"),
        "validated after env: {msg}"
    );
}

#[test]
fn raft_timing_is_validated() {
    let msg = server_err("[server.raft]\nelection_timeout_min_ms = 1200\n");
    assert!(msg.starts_with("server.raft.election_timeout_min_ms (1200) must be less than election_timeout_max_ms (1200)"), "{msg}");
    let msg = server_err("[server.raft]\nheartbeat_ms = 600\n");
    assert!(
        msg.starts_with(
            "server.raft.heartbeat_ms (600) must be less than election_timeout_min_ms (600)"
        ),
        "{msg}"
    );
    for key in ["heartbeat_ms", "snapshot_after_logs", "max_payload_entries"] {
        let msg = server_err(&format!("[server.raft]\n{key} = 0\n"));
        assert_eq!(msg, format!("server.raft.{key} must be at least 1"));
    }
    assert!(server("[server.raft]\nheartbeat_ms = 599\n").is_ok());
}

#[test]
fn names_paths_and_servers_are_validated() {
    assert!(server_err("[server]\ncluster_name = \"\"\n")
        .starts_with("server.cluster_name \"\" must be"));
    assert!(server_err("[server]\nnode_name = \"a/b\"\n")
        .starts_with("server.node_name \"a/b\" must be"));
    assert_eq!(
        server_err("[server]\ndata_dir = \"\"\n"),
        "server.data_dir is empty; give a path"
    );
    assert!(server_err("[server]\nadmin_group = \"a b\"\n")
        .starts_with("server.admin_group \"a b\" is not a group name"));
    let msg = agent("[agent]\nservers = [\"ok:1\", \"nope\"]\n")
        .unwrap_err()
        .to_string();
    assert!(
        msg.starts_with("agent.servers[1] \"nope\" is not HOST:PORT"),
        "{msg}"
    );
    assert!(agent("[agent]\nsocket = \"\"\n").is_err());
    for bad in ["https://reg.lan", "reg.lan/path", "reg.lan:http", ""] {
        let msg = agent(&format!(
            "[agent.containers]\ninsecure_registries = [\"reg:5000\", \"{bad}\"]\n"
        ))
        .unwrap_err()
        .to_string();
        assert!(
            msg.starts_with(&format!(
                "agent.containers.insecure_registries[1] \"{bad}\" is not a registry"
            )) && msg.contains("HOST:PORT"),
            "{msg}"
        );
    }
    let ok =
        agent("[agent.containers]\ninsecure_registries = [\"localhost\", \"10.0.0.5:5000\"]\n");
    assert_eq!(ok.unwrap().containers.insecure_registries.len(), 2);
    for engine in ["podman", "/usr/bin/apptainer", "docker"] {
        let msg = agent(&format!("[agent.containers]\nruntime = \"{engine}\"\n"))
            .unwrap_err()
            .to_string();
        assert!(
            msg.starts_with("agent.containers.runtime")
                && msg.contains("not an OCI runtime")
                && msg.contains("crun"),
            "{msg}"
        );
    }
    assert!(agent("[agent.containers]\nruntime = \"/usr/bin/crun\"\n").is_ok());
}

#[test]
fn host_port_forms() {
    for ok in ["gpuq1:7420", "10.0.0.1:7420", "[fd00::1]:7420", "a.b-c_d:1"] {
        assert!(is_host_port(ok), "{ok}");
    }
    for bad in [
        "gpuq1",
        ":7420",
        "gpuq1:",
        "gpuq1:0",
        "gpuq1:70000",
        "fd00::1:7420x",
        "[fd00::1:7420",
        "a b:1",
        "[x]:1",
    ] {
        assert!(!is_host_port(bad), "{bad}");
    }
}

#[test]
fn the_advertised_address() {
    let mut c = ServerConfig::default();
    let msg = c.advertise_addr().unwrap_err().to_string();
    assert!(
        msg.starts_with("server.advertise is not set and server.listen (0.0.0.0:7420)"),
        "{msg}"
    );
    assert!(msg.contains("GPUQ_ADVERTISE"), "{msg}");
    c.listen = "10.0.0.5:7420".parse().unwrap();
    assert_eq!(c.advertise_addr().unwrap(), c.listen);
    c.advertise = Some("192.168.1.1:1".parse().unwrap());
    assert_eq!(
        c.advertise_addr().unwrap(),
        "192.168.1.1:1".parse().unwrap()
    );
}

#[test]
fn the_host_s_one_address_is_advertised_when_nothing_names_one() {
    let ip = |s: &str| -> std::net::IpAddr { s.parse().unwrap() };
    let mut c = ServerConfig::default();
    assert_eq!(
        c.advertise_among(&[ip("10.0.0.5")]).unwrap(),
        ("10.0.0.5:7420".parse().unwrap(), true)
    );
    // IPv6 addresses do not count against the one IPv4 address.
    assert_eq!(
        c.advertise_among(&[ip("fd00::5"), ip("10.0.0.5")])
            .unwrap()
            .0,
        "10.0.0.5:7420".parse().unwrap()
    );
    let msg = c
        .advertise_among(&[ip("10.0.0.5"), ip("192.168.1.7")])
        .unwrap_err()
        .to_string();
    assert!(
        msg.contains("this host has several: 10.0.0.5, 192.168.1.7") && msg.contains("--advertise"),
        "{msg}"
    );
    let msg = c.advertise_among(&[]).unwrap_err().to_string();
    assert!(msg.contains("GPUQ_ADVERTISE"), "{msg}");
    // A configured address is never second-guessed.
    c.advertise = Some("192.168.1.1:1".parse().unwrap());
    assert_eq!(
        c.advertise_among(&[ip("10.0.0.5")]).unwrap(),
        ("192.168.1.1:1".parse().unwrap(), false)
    );
}

#[test]
fn the_default_node_name_is_the_short_hostname() {
    let name = crate::hostname::short();
    assert!(!name.is_empty() && !name.contains('.'), "{name}");
    assert_eq!(ServerConfig::default().node_name, name);
}

#[test]
fn master_port_range_is_read_and_a_bad_one_names_the_key_and_the_fix() {
    let cfg = ServerConfig::from_toml(
        "[server]\nmaster_port_range = \"40000-40999\"\n",
        Path::new("/etc/gpuq/gpuq.toml"),
    )
    .unwrap();
    assert_eq!(cfg.master_port_range.to_string(), "40000-40999");
    assert_eq!(
        ServerConfig::default().master_port_range.to_string(),
        "29500-30499"
    );
    for (bad, says) in [
        ("\"29500\"", "write FIRST-LAST, e.g. \"29500-30499\""),
        ("\"100-200\"", "port 100 is privileged"),
        ("\"30000-29000\"", "is backwards"),
    ] {
        let msg = server_err(&format!("[server]\nmaster_port_range = {bad}\n"));
        assert!(
            msg.contains("line 2: server.master_port_range") && msg.contains(says),
            "{bad}: {msg}"
        );
    }
}
