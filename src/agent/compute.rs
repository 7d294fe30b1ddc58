//! The compute agent: keeps one connection to the leader, registers the node,
//! and reconciles the tasks it runs to the desired state it is sent
//! (level-triggered: start what is desired and absent, stop what runs and is
//! not desired). Task starts and ends are buffered and replayed until the
//! leader acknowledges them as committed, so a reconnect or a control-plane
//! outage loses nothing and a repeat changes nothing (events are keyed by
//! job, attempt and rank).
//!
//! While no leader is reachable, running tasks keep running: nothing is
//! started or stopped on a desired state that may be stale.
//!
//! This file is the connection; the reconcile step and the event batches are
//! the `ledger`'s, and what runs the tasks is a `runner::TaskRunner`.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, watch};

use super::gpu::GpuBackend;
use super::ledger::Ledger;
use super::runner::TaskRunner;
use super::servers::{Backoff, ServerList};
use crate::model::{NodeInventory, Role};
use crate::net::agent_proto::{AgentHello, AgentMsg, ServerMsg};
use crate::net::endpoint::{Endpoint, ALPN_AGENT};
use crate::net::frame::{read_frame, write_frame, DEFAULT_MAX_FRAME};

/// How a compute agent reaches the control plane.
pub struct ComputeAgent {
    pub endpoint: Arc<Endpoint>,
    /// The servers to fail over between (shared with the local forwarder).
    pub servers: Arc<ServerList>,
    pub inventory: NodeInventory,
    /// The port advertised with this node's address (MASTER_ADDR host is the
    /// local address of the connection to the leader).
    pub advertise: Option<String>,
    pub runner: Arc<dyn TaskRunner>,
    /// How often tasks are re-examined.
    pub reconcile_every: Duration,
    /// The GPU backend, polled for health events (none for simulated nodes).
    pub gpus: Option<Arc<dyn GpuBackend>>,
    /// The health-check command's latest result, when one is configured.
    pub health: Option<super::health::Latest>,
    /// Stay drained on first registration until the health check passes.
    pub preflight: bool,
    /// Which job holds each GPU, from the last desired set (for metrics
    /// and dcgm-exporter's job mapping).
    pub holders: Arc<super::telemetry::GpuHolders>,
}

enum Session {
    /// The leader is elsewhere: try this address next.
    Redirect(Option<SocketAddr>),
    /// The connection ended; back off and retry.
    Lost(String),
    /// A welcomed connection ended; retry at once.
    Ended(String),
    /// Refused for good (e.g. a duplicate node name).
    Refused(String),
}

/// How long dialling one server may take before the next is tried.
pub const DIAL_TIMEOUT: Duration = Duration::from_secs(2);

/// How long a server may take to welcome an agent (it commits the
/// registration first).
const WELCOME_TIMEOUT: Duration = Duration::from_secs(15);

/// Leader hints followed in a row before the agent waits: two servers that
/// each name the other (stale hints during an election) must not make a loop.
const MAX_REDIRECTS: u32 = 3;

impl ComputeAgent {
    /// Runs until `shutdown`, failing over between the known servers: each
    /// round tries them all (the last that answered first), follows leader
    /// hints, and waits with jittered backoff between rounds.
    pub async fn run(self: Arc<Self>, mut shutdown: watch::Receiver<bool>) -> anyhow::Result<()> {
        let boot_id: u64 = rand::random();
        let mut ledger = Ledger::default();
        let mut backoff = Backoff::new(Duration::from_millis(100), Duration::from_secs(3));
        let mut hint: Option<SocketAddr> = None;
        let mut round: std::collections::VecDeque<SocketAddr> = Default::default();
        let mut redirects = 0u32;
        let mut just_lost = false;
        loop {
            if *shutdown.borrow() {
                return Ok(());
            }
            let addr = match hint.take() {
                Some(a) => a,
                None => {
                    if round.is_empty() {
                        round = self.servers.in_order().into();
                        // After a lost session, the server it was with (first
                        // in order) is likely dead or deposed: try it last.
                        if just_lost {
                            round.rotate_left(1);
                        }
                    }
                    just_lost = false;
                    match round.pop_front() {
                        Some(a) => a,
                        None => anyhow::bail!("this agent knows no server to connect to"),
                    }
                }
            };
            let wait = match self
                .session(addr, boot_id, &mut ledger, &mut shutdown)
                .await
            {
                Session::Redirect(Some(to)) if redirects < MAX_REDIRECTS => {
                    tracing::debug!(server = %addr, leader = %to, "following the leader hint");
                    redirects += 1;
                    hint = Some(to);
                    continue;
                }
                Session::Redirect(_) => {
                    redirects = 0;
                    true
                }
                Session::Lost(why) => {
                    tracing::info!(server = %addr, %why, "no leader there; trying the next server");
                    redirects = 0;
                    // Wait only after a whole round found no leader.
                    round.is_empty()
                }
                Session::Ended(why) => {
                    tracing::info!(server = %addr, %why, "leader connection lost; reconnecting");
                    backoff.reset();
                    redirects = 0;
                    round.clear();
                    just_lost = true;
                    true
                }
                Session::Refused(why) => {
                    tracing::error!(server = %addr, "registration refused: {why}");
                    // The leader refuses a restarted agent until the old
                    // connection has gone quiet (about 1.5 s): retry often.
                    if why.contains("already connected") {
                        backoff.reset();
                    }
                    true
                }
            };
            // Meanwhile keep observing tasks so ends are buffered, but start
            // and stop nothing on a desired state that may be stale.
            ledger.desired = None;
            ledger.stopping.clear();
            let events = ledger.reconcile(self.runner.as_ref());
            ledger.queue(events);
            if wait {
                tokio::select! {
                    _ = tokio::time::sleep(backoff.next_wait()) => {}
                    _ = shutdown.changed() => return Ok(()),
                }
            }
        }
    }

