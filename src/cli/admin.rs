//! `gpuq admin account|qos|partition|priority|ports ...` (admins: root or
//! admin_group): the arguments of each policy change and the `show` listings
//! of the policy. The reports anyone may read (`gpuq share`, priority
//! factors) are in [`super::report`].

use clap::{Args, Subcommand};

use super::policy_change;
use super::table::Table;
use super::{print_json, CliError, JsonFlag};
use crate::model::policy::fmt_secs;
use crate::model::policy_change::{
    AccountPatch, Limit, Op, PartitionPatch, PolicyChange, PriorityPatch, QosPatch,
};
use crate::model::{PartitionState, PreemptMode};

// `gpuq admin ...`
#[derive(Subcommand, Debug)]
#[command(defer = true)]
pub enum AdminCommand {
    /// Fair-share accounts: users, shares, parent, GPU cap and guarantee.
    Account {
        #[command(subcommand)]
        cmd: AccountCommand,
    },
    /// Qualities of service: priority, preemption, grace, GPU caps.
    Qos {
        #[command(subcommand)]
        cmd: QosCommand,
    },
    /// Partitions: node sets with time limits, a priority and a state.
    Partition {
        #[command(subcommand)]
        cmd: PartitionCommand,
    },
    /// Multifactor priority weights and the fair-share half-life.
    Priority {
        #[command(subcommand)]
        cmd: PriorityCommand,
    },
    /// The cluster's MASTER_PORT range (`master_port_range`).
    Ports {
        #[command(subcommand)]
        cmd: super::ports::PortsCommand,
    },
    /// Advance reservations: whole nodes set aside over a window (maintenance, a big run).
    Reservation {
        #[command(subcommand)]
        cmd: super::reservation::ReservationCommand,
    },
    /// Node groups: capacity started and stopped on demand (scale-out and power saving).
    Nodegroup {
        #[command(subcommand)]
        cmd: super::nodegroup::NodeGroupCommand,
    },
}

// `gpuq admin account ...`
#[derive(Subcommand, Debug)]
#[command(defer = true)]
pub enum AccountCommand {
    /// Add an account.
    Add(AccountArgs),
    /// Change an account (only the options given).
    Modify(AccountArgs),
    /// Remove an account with no child accounts and no unfinished jobs.
    Remove { name: String },
    /// List accounts (the built-in `default` included).
    List {
        #[command(flatten)]
        json: JsonFlag,
    },
}

// The settings of an account.
#[derive(Args, Debug)]
pub struct AccountArgs {
    /// The account's name.
    name: String,
    /// Parent account in the share tree ("" or "none": top level).
    #[arg(long)]
    parent: Option<String>,
    /// Shares among its siblings [default on add: 1].
    #[arg(long)]
    shares: Option<u32>,
    /// Users who may charge it (comma list).
    #[arg(long = "add-user", alias = "users", value_delimiter = ',')]
    add_user: Vec<String>,
    /// Users to take out of it (comma list).
    #[arg(long = "remove-user", value_delimiter = ',')]
    remove_user: Vec<String>,
    /// Hard cap: GPUs its running jobs may hold at once, or "none".
    #[arg(long, value_parser = parse_limit)]
    max_gpus: Option<Limit>,
    /// GPUs it can always reclaim by preempting borrowers.
    #[arg(long)]
    guaranteed_gpus: Option<u32>,
    /// Make it the default account of these users (comma list).
    #[arg(long, value_delimiter = ',')]
    default_for: Vec<String>,
}

// `gpuq admin qos ...`
#[derive(Subcommand, Debug)]
#[command(defer = true)]
pub enum QosCommand {
    /// Add a QoS.
    Add(QosArgs),
    /// Change a QoS (only the options given).
    Modify(QosArgs),
    /// Remove a QoS no unfinished job uses.
    Remove { name: String },
    /// List QoS (the built-in `normal` included).
    List {
        #[command(flatten)]
        json: JsonFlag,
    },
}

