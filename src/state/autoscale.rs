//! What the leader decides for node groups (`gpuq admin nodegroup`) from
//! the state at a time: nodes to ask for, nodes given up on, idle nodes
//! to stop. Pure (the time and how long nodes have been idle are passed
//! in), so the leader's loop (`server::autoscale`) and a replay in virtual
//! time (`sim::replay`) decide alike. See the server's loop for the rules.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use super::{NodeStatus, State};
use crate::model::hostlist::compress_hostlist;
use crate::model::{JobId, JobState, Millis, NodeGroup, PowerChange, PowerState};

/// What one look at the groups decided.
#[derive(Default)]
pub struct PowerDecisions {
    pub changes: Vec<PowerChange>,
    /// Jobs that wait for nodes of a group now starting.
    pub starting_for: BTreeMap<JobId, String>,
}

/// The tick's decisions for every group, from the state at `now`.
pub fn power_decisions(
    state: &State,
    now: Millis,
    waiting: &dyn Fn(JobId) -> bool,
    idle_since: &mut HashMap<String, Millis>,
) -> PowerDecisions {
    let mut out = PowerDecisions::default();
    let busy: BTreeSet<&str> = state
        .index
        .holding()
        .filter_map(|id| state.jobs.get(&id)?.run.as_ref())
        .flat_map(|run| run.allocation.nodes.iter().map(|n| n.node.as_str()))
        .collect();
    for g in state.policy.node_groups.values() {
        let of_group: Vec<(&String, PowerState, u64)> = state
            .power
            .iter()
            .filter(|(_, r)| r.group == g.name)
            .map(|(n, r)| (n, r.state, r.since))
            .collect();
        // Given up on: asked for and not joined in time.
        let late: Vec<String> = of_group
            .iter()
            .filter(|(_, s, since)| {
                *s == PowerState::Resuming
                    && now.saturating_sub(*since) > g.resume_timeout_secs.saturating_mul(1000)
            })
            .map(|(n, _, _)| (*n).clone())
            .collect();
        if !late.is_empty() {
            out.changes.push(PowerChange::Failed {
                why: format!(
                    "{} did not join within {}s of being asked for; asking again",
                    compress_hostlist(&late),
                    g.resume_timeout_secs
                ),
                nodes: late.clone(),
            });
        }
        let starting: Vec<&String> = of_group
            .iter()
            .filter(|(n, s, _)| *s == PowerState::Resuming && !late.contains(n))
            .map(|(n, _, _)| *n)
            .collect();
        let up: Vec<&String> = of_group
            .iter()
            .filter(|(n, s, _)| {
                *s == PowerState::Up
                    && state
                        .nodes
                        .get(*n)
                        .is_some_and(|r| matches!(r.status, NodeStatus::Up))
            })
            .map(|(n, _, _)| *n)
            .collect();
        let idle: Vec<&String> = up
            .iter()
            .copied()
            .filter(|n| !busy.contains(n.as_str()))
            .collect();
        for n in &up {
            if busy.contains(n.as_str()) {
                idle_since.remove(n.as_str());
            } else {
                idle_since.entry(n.to_string()).or_insert(now);
            }
        }

        let demand = demand(state, g, now, waiting);
        let need = nodes_for(g, &demand);
        let have = starting.len() + idle.len();
        let active = of_group
            .iter()
            .filter(|(n, s, _)| {
                !matches!(s, PowerState::Suspended | PowerState::Failed) && !late.contains(n)
            })
            .count();
        let room = (g.max as usize).saturating_sub(active);
        let ask = need.saturating_sub(have).min(room);
        if ask > 0 {
            let names = pick_names(state, g, ask);
            if !names.is_empty() {
                tracing::info!(
                    group = %g.name,
                    "{} pending job(s) fit group {}: asking for {} node(s) ({})",
                    demand.len(),
                    g.name,
                    names.len(),
                    compress_hostlist(&names)
                );
                out.changes.push(PowerChange::Resume {
                    group: g.name.clone(),
                    nodes: names,
                });
            }
        }
        if !starting.is_empty() || ask > 0 {
            for d in &demand {
                out.starting_for.insert(d.id, g.name.clone());
            }
        }
        // Shrink: idle past the time, nothing waiting for the group. Only
        // a group that can stop its nodes: one with no suspend command
        // keeps them.
        if demand.is_empty() && starting.is_empty() && g.suspend_command.is_some() {
            let mut spare = active.saturating_sub(g.min as usize);
            let mut stop = Vec::new();
            let limit = g.idle_secs.saturating_mul(1000);
            for n in idle.iter().rev() {
                if spare == 0 {
                    break;
                }
                if idle_since
                    .get(n.as_str())
                    .is_some_and(|&t| now.saturating_sub(t) >= limit)
                {
                    stop.push((*n).clone());
                    spare -= 1;
                }
            }
            if !stop.is_empty() {
                tracing::info!(
                    group = %g.name,
                    "suspending {} idle for {}s",
                    compress_hostlist(&stop),
                    g.idle_secs
                );
                for n in &stop {
                    idle_since.remove(n);
                }
                out.changes.push(PowerChange::Suspend { nodes: stop });
            }
        }
    }
    out
}

