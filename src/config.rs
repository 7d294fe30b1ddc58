//! Daemon configuration: TOML, then `GPUQ_*` environment overrides, then
//! flags (applied by the caller to the pub fields, followed by `validate`).
//!
//! One file per host (`/etc/gpuq/gpuq.toml`) holds a `[server]` and/or an
//! `[agent]` table, so a machine that runs both has one place to look. Both
//! tables are checked whichever daemon reads the file: a typo is reported at
//! once, not when the other daemon first starts.
//!
//! Unknown keys are errors. Before serde sees the file, it is walked against
//! the field names serde itself knows (captured from each struct's
//! `Deserialize`, so a new key needs no list kept in step), which lets the
//! message name the full key and its line and suggest the nearest key. Every
//! key is documented once, with its default, in `config/server.toml` and
//! `config/agent.toml`; tests hold the examples and the structs together.
//!
//! The value types of the agent's nested keys are here too, not in the
//! agent: [`gpus`] (`gpus = ...`), [`health_check`] (`[agent.health_check]`)
//! and [`containers`] (`[agent.containers]`).

use std::io;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use checks::{check_group, check_name, check_path, is_host_port};
pub use containers::Containers;
pub use gpus::{FakeGpuConfig, FakeNvLink, GpuConfig};
pub use health_check::HealthCheck;
use toml_file::field_names;

mod advertise;
mod checks;
pub mod containers;
pub mod gpus;
pub mod health_check;
mod toml_file;

/// Where the daemons look for their config when no path is given.
pub const DEFAULT_CONFIG_PATH: &str = "/etc/gpuq/gpuq.toml";

/// The `[server]` table: one member of the Raft control plane.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ServerConfig {
    pub cluster_name: String,
    pub node_name: String,
    pub data_dir: PathBuf,
    #[serde(deserialize_with = "addr::required")]
    pub listen: SocketAddr,
    #[serde(deserialize_with = "addr::optional")]
    pub advertise: Option<SocketAddr>,
    pub socket: PathBuf,
    /// TCP address of the HTTP port: `/metrics`, `/healthz`, the JSON API
    /// under `/api/v1/` and the web page. Beyond loopback it is served
    /// over TLS with this server's certificate.
    #[serde(deserialize_with = "addr::required")]
    pub http_listen: SocketAddr,
    pub admin_group: Option<String>,
    /// Users whose requests count as an admin's when another host (a login
    /// or compute agent) vouches for them as admin there. Empty: admin
    /// requests are honoured only from a server's own socket.
    pub admin_users: Vec<String>,
    /// Hide other users' jobs from ordinary users (Slurm's PrivateData=jobs).
    pub private_jobs: bool,
    /// The longest `--ttl` a join token may be given.
    pub max_token_ttl_secs: u64,
    /// A node whose agent is silent this long is declared down.
    pub node_ttl_secs: u64,
    /// Finished jobs move from memory to the on-disk history archive this
    /// long after they end.
    pub history_retention_secs: u64,
    /// An interactive allocation (salloc, srun, gpuq run) whose client has
    /// not renewed it for this long is released (Slurm's InactiveLimit);
    /// 0: never.
    pub inactive_limit_secs: u64,
    /// A running job whose GPUs were all idle this long is flagged idle
    /// (`gpuq queue`, `gpuq show`); 0: never.
    pub idle_gpu_secs: u64,
    /// Where MASTER_PORT is chosen from; taken into the cluster's state
    /// when this server bootstraps it.
    pub master_port_range: crate::model::PortRange,
    pub raft: RaftConfig,
    pub bootstrap: BootstrapConfig,
}

/// The `[server.bootstrap]` table: forming a cluster of several servers
/// started at once (`--bootstrap-expect`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct BootstrapConfig {
    /// Voters to form; 0: not forming a cluster this way.
    pub expect: usize,
    /// Every server's advertised `IP:PORT`, this one's included.
    pub peers: Vec<String>,
    /// A file holding the shared secret (or GPUQ_BOOTSTRAP_SECRET).
    pub secret_file: Option<PathBuf>,
}

