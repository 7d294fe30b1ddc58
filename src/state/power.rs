//! Node groups and their nodes' power states in apply (`gpuq admin
//! nodegroup`, `Command::Power`). The leader decides when to ask for nodes
//! and when to stop them (`server::autoscale`); apply records it, so a new
//! leader knows which nodes are on their way and which are stopped. A node
//! asked for becomes `Up` when its agent registers; a suspended one is kept
//! drained (by `DrainSource::Power`) until it registers again.

use std::sync::Arc;

use super::{CommandResult, Dirty, DrainSource, NodeStatus, Rejection, State};
use crate::model::policy_change::{NodeGroupPatch, Op};
use crate::model::{Millis, NodeGroup, PowerChange, PowerRecord, PowerState};

fn refuse(msg: impl Into<String>) -> Rejection {
    Rejection::Policy(msg.into())
}

/// The most nodes one group may have (names have three digits).
const MAX_NODES: u32 = 999;

impl State {
    pub(super) fn change_node_group(
        &mut self,
        op: Op,
        name: &str,
        p: &NodeGroupPatch,
    ) -> Result<String, Rejection> {
        super::policy::check_name("node group", name)?;
        let current = self.policy.node_groups.get(name).cloned();
        match (op, &current) {
            (Op::Add, Some(_)) => {
                return Err(refuse(format!(
                    "node group {name} already exists; change it with \
                     `gpuq admin nodegroup modify {name}`"
                )))
            }
            (Op::Modify | Op::Remove, None) => {
                return Err(refuse(format!(
                    "node group {name} does not exist (see `gpuq admin nodegroup list`)"
                )))
            }
            (Op::Remove, Some(_)) => {
                let live: Vec<&String> = self
                    .power
                    .iter()
                    .filter(|(_, r)| {
                        r.group == name
                            && !matches!(r.state, PowerState::Suspended | PowerState::Failed)
                    })
                    .map(|(n, _)| n)
                    .collect();
                if !live.is_empty() {
                    return Err(refuse(format!(
                        "node group {name} has {} nodes up or on their way ({}); set \
                         --min 0 and let them be suspended when idle first",
                        live.len(),
                        crate::model::hostlist::compress_hostlist(&live)
                    )));
                }
                Arc::make_mut(&mut self.policy).node_groups.remove(name);
                self.power.retain(|_, r| r.group != name);
                return Ok(format!("node group {name} removed"));
            }
            _ => {}
        }
        let adding = current.is_none();
        let mut g = match current {
            Some(g) => g,
            None => NodeGroup {
                name: name.to_string(),
                gpus: need(name, "--gpus (GPUs per node)", p.gpus)?,
                cpus: need(name, "--cpus (CPUs per node)", p.cpus)?,
                memory_mb: need(name, "--mem (memory per node)", p.memory_mb)?,
                features: Vec::new(),
                min: 0,
                max: need(name, "--max (the most nodes)", p.max)?,
                resume_command: need(
                    name,
                    "a --resume-command (what starts its nodes)",
                    p.resume_command.clone(),
                )?,
                suspend_command: None,
                idle_secs: 600,
                resume_timeout_secs: 600,
                demand_secs: 30,
                mig_layout: None,
            },
        };
        if !adding {
            set(&mut g.gpus, p.gpus);
            set(&mut g.cpus, p.cpus);
            set(&mut g.memory_mb, p.memory_mb);
            set(&mut g.max, p.max);
            set(&mut g.resume_command, p.resume_command.clone());
        }
        set(&mut g.min, p.min);
        set(&mut g.idle_secs, p.idle_secs);
        set(&mut g.resume_timeout_secs, p.resume_timeout_secs);
        set(&mut g.demand_secs, p.demand_secs);
        if let Some(f) = &p.features {
            g.features = f.clone();
        }
        if let Some(l) = &p.mig_layout {
            g.mig_layout = match l.trim() {
                "" => None,
                text => Some(
                    crate::model::mig::parse_target(text)
                        .map_err(|e| refuse(format!("--mig-layout {text}: {e}; or `none`")))?
                        .map_or(crate::model::mig::NO_MIG.to_string(), |l| l.to_text()),
                ),
            };
        }
        if let Some(c) = &p.suspend_command {
            g.suspend_command = (!c.trim().is_empty()).then(|| c.clone());
        }
        if g.resume_command.trim().is_empty() {
            return Err(refuse(
                "--resume-command is empty; give the command that starts the group's nodes",
            ));
        }
        if g.cpus == 0 || g.memory_mb == 0 {
            return Err(refuse("--cpus and --mem must be positive"));
        }
        if g.max == 0 || g.max > MAX_NODES {
            return Err(refuse(format!(
                "--max {} is out of range; give 1 to {MAX_NODES}",
                g.max
            )));
        }
        if g.min > g.max {
            return Err(refuse(format!(
                "--min {} is over --max {}; give a minimum no larger than the maximum",
                g.min, g.max
            )));
        }
        if g.resume_timeout_secs == 0 {
            return Err(refuse("--resume-timeout must be positive, e.g. 10m"));
        }
        if let Some(taken) = self
            .nodes
            .keys()
            .find(|n| g.owns(n) && !self.power.contains_key(*n))
        {
            return Err(refuse(format!(
                "node {taken} exists already outside any group, and group {name} would name \
                 its nodes the same; pick another group name"
            )));
        }
        let what = format!(
            "node group {name} {}: {}..{} nodes of {} GPUs, named {}..{}",
            if adding { "added" } else { "changed" },
            g.min,
            g.max,
            g.gpus,
            g.node_name(1),
            g.node_name(g.max)
        );
        Arc::make_mut(&mut self.policy)
            .node_groups
            .insert(name.to_string(), g);
        Ok(what)
    }