    /// Repartitions the GPUs into MIG `layout` (`gpuq node mig set`): the
    /// GPUs as they are now, then `MigFailed` when it did not work.
    fn apply_mig(&self, layout: &str) -> Vec<AgentMsg> {
        let failed = |error: String| AgentMsg::MigFailed {
            layout: layout.to_string(),
            error,
        };
        let Some(backend) = self.gpus.as_ref() else {
            return vec![failed("this node has no GPU backend".into())];
        };
        let applied = crate::model::mig::parse_target(layout)
            .map_err(|e| e.to_string())
            .and_then(|target| backend.set_mig(target.as_ref()).map_err(|e| e.to_string()));
        let mut out = Vec::new();
        match backend.gpus() {
            Ok(gpus) => out.push(AgentMsg::Gpus { gpus }),
            Err(e) => out.push(failed(format!(
                "cannot read the GPUs after repartitioning: {e}"
            ))),
        }
        match applied {
            Ok(()) => tracing::info!(node = %self.inventory.name, layout, "GPUs repartitioned"),
            Err(e) => {
                tracing::warn!(node = %self.inventory.name, layout, "MIG repartition failed: {e}");
                out.push(failed(e));
            }
        }
        out
    }

    /// Polls the GPU backend; after a health event, the GPUs to report.
    fn gpu_health(&self) -> Option<AgentMsg> {
        let backend = self.gpus.as_ref()?;
        let events = backend.poll_events();
        if events.is_empty() {
            return None;
        }
        for ev in &events {
            let critical = super::gpu::is_critical(ev);
            tracing::warn!(node = %self.inventory.name, event = %ev, critical, "GPU event");
        }
        match backend.gpus() {
            Ok(gpus) => Some(AgentMsg::Gpus { gpus }),
            Err(e) => {
                tracing::warn!("cannot read the GPUs after an event: {e}");
                None
            }
        }
    }