/// The `[server.raft]` table: timing and log compaction of the control plane.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RaftConfig {
    pub heartbeat_ms: u64,
    pub election_timeout_min_ms: u64,
    pub election_timeout_max_ms: u64,
    pub snapshot_after_logs: u64,
    /// Log entries kept behind a snapshot, so a briefly lagging follower
    /// catches up from the log instead of a whole snapshot.
    pub logs_kept_after_snapshot: u64,
    pub max_payload_entries: u64,
}

/// The `[agent]` table: a compute node, or a login node that only vouches for
/// its users.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AgentConfig {
    pub node_name: String,
    pub data_dir: PathBuf,
    #[serde(deserialize_with = "addr::required")]
    pub listen: SocketAddr,
    pub socket: PathBuf,
    /// TCP address of the agent's HTTP port (`/metrics`, `/healthz`).
    #[serde(deserialize_with = "addr::required")]
    pub http_listen: SocketAddr,
    /// Where to write dcgm-exporter's job-mapping files (one file per GPU
    /// index holding the ids of the jobs on it), if anywhere.
    pub dcgm_job_map_dir: Option<PathBuf>,
    pub servers: Vec<String>,
    pub role: AgentRole,
    pub admin_group: Option<String>,
    /// Where GPUs come from: "auto", "nvml", "none", or a fake table.
    pub gpus: GpuConfig,
    /// CPUs kept for the system; jobs never get them.
    pub reserved_cpus: u32,
    /// Memory in MiB kept for the system.
    pub reserved_memory_mb: u64,
    /// The node's topology domain path, e.g. `spine1/leaf3`.
    pub topology: String,
    /// Node features for `--constraint`.
    pub features: Vec<String>,
    /// Schedulable CPUs to declare instead of the host's (simulation, dev).
    pub cpus: Option<u32>,
    /// Schedulable memory in MiB to declare instead of the host's.
    pub memory_mb: Option<u64>,
    /// Whether tasks may run as root.
    pub allow_root: bool,
    /// Seconds between SIGTERM and SIGKILL when a task is stopped.
    pub kill_grace_secs: u64,
    /// A command whose failure drains the node (`[agent.health_check]`).
    pub health_check: Option<HealthCheck>,
    /// A node joining for the first time stays drained until its health
    /// check passes once.
    pub preflight: bool,
    /// How tasks in container images run here (`[agent.containers]`).
    pub containers: Containers,
}

/// What an agent's node is for.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AgentRole {
    /// Runs tasks.
    #[default]
    Compute,
    /// Runs no tasks; submits for the users logged in here.
    Login,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            cluster_name: "gpuq".into(),
            node_name: crate::hostname::short(),
            data_dir: "/var/lib/gpuq/server".into(),
            listen: SocketAddr::from(([0, 0, 0, 0], 7420)),
            advertise: None,
            socket: crate::socket_path::system(),
            http_listen: SocketAddr::from(([127, 0, 0, 1], 7480)),
            admin_group: None,
            admin_users: Vec::new(),
            private_jobs: false,
            max_token_ttl_secs: 7 * 24 * 3600,
            node_ttl_secs: 10,
            history_retention_secs: 300,
            inactive_limit_secs: 300,
            idle_gpu_secs: 1800,
            master_port_range: Default::default(),
            raft: RaftConfig::default(),
            bootstrap: BootstrapConfig::default(),
        }
    }
}

impl Default for RaftConfig {
    fn default() -> Self {
        RaftConfig {
            heartbeat_ms: 150,
            election_timeout_min_ms: 600,
            election_timeout_max_ms: 1200,
            snapshot_after_logs: 10_000,
            logs_kept_after_snapshot: 1000,
            max_payload_entries: 512,
        }
    }
}

