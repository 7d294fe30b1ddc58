//! Interactive streams through the API (`gpuq exec`, `gpuq attach`, `srun
//! --pty`): the leader checks the caller and the job, finds the task and
//! its node, opens a stream on that node's agent connection (as `logs`
//! does) with a `StdioRequest`, and answers `Attached`; the caller's
//! stream is then spliced to the agent's (see `net::stdio`). A follower
//! forwards the request to the leader and splices to that.
//!
//! Nothing here is replicated: an exec is a process beside a task, not a
//! task of the job, and an attach changes nothing. The task belongs to its
//! node's shim, so a leader that goes away takes only the stream with it.

use crate::model::{Job, JobId, JobState, Launch, TaskKey};
use crate::net::agent_proto::StdioRequest;
use crate::net::proto::{ApiRequest, ApiResponse, Caller, ErrorKind};
use crate::net::rpc::Reply;
use crate::net::stdio::{quic_stream, ExecSpec, OutputSeen};

use super::Api;

/// Why a stream is not opened: its kind and the sentence.
type Refusal = (ErrorKind, String);

impl Api {
    /// Answers one request for `caller`; one that opens an interactive
    /// stream with the stream's next hop.
    pub async fn handle_relaying(&self, caller: Caller, req: ApiRequest) -> Reply<ApiResponse> {
        if !req.opens_stream() {
            return self.handle(caller, req).await.into();
        }
        if let Some(reply) = self.forward_stream_if_follower(&caller, &req).await {
            return reply;
        }
        if let Some(resp) = self.refuse_without_lease() {
            return resp.into();
        }
        match self.open_stream(&caller, req).await {
            Ok(reply) => reply,
            Err((kind, why)) => ApiResponse::error(kind, why).into(),
        }
    }

    /// On the leader: the task's stream on its node's agent connection.
    async fn open_stream(
        &self,
        caller: &Caller,
        req: ApiRequest,
    ) -> Result<Reply<ApiResponse>, Refusal> {
        let (id, what) = match &req {
            ApiRequest::Exec { job, .. } => (*job, "exec into"),
            ApiRequest::Attach { job, .. } => (*job, "attach to"),
            _ => return Err((ErrorKind::Internal, "not a stream request".into())),
        };
        let (request, node) = {
            let s = self.state();
            let job = running_job_of(s.job(id), id, caller, what)?;
            let user = job.user.clone();
            match req {
                ApiRequest::Exec { rank, exec, .. } => {
                    let (task, node) = exec_target(job, rank)?;
                    (request(task, user, Some(exec), OutputSeen::default()), node)
                }
                ApiRequest::Attach {
                    rank, step, seen, ..
                } => {
                    let (task, node) = attach_target(job, rank, step)?;
                    (request(task, user, None, seen), node)
                }
                _ => return Err((ErrorKind::Internal, "not a stream request".into())),
            }
        };
        let Some(conn) = self.hub.connection(&node) else {
            return Err((
                ErrorKind::Unavailable,
                format!("node {node}, where the task runs, is not connected now; retry later"),
            ));
        };
        let opened = async {
            let (mut send, recv) = conn.open_bi().await.map_err(|e| e.to_string())?;
            crate::net::write_frame(&mut send, &request)
                .await
                .map_err(|e| e.to_string())?;
            Ok::<_, String>(quic_stream(send, recv))
        };
        match tokio::time::timeout(std::time::Duration::from_secs(10), opened).await {
            Ok(Ok(upstream)) => Ok(Reply::Relay(ApiResponse::Attached { node }, upstream)),
            Ok(Err(e)) => Err((
                ErrorKind::Unavailable,
                format!("cannot open a stream to node {node}: {e}"),
            )),
            Err(_) => Err((
                ErrorKind::Unavailable,
                format!("node {node} did not take the stream within 10 s"),
            )),
        }
    }
}

fn request(task: TaskKey, user: String, exec: Option<ExecSpec>, seen: OutputSeen) -> StdioRequest {
    StdioRequest {
        task,
        user,
        exec,
        seen,
    }
}

/// The job `id` if `caller` may reach into it and it is running.
fn running_job_of<'a>(
    job: Option<&'a Job>,
    id: JobId,
    caller: &Caller,
    what: &str,
) -> Result<&'a Job, Refusal> {
    let Some(job) = job else {
        return Err((ErrorKind::NotFound, format!("job {id} does not exist")));
    };
    if !caller.admin && job.user != caller.user {
        return Err((
            ErrorKind::Forbidden,
            format!(
                "job {id} belongs to {}; only its owner or an admin may {what} it",
                job.user
            ),
        ));
    }
    if job.state != JobState::Running || job.run.is_none() {
        let when = if job.state == JobState::Pending {
            "it has not started yet; wait until it runs"
        } else {
            "only a running job's tasks can be reached"
        };
        return Err((
            ErrorKind::BadInput,
            format!("job {id} is {}: {when}", job.state),
        ));
    }
    Ok(job)
}

