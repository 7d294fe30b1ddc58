//! The `gpuq` binary: maps subcommands onto the library's roles and commands.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};

use gpuq::cli::{self, CliError, ClientCommand};
use gpuq::config::{AgentConfig, AgentRole, ServerConfig};

/// gpuq: a GPU cluster workload manager. One binary runs the Raft-replicated
/// control plane (`gpuq server`), the node agents (`gpuq agent`) and the
/// client commands, which talk to the local daemon's socket (GPUQ_SOCKET).
///
/// Exit codes: 0 ok, 1 wrong input (or a missing or forbidden thing),
/// 2 the cluster could not be reached, 3 internal error.
#[derive(Parser, Debug)]
#[command(name = "gpuq", version, max_term_width = 100)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand, Debug)]
#[command(defer = true)]
enum Cmd {
    /// Run a control-plane server (a Raft member).
    Server(ServerArgs),
    /// Run a node agent (compute, or login: vouches for local users only).
    Agent(AgentArgs),
    /// Run a whole cluster in this process: one server and N agents with fake
    /// GPUs; tasks are real processes. The CLI finds its socket with no flags.
    Dev(DevArgs),
    /// Simulation: virtual agents for benchmarks at fleet scale.
    #[command(subcommand)]
    Sim(SimCmd),
    #[command(flatten)]
    Client(ClientCommand),
    /// Slurm's commands: sbatch, srun, salloc, sattach, squeue, sacct, scancel,
    /// scontrol, sinfo (also as
    /// links of those names to this binary); `gpuq slurm --help` lists them.
    #[command(disable_help_flag = true)]
    Slurm {
        /// The Slurm command and its arguments.
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<std::ffi::OsString>,
    },
    /// Parent of one task's process, started detached by the agent; with
    /// --serve, the agent's shim launcher (task directories on stdin).
    #[command(hide = true)]
    Shim {
        #[arg(long, required_unless_present = "serve")]
        task_dir: Option<PathBuf>,
        #[arg(long, conflicts_with = "task_dir")]
        serve: bool,
    },
}

// `gpuq server`
#[derive(Args, Debug)]
struct ServerArgs {
    /// Config file (TOML, [server] table). Default /etc/gpuq/gpuq.toml if it exists.
    #[arg(long)]
    config: Option<PathBuf>,
    /// Create a new cluster (CA and first voter) when the data dir is empty.
    /// Harmless on a server that already has one.
    #[arg(long)]
    bootstrap: bool,
    /// Where the Raft log, state and keys live.
    #[arg(long)]
    data_dir: Option<PathBuf>,
    /// UDP address for QUIC (agents, servers, forwarded requests).
    #[arg(long)]
    listen: Option<SocketAddr>,
    /// The address other daemons dial to reach this server.
    #[arg(long)]
    advertise: Option<SocketAddr>,
    /// The local API socket for the CLI.
    #[arg(long)]
    socket: Option<PathBuf>,
    /// This server's name (default: the host name).
    #[arg(long)]
    node_name: Option<String>,
    /// The cluster's name, set when bootstrapping.
    #[arg(long)]
    cluster_name: Option<String>,
    /// Join an existing cluster through this server, HOST:PORT (needed once,
    /// with --token; a restart needs neither).
    #[arg(long, requires = "token", conflicts_with = "bootstrap")]
    join: Option<SocketAddr>,
    /// The join token printed by `gpuq token create --role server`.
    #[arg(long, env = "GPUQ_TOKEN", hide_env_values = true)]
    token: Option<String>,
    /// Form a new cluster of N servers started at once: with --peers and a
    /// shared secret (GPUQ_BOOTSTRAP_SECRET or --bootstrap-secret-file) on
    /// every one; the lowest peer address creates it, the others join it.
    #[arg(long, conflicts_with_all = ["bootstrap", "join"])]
    bootstrap_expect: Option<usize>,
    /// Every server's advertised IP:PORT, this one's included (comma list).
    #[arg(long, value_delimiter = ',')]
    peers: Vec<SocketAddr>,
    /// A file holding the shared bootstrap secret.
    #[arg(long)]
    bootstrap_secret_file: Option<PathBuf>,
}

