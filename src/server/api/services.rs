//! `gpuq service`: creating, scaling and deleting services (writes through
//! the log; apply keeps a job per replica, see `state::services`) and
//! listing them with their replicas and endpoints (a read of this server's
//! state).

use crate::clock::now_ms;
use crate::model::{JobId, JobSpec, JobState, Program, Service, ServiceSettings};
use crate::net::proto::{ApiResponse, Caller, ReplicaInfo, ServiceInfo};
use crate::state::{Command, CommandResult, State};

use super::Api;

impl Api {
    pub(super) async fn service_create(
        &self,
        caller: Caller,
        name: String,
        spec: Box<JobSpec>,
        settings: ServiceSettings,
    ) -> ApiResponse {
        if let Err(refused) = self.check_template(&caller, &spec) {
            return *refused;
        }
        let cmd = Command::ServiceCreate {
            user: caller.user,
            name,
            spec,
            settings,
            now: now_ms(),
        };
        self.service_write(cmd).await
    }

    pub(super) async fn service_scale(
        &self,
        caller: Caller,
        name: String,
        replicas: u32,
    ) -> ApiResponse {
        let cmd = Command::ServiceScale {
            by: caller.user,
            admin: caller.admin,
            name,
            replicas,
            now: now_ms(),
        };
        self.service_write(cmd).await
    }

    pub(super) async fn service_update(
        &self,
        caller: Caller,
        name: String,
        spec: Option<Box<JobSpec>>,
    ) -> ApiResponse {
        if let Some(Err(refused)) = spec.as_ref().map(|s| self.check_template(&caller, s)) {
            return *refused;
        }
        let cmd = Command::ServiceUpdate {
            by: caller.user,
            admin: caller.admin,
            name,
            spec,
            now: now_ms(),
        };
        self.service_write(cmd).await
    }

    pub(super) async fn service_apply(
        &self,
        caller: Caller,
        name: String,
        spec: Box<JobSpec>,
        settings: ServiceSettings,
    ) -> ApiResponse {
        if let Err(refused) = self.check_template(&caller, &spec) {
            return *refused;
        }
        let cmd = Command::ServiceApply {
            by: caller.user,
            admin: caller.admin,
            name,
            spec,
            settings,
            now: now_ms(),
        };
        match self.write(cmd).await {
            Ok(CommandResult::ServiceApplied { changes, .. }) => {
                ApiResponse::ServiceApplied { changes }
            }
            Ok(other) => self.unexpected(other),
            Err(resp) => resp,
        }
    }

    pub(super) async fn service_delete(&self, caller: Caller, name: String) -> ApiResponse {
        let cmd = Command::ServiceDelete {
            by: caller.user,
            admin: caller.admin,
            name,
            now: now_ms(),
        };
        self.service_write(cmd).await
    }

    /// The checks a submit makes (the spec, --nice, whether any node could
    /// hold one replica), once for a replica template.
    fn check_template(&self, caller: &Caller, spec: &JobSpec) -> Result<(), Box<ApiResponse>> {
        let s = self.state();
        super::submit::check(caller, spec, s.nodes.values().map(|n| &n.inventory))
            .map_err(|(kind, why)| Box::new(ApiResponse::error(kind, why)))
    }

    async fn service_write(&self, cmd: Command) -> ApiResponse {
        match self.write(cmd).await {
            Ok(CommandResult::ServiceChanged { queued, cancelled }) => {
                ApiResponse::ServiceChanged { queued, cancelled }
            }
            Ok(other) => self.unexpected(other),
            Err(resp) => resp,
        }
    }

    /// Every service, or the one named; a command only to its owner and
    /// admins, as a job's script.
    pub(super) fn services(&self, caller: &Caller, name: Option<String>) -> ApiResponse {
        let s = self.state();
        if let Some(n) = &name {
            if !s.services.contains_key(n) {
                return ApiResponse::error(
                    crate::net::proto::ErrorKind::NotFound,
                    format!("service {n} does not exist (see `gpuq service list`)"),
                );
            }
        }
        let services = s
            .services
            .values()
            .filter(|svc| name.as_ref().is_none_or(|n| &svc.name == n))
            .map(|svc| {
                let owner = caller.admin || caller.user == svc.user;
                let reasons = self.pending_reasons();
                let waits = |job| reasons.get(job).map(|(why, _)| why.to_string());
                info(&s, svc, owner, &|job| self.hub.replica_health(job), &waits)
            })
            .collect();
        ApiResponse::Services { services }
    }
}

/// `health`: a job's last health verdict, if its service checks and one
/// was made; a replica with a check is an endpoint only once healthy.
/// `waits`: why a pending job waits, as the last pass said.
fn info(
    s: &State,
    svc: &Service,
    owner: bool,
    health: &dyn Fn(JobId) -> Option<bool>,
    waits: &dyn Fn(JobId) -> Option<String>,
) -> ServiceInfo {
    let command = if !owner {
        crate::model::REDACTED.to_string()
    } else {
        match &svc.spec.program {
            Program::Command { argv } => argv.join(" "),
            Program::Script { path, .. } => format!("script {path}"),
        }
    };
    let slots = svc
        .slots
        .iter()
        .map(|(&index, slot)| {
            let job = slot.job.and_then(|id| s.job(id));
            let run = job
                .filter(|j| j.state == JobState::Running)
                .and_then(|j| j.run.as_ref());
            let node = run
                .and_then(|r| r.allocation.nodes.first())
                .map(|n| n.node.clone());
            let healthy = svc.health.as_ref().and(slot.job).and_then(health);
            let serving = svc.health.is_none() || healthy == Some(true);
            let host = run
                .filter(|_| serving)
                .zip(node.as_ref())
                .and_then(|(_, n)| {
                    let addr = &s.nodes.get(n)?.addr;
                    Some(addr.rsplit_once(':').map_or(addr.as_str(), |(h, _)| h))
                });
            let endpoint = run
                .zip(host)
                .map(|(r, host)| format!("{host}:{}", r.master_port));
            let ports = run
                .zip(host)
                .map(|(r, host)| {
                    r.named_ports
                        .iter()
                        .map(|(name, p)| (name.clone(), format!("{host}:{p}")))
                        .collect()
                })
                .unwrap_or_default();
            ReplicaInfo {
                index,
                job: slot.job,
                state: job.map(|j| j.state),
                node,
                endpoint,
                healthy,
                restarts: slot.restarts,
                reason: job.and_then(|j| match j.state {
                    JobState::Pending if j.reason.is_none() => waits(j.id),
                    _ => j.reason.clone(),
                }),
                version: slot.version,
                next: slot.next,
                ports,
            }
        })
        .collect();
    ServiceInfo {
        name: svc.name.clone(),
        user: svc.user.clone(),
        replicas: svc.replicas,
        restart_delay_secs: svc.restart_delay_secs,
        created: svc.created,
        gpus_per_replica: svc.spec.total_gpus(),
        command,
        slots,
        health: svc.health.clone(),
        version: svc.version,
        roll: roll(svc),
        ports: svc.ports.clone(),
    }
}

/// How a service's roll-out stands, when one is under way or halted.
fn roll(svc: &Service) -> Option<String> {
    if let Some(why) = &svc.roll_halted {
        return Some(format!("halted: {why}"));
    }
    let wanted = svc.slots.iter().filter(|(i, _)| **i < svc.replicas);
    let (done, all) = wanted.fold((0, 0), |(d, a), (_, x)| {
        (d + u32::from(x.version == svc.version), a + 1)
    });
    svc.rolling().then(|| {
        format!(
            "rolling to version {}: {done} of {all} replicas done",
            svc.version
        )
    })
}