    pub(super) fn apply_power(
        &mut self,
        changes: &[PowerChange],
        now: Millis,
        dirty: &mut Dirty,
    ) -> CommandResult {
        let mut changed = Vec::new();
        for c in changes {
            match c {
                PowerChange::Resume { group, nodes } => {
                    let Some(g) = self.policy.node_groups.get(group).cloned() else {
                        continue;
                    };
                    for n in nodes.iter().filter(|n| g.owns(n)) {
                        // Never one that is up or on its way already.
                        let free = self.power.get(n).is_none_or(|r| {
                            matches!(r.state, PowerState::Suspended | PowerState::Failed)
                        });
                        if free {
                            self.set_power(n, group, PowerState::Resuming, now);
                            changed.push(n.clone());
                        }
                    }
                }
                PowerChange::Failed { nodes, why } => {
                    for n in nodes {
                        if self.power.get(n).map(|r| r.state) == Some(PowerState::Resuming) {
                            let group = self.power[n].group.clone();
                            self.set_power(n, &group, PowerState::Failed, now);
                            tracing::warn!(node = %n, "node did not come: {why}");
                            changed.push(n.clone());
                        }
                    }
                }
                PowerChange::Suspend { nodes } => {
                    for n in nodes {
                        let Some(group) = self
                            .power
                            .get(n)
                            .filter(|r| r.state == PowerState::Up)
                            .map(|r| r.group.clone())
                        else {
                            continue;
                        };
                        if let Some(rec) = self.nodes.get_mut(n) {
                            if matches!(rec.status, NodeStatus::Up) {
                                rec.status = NodeStatus::Drained {
                                    reason: "idle: suspended by its node group".into(),
                                    by: DrainSource::Power,
                                    user: None,
                                    since: now,
                                };
                                dirty.nodes.insert(n.clone());
                            }
                        }
                        self.set_power(n, &group, PowerState::Suspending, now);
                        changed.push(n.clone());
                    }
                }
                PowerChange::Suspended { nodes } => {
                    for n in nodes {
                        if let Some(group) = self
                            .power
                            .get(n)
                            .filter(|r| r.state == PowerState::Suspending)
                            .map(|r| r.group.clone())
                        {
                            self.set_power(n, &group, PowerState::Suspended, now);
                            changed.push(n.clone());
                        }
                    }
                }
            }
        }
        if !changed.is_empty() {
            dirty.meta = true;
        }
        CommandResult::PowerChanged { nodes: changed }
    }

    fn set_power(&mut self, node: &str, group: &str, state: PowerState, now: Millis) {
        self.power.insert(
            node.to_string(),
            PowerRecord {
                group: group.to_string(),
                state,
                since: now,
            },
        );
    }

    /// A group node's agent registered: it is up, and a drain its
    /// suspension set is lifted. Returns the status it registers with.
    pub(super) fn powered_up(&mut self, node: &str, status: NodeStatus, now: Millis) -> NodeStatus {
        let Some(r) = self.power.get_mut(node) else {
            return status;
        };
        if r.state != PowerState::Up {
            r.state = PowerState::Up;
            r.since = now;
        }
        match status {
            NodeStatus::Drained {
                by: DrainSource::Power,
                ..
            } => NodeStatus::Up,
            other => other,
        }
    }
}

/// `v`, or a refusal saying `what` a new group needs.
fn need<T>(name: &str, what: &str, v: Option<T>) -> Result<T, Rejection> {
    v.ok_or_else(|| {
        refuse(format!(
            "a node group needs {what}; e.g. gpuq admin nodegroup add {name} --gpus 8 \
             --cpus 96 --mem 1000G --max 16 --resume-command /etc/gpuq/resume.sh"
        ))
    })
}

fn set<T>(slot: &mut T, v: Option<T>) {
    if let Some(v) = v {
        *slot = v;
    }
}
