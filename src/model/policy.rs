//! Scheduling policy as data: accounts (fair-share tree, quotas), QoS
//! (priority, preemption, per-user and per-job caps), partitions (node sets,
//! time limits) and the multifactor priority weights. It lives in the
//! replicated state, so every server agrees on it and no config file has to
//! be kept in sync. A fresh cluster configures none and still works: the
//! built-in `default` account (open to every user), `normal` QoS and
//! `default` partition (every node) stand in for what is not configured.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use serde::{Deserialize, Serialize};

use super::JobSpec;

/// The account every user may charge, and the one jobs get by default.
pub const DEFAULT_ACCOUNT: &str = "default";
/// The QoS jobs get by default.
pub const DEFAULT_QOS: &str = "normal";
/// The partition over every node, used when none is marked default.
pub const DEFAULT_PARTITION: &str = "default";

/// A fair-share account: a node of the share tree, with users and quotas.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Account {
    pub name: String,
    /// `None`: a top-level account (a child of the root).
    #[serde(default)]
    pub parent: Option<String>,
    /// Shares among its siblings (Slurm's `Fairshare=`), at least 1.
    pub shares: u32,
    /// Users who may charge it. The built-in `default` admits everyone.
    #[serde(default)]
    pub users: BTreeSet<String>,
    /// Hard cap: GPUs its running jobs may hold at once.
    #[serde(default)]
    pub max_gpus: Option<u32>,
    /// GPUs it may always get back by preempting borrowers (Kueue's nominal
    /// quota); beyond this it only borrows idle capacity.
    #[serde(default)]
    pub guaranteed_gpus: u32,
}

impl Account {
    pub fn new(name: &str) -> Account {
        Account {
            name: name.to_string(),
            parent: None,
            shares: 1,
            users: BTreeSet::new(),
            max_gpus: None,
            guaranteed_gpus: 0,
        }
    }

    /// Whether `user` may charge this account.
    pub fn admits(&self, user: &str) -> bool {
        self.name == DEFAULT_ACCOUNT || self.users.contains(user)
    }
}

/// What happens to a job another preempts.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PreemptMode {
    /// Back to the queue with the same id and `restart_count + 1`.
    #[default]
    Requeue,
    /// Ended (PREEMPTED).
    Cancel,
}

impl PreemptMode {
    pub fn as_str(self) -> &'static str {
        match self {
            PreemptMode::Requeue => "requeue",
            PreemptMode::Cancel => "cancel",
        }
    }

    pub fn parse(s: &str) -> Option<PreemptMode> {
        match s.to_ascii_lowercase().as_str() {
            "requeue" => Some(PreemptMode::Requeue),
            "cancel" => Some(PreemptMode::Cancel),
            _ => None,
        }
    }
}

/// A quality of service: priority, who it may preempt, caps.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Qos {
    pub name: String,
    /// Raw priority; the QoS factor is this over the largest of any QoS.
    pub priority: u32,
    /// QoS names whose running jobs jobs of this QoS may preempt.
    #[serde(default)]
    pub preempts: BTreeSet<String>,
    /// What happens to a job of this QoS when it is preempted.
    #[serde(default)]
    pub preempt_mode: PreemptMode,
    /// Seconds between SIGTERM and SIGKILL when a job of this QoS is
    /// stopped; `None`: the agent's `kill_grace_secs`.
    #[serde(default)]
    pub grace_secs: Option<u64>,
    /// GPUs one user's running jobs of this QoS may hold at once.
    #[serde(default)]
    pub max_gpus_per_user: Option<u32>,
    /// GPUs one job of this QoS may ask for.
    #[serde(default)]
    pub max_gpus_per_job: Option<u32>,
    /// Accounts whose jobs may use this QoS. With `allowed_users`, both
    /// empty: everyone may.
    #[serde(default, skip_serializing_if = "BTreeSet::is_empty")]
    pub allowed_accounts: BTreeSet<String>,
    /// Users who may use this QoS whatever their account.
    #[serde(default, skip_serializing_if = "BTreeSet::is_empty")]
    pub allowed_users: BTreeSet<String>,
    /// A running job of this QoS whose GPUs were all idle this long is
    /// flagged; `None`: the servers' `idle_gpu_secs`; 0: never.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idle_gpu_secs: Option<u64>,
    /// Cancel a job once it is flagged idle (off: only flagged).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub cancel_idle: bool,
}

