//! The workload driver: turns a trace or a synthetic mix into timed
//! submissions, submits them through the real API (the unix socket the CLI
//! uses), follows the jobs to their end and summarises what the cluster did.
//!
//! Times in the summary come from the jobs themselves (`submit_time`,
//! `start_time`, `end_time`, stamped by the leader), not from polling, so
//! the poll interval does not blur them; the driver's own clock only gives
//! the submit acknowledgement latency. A "start" is the scheduling decision
//! (the job turned RUNNING); its ranks come up one agent reconcile later.
//!
//! Compression is applied twice and must match: the driver submits at
//! `trace time / compression`, and the simulated agents run each task for
//! `GPUQ_SIM_DURATION_MS / compression`. `GPUQ_SIM_DURATION_MS` carries the
//! trace's own duration. Figures are reported in wall time and in trace time
//! (wall x compression).

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use rand::{Rng, SeedableRng};
use serde::Serialize;

use super::runner::{DURATION_ENV, EXIT_ENV};
use super::trace::{shape_for, TraceJob};
use crate::model::{Job, JobId, JobSpec, JobState, Program};
use crate::net::local::LocalClient;
use crate::net::proto::{ApiRequest, ApiResponse};

/// One job to submit, `at` after the workload starts.
#[derive(Clone, Debug, PartialEq)]
pub struct WorkItem {
    pub at: Duration,
    pub spec: JobSpec,
}

/// A job for simulated agents: `nodes` x `gpus_per_node`, running `duration`
/// (before compression) and ending with `exit_code`.
pub fn sim_spec(
    name: &str,
    nodes: u32,
    gpus_per_node: u32,
    duration: Duration,
    exit_code: i32,
) -> JobSpec {
    let mut env = vec![(DURATION_ENV.to_string(), duration.as_millis().to_string())];
    if exit_code != 0 {
        env.push((EXIT_ENV.to_string(), exit_code.to_string()));
    }
    JobSpec {
        qos: None,
        nice: 0,
        name: name.to_string(),
        nodes,
        ntasks_per_node: 1,
        gpus_per_node,
        // A fair share of a DGX's CPUs per GPU, so CPUs never bind first.
        cpus_per_task: (gpus_per_node * 16).max(1),
        mem_per_node_mb: None,
        time_limit_secs: None,
        account: None,
        partition: None,
        output: None,
        error: None,
        workdir: "/tmp".into(),
        env,
        export: crate::model::ExportMode::Listed,
        program: Program::Command {
            argv: vec!["true".into()],
        },
        requeue: Default::default(),
        max_restarts: 3,
        total_gpus: None,
        placement: Default::default(),
        queue: Default::default(),
        signal: None,
        launch: Default::default(),
        submit_host: None,
        first_step: None,
        exclusive: false,
        container: None,
    }
}

/// How trace jobs become submissions (see [`itp_items_with`]).
#[derive(Clone, Debug, PartialEq)]
pub struct ItpReplay {
    /// Trace seconds per wall second.
    pub compression: f64,
    /// Give each job a time limit (wall seconds, as the server counts them):
    /// its compressed runtime plus this margin, rounded up to whole seconds.
    /// `None`: no limit, so backfill never lets the job pass a reservation.
    pub limit_margin: Option<Duration>,
    /// Jobs of at least this many GPUs ask for [`ItpReplay::large_qos`].
    pub large_gpus: u32,
    /// The QoS large jobs ask for (`None`: every job gets the default).
    pub large_qos: Option<String>,
    /// Charge each job to the account named after its trace cluster (the
    /// trace records no users; its cluster is the one tenant-like column).
    pub account_per_cluster: bool,
}

impl ItpReplay {
    /// Plain replay: no limits, no QoS, the default account.
    pub fn plain(compression: f64) -> ItpReplay {
        ItpReplay {
            compression,
            limit_margin: None,
            large_gpus: 32,
            large_qos: None,
            account_per_cluster: false,
        }
    }
}

/// The trace replayed at `compression`: submit offsets from the first job,
/// shapes by [`shape_for`], durations as declared.
pub fn itp_items(jobs: &[TraceJob], compression: f64) -> Vec<WorkItem> {
    itp_items_with(jobs, &ItpReplay::plain(compression))
}