impl Default for AgentConfig {
    fn default() -> Self {
        AgentConfig {
            node_name: crate::hostname::short(),
            data_dir: "/var/lib/gpuq/agent".into(),
            listen: SocketAddr::from(([0, 0, 0, 0], 7421)),
            socket: crate::socket_path::system(),
            http_listen: SocketAddr::from(([127, 0, 0, 1], 7481)),
            dcgm_job_map_dir: None,
            servers: Vec::new(),
            role: AgentRole::Compute,
            admin_group: None,
            gpus: Default::default(),
            reserved_cpus: 0,
            reserved_memory_mb: 0,
            topology: String::new(),
            features: Vec::new(),
            cpus: None,
            memory_mb: None,
            allow_root: false,
            kill_grace_secs: 10,
            health_check: None,
            preflight: false,
            containers: Containers::default(),
        }
    }
}

/// Why a configuration was refused. Each names the file, variable or key.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("config file {} does not exist; create it (config/server.toml and config/agent.toml document every key) or give another path", .path.display())]
    NotFound { path: PathBuf },
    #[error("cannot read config file {}: {source}", .path.display())]
    Unreadable { path: PathBuf, source: io::Error },
    #[error("config file {} is not valid TOML: {message}", .path.display())]
    Syntax { path: PathBuf, message: String },
    #[error("config file {}{at}: unknown key {key}; {hint}", .path.display())]
    UnknownKey {
        path: PathBuf,
        /// `" line N"`, or empty where toml knows no position.
        at: String,
        key: String,
        hint: String,
    },
    #[error("config file {}{at}: {message}", .path.display())]
    BadValue {
        path: PathBuf,
        /// `" line N: the.key"`, `" line N"`, or empty.
        at: String,
        message: String,
    },
    #[error("environment variable {var}={value:?} {problem}")]
    Env {
        var: &'static str,
        value: String,
        problem: String,
    },
    #[error("{key} {problem}")]
    Invalid { key: String, problem: String },
}

/// The whole file: each daemon takes its table, both are checked.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct ConfigFile {
    #[serde(default)]
    server: ServerConfig,
    #[serde(default)]
    agent: AgentConfig,
}

/// The table paths the key check descends into. A new nested table (such as
/// `[agent.gpus]`) is one more arm here.
fn known_keys(table: &str) -> Option<&'static [&'static str]> {
    Some(match table {
        "" => field_names::<ConfigFile>(),
        "server" => field_names::<ServerConfig>(),
        "server.raft" => field_names::<RaftConfig>(),
        "server.bootstrap" => field_names::<BootstrapConfig>(),
        "agent" => field_names::<AgentConfig>(),
        "agent.containers" => field_names::<Containers>(),
        _ => return None,
    })
}

impl ServerConfig {
    /// Reads `path` (which must exist), or `/etc/gpuq/gpuq.toml` if present, or
    /// nothing; then applies `GPUQ_*` overrides from `env`, then validates.
    pub fn load(path: Option<&Path>, env: &[(String, String)]) -> Result<Self, ConfigError> {
        Self::load_from(path, Path::new(DEFAULT_CONFIG_PATH), env)
    }

    fn load_from(
        path: Option<&Path>,
        default_path: &Path,
        env: &[(String, String)],
    ) -> Result<Self, ConfigError> {
        load_table(path, default_path, env)
    }

    /// Parses the `[server]` table of a config file's text (no env, validated).
    /// `origin` is only used in messages.
    pub fn from_toml(text: &str, origin: &Path) -> Result<Self, ConfigError> {
        table_from_toml(text, origin)
    }