/// A pending job the group could run, as whole nodes of its shape.
struct Demand {
    id: JobId,
    nodes: u32,
    gpus_per_node: u32,
}

/// Jobs pending for the group's `demand_secs`, waiting for capacity, whose
/// nodes its nodes could be and whose per-node share one of them holds.
fn demand(
    state: &State,
    g: &NodeGroup,
    now: Millis,
    waiting: &dyn Fn(JobId) -> bool,
) -> Vec<Demand> {
    let old_enough = now.saturating_sub(g.demand_secs.saturating_mul(1000));
    let sample = g.node_name(1);
    state
        .index
        .pending
        .iter()
        .filter_map(|id| state.jobs.get(id))
        .filter(|j| j.state == JobState::Pending && !j.held && j.submit_time <= old_enough)
        .filter(|j| waiting(j.id))
        .filter_map(|j| {
            let s = &j.spec;
            let p = &s.placement;
            // Jobs tied to other nodes, or to GPUs a group does not
            // describe, are not the group's to serve.
            if !p.nodelist.is_empty()
                || p.gpu_type.is_some()
                || p.gpu_slice.is_some()
                || p.reservation.is_some()
                || p.exclude.iter().any(|x| x == &sample)
            {
                return None;
            }
            let in_partition = s
                .partition
                .as_deref()
                .and_then(|name| state.policy.partition(name))
                .and_then(|part| part.node_set())
                .is_none_or(|set| set.contains(&sample));
            if !in_partition {
                return None;
            }
            let (nodes, gpus) = match s.total_gpus {
                Some(t) if g.gpus > 0 && t > g.gpus && t % g.gpus == 0 => (t / g.gpus, g.gpus),
                Some(t) => (1, t),
                None => (s.nodes, s.gpus_per_node),
            };
            let cpus = u64::from(s.ntasks_per_node) * u64::from(s.cpus_per_task);
            let mem = s.mem_per_node_mb.unwrap_or(0);
            (nodes <= g.max && g.holds(gpus, cpus, mem, &p.features)).then_some(Demand {
                id: j.id,
                nodes,
                gpus_per_node: gpus,
            })
        })
        .collect()
}

/// Whole nodes of `g` that `demand` needs: enough for its GPUs (a node
/// per job for CPU-only work), and at least its widest gang.
fn nodes_for(g: &NodeGroup, demand: &[Demand]) -> usize {
    let widest = demand.iter().map(|d| d.nodes as usize).max().unwrap_or(0);
    let by_gpus = if g.gpus == 0 {
        demand.iter().map(|d| d.nodes as usize).sum()
    } else {
        let gpus: u64 = demand
            .iter()
            .map(|d| u64::from(d.nodes) * u64::from(d.gpus_per_node.max(1)))
            .sum();
        gpus.div_ceil(u64::from(g.gpus)) as usize
    };
    widest.max(by_gpus)
}