/// The trace replayed as `how` says. Durations are declared uncompressed
/// (the simulated agents divide them); time limits are wall seconds, since
/// the server's timeline and the agents' enforcement both run on the wall
/// clock.
pub fn itp_items_with(jobs: &[TraceJob], how: &ItpReplay) -> Vec<WorkItem> {
    let compression = how.compression;
    let first = jobs.iter().map(|j| j.submit_s).min().unwrap_or(0);
    let mut items: Vec<WorkItem> = jobs
        .iter()
        .map(|j| {
            let (nodes, per_node) = shape_for(j.gpus);
            let mut spec = sim_spec(
                &format!("itp-{}-{}g", j.cluster, j.gpus),
                nodes,
                per_node,
                Duration::from_secs(j.runtime_s),
                0,
            );
            spec.time_limit_secs = how.limit_margin.map(|m| {
                let wall = j.runtime_s as f64 / compression + m.as_secs_f64();
                (wall.ceil() as u64).max(1)
            });
            if j.gpus >= how.large_gpus {
                spec.qos.clone_from(&how.large_qos);
            }
            if how.account_per_cluster {
                spec.account = Some(j.cluster.clone());
            }
            WorkItem {
                at: Duration::from_secs_f64((j.submit_s - first) as f64 / compression),
                spec,
            }
        })
        .collect();
    items.sort_by_key(|i| i.at);
    items
}

/// A class of synthetic job.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub enum JobClass {
    /// No GPU, no time: the control plane's own cost per job.
    Trivial,
    OneGpu,
    EightGpu,
    /// 64 nodes x 8 GPUs.
    Gang64x8,
}

impl JobClass {
    /// (nodes, GPUs per node).
    pub fn shape(self) -> (u32, u32) {
        match self {
            JobClass::Trivial => (1, 0),
            JobClass::OneGpu => (1, 1),
            JobClass::EightGpu => (1, 8),
            JobClass::Gang64x8 => (64, 8),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            JobClass::Trivial => "trivial",
            JobClass::OneGpu => "1gpu",
            JobClass::EightGpu => "8gpu",
            JobClass::Gang64x8 => "gang64x8",
        }
    }
}

/// A synthetic mix: relative weights of each class, an arrival rate, and
/// the (uncompressed) duration of each class's jobs.
#[derive(Clone, Debug)]
pub struct Mix {
    pub weights: Vec<(JobClass, u32, Duration)>,
    /// Mean arrivals per second (Poisson); `f64::INFINITY` submits all at once.
    pub rate_per_s: f64,
}

/// `n` jobs drawn from `mix`, reproducibly from `seed`.
pub fn synthetic(mix: &Mix, n: usize, seed: u64) -> Vec<WorkItem> {
    let total: u32 = mix.weights.iter().map(|w| w.1).sum();
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut at = 0.0f64;
    (0..n)
        .map(|i| {
            if mix.rate_per_s.is_finite() && i > 0 {
                let u: f64 = rng.gen_range(f64::EPSILON..1.0);
                at += -u.ln() / mix.rate_per_s;
            }
            let mut pick = rng.gen_range(0..total.max(1));
            let (class, _, duration) = mix
                .weights
                .iter()
                .find(|(_, w, _)| {
                    if pick < *w {
                        true
                    } else {
                        pick -= w;
                        false
                    }
                })
                .copied()
                .unwrap_or((JobClass::Trivial, 1, Duration::ZERO));
            let (nodes, gpus) = class.shape();
            WorkItem {
                at: Duration::from_secs_f64(at),
                spec: sim_spec(class.name(), nodes, gpus, duration, 0),
            }
        })
        .collect()
}

/// What the driver saw of one job, plus the job as the cluster recorded it.
#[derive(Clone, Debug, Serialize)]
pub struct JobRecord {
    pub id: u64,
    pub name: String,
    pub gpus: u64,
    /// When the driver meant to submit it, and when it did, after the start.
    pub planned: Duration,
    pub sent: Duration,
    /// Submit round trip on the socket.
    pub ack: Duration,
    pub state: JobState,
    /// Leader timestamps, ms since the epoch.
    pub submit_time: u64,
    pub start_time: Option<u64>,
    pub end_time: Option<u64>,
}