// `gpuq agent`
#[derive(Args, Debug)]
struct AgentArgs {
    /// Config file (TOML, [agent] table). Default /etc/gpuq/gpuq.toml if it exists.
    #[arg(long)]
    config: Option<PathBuf>,
    /// compute (runs jobs) or login (runs none; lets local users submit).
    #[arg(long, value_parser = parse_agent_role)]
    role: Option<AgentRole>,
    /// A server to join through, HOST:PORT (needed once, with --token).
    #[arg(long)]
    join: Option<SocketAddr>,
    /// The join token printed by `gpuq token create --role agent`.
    #[arg(long, env = "GPUQ_TOKEN", hide_env_values = true)]
    token: Option<String>,
    /// Where the agent keeps its identity and ledger.
    #[arg(long)]
    data_dir: Option<PathBuf>,
    /// The local API socket for the CLI.
    #[arg(long)]
    socket: Option<PathBuf>,
    /// This node's name (default: the host name).
    #[arg(long)]
    node_name: Option<String>,
    /// Servers to talk to, HOST:PORT (comma list).
    #[arg(long, value_delimiter = ',')]
    servers: Vec<String>,
}

// `gpuq dev`
#[derive(Args, Debug)]
struct DevArgs {
    /// Number of compute nodes.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u32).range(1..=256))]
    nodes: u32,
    /// Fake GPUs per node (a DGX H100 topology).
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u32).range(0..=64))]
    gpus_per_node: u32,
    /// Where the cluster keeps its state (default ~/.local/state/gpuq/dev).
    #[arg(long)]
    dir: Option<PathBuf>,
    /// Start from an empty state.
    #[arg(long)]
    fresh: bool,
    /// fake (simulated GPUs) or nvml (this machine's GPUs, with --nodes 1).
    #[arg(long, default_value = "fake", value_parser = ["fake", "nvml"])]
    gpus: String,
    /// Partition every simulated GPU into MIG slices with this layout, e.g.
    /// 1g.10gb:7 or 3g.40gb,2g.20gb,1g.10gb:2 (profiles of an 80 GB H100:
    /// 1g.10gb, 1g.20gb, 2g.20gb, 3g.40gb, 4g.40gb, 7g.80gb; at most 7
    /// compute and 8 memory slices per GPU).
    #[arg(long, value_name = "LAYOUT", value_parser = parse_mig_layout)]
    mig: Option<gpuq::model::MigLayout>,
    /// Time-share every simulated GPU into N slots (1 to 64): jobs ask for a
    /// slot with --gpus shared:1 (see `gpuq node share`).
    #[arg(long, value_name = "N")]
    shared: Option<u32>,
    /// The server's HTTP port (metrics, API, web page) on loopback; port 0
    /// takes any free one. The nodes' agents serve theirs on free ports.
    #[arg(long, env = "GPUQ_HTTP_LISTEN", default_value = "127.0.0.1:7480")]
    http: std::net::SocketAddr,
    /// A node group of up to N more simulated nodes (burst-001, ...), each
    /// its own `gpuq agent` process, started when jobs wait for capacity
    /// and stopped after a minute idle (needs root).
    #[arg(long, value_name = "N", default_value_t = 0, value_parser = clap::value_parser!(u32).range(0..=64))]
    burst: u32,
}

// `gpuq sim ...`
#[derive(Subcommand, Debug)]
#[command(defer = true)]
enum SimCmd {
    /// Run N simulated compute agents in this process: each joins with the
    /// token, connects over its own QUIC endpoint and heartbeats like a real
    /// agent; tasks run no process and end after their job's
    /// GPUQ_SIM_DURATION_MS (default 1000) divided by --compression, failing
    /// when GPUQ_SIM_EXIT is non-zero.
    Agents(SimAgentsArgs),
    /// Replay a job trace in virtual time through the real scheduler and
    /// state machine (no network, no agents, no sleeping) and report
    /// utilisation, waits, completion times and fairness; with --compare,
    /// two policies side by side.
    Replay(gpuq::sim::replay::command::ReplayArgs),
}

