//! What `gpuq nodes` and `gpuq cluster` show: each node's usage, and the
//! control plane's members with their health, from this server's applied
//! state and Raft metrics.

use crate::model::JobState;
use crate::net::proto::{ClusterStatus, Member};

use super::{Api, LAGGING_ENTRIES};

impl Api {
    /// A running job's GPU use from its agents, flagged idle past its
    /// QoS's idle time (or the servers' `idle_gpu_secs`; leader only: the
    /// agents report to it); an ended job's as its run kept it.
    pub(in crate::server) fn fill_gpu_use(
        &self,
        job: &mut crate::model::Job,
        policy: &crate::model::Policy,
    ) {
        if job.state != JobState::Running {
            job.gpu_use = job.run.as_ref().and_then(|r| r.gpu_use());
            return;
        }
        let limit = self.idle_limit_secs(job, policy);
        job.gpu_use = self.hub.gpu_use(job.id).map(|mut u| {
            u.idle = limit.is_some_and(|l| u.idle_secs >= l);
            u
        });
    }

    /// How long `job`'s GPUs may sit idle before it is flagged; `None`:
    /// never.
    pub(in crate::server) fn idle_limit_secs(
        &self,
        job: &crate::model::Job,
        policy: &crate::model::Policy,
    ) -> Option<u64> {
        let name = job
            .spec
            .qos
            .as_deref()
            .unwrap_or(crate::model::policy::DEFAULT_QOS);
        // Borrowed, not `Policy::qos`'s copy: this runs per running job of
        // every listing. A QoS not in the map (the built-in) sets nothing.
        match policy.qos.get(name) {
            Some(q) => q.idle_limit_secs(self.cfg.idle_gpu_secs),
            None => Some(self.cfg.idle_gpu_secs).filter(|&s| s > 0),
        }
    }

    pub(super) fn nodes(&self) -> Vec<crate::net::proto::NodeInfo> {
        let alive: std::collections::HashSet<String> = self.hub.alive().into_iter().collect();
        let s = self.state();
        // The index's views, not views built afresh: at 10,000 nodes that
        // copied every inventory while holding the state's lock.
        s.nodes
            .iter()
            .map(|(name, n)| {
                let v = s.node_view(name);
                let why = n.status.reason();
                // Shown with who set it, as before the name was kept apart.
                let reason = why.map(|(reason, user, _)| match user {
                    Some(u) => format!("{reason} (by {u})"),
                    None => reason.to_string(),
                });
                crate::net::proto::NodeInfo {
                    name: n.inventory.name.clone(),
                    state: n.status.word().to_string(),
                    reason,
                    reason_user: why.and_then(|(_, user, _)| user.map(str::to_string)),
                    reason_since: why.map(|(_, _, since)| since).filter(|&s| s > 0),
                    addr: n.addr.clone(),
                    connected: alive.contains(&n.inventory.name),
                    gpus_used: v.map(|v| v.used.gpus.len() as u32).unwrap_or(0),
                    cpus_used: v.map(|v| v.used.cpus).unwrap_or(0),
                    memory_used_mb: v.map(|v| v.used.memory_mb).unwrap_or(0),
                    running_jobs: crate::server::agents::running_jobs_on(&s, &n.inventory.name)
                        as u32,
                    inventory: n.inventory.clone(),
                }
            })
            .collect()
    }

    pub(super) fn cluster_status(&self) -> ClusterStatus {
        let m = self.node.raft.metrics().borrow().clone();
        let membership = m.membership_config.membership();
        let voters: std::collections::BTreeSet<u64> = membership.voter_ids().collect();
        let matched = m.replication.clone().unwrap_or_default();
        let leading = m.current_leader == Some(m.id);
        let unreachable_ms = 2 * self.cfg.raft.election_timeout_max_ms;
        let members = membership
            .nodes()
            .map(|(id, n)| {
                let matched_index = matched
                    .get(id)
                    .and_then(|l| l.as_ref().map(|l| l.index))
                    .or(if *id == m.id { m.last_log_index } else { None });
                let me = *id == m.id;
                let (lag, last_contact_ms, problem) = if !leading {
                    (None, None, None)
                } else if me {
                    (Some(0), Some(0), None)
                } else {
                    let lag = m
                        .last_log_index
                        .map(|last| last.saturating_sub(matched_index.unwrap_or(0)));
                    let contact = self.contacts.since_ms(*id);
                    let problem = match contact {
                        None => Some("unreachable: never answered".to_string()),
                        Some(ms) if ms > unreachable_ms => Some(format!(
                            "unreachable: no answer for {:.1} s",
                            ms as f64 / 1000.0
                        )),
                        _ => match lag {
                            Some(l) if l > LAGGING_ENTRIES => {
                                Some(format!("lagging by {l} entries"))
                            }
                            _ => None,
                        },
                    };
                    (lag, contact, problem)
                };
                Member {
                    id: *id,
                    name: n.name.clone(),
                    addr: n.addr.clone(),
                    voter: voters.contains(id),
                    leader: m.current_leader == Some(*id),
                    matched_index,
                    lag,
                    last_contact_ms,
                    problem,
                }
            })
            .collect();
        let leader = m
            .current_leader
            .and_then(|l| membership.get_node(&l).map(|n| n.name.clone()));
        let s = self.state();
        let counts = s.count_by_state();
        let stats = &self.node.stats;
        ClusterStatus {
            cluster_name: s
                .cluster
                .as_ref()
                .map(|c| c.name.clone())
                .unwrap_or_else(|| self.cfg.cluster_name.clone()),
            answered_by: self.cfg.node_name.clone(),
            leader,
            term: m.current_term,
            last_log_index: m.last_log_index,
            applied_index: m.last_applied.map(|l| l.index),
            snapshot_index: m.snapshot.map(|l| l.index),
            purged_index: m.purged.map(|l| l.index),
            members,
            jobs: JobState::ALL
                .iter()
                .filter_map(|st| {
                    counts
                        .get(st.as_str())
                        .map(|n| (st.as_str().to_string(), *n))
                })
                .collect(),
            log_entries_written: stats.entries.load(std::sync::atomic::Ordering::Relaxed),
            log_write_txns: stats
                .appends_txns
                .load(std::sync::atomic::Ordering::Relaxed),
            proposed_commands: self
                .proposer
                .stats
                .commands
                .load(std::sync::atomic::Ordering::Relaxed),
            proposed_entries: self
                .proposer
                .stats
                .entries
                .load(std::sync::atomic::Ordering::Relaxed),
        }
    }
}
