//! `gpuq logs`: a rank's output, read from the agent of the rank's node over
//! its connection to this (leading) server.

use crate::model::Job;
use crate::net::agent_proto::LogRequest;
use crate::net::proto::{ApiResponse, Caller, ErrorKind};
use crate::net::DEFAULT_MAX_FRAME;

use super::Api;

impl Api {
    /// Reads part of a rank's output from the agent of the rank's node; with
    /// `step`, part of a step task's (its stdout, or with `stderr` its
    /// stderr, when it has no output file).
    pub(super) async fn logs(
        &self,
        caller: &Caller,
        id: crate::model::JobId,
        rank: u32,
        offset: u64,
        step: Option<(u32, bool)>,
    ) -> ApiResponse {
        use crate::net::agent_proto::LogReply;
        let (req, node, state) = {
            let s = self.state();
            let Some(job) = s.job(id) else {
                return ApiResponse::error(ErrorKind::NotFound, format!("job {id} does not exist"));
            };
            if !caller.admin && job.user != caller.user {
                return ApiResponse::error(
                    ErrorKind::Forbidden,
                    format!(
                        "job {id} belongs to {}; only its owner or an admin may read its output",
                        job.user
                    ),
                );
            }
            let built = match step {
                Some((step, stderr)) => step_log_request(job, step, rank, stderr, offset),
                None => rank_log_request(job, rank, offset),
            };
            match built {
                Ok(Some((req, node))) => (req, node, job.state),
                Ok(None) => {
                    return ApiResponse::Logs {
                        data: vec![],
                        next_offset: offset,
                        state: job.state,
                        missing: true,
                    }
                }
                Err((kind, why)) => return ApiResponse::error(kind, why),
            }
        };
        let Some(conn) = self.hub.connection(&node) else {
            return ApiResponse::error(
                ErrorKind::Unavailable,
                format!("node {node}, where rank {rank} ran, is not connected: its output cannot be read now"),
            );
        };
        let ask = async {
            let (mut send, mut recv) = conn.open_bi().await.map_err(|e| e.to_string())?;
            crate::net::write_frame(&mut send, &req)
                .await
                .map_err(|e| e.to_string())?;
            let _ = send.finish();
            crate::net::read_frame::<_, LogReply>(&mut recv, DEFAULT_MAX_FRAME)
                .await
                .map_err(|e| e.to_string())?
                .ok_or_else(|| "no answer".to_string())
        };
        match tokio::time::timeout(std::time::Duration::from_secs(10), ask).await {
            Ok(Ok(LogReply::Chunk { data, .. })) => ApiResponse::Logs {
                next_offset: offset + data.len() as u64,
                data,
                state,
                missing: false,
            },
            Ok(Ok(LogReply::Missing { .. })) => ApiResponse::Logs {
                data: vec![],
                next_offset: offset,
                state,
                missing: true,
            },
            Ok(Ok(LogReply::Refused { reason })) => {
                ApiResponse::error(ErrorKind::Forbidden, reason)
            }
            Ok(Err(e)) => ApiResponse::error(
                ErrorKind::Unavailable,
                format!("reading from node {node} failed: {e}"),
            ),
            Err(_) => ApiResponse::error(
                ErrorKind::Unavailable,
                format!("node {node} did not answer within 10 s"),
            ),
        }
    }
}

/// What to ask the node of rank `rank` of `job` for; `None` before the job
/// ran.
fn rank_log_request(
    job: &Job,
    rank: u32,
    offset: u64,
) -> Result<Option<(LogRequest, String)>, (ErrorKind, String)> {
    let id = job.id;
    if u64::from(rank) >= job.spec.total_tasks() {
        return Err((
            ErrorKind::BadInput,
            format!(
                "job {id} has ranks 0-{}; --rank {rank} does not exist",
                job.spec.total_tasks() - 1
            ),
        ));
    }
    let Some(run) = &job.run else {
        return Ok(None);
    };
    let per_node = job.spec.ntasks_per_node.max(1);
    let node = run
        .node_of_rank(rank, per_node)
        .unwrap_or_default()
        .to_string();
    let req = LogRequest {
        job: id,
        job_name: job.spec.name.clone(),
        rank,
        node_rank: rank / per_node,
        user: job.user.clone(),
        workdir: job.spec.workdir.clone(),
        output: job.spec.output.clone(),
        offset,
        max_bytes: crate::net::agent_proto::MAX_LOG_CHUNK,
        attempt: run.attempt,
        step: None,
        stderr: false,
        array: job.array.map(|a| (a.array_job, a.index)),
        node: node.clone(),
    };
    Ok(Some((req, node)))
}

/// What to ask the node of task `rank` of step `step` of `job` for.
fn step_log_request(
    job: &Job,
    step: u32,
    rank: u32,
    stderr: bool,
    offset: u64,
) -> Result<Option<(LogRequest, String)>, (ErrorKind, String)> {
    let id = job.id;
    let no_step = || {
        (
            ErrorKind::NotFound,
            format!("job {id} has no step {step} in its current run"),
        )
    };
    let run = job.run.as_ref().ok_or_else(no_step)?;
    let s = run.steps.get(step as usize).ok_or_else(no_step)?;
    let Some((i, _)) = s.spec.place(rank) else {
        return Err((
            ErrorKind::BadInput,
            format!(
                "step {id}.{step} has tasks 0-{}; task {rank} does not exist",
                s.spec.ntasks().saturating_sub(1)
            ),
        ));
    };
    let key = crate::model::TaskKey {
        job: id,
        attempt: run.attempt,
        rank,
        step: Some(step),
    };
    let node = run
        .node_of_task(&key, job.spec.ntasks_per_node)
        .unwrap_or_default()
        .to_string();
    let output = if stderr {
        s.spec.error.clone().or_else(|| s.spec.output.clone())
    } else {
        s.spec.output.clone()
    };
    let req = LogRequest {
        job: id,
        job_name: job.spec.name.clone(),
        rank,
        node_rank: i as u32,
        user: job.user.clone(),
        workdir: s.spec.workdir.clone(),
        output,
        offset,
        max_bytes: crate::net::agent_proto::MAX_LOG_CHUNK,
        attempt: run.attempt,
        step: Some(step),
        stderr,
        array: job.array.map(|a| (a.array_job, a.index)),
        node: node.clone(),
    };
    Ok(Some((req, node)))
}
