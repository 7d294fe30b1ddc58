//! Indexes over the active jobs, derived from `State::jobs` and kept in step
//! by `apply` from the records each command touched (`Dirty::jobs`). They make
//! the leader's hot reads proportional to what is active, not to every job:
//! the pending queue for a scheduling pass, the jobs on one node for its
//! desired state and for `gpuq nodes`, and a per-node version that changes
//! whenever a job on the node changes, so the desired state is recomputed
//! and pushed only to the agents whose tasks changed.
//!
//! Derived data, never persisted or replicated: `load` and snapshot install
//! rebuild it, and it takes no part in comparing states.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use super::State;
use crate::model::{JobId, JobState};

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
        let index = &mut self.index;
        if let Some(old) = index.nodes_of.remove(&id) {
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
            return;
        };
        if job.state == JobState::Pending {
            index.pending.insert(id);
        } else {
            index.pending.remove(&id);
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
            index.nodes_of.insert(id, nodes);
        }
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
            self.reindex_job(id);
        }
        // Versions only grow, so an agent loop never mistakes a rebuilt
        // index for one it has seen.
        for (n, v) in versions {
            *self.index.version.entry(n).or_insert(0) += v + 1;
        }
    }
}
