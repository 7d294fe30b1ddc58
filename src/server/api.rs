//! The API every server answers: requests from its own local socket and
//! requests forwarded by other daemons over QUIC (`gpuq-api/1`) with the
//! caller they vouch for. Reads are answered from this server's applied state;
//! writes go through the Raft log on the leader, so an answer means committed.

use std::ops::Bound;
use std::sync::Arc;

use crate::clock::now_ms;
use crate::config::ServerConfig;
use crate::model::{BatchEntryError, JobRef, JobState};
use crate::net::endpoint::Endpoint;
use crate::net::pki::NodeIdentity;
use crate::net::proto::{take_page, ApiRequest, ApiResponse, Caller, ErrorKind};
use crate::raft::RaftNode;
use crate::state::{Command, CommandResult, Rejection, State};

mod forward;
mod interactive;
mod logs;
mod nodes;
mod services;
mod status;
mod steps;
mod submit;
mod tokens;
mod trust;
mod utilisation;

/// The server's request handler.
pub struct Api {
    cfg: ServerConfig,
    node: RaftNode,
    endpoint: Arc<Endpoint>,
    identity: NodeIdentity,
    /// Why each pending job waits, and when backfill expects it to start,
    /// from the leader's last scheduling pass.
    pending_reasons: std::sync::RwLock<crate::sched::PendingReasons>,
    /// Jobs waiting for nodes a node group is starting (`autoscale`).
    starting_for: std::sync::RwLock<std::collections::BTreeMap<crate::model::JobId, String>>,
    /// Connected agents (leader only).
    pub hub: Arc<super::agents::AgentHub>,
    proposer: super::propose::Proposer,
    /// The term in which this server led without a majority's acknowledgement
    /// yet, and since when (see `lease_lost_ms`).
    unacked_since: std::sync::Mutex<Option<(u64, std::time::Instant)>>,
    /// When each peer last answered this server's Raft requests.
    contacts: Arc<super::transport::PeerContacts>,
    /// What this process measured for `/metrics`.
    pub(super) observed: super::metrics::Observed,
}

/// A member further behind the leader's log than this is flagged lagging.
pub const LAGGING_ENTRIES: u64 = 1000;

fn rejection(r: Rejection) -> ApiResponse {
    match r {
        Rejection::InBatch { index, why } => ApiResponse::batch_entry_error(
            rejection_kind(&why),
            BatchEntryError {
                index,
                why: why.to_string(),
            },
        ),
        r => ApiResponse::error(rejection_kind(&r), r.to_string()),
    }
}

fn rejection_kind(r: &Rejection) -> ErrorKind {
    match r {
        Rejection::NoSuchJob(_)
        | Rejection::NoSuchToken(_)
        | Rejection::NoSuchStep { .. }
        | Rejection::NoSuchService(_) => ErrorKind::NotFound,
        Rejection::NotOwner { .. } | Rejection::NotServiceOwner { .. } => ErrorKind::Forbidden,
        _ => ErrorKind::BadInput,
    }
}

/// The longest a write waits for its commit before the caller is told the
/// outcome is unknown.
pub const WRITE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

fn write_timed_out() -> ApiResponse {
    ApiResponse::error(
        ErrorKind::Unavailable,
        format!(
            "the write was not confirmed within {} s (this server may have lost \
             contact with the other servers); it may still take effect: check \
             with `gpuq queue` before retrying",
            WRITE_TIMEOUT.as_secs()
        ),
    )
}

fn forbidden(what: &str) -> ApiResponse {
    ApiResponse::error(
        ErrorKind::Forbidden,
        format!("{what} needs an admin (root, or a member of admin_group)"),
    )
}

impl Api {
    pub fn new(
        cfg: ServerConfig,
        node: RaftNode,
        endpoint: Arc<Endpoint>,
        identity: NodeIdentity,
    ) -> Api {
        Api {
            cfg,
            endpoint,
            identity,
            pending_reasons: Default::default(),
            starting_for: Default::default(),
            hub: Default::default(),
            proposer: super::propose::Proposer::start(node.raft.clone()),
            unacked_since: Default::default(),
            contacts: Default::default(),
            observed: Default::default(),
            node,
        }
    }