    /// Applies `GPUQ_CLUSTER_NAME`, `GPUQ_NODE_NAME`, `GPUQ_DATA_DIR`,
    /// `GPUQ_LISTEN`, `GPUQ_ADVERTISE`, `GPUQ_SOCKET`, `GPUQ_HTTP_LISTEN` and
    /// `GPUQ_ADMIN_GROUP`.
    pub fn apply_env(&mut self, env: &[(String, String)]) -> Result<(), ConfigError> {
        let env = Env(env);
        env.string("GPUQ_CLUSTER_NAME", &mut self.cluster_name)?;
        env.string("GPUQ_NODE_NAME", &mut self.node_name)?;
        env.path("GPUQ_DATA_DIR", &mut self.data_dir)?;
        env.addr("GPUQ_LISTEN", &mut self.listen)?;
        if let Some(value) = env.get("GPUQ_ADVERTISE") {
            // Empty clears it, as for the other optional settings.
            self.advertise = match value.trim() {
                "" => None,
                _ => Some(env_addr("GPUQ_ADVERTISE", value)?),
            };
        }
        env.path("GPUQ_SOCKET", &mut self.socket)?;
        env.addr("GPUQ_HTTP_LISTEN", &mut self.http_listen)?;
        env.optional("GPUQ_ADMIN_GROUP", &mut self.admin_group);
        Ok(())
    }

    /// Checks what the types cannot: names, timing relations, non-empty paths.
    pub fn validate(&self) -> Result<(), ConfigError> {
        check_name("server.cluster_name", &self.cluster_name)?;
        check_name("server.node_name", &self.node_name)?;
        check_path("server.data_dir", &self.data_dir)?;
        check_path("server.socket", &self.socket)?;
        check_group("server.admin_group", &self.admin_group)?;
        if self.admin_users.iter().any(|u| u.trim().is_empty()) {
            return Err(ConfigError::Invalid {
                key: "server.admin_users".into(),
                problem: "holds an empty name: list user names, e.g. [\"alice\"]".into(),
            });
        }
        if self.max_token_ttl_secs == 0 {
            return Err(ConfigError::Invalid {
                key: "server.max_token_ttl_secs".into(),
                problem: "must be positive, e.g. 604800 (a week)".into(),
            });
        }
        self.raft.validate()
    }
}

impl RaftConfig {
    /// Heartbeats must come well inside the election timeout, or followers
    /// start elections against a healthy leader.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let invalid = |key: &str, problem: String| {
            Err(ConfigError::Invalid {
                key: format!("server.raft.{key}"),
                problem,
            })
        };
        for (key, value) in [
            ("heartbeat_ms", self.heartbeat_ms),
            ("snapshot_after_logs", self.snapshot_after_logs),
            ("max_payload_entries", self.max_payload_entries),
        ] {
            if value == 0 {
                return invalid(key, "must be at least 1".into());
            }
        }
        if self.election_timeout_min_ms >= self.election_timeout_max_ms {
            return invalid(
                "election_timeout_min_ms",
                format!(
                    "({}) must be less than election_timeout_max_ms ({}); e.g. 600 and 1200",
                    self.election_timeout_min_ms, self.election_timeout_max_ms
                ),
            );
        }
        if self.heartbeat_ms >= self.election_timeout_min_ms {
            return invalid(
                "heartbeat_ms",
                format!(
                    "({}) must be less than election_timeout_min_ms ({}); a quarter of it is usual",
                    self.heartbeat_ms, self.election_timeout_min_ms
                ),
            );
        }
        Ok(())
    }
}

impl AgentConfig {
    /// Reads the `[agent]` table the way `ServerConfig::load` reads `[server]`.
    pub fn load(path: Option<&Path>, env: &[(String, String)]) -> Result<Self, ConfigError> {
        Self::load_from(path, Path::new(DEFAULT_CONFIG_PATH), env)
    }

    fn load_from(
        path: Option<&Path>,
        default_path: &Path,
        env: &[(String, String)],
    ) -> Result<Self, ConfigError> {
        load_table(path, default_path, env)
    }

    /// Parses the `[agent]` table of a config file's text (no env, validated).
    pub fn from_toml(text: &str, origin: &Path) -> Result<Self, ConfigError> {
        table_from_toml(text, origin)
    }

