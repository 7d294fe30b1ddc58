//! The leader's side of agent connections (`gpuq-agent/1`). Each connected
//! agent gets its node's full desired state whenever the applied state
//! changes; its task events are committed through the log and acknowledged.
//! Liveness (last heard) is kept here, in memory, never in the log.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::mpsc;

use crate::clock::now_ms;
use crate::model::{JobState, Role, TaskKey};
use crate::net::agent_proto::{AgentHello, AgentMsg, DesiredTask, ServerMsg};
use crate::net::endpoint::Peer;
use crate::net::frame::{read_frame, write_frame, DEFAULT_MAX_FRAME};
use crate::state::{Command, State};

use super::desired::{desired_tasks, preempted_jobs, stopping_tasks};
use super::Api;

/// An agent is taken for alive while heard from within this long (agents
/// heartbeat every second), so a restarted agent is admitted quickly while a
/// second live agent with the same name is still refused.
const ALIVE_WINDOW: Duration = Duration::from_millis(1500);

struct Connected {
    boot_id: u64,
    last_seen: Instant,
    conn: quinn::Connection,
    /// Messages for the session to send beside the desired state (signals).
    outbox: mpsc::UnboundedSender<ServerMsg>,
}

/// The agents connected to this server, by node name.
#[derive(Default)]
pub struct AgentHub {
    agents: Mutex<HashMap<String, Connected>>,
    /// When a session was last closed because this server stopped leading
    /// (or lost its lease): liveness counts every node's grace from then,
    /// since an agent turned away cannot heartbeat here.
    deposed_at: Mutex<Option<Instant>>,
    /// Each node's last report of its jobs' GPU use.
    gpu_use: Mutex<HashMap<String, Vec<(crate::model::JobId, crate::model::GpuUse)>>>,
    /// Service replicas' last health verdicts, from their agents.
    replica_health: Mutex<HashMap<crate::model::JobId, bool>>,
}

impl AgentHub {
    /// A replica's last health verdict, if its agent made one.
    pub fn replica_health(&self, job: crate::model::JobId) -> Option<bool> {
        let h = self
            .replica_health
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        h.get(&job).copied()
    }

    /// `job`'s GPU use over every node that reported it.
    pub fn gpu_use(&self, job: crate::model::JobId) -> Option<crate::model::GpuUse> {
        let reports = self.gpu_use.lock().unwrap_or_else(|p| p.into_inner());
        crate::model::GpuUse::merge(
            reports
                .values()
                .flat_map(|r| r.iter().filter(|(j, _)| *j == job).map(|(_, u)| *u)),
        )
    }

    /// Every reported job's GPU use over its nodes, in one pass over the
    /// reports (for checks over all running jobs).
    pub fn all_gpu_use(&self) -> HashMap<crate::model::JobId, crate::model::GpuUse> {
        let reports = self.gpu_use.lock().unwrap_or_else(|p| p.into_inner());
        let mut by_job: HashMap<crate::model::JobId, Vec<crate::model::GpuUse>> = HashMap::new();
        for (job, u) in reports.values().flatten() {
            by_job.entry(*job).or_default().push(*u);
        }
        by_job
            .into_iter()
            .filter_map(|(job, parts)| Some((job, crate::model::GpuUse::merge(parts)?)))
            .collect()
    }

