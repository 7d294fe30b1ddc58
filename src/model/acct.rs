//! Accounting records: what `gpuq acct` reports about a finished job, the
//! filters it takes (Slurm `sacct` semantics for the time window) and the
//! per-account and per-user summary. Pure data and arithmetic over `Job`.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::{ArrayTask, GpuUse, Job, JobId, JobState, Launch, Millis, TaskEnd};

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
    /// `sacct -j`: only these jobs, an array's id naming all its tasks.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ids: Vec<JobId>,
    /// `sacct --name`: only jobs with one of these names.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub names: Vec<String>,
    /// Jobs not ended yet too (`sacct` lists them; `gpuq acct` does not):
    /// they count as ending after any `since`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub active: bool,
    /// A page: only jobs with a greater id (the last of the page before).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub after: Option<JobId>,
    /// A page: at most this many records, the lowest ids first; a full
    /// page means there may be more.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<u32>,
}

/// Records per page the clients ask for: well under a frame's 16 MiB.
pub const ACCT_PAGE: u32 = 5_000;

impl AcctFilter {
    /// Whether `job` (finished) is selected.
    pub fn matches(&self, job: &Job) -> bool {
        let end = match job.end_time {
            Some(end) if job.state.is_final() => end,
            _ if self.active => Millis::MAX,
            _ => return false,
        };
        self.user.as_ref().is_none_or(|u| *u == job.user)
            && self.after.is_none_or(|a| job.id > a)
            && (self.ids.is_empty()
                || self.ids.contains(&job.id)
                || job.array.is_some_and(|a| self.ids.contains(&a.array_job)))
            && (self.names.is_empty() || self.names.contains(&job.spec.name))
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
    /// Mean GPU and memory utilisation of the last attempt, as its agents
    /// sampled it; absent for jobs that held no GPU, ran on older agents or
    /// ended before a sample.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_use: Option<GpuUse>,
    /// What sacct shows beyond `gpuq acct`'s columns; absent from older
    /// servers' records.
    #[serde(default, flatten)]
    pub detail: AcctDetail,
}

/// A job's settings, its way of ending and its steps, as sacct shows them.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct AcctDetail {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub partition: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub qos: Option<String>,
    /// Nodes asked for.
    #[serde(default)]
    pub req_nodes: u32,
    /// Tasks in all (nodes × tasks per node).
    #[serde(default)]
    pub ntasks: u32,
    /// CPUs asked for (tasks × CPUs per task); allocated once it runs.
    #[serde(default)]
    pub cpus: u32,
    /// GPUs asked for.
    #[serde(default)]
    pub req_gpus: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mem_per_node_mb: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time_limit_secs: Option<u64>,
    #[serde(default)]
    pub workdir: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub array: Option<ArrayTask>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cancelled_by: Option<String>,
    /// The signal that ended the first failing rank, if one did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signal: Option<i32>,
    /// Why it is pending, or why it ended as it did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Held: it waits for a release.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub held: bool,
    /// On its way back to the queue (Slurm's REQUEUED).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub requeueing: bool,
    /// The batch step (sbatch) and the job steps (srun) of the last attempt.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub steps: Vec<AcctStep>,
}

/// Which step a row is: the batch script, or step N.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StepName {
    Batch,
    Step(u32),
}

/// One step of a job's last attempt, as sacct lists it (`12.batch`, `12.0`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct AcctStep {
    pub id: StepName,
    pub name: String,
    /// RUNNING until it ends, then how its tasks ended.
    pub state: JobState,
    pub exit_code: i32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signal: Option<i32>,
    pub start_time: Millis,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub end_time: Option<Millis>,
    pub nodes: Vec<String>,
    pub ntasks: u32,
    pub cpus: u32,
}

/// A task end as sacct's state, exit code and signal: a task stopped on
/// request or at its limit was sent SIGTERM.
fn end_parts(end: &TaskEnd) -> (JobState, i32, Option<i32>) {
    const SIGTERM: i32 = 15;
    match end {
        TaskEnd::Completed => (JobState::Completed, 0, None),
        TaskEnd::Failed { exit_code, signal } => {
            (JobState::Failed, exit_code.unwrap_or(0), *signal)
        }
        TaskEnd::Cancelled => (JobState::Cancelled, 0, Some(SIGTERM)),
        TaskEnd::Timeout => (JobState::Timeout, 0, Some(SIGTERM)),
        other => (other.job_state(), other.exit_code().min(255), None),
    }
}