fn no_rank(job: &Job, rank: u32) -> Refusal {
    (
        ErrorKind::BadInput,
        format!(
            "job {} has ranks 0-{}; --rank {rank} does not exist",
            job.id,
            job.spec.total_tasks().saturating_sub(1)
        ),
    )
}

/// The task an exec into rank `rank` joins, and its node: the rank's own
/// task while it runs, else a running step task of the job on that node.
fn exec_target(job: &Job, rank: u32) -> Result<(TaskKey, String), Refusal> {
    if u64::from(rank) >= job.spec.total_tasks() {
        return Err(no_rank(job, rank));
    }
    let Some(run) = job.run.as_ref() else {
        return Err(no_rank(job, rank));
    };
    let per_node = job.spec.ntasks_per_node.max(1);
    let node_rank = rank / per_node;
    let node = run
        .node_of_rank(rank, per_node)
        .unwrap_or_default()
        .to_string();
    let own = job
        .spec
        .launch
        .local_ranks(node_rank, per_node)
        .contains(&(rank % per_node));
    if own && run.started.contains(&rank) && !run.ended.contains_key(&rank) {
        return Ok((TaskKey::of_job(job.id, run.attempt, rank), node));
    }
    let live = run.steps.iter().filter(|s| !s.is_over() && !s.cancelled);
    for step in live {
        let running = step
            .spec
            .ranks_on(node_rank)
            .find(|r| step.started.contains(r) && !step.ended.contains_key(r));
        if let Some(r) = running {
            let key = TaskKey {
                job: job.id,
                attempt: run.attempt,
                rank: r,
                step: Some(step.id),
            };
            return Ok((key, node));
        }
    }
    let why = match (own, job.spec.launch) {
        (true, _) if run.ended.contains_key(&rank) => format!("rank {rank} has ended"),
        (true, _) => format!("rank {rank} has not started yet; retry in a moment"),
        (false, Launch::Allocation) => "an allocation runs only its steps, and none runs there \
                                        now"
        .to_string(),
        (false, _) => {
            "its batch script runs on its first node, and no step runs there now".to_string()
        }
    };
    Err((
        ErrorKind::BadInput,
        format!(
            "job {} runs nothing on node {node} (rank {rank}) to exec beside: {why}; start a \
             step there instead: srun --jobid {} -w {node} --pty bash",
            job.id, job.id
        ),
    ))
}

/// The task an attach to rank `rank` (of step `step`) reaches, and its
/// node. Only a task on a terminal or pipes can be attached to.
fn attach_target(job: &Job, rank: u32, step: Option<u32>) -> Result<(TaskKey, String), Refusal> {
    let id = job.id;
    let Some(run) = job.run.as_ref() else {
        return Err(no_rank(job, rank));
    };
    let Some(step_id) = step else {
        return Err((
            ErrorKind::BadInput,
            format!(
                "job {id}'s own ranks write their output to files: follow rank {rank} with \
                 gpuq logs -f {id} --rank {rank}"
            ),
        ));
    };
    let Some(s) = run.steps.get(step_id as usize) else {
        return Err((
            ErrorKind::NotFound,
            format!("job {id} has no step {step_id} in its current run"),
        ));
    };
    if s.is_over() {
        return Err((
            ErrorKind::BadInput,
            format!("step {id}.{step_id} has ended"),
        ));
    }
    if rank >= s.spec.ntasks() {
        return Err((
            ErrorKind::BadInput,
            format!(
                "step {id}.{step_id} has tasks 0-{}; task {rank} does not exist",
                s.spec.ntasks().saturating_sub(1)
            ),
        ));
    }
    if !s.spec.io.is_interactive() {
        return Err((
            ErrorKind::BadInput,
            format!("step {id}.{step_id} writes its output to files, not to a terminal"),
        ));
    }
    if s.ended.contains_key(&rank) {
        return Err((
            ErrorKind::BadInput,
            format!("task {rank} of step {id}.{step_id} has ended"),
        ));
    }
    let key = TaskKey {
        job: id,
        attempt: run.attempt,
        rank,
        step: Some(step_id),
    };
    let node = run
        .node_of_task(&key, job.spec.ntasks_per_node)
        .unwrap_or_default()
        .to_string();
    Ok((key, node))
}