/// How the driver submits and follows.
#[derive(Clone, Debug)]
pub struct DriveOptions {
    /// Connections submitting in parallel (keeps a burst on schedule).
    pub clients: usize,
    /// How often the queue is polled for the end of the workload.
    pub poll_every: Duration,
    /// Give up waiting for the jobs this long after the last submit.
    pub drain_timeout: Duration,
}

impl Default for DriveOptions {
    fn default() -> Self {
        DriveOptions {
            clients: 4,
            poll_every: Duration::from_millis(500),
            drain_timeout: Duration::from_secs(600),
        }
    }
}

/// One call on a fresh or kept connection, as an error on anything but success.
async fn call(c: &mut LocalClient, req: &ApiRequest) -> anyhow::Result<ApiResponse> {
    match c.call(req).await? {
        ApiResponse::Error { kind, message, .. } => bail!("{kind:?}: {message}"),
        other => Ok(other),
    }
}

/// GPUs of the registered nodes.
pub async fn fleet_gpus(socket: &Path) -> anyhow::Result<u64> {
    let mut c = LocalClient::connect(socket).await?;
    match call(&mut c, &ApiRequest::Nodes).await? {
        ApiResponse::Nodes { nodes } => {
            Ok(nodes.iter().map(|n| n.inventory.gpus.len() as u64).sum())
        }
        other => bail!("unexpected answer to Nodes: {other:?}"),
    }
}

/// Submits `items` on schedule, waits until every job has ended (or the
/// drain timeout passed), and returns what happened to each.
pub async fn drive(
    socket: &Path,
    items: Vec<WorkItem>,
    opts: &DriveOptions,
) -> anyhow::Result<Vec<JobRecord>> {
    let start = Instant::now();
    let (tx, rx) = async_channel(items.len());
    let mut workers = Vec::new();
    for _ in 0..opts.clients.max(1) {
        let rx = rx.clone();
        let mut c = LocalClient::connect(socket).await?;
        workers.push(tokio::spawn(async move {
            let mut out = Vec::new();
            loop {
                let next = rx.lock().await.recv().await;
                let Some((planned, spec)) = next else { break };
                let sent = start.elapsed();
                let t = Instant::now();
                let req = ApiRequest::Submit {
                    spec: Box::new(spec),
                };
                let id = match call(&mut c, &req).await? {
                    ApiResponse::Submitted { id } => id,
                    other => bail!("unexpected answer to Submit: {other:?}"),
                };
                out.push((id, planned, sent, t.elapsed()));
            }
            anyhow::Ok(out)
        }));
    }
    for item in items {
        tokio::time::sleep_until((start + item.at).into()).await;
        if tx.send((item.at, item.spec)).await.is_err() {
            break; // a worker failed; its error is reported below
        }
    }
    drop(tx);
    let mut sent = Vec::new();
    for w in workers {
        sent.extend(w.await.context("a submit worker panicked")??);
    }
    let ids: std::collections::BTreeSet<JobId> = sent.iter().map(|s| s.0).collect();

    // Follow: done when none of ours is active.
    let mut c = LocalClient::connect(socket).await?;
    let deadline = Instant::now() + opts.drain_timeout;
    loop {
        let active = match call(
            &mut c,
            &ApiRequest::Queue {
                all: false,
                user: None,
                states: vec![],
                after: None,
            },
        )
        .await?
        {
            ApiResponse::Jobs { jobs, .. } => jobs.iter().filter(|j| ids.contains(&j.id)).count(),
            other => bail!("unexpected answer to Queue: {other:?}"),
        };
        if active == 0 {
            break;
        }
        if Instant::now() > deadline {
            tracing::warn!(active, "jobs still active at the drain timeout");
            break;
        }
        tokio::time::sleep(opts.poll_every).await;
    }
    let mut records = Vec::with_capacity(sent.len());
    for (id, planned, sent_at, ack) in sent {
        let job: Job = match call(&mut c, &ApiRequest::Show { id, task: None }).await? {
            ApiResponse::Job { job, .. } => *job,
            other => bail!("unexpected answer to Show: {other:?}"),
        };
        records.push(JobRecord {
            id: id.0,
            name: job.spec.name.clone(),
            gpus: job.spec.total_gpus(),
            planned,
            sent: sent_at,
            ack,
            state: job.state,
            submit_time: job.submit_time,
            start_time: job.start_time,
            end_time: job.end_time,
        });
    }
    records.sort_by_key(|r| r.id);
    Ok(records)
}

