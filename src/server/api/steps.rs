//! Job steps through the API: `srun` starting one in a running job's
//! allocation, stopping one, and releasing an allocation. Apply checks the
//! owner, the job's state and the step's shape; this turns the caller and
//! the request into the command.

use crate::clock::now_ms;
use crate::net::proto::{ApiRequest, ApiResponse, Caller, ErrorKind};
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
            Ok(other) => self.unexpected(other),
            Err(resp) => resp,
        }
    }
}