    /// Uses the transport's record of peer answers for `gpuq cluster`.
    pub(super) fn with_contacts(mut self, contacts: Arc<super::transport::PeerContacts>) -> Api {
        self.contacts = contacts;
        self
    }

    /// Raft metrics: changes whenever anything is applied or leadership moves.
    pub fn metrics(
        &self,
    ) -> tokio::sync::watch::Receiver<openraft::RaftMetrics<u64, crate::raft::ServerNode>> {
        self.node.raft.metrics()
    }

    /// Whether this server is the leader now and still holds its lease (see
    /// [`Api::leader_elsewhere`]).
    pub fn is_leader(&self) -> bool {
        self.leader_elsewhere().is_none()
    }

    /// `None` when this server leads; otherwise the leader's address if known.
    ///
    /// A leader that has heard from no majority for an election timeout acts
    /// as a follower that knows no leader: openraft 0.9 keeps a partitioned
    /// leader in office until it hears a higher term, but by then the
    /// majority may have elected another. So it stops scheduling, declaring
    /// nodes down, serving agents and accepting writes as soon as its lease
    /// may have passed to someone else (a "check quorum").
    pub fn leader_elsewhere(&self) -> Option<Option<String>> {
        let m = self.node.raft.metrics().borrow().clone();
        if m.current_leader == Some(m.id) {
            return self.lease_lost_ms(&m).map(|_| None);
        }
        Some(m.current_leader.and_then(|l| {
            m.membership_config
                .membership()
                .get_node(&l)
                .map(|n| n.addr.clone())
        }))
    }

    /// For a leader: how long ago a majority last acknowledged it, when that
    /// is longer than the lease (the shortest election timeout, after which
    /// followers may elect another). A leader not yet acknowledged in its term
    /// counts from when this server first saw itself lead in that term.
    fn lease_lost_ms(
        &self,
        m: &openraft::RaftMetrics<u64, crate::raft::ServerNode>,
    ) -> Option<u64> {
        let lease_ms = self.cfg.raft.election_timeout_min_ms;
        let since_ack = match m.millis_since_quorum_ack {
            Some(ms) => ms,
            None => {
                let mut first = self.unacked_since.lock().unwrap_or_else(|p| p.into_inner());
                match *first {
                    Some((term, at)) if term == m.current_term => at.elapsed().as_millis() as u64,
                    _ => {
                        *first = Some((m.current_term, std::time::Instant::now()));
                        0
                    }
                }
            }
        };
        (since_ack > lease_ms).then_some(since_ack)
    }

    /// The addresses of every member of the control plane (voters and
    /// learners), as the membership records them: what agents and login
    /// agents keep to fail over.
    pub fn member_addrs(&self) -> Vec<String> {
        let m = self.node.raft.metrics().borrow().clone();
        let membership = m.membership_config.membership();
        membership.nodes().map(|(_, n)| n.addr.clone()).collect()
    }

    /// The last applied log index.
    pub fn applied_index(&self) -> u64 {
        self.node
            .raft
            .metrics()
            .borrow()
            .last_applied
            .map(|l| l.index)
            .unwrap_or(0)
    }

    /// Records the reasons of the last scheduling pass.
    pub fn set_pending_reasons(&self, reasons: crate::sched::PendingReasons) {
        *self
            .pending_reasons
            .write()
            .unwrap_or_else(|p| p.into_inner()) = reasons;
    }

    /// Records which jobs wait for nodes of which starting node group.
    pub(super) fn set_starting_for(
        &self,
        jobs: std::collections::BTreeMap<crate::model::JobId, String>,
    ) {
        *self.starting_for.write().unwrap_or_else(|p| p.into_inner()) = jobs;
    }