// `gpuq sim agents`
#[derive(Args, Debug)]
struct SimAgentsArgs {
    /// Number of agents (each needs one open file and one UDP port).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
    count: u32,
    /// The server to join and connect to, HOST:PORT.
    #[arg(long)]
    join: SocketAddr,
    /// An agent join token (`gpuq token create --role agent`).
    #[arg(long, env = "GPUQ_TOKEN", hide_env_values = true)]
    token: String,
    /// Fake GPUs per node (a DGX H100 topology).
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u32).range(0..=64))]
    gpus_per_node: u32,
    /// Nodes per leaf switch: topology labels are spine{s}/leaf{l}.
    #[arg(long, default_value_t = 32, value_parser = clap::value_parser!(u32).range(1..))]
    topology_leaves: u32,
    /// Leaf switches per spine.
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u32).range(1..))]
    leaves_per_spine: u32,
    /// Time compression: tasks run their declared duration divided by this
    /// (a job's time limit is wall time and is not divided).
    #[arg(long, default_value_t = 1.0)]
    compression: f64,
    /// Node names: this prefix and a zero-padded number.
    #[arg(long, default_value = "sim")]
    name_prefix: String,
    /// The number of the first node (to run several sim processes side by side).
    #[arg(long, default_value_t = 1)]
    first: u32,
    /// Keep identities under DIR/NAME/tls so a restart joins nothing (default:
    /// in memory only).
    #[arg(long)]
    data_dir: Option<PathBuf>,
    /// Joins in flight at once.
    #[arg(long, default_value_t = 32, value_parser = clap::value_parser!(u64).range(1..=1024))]
    join_concurrency: u64,
    /// How often each agent re-examines its tasks, ms (a real agent: 200).
    #[arg(long, default_value_t = 200, value_parser = clap::value_parser!(u64).range(1..))]
    reconcile_ms: u64,
}

impl SimAgentsArgs {
    fn options(self) -> gpuq::sim::FleetOptions {
        gpuq::sim::FleetOptions {
            count: self.count,
            join: self.join,
            token: self.token,
            gpus_per_node: self.gpus_per_node,
            nodes_per_leaf: self.topology_leaves,
            leaves_per_spine: self.leaves_per_spine,
            compression: self.compression,
            name_prefix: self.name_prefix,
            first_index: self.first,
            data_dir: self.data_dir,
            join_concurrency: self.join_concurrency as usize,
            reconcile_every: std::time::Duration::from_millis(self.reconcile_ms),
        }
    }
}

fn parse_mig_layout(s: &str) -> Result<gpuq::model::MigLayout, String> {
    gpuq::model::MigLayout::parse(s).map_err(|e| e.to_string())
}

fn parse_agent_role(s: &str) -> Result<AgentRole, String> {
    match s {
        "compute" => Ok(AgentRole::Compute),
        "login" => Ok(AgentRole::Login),
        _ => Err(format!("unknown role {s:?}; use compute or login")),
    }
}

fn env_pairs() -> Vec<(String, String)> {
    std::env::vars().collect()
}

fn server_config(a: ServerArgs) -> anyhow::Result<(ServerConfig, gpuq::server::ServerOptions)> {
    let mut cfg = ServerConfig::load(a.config.as_deref(), &env_pairs())?;
    if let Some(v) = a.data_dir {
        cfg.data_dir = v;
    }
    if let Some(v) = a.listen {
        cfg.listen = v;
    }
    if let Some(v) = a.advertise {
        cfg.advertise = Some(v);
    }
    if let Some(v) = a.socket {
        cfg.socket = v;
    }
    if let Some(v) = a.node_name {
        cfg.node_name = v;
    }
    if let Some(v) = a.cluster_name {
        cfg.cluster_name = v;
    }
    if let Some(v) = a.bootstrap_expect {
        cfg.bootstrap.expect = v;
    }
    if !a.peers.is_empty() {
        cfg.bootstrap.peers = a.peers.iter().map(|p| p.to_string()).collect();
    }
    if let Some(v) = a.bootstrap_secret_file {
        cfg.bootstrap.secret_file = Some(v);
    }
    let bootstrap_plan = bootstrap_plan(&cfg)?;
    let opts = gpuq::server::ServerOptions {
        bootstrap: a.bootstrap,
        join: a.join.zip(a.token),
        bootstrap_plan,
    };
    Ok((cfg, opts))
}