impl AcctDetail {
    fn from_job(job: &Job) -> AcctDetail {
        let spec = &job.spec;
        let mut steps = Vec::new();
        let mut signal = None;
        if let Some(run) = &job.run {
            signal = run.ended.values().find_map(|e| match e {
                TaskEnd::Failed { signal, .. } => *signal,
                _ => None,
            });
            if spec.launch == Launch::Batch && job.start_time.is_some() {
                let (state, exit_code, signal) = match run.ended.get(&0) {
                    Some(end) => end_parts(end),
                    None => (JobState::Running, 0, None),
                };
                steps.push(AcctStep {
                    id: StepName::Batch,
                    name: "batch".into(),
                    state,
                    exit_code,
                    signal,
                    start_time: job.start_time.unwrap_or(job.submit_time),
                    end_time: run.ended.get(&0).and(job.end_time),
                    nodes: run.node_names().into_iter().take(1).collect(),
                    ntasks: 1,
                    cpus: spec.cpus_per_task * spec.ntasks_per_node.max(1),
                });
            }
            let names = run.node_names();
            for step in &run.steps {
                let (state, exit_code, signal) = match step.end_time {
                    None => (JobState::Running, 0, None),
                    Some(_) if step.cancelled && step.outcome() == TaskEnd::Completed => {
                        (JobState::Cancelled, 0, None)
                    }
                    Some(_) => end_parts(&step.outcome()),
                };
                steps.push(AcctStep {
                    id: StepName::Step(step.id),
                    name: step.spec.name.clone(),
                    state,
                    exit_code,
                    signal,
                    start_time: step.start_time,
                    end_time: step.end_time,
                    nodes: step
                        .spec
                        .nodes
                        .iter()
                        .filter_map(|&n| names.get(n as usize).cloned())
                        .collect(),
                    ntasks: step.spec.ntasks(),
                    cpus: step.spec.ntasks() * step.spec.cpus_per_task,
                });
            }
        }
        let ntasks = spec.total_tasks().min(u64::from(u32::MAX)) as u32;
        AcctDetail {
            partition: spec.partition.clone(),
            qos: spec.qos.clone(),
            req_nodes: spec.nodes,
            ntasks,
            cpus: ntasks.saturating_mul(spec.cpus_per_task),
            req_gpus: spec.total_gpus().min(u64::from(u32::MAX)) as u32,
            mem_per_node_mb: spec.mem_per_node_mb,
            time_limit_secs: spec.time_limit_secs,
            workdir: spec.workdir.clone(),
            array: job.array,
            cancelled_by: job.cancelled_by.clone(),
            signal,
            reason: job.reason_code.clone().or_else(|| job.reason.clone()),
            held: job.held,
            requeueing: job.is_requeueing(),
            steps,
        }
    }
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
                run.allocation.gpus() as u32,
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
            gpu_hours: gpu_hours(job, gpus, elapsed_ms),
            restart_count: job.restart_count,
            gpu_use: job.run.as_ref().and_then(|r| r.gpu_use()),
            detail: AcctDetail::from_job(job),
        }
    }
}

/// `gpus` × elapsed in hours; a MIG slice counts as its share of a GPU
/// (compute slices / 7), a slot of a time-shared GPU as 1 / its slots.
fn gpu_hours(job: &Job, gpus: u32, elapsed_ms: u64) -> f64 {
    if let Some(milli) = job.run.as_ref().and_then(|r| r.charged_milli_gpus) {
        return milli as f64 / 1000.0 * elapsed_ms as f64 / 3_600_000.0;
    }
    let gpu_ms = match (job.start_time, job.resizes.is_empty()) {
        // An elastic job's sizes, each over its own span.
        (Some(start), false) => {
            super::elastic::gpu_ms(start, start + elapsed_ms, u64::from(gpus), &job.resizes) as f64
        }
        _ => f64::from(gpus) * elapsed_ms as f64,
    };
    let hours = gpu_ms / 3_600_000.0;
    match job.spec.placement.gpu_slice.as_deref() {
        None => hours,
        slice => {
            let (part, whole) = super::mig::share(slice);
            hours * part as f64 / whole as f64
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
