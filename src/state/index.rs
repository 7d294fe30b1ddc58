//! Indexes over the active jobs, derived from `State::jobs` and kept in step
//! by `apply` from the records each command touched (`Dirty::jobs`). They make
//! the leader's hot reads proportional to what is active, not to every job:
//! the pending queue for a scheduling pass, the jobs on one node for its
//! desired state and for `gpuq nodes`, and a per-node version that changes
//! whenever a job on the node changes, so the desired state is recomputed
//! and pushed only to the agents whose tasks changed.
//!
//! They also keep what a scheduling pass reads of the active jobs and nodes
//! (`ClusterView`'s nodes and pending jobs) between passes, rebuilt per job
//! and per node as apply touches them, so a pass borrows them instead of
//! building 100,000 pending jobs and 10,000 node inventories from the whole
//! state each time (see `State::sched_input`).
//!
//! Derived data, never persisted or replicated: `load` and snapshot install
//! rebuild it, and it takes no part in comparing states.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use rustc_hash::FxHashMap;

use super::{NodeStatus, State};
use crate::model::{DependencyKind, Job, JobId, JobState};
use crate::sched::{NodeState, NodeView, PendingJob, Usage};

/// Active-job indexes (see the module comment).
#[derive(Clone, Debug, Default)]
pub struct ActiveIndex {
    /// Jobs in PENDING, in id order.
    pub pending: BTreeSet<JobId>,
    /// Per node, the RUNNING or COMPLETING jobs with ranks there.
    on_node: HashMap<String, BTreeSet<JobId>>,
    /// The nodes each job in `on_node` is recorded under (ordered, so readers
    /// that sum over it do so in one order on every server).
    nodes_of: BTreeMap<JobId, Vec<String>>,
    /// Bumped whenever a job with ranks on the node changes.
    version: HashMap<String, u64>,
    /// Each job in `pending` as a pass sees it (see [`Queued`]).
    pub(super) queued: Queued,
    /// Every node as a pass sees it (inventory, state, what active jobs use
    /// there), by name: rebuilt when its record or a job on it changes.
    pub(super) node_views: BTreeMap<String, NodeView>,
}

impl PartialEq for ActiveIndex {
    /// Always equal: the index is a function of the jobs it indexes.
    fn eq(&self, _: &ActiveIndex) -> bool {
        true
    }
}

impl Eq for ActiveIndex {}

impl ActiveIndex {
    /// The RUNNING or COMPLETING jobs with ranks on `node`.
    pub fn jobs_on(&self, node: &str) -> impl Iterator<Item = JobId> + '_ {
        self.on_node.get(node).into_iter().flatten().copied()
    }

    /// A number that changes whenever a job with ranks on `node` changes.
    pub fn node_version(&self, node: &str) -> u64 {
        self.version.get(node).copied().unwrap_or(0)
    }

    /// Every job holding resources (RUNNING or COMPLETING), once each.
    pub fn holding(&self) -> impl Iterator<Item = JobId> + '_ {
        self.nodes_of.keys().copied()
    }
}

impl State {
    /// Brings the indexes in step with job `id` as it is now.
    pub(super) fn reindex_job(&mut self, id: JobId) {
        let touched = self.reindex_job_only(id);
        for n in touched {
            self.refresh_node_view(&n);
        }
    }

    /// [`State::reindex_job`] but for the node views: returns the nodes
    /// whose usage may have changed.
    fn reindex_job_only(&mut self, id: JobId) -> Vec<String> {
        let index = &mut self.index;
        let mut touched = Vec::new();
        if let Some(old) = index.nodes_of.remove(&id) {
            touched.extend(old.iter().cloned());
            for n in old {
                *index.version.entry(n.clone()).or_insert(0) += 1;
                if let Some(set) = index.on_node.get_mut(&n) {
                    set.remove(&id);
                    if set.is_empty() {
                        index.on_node.remove(&n);
                    }
                }
            }
        }
        let Some(job) = self.jobs.get(&id) else {
            index.pending.remove(&id);
            index.queued.remove(id);
            return touched;
        };
        if job.state == JobState::Pending {
            index.pending.insert(id);
            let (p, derived) = queued(job);
            index.queued.insert(p, derived);
        } else {
            index.pending.remove(&id);
            index.queued.remove(id);
        }
        if matches!(job.state, JobState::Running | JobState::Completing) {
            let nodes: Vec<String> = job
                .run
                .iter()
                .flat_map(|run| run.allocation.nodes.iter().map(|n| n.node.clone()))
                .collect();
            for n in &nodes {
                *index.version.entry(n.clone()).or_insert(0) += 1;
                index.on_node.entry(n.clone()).or_default().insert(id);
            }
            touched.extend(nodes.iter().cloned());
            index.nodes_of.insert(id, nodes);
        }
        touched.sort();
        touched.dedup();
        touched
    }

    /// Brings the view of node `name` in step with its record and the jobs
    /// on it (or drops it, if the node is gone).
    pub(super) fn refresh_node_view(&mut self, name: &str) {
        match self.build_node_view(name) {
            Some(v) => {
                self.index.node_views.insert(name.to_string(), v);
            }
            None => {
                self.index.node_views.remove(name);
            }
        }
    }

