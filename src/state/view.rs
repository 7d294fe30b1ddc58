//! Read views of the state for the scheduler and for dispatch: node capacity
//! and usage, pending jobs, and the tasks each node should be running. Each
//! reads the active-job indexes (`index`), so its cost follows what is
//! pending or running, not every job the state holds; a scheduling pass
//! borrows the nodes and pending jobs the index keeps (`sched_input`).

use std::collections::{BTreeMap, BTreeSet, HashMap};

use super::index::node_state;
use super::State;
use crate::model::{Job, JobId, JobState};
use crate::sched::{
    ArrayThrottle, BackfillConfig, ClusterView, NodeView, PendingJob, RunningJob, Usage, ViewRef,
};

impl State {
    /// Node `name` with what active jobs use on it, as the index keeps it
    /// (in step with every applied command; no copy).
    pub fn node_view(&self, name: &str) -> Option<&NodeView> {
        self.index.node_views.get(name)
    }

    /// Every node with what active jobs use on it, in name order, built
    /// from the records (the index's are [`State::node_view`]).
    pub fn node_views(&self) -> Vec<NodeView> {
        let mut views: Vec<NodeView> = self
            .nodes
            .values()
            .map(|n| NodeView {
                name: n.inventory.name.clone(),
                inventory: n.inventory.clone(),
                state: node_state(&n.status),
                used: Usage::default(),
            })
            .collect();
        let at: HashMap<&str, usize> = self
            .nodes
            .values()
            .enumerate()
            .map(|(i, n)| (n.inventory.name.as_str(), i))
            .collect();
        for id in self.index.holding() {
            let Some(run) = self.jobs.get(&id).and_then(|j| j.run.as_ref()) else {
                continue;
            };
            for (rank, na) in run.allocation.nodes.iter().enumerate() {
                if let Some(&i) = at.get(na.node.as_str()) {
                    views[i].used.charge(na);
                    // Rank 0 holds one of the node's MASTER_PORTs.
                    if rank == 0 {
                        views[i].used.master_ports += 1 + run.named_ports.len() as u32;
                    }
                }
            }
        }
        views
    }

    /// What the scheduler needs for one pass: nodes, pending jobs with what
    /// keeps them back outside the scheduler (holds, dependencies, array
    /// throttles, singletons), and running jobs with their expected ends.
    /// An owned copy of [`State::sched_input`], for readers that keep or
    /// change it.
    pub fn cluster_view(&self) -> ClusterView {
        let input = self.sched_input();
        let v = input.view();
        ClusterView {
            nodes: v.nodes.into_iter().cloned().collect(),
            pending: v.pending.into_iter().cloned().collect(),
            ..input.rest.clone()
        }
    }

