//! `gpuq logs`: a rank's output, read from the agent of the rank's node over
//! its connection to this (leading) server.

use crate::net::proto::{ApiResponse, Caller, ErrorKind};
use crate::net::DEFAULT_MAX_FRAME;

use super::Api;

impl Api {
    /// Reads part of a rank's output from the agent of the rank's node.
    pub(super) async fn logs(
        &self,
        caller: &Caller,
        id: crate::model::JobId,
        rank: u32,
        offset: u64,
    ) -> ApiResponse {
        use crate::net::agent_proto::{LogReply, LogRequest};
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
            if u64::from(rank) >= job.spec.total_tasks() {
                return ApiResponse::error(
                    ErrorKind::BadInput,
                    format!(
                        "job {id} has ranks 0-{}; --rank {rank} does not exist",
                        job.spec.total_tasks() - 1
                    ),
                );
            }
            let Some(run) = &job.run else {
                return ApiResponse::Logs {
                    data: vec![],
                    next_offset: offset,
                    state: job.state,
                    missing: true,
                };
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
            };
            (req, node, job.state)
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