    /// The reasons of the last scheduling pass.
    pub(super) fn pending_reasons(
        &self,
    ) -> std::sync::RwLockReadGuard<'_, crate::sched::PendingReasons> {
        self.pending_reasons
            .read()
            .unwrap_or_else(|p| p.into_inner())
    }

    /// The redb file holding the history archive.
    pub(super) fn db(&self) -> Arc<redb::Database> {
        self.node.db.clone()
    }

    /// Whether `caller` may see that `job` exists: always, unless the
    /// servers' `private_jobs` hides other users' jobs from non-admins.
    pub(super) fn may_see(&self, caller: &Caller, job: &crate::model::Job) -> bool {
        !self.cfg.private_jobs || caller.admin || job.user == caller.user
    }

    /// `job` as `caller` may see it: its environment and script only for
    /// its owner and admins (they hold tokens and passwords).
    pub(super) fn as_seen_by(
        &self,
        caller: &Caller,
        mut job: crate::model::Job,
    ) -> crate::model::Job {
        if !caller.admin && job.user != caller.user {
            job.redact();
        }
        job
    }

    /// `job` as answered: its pending reason and GPU use filled in (`policy`
    /// is the state's, passed in since callers may hold the state's lock).
    pub(super) fn with_reason(
        &self,
        mut job: crate::model::Job,
        policy: &crate::model::Policy,
    ) -> crate::model::Job {
        self.fill_gpu_use(&mut job, policy);
        if job.state == JobState::Pending && job.reason.is_none() {
            let reasons = self
                .pending_reasons
                .read()
                .unwrap_or_else(|p| p.into_inner());
            let starting = self
                .starting_for
                .read()
                .unwrap_or_else(|p| p.into_inner())
                .get(&job.id)
                .map(|g| crate::sched::PendingReason::NodesStarting(g.clone()));
            if let Some((reason, start)) = reasons.get(job.id) {
                let reason = starting.as_ref().unwrap_or(reason);
                job.reason = Some(match (reason, &job.spec.placement.gpu_slice) {
                    // A slice job waits for instances of its profile, not GPUs.
                    (crate::sched::PendingReason::Resources, Some(profile)) => format!(
                        "waiting for resources: not enough free {}, CPUs or memory now",
                        crate::model::share::noun(profile)
                    ),
                    _ => reason.to_string(),
                });
                job.reason_code = Some(reason.as_str().to_string());
                job.expected_start = start;
            }
        }
        job
    }

    /// The job ids `refs` name (see `State::resolve`); `keep` picks the tasks
    /// of a whole array that the request acts on.
    fn resolve(
        &self,
        refs: impl IntoIterator<Item = JobRef>,
        keep: impl Fn(&crate::model::Job) -> bool,
    ) -> Result<Vec<crate::model::JobId>, String> {
        let state = self.state();
        let mut ids = Vec::new();
        for r in refs {
            let found = state.resolve(r, &keep)?;
            for id in found {
                if !ids.contains(&id) {
                    ids.push(id);
                }
            }
        }
        Ok(ids)
    }

    /// The cluster CA certificate this server trusts.
    pub fn ca_cert_pem(&self) -> String {
        self.identity.ca_cert_pem.clone()
    }

    /// The replicated state as applied on this server.
    pub fn state(&self) -> std::sync::RwLockReadGuard<'_, State> {
        self.node
            .state
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The Raft node this API serves.
    pub(super) fn raft_node(&self) -> &RaftNode {
        &self.node
    }

    /// Answers one request for `caller`.
    pub async fn handle(&self, caller: Caller, req: ApiRequest) -> ApiResponse {
        // Writes, and what only the leader knows (its agent connections).
        let needs_leader = matches!(
            req,
            ApiRequest::Submit { .. }
                | ApiRequest::SubmitMany { .. }
                | ApiRequest::Cancel { .. }
                | ApiRequest::Hold { .. }
                | ApiRequest::TokenCreate { .. }
                | ApiRequest::TokenRevoke { .. }
                | ApiRequest::ApiTokenCreate { .. }
                | ApiRequest::Logs { .. }
                | ApiRequest::NodeDrain { .. }
                | ApiRequest::NodeMig { .. }
                | ApiRequest::NodeShare { .. }
                | ApiRequest::NodeResume { .. }
                | ApiRequest::NodeReplace { .. }
                | ApiRequest::RemoveServer { .. }
                | ApiRequest::Admin { .. }
                | ApiRequest::StepStart { .. }
                | ApiRequest::StepCancel { .. }
                | ApiRequest::Release { .. }
                | ApiRequest::Keepalive { .. }
                | ApiRequest::StepLogs { .. }
                | ApiRequest::Signal { .. }
                | ApiRequest::Requeue { .. }
                | ApiRequest::Update { .. }
                | ApiRequest::ServiceCreate { .. }
                | ApiRequest::ServiceScale { .. }
                | ApiRequest::ServiceDelete { .. }
                | ApiRequest::ServiceUpdate { .. }
                | ApiRequest::ServiceApply { .. }
        );
        if needs_leader {
            if let Some(resp) = self.forward_if_follower(&caller, &req).await {
                return resp;
            }
            if let Some(resp) = self.refuse_without_lease() {
                return resp;
            }
        }
        match req {
            ApiRequest::Submit { spec } => self.submit(caller, spec).await,
            ApiRequest::ServiceCreate {
                name,
                spec,
                settings,
            } => self.service_create(caller, name, spec, settings).await,
            ApiRequest::ServiceScale { name, replicas } => {
                self.service_scale(caller, name, replicas).await
            }
            ApiRequest::ServiceDelete { name } => self.service_delete(caller, name).await,
            ApiRequest::ServiceUpdate { name, spec } => {
                self.service_update(caller, name, spec).await
            }
            ApiRequest::ServiceApply {
                name,
                spec,
                settings,
            } => self.service_apply(caller, name, spec, settings).await,
            ApiRequest::Services { name } => self.services(&caller, name),
            ApiRequest::SubmitMany { specs } => self.submit_many(caller, specs).await,
            ApiRequest::Cancel { ids, tasks } => {
                // `12` of an array is every unfinished task; `12_3` one task.
                let refs = ids.iter().map(|&id| JobRef { id, task: None }).chain(tasks);
                let ids = match self.resolve(refs, |j| !j.state.is_final()) {
                    Ok(ids) => ids,
                    Err(why) => return ApiResponse::error(ErrorKind::NotFound, why),
                };
                let cmd = Command::Cancel {
                    by: caller.user,
                    admin: caller.admin,
                    ids,
                    now: now_ms(),
                };
                match self.write(cmd).await {
                    Ok(CommandResult::Cancelled { ids }) => ApiResponse::Cancelled { ids },
                    Ok(other) => self.unexpected(other),
                    Err(resp) => resp,
                }
            }
            ApiRequest::Queue {
                all,
                user,
                states,
                after,
            } => {
                let s = self.state();
                let from = match after {
                    Some(a) => Bound::Excluded(a),
                    None => Bound::Unbounded,
                };
                let seen = s
                    .jobs
                    .range((from, Bound::Unbounded))
                    .map(|(_, j)| j)
                    .filter(|j| all || !states.is_empty() || !j.state.is_final())
                    .filter(|j| user.as_ref().is_none_or(|u| &j.user == u))
                    .filter(|j| states.is_empty() || states.contains(&j.state))
                    .filter(|j| self.may_see(&caller, j))
                    .map(|j| self.as_seen_by(&caller, self.with_reason(j.clone(), &s.policy)));
                match after {
                    Some(_) => {
                        let (jobs, next) = take_page(seen, |j| j.id);
                        ApiResponse::Jobs { jobs, next }
                    }
                    None => ApiResponse::Jobs {
                        jobs: seen.collect(),
                        next: None,
                    },
                }
            }
            ApiRequest::Hold { jobs, hold } => {
                let ids = match self.resolve(jobs, |j| j.state == JobState::Pending) {
                    Ok(ids) => ids,
                    Err(why) => return ApiResponse::error(ErrorKind::NotFound, why),
                };
                let cmd = Command::Hold {
                    by: caller.user,
                    admin: caller.admin,
                    ids,
                    hold,
                };
                match self.write(cmd).await {
                    Ok(CommandResult::Held { ids, .. }) => ApiResponse::Held { ids, hold },
                    Ok(other) => self.unexpected(other),
                    Err(resp) => resp,
                }
            }
            ApiRequest::Show { id, task } => {
                let found = match self.resolve([JobRef { id, task }], |_| true) {
                    Ok(ids) => ids[0],
                    Err(why) => return ApiResponse::error(ErrorKind::NotFound, why),
                };
                self.show(&caller, found).await
            }
            ApiRequest::Acct {
                mut filter,
                summary,
            } => {
                if self.cfg.private_jobs && !caller.admin {
                    // Only one's own jobs: another user's name selects none.
                    if filter.user.as_ref().is_some_and(|u| *u != caller.user) {
                        return ApiResponse::Acct {
                            records: Vec::new(),
                            next: None,
                        };
                    }
                    filter.user = Some(caller.user.clone());
                }
                self.acct(filter, summary).await
            }
            ApiRequest::Cluster => ApiResponse::Cluster {
                status: self.cluster_status(),
            },
            ApiRequest::Nodes => ApiResponse::Nodes {
                nodes: self.nodes(),
            },
            ApiRequest::Utilisation { hours, buckets } => self.utilisation(hours, buckets).await,
            ApiRequest::Logs { id, rank, offset } => {
                self.logs(&caller, id, rank, offset, None).await
            }
            ApiRequest::StepLogs {
                job,
                step,
                rank,
                stderr,
                offset,
            } => {
                self.logs(&caller, job, rank, offset, Some((step, stderr)))
                    .await
            }
            ApiRequest::Signal {
                jobs,
                signal,
                scope,
                step,
            } => self.signal(&caller, jobs, signal, scope, step),
            ApiRequest::Requeue { jobs, hold } => {
                let ids = match self.resolve(jobs, |j| !j.state.is_final()) {
                    Ok(ids) => ids,
                    Err(why) => return ApiResponse::error(ErrorKind::NotFound, why),
                };
                let cmd = Command::Requeue {
                    by: caller.user,
                    admin: caller.admin,
                    ids,
                    hold,
                    now: now_ms(),
                };
                match self.write(cmd).await {
                    Ok(CommandResult::Requeued { ids }) => ApiResponse::Requeued { ids },
                    Ok(other) => self.unexpected(other),
                    Err(resp) => resp,
                }
            }
            ApiRequest::Update { jobs, change } => {
                let ids = match self.resolve(jobs, |j| !j.state.is_final()) {
                    Ok(ids) => ids,
                    Err(why) => return ApiResponse::error(ErrorKind::NotFound, why),
                };
                let cmd = Command::Update {
                    by: caller.user,
                    admin: caller.admin,
                    ids,
                    change,
                };
                match self.write(cmd).await {
                    Ok(CommandResult::Updated { ids }) => ApiResponse::Updated { ids },
                    Ok(other) => self.unexpected(other),
                    Err(resp) => resp,
                }
            }
            req @ (ApiRequest::StepStart { .. }
            | ApiRequest::StepCancel { .. }
            | ApiRequest::Release { .. }
            | ApiRequest::Keepalive { .. }) => self.step_request(caller, req).await,
            ApiRequest::Exec { .. } | ApiRequest::Attach { .. } => ApiResponse::error(
                ErrorKind::BadInput,
                "this request opens an interactive stream; send it where one can follow",
            ),
            ApiRequest::NodeDrain { node, reason, now } => {
                if !caller.admin {
                    return forbidden("draining a node");
                }
                if reason.trim().is_empty() {
                    return ApiResponse::error(
                        ErrorKind::BadInput,
                        "--reason must say why, e.g. --reason \"replace PSU\"",
                    );
                }
                self.set_drain(node, Some((reason, caller.user)), now).await
            }
            ApiRequest::NodeMig { node, layout, now } => {
                if !caller.admin {
                    return forbidden("repartitioning a node's GPUs");
                }
                self.set_mig(node, layout, caller.user, now).await
            }
            ApiRequest::NodeShare { node, slots } => {
                if !caller.admin {
                    return forbidden("sharing a node's GPUs");
                }
                self.set_share(node, slots).await
            }
            ApiRequest::NodeResume { node } => {
                if !caller.admin {
                    return forbidden("resuming a node");
                }
                self.set_drain(node, None, false).await
            }
            ApiRequest::NodeReplace { node } => {
                if !caller.admin {
                    return forbidden("replacing a node");
                }
                let cmd = Command::AllowReplace {
                    node: node.clone(),
                    now: now_ms(),
                };
                match self.write(cmd).await {
                    Ok(CommandResult::NodeUpdated) => ApiResponse::NodeUpdated { node },
                    Ok(other) => self.unexpected(other),
                    Err(resp) => resp,
                }
            }
            ApiRequest::UseToken { .. } => ApiResponse::error(
                ErrorKind::Forbidden,
                "a token's use is taken by the server admitting a join",
            ),
            ApiRequest::TokenCreate {
                role,
                ttl_secs,
                uses,
            } => {
                if !caller.admin {
                    return forbidden("creating a join token");
                }
                self.create_token(&caller, role, ttl_secs, uses).await
            }
            ApiRequest::TokenList => self.token_list(&caller),
            ApiRequest::ApiTokenCreate {
                user,
                ttl_secs,
                read_only,
            } => {
                self.create_api_token(&caller, user, ttl_secs, read_only)
                    .await
            }
            ApiRequest::AddServer { .. } => ApiResponse::error(
                ErrorKind::Forbidden,
                "servers join with `gpuq server --join HOST:PORT --token TOKEN`",
            ),
            ApiRequest::RemoveServer { name } => self.remove_server(&caller, name).await,
            ApiRequest::SnapshotSave { path } => self.snapshot_save(&caller, path).await,
            req @ (ApiRequest::Admin { .. }
            | ApiRequest::PolicyShow
            | ApiRequest::Share
            | ApiRequest::Priorities { .. }) => self.policy_request(&caller, req).await,
            ApiRequest::TokenRevoke { id } => self.revoke_token(&caller, id).await,
        }
    }

    pub(super) fn unexpected(&self, r: CommandResult) -> ApiResponse {
        match r {
            CommandResult::Rejected(why) => rejection(why),
            other => ApiResponse::error(
                ErrorKind::Internal,
                format!("unexpected answer from the state machine: {other:?}"),
            ),
        }
    }

    /// Proposes a command and waits until it is committed and applied, for
    /// at most [`WRITE_TIMEOUT`]: a leader cut off from its majority cannot
    /// commit, and its callers must hear so rather than wait for the heal.
    pub async fn write(&self, cmd: Command) -> Result<CommandResult, ApiResponse> {
        match tokio::time::timeout(WRITE_TIMEOUT, self.proposer.propose(cmd)).await {
            Ok(r) => r,
            Err(_) => Err(write_timed_out()),
        }
    }

    /// [`Api::write`] for a command that must be a log entry of its own.
    pub async fn write_alone(&self, cmd: Command) -> Result<CommandResult, ApiResponse> {
        match tokio::time::timeout(WRITE_TIMEOUT, self.proposer.propose_alone(cmd)).await {
            Ok(r) => r,
            Err(_) => Err(write_timed_out()),
        }
    }

    /// On a leader whose lease has lapsed, the "not leader" answer.
    fn refuse_without_lease(&self) -> Option<ApiResponse> {
        let m = self.node.raft.metrics().borrow().clone();
        if m.current_leader != Some(m.id) {
            return None;
        }
        let ms = self.lease_lost_ms(&m)?;
        Some(ApiResponse::error(
            ErrorKind::Unavailable,
            format!(
                "not leader: this server has heard from no majority of the servers for \
                 {ms} ms, so another may lead now; retry on another server"
            ),
        ))
    }
}