impl Qos {
    /// Whether `user` submitting under `account` may use this QoS.
    pub fn admits(&self, user: &str, account: &str) -> bool {
        (self.allowed_accounts.is_empty() && self.allowed_users.is_empty())
            || self.allowed_accounts.contains(account)
            || self.allowed_users.contains(user)
    }

    pub fn new(name: &str) -> Qos {
        Qos {
            name: name.to_string(),
            priority: 0,
            preempts: BTreeSet::new(),
            preempt_mode: PreemptMode::Requeue,
            grace_secs: None,
            max_gpus_per_user: None,
            max_gpus_per_job: None,
            allowed_accounts: BTreeSet::new(),
            allowed_users: BTreeSet::new(),
            idle_gpu_secs: None,
            cancel_idle: false,
        }
    }

    /// How long a job's GPUs may sit idle before it is flagged, given the
    /// servers' `idle_gpu_secs`; `None`: never.
    pub fn idle_limit_secs(&self, server_default: u64) -> Option<u64> {
        Some(self.idle_gpu_secs.unwrap_or(server_default)).filter(|&s| s > 0)
    }
}

/// Whether a partition takes new work.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PartitionState {
    #[default]
    Up,
    /// Queued jobs wait (`PartitionDown`); running ones go on.
    Down,
}

impl fmt::Display for PartitionState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            PartitionState::Up => "up",
            PartitionState::Down => "down",
        })
    }
}

/// A set of nodes with time limits and a priority.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Partition {
    pub name: String,
    /// A host list (`gpu[001-064],dgx7`); `None`: every node.
    #[serde(default)]
    pub nodes: Option<String>,
    /// The time limit of a job that gives none.
    #[serde(default)]
    pub default_time_secs: Option<u64>,
    /// The longest time limit a job may ask for.
    #[serde(default)]
    pub max_time_secs: Option<u64>,
    /// Raw priority; the partition factor is this over the largest.
    #[serde(default)]
    pub priority: u32,
    /// Jobs that name no partition go here.
    #[serde(default)]
    pub default: bool,
    #[serde(default)]
    pub state: PartitionState,
}

impl Partition {
    pub fn new(name: &str) -> Partition {
        Partition {
            name: name.to_string(),
            nodes: None,
            default_time_secs: None,
            max_time_secs: None,
            priority: 0,
            default: false,
            state: PartitionState::Up,
        }
    }

    /// The node names of the partition, or `None` for every node. A list
    /// that does not parse was refused when it was set.
    pub fn node_set(&self) -> Option<BTreeSet<String>> {
        let list = self.nodes.as_deref()?;
        Some(
            super::expand_hostlist(list)
                .unwrap_or_default()
                .into_iter()
                .collect(),
        )
    }
}

/// The weights of the multifactor priority (Slurm's `PriorityWeight*`):
/// each factor is in 0..1 and counts times its weight.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PriorityWeights {
    pub age: u32,
    pub fairshare: u32,
    pub job_size: u32,
    pub qos: u32,
    pub partition: u32,
    /// The age at which the age factor reaches 1 (Slurm's `PriorityMaxAge`).
    pub max_age_secs: u64,
}

impl Default for PriorityWeights {
    /// Fair-share dominates, then QoS; age breaks ties among equals over a
    /// week; size a little, favouring large jobs (which wait longest).
    fn default() -> Self {
        PriorityWeights {
            age: 1000,
            fairshare: 10_000,
            job_size: 1000,
            qos: 5000,
            partition: 1000,
            max_age_secs: 7 * 24 * 3600,
        }
    }
}