type Queue = (
    tokio::sync::mpsc::Sender<(Duration, JobSpec)>,
    std::sync::Arc<tokio::sync::Mutex<tokio::sync::mpsc::Receiver<(Duration, JobSpec)>>>,
);

/// A multi-consumer queue: workers take turns at one receiver.
fn async_channel(cap: usize) -> Queue {
    let (tx, rx) = tokio::sync::mpsc::channel(cap.max(1));
    (tx, std::sync::Arc::new(tokio::sync::Mutex::new(rx)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn itp_jobs_become_compressed_sim_jobs() {
        let job = |s, g, r| TraceJob {
            job_id: "x".into(),
            cluster: "cluster04".into(),
            submit_s: s,
            gpus: g,
            runtime_s: r,
        };
        let items = itp_items(&[job(2000, 16, 7200), job(1000, 1, 60)], 100.0);
        assert_eq!(items[0].at, Duration::ZERO);
        assert_eq!(items[1].at, Duration::from_secs(10));
        let big = &items[1].spec;
        assert_eq!((big.nodes, big.gpus_per_node), (2, 8));
        assert!(big
            .env
            .contains(&(DURATION_ENV.to_string(), "7200000".to_string())));
        assert!(big.check_invariants().is_ok());
        assert_eq!(items[0].spec.gpus_per_node, 1);
    }

    #[test]
    fn replay_options_set_wall_time_limits_qos_and_accounts() {
        let job = |g, r| TraceJob {
            job_id: "x".into(),
            cluster: "cluster04".into(),
            submit_s: 0,
            gpus: g,
            runtime_s: r,
        };
        let how = ItpReplay {
            limit_margin: Some(Duration::from_millis(500)),
            large_qos: Some("large".into()),
            account_per_cluster: true,
            ..ItpReplay::plain(1000.0)
        };
        let items = itp_items_with(&[job(64, 7200), job(1, 10)], &how);
        let (big, small) = (&items[0].spec, &items[1].spec);
        // 7.2 s of wall time plus 0.5 s, rounded up; a tiny job gets 1 s.
        assert_eq!(big.time_limit_secs, Some(8));
        assert_eq!(small.time_limit_secs, Some(1));
        assert_eq!(big.qos.as_deref(), Some("large"));
        assert_eq!(small.qos, None);
        assert_eq!(small.account.as_deref(), Some("cluster04"));
        let plain = itp_items(&[job(64, 7200)], 1000.0);
        assert_eq!(
            (plain[0].spec.time_limit_secs, &plain[0].spec.qos),
            (None, &None)
        );
        assert_eq!(plain[0].spec.account, None);
    }

    #[test]
    fn synthetic_mixes_follow_weights_and_rate_reproducibly() {
        let mix = Mix {
            weights: vec![
                (JobClass::Trivial, 1, Duration::ZERO),
                (JobClass::Gang64x8, 1, Duration::from_secs(1)),
            ],
            rate_per_s: 100.0,
        };
        let a = synthetic(&mix, 2000, 7);
        assert_eq!(a, synthetic(&mix, 2000, 7));
        let gangs = a.iter().filter(|i| i.spec.nodes == 64).count();
        assert!((800..1200).contains(&gangs), "{gangs}");
        // 2000 arrivals at 100/s take about 20 s.
        let span = a.last().unwrap().at.as_secs_f64();
        assert!((17.0..23.0).contains(&span), "{span}");
        assert!(a.windows(2).all(|w| w[0].at <= w[1].at));
        let burst = synthetic(
            &Mix {
                rate_per_s: f64::INFINITY,
                ..mix
            },
            10,
            1,
        );
        assert!(burst.iter().all(|i| i.at == Duration::ZERO));
    }
}
