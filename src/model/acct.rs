//! Accounting records: what `gpuq acct` reports about a finished job, the
//! filters it takes (Slurm `sacct` semantics for the time window) and the
//! per-account and per-user summary. Pure data and arithmetic over `Job`.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::{Job, JobId, JobState, Millis};

/// The account a job is charged to when it names none: the policy's
/// built-in account (apply fills in the resolved account at submit, so only
/// jobs from before the policy existed name none).
pub use super::policy::DEFAULT_ACCOUNT;

/// The account `job` is charged to.
pub fn account_of(job: &Job) -> &str {
    job.spec.account.as_deref().unwrap_or(DEFAULT_ACCOUNT)
}

/// Which finished jobs `gpuq acct` lists. Empty fields match everything.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AcctFilter {
    #[serde(default)]
    pub user: Option<String>,
    #[serde(default)]
    pub account: Option<String>,
    #[serde(default)]
    pub states: Vec<JobState>,
    /// `-S`: jobs that were eligible or running at or after this time, i.e.
    /// that ended at or after it.
    #[serde(default)]
    pub since: Option<Millis>,
    /// `-E`: jobs that were submitted at or before this time.
    #[serde(default)]
    pub until: Option<Millis>,
}

impl AcctFilter {
    /// Whether `job` (finished) is selected.
    pub fn matches(&self, job: &Job) -> bool {
        let Some(end) = job.end_time else {
            return false;
        };
        self.user.as_ref().is_none_or(|u| *u == job.user)
            && self.account.as_ref().is_none_or(|a| a == account_of(job))
            && (self.states.is_empty() || self.states.contains(&job.state))
            && self.since.is_none_or(|s| end >= s)
            && self.until.is_none_or(|u| job.submit_time <= u)
    }
}

/// One finished job as `gpuq acct` prints it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct AcctRecord {
    pub id: JobId,
    pub name: String,
    pub user: String,
    pub account: String,
    pub state: JobState,
    pub exit_code: Option<i32>,
    /// The nodes of the last attempt, in node-rank order.
    pub nodes: Vec<String>,
    /// GPUs the last attempt held.
    pub gpus: u32,
    pub submit_time: Millis,
    pub start_time: Option<Millis>,
    pub end_time: Option<Millis>,
    /// Seconds from start to end (0 for a job that never started).
    pub elapsed_secs: u64,
    /// `gpus` × elapsed, in hours.
    pub gpu_hours: f64,
    pub restart_count: u32,
}

impl AcctRecord {
    pub fn from_job(job: &Job) -> AcctRecord {
        let (nodes, gpus) = match &job.run {
            Some(run) => (
                run.allocation
                    .nodes
                    .iter()
                    .map(|n| n.node.clone())
                    .collect(),
                run.allocation
                    .nodes
                    .iter()
                    .map(|n| n.gpus.len() as u32)
                    .sum(),
            ),
            None => (Vec::new(), 0),
        };
        let elapsed_ms = match (job.start_time, job.end_time) {
            (Some(s), Some(e)) => e.saturating_sub(s),
            _ => 0,
        };
        AcctRecord {
            id: job.id,
            name: job.spec.name.clone(),
            user: job.user.clone(),
            account: account_of(job).to_string(),
            state: job.state,
            exit_code: job.exit_code,
            nodes,
            gpus,
            submit_time: job.submit_time,
            start_time: job.start_time,
            end_time: job.end_time,
            elapsed_secs: elapsed_ms / 1000,
            gpu_hours: f64::from(gpus) * elapsed_ms as f64 / 3_600_000.0,
            restart_count: job.restart_count,
        }
    }
}

/// Totals of one account or one user of an account, for `gpuq acct --summary`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct AcctSummary {
    pub account: String,
    /// `None`: the account's total over all its users.
    pub user: Option<String>,
    pub jobs: u64,
    pub gpu_hours: f64,
    /// Jobs per final state, by state name.
    pub by_state: BTreeMap<String, u64>,
}

/// Sums `records` per account (a total row, `user: None`) and per user within
/// each account, ordered by account then user.
pub fn summarize<'a>(records: impl IntoIterator<Item = &'a AcctRecord>) -> Vec<AcctSummary> {
    let mut rows: BTreeMap<(String, Option<String>), AcctSummary> = BTreeMap::new();
    for r in records {
        for user in [None, Some(r.user.clone())] {
            let row = rows
                .entry((r.account.clone(), user.clone()))
                .or_insert_with(|| AcctSummary {
                    account: r.account.clone(),
                    user,
                    ..AcctSummary::default()
                });
            row.jobs += 1;
            row.gpu_hours += r.gpu_hours;
            *row.by_state
                .entry(r.state.as_str().to_string())
                .or_insert(0) += 1;
        }
    }
    rows.into_values().collect()
}