impl PriorityWeights {
    /// All weights zero: strict FIFO (the order of submit times).
    pub fn fifo() -> PriorityWeights {
        PriorityWeights {
            age: 0,
            fairshare: 0,
            job_size: 0,
            qos: 0,
            partition: 0,
            max_age_secs: 7 * 24 * 3600,
        }
    }
}

/// The default fair-share usage half-life: 7 days.
pub const DEFAULT_HALF_LIFE_SECS: u64 = 7 * 24 * 3600;

fn default_half_life() -> u64 {
    DEFAULT_HALF_LIFE_SECS
}

/// The whole policy as the replicated state holds it. The maps hold what an
/// admin configured; the built-ins fill in where they are silent.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Policy {
    #[serde(default)]
    pub accounts: BTreeMap<String, Account>,
    #[serde(default)]
    pub qos: BTreeMap<String, Qos>,
    #[serde(default)]
    pub partitions: BTreeMap<String, Partition>,
    /// A user's default account, where set; else the first account (by
    /// name) that lists the user; else `default`.
    #[serde(default)]
    pub default_accounts: BTreeMap<String, String>,
    #[serde(default)]
    pub weights: PriorityWeights,
    /// Half-life of fair-share usage.
    #[serde(default = "default_half_life")]
    pub half_life_secs: u64,
    /// Advance reservations by name (`gpuq admin reservation`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub reservations: BTreeMap<String, super::AdvanceReservation>,
    /// Node groups started and stopped on demand (`gpuq admin nodegroup`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub node_groups: BTreeMap<String, super::NodeGroup>,
}

impl Default for Policy {
    fn default() -> Self {
        Policy {
            accounts: BTreeMap::new(),
            qos: BTreeMap::new(),
            partitions: BTreeMap::new(),
            default_accounts: BTreeMap::new(),
            weights: PriorityWeights::default(),
            half_life_secs: DEFAULT_HALF_LIFE_SECS,
            reservations: BTreeMap::new(),
            node_groups: BTreeMap::new(),
        }
    }
}

impl Policy {
    /// A policy whose weights are all zero: the FIFO order scheduler tests
    /// and views built by hand start from.
    pub fn fifo() -> Policy {
        Policy {
            weights: PriorityWeights::fifo(),
            ..Policy::default()
        }
    }

    /// The account by name, with the built-in `default`.
    pub fn account(&self, name: &str) -> Option<Account> {
        match self.accounts.get(name) {
            Some(a) => Some(a.clone()),
            None if name == DEFAULT_ACCOUNT => Some(Account::new(DEFAULT_ACCOUNT)),
            None => None,
        }
    }

    /// Every account, the built-in included.
    pub fn all_accounts(&self) -> BTreeMap<String, Account> {
        let mut all = self.accounts.clone();
        all.entry(DEFAULT_ACCOUNT.into())
            .or_insert_with(|| Account::new(DEFAULT_ACCOUNT));
        all
    }

    /// The QoS by name, with the built-in `normal`.
    pub fn qos(&self, name: &str) -> Option<Qos> {
        match self.qos.get(name) {
            Some(q) => Some(q.clone()),
            None if name == DEFAULT_QOS => Some(Qos::new(DEFAULT_QOS)),
            None => None,
        }
    }

    /// Every QoS, the built-in included.
    pub fn all_qos(&self) -> BTreeMap<String, Qos> {
        let mut all = self.qos.clone();
        all.entry(DEFAULT_QOS.into())
            .or_insert_with(|| Qos::new(DEFAULT_QOS));
        all
    }

    /// The partition by name, with the built-in `default`.
    pub fn partition(&self, name: &str) -> Option<Partition> {
        match self.partitions.get(name) {
            Some(p) => Some(p.clone()),
            None if name == DEFAULT_PARTITION => Some(self.builtin_partition()),
            None => None,
        }
    }

    fn builtin_partition(&self) -> Partition {
        let mut p = Partition::new(DEFAULT_PARTITION);
        p.default = !self.partitions.values().any(|p| p.default);
        p
    }

