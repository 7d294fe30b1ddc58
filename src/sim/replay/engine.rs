//! The discrete-event loop of a replay: the leader's work in virtual time,
//! with the real state machine and the real scheduler.
//!
//! Each distinct instant of the trace is one step: the jobs that end then
//! report their ranks' ends (`Command::TaskEvents`, as their agents would),
//! the jobs that arrive then are submitted (`Command::Submit`), and, as the
//! leader does on a state change, one pass runs (`sched::plan_ref` on
//! `State::sched_input`): its preemptions are applied (`Command::Preempt`,
//! the victims' ranks end at once) and its allocations (`Command::Schedule`);
//! every started rank reports its start and its end is queued at start +
//! duration, or at start + time limit as a timeout when the job outruns it.
//! Between changes the leader's periodic pass runs every `tick` while jobs
//! wait; a tick that provably cannot start anything is skipped: nothing
//! changed since the last pass, and either the queue's order cannot change
//! with time (no fair-share, and age is alone or absent among the weights)
//! or fewer GPUs are free than the smallest waiting job needs and no QoS may
//! preempt. A pass takes no virtual time.
//!
//! Deterministic: the state machine is, arrivals go in trace order, and ties
//! in time break by job id.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};

use super::policy::ReplayPolicy;
use super::{Outcome, Run, Sample, TraceJob};
use crate::model::{JobId, JobState, Millis, TaskEnd, TaskEvent, TaskEventKind, TaskKey};
use crate::state::{Command, CommandResult, Dirty, State};

mod autoscale;
pub use autoscale::Autoscale;
use autoscale::{declare_group, GROUP};

/// `State::apply` without a store: what it touched is only for writing
/// records out, which a replay never does.
fn apply(state: &mut State, cmd: &Command) -> CommandResult {
    state.apply(cmd, &mut Dirty::default())
}

/// The replayed cluster: `nodes` identical nodes of `gpus_per_node` GPUs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Shape {
    pub nodes: u32,
    pub gpus_per_node: u32,
    /// Spread the nodes over this many leaf switches (one spine), so
    /// topology-aware placement has domains to respect; `None`: flat.
    pub topology_leaves: Option<u32>,
    /// The nodes are a node group the leader's autoscaler starts and
    /// stops (`state::power_decisions`), not a fixed fleet.
    pub autoscale: Option<Autoscale>,
}

impl Shape {
    pub fn gpus(&self) -> u64 {
        u64::from(self.nodes) * u64::from(self.gpus_per_node)
    }

    /// Nodes and GPUs per node for a job of `gpus` GPUs: up to a node's
    /// worth on one node, more as whole nodes (a 12-GPU job on 8-GPU nodes
    /// holds 2 x 8, as it would on a real fleet).
    pub fn job_shape(&self, gpus: u32) -> (u32, u32) {
        let g = self.gpus_per_node.max(1);
        if gpus <= g {
            (1, gpus)
        } else {
            (gpus.div_ceil(g), g)
        }
    }

    fn node_name(&self, i: u32) -> String {
        if self.autoscale.is_some() {
            return format!("{GROUP}-{:03}", i + 1);
        }
        let width = self.nodes.to_string().len();
        format!("node{:0width$}", i + 1)
    }

    /// The simulated inventory of node `i`.
    fn inventory(&self, i: u32) -> Result<crate::model::NodeInventory, EngineError> {
        let name = self.node_name(i);
        crate::sim::fleet::sim_inventory(&name, self.gpus_per_node, &self.topology(i)).map_err(
            |e| EngineError::Node {
                node: name.clone(),
                reason: format!("{e:#}"),
            },
        )
    }

    fn topology(&self, i: u32) -> String {
        match self.topology_leaves {
            Some(l) if l > 0 => {
                let per_leaf = self.nodes.div_ceil(l).max(1);
                format!("spine1/leaf{}", i / per_leaf + 1)
            }
            _ => String::new(),
        }
    }
}