// The settings of a QoS.
#[derive(Args, Debug)]
pub struct QosArgs {
    /// The QoS's name.
    name: String,
    /// Raw priority (the QoS factor is it over the largest).
    #[arg(long)]
    priority: Option<u32>,
    /// QoS whose running jobs this one may preempt (comma list; "" for none).
    #[arg(long, value_delimiter = ',')]
    preempts: Option<Vec<String>>,
    /// What happens to a job of this QoS when preempted: requeue or cancel.
    #[arg(long, value_parser = parse_mode)]
    preempt_mode: Option<PreemptMode>,
    /// Time between SIGTERM and SIGKILL when its jobs are stopped (30s, 2m),
    /// or "none" for the agent's default.
    #[arg(long, value_parser = parse_duration_limit)]
    grace: Option<Limit>,
    /// GPUs one user's running jobs of this QoS may hold, or "none".
    #[arg(long, value_parser = parse_limit)]
    max_gpus_per_user: Option<Limit>,
    /// GPUs one job of this QoS may ask for, or "none".
    #[arg(long, value_parser = parse_limit)]
    max_gpus_per_job: Option<Limit>,
    /// Only jobs of these accounts may use it (comma list; "" with no
    /// --allow-users opens it to everyone again).
    #[arg(long, value_delimiter = ',')]
    allow_accounts: Option<Vec<String>>,
    /// These users may use it whatever their account (comma list).
    #[arg(long, value_delimiter = ',')]
    allow_users: Option<Vec<String>>,
    /// Flag its running jobs whose GPUs were all idle this long (30m, 2h;
    /// 0: never), or "none" for the servers' idle_gpu_secs.
    #[arg(long, value_parser = parse_duration_limit)]
    idle_gpu_time: Option<Limit>,
    /// Cancel its jobs once flagged idle (true or false; off by default).
    #[arg(long, value_parser = clap::builder::BoolishValueParser::new())]
    cancel_idle: Option<bool>,
}

// `gpuq admin partition ...`
#[derive(Subcommand, Debug)]
#[command(defer = true)]
pub enum PartitionCommand {
    /// Add a partition.
    Add(PartitionArgs),
    /// Change a partition (only the options given).
    Modify(PartitionArgs),
    /// Remove a partition no unfinished job uses.
    Remove { name: String },
    /// List partitions (the built-in `default` included).
    List {
        #[command(flatten)]
        json: JsonFlag,
    },
}

// The settings of a partition.
#[derive(Args, Debug)]
pub struct PartitionArgs {
    /// The partition's name.
    name: String,
    /// Its nodes, a host list (gpu[001-064],dgx7), or "all".
    #[arg(long)]
    nodes: Option<String>,
    /// Time limit of jobs that give none (1:00:00, 2-00:00:00), or "none".
    #[arg(long, value_parser = parse_time_limit)]
    default_time: Option<Limit>,
    /// Longest time limit a job may ask for, or "none".
    #[arg(long, value_parser = parse_time_limit)]
    max_time: Option<Limit>,
    /// Raw priority (the partition factor is it over the largest).
    #[arg(long)]
    priority: Option<u32>,
    /// Make it the partition of jobs that name none (true or false).
    #[arg(long, num_args = 0..=1, default_missing_value = "true")]
    default: Option<bool>,
    /// up, or down (queued jobs wait; running ones go on).
    #[arg(long, value_parser = parse_part_state)]
    state: Option<PartitionState>,
}

// `gpuq admin priority ...`
#[derive(Subcommand, Debug)]
#[command(defer = true)]
pub enum PriorityCommand {
    /// Set weights (each factor is 0..1 times its weight) and the half-life.
    Set {
        #[arg(long)]
        age: Option<u32>,
        #[arg(long)]
        fairshare: Option<u32>,
        #[arg(long)]
        job_size: Option<u32>,
        #[arg(long)]
        qos: Option<u32>,
        #[arg(long)]
        partition: Option<u32>,
        /// Age at which the age factor reaches 1 (e.g. 7d).
        #[arg(long, value_parser = policy_change::parse_secs)]
        max_age: Option<u64>,
        /// Half-life of fair-share usage (e.g. 7d).
        #[arg(long, value_parser = policy_change::parse_secs)]
        half_life: Option<u64>,
    },
    /// Print the weights and the half-life.
    Show {
        #[command(flatten)]
        json: JsonFlag,
    },
}

fn parse_limit(s: &str) -> Result<Limit, String> {
    if s.eq_ignore_ascii_case("none") || s.eq_ignore_ascii_case("unlimited") {
        return Ok(Limit::Unlimited);
    }
    s.parse::<u64>()
        .map(Limit::Max)
        .map_err(|_| format!("{s:?} is not a number; give N or none"))
}

fn parse_duration_limit(s: &str) -> Result<Limit, String> {
    if s.eq_ignore_ascii_case("none") {
        return Ok(Limit::Unlimited);
    }
    if let Ok(n) = s.parse::<u64>() {
        return Ok(Limit::Max(n));
    }
    policy_change::parse_secs(s).map(Limit::Max)
}

fn parse_time_limit(s: &str) -> Result<Limit, String> {
    if s.eq_ignore_ascii_case("none") {
        return Ok(Limit::Unlimited);
    }
    match crate::spec::time::parse_time(s) {
        Ok(Some(t)) => Ok(Limit::Max(t)),
        Ok(None) => Ok(Limit::Unlimited),
        Err(e) => Err(e.to_string()),
    }
}

