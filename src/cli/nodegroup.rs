//! `gpuq admin nodegroup add|modify|remove|list`: node groups, capacity
//! the leader starts and stops on demand (see `model::nodegroup` and
//! `server::autoscale`).

use clap::{Args, Subcommand};

use super::table::Table;
use super::{policy_change, print_json, CliError, JsonFlag};
use crate::model::policy_change::{NodeGroupPatch, Op, PolicyChange};

// `gpuq admin nodegroup ...`
#[derive(Subcommand, Debug)]
#[command(defer = true)]
pub enum NodeGroupCommand {
    /// Declare a group of like nodes started and stopped on demand.
    ///
    /// When jobs that fit one of its nodes have waited --demand-time for
    /// capacity, the leader runs --resume-command with the host list of the
    /// nodes it wants appended (and GPUQ_NODES, GPUQ_NODE_NAMES (space
    /// separated), GPUQ_NODE_COUNT, GPUQ_NODE_GROUP in its environment);
    /// the command starts machines
    /// whose `gpuq agent` joins with those names (GROUP-001, GROUP-002,
    /// ...). A node that has not joined after --resume-timeout is given up
    /// on (`failed`) and its place asked for again under another name.
    /// Nodes idle for --idle-time are drained and stopped with
    /// --suspend-command (same arguments), down to --min.
    Add(NodeGroupArgs),
    /// Change a group (only the options given).
    Modify(NodeGroupArgs),
    /// Remove a group whose nodes are all stopped.
    Remove { name: String },
    /// List groups with their shape, bounds and commands.
    List {
        #[command(flatten)]
        json: JsonFlag,
    },
}

// The settings of a node group.
#[derive(Args, Debug)]
pub struct NodeGroupArgs {
    /// The group's name; its nodes are NAME-001, NAME-002, ...
    name: String,
    /// GPUs of one node.
    #[arg(long)]
    gpus: Option<u32>,
    /// CPUs of one node available to jobs.
    #[arg(long)]
    cpus: Option<u32>,
    /// Memory of one node available to jobs: 1000G, 512000M.
    #[arg(long, value_name = "SIZE", value_parser = parse_mem)]
    mem: Option<u64>,
    /// Features its nodes have, for --constraint (comma list; "" for none).
    #[arg(long, value_delimiter = ',', num_args = 0..)]
    features: Option<Vec<String>>,
    /// Nodes it keeps even when idle [default on add: 0].
    #[arg(long)]
    min: Option<u32>,
    /// The most nodes it may have (1-999).
    #[arg(long)]
    max: Option<u32>,
    /// Shell command that starts nodes (the host list is appended as its argument).
    #[arg(long, value_name = "COMMAND")]
    resume_command: Option<String>,
    /// Shell command that stops idle nodes ("" for none: idle nodes are kept).
    #[arg(long, value_name = "COMMAND")]
    suspend_command: Option<String>,
    /// How long a node stays idle before it is stopped: 10m [default: 10m].
    #[arg(long, value_name = "D", value_parser = super::policy_change::parse_secs)]
    idle_time: Option<u64>,
    /// How long a node asked for may take to join: 10m [default: 10m].
    #[arg(long, value_name = "D", value_parser = super::policy_change::parse_secs)]
    resume_timeout: Option<u64>,
    /// How long fitting jobs wait before nodes are asked for: 30s [default: 30s].
    #[arg(long, value_name = "D", value_parser = super::policy_change::parse_secs)]
    demand_time: Option<u64>,
    /// The MIG layout of its nodes' GPUs (as `gpuq node mig set --layout`
    /// takes it, e.g. 1g.10gb:7, or none for whole GPUs; "" for no layout):
    /// a node that joins with other GPUs is repartitioned before it takes work.
    #[arg(long, value_name = "LAYOUT")]
    mig_layout: Option<String>,
}

fn parse_mem(s: &str) -> Result<u64, String> {
    crate::spec::memory::parse_mem(s).map_err(|e| e.to_string())
}

fn change(op: Op, a: NodeGroupArgs) -> PolicyChange {
    PolicyChange::NodeGroup {
        op,
        name: a.name,
        patch: NodeGroupPatch {
            gpus: a.gpus,
            cpus: a.cpus,
            memory_mb: a.mem,
            features: a
                .features
                .map(|f| f.into_iter().filter(|s| !s.is_empty()).collect()),
            min: a.min,
            max: a.max,
            resume_command: a.resume_command,
            suspend_command: a.suspend_command,
            idle_secs: a.idle_time,
            resume_timeout_secs: a.resume_timeout,
            demand_secs: a.demand_time,
            mig_layout: a.mig_layout,
        },
    }
}

/// Runs `gpuq admin nodegroup ...`.
pub async fn run(cmd: NodeGroupCommand) -> Result<(), CliError> {
    match cmd {
        NodeGroupCommand::Add(a) => policy_change::send(change(Op::Add, a)).await,
        NodeGroupCommand::Modify(a) => policy_change::send(change(Op::Modify, a)).await,
        NodeGroupCommand::Remove { name } => {
            policy_change::send(PolicyChange::NodeGroup {
                op: Op::Remove,
                name,
                patch: NodeGroupPatch::default(),
            })
            .await
        }
        NodeGroupCommand::List { json } => {
            let policy = policy_change::current().await?;
            if json.json {
                return print_json(&policy.node_groups);
            }
            let mut t = Table::new(&[
                "GROUP", "NODES", "SHAPE", "MIN", "MAX", "IDLE", "RESUME", "SUSPEND",
            ]);
            for g in policy.node_groups.values() {
                t.row(vec![
                    g.name.clone(),
                    format!("{}..{}", g.node_name(1), g.node_name(g.max)),
                    format!(
                        "{} GPUs, {} CPUs, {}{}",
                        g.gpus,
                        g.cpus,
                        crate::spec::memory::format_mem(g.memory_mb),
                        g.mig_layout
                            .as_ref()
                            .map(|l| format!(", MIG {l}"))
                            .unwrap_or_default()
                    ),
                    g.min.to_string(),
                    g.max.to_string(),
                    format!("{}s", g.idle_secs),
                    g.resume_command.clone(),
                    g.suspend_command.clone().unwrap_or_else(|| "-".into()),
                ]);
            }
            print!("{}", t.render());
            Ok(())
        }
    }
}