    /// Node `name` as a pass sees it, from its record and the active jobs
    /// with ranks there.
    fn build_node_view(&self, name: &str) -> Option<NodeView> {
        let n = self.nodes.get(name)?;
        let mut used = Usage::default();
        for id in self.index.jobs_on(name) {
            let Some(run) = self.jobs.get(&id).and_then(|j| j.run.as_ref()) else {
                continue;
            };
            for (rank, na) in run.allocation.nodes.iter().enumerate() {
                if na.node == name {
                    used.charge(na);
                    // Rank 0 holds one of the node's MASTER_PORTs.
                    if rank == 0 {
                        used.master_ports += 1 + run.named_ports.len() as u32;
                    }
                }
            }
        }
        Some(NodeView {
            name: n.inventory.name.clone(),
            inventory: n.inventory.clone(),
            state: node_state(&n.status),
            used,
        })
    }

    /// Rebuilds every index from `jobs` (after loading or installing).
    pub fn rebuild_index(&mut self) {
        let versions = std::mem::take(&mut self.index.version);
        self.rebuild_index_after(versions);
    }

    /// Takes the place of `old` (installing a snapshot): the indexes are
    /// rebuilt with every node version above what `old` had.
    pub fn succeed(&mut self, old: &State) {
        self.rebuild_index_after(old.index.version.clone());
    }

    fn rebuild_index_after(&mut self, versions: HashMap<String, u64>) {
        self.index = ActiveIndex::default();
        let ids: Vec<JobId> = self.jobs.keys().copied().collect();
        for id in ids {
            self.reindex_job_only(id);
        }
        let names: Vec<String> = self.nodes.keys().cloned().collect();
        for n in names {
            self.refresh_node_view(&n);
        }
        // Versions only grow, so an agent loop never mistakes a rebuilt
        // index for one it has seen.
        for (n, v) in versions {
            *self.index.version.entry(n).or_insert(0) += v + 1;
        }
    }
}

/// The pending jobs as a pass sees them, less what depends on other jobs
/// (holds and dependencies, array throttles), which a pass fills in for the
/// jobs flagged `derived`.
///
/// One dense vector in no particular order (a removal moves the last job
/// into the gap), because every pass reads all of it: walking 100,000
/// records of about 400 bytes in a B-tree missed the cache on nearly every
/// job, where a vector streams. The queue's order comes from sorting by
/// priority and id, never from this order.
#[derive(Clone, Debug, Default)]
pub(super) struct Queued {
    jobs: Vec<PendingJob>,
    /// Per job of `jobs`: whether a pass derives its hold, dependencies or
    /// throttle.
    derived: Vec<bool>,
    /// Position in `jobs` by id.
    at: FxHashMap<JobId, usize>,
}

impl Queued {
    /// Adds or replaces the job `p.id`.
    fn insert(&mut self, p: PendingJob, derived: bool) {
        match self.at.get(&p.id) {
            Some(&i) => {
                self.jobs[i] = p;
                self.derived[i] = derived;
            }
            None => {
                self.at.insert(p.id, self.jobs.len());
                self.jobs.push(p);
                self.derived.push(derived);
            }
        }
    }

    fn remove(&mut self, id: JobId) {
        let Some(i) = self.at.remove(&id) else {
            return;
        };
        self.jobs.swap_remove(i);
        self.derived.swap_remove(i);
        if let Some(moved) = self.jobs.get(i) {
            self.at.insert(moved.id, i);
        }
    }

    pub(super) fn len(&self) -> usize {
        self.jobs.len()
    }

    /// Test and debug builds: every position map entry points at its job
    /// (a stale one would make a later removal take out the wrong job).
    #[cfg(any(test, debug_assertions))]
    pub(super) fn check(&self) {
        assert_eq!(
            self.jobs.len(),
            self.derived.len(),
            "queued flags out of step"
        );
        assert_eq!(
            self.at.len(),
            self.jobs.len(),
            "queued positions out of step"
        );
        for (i, p) in self.jobs.iter().enumerate() {
            assert_eq!(
                self.at.get(&p.id),
                Some(&i),
                "queued position of job {}",
                p.id
            );
        }
    }

    /// Every job with its `derived` flag, in no particular order.
    pub(super) fn iter(&self) -> impl Iterator<Item = (&PendingJob, bool)> {
        self.jobs.iter().zip(self.derived.iter().copied())
    }
}

/// A pending job as a pass sees it, and whether a pass must fill in what
/// depends on other jobs: its hold or dependencies, its array's throttle.
pub(super) fn queued(job: &Job) -> (PendingJob, bool) {
    let mut p = PendingJob::from(job);
    let deps = &job.spec.queue.dependency;
    p.singleton = deps
        .iter()
        .any(|d| d.kind == DependencyKind::Singleton)
        .then(|| job.spec.name.clone());
    let derived = job.held || !deps.is_empty() || job.array.is_some_and(|a| a.throttle.is_some());
    (p, derived)
}

/// What the scheduler sees of a node's status.
pub(crate) fn node_state(status: &NodeStatus) -> NodeState {
    match status {
        NodeStatus::Up => NodeState::Up,
        NodeStatus::Drained { .. } => NodeState::Drained,
        NodeStatus::Down { .. } => NodeState::Down,
    }
}