    /// Every partition, the built-in included.
    pub fn all_partitions(&self) -> BTreeMap<String, Partition> {
        let mut all = self.partitions.clone();
        if !all.contains_key(DEFAULT_PARTITION) {
            all.insert(DEFAULT_PARTITION.into(), self.builtin_partition());
        }
        all
    }

    /// The partition a job naming none goes to.
    pub fn default_partition(&self) -> String {
        self.partitions
            .values()
            .find(|p| p.default)
            .map(|p| p.name.clone())
            .unwrap_or_else(|| DEFAULT_PARTITION.to_string())
    }

    /// The account a job of `user` naming none is charged to.
    pub fn default_account(&self, user: &str) -> String {
        if let Some(a) = self.default_accounts.get(user) {
            if self.accounts.contains_key(a) {
                return a.clone();
            }
        }
        self.accounts
            .values()
            .find(|a| a.users.contains(user))
            .map(|a| a.name.clone())
            .unwrap_or_else(|| DEFAULT_ACCOUNT.to_string())
    }

    /// Fills in the account, QoS, partition and time limit a spec leaves to
    /// the defaults, and checks it against them: membership, caps, the
    /// partition's longest time. Returns a sentence naming the input and the
    /// fix when it is refused.
    pub fn resolve(&self, user: &str, spec: &mut JobSpec) -> Result<(), String> {
        let account = spec
            .account
            .clone()
            .unwrap_or_else(|| self.default_account(user));
        let a = self.account(&account).ok_or_else(|| {
            format!(
                "account {account:?} does not exist; `gpuq share` lists the accounts \
                 (or leave out --account for your default, {})",
                self.default_account(user)
            )
        })?;
        if !a.admits(user) {
            return Err(format!(
                "user {user} is not in account {account}; ask an admin \
                 (gpuq admin account modify {account} --add-user {user}) or use your \
                 default account {}",
                self.default_account(user)
            ));
        }
        let qos_name = spec.qos.clone().unwrap_or_else(|| DEFAULT_QOS.to_string());
        let qos = self.qos(&qos_name).ok_or_else(|| {
            let names: Vec<String> = self.all_qos().into_keys().collect();
            format!(
                "QoS {qos_name:?} does not exist; use one of {}",
                names.join(", ")
            )
        })?;
        if !qos.admits(user, &account) {
            return Err(format!(
                "QoS {qos_name} is not open to user {user} in account {account}; use another \
                 --qos, or ask an admin (gpuq admin qos modify {qos_name} --allow-users {user})"
            ));
        }
        let gpus = spec.total_gpus();
        if let Some(max) = qos.max_gpus_per_job {
            if gpus > u64::from(max) {
                return Err(format!(
                    "the job asks for {gpus} GPUs; QoS {qos_name} allows at most {max} per job \
                     (ask for fewer, or use another --qos)"
                ));
            }
        }
        if let Some(max) = a.max_gpus {
            if gpus > u64::from(max) {
                return Err(format!(
                    "the job asks for {gpus} GPUs; account {account} may hold at most {max} \
                     at once, so it could never start"
                ));
            }
        }
        let part_name = spec
            .partition
            .clone()
            .unwrap_or_else(|| self.default_partition());
        let part = self.partition(&part_name).ok_or_else(|| {
            let names: Vec<String> = self.all_partitions().into_keys().collect();
            format!(
                "partition {part_name:?} does not exist; use one of {}",
                names.join(", ")
            )
        })?;
        if spec.time_limit_secs.is_none() {
            spec.time_limit_secs = part.default_time_secs.or(part.max_time_secs);
        }
        if let (Some(t), Some(max)) = (spec.time_limit_secs, part.max_time_secs) {
            if t > max {
                return Err(format!(
                    "time limit {} is over partition {part_name}'s maximum {}; ask for \
                     --time {} or less",
                    fmt_secs(t),
                    fmt_secs(max),
                    fmt_secs(max)
                ));
            }
        }
        if let Some(name) = &spec.placement.reservation {
            let r = self.reservations.get(name).ok_or_else(|| {
                format!(
                    "reservation {name:?} does not exist (see `gpuq admin reservation list`); \
                     leave out --reservation to run outside it"
                )
            })?;
            if !r.admits(user, &account) {
                return Err(format!(
                    "user {user} in account {account} may not use reservation {name}; \
                     leave out --reservation, or ask an admin \
                     (gpuq admin reservation modify {name} --users {user})"
                ));
            }
        }
        spec.account = Some(account);
        spec.qos = Some(qos_name);
        spec.partition = Some(part_name);
        Ok(())
    }
}

