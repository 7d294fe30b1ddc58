//! The server's Prometheus page, written afresh from its applied state and
//! Raft metrics at each scrape, plus the few figures only a running process
//! knows ([`Observed`]: pass and wait histograms, starts, leader changes).
//!
//! Every server answers from its own copy, so a follower's page shows the
//! same queue and nodes as the leader's a moment later; what only the
//! leader knows (agents' heartbeats, followers' lag, starts it scheduled)
//! appears on the leader's page alone, beside `gpuq_raft_is_leader`.
//! Counters that must survive a leader change come from the replicated
//! state (`gpuq_jobs_submitted_total` from the id counter, GPU-seconds from
//! fair-share's undecayed totals); those a process counts restart at 0 with
//! it, as Prometheus's `rate()` expects of a restarted target.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use tokio::sync::watch;

use crate::clock::now_ms;
use crate::http::exposition::{Exposition, Kind};
use crate::metric::{Histogram, WAIT_BUCKETS};
use crate::model::policy::{DEFAULT_ACCOUNT, DEFAULT_PARTITION};
use crate::model::JobState;

use super::Api;

/// What this server process measured since it started.
#[derive(Debug)]
pub struct Observed {
    /// Scheduling passes (the pure plan, while the state's read lock is held).
    pub pass_seconds: Histogram,
    /// From a job's submission to its start, for the starts this leader made.
    pub time_to_start_seconds: Histogram,
    /// Jobs this server started as leader.
    pub jobs_started: AtomicU64,
    /// Times this server saw the leader change (a new leader, or none).
    pub leader_changes: AtomicU64,
}

impl Default for Observed {
    fn default() -> Self {
        Observed {
            pass_seconds: Histogram::default(),
            time_to_start_seconds: Histogram::new(WAIT_BUCKETS),
            jobs_started: AtomicU64::new(0),
            leader_changes: AtomicU64::new(0),
        }
    }
}

impl Observed {
    /// Records the jobs a committed `Schedule` started.
    pub fn started(&self, api: &Api, ids: &[crate::model::JobId]) {
        self.jobs_started
            .fetch_add(ids.len() as u64, Ordering::Relaxed);
        let s = api.state();
        for id in ids {
            if let Some(j) = s.job(*id) {
                let start = j.start_time.unwrap_or_else(now_ms);
                let waited = start.saturating_sub(j.submit_time) as f64 / 1000.0;
                self.time_to_start_seconds.observe(waited);
            }
        }
    }
}

/// Counts leader changes until `shutdown`.
pub async fn watch_leader(api: Arc<Api>, mut shutdown: watch::Receiver<bool>) {
    let mut metrics = api.metrics();
    let mut last = metrics.borrow().current_leader;
    loop {
        tokio::select! {
            r = metrics.changed() => if r.is_err() { return },
            _ = shutdown.changed() => return,
        }
        let now = metrics.borrow().current_leader;
        if now != last {
            api.observed.leader_changes.fetch_add(1, Ordering::Relaxed);
            last = now;
        }
    }
}

/// The server's metrics page.
pub fn render(api: &Api) -> String {
    let mut e = Exposition::new();
    raft(api, &mut e);
    queue(api, &mut e);
    nodes(api, &mut e);
    e.finish()
}