/// What the loop reports while it runs (every `progress_every` steps).
#[derive(Clone, Copy, Debug)]
pub struct Progress {
    pub now: Millis,
    pub arrived: usize,
    pub jobs: usize,
    pub pending: usize,
    pub running: usize,
    pub passes: u64,
    /// Wall time spent in the scheduler's passes so far.
    pub pass_time: std::time::Duration,
}

/// Why a replay could not run.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error("the cluster shape is empty: give --nodes and --gpus-per-node of 1 or more")]
    EmptyCluster,
    #[error("cannot build the simulated node {node}: {reason}")]
    Node { node: String, reason: String },
    #[error("--autoscale: {0}")]
    Autoscale(String),
    #[error("the state machine refused {what} of trace job {job} (line {line}): {reason}")]
    Refused {
        what: &'static str,
        job: String,
        line: usize,
        reason: String,
    },
}

/// Replays `trace` (sorted by arrival) on `shape` under `policy`.
/// Jobs larger than the cluster are left out and listed in `Run::skipped`.
pub fn replay(
    trace: &[TraceJob],
    shape: &Shape,
    policy: &ReplayPolicy,
    progress: &mut dyn FnMut(&Progress),
) -> Result<Run, EngineError> {
    let mut engine = Engine::new(shape, policy)?;
    let mut skipped = Vec::new();
    let jobs: Vec<&TraceJob> = trace
        .iter()
        .filter(|j| {
            let (nodes, per_node) = shape.job_shape(j.gpus);
            let fits = nodes <= shape.nodes && per_node <= shape.gpus_per_node;
            if !fits {
                skipped.push(j.id.clone());
            }
            fits
        })
        .collect();
    engine.run(&jobs, progress)?;
    Ok(Run {
        policy: policy.name.clone(),
        nodes: shape.nodes,
        gpus_per_node: shape.gpus_per_node,
        jobs: engine.outcomes,
        samples: engine.samples,
        skipped,
        passes: engine.passes,
        provisioned_gpu_ms: shape.autoscale.map(|_| {
            engine
                .powered_ms
                .saturating_mul(u128::from(shape.gpus_per_node)) as u64
        }),
    })
}

/// Registers node `i` of `shape` at `now`.
fn register(state: &mut State, shape: &Shape, i: u32, now: Millis) -> Result<(), EngineError> {
    let cmd = Command::RegisterNode {
        inventory: shape.inventory(i)?,
        addr: format!("10.{}.{}.{}:7421", i >> 16 & 255, i >> 8 & 255, i & 255),
        preflight: false,
        now,
        cert_sha256: String::new(),
    };
    if let CommandResult::Rejected(r) = apply(state, &cmd) {
        return Err(EngineError::Node {
            node: shape.node_name(i),
            reason: r.to_string(),
        });
    }
    Ok(())
}

/// A started attempt the loop is waiting on.
struct Holding {
    /// Index into the outcomes.
    at: usize,
    attempt: u32,
    gpus: u32,
    /// The allocation's nodes, rank order.
    nodes: Vec<String>,
}

struct Engine<'p> {
    state: State,
    policy: &'p ReplayPolicy,
    shape: Shape,
    now: Millis,
    /// Ends to come: (time, job, attempt, timed out).
    ends: BinaryHeap<Reverse<(Millis, JobId, u32, bool)>>,
    /// Trace index of each submitted job.
    of_job: HashMap<JobId, usize>,
    durations: Vec<Millis>,
    holding: HashMap<JobId, Holding>,
    outcomes: Vec<Outcome>,
    samples: Vec<Sample>,
    busy_gpus: u32,
    passes: u64,
    pass_time: std::time::Duration,
    /// Whether the order of the queue can change with time alone.
    order_drifts: bool,
    may_preempt: bool,
    /// Skip the ticks that cannot start anything (off only to test that).
    skip_ticks: bool,
    /// Autoscaled: nodes asked for, by when they join.
    joins: BinaryHeap<Reverse<(Millis, String)>>,
    /// Since when each group node has been idle (`power_decisions`).
    idle_since: HashMap<String, Millis>,
    /// The last pass's reasons, which the autoscaler reads.
    reasons: crate::sched::PendingReasons,
    /// Node-milliseconds powered (asked for, up or stopping) so far, and
    /// when that was last brought up to date.
    powered_ms: u128,
    powered_at: Millis,
    /// GPUs of the nodes up (all of them, for a fixed fleet).
    up_gpus: u64,
}

