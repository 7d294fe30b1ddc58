//! The policy part of the API: admin changes (through the log), the policy
//! in force, fair-share (`gpuq share`) and priority factors (`gpuq queue
//! --priority`, `gpuq show`), computed from this server's applied state by
//! the same pure functions the scheduler uses.

use crate::clock::now_ms;
use crate::model::Policy;
use crate::net::proto::{ApiRequest, ApiResponse, Caller, ErrorKind};
use crate::state::{Command, CommandResult};

use super::Api;

/// The policy with the built-ins filled in, as `gpuq admin ... list` shows it.
fn effective(p: &Policy) -> Policy {
    Policy {
        accounts: p.all_accounts(),
        qos: p.all_qos(),
        partitions: p.all_partitions(),
        ..p.clone()
    }
}

impl Api {
    pub(super) async fn policy_request(&self, caller: &Caller, req: ApiRequest) -> ApiResponse {
        match req {
            ApiRequest::Admin { change } => {
                if !caller.admin {
                    return ApiResponse::error(
                        ErrorKind::Forbidden,
                        "changing accounts, QoS, partitions, priority weights or the MASTER_PORT \
                         range needs an admin \
                         (root, or a member of admin_group)",
                    );
                }
                let cmd = Command::Policy {
                    change,
                    by: caller.user.clone(),
                    now: now_ms(),
                };
                match self.write(cmd).await {
                    Ok(CommandResult::PolicyUpdated { what }) => {
                        ApiResponse::PolicyUpdated { what }
                    }
                    Ok(other) => self.unexpected(other),
                    Err(resp) => resp,
                }
            }
            ApiRequest::PolicyShow => {
                let s = self.state();
                ApiResponse::Policy {
                    policy: Box::new(effective(&s.policy)),
                    master_ports: s.master_ports(),
                }
            }
            ApiRequest::Share => {
                let s = self.state();
                let fs = crate::sched::fairshare::compute(&s.policy_view(), now_ms());
                ApiResponse::Share {
                    rows: fs.rows,
                    half_life_secs: s.policy.half_life_secs,
                }
            }
            ApiRequest::Priorities { ids } => {
                let s = self.state();
                let mut view = s.cluster_view();
                if !ids.is_empty() {
                    if let Some(id) = ids.iter().find(|id| s.job(**id).is_none()) {
                        return ApiResponse::error(
                            ErrorKind::NotFound,
                            format!("job {id} does not exist (see `gpuq queue --all`)"),
                        );
                    }
                    view.pending.retain(|j| ids.contains(&j.id));
                }
                let prios = crate::sched::priority::priorities(&view, now_ms());
                let mut jobs: Vec<_> = prios.into_iter().collect();
                jobs.sort_by_key(|(id, f)| (std::cmp::Reverse(f.total), *id));
                ApiResponse::Priorities {
                    weights: s.policy.weights.clone(),
                    jobs,
                }
            }
            _ => ApiResponse::error(ErrorKind::Internal, "not a policy request"),
        }
    }
}