fn raft(api: &Api, e: &mut Exposition) {
    let m = api.metrics().borrow().clone();
    let leading = api.is_leader();
    let stats = &api.raft_node().stats;
    let g = Kind::Gauge;
    e.single(
        "gpuq_raft_term",
        "The Raft term this server is in.",
        g,
        m.current_term as f64,
    );
    e.single(
        "gpuq_raft_is_leader",
        "1 when this server leads (and holds its lease), else 0.",
        g,
        f64::from(u8::from(leading)),
    );
    e.single(
        "gpuq_raft_last_log_index",
        "The last index in this server's Raft log.",
        g,
        m.last_log_index.unwrap_or(0) as f64,
    );
    e.single(
        "gpuq_raft_commit_index",
        "The highest log index this server knows is committed.",
        g,
        stats.committed_index.load(Ordering::Relaxed) as f64,
    );
    e.single(
        "gpuq_raft_applied_index",
        "The last log index applied to this server's state.",
        g,
        m.last_applied.map_or(0, |l| l.index) as f64,
    );
    e.single(
        "gpuq_raft_snapshot_index",
        "The log index of this server's latest snapshot.",
        g,
        m.snapshot.map_or(0, |l| l.index) as f64,
    );
    e.single(
        "gpuq_raft_leader_changes_total",
        "Times this server saw the leader change since it started.",
        Kind::Counter,
        api.observed.leader_changes.load(Ordering::Relaxed) as f64,
    );
    e.single(
        "gpuq_raft_log_entries_written_total",
        "Raft log entries this server wrote since it started.",
        Kind::Counter,
        stats.entries.load(Ordering::Relaxed) as f64,
    );
    e.single_histogram(
        "gpuq_raft_log_write_seconds",
        "Durable Raft log writes (one fsync each, many entries when grouped).",
        &stats.write_seconds.snapshot(),
    );
    if leading {
        let membership = m.membership_config.membership();
        let last = m.last_log_index.unwrap_or(0);
        let matched = m.replication.clone().unwrap_or_default();
        let mut lag = e.family(
            "gpuq_raft_follower_lag_entries",
            "Log entries each member is behind the leader (leader only).",
            g,
        );
        for (id, node) in membership.nodes() {
            if *id == m.id {
                continue;
            }
            let at = matched
                .get(id)
                .and_then(|l| l.as_ref().map(|l| l.index))
                .unwrap_or(0);
            lag.sample(&[("member", &node.name)], last.saturating_sub(at) as f64);
        }
    }
}

fn queue(api: &Api, e: &mut Exposition) {
    let s = api.state();
    let reasons = api.pending_reasons();
    let mut by_state: BTreeMap<(&str, &str), u64> = BTreeMap::new();
    let mut pending: BTreeMap<(&str, String), u64> = BTreeMap::new();
    let now = now_ms();
    let mut running_gpu_ms: BTreeMap<&str, u64> = BTreeMap::new();
    for j in s.jobs.values() {
        let partition = j.spec.partition.as_deref().unwrap_or(DEFAULT_PARTITION);
        *by_state.entry((j.state.as_str(), partition)).or_default() += 1;
        if j.state == JobState::Pending {
            let reason = match (&j.reason_code, reasons.get(j.id)) {
                (Some(code), _) => code.clone(),
                (None, Some((r, _))) => r.as_str().to_string(),
                (None, None) if j.held => "JobHeldUser".to_string(),
                (None, None) => "None".to_string(),
            };
            *pending.entry((partition, reason)).or_default() += 1;
        }
        if j.state.is_active() {
            if let (Some(start), Some(run)) = (j.start_time, &j.run) {
                let gpus: u64 = run.allocation.gpus();
                let account = j.spec.account.as_deref().unwrap_or(DEFAULT_ACCOUNT);
                *running_gpu_ms.entry(account).or_default() +=
                    gpus.saturating_mul(now.saturating_sub(start));
            }
        }
    }
    let mut f = e.family(
        "gpuq_jobs",
        "Jobs held in memory by state and partition (finished jobs until they are archived).",
        Kind::Gauge,
    );
    for ((state, partition), n) in &by_state {
        f.sample(&[("state", state), ("partition", partition)], *n as f64);
    }
    let mut f = e.family(
        "gpuq_jobs_pending",
        "Pending jobs by partition and the reason of the last scheduling pass.",
        Kind::Gauge,
    );
    for ((partition, reason), n) in &pending {
        f.sample(&[("partition", partition), ("reason", reason)], *n as f64);
    }
    e.single(
        "gpuq_jobs_submitted_total",
        "Job ids the cluster has assigned (replicated: the same on every server).",
        Kind::Counter,
        s.counters.next_job_id.saturating_sub(1) as f64,
    );
    e.single(
        "gpuq_jobs_started_total",
        "Job starts this server committed as leader since it started.",
        Kind::Counter,
        api.observed.jobs_started.load(Ordering::Relaxed) as f64,
    );
    e.single_histogram(
        "gpuq_job_time_to_start_seconds",
        "From submission to start, for the starts this server made as leader.",
        &api.observed.time_to_start_seconds.snapshot(),
    );
    e.single_histogram(
        "gpuq_scheduler_pass_seconds",
        "Scheduling passes on this server as leader.",
        &api.observed.pass_seconds.snapshot(),
    );
    // GPU-seconds: what ended attempts charged (undecayed) plus what the
    // running ones have held so far, which they charge when they end.
    let mut per_account: BTreeMap<&str, f64> = BTreeMap::new();
    for (account, users) in &s.usage {
        let total: u64 = users.values().map(|u| u.total_gpu_ms).sum();
        *per_account.entry(account.as_str()).or_default() += total as f64 / 1000.0;
    }
    for (account, ms) in running_gpu_ms {
        *per_account.entry(account).or_default() += ms as f64 / 1000.0;
    }
    let mut f = e.family(
        "gpuq_account_gpu_seconds_total",
        "GPU-seconds used per account: ended attempts plus running ones so far.",
        Kind::Counter,
    );
    for (account, secs) in per_account {
        f.sample(&[("account", account)], secs);
    }
}

