//! Reads over finished jobs: `gpuq show` for a job that may be archived, and
//! `gpuq acct`. Each looks in the active set first, then the jobs being
//! archived, then the history tables; jobs only ever move in that direction,
//! so a job is always found (and `acct` dedupes a job seen twice by id).
//! Reads are served from this server's own state: no leader needed.

use std::collections::BTreeMap;

use crate::model::acct::{summarize, AcctFilter, AcctRecord};
use crate::model::{Job, JobId, JobState};
use crate::net::proto::{take_page, ApiResponse, Caller, ErrorKind};
use crate::state::history;

use super::Api;

impl Api {
    /// One job, active or archived.
    pub(super) async fn show(&self, caller: &Caller, id: JobId) -> ApiResponse {
        let (found, policy) = {
            let s = self.state();
            let found = s.job(id).or_else(|| s.archiving_job(id)).cloned();
            (found, s.policy.clone())
        };
        let found = match found {
            Some(job) => Some(self.with_reason(job, &policy)),
            None => {
                let db = self.db();
                let read = tokio::task::spawn_blocking(move || -> Result<Option<Job>, String> {
                    let txn = db.begin_read().map_err(|e| e.to_string())?;
                    history::get(&txn, id).map_err(|e| e.to_string())
                })
                .await;
                match read {
                    Ok(Ok(job)) => job.map(|j| self.with_reason(j, &policy)),
                    Ok(Err(e)) => return ApiResponse::error(ErrorKind::Internal, e),
                    Err(e) => return ApiResponse::error(ErrorKind::Internal, e.to_string()),
                }
            }
        };
        match found.filter(|job| self.may_see(caller, job)) {
            Some(job) => {
                let job = self.as_seen_by(caller, job);
                let placement = super::show::placement(&self.state(), &job);
                ApiResponse::Job {
                    job: Box::new(job),
                    placement,
                }
            }
            None => ApiResponse::error(
                ErrorKind::NotFound,
                format!("job {id} does not exist (see `gpuq queue --all` and `gpuq acct`)"),
            ),
        }
    }

    /// Finished jobs `filter` selects, or their totals per account and user.
    pub(super) async fn acct(&self, filter: AcctFilter, summary: bool) -> ApiResponse {
        if let (Some(s), Some(u)) = (filter.since, filter.until) {
            if s > u {
                return ApiResponse::error(
                    ErrorKind::BadInput,
                    "--since is after --until; give the earlier time to --since",
                );
            }
        }
        let mut jobs = match self.acct_records(&filter).await {
            Ok(jobs) => jobs,
            Err(resp) => return resp,
        };
        // A page: the lowest ids of both sources together, as many as the
        // filter's limit and a page's bytes allow.
        let mut more = false;
        if let Some(limit) = filter.limit.filter(|_| !summary) {
            if let Some(&cut) = jobs.keys().nth(limit as usize) {
                more = !jobs.split_off(&cut).is_empty();
            }
        }
        if summary {
            ApiResponse::AcctSummary {
                rows: summarize(jobs.values()),
            }
        } else {
            let last = jobs.keys().next_back().copied();
            let (records, next) = take_page(jobs.into_values(), |r| r.id);
            ApiResponse::Acct {
                records,
                next: next.or(last.filter(|_| more)),
            }
        }
    }

    /// The record of every job `filter` selects, by id: the active set and
    /// the jobs being archived, then the history tables (where `limit`
    /// caps the rows read). `gpuq acct`'s rows, and the runs the
    /// utilisation chart adds up (`api/utilisation.rs`).
    pub(super) async fn acct_records(
        &self,
        filter: &AcctFilter,
    ) -> Result<BTreeMap<JobId, AcctRecord>, ApiResponse> {
        let (active, policy) = {
            let s = self.state();
            let active = s
                .jobs
                .values()
                .chain(s.archiving.iter())
                .filter(|j| filter.matches(j))
                .map(|j| (j.id, j.clone()))
                .collect::<Vec<_>>();
            (active, s.policy.clone())
        };
        let mut jobs: BTreeMap<JobId, AcctRecord> = active
            .into_iter()
            .map(|(id, job)| {
                // A pending job's reason is the leader's last pass's, as in `queue`.
                let job = match job.state {
                    JobState::Pending => self.with_reason(job, &policy),
                    _ => job,
                };
                (id, AcctRecord::from_job(&job))
            })
            .collect();
        let db = self.db();
        let f = filter.clone();
        let read = tokio::task::spawn_blocking(move || -> Result<Vec<AcctRecord>, String> {
            let txn = db.begin_read().map_err(|e| e.to_string())?;
            let jobs = history::query(&txn, &f).map_err(|e| e.to_string())?;
            Ok(jobs.iter().map(AcctRecord::from_job).collect())
        })
        .await;
        match read {
            Ok(Ok(records)) => jobs.extend(records.into_iter().map(|r| (r.id, r))),
            Ok(Err(e)) => return Err(ApiResponse::error(ErrorKind::Internal, e)),
            Err(e) => return Err(ApiResponse::error(ErrorKind::Internal, e.to_string())),
        }
        Ok(jobs)
    }
}