    /// `node`'s last use report for each job whose ranks end in `events`,
    /// to go into the run with the ends.
    fn gpu_use_for_ends(
        &self,
        node: &str,
        events: &[crate::model::TaskEvent],
    ) -> Vec<(crate::model::JobId, crate::model::GpuUse)> {
        let reports = self.gpu_use.lock().unwrap_or_else(|p| p.into_inner());
        let Some(report) = reports.get(node) else {
            return Vec::new();
        };
        let ending: std::collections::BTreeSet<crate::model::JobId> = events
            .iter()
            .filter(|e| matches!(e.kind, crate::model::TaskEventKind::Ended(_)))
            .map(|e| e.key.job)
            .collect();
        report
            .iter()
            .filter(|(job, _)| ending.contains(job))
            .copied()
            .collect()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Connected>> {
        self.agents.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Admits a connection for `node`, or says why not: a different agent
    /// process for the same node that is still heard from is refused.
    fn admit(
        &self,
        node: &str,
        boot_id: u64,
        conn: &quinn::Connection,
        outbox: mpsc::UnboundedSender<ServerMsg>,
    ) -> Result<(), String> {
        let mut agents = self.lock();
        if let Some(c) = agents.get(node) {
            if c.boot_id != boot_id && c.last_seen.elapsed() < ALIVE_WINDOW {
                return Err(format!(
                    "node {node} is already connected from another running agent; \
                     stop it or give this agent another node_name"
                ));
            }
        }
        agents.insert(
            node.to_string(),
            Connected {
                boot_id,
                last_seen: Instant::now(),
                conn: conn.clone(),
                outbox,
            },
        );
        Ok(())
    }

    fn touch(&self, node: &str, boot_id: u64) {
        if let Some(c) = self.lock().get_mut(node) {
            if c.boot_id == boot_id {
                c.last_seen = Instant::now();
            }
        }
    }

    fn leave(&self, node: &str, boot_id: u64) {
        let mut agents = self.lock();
        if agents.get(node).is_some_and(|c| c.boot_id == boot_id) {
            agents.remove(node);
        }
    }

    /// When `node`'s agent was last heard from by this server.
    /// When a session was last closed because this server was not leading.
    pub fn deposed_at(&self) -> Option<Instant> {
        *self.deposed_at.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn last_seen(&self, node: &str) -> Option<Instant> {
        self.lock().get(node).map(|c| c.last_seen)
    }

    /// The live connection of `node`'s agent.
    pub fn connection(&self, node: &str) -> Option<quinn::Connection> {
        self.lock()
            .get(node)
            .filter(|c| c.conn.close_reason().is_none())
            .map(|c| c.conn.clone())
    }

    /// Hands `msg` to `node`'s session to send; false when it has none.
    pub fn send(&self, node: &str, msg: ServerMsg) -> bool {
        self.lock()
            .get(node)
            .is_some_and(|c| c.outbox.send(msg).is_ok())
    }

    /// Names of agents heard from recently.
    pub fn alive(&self) -> Vec<String> {
        self.lock()
            .iter()
            .filter(|(_, c)| c.last_seen.elapsed() < ALIVE_WINDOW)
            .map(|(n, _)| n.clone())
            .collect()
    }
}

async fn refuse(send: &mut quinn::SendStream, reason: String, leader_addr: Option<String>) {
    let _ = write_frame(
        send,
        &ServerMsg::Refused {
            reason,
            leader_addr,
        },
    )
    .await;
    let _ = send.finish();
    // Give the frame a moment to leave before the stream is dropped.
    tokio::time::sleep(Duration::from_millis(50)).await;
}

/// What a node's agent was last sent: its desired tasks, the tasks to stop,
/// the jobs being preempted.
type DesiredSets = (Vec<DesiredTask>, Vec<TaskKey>, Vec<crate::model::JobId>);

/// Serves one agent connection until it closes or this server stops leading.
pub async fn serve(api: Arc<Api>, hub: Arc<AgentHub>, peer: Peer) {
    let (mut send, mut recv) = match peer.conn.accept_bi().await {
        Ok(s) => s,
        Err(_) => return,
    };
    let hello: AgentHello = match read_frame(&mut recv, DEFAULT_MAX_FRAME).await {
        Ok(Some(h)) => h,
        _ => return,
    };
    let node = hello.inventory.name.clone();
    match &peer.identity {
        Some((Role::Agent, name)) if *name == node => {}
        Some((role, name)) => {
            let why = format!(
                "this agent's certificate is for {role} {name}, but it registers as node {node}"
            );
            tracing::warn!(%node, remote = %peer.remote, "{why}");
            return refuse(&mut send, why, None).await;
        }
        None => return refuse(&mut send, "a certificate is required".into(), None).await,
    }
    if let Some(leader) = api.leader_elsewhere() {
        return refuse(&mut send, "this server is not the leader".into(), leader).await;
    }
    let (outbox, mut outgoing) = mpsc::unbounded_channel::<ServerMsg>();
    if let Err(why) = hub.admit(&node, hello.boot_id, &peer.conn, outbox) {
        tracing::warn!(%node, remote = %peer.remote, "refused agent: {why}");
        return refuse(&mut send, why, None).await;
    }
    let reg = Command::RegisterNode {
        inventory: hello.inventory.clone(),
        addr: hello.addr.clone(),
        preflight: hello.preflight,
        now: now_ms(),
        cert_sha256: peer.cert_sha256(),
    };
    let refused = match api.write(reg).await {
        Ok(crate::state::CommandResult::Rejected(why)) => Some(why.to_string()),
        Ok(_) => None,
        Err(resp) => Some(format!("registration failed: {resp:?}")),
    };
    if let Some(why) = refused {
        tracing::warn!(%node, remote = %peer.remote, "refused agent registration: {why}");
        hub.leave(&node, hello.boot_id);
        return refuse(&mut send, why, None).await;
    }
    tracing::info!(%node, remote = %peer.remote, gpus = hello.inventory.gpus.len(), "agent connected");
    let welcome = ServerMsg::Welcome {
        node: node.clone(),
        servers: api.member_addrs(),
    };
    if write_frame(&mut send, &welcome).await.is_err() {
        hub.leave(&node, hello.boot_id);
        return;
    }

    // Reading is not cancel-safe, so a task feeds frames into a channel.
    let (tx, mut rx) = mpsc::channel::<AgentMsg>(64);
    let reader = tokio::spawn(async move {
        while let Ok(Some(msg)) = read_frame::<_, AgentMsg>(&mut recv, DEFAULT_MAX_FRAME).await {
            if tx.send(msg).await.is_err() {
                break;
            }
        }
    });

    let mut metrics = api.metrics();
    let mut last_sent: Option<DesiredSets> = None;
    // The node's index version when `last_sent` was computed: an applied
    // entry that touched no job on this node leaves it, and the desired
    // state is then neither recomputed nor compared.
    let mut sent_version: Option<u64> = None;
    // The MIG layout last handed to the agent (`gpuq node mig set`).
    let mut last_mig: Option<String> = None;
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    loop {
        // A deposed leader (or one that lost its majority) must not push
        // desired state any more: it tells the agent where to go and closes
        // the session, so the agent reconnects to whoever leads now.
        if let Some(leader) = api.leader_elsewhere() {
            tracing::info!(%node, leader = ?leader, "no longer leading: closing the agent session");
            *api.hub.deposed_at.lock().unwrap_or_else(|p| p.into_inner()) = Some(Instant::now());
            let _ = write_frame(
                &mut send,
                &ServerMsg::Refused {
                    reason: "this server is not the leader any more".into(),
                    leader_addr: leader,
                },
            )
            .await;
            let _ = send.finish();
            tokio::time::sleep(Duration::from_millis(50)).await;
            peer.conn.close(0u32.into(), b"not the leader");
            break;
        }
        let changed = {
            let s = api.state();
            let version = s.index.node_version(&node);
            if sent_version == Some(version) {
                None
            } else {
                sent_version = Some(version);
                let sets = (
                    desired_tasks(&s, &node),
                    stopping_tasks(&s, &node),
                    preempted_jobs(&s, &node),
                );
                Some((sets, api.applied_index()))
            }
        };
        if let Some((desired, index)) = changed.filter(|(d, _)| last_sent.as_ref() != Some(d)) {
            let msg = ServerMsg::Desired {
                index,
                tasks: desired.0.clone(),
                stopping: desired.1.clone(),
                preempted: desired.2.clone(),
            };
            if write_frame(&mut send, &msg).await.is_err() {
                break;
            }
            last_sent = Some(desired);
        }
        // A MIG target goes to the agent once nothing runs there.
        let mig = api.state().mig_to_apply(&node).map(str::to_string);
        if mig != last_mig {
            if let Some(layout) = &mig {
                tracing::info!(%node, %layout, "asking the agent to repartition its GPUs");
                let msg = ServerMsg::Mig {
                    layout: layout.clone(),
                };
                if write_frame(&mut send, &msg).await.is_err() {
                    break;
                }
            }
            last_mig = mig;
        }
        tokio::select! {
            changed = metrics.changed() => {
                if changed.is_err() {
                    break;
                }
            }
            msg = outgoing.recv() => {
                let Some(msg) = msg else { break };
                if write_frame(&mut send, &msg).await.is_err() {
                    break;
                }
            }
            msg = rx.recv() => {
                let Some(msg) = msg else { break };
                hub.touch(&node, hello.boot_id);
                match msg {
                    AgentMsg::Heartbeat => {}
                    AgentMsg::GpuUse { jobs } => {
                        hub.gpu_use
                            .lock()
                            .unwrap_or_else(|p| p.into_inner())
                            .insert(node.clone(), jobs);
                    }
                    AgentMsg::ReplicaHealth { job, attempt, healthy, detail } => {
                        hub.replica_health
                            .lock()
                            .unwrap_or_else(|p| p.into_inner())
                            .insert(job, healthy);
                        if healthy {
                            promote_ready(&api, job).await;
                        } else {
                            stop_unhealthy(&api, &node, job, attempt, &detail).await;
                        }
                    }
                    AgentMsg::MigFailed { layout, error } => {
                        tracing::warn!(%node, %layout, "MIG repartition failed: {error}");
                        let cmd = Command::MigFailed { node: node.clone(), error, now: now_ms() };
                        if let Err(e) = api.write(cmd).await {
                            tracing::warn!(%node, "MIG failure not committed: {e:?}");
                        }
                    }
                    AgentMsg::Gpus { gpus } => {
                        let cmd = Command::GpuHealth { node: node.clone(), gpus, now: now_ms() };
                        if let Err(e) = api.write(cmd).await {
                            tracing::warn!(%node, "GPU health not committed: {e:?}");
                        }
                    }
                    AgentMsg::HealthCheck { ok, output } => {
                        let drained_by_check = matches!(
                            api.state().nodes.get(&node).map(|n| &n.status),
                            Some(crate::state::NodeStatus::Drained { by: crate::state::DrainSource::HealthCheck, .. })
                        );
                        let up = matches!(
                            api.state().nodes.get(&node).map(|n| &n.status),
                            Some(crate::state::NodeStatus::Up)
                        );
                        let drain = match (ok, up, drained_by_check) {
                            (false, true, _) => Some(Some(format!("health check failed: {}", output.trim()))),
                            (true, _, true) => Some(None),
                            _ => None,
                        };
                        if let Some(drain) = drain {
                            tracing::info!(%node, ok, "health check changed the node's state");
                            let cmd = Command::SetDrain {
                                node: node.clone(),
                                drain,
                                by: crate::state::DrainSource::HealthCheck,
                                user: None,
                                requeue_now: false,
                                now: now_ms(),
                            };
                            if let Err(e) = api.write(cmd).await {
                                tracing::warn!(%node, "health check result not committed: {e:?}");
                            }
                        }
                    }
                    AgentMsg::Events { seq, events } => {
                        let gpu_use = hub.gpu_use_for_ends(&node, &events);
                        let cmd = Command::TaskEvents { node: node.clone(), events, now: now_ms(), gpu_use };
                        match api.write(cmd).await {
                            Ok(_) => {
                                if write_frame(&mut send, &ServerMsg::EventsCommitted { seq }).await.is_err() {
                                    break;
                                }
                            }
                            Err(e) => tracing::warn!(%node, "task events not committed: {e:?}"),
                        }
                    }
                }
            }
            _ = tick.tick() => {}
        }
    }
    reader.abort();
    hub.leave(&node, hello.boot_id);
    tracing::info!(%node, "agent disconnected");
}

/// Counts of nodes' jobs, for tables.
pub fn running_jobs_on(state: &State, node: &str) -> usize {
    state
        .jobs_on(node)
        .filter(|j| j.state == JobState::Running || j.state == JobState::Completing)
        .count()
}

/// Stops a replica its agent found unhealthy (`detail`: what the check
/// saw), if that attempt still runs; apply then queues its index's next job.
async fn stop_unhealthy(
    api: &Api,
    node: &str,
    job: crate::model::JobId,
    attempt: u32,
    detail: &str,
) {
    let current = api.state().job(job).is_some_and(|j| {
        j.state == crate::model::JobState::Running
            && j.replica_of.is_some()
            && j.run.as_ref().is_some_and(|r| r.attempt == attempt)
    });
    if !current {
        return;
    }
    tracing::warn!(%node, %job, %detail, "stopping an unhealthy replica");
    let cmd = Command::Cancel {
        by: format!("its health check ({detail})"),
        admin: true,
        ids: vec![job],
        now: now_ms(),
    };
    if let Err(e) = api.write(cmd).await {
        tracing::warn!(%node, %job, "could not stop the unhealthy replica: {e:?}");
    }
}

/// A rolling update's new replica passed its health check: it takes its
/// index's place (the old replica stops, the roll moves on).
async fn promote_ready(api: &Api, job: crate::model::JobId) {
    let ready = {
        let s = api.state();
        s.job(job).and_then(|j| j.replica_of.clone()).filter(|r| {
            s.services
                .get(&r.service)
                .and_then(|svc| svc.slots.get(&r.index))
                .is_some_and(|slot| slot.next == Some(job))
        })
    };
    let Some(r) = ready else { return };
    let cmd = Command::ServiceReplicaReady {
        name: r.service,
        index: r.index,
        job,
        now: now_ms(),
    };
    if let Err(e) = api.write(cmd).await {
        tracing::warn!(%job, "could not promote the ready replica: {e:?}");
    }
}