    /// The input of a scheduling pass, with the nodes and pending jobs
    /// borrowed from the index (which keeps them between passes) instead of
    /// built: per pass only the running jobs, the policy, and the pending
    /// jobs that a hold, a dependency or an array throttle keeps back are
    /// worked out. `sched::plan_ref(&input.view(), ..)` runs the pass.
    pub fn sched_input(&self) -> SchedInput<'_> {
        #[cfg(any(test, debug_assertions))]
        self.check_view_cache();
        let backfill = BackfillConfig::default();
        let mut running = Vec::new();
        let mut active = Vec::new();
        for job in self.index.holding().filter_map(|id| self.jobs.get(&id)) {
            active.extend(super::policy::active_job(job));
            if let (Some(run), Some(start)) = (&job.run, job.start_time) {
                let limit = job
                    .spec
                    .time_limit_secs
                    .unwrap_or(backfill.default_time_limit_secs);
                running.push(RunningJob {
                    id: job.id,
                    allocation: run.allocation.clone(),
                    expected_end: Some(start.saturating_add(limit.saturating_mul(1000))),
                });
            }
        }
        // Only jobs flagged in the index depend on others; the sets they
        // are checked against are built only when there is one.
        let mut others: Option<HoldingSets> = None;
        let mut fixed = Vec::new();
        let mut pending = Vec::with_capacity(self.index.queued.len());
        for (p, derived) in self.index.queued.iter() {
            // Most jobs are not derived: they skip the lookup of the job.
            let Some(job) = derived.then(|| self.jobs.get(&p.id)).flatten() else {
                pending.push((p, None));
                continue;
            };
            let (names, array_running) = others.get_or_insert_with(|| self.holding_sets());
            let blocked = self.blocked_reason(job, names);
            let array_throttle = job.array.and_then(|a| {
                let limit = a.throttle?;
                let used = array_running.get(&a.array_job).copied().unwrap_or(0);
                Some(ArrayThrottle {
                    array: a.array_job,
                    slots: limit.saturating_sub(used),
                })
            });
            if blocked.is_none() && array_throttle.is_none() {
                pending.push((p, None));
                continue;
            }
            let mut copy = p.clone();
            copy.blocked = blocked;
            copy.array_throttle = array_throttle;
            pending.push((p, Some(fixed.len())));
            fixed.push(copy);
        }
        let (starting, holds) = self.starting_nodes();
        running.extend(holds);
        SchedInput {
            rest: ClusterView {
                nodes: Vec::new(),
                pending: Vec::new(),
                running,
                backfill,
                master_ports: Some(self.master_ports().len()),
                policy: self.policy_view_of(active),
            },
            nodes: self.index.node_views.values().collect(),
            starting,
            pending,
            fixed,
        }
    }

    /// Nodes node groups were asked for that have not registered: each a
    /// node of its group's shape, held whole until the group's resume
    /// timeout by a stand-in running job, so backfill's timeline counts on
    /// it from then (a blocked job's expected start may be there) and
    /// nothing is placed on it before it joins.
    fn starting_nodes(&self) -> (Vec<NodeView>, Vec<RunningJob>) {
        let mut nodes = Vec::new();
        let mut holds = Vec::new();
        let starting = self.power.iter().filter(|(n, p)| {
            p.state == crate::model::PowerState::Resuming && !self.nodes.contains_key(*n)
        });
        for (k, (name, p)) in starting.enumerate() {
            let Some(g) = self.policy.node_groups.get(&p.group) else {
                continue;
            };
            let gpus: Vec<u32> = (0..g.gpus).collect();
            let inventory = crate::model::NodeInventory {
                name: name.clone(),
                gpus: gpus
                    .iter()
                    .map(|&index| crate::model::GpuInfo {
                        index,
                        uuid: format!("{name}-starting-{index}"),
                        model: String::new(),
                        memory_mb: 0,
                        pci_bus_id: String::new(),
                        numa_node: None,
                        healthy: true,
                        fault: None,
                        mig: None,
                    })
                    .collect(),
                gpu_links: crate::model::nvswitch_links(gpus.len()),
                numa: Vec::new(),
                cpus: g.cpus,
                memory_mb: g.memory_mb,
                topology: String::new(),
                features: g.features.clone(),
            };
            let whole = crate::model::NodeAllocation {
                node: name.clone(),
                gpus: gpus.clone(),
                cpus: Vec::new(),
                cpu_count: g.cpus,
                memory_mb: g.memory_mb,
            };
            let mut view = NodeView::new(inventory, crate::sched::NodeState::Up);
            view.used.charge(&whole);
            // Ids no job has: counted down from the top.
            let id = JobId(u64::MAX - k as u64);
            holds.push(RunningJob {
                id,
                allocation: std::sync::Arc::new(crate::model::Allocation {
                    job: id,
                    nodes: vec![whole],
                }),
                expected_end: Some(
                    p.since
                        .saturating_add(g.resume_timeout_secs.saturating_mul(1000)),
                ),
            });
            nodes.push(view);
        }
        (nodes, holds)
    }

    /// The (user, name) pairs of jobs holding resources (for singletons)
    /// and the running tasks per array (for throttles).
    fn holding_sets(&self) -> HoldingSets<'_> {
        let mut names = BTreeSet::new();
        let mut array_running: BTreeMap<JobId, u32> = BTreeMap::new();
        for job in self.index.holding().filter_map(|id| self.jobs.get(&id)) {
            names.insert((job.user.as_str(), job.spec.name.as_str()));
            if let Some(a) = job.array {
                *array_running.entry(a.array_job).or_default() += 1;
            }
        }
        (names, array_running)
    }

    /// Debug and test builds check on every pass that the views the index
    /// keeps are what building them from the whole state gives, so every
    /// test that schedules checks the incremental upkeep.
    #[cfg(any(test, debug_assertions))]
    fn check_view_cache(&self) {
        let kept: Vec<&NodeView> = self.index.node_views.values().collect();
        let built = self.node_views();
        assert!(
            kept.len() == built.len() && kept.iter().zip(&built).all(|(a, b)| *a == b),
            "the index's node views are out of step with the state"
        );
        self.index.queued.check();
        let mut ids: Vec<JobId> = self.index.queued.iter().map(|(p, _)| p.id).collect();
        ids.sort_unstable();
        assert!(
            ids.iter().eq(self.index.pending.iter()),
            "the index's queued jobs are not the pending ones"
        );
        for (p, derived) in self.index.queued.iter() {
            let fresh = super::index::queued(&self.jobs[&p.id]);
            assert!(
                (p, derived) == (&fresh.0, fresh.1),
                "the index's view of job {} is stale",
                p.id
            );
        }
    }

    /// The jobs with ranks that `node` should be running now, with the node's
    /// rank in each. Only RUNNING jobs: ranks of a COMPLETING job are stopped.
    pub fn desired_on(&self, node: &str) -> Vec<(&Job, u32)> {
        self.jobs_on(node)
            .filter(|j| j.state == JobState::Running)
            .filter_map(|j| {
                // An elastic job changing size runs nothing until it has.
                let run = j.run.as_ref().filter(|r| r.resize.is_none())?;
                let rank = run.allocation.nodes.iter().position(|n| n.node == node)?;
                Some((j, rank as u32))
            })
            .collect()
    }
}

/// The (user, name) pairs of jobs holding resources, and running tasks per
/// array (see `State::holding_sets`).
type HoldingSets<'s> = (BTreeSet<(&'s str, &'s str)>, BTreeMap<JobId, u32>);

/// What [`State::sched_input`] gives a pass: the nodes and pending jobs
/// borrowed from the state, the rest built for this pass.
pub struct SchedInput<'s> {
    /// Running jobs, backfill's knobs, ports and policy (no nodes or
    /// pending jobs: those are borrowed).
    pub rest: ClusterView,
    nodes: Vec<&'s NodeView>,
    /// Nodes node groups are starting (see [`State::starting_nodes`]).
    starting: Vec<NodeView>,
    /// In no particular order; `Some(i)`: this pass's copy `fixed[i]` stands in for
    /// it (it is held, waits on dependencies or has an array throttle).
    pending: Vec<(&'s PendingJob, Option<usize>)>,
    fixed: Vec<PendingJob>,
}

impl SchedInput<'_> {
    /// The pass's input as the scheduler reads it.
    pub fn view(&self) -> ViewRef<'_> {
        ViewRef {
            nodes: self.nodes.iter().copied().chain(&self.starting).collect(),
            pending: self
                .pending
                .iter()
                .map(|&(p, f)| f.map_or(p, |i| &self.fixed[i]))
                .collect(),
            rest: &self.rest,
        }
    }
}