fn parse_mode(s: &str) -> Result<PreemptMode, String> {
    PreemptMode::parse(s).ok_or_else(|| format!("unknown mode {s:?}; use requeue or cancel"))
}

fn parse_part_state(s: &str) -> Result<PartitionState, String> {
    match s.to_ascii_lowercase().as_str() {
        "up" => Ok(PartitionState::Up),
        "down" => Ok(PartitionState::Down),
        _ => Err(format!("unknown state {s:?}; use up or down")),
    }
}

fn account_change(op: Op, a: AccountArgs) -> PolicyChange {
    PolicyChange::Account {
        op,
        name: a.name,
        patch: AccountPatch {
            parent: a.parent.map(|p| {
                if p.eq_ignore_ascii_case("none") {
                    String::new()
                } else {
                    p
                }
            }),
            shares: a.shares,
            add_users: a.add_user,
            remove_users: a.remove_user,
            max_gpus: a.max_gpus,
            guaranteed_gpus: a.guaranteed_gpus,
            default_for: a.default_for,
        },
    }
}

fn qos_change(op: Op, q: QosArgs) -> PolicyChange {
    PolicyChange::Qos {
        op,
        name: q.name,
        patch: QosPatch {
            priority: q.priority,
            preempts: q.preempts.map(non_empty),
            preempt_mode: q.preempt_mode,
            grace_secs: q.grace,
            max_gpus_per_user: q.max_gpus_per_user,
            max_gpus_per_job: q.max_gpus_per_job,
            allowed_accounts: q.allow_accounts.map(non_empty),
            allowed_users: q.allow_users.map(non_empty),
            idle_gpu_secs: q.idle_gpu_time,
            cancel_idle: q.cancel_idle,
        },
    }
}

/// A QoS's idle-GPU rule as `admin qos list` shows it.
fn idle(q: &crate::model::Qos) -> String {
    let time = match q.idle_gpu_secs {
        None => "server".to_string(),
        Some(0) => "never".to_string(),
        Some(s) => format!("{s}s"),
    };
    if q.cancel_idle {
        format!("{time},cancel")
    } else {
        time
    }
}

/// A comma list as typed, less the empty items (`""` is the empty list).
fn non_empty(v: Vec<String>) -> Vec<String> {
    v.into_iter().filter(|s| !s.is_empty()).collect()
}

fn partition_change(op: Op, p: PartitionArgs) -> PolicyChange {
    PolicyChange::Partition {
        op,
        name: p.name,
        patch: PartitionPatch {
            nodes: p.nodes.map(|n| if n == "all" { String::new() } else { n }),
            default_time_secs: p.default_time,
            max_time_secs: p.max_time,
            priority: p.priority,
            default: p.default,
            state: p.state,
        },
    }
}

fn opt<T: ToString>(v: Option<T>) -> String {
    v.map(|v| v.to_string()).unwrap_or_else(|| "-".into())
}

/// Who may use a QoS: `all`, or `accounts:a,b users:u`.
fn allowed(q: &crate::model::Qos) -> String {
    let list = |s: &std::collections::BTreeSet<String>| s.iter().cloned().collect::<Vec<_>>();
    match (q.allowed_accounts.is_empty(), q.allowed_users.is_empty()) {
        (true, true) => "all".into(),
        (false, true) => format!("accounts:{}", list(&q.allowed_accounts).join(",")),
        (true, false) => format!("users:{}", list(&q.allowed_users).join(",")),
        (false, false) => format!(
            "accounts:{} users:{}",
            list(&q.allowed_accounts).join(","),
            list(&q.allowed_users).join(",")
        ),
    }
}

