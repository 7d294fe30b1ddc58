//! An admin's node requests that change the state: drain and resume, and
//! MIG repartitioning (`gpuq node mig set`, see `state::mig`), and GPU
//! time-sharing (`gpuq node share`, see `state::share`).

use crate::clock::now_ms;
use crate::net::proto::{ApiResponse, ErrorKind};
use crate::state::{Command, CommandResult};

use super::Api;

impl Api {
    /// Drains `node` (`drain`: the reason and the admin) or resumes it.
    pub(super) async fn set_drain(
        &self,
        node: String,
        drain: Option<(String, String)>,
        requeue_now: bool,
    ) -> ApiResponse {
        let (drain, user) = drain.unzip();
        let cmd = Command::SetDrain {
            node: node.clone(),
            drain,
            by: crate::state::DrainSource::Admin,
            user,
            requeue_now,
            now: now_ms(),
        };
        self.node_command(node, cmd).await
    }

    /// Asks for `layout` on every GPU of `node` (admin `user`).
    pub(super) async fn set_mig(
        &self,
        node: String,
        layout: String,
        user: String,
        requeue_now: bool,
    ) -> ApiResponse {
        if let Err(why) = crate::model::mig::parse_target(&layout) {
            return ApiResponse::error(
                ErrorKind::BadInput,
                format!("--layout {layout}: {why}; or `none` for whole GPUs"),
            );
        }
        let cmd = Command::SetMig {
            node: node.clone(),
            layout,
            user: Some(user),
            requeue_now,
            now: now_ms(),
        };
        self.node_command(node, cmd).await
    }

    /// Shares every whole GPU of `node` into `slots` (`None`: stops).
    pub(super) async fn set_share(&self, node: String, slots: Option<u32>) -> ApiResponse {
        let slots = match slots.map(crate::model::share::check_slots).transpose() {
            Ok(s) => s,
            Err(why) => return ApiResponse::error(ErrorKind::BadInput, why),
        };
        let cmd = Command::SetShare {
            node: node.clone(),
            slots,
            now: now_ms(),
        };
        self.node_command(node, cmd).await
    }

    async fn node_command(&self, node: String, cmd: Command) -> ApiResponse {
        match self.write(cmd).await {
            Ok(CommandResult::NodeUpdated) => ApiResponse::NodeUpdated { node },
            Ok(other) => self.unexpected(other),
            Err(resp) => resp,
        }
    }
}