/// The `--bootstrap-expect` plan from the config (flags applied), if any.
fn bootstrap_plan(cfg: &ServerConfig) -> anyhow::Result<Option<gpuq::server::BootstrapPlan>> {
    use anyhow::Context;
    let b = &cfg.bootstrap;
    if b.expect == 0 {
        if !b.peers.is_empty() {
            anyhow::bail!("--peers is given without --bootstrap-expect N (the number of servers)");
        }
        return Ok(None);
    }
    let peers = b
        .peers
        .iter()
        .map(|p| {
            p.parse::<SocketAddr>()
                .map_err(|_| anyhow::anyhow!("peer {p:?} is not IP:PORT (e.g. 10.0.0.1:7420)"))
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    let secret = match (std::env::var("GPUQ_BOOTSTRAP_SECRET"), &b.secret_file) {
        (Ok(s), _) => s,
        (Err(_), Some(path)) => std::fs::read_to_string(path)
            .with_context(|| format!("cannot read the bootstrap secret file {}", path.display()))?,
        (Err(_), None) => anyhow::bail!(
            "--bootstrap-expect needs the shared secret: set GPUQ_BOOTSTRAP_SECRET or \
             --bootstrap-secret-file (the same on every server)"
        ),
    };
    Ok(Some(gpuq::server::BootstrapPlan {
        expect: b.expect,
        peers,
        secret,
    }))
}

fn agent_config(a: &AgentArgs) -> anyhow::Result<AgentConfig> {
    let mut cfg = AgentConfig::load(a.config.as_deref(), &env_pairs())?;
    if let Some(v) = a.role {
        cfg.role = v;
    }
    if let Some(v) = &a.data_dir {
        cfg.data_dir = v.clone();
    }
    if let Some(v) = &a.socket {
        cfg.socket = v.clone();
    }
    if let Some(v) = &a.node_name {
        cfg.node_name = v.clone();
    }
    if !a.servers.is_empty() {
        cfg.servers = a.servers.clone();
    }
    Ok(cfg)
}

fn init_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_env("GPUQ_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info,openraft=warn,quinn=warn"));
    use std::io::IsTerminal;
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr)
        .with_target(false)
        .init();
}

async fn daemon(cmd: Cmd) -> anyhow::Result<()> {
    match cmd {
        Cmd::Server(a) => {
            let (cfg, opts) = server_config(a)?;
            gpuq::server::run(cfg, opts).await
        }
        Cmd::Agent(a) => {
            let cfg = agent_config(&a)?;
            match cfg.role {
                AgentRole::Login => gpuq::agent::run_login(cfg, a.join, a.token).await,
                AgentRole::Compute => gpuq::agent::run_compute(cfg, a.join, a.token).await,
            }
        }
        Cmd::Dev(a) => {
            gpuq::dev::run(gpuq::dev::DevOptions {
                nodes: a.nodes,
                gpus_per_node: a.gpus_per_node,
                dir: a.dir.unwrap_or_else(gpuq::socket_path::dev_dir),
                fresh: a.fresh,
                nvml: a.gpus == "nvml",
                mig: a.mig,
                shared: a.shared,
                links: gpuq::compat::COMMANDS.map(String::from).to_vec(),
                http: a.http,
                burst: a.burst,
            })
            .await
        }
        Cmd::Sim(SimCmd::Agents(a)) => gpuq::sim::run_agents(a.options()).await,
        Cmd::Sim(SimCmd::Replay(_)) => unreachable!("not a daemon"),
        Cmd::Client(_) | Cmd::Shim { .. } | Cmd::Slurm { .. } => unreachable!("not a daemon"),
    }
}