fn nodes(api: &Api, e: &mut Exposition) {
    let s = api.state();
    let mut by_state: BTreeMap<&str, u64> = ["up", "drained", "down"]
        .into_iter()
        .map(|w| (w, 0))
        .collect();
    for n in s.nodes.values() {
        *by_state.entry(n.status.word()).or_default() += 1;
    }
    let mut f = e.family("gpuq_nodes", "Compute nodes by state.", Kind::Gauge);
    for (state, n) in &by_state {
        f.sample(&[("state", state)], *n as f64);
    }
    let mut rows = Vec::with_capacity(s.nodes.len());
    for (name, n) in &s.nodes {
        let model = n.inventory.gpu_model().unwrap_or("none").to_string();
        let total = n.inventory.gpus.len() as f64;
        let unhealthy = n.inventory.gpus.iter().filter(|g| !g.healthy).count() as f64;
        let used = s.node_view(name).map_or(0, |v| v.used.gpus.len()) as f64;
        rows.push((name.as_str(), model, total, used, unhealthy));
    }
    type Pick = fn(&(&str, String, f64, f64, f64)) -> f64;
    let families: [(&str, &str, Pick); 4] = [
        ("gpuq_node_gpus", "GPUs per node and model.", |r| r.2),
        (
            "gpuq_node_gpus_allocated",
            "GPUs jobs hold, per node.",
            |r| r.3,
        ),
        (
            "gpuq_node_gpus_unhealthy",
            "GPUs marked unhealthy (XID, ECC, off the bus), per node.",
            |r| r.4,
        ),
        (
            "gpuq_node_gpus_idle",
            "Healthy GPUs no job holds, per node.",
            |r| (r.2 - r.3 - r.4).max(0.0),
        ),
    ];
    for (name, help, pick) in families {
        let mut f = e.family(name, help, Kind::Gauge);
        for r in &rows {
            f.sample(&[("node", r.0), ("model", &r.1)], pick(r));
        }
    }
    drop(s);
    if api.is_leader() {
        let names: Vec<String> = api.state().nodes.keys().cloned().collect();
        let mut f = e.family(
            "gpuq_node_heartbeat_age_seconds",
            "Seconds since the leader last heard each node's agent (leader only; absent: never since it leads).",
            Kind::Gauge,
        );
        for name in &names {
            if let Some(at) = api.hub.last_seen(name) {
                f.sample(&[("node", name)], at.elapsed().as_secs_f64());
            }
        }
    }
}
