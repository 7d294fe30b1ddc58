//! The queue listings: `gpuq queue`'s table and its `--start` view of
//! expected start times, both with array tasks shown compactly
//! (`12_[4-99%8]`, as squeue does).

use crate::model::{Job, JobId, JobState};
use crate::net::proto::{ApiRequest, ApiResponse};

use super::table::{fmt_duration, fmt_time, Table};
use super::{call, unexpected, CliError};

/// Every job the query selects (`all`: finished ones too; `user`; `states`),
/// fetched a page at a time: a frame holds 16 MiB, a queue of 100,000 jobs
/// with their scripts is more.
pub(crate) async fn fetch_jobs(
    all: bool,
    user: Option<String>,
    states: Vec<JobState>,
) -> Result<Vec<Job>, CliError> {
    let mut jobs = Vec::new();
    let mut after = Some(JobId(0));
    while let Some(from) = after {
        match call(ApiRequest::Queue {
            all,
            user: user.clone(),
            states: states.clone(),
            after: Some(from),
        })
        .await?
        {
            ApiResponse::Jobs { jobs: page, next } => {
                // A server from before pages answers everything, no `next`.
                jobs.extend(page);
                after = next.filter(|n| *n > from);
            }
            other => return Err(unexpected(other)),
        }
    }
    Ok(jobs)
}

/// One line of the queue: a job, or pending tasks of one array folded
/// together (same reason) with the id shown as `12_[4-7,9%2]`.
pub struct QueueRow<'j> {
    pub id: String,
    /// The first job of the line: every other column comes from it.
    pub job: &'j Job,
}

/// Folds runs of pending tasks of one array with the same reason and
/// expected start into one row. Other jobs get a row each.
pub fn rows(jobs: &[Job]) -> Vec<QueueRow<'_>> {
    let mut out: Vec<QueueRow> = Vec::new();
    let mut i = 0;
    while i < jobs.len() {
        let j = &jobs[i];
        let Some(a) = j.array.filter(|_| j.state == JobState::Pending) else {
            out.push(QueueRow {
                id: j.display_id(),
                job: j,
            });
            i += 1;
            continue;
        };
        let mut k = i + 1;
        while k < jobs.len() {
            let n = &jobs[k];
            let same = n.state == JobState::Pending
                && n.array.is_some_and(|b| b.array_job == a.array_job)
                && n.reason == j.reason
                && n.expected_start == j.expected_start;
            if !same {
                break;
            }
            k += 1;
        }
        let indices: Vec<u32> = jobs[i..k]
            .iter()
            .filter_map(|t| t.array.map(|a| a.index))
            .collect();
        let id = if indices.len() == 1 {
            j.display_id()
        } else {
            let throttle = a.throttle.map(|t| format!("%{t}")).unwrap_or_default();
            format!("{}_[{}{throttle}]", a.array_job, ranges(&indices))
        };
        out.push(QueueRow { id, job: j });
        i = k;
    }
    out
}

/// `1,3,5-7` for ascending indices.
pub fn ranges(indices: &[u32]) -> String {
    let mut parts = Vec::new();
    let mut i = 0;
    while i < indices.len() {
        let mut k = i;
        while k + 1 < indices.len() && indices[k + 1] == indices[k] + 1 {
            k += 1;
        }
        parts.push(if k == i {
            indices[i].to_string()
        } else {
            format!("{}-{}", indices[i], indices[k])
        });
        i = k + 1;
    }
    parts.join(",")
}

/// `gpuq queue`: one line per job, pending array tasks folded.
pub fn queue_table(jobs: &[Job]) -> String {
    let mut t = Table::new(&[
        "JOBID",
        "NAME",
        "USER",
        "STATE",
        "NODES",
        "GPUS",
        "TIME_LIMIT",
        "SUBMIT",
        "REASON",
    ]);
    for r in rows(jobs) {
        let j = r.job;
        t.row(vec![
            r.id,
            j.spec.name.clone(),
            j.user.clone(),
            j.state.to_string(),
            j.spec.nodes.to_string(),
            j.spec.total_gpus().to_string(),
            j.spec
                .time_limit_secs
                .map(fmt_duration)
                .unwrap_or_else(|| "UNLIMITED".into()),
            fmt_time(j.submit_time),
            match j.gpu_use.filter(|u| u.idle) {
                Some(u) => format!("GPUs idle for {}", fmt_duration(u.idle_secs)),
                None => j.reason.clone().unwrap_or_default(),
            },
        ]);
    }
    t.render()
}

/// `gpuq queue --start`: pending jobs with their expected start (squeue --start).
pub fn start_table(jobs: &[Job]) -> String {
    let mut t = Table::new(&[
        "JOBID",
        "NAME",
        "USER",
        "STATE",
        "START_TIME",
        "NODES",
        "GPUS",
        "REASON",
    ]);
    let pending: Vec<Job> = jobs
        .iter()
        .filter(|j| j.state == JobState::Pending)
        .cloned()
        .collect();
    for r in rows(&pending) {
        let j = r.job;
        t.row(vec![
            r.id,
            j.spec.name.clone(),
            j.user.clone(),
            j.state.to_string(),
            j.expected_start
                .map(fmt_time)
                .unwrap_or_else(|| "N/A".into()),
            j.spec.nodes.to_string(),
            j.spec.total_gpus().to_string(),
            j.reason.clone().unwrap_or_default(),
        ]);
    }
    t.render()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn index_ranges_compress() {
        assert_eq!(ranges(&[1, 3, 5, 6, 7]), "1,3,5-7");
        assert_eq!(ranges(&[4, 5, 6]), "4-6");
        assert_eq!(ranges(&[]), "");
    }
}