/// Runs `gpuq admin ...`.
pub async fn run(cmd: AdminCommand) -> Result<(), CliError> {
    match cmd {
        AdminCommand::Ports { cmd } => super::ports::run(cmd).await,
        AdminCommand::Reservation { cmd } => super::reservation::run(cmd).await,
        AdminCommand::Nodegroup { cmd } => super::nodegroup::run(cmd).await,
        AdminCommand::Account { cmd } => match cmd {
            AccountCommand::Add(a) => policy_change::send(account_change(Op::Add, a)).await,
            AccountCommand::Modify(a) => policy_change::send(account_change(Op::Modify, a)).await,
            AccountCommand::Remove { name } => {
                policy_change::send(account_change(
                    Op::Remove,
                    AccountArgs {
                        name,
                        parent: None,
                        shares: None,
                        add_user: vec![],
                        remove_user: vec![],
                        max_gpus: None,
                        guaranteed_gpus: None,
                        default_for: vec![],
                    },
                ))
                .await
            }
            AccountCommand::List { json } => {
                let p = policy_change::current().await?;
                if json.json {
                    return print_json(&p.accounts);
                }
                let mut t = Table::new(&[
                    "ACCOUNT",
                    "PARENT",
                    "SHARES",
                    "MAX_GPUS",
                    "GUARANTEED",
                    "USERS",
                ]);
                for a in p.accounts.values() {
                    let users = if a.name == crate::model::policy::DEFAULT_ACCOUNT {
                        "(everyone)".to_string()
                    } else {
                        a.users.iter().cloned().collect::<Vec<_>>().join(",")
                    };
                    t.row(vec![
                        a.name.clone(),
                        opt(a.parent.clone()),
                        a.shares.to_string(),
                        opt(a.max_gpus),
                        a.guaranteed_gpus.to_string(),
                        users,
                    ]);
                }
                print!("{}", t.render());
                Ok(())
            }
        },
        AdminCommand::Qos { cmd } => match cmd {
            QosCommand::Add(q) => policy_change::send(qos_change(Op::Add, q)).await,
            QosCommand::Modify(q) => policy_change::send(qos_change(Op::Modify, q)).await,
            QosCommand::Remove { name } => {
                policy_change::send(PolicyChange::Qos {
                    op: Op::Remove,
                    name,
                    patch: QosPatch::default(),
                })
                .await
            }
            QosCommand::List { json } => {
                let p = policy_change::current().await?;
                if json.json {
                    return print_json(&p.qos);
                }
                let mut t = Table::new(&[
                    "QOS",
                    "PRIORITY",
                    "PREEMPTS",
                    "MODE",
                    "GRACE",
                    "MAX_GPUS_USER",
                    "MAX_GPUS_JOB",
                    "ALLOWED",
                    "IDLE_GPU",
                ]);
                for q in p.qos.values() {
                    t.row(vec![
                        q.name.clone(),
                        q.priority.to_string(),
                        if q.preempts.is_empty() {
                            "-".into()
                        } else {
                            q.preempts.iter().cloned().collect::<Vec<_>>().join(",")
                        },
                        q.preempt_mode.as_str().into(),
                        q.grace_secs
                            .map(|s| format!("{s}s"))
                            .unwrap_or_else(|| "agent".into()),
                        opt(q.max_gpus_per_user),
                        opt(q.max_gpus_per_job),
                        allowed(q),
                        idle(q),
                    ]);
                }
                print!("{}", t.render());
                Ok(())
            }
        },
        AdminCommand::Partition { cmd } => match cmd {
            PartitionCommand::Add(p) => policy_change::send(partition_change(Op::Add, p)).await,
            PartitionCommand::Modify(p) => {
                policy_change::send(partition_change(Op::Modify, p)).await
            }
            PartitionCommand::Remove { name } => {
                policy_change::send(PolicyChange::Partition {
                    op: Op::Remove,
                    name,
                    patch: PartitionPatch::default(),
                })
                .await
            }
            PartitionCommand::List { json } => {
                let p = policy_change::current().await?;
                if json.json {
                    return print_json(&p.partitions);
                }
                let mut t = Table::new(&[
                    "PARTITION",
                    "STATE",
                    "DEFAULT",
                    "NODES",
                    "DEFAULT_TIME",
                    "MAX_TIME",
                    "PRIORITY",
                ]);
                for part in p.partitions.values() {
                    t.row(vec![
                        part.name.clone(),
                        part.state.to_string(),
                        if part.default { "yes" } else { "" }.into(),
                        part.nodes.clone().unwrap_or_else(|| "(all)".into()),
                        opt(part.default_time_secs.map(fmt_secs)),
                        opt(part.max_time_secs.map(fmt_secs)),
                        part.priority.to_string(),
                    ]);
                }
                print!("{}", t.render());
                Ok(())
            }
        },
        AdminCommand::Priority { cmd } => match cmd {
            PriorityCommand::Set {
                age,
                fairshare,
                job_size,
                qos,
                partition,
                max_age,
                half_life,
            } => {
                policy_change::send(PolicyChange::Priority(PriorityPatch {
                    age,
                    fairshare,
                    job_size,
                    qos,
                    partition,
                    max_age_secs: max_age,
                    half_life_secs: half_life,
                }))
                .await
            }
            PriorityCommand::Show { json } => {
                let p = policy_change::current().await?;
                if json.json {
                    return print_json(&serde_json::json!({
                        "weights": p.weights,
                        "half_life_secs": p.half_life_secs,
                    }));
                }
                let w = &p.weights;
                println!(
                    "weights: age {} fairshare {} job_size {} qos {} partition {}",
                    w.age, w.fairshare, w.job_size, w.qos, w.partition
                );
                println!(
                    "max age {}, fair-share half-life {}",
                    fmt_secs(w.max_age_secs),
                    fmt_secs(p.half_life_secs)
                );
                Ok(())
            }
        },
    }
}