    async fn session(
        &self,
        addr: SocketAddr,
        boot_id: u64,
        ledger: &mut Ledger,
        shutdown: &mut watch::Receiver<bool>,
    ) -> Session {
        let dial = self.endpoint.dial(addr, ALPN_AGENT, &[Role::Server]);
        let conn = match tokio::time::timeout(DIAL_TIMEOUT, dial).await {
            Ok(Ok(p)) => p.conn,
            Ok(Err(e)) => return Session::Lost(e.to_string()),
            Err(_) => return Session::Lost(format!("no answer within {DIAL_TIMEOUT:?}")),
        };
        let (mut send, mut recv) = match conn.open_bi().await {
            Ok(s) => s,
            Err(e) => return Session::Lost(e.to_string()),
        };
        let host = conn
            .local_ip()
            .map(|ip| ip.to_string())
            .unwrap_or_else(|| "127.0.0.1".into());
        let mut inventory = self.inventory.clone();
        if let Some(gpus) = self.gpus.as_ref().and_then(|b| b.gpus().ok()) {
            inventory.gpus = gpus;
        }
        let hello = AgentHello {
            inventory,
            addr: self
                .advertise
                .clone()
                .unwrap_or_else(|| format!("{host}:0")),
            boot_id,
            preflight: self.preflight,
        };
        if let Err(e) = write_frame(&mut send, &hello).await {
            return Session::Lost(e.to_string());
        }
        let first = tokio::time::timeout(
            WELCOME_TIMEOUT,
            read_frame::<_, ServerMsg>(&mut recv, DEFAULT_MAX_FRAME),
        );
        match first.await {
            Ok(Ok(Some(ServerMsg::Welcome { servers, .. }))) => {
                self.servers.learn(&servers);
                self.servers.answered(addr);
            }
            Ok(Ok(Some(ServerMsg::Refused {
                leader_addr: Some(l),
                ..
            }))) => return Session::Redirect(l.parse().ok()),
            Ok(Ok(Some(ServerMsg::Refused { reason, .. }))) => {
                if reason.contains("not the leader") {
                    return Session::Lost(reason);
                }
                return Session::Refused(reason);
            }
            Ok(Ok(other)) => return Session::Lost(format!("unexpected first answer {other:?}")),
            Ok(Err(e)) => return Session::Lost(e.to_string()),
            Err(_) => return Session::Lost(format!("not welcomed within {WELCOME_TIMEOUT:?}")),
        }
        tracing::info!(server = %addr, node = %self.inventory.name, "connected to the leader");
        // Replay what the last connection may not have delivered.
        for (seq, events) in ledger.unacked.clone() {
            if write_frame(&mut send, &AgentMsg::Events { seq, events })
                .await
                .is_err()
            {
                return Session::Lost("connection lost while replaying".into());
            }
        }
        let logs = tokio::spawn(super::streams::serve(conn.clone(), self.runner.clone()));
        let (tx, mut rx) = mpsc::channel::<ServerMsg>(16);
        let reader = tokio::spawn(async move {
            while let Ok(Some(m)) = read_frame::<_, ServerMsg>(&mut recv, DEFAULT_MAX_FRAME).await {
                if tx.send(m).await.is_err() {
                    break;
                }
            }
        });
        let mut tick = tokio::time::interval(self.reconcile_every);
        let mut heartbeat = tokio::time::interval(Duration::from_secs(1));
        // Service replicas' health checks (this session's leader hears each
        // verdict from the start).
        let prober = super::probe::Prober::default();
        let mut health = self.health.clone();
        if let Some(h) = health.as_mut() {
            h.mark_changed(); // report the current result on every connect
        }
        let outcome = loop {
            let mut reconcile = false;
            tokio::select! {
                m = rx.recv() => match m {
                    Some(ServerMsg::Desired { tasks, stopping, preempted, .. }) => {
                        self.holders.update(&tasks, self.gpus.as_deref());
                        ledger.desired = Some(tasks.into_iter().map(|t| (t.key, t)).collect());
                        ledger.stopping = stopping.into_iter().collect();
                        ledger.preempted = preempted.into_iter().collect();
                        reconcile = true;
                    }
                    Some(ServerMsg::EventsCommitted { seq }) => {
                        ledger.committed(seq);
                        reconcile = true;
                    }
                    Some(ServerMsg::Refused { reason, leader_addr }) => {
                        break match leader_addr.and_then(|l| l.parse().ok()) {
                            Some(a) => Session::Redirect(Some(a)),
                            None => Session::Lost(reason),
                        };
                    }
                    Some(ServerMsg::Welcome { .. }) => {}
                    Some(ServerMsg::Signal { tasks, signal }) => {
                        for key in tasks {
                            self.runner.signal(key, signal);
                        }
                    }
                    Some(ServerMsg::Mig { layout }) => {
                        let mut lost = false;
                        for msg in self.apply_mig(&layout) {
                            if write_frame(&mut send, &msg).await.is_err() {
                                lost = true;
                                break;
                            }
                        }
                        if lost {
                            break Session::Lost("connection lost".into());
                        }
                    }
                    None => break Session::Lost("the leader closed the connection".into()),
                },
                _ = tick.tick() => reconcile = true,
                _ = heartbeat.tick() => {
                    if write_frame(&mut send, &AgentMsg::Heartbeat).await.is_err() {
                        break Session::Lost("heartbeat failed".into());
                    }
                    let jobs = self.holders.use_report();
                    if !jobs.is_empty()
                        && write_frame(&mut send, &AgentMsg::GpuUse { jobs }).await.is_err()
                    {
                        break Session::Lost("connection lost".into());
                    }
                    if let Some(msg) = self.gpu_health() {
                        if write_frame(&mut send, &msg).await.is_err() {
                            break Session::Lost("connection lost".into());
                        }
                    }
                    let verdicts = ledger
                        .desired
                        .as_ref()
                        .map(|d| prober.tick(d.values()))
                        .unwrap_or_default();
                    let mut lost = false;
                    for (job, attempt, healthy, detail) in verdicts {
                        let msg = AgentMsg::ReplicaHealth { job, attempt, healthy, detail };
                        if write_frame(&mut send, &msg).await.is_err() {
                            lost = true;
                            break;
                        }
                    }
                    if lost {
                        break Session::Lost("connection lost".into());
                    }
                }
                Ok(()) = async {
                    match health.as_mut() {
                        Some(h) => h.changed().await,
                        None => std::future::pending().await,
                    }
                } => {
                    let latest = health.as_mut().and_then(|h| h.borrow_and_update().clone());
                    if let Some((ok, output)) = latest {
                        if write_frame(&mut send, &AgentMsg::HealthCheck { ok, output }).await.is_err() {
                            break Session::Lost("connection lost".into());
                        }
                    }
                }
                _ = shutdown.changed() => break Session::Lost("shutting down".into()),
            }
            if reconcile {
                let events = ledger.reconcile(self.runner.as_ref());
                if let Some((seq, events)) = ledger.queue(events) {
                    if write_frame(&mut send, &AgentMsg::Events { seq, events })
                        .await
                        .is_err()
                    {
                        break Session::Lost("connection lost".into());
                    }
                }
            }
        };
        reader.abort();
        logs.abort();
        match outcome {
            Session::Lost(why) => Session::Ended(why),
            other => other,
        }
    }
}