impl<'p> Engine<'p> {
    fn new(shape: &Shape, policy: &'p ReplayPolicy) -> Result<Engine<'p>, EngineError> {
        if shape.nodes == 0 || shape.gpus_per_node == 0 {
            return Err(EngineError::EmptyCluster);
        }
        let mut state = State {
            policy: std::sync::Arc::new(policy.policy.clone()),
            ..State::default()
        };
        let up_at_start = match shape.autoscale {
            Some(a) => {
                declare_group(&mut state, shape, a)?;
                a.min
            }
            None => shape.nodes,
        };
        for i in 0..up_at_start {
            register(&mut state, shape, i, 0)?;
        }
        let w = &policy.policy.weights;
        let others = w.job_size != 0 || w.qos != 0 || w.partition != 0;
        let order_drifts = w.fairshare != 0 || (w.age != 0 && others);
        let may_preempt = policy.policy.qos.values().any(|q| !q.preempts.is_empty());
        Ok(Engine {
            state,
            policy,
            shape: shape.clone(),
            now: 0,
            ends: BinaryHeap::new(),
            of_job: HashMap::new(),
            durations: Vec::new(),
            holding: HashMap::new(),
            outcomes: Vec::new(),
            samples: Vec::new(),
            busy_gpus: 0,
            passes: 0,
            pass_time: std::time::Duration::ZERO,
            order_drifts,
            may_preempt,
            skip_ticks: true,
            joins: BinaryHeap::new(),
            idle_since: HashMap::new(),
            reasons: Default::default(),
            powered_ms: 0,
            powered_at: 0,
            up_gpus: u64::from(up_at_start) * u64::from(shape.gpus_per_node),
        })
    }

    fn run(
        &mut self,
        jobs: &[&TraceJob],
        progress: &mut dyn FnMut(&Progress),
    ) -> Result<(), EngineError> {
        let mut next = 0;
        let mut next_tick: Option<Millis> = None;
        let mut steps: u64 = 0;
        loop {
            let arrival = jobs.get(next).map(|j| j.arrival);
            let end = self.ends.peek().map(|Reverse(e)| e.0);
            let join = self.joins.peek().map(|Reverse(j)| j.0);
            // With nothing running and nothing to come, what still waits
            // after the last pass can never start: no tick would change that.
            let idle = arrival.is_none() && end.is_none() && join.is_none();
            let tick = next_tick.filter(|_| !idle && self.state.has_pending());
            let check = self.next_check(idle);
            let Some(t) = [arrival, end, tick, join, check]
                .into_iter()
                .flatten()
                .min()
            else {
                break;
            };
            self.count_powered(t);
            self.now = t;
            let mut changed = false;
            while self.joins.peek().is_some_and(|Reverse(j)| j.0 == t) {
                let Some(Reverse((_, name))) = self.joins.pop() else {
                    break;
                };
                changed |= self.join(&name)?;
            }
            while self.ends.peek().is_some_and(|Reverse(e)| e.0 == t) {
                let Some(Reverse((_, id, attempt, timed_out))) = self.ends.pop() else {
                    break;
                };
                changed |= self.end(id, attempt, timed_out);
            }
            while let Some(job) = jobs.get(next).filter(|j| j.arrival == t) {
                self.submit(job)?;
                next += 1;
                changed = true;
            }
            if changed || (tick == Some(t) && self.tick_may_start()) {
                self.pass()?;
                next_tick = Some(t.saturating_add(self.policy.tick_ms));
            } else if tick == Some(t) {
                next_tick = Some(t.saturating_add(self.policy.tick_ms));
            }
            self.autoscale();
            self.sample();
            steps += 1;
            if steps % 4096 == 0 {
                progress(&self.progress(next, jobs.len()));
            }
        }
        progress(&self.progress(next, jobs.len()));
        Ok(())
    }

    fn progress(&self, arrived: usize, jobs: usize) -> Progress {
        Progress {
            now: self.now,
            arrived,
            jobs,
            pending: self.state.index.pending.len(),
            running: self.holding.len(),
            passes: self.passes,
            pass_time: self.pass_time,
        }
    }

    /// Whether a periodic pass with nothing changed since the last could
    /// start anything (see the module's top comment).
    fn tick_may_start(&self) -> bool {
        if !self.skip_ticks {
            return true;
        }
        if !self.order_drifts {
            return false;
        }
        if self.may_preempt {
            return true;
        }
        let free = self.up_gpus.saturating_sub(u64::from(self.busy_gpus));
        let smallest = self
            .state
            .index
            .pending
            .iter()
            .filter_map(|id| self.of_job.get(id))
            .map(|&i| u64::from(self.outcomes[i].gpus))
            .min();
        smallest.is_some_and(|g| g <= free)
    }

    fn submit(&mut self, job: &TraceJob) -> Result<(), EngineError> {
        let (nodes, per_node) = self.shape.job_shape(job.gpus);
        let mut spec = crate::sim::workload::sim_spec(
            &job.id,
            nodes,
            per_node,
            std::time::Duration::from_millis(job.duration),
            0,
        );
        // Traces give no CPUs: one per task, so CPUs never bind before
        // GPUs whatever --gpus-per-node is.
        spec.cpus_per_task = 1;
        spec.time_limit_secs = Some(match job.limit {
            Some(l) => l.div_ceil(1000).max(1),
            None => self.policy.limit_secs(job.duration),
        });
        let user = if job.user.is_empty() {
            "user".to_string()
        } else {
            job.user.clone()
        };
        let cmd = Command::Submit {
            user,
            spec: Box::new(spec),
            now: self.now,
        };
        match apply(&mut self.state, &cmd) {
            CommandResult::Submitted { id } => {
                self.of_job.insert(id, self.outcomes.len());
                self.durations.push(job.duration);
                self.outcomes.push(Outcome {
                    id: job.id.clone(),
                    user: job.user.clone(),
                    gpus: job.gpus,
                    arrival: job.arrival,
                    start: None,
                    end: None,
                    restarts: 0,
                });
                Ok(())
            }
            other => Err(EngineError::Refused {
                what: "the submission",
                job: job.id.clone(),
                line: job.line,
                reason: format!("{other:?}"),
            }),
        }
    }

    /// One pass, its preemptions and its starts.
    fn pass(&mut self) -> Result<(), EngineError> {
        self.passes += 1;
        let began = std::time::Instant::now();
        let mut plan = {
            let mut input = self.state.sched_input();
            input.rest.backfill = self.policy.backfill;
            crate::sched::plan_ref(&input.view(), self.now, self.policy.packing)
        };
        self.pass_time += began.elapsed();
        if self.shape.autoscale.is_some() {
            self.reasons = crate::sched::PendingReasons::take(&mut plan);
        }
        if !plan.preemptions.is_empty() {
            let cmd = Command::Preempt {
                preemptions: plan.preemptions,
                now: self.now,
            };
            if let CommandResult::Preempted { stopped, .. } = apply(&mut self.state, &cmd) {
                for id in stopped {
                    self.stop(id, TaskEnd::Cancelled);
                }
            }
        }
        if plan.allocations.is_empty() {
            return Ok(());
        }
        let cmd = Command::Schedule {
            allocations: plan.allocations,
            now: self.now,
        };
        let started = match apply(&mut self.state, &cmd) {
            CommandResult::Scheduled { started, .. } => started,
            _ => Vec::new(),
        };
        for id in started {
            self.started(id);
        }
        Ok(())
    }

    /// A job the pass started: its ranks report their start, and its end is
    /// queued.
    fn started(&mut self, id: JobId) {
        let Some(job) = self.state.jobs.get(&id) else {
            return;
        };
        let Some(run) = &job.run else { return };
        let Some(&at) = self.of_job.get(&id) else {
            return;
        };
        let attempt = run.attempt;
        let limit = job.spec.time_limit_secs.unwrap_or(u64::MAX);
        let nodes: Vec<String> = run
            .allocation
            .nodes
            .iter()
            .map(|n| n.node.clone())
            .collect();
        let gpus: u32 = run.allocation.gpus() as u32;
        let duration = self.durations[at];
        let timed_out = duration > limit.saturating_mul(1000);
        let end = self
            .now
            .saturating_add(duration.min(limit.saturating_mul(1000)));
        self.report(id, attempt, &nodes, TaskEventKind::Started);
        self.ends.push(Reverse((end, id, attempt, timed_out)));
        self.busy_gpus += gpus;
        let o = &mut self.outcomes[at];
        if o.start.is_some() {
            o.restarts += 1;
        }
        o.start = Some(self.now);
        self.holding.insert(
            id,
            Holding {
                at,
                attempt,
                gpus,
                nodes,
            },
        );
    }

    /// A queued end: the attempt's ranks end, unless it was stopped first.
    fn end(&mut self, id: JobId, attempt: u32, timed_out: bool) -> bool {
        if self.holding.get(&id).is_none_or(|h| h.attempt != attempt) {
            return false;
        }
        let how = if timed_out {
            TaskEnd::Timeout
        } else {
            TaskEnd::Completed
        };
        self.stop(id, how);
        true
    }

    /// Every rank of `id`'s attempt ends `how`; the job ends or requeues.
    fn stop(&mut self, id: JobId, how: TaskEnd) {
        let Some(h) = self.holding.remove(&id) else {
            return;
        };
        self.report(id, h.attempt, &h.nodes, TaskEventKind::Ended(how));
        self.busy_gpus -= h.gpus;
        let ended = self
            .state
            .jobs
            .get(&id)
            .is_some_and(|j| !j.state.is_active() && j.state != JobState::Pending);
        if ended {
            self.outcomes[h.at].end = Some(self.now);
        }
    }

    /// Each node of the allocation reports `kind` for its rank.
    fn report(&mut self, id: JobId, attempt: u32, nodes: &[String], kind: TaskEventKind) {
        for (rank, node) in nodes.iter().enumerate() {
            let cmd = Command::TaskEvents {
                node: node.clone(),
                events: vec![TaskEvent {
                    key: TaskKey {
                        job: id,
                        attempt,
                        rank: rank as u32,
                        step: None,
                    },
                    kind: kind.clone(),
                }],
                now: self.now,
                gpu_use: Vec::new(),
            };
            apply(&mut self.state, &cmd);
        }
    }

    /// Records the load if it changed.
    fn sample(&mut self) {
        let s = Sample {
            t: self.now,
            busy_gpus: self.busy_gpus,
            pending: self.state.index.pending.len() as u32,
            running: self.holding.len() as u32,
        };
        let same = self.samples.last().is_some_and(|l| {
            (l.busy_gpus, l.pending, l.running) == (s.busy_gpus, s.pending, s.running)
        });
        if !same {
            self.samples.push(s);
        }
    }
}

#[cfg(test)]
mod tests;
