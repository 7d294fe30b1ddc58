//! Job steps through the API: `srun` starting one in a running job's
//! allocation, stopping one, releasing an allocation, and its client's
//! renewals (`Keepalive`). Apply checks the
//! owner, the job's state and the step's shape; this turns the caller and
//! the request into the command.

use std::collections::BTreeMap;

use crate::clock::now_ms;
use crate::model::{JobRef, JobState, Launch, TaskKey};
use crate::net::agent_proto::ServerMsg;
use crate::net::proto::{ApiRequest, ApiResponse, Caller, ErrorKind, SignalScope};
use crate::state::{Command, CommandResult};

use super::Api;

impl Api {
    pub(super) async fn step_request(&self, caller: Caller, req: ApiRequest) -> ApiResponse {
        let now = now_ms();
        let cmd = match req {
            ApiRequest::StepStart { job, spec } => Command::StepStart {
                by: caller.user,
                admin: caller.admin,
                job,
                spec,
                now,
            },
            ApiRequest::StepCancel { job, step } => Command::StepCancel {
                by: caller.user,
                admin: caller.admin,
                job,
                step,
                now,
            },
            ApiRequest::Release { job } => Command::Release {
                by: caller.user,
                admin: caller.admin,
                job,
                now,
            },
            ApiRequest::Keepalive { job } => Command::Keepalive {
                by: caller.user,
                admin: caller.admin,
                job,
                now,
            },
            other => {
                return ApiResponse::error(
                    ErrorKind::Internal,
                    format!("not a step request: {other:?}"),
                )
            }
        };
        match self.write(cmd).await {
            Ok(CommandResult::StepStarted { step }) => ApiResponse::StepStarted { step },
            Ok(CommandResult::StepCancelled) => ApiResponse::StepCancelled,
            Ok(CommandResult::Released) => ApiResponse::Released,
            Ok(CommandResult::KeptAlive) => ApiResponse::KeptAlive {
                limit_secs: self.inactive_limit_secs(),
            },
            Ok(other) => self.unexpected(other),
            Err(resp) => resp,
        }
    }

    /// The servers' `inactive_limit_secs`: how long an interactive
    /// allocation is held without a renewal.
    pub fn inactive_limit_secs(&self) -> u64 {
        self.cfg.inactive_limit_secs
    }

    /// Sends `signal` to the tasks `scope` names of the running jobs
    /// `refs` names (or to step `only_step`'s), through their nodes' agent
    /// sessions.
    pub(super) fn signal(
        &self,
        caller: &Caller,
        refs: Vec<JobRef>,
        signal: i32,
        scope: SignalScope,
        only_step: Option<u32>,
    ) -> ApiResponse {
        if !(1..=64).contains(&signal) {
            return ApiResponse::error(
                ErrorKind::BadInput,
                format!("signal {signal} does not exist; give a name (USR1) or 1-64"),
            );
        }
        let ids = match self.resolve(refs, |j| j.state.is_active()) {
            Ok(ids) => ids,
            Err(why) => return ApiResponse::error(ErrorKind::NotFound, why),
        };
        let mut by_node: BTreeMap<String, Vec<TaskKey>> = BTreeMap::new();
        {
            let s = self.state();
            for &id in &ids {
                let Some(job) = s.job(id) else { continue };
                if !caller.admin && job.user != caller.user {
                    return ApiResponse::error(
                        ErrorKind::Forbidden,
                        format!(
                            "job {id} belongs to {}; only its owner or an admin may signal it",
                            job.user
                        ),
                    );
                }
                let Some(run) = job.run.as_ref().filter(|_| job.state == JobState::Running) else {
                    return ApiResponse::error(
                        ErrorKind::BadInput,
                        format!(
                            "job {id} is {}: only a running job's tasks can be signalled",
                            job.state
                        ),
                    );
                };
                let own = match (scope, job.spec.launch) {
                    (SignalScope::Full | SignalScope::Batch, _) => true,
                    (SignalScope::Steps, Launch::Ranks) => true,
                    (SignalScope::Steps, _) => false,
                };
                let per_node = job.spec.ntasks_per_node.max(1);
                if own && only_step.is_none() {
                    for rank in 0..job.spec.launched_tasks() as u32 {
                        if run.ended.contains_key(&rank) {
                            continue;
                        }
                        let key = TaskKey::of_job(id, run.attempt, rank);
                        if let Some(node) = run.node_of_task(&key, per_node) {
                            by_node.entry(node.to_string()).or_default().push(key);
                        }
                    }
                }
                if scope == SignalScope::Batch {
                    continue;
                }
                let live = run.steps.iter().filter(|s| !s.is_over());
                for step in live.filter(|s| only_step.is_none_or(|o| o == s.id)) {
                    for rank in 0..step.spec.ntasks() {
                        if step.ended.contains_key(&rank) {
                            continue;
                        }
                        let key = TaskKey {
                            job: id,
                            attempt: run.attempt,
                            rank,
                            step: Some(step.id),
                        };
                        if let Some(node) = run.node_of_task(&key, per_node) {
                            by_node.entry(node.to_string()).or_default().push(key);
                        }
                    }
                }
            }
        }
        for (node, tasks) in by_node {
            if !self.hub.send(&node, ServerMsg::Signal { tasks, signal }) {
                tracing::warn!(%node, signal, "signal not sent: the node's agent is not connected");
            }
        }
        ApiResponse::Signalled { ids }
    }
}