/// Formats Unix milliseconds as `YYYY-MM-DDTHH:MM:SS` in UTC.
pub fn fmt_time(ms: super::Millis) -> String {
    let secs = ms / 1000;
    let (days, rem) = (secs / 86_400, secs % 86_400);
    // Civil-from-days (Howard Hinnant's algorithm).
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// Seconds as Slurm's `D-HH:MM:SS` (days only when there are some).
pub fn fmt_secs(s: u64) -> String {
    let (d, h, m, s) = (s / 86400, s / 3600 % 24, s / 60 % 60, s % 60);
    if d > 0 {
        format!("{d}-{h:02}:{m:02}:{s:02}")
    } else {
        format!("{h:02}:{m:02}:{s:02}")
    }
}

/// One preemption of a job, kept in its record (`gpuq show`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PreemptionRecord {
    /// When the victim was signalled.
    pub at: super::Millis,
    /// The attempt that was preempted.
    pub attempt: u32,
    /// The job it made room for.
    pub by: super::JobId,
    pub mode: PreemptMode,
    /// Why: a QoS preemption or a quota reclaim.
    pub why: String,
}

/// Decayed GPU usage of one (account, user) as of `at`: GPU-milliseconds,
/// each halved every half-life since it was charged.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct UsageCell {
    pub gpu_ms: u64,
    pub at: super::Millis,
    /// Every GPU-millisecond ever charged, undecayed (the metrics'
    /// GPU-seconds per account); absent from states before it was kept.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub total_gpu_ms: u64,
}

fn is_zero(v: &u64) -> bool {
    *v == 0
}

/// `2^(-dt / half_life)`: what is left of usage `dt_ms` later.
pub fn decay(dt_ms: u64, half_life_secs: u64) -> f64 {
    if half_life_secs == 0 {
        return if dt_ms == 0 { 1.0 } else { 0.0 };
    }
    (-(dt_ms as f64) / (half_life_secs as f64 * 1000.0)).exp2()
}

impl UsageCell {
    /// The usage decayed to `now` (never into the past).
    pub fn at_time(&self, now: super::Millis, half_life_secs: u64) -> f64 {
        self.gpu_ms as f64 * decay(now.saturating_sub(self.at), half_life_secs)
    }

    /// Decays to `now`, then adds `gpu_ms`. Deterministic: the same inputs
    /// give the same integer on every server running this build.
    pub fn charge(&mut self, gpu_ms: u64, now: super::Millis, half_life_secs: u64) {
        let now = now.max(self.at);
        let kept = self.at_time(now, half_life_secs).round() as u64;
        self.gpu_ms = kept.saturating_add(gpu_ms);
        self.total_gpu_ms = self.total_gpu_ms.saturating_add(gpu_ms);
        self.at = now;
    }
}

/// The share tree's numbers for one account (or one user in it).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ShareRow {
    pub account: String,
    /// `None`: the account's own row.
    pub user: Option<String>,
    pub parent: Option<String>,
    pub shares: u32,
    pub norm_shares: f64,
    /// Decayed GPU-seconds (the subtree's, for an account).
    pub usage_gpu_secs: f64,
    pub norm_usage: f64,
    pub factor: f64,
}

/// A job's priority and the factors it is made of.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PriorityFactors {
    pub total: i64,
    pub age: f64,
    pub fairshare: f64,
    pub job_size: f64,
    pub qos: f64,
    pub partition: f64,
    pub nice: i32,
}
