//! What `gpuq nodes` and `gpuq cluster` show: each node's usage, and the
//! control plane's members with their health, from this server's applied
//! state and Raft metrics.

use crate::model::reservation::maint_on;
use crate::model::{JobState, PowerState};
use crate::net::proto::{ClusterStatus, Member};
use crate::state::NodeStatus;

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
        let now = crate::clock::now_ms();
        // The index's views, not views built afresh: at 10,000 nodes that
        // copied every inventory while holding the state's lock.
        s.nodes
            .iter()
            .map(|(name, n)| {
                let v = s.node_view(name);
                let why = n.status.reason();
                // Shown with who set it, as before the name was kept apart.
                let mut reason = why.map(|(reason, user, _)| match user {
                    Some(u) => format!("{reason} (by {u})"),
                    None => reason.to_string(),
                });
                let mut state = n.status.word();
                // An up node in an open maintenance window is drained by it.
                let maint = maint_on(s.policy.reservations.values(), name, now);
                if let (Some(r), NodeStatus::Up) = (maint, &n.status) {
                    state = "maint";
                    reason = Some(format!(
                        "maintenance reservation {} until {}",
                        r.name,
                        crate::clock::fmt_time(r.end)
                    ));
                }
                // A group's node shows where it is in its power cycle.
                if let Some(p) = s.power.get(name).filter(|p| p.state != PowerState::Up) {
                    state = p.state.as_str();
                    reason = Some(power_reason(p));
                }
                crate::net::proto::NodeInfo {
                    name: n.inventory.name.clone(),
                    state: state.to_string(),
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
            .chain(
                // Nodes asked for that have not registered yet.
                s.power
                    .iter()
                    .filter(|(name, _)| !s.nodes.contains_key(*name))
                    .map(|(name, p)| crate::net::proto::NodeInfo {
                        name: name.clone(),
                        state: p.state.as_str().to_string(),
                        reason: Some(power_reason(p)),
                        reason_user: None,
                        reason_since: Some(p.since),
                        addr: String::new(),
                        connected: false,
                        gpus_used: 0,
                        cpus_used: 0,
                        memory_used_mb: 0,
                        running_jobs: 0,
                        inventory: shape_of(name, s.policy.node_groups.get(&p.group)),
                    }),
            )
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

/// Why a group's node is where it is in its power cycle, for `gpuq nodes`.
fn power_reason(p: &crate::model::PowerRecord) -> String {
    let verb = match p.state {
        PowerState::Resuming => "asked for",
        PowerState::Up => "up",
        PowerState::Suspending => "idle; being stopped",
        PowerState::Suspended => "idle; stopped",
        PowerState::Failed => "did not come when asked for",
    };
    format!(
        "{verb} by node group {} at {}",
        p.group,
        crate::clock::fmt_time(p.since)
    )
}

/// What a node of `group` will have, for a node that has not registered:
/// its CPUs, memory and features (its GPUs are known once it registers).
fn shape_of(name: &str, group: Option<&crate::model::NodeGroup>) -> crate::model::NodeInventory {
    crate::model::NodeInventory {
        name: name.to_string(),
        gpus: Vec::new(),
        gpu_links: Vec::new(),
        numa: Vec::new(),
        cpus: group.map_or(0, |g| g.cpus),
        memory_mb: group.map_or(0, |g| g.memory_mb),
        topology: String::new(),
        features: group.map(|g| g.features.clone()).unwrap_or_default(),
    }
}