    /// Applies `GPUQ_NODE_NAME`, `GPUQ_DATA_DIR`, `GPUQ_LISTEN`, `GPUQ_SOCKET`,
    /// `GPUQ_HTTP_LISTEN`, `GPUQ_ADMIN_GROUP` and `GPUQ_SERVERS`
    /// (comma-separated HOST:PORT).
    pub fn apply_env(&mut self, env: &[(String, String)]) -> Result<(), ConfigError> {
        let env = Env(env);
        env.string("GPUQ_NODE_NAME", &mut self.node_name)?;
        env.path("GPUQ_DATA_DIR", &mut self.data_dir)?;
        env.addr("GPUQ_LISTEN", &mut self.listen)?;
        env.path("GPUQ_SOCKET", &mut self.socket)?;
        env.addr("GPUQ_HTTP_LISTEN", &mut self.http_listen)?;
        env.optional("GPUQ_ADMIN_GROUP", &mut self.admin_group);
        if let Some(value) = env.get("GPUQ_SERVERS") {
            let servers: Vec<String> = value
                .split(',')
                .map(|s| s.trim().to_string())
                .filter(|s| !s.is_empty())
                .collect();
            if let Some(bad) = servers.iter().find(|s| !is_host_port(s)) {
                return Err(ConfigError::Env {
                    var: "GPUQ_SERVERS",
                    value: value.to_string(),
                    problem: format!(
                        "has {bad:?}, which is not HOST:PORT; use e.g. gpuq1:7420,gpuq2:7420"
                    ),
                });
            }
            self.servers = servers;
        }
        Ok(())
    }

    /// Checks what the types cannot.
    pub fn validate(&self) -> Result<(), ConfigError> {
        check_name("agent.node_name", &self.node_name)?;
        check_path("agent.data_dir", &self.data_dir)?;
        check_path("agent.socket", &self.socket)?;
        check_group("agent.admin_group", &self.admin_group)?;
        self.containers.validate()?;
        if !self.http_listen.ip().is_loopback() {
            return Err(ConfigError::Invalid {
                key: "agent.http_listen".into(),
                problem: format!(
                    "({}) is beyond loopback, and an agent serves its HTTP port on loopback \
                     only (it has no tokens to check): use e.g. 127.0.0.1:7481 and scrape it \
                     from a Prometheus agent on the node",
                    self.http_listen
                ),
            });
        }
        for (i, server) in self.servers.iter().enumerate() {
            if !is_host_port(server) {
                return Err(ConfigError::Invalid {
                    key: format!("agent.servers[{i}]"),
                    problem: format!(
                        "{server:?} is not HOST:PORT; use e.g. \"gpuq1:7420\" or \"[fd00::1]:7420\""
                    ),
                });
            }
        }
        Ok(())
    }
}

/// A daemon's table of the file: how it is taken out of the whole file,
/// overridden from the environment and checked. One loader reads either.
trait DaemonTable: Sized {
    fn take(file: ConfigFile) -> Self;
    fn apply_env(&mut self, env: &[(String, String)]) -> Result<(), ConfigError>;
    fn validate(&self) -> Result<(), ConfigError>;
}

impl DaemonTable for ServerConfig {
    fn take(file: ConfigFile) -> Self {
        file.server
    }
    fn apply_env(&mut self, env: &[(String, String)]) -> Result<(), ConfigError> {
        ServerConfig::apply_env(self, env)
    }
    fn validate(&self) -> Result<(), ConfigError> {
        ServerConfig::validate(self)
    }
}

impl DaemonTable for AgentConfig {
    fn take(file: ConfigFile) -> Self {
        file.agent
    }
    fn apply_env(&mut self, env: &[(String, String)]) -> Result<(), ConfigError> {
        AgentConfig::apply_env(self, env)
    }
    fn validate(&self) -> Result<(), ConfigError> {
        AgentConfig::validate(self)
    }
}

/// Reads the file (`path`, else `default_path` if present, else defaults),
/// takes the daemon's table, applies `GPUQ_*` overrides, validates.
fn load_table<T: DaemonTable>(
    path: Option<&Path>,
    default_path: &Path,
    env: &[(String, String)],
) -> Result<T, ConfigError> {
    let mut config = T::take(read_file(path, default_path)?);
    config.apply_env(env)?;
    config.validate()?;
    Ok(config)
}

