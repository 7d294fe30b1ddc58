//! The reports anyone may read about priority and fair share: `gpuq share`
//! (the share tree with usage and factors), `gpuq queue --priority` (pending
//! jobs with their priority factors), and the priority and preemption lines
//! `gpuq show` prints for one job.

use super::table::Table;
use super::{call, print_json, unexpected, CliError};
use crate::model::{JobId, PriorityFactors};
use crate::net::proto::{ApiRequest, ApiResponse};

/// `gpuq share`: the share tree with usage and factors.
pub async fn share(json: bool) -> Result<(), CliError> {
    match call(ApiRequest::Share).await? {
        ApiResponse::Share {
            rows,
            half_life_secs,
        } => {
            if json {
                return print_json(&serde_json::json!({
                    "half_life_secs": half_life_secs,
                    "rows": rows,
                }));
            }
            let mut t = Table::new(&[
                "ACCOUNT",
                "USER",
                "SHARES",
                "NORM_SHARES",
                "GPU_HOURS",
                "NORM_USAGE",
                "FAIRSHARE",
            ]);
            for r in rows {
                t.row(vec![
                    if r.user.is_some() {
                        format!("  {}", r.account)
                    } else {
                        r.account.clone()
                    },
                    r.user.clone().unwrap_or_default(),
                    r.shares.to_string(),
                    format!("{:.4}", r.norm_shares),
                    format!("{:.2}", r.usage_gpu_secs / 3600.0),
                    format!("{:.4}", r.norm_usage),
                    format!("{:.4}", r.factor),
                ]);
            }
            print!("{}", t.render());
            Ok(())
        }
        other => Err(unexpected(other)),
    }
}

/// Priority factors of pending jobs (`ids` empty: all).
pub async fn priorities(ids: Vec<JobId>) -> Result<Vec<(JobId, PriorityFactors)>, CliError> {
    match call(ApiRequest::Priorities { ids }).await? {
        ApiResponse::Priorities { jobs, .. } => Ok(jobs),
        other => Err(unexpected(other)),
    }
}

/// The `gpuq queue --priority` table.
pub fn priority_table(jobs: &[crate::model::Job], prios: &[(JobId, PriorityFactors)]) -> String {
    let mut t = Table::new(&[
        "JOBID",
        "USER",
        "ACCOUNT",
        "QOS",
        "PRIORITY",
        "AGE",
        "FAIRSHARE",
        "JOBSIZE",
        "QOS_F",
        "PARTITION_F",
        "NICE",
    ]);
    for (id, f) in prios {
        let Some(j) = jobs.iter().find(|j| j.id == *id) else {
            continue;
        };
        t.row(vec![
            id.to_string(),
            j.user.clone(),
            j.spec.account.clone().unwrap_or_default(),
            j.spec.qos.clone().unwrap_or_default(),
            f.total.to_string(),
            format!("{:.3}", f.age),
            format!("{:.3}", f.fairshare),
            format!("{:.3}", f.job_size),
            format!("{:.3}", f.qos),
            format!("{:.3}", f.partition),
            f.nice.to_string(),
        ]);
    }
    t.render()
}

/// One line of factors for `gpuq show`.
pub fn factors_line(f: &PriorityFactors) -> String {
    format!(
        "{} (age {:.3}, fairshare {:.3}, jobsize {:.3}, qos {:.3}, partition {:.3}, nice {})",
        f.total, f.age, f.fairshare, f.job_size, f.qos, f.partition, f.nice
    )
}

/// `gpuq queue --priority`: pending jobs in priority order with their factors.
pub async fn queue_priority(user: Option<String>, json: bool) -> Result<(), CliError> {
    let jobs = super::queue::fetch_jobs(false, user, vec![crate::model::JobState::Pending]).await?;
    let mut prios = priorities(vec![]).await?;
    prios.retain(|(id, _)| jobs.iter().any(|j| j.id == *id));
    if json {
        return print_json(&prios);
    }
    print!("{}", priority_table(&jobs, &prios));
    Ok(())
}

/// `gpuq show` lines for each time the job was preempted.
pub fn preemption_lines(j: &crate::model::Job) -> String {
    j.preemptions
        .iter()
        .map(|p| {
            format!(
                "{:>16}: PREEMPTED attempt {} at {} for job {} ({}; {})\n",
                "Preempted",
                p.attempt,
                super::table::fmt_time(p.at),
                p.by,
                p.why,
                p.mode.as_str()
            )
        })
        .collect()
}

/// `gpuq show` lines for each size change of an elastic job.
pub fn resize_lines(j: &crate::model::Job) -> String {
    j.resizes
        .iter()
        .map(|r| {
            format!(
                "{:>16}: {} -> {} nodes ({} -> {} GPUs) at {}, attempt {}: {}\n",
                "Resized",
                r.from_nodes,
                r.to_nodes,
                r.from_gpus,
                r.to_gpus,
                super::table::fmt_time(r.at),
                r.attempt,
                r.why
            )
        })
        .collect()
}