/// `gpuq slurm COMMAND ARGS...`: the Slurm command, or the list of them.
fn slurm(args: &[std::ffi::OsString]) -> ExitCode {
    match args.first().map(|a| a.to_string_lossy()) {
        None => {
            print!("{}", gpuq::compat::HELP);
            ExitCode::SUCCESS
        }
        Some(a) if a == "--help" || a == "-h" || a == "help" => {
            print!("{}", gpuq::compat::HELP);
            ExitCode::SUCCESS
        }
        Some(a) => match gpuq::compat::command_of(&args[0]).filter(|c| *c == a) {
            Some(command) => gpuq::compat::main(command, args[1..].to_vec()),
            None => CliError::input(format!(
                "{a:?} is not a Slurm command gpuq speaks; use one of {} (gpuq slurm --help)",
                gpuq::compat::COMMANDS.join(", ")
            ))
            .exit(),
        },
    }
}

fn main() -> ExitCode {
    // The agent starts a shim per task exactly so: skip building the parser
    // for every other command (a measurable part of a shim's start).
    // The launcher is started so too: its forks (the shims) copy its memory,
    // so it never builds the parser either.
    let args: Vec<std::ffi::OsString> = std::env::args_os().collect();
    match args.as_slice() {
        [_, shim, flag, task_dir] if shim == "shim" && flag == "--task-dir" => {
            std::process::exit(gpuq::agent::exec::shim_main(std::path::Path::new(task_dir)));
        }
        [_, shim, flag] if shim == "shim" && flag == "--serve" => {
            std::process::exit(gpuq::agent::exec::serve_shims());
        }
        _ => {}
    }
    // Slurm's commands: a link named sbatch (etc.), or `gpuq slurm sbatch`.
    // Before clap, so their flags are theirs, not gpuq's.
    if let Some(command) = args.first().and_then(|a| gpuq::compat::command_of(a)) {
        return gpuq::compat::main(command, args[1..].to_vec());
    }
    if args.get(1).is_some_and(|a| a == "slurm") {
        return slurm(&args[2..]);
    }
    let cli = match Cli::try_parse() {
        Ok(c) => c,
        Err(e) => {
            let code = if e.use_stderr() { 1 } else { 0 };
            let _ = e.print();
            return ExitCode::from(code);
        }
    };
    let cli = match cli.cmd {
        Cmd::Sim(SimCmd::Replay(a)) => {
            return match gpuq::sim::replay::command::run(a) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) if e.is_input() => CliError::input(e.to_string()).exit(),
                Err(e) => CliError::internal(e.to_string()).exit(),
            }
        }
        cmd => Cli { cmd },
    };
    if let Cmd::Shim { task_dir, serve } = &cli.cmd {
        // Before any runtime or thread exists: the shim and the launcher fork.
        std::process::exit(match task_dir {
            Some(dir) if !serve => gpuq::agent::exec::shim_main(dir),
            _ => gpuq::agent::exec::serve_shims(),
        });
    }
    // A client command is one round trip: a single-threaded runtime starts
    // faster than a pool of workers.
    let runtime = match &cli.cmd {
        Cmd::Client(_) => tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build(),
        _ => tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build(),
    };
    let runtime = match runtime {
        Ok(r) => r,
        Err(e) => return CliError::internal(format!("cannot start the runtime: {e}")).exit(),
    };
    use gpuq::cli::cluster::{ClusterCommand, SnapshotCommand};
    match cli.cmd {
        Cmd::Client(ClientCommand::Cluster {
            cmd:
                Some(ClusterCommand::Snapshot(SnapshotCommand::Restore {
                    file,
                    data_dir,
                    node_name,
                    advertise,
                })),
            ..
        }) => match runtime.block_on(gpuq::server::restore(
            &file, &data_dir, &node_name, advertise,
        )) {
            Ok(msg) => {
                println!("{msg}");
                ExitCode::SUCCESS
            }
            Err(e) => CliError::input(format!("{e:#}")).exit(),
        },
        Cmd::Slurm { args } => slurm(&args),
        Cmd::Client(c) => match runtime.block_on(cli::run(c)) {
            Ok(code) => code,
            Err(e) => e.exit(),
        },
        daemon_cmd => {
            init_logging();
            match runtime.block_on(daemon(daemon_cmd)) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("gpuq: {e:#}");
                    ExitCode::from(1)
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    /// Subcommands are built when they are used (`defer`), so a mistake in
    /// one (a clash of flags, say) would show only then; this builds them all.
    #[test]
    fn every_command_is_well_formed() {
        super::Cli::command().debug_assert();
    }
}