/// Parses a file's text and takes the daemon's table (no env, validated).
fn table_from_toml<T: DaemonTable>(text: &str, origin: &Path) -> Result<T, ConfigError> {
    let config = T::take(parse_file(text, origin)?);
    config.validate()?;
    Ok(config)
}

fn read_file(path: Option<&Path>, default_path: &Path) -> Result<ConfigFile, ConfigError> {
    let path = match path {
        Some(p) => p,
        None if default_path.exists() => default_path,
        None => return Ok(ConfigFile::default()),
    };
    let text = std::fs::read_to_string(path).map_err(|source| {
        if source.kind() == io::ErrorKind::NotFound {
            ConfigError::NotFound { path: path.into() }
        } else {
            ConfigError::Unreadable {
                path: path.into(),
                source,
            }
        }
    })?;
    parse_file(&text, path)
}

fn parse_file(text: &str, path: &Path) -> Result<ConfigFile, ConfigError> {
    toml_file::parse(text, path, known_keys)
}

/// Socket addresses with a message that says what is expected.
mod addr {
    use std::net::SocketAddr;

    use serde::{Deserialize, Deserializer};

    /// Parses `IP:PORT`; the error says what is expected, not what was given.
    pub fn parse(text: &str) -> Result<SocketAddr, &'static str> {
        text.trim()
            .parse()
            .map_err(|_| "is not an IP:PORT address; use e.g. 0.0.0.0:7420 or [::]:7420")
    }

    pub fn required<'de, D: Deserializer<'de>>(d: D) -> Result<SocketAddr, D::Error> {
        let text = String::deserialize(d)?;
        parse(&text).map_err(|problem| serde::de::Error::custom(format!("{text:?} {problem}")))
    }

    pub fn optional<'de, D: Deserializer<'de>>(d: D) -> Result<Option<SocketAddr>, D::Error> {
        required(d).map(Some)
    }
}

/// `GPUQ_*` lookups; the last occurrence of a variable wins, as in a shell.
struct Env<'a>(&'a [(String, String)]);

impl Env<'_> {
    fn get(&self, var: &str) -> Option<&str> {
        self.0
            .iter()
            .rev()
            .find(|(k, _)| k == var)
            .map(|(_, v)| v.as_str())
    }

    fn string(&self, var: &'static str, slot: &mut String) -> Result<(), ConfigError> {
        if let Some(value) = self.get(var) {
            if value.trim().is_empty() {
                return Err(empty(var));
            }
            *slot = value.to_string();
        }
        Ok(())
    }

    fn path(&self, var: &'static str, slot: &mut PathBuf) -> Result<(), ConfigError> {
        if let Some(value) = self.get(var) {
            if value.trim().is_empty() {
                return Err(empty(var));
            }
            *slot = value.into();
        }
        Ok(())
    }

    fn addr(&self, var: &'static str, slot: &mut SocketAddr) -> Result<(), ConfigError> {
        if let Some(value) = self.get(var) {
            *slot = env_addr(var, value)?;
        }
        Ok(())
    }

    /// An empty value clears an optional setting.
    fn optional(&self, var: &'static str, slot: &mut Option<String>) {
        if let Some(value) = self.get(var) {
            *slot = (!value.trim().is_empty()).then(|| value.to_string());
        }
    }
}

fn env_addr(var: &'static str, value: &str) -> Result<SocketAddr, ConfigError> {
    addr::parse(value).map_err(|problem| ConfigError::Env {
        var,
        value: value.to_string(),
        problem: problem.to_string(),
    })
}

fn empty(var: &'static str) -> ConfigError {
    ConfigError::Env {
        var,
        value: String::new(),
        problem: "is empty; unset it or give a value".into(),
    }
}

#[cfg(test)]
mod tests;