/// `count` node names to ask `g` for: stopped ones first (longest stopped
/// first), then the lowest numbers no node or record has, then those that
/// failed to come (longest ago first), so a failed one is retried elsewhere.
fn pick_names(state: &State, g: &NodeGroup, count: usize) -> Vec<String> {
    let of = |want: PowerState| {
        let mut v: Vec<(u64, &String)> = state
            .power
            .iter()
            .filter(|(_, r)| r.group == g.name && r.state == want)
            .map(|(n, r)| (r.since, n))
            .collect();
        v.sort();
        v.into_iter().map(|(_, n)| n.clone()).collect::<Vec<_>>()
    };
    let mut names: Vec<String> = of(PowerState::Suspended);
    let mut i = 1;
    while names.len() < count && i <= g.max {
        let n = g.node_name(i);
        if !state.power.contains_key(&n) && !state.nodes.contains_key(&n) {
            names.push(n);
        }
        i += 1;
    }
    names.extend(of(PowerState::Failed));
    names.truncate(count);
    names
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::policy_change::{NodeGroupPatch, Op, PolicyChange};
    use crate::model::{GpuInfo, NodeInventory};
    use crate::state::{Command, CommandResult, Dirty};

    fn apply(s: &mut State, cmd: Command) -> CommandResult {
        s.apply(&cmd, &mut Dirty::default())
    }

    fn group(s: &mut State, patch: NodeGroupPatch) {
        let r = apply(
            s,
            Command::Policy {
                change: PolicyChange::NodeGroup {
                    op: Op::Add,
                    name: "burst".into(),
                    patch,
                },
                by: "root".into(),
                now: 1,
            },
        );
        assert!(matches!(r, CommandResult::PolicyUpdated { .. }), "{r:?}");
    }

    fn shape() -> NodeGroupPatch {
        NodeGroupPatch {
            gpus: Some(8),
            cpus: Some(64),
            memory_mb: Some(512 * 1024),
            max: Some(4),
            resume_command: Some("true".into()),
            suspend_command: Some("true".into()),
            idle_secs: Some(0),
            demand_secs: Some(0),
            resume_timeout_secs: Some(60),
            ..Default::default()
        }
    }

    fn submit(s: &mut State, gpus: &str) {
        let args = crate::spec::SubmitArgs {
            gpus_per_node: Some(crate::spec::values::parse_gpus_per_node(gpus).unwrap()),
            script_or_command: vec!["true".into()],
            ..Default::default()
        };
        let spec = crate::spec::build_spec(&args, &[], std::path::Path::new("/tmp")).unwrap();
        let r = apply(
            s,
            Command::Submit {
                user: "alice".into(),
                spec: Box::new(spec),
                now: 5,
            },
        );
        assert!(matches!(r, CommandResult::Submitted { .. }), "{r:?}");
    }

    fn register(s: &mut State, name: &str) {
        let inventory = NodeInventory {
            name: name.into(),
            gpus: (0..8)
                .map(|index| GpuInfo {
                    index,
                    uuid: format!("GPU-{name}-{index}"),
                    model: "H100".into(),
                    memory_mb: 81_920,
                    pci_bus_id: String::new(),
                    numa_node: None,
                    healthy: true,
                    fault: None,
                    mig: None,
                })
                .collect(),
            gpu_links: Vec::new(),
            numa: Vec::new(),
            cpus: 64,
            memory_mb: 512 * 1024,
            topology: String::new(),
            features: Vec::new(),
        };
        apply(
            s,
            Command::RegisterNode {
                inventory,
                addr: "10.0.0.9:7421".into(),
                preflight: false,
                now: 7,
                cert_sha256: String::new(),
            },
        );
    }

    fn resumes(d: &PowerDecisions) -> Vec<String> {
        d.changes
            .iter()
            .filter_map(|c| match c {
                PowerChange::Resume { nodes, .. } => Some(nodes.clone()),
                _ => None,
            })
            .flatten()
            .collect()
    }

    #[test]
    fn demand_asks_for_just_enough_nodes_once_and_gives_up_on_late_ones() {
        let mut s = State::default();
        group(&mut s, shape());
        for _ in 0..3 {
            submit(&mut s, "8");
        }
        submit(&mut s, "4");
        submit(&mut s, "4");
        // Too big for one of the group's nodes: not its demand.
        submit(&mut s, "16");
        let mut idle = HashMap::new();
        let d = power_decisions(&s, 10_000, &|_| true, &mut idle);
        assert_eq!(
            resumes(&d),
            ["burst-001", "burst-002", "burst-003", "burst-004"]
        );
        assert_eq!(d.starting_for.len(), 5);
        // Nothing waits for capacity (the last pass started them): nothing asked.
        assert!(resumes(&power_decisions(&s, 10_000, &|_| false, &mut idle)).is_empty());

        apply(
            &mut s,
            Command::Power {
                changes: d.changes,
                now: 10_000,
            },
        );
        // A pass counts on them from the resume timeout (60 s after they
        // were asked for): the first blocked job expects to start there,
        // and nothing is placed on them before they join.
        let mut plan = crate::sched::plan_ref(
            &s.sched_input().view(),
            15_000,
            crate::sched::Packing::BestFit,
        );
        assert!(plan.allocations.is_empty());
        let reasons = crate::sched::PendingReasons::take(&mut plan);
        let (reason, start) = reasons.get(JobId(1)).unwrap();
        assert_eq!(reason, &crate::sched::PendingReason::Resources);
        assert_eq!(start, Some(70_000));
        // On their way: not asked for again.
        let d = power_decisions(&s, 20_000, &|_| true, &mut idle);
        assert!(d.changes.is_empty(), "{:?}", d.changes.len());
        assert_eq!(d.starting_for.len(), 5);
        // One joins; the rest are late past the timeout: given up on.
        register(&mut s, "burst-002");
        let d = power_decisions(&s, 80_000, &|_| true, &mut idle);
        let failed: Vec<String> = d
            .changes
            .iter()
            .filter_map(|c| match c {
                PowerChange::Failed { nodes, .. } => Some(nodes.clone()),
                _ => None,
            })
            .flatten()
            .collect();
        assert_eq!(failed, ["burst-001", "burst-003", "burst-004"]);
        apply(
            &mut s,
            Command::Power {
                changes: d.changes,
                now: 80_000,
            },
        );
        // Their places are asked for again (burst-002 is idle: it counts).
        let d = power_decisions(&s, 81_000, &|_| true, &mut idle);
        assert_eq!(resumes(&d), ["burst-001", "burst-003", "burst-004"]);
    }

    #[test]
    fn idle_nodes_are_suspended_down_to_the_minimum_when_nothing_waits() {
        let mut s = State::default();
        group(
            &mut s,
            NodeGroupPatch {
                min: Some(1),
                ..shape()
            },
        );
        apply(
            &mut s,
            Command::Power {
                changes: vec![PowerChange::Resume {
                    group: "burst".into(),
                    nodes: vec!["burst-001".into(), "burst-002".into()],
                }],
                now: 1,
            },
        );
        register(&mut s, "burst-001");
        register(&mut s, "burst-002");
        let mut idle = HashMap::new();
        let d = power_decisions(&s, 2_000, &|_| true, &mut idle);
        let stopped: Vec<&PowerChange> = d
            .changes
            .iter()
            .filter(|c| matches!(c, PowerChange::Suspend { .. }))
            .collect();
        assert_eq!(
            stopped,
            [&PowerChange::Suspend {
                nodes: vec!["burst-002".into()]
            }]
        );
        // A group that cannot stop its nodes keeps them.
        let mut s2 = s.clone();
        apply(
            &mut s2,
            Command::Policy {
                change: PolicyChange::NodeGroup {
                    op: Op::Modify,
                    name: "burst".into(),
                    patch: NodeGroupPatch {
                        suspend_command: Some(String::new()),
                        ..Default::default()
                    },
                },
                by: "root".into(),
                now: 3,
            },
        );
        assert!(power_decisions(&s2, 4_000, &|_| true, &mut HashMap::new())
            .changes
            .is_empty());
    }
}
