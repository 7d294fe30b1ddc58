//! An autoscaled replay (`--autoscale`): the fleet is one node group that
//! the leader's own decision function (`state::power_decisions`) grows and
//! shrinks in virtual time. Nodes asked for register after the boot time;
//! stopped ones stop at once; powered node-time is counted for the report.

use std::cmp::Reverse;

use super::{apply, register, Engine, EngineError, Shape};
use crate::model::{JobId, Millis};
use crate::state::{Command, CommandResult, State};

/// A replayed fleet that grows and shrinks: `Shape::nodes` at most.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Autoscale {
    /// Nodes up from the start, and never stopped.
    pub min: u32,
    /// From being asked for to taking work.
    pub boot_ms: Millis,
    pub idle_secs: u64,
    /// How long fitting jobs wait before nodes are asked for.
    pub demand_secs: u64,
}

/// The replayed node group's name (its nodes are `node-001`, ...).
pub(super) const GROUP: &str = "node";

/// How often an autoscaled replay looks at its group while nodes beyond
/// the minimum are up or jobs wait (the leader looks every second; a
/// replay's minute changes no figure and costs a 60th of the steps).
const CHECK_MS: Millis = 60_000;

/// Whether a node in `state` is costing: asked for, up or stopping.
fn powered(state: crate::model::PowerState) -> bool {
    use crate::model::PowerState::*;
    matches!(state, Resuming | Up | Suspending)
}

/// Declares the replayed fleet as a node group of `shape.nodes` nodes.
pub(super) fn declare_group(
    state: &mut State,
    shape: &Shape,
    a: Autoscale,
) -> Result<(), EngineError> {
    if shape.nodes > 999 {
        return Err(EngineError::Autoscale(format!(
            "a node group has at most 999 nodes; give --nodes 999 or fewer (not {})",
            shape.nodes
        )));
    }
    if a.min > shape.nodes {
        return Err(EngineError::Autoscale(format!(
            "the minimum ({}) is over --nodes ({})",
            a.min, shape.nodes
        )));
    }
    let mem = crate::sim::fleet::sim_inventory("probe", shape.gpus_per_node, "")
        .map(|inv| (inv.cpus, inv.memory_mb))
        .map_err(|e| EngineError::Autoscale(format!("{e:#}")))?;
    let change = crate::model::policy_change::PolicyChange::NodeGroup {
        op: crate::model::policy_change::Op::Add,
        name: GROUP.into(),
        patch: crate::model::policy_change::NodeGroupPatch {
            gpus: Some(shape.gpus_per_node),
            cpus: Some(mem.0),
            memory_mb: Some(mem.1),
            min: Some(a.min),
            max: Some(shape.nodes),
            resume_command: Some("replay".into()),
            suspend_command: Some("replay".into()),
            idle_secs: Some(a.idle_secs),
            // Nodes join exactly after the boot: the plan counts on them then.
            resume_timeout_secs: Some((a.boot_ms / 1000).max(1)),
            demand_secs: Some(a.demand_secs),
            ..Default::default()
        },
    };
    let cmd = Command::Policy {
        change,
        by: "replay".into(),
        now: 0,
    };
    if let CommandResult::Rejected(r) = apply(state, &cmd) {
        return Err(EngineError::Autoscale(r.to_string()));
    }
    let first: Vec<String> = (0..a.min).map(|i| shape.node_name(i)).collect();
    if !first.is_empty() {
        let cmd = Command::Power {
            changes: vec![crate::model::PowerChange::Resume {
                group: GROUP.into(),
                nodes: first,
            }],
            now: 0,
        };
        apply(state, &cmd);
    }
    Ok(())
}

impl Engine<'_> {
    /// When an autoscaled replay next looks at its group with nothing
    /// else happening: while nodes beyond the minimum are up (to stop them
    /// once idle) or jobs wait (to ask for more).
    pub(super) fn next_check(&self, idle: bool) -> Option<Millis> {
        let a = self.shape.autoscale?;
        let beyond_min = self
            .state
            .power
            .values()
            .filter(|p| powered(p.state))
            .count() as u32
            > a.min;
        (beyond_min || (!idle && self.state.has_pending()))
            .then(|| self.now.saturating_add(CHECK_MS))
    }

    /// Adds the powered node-time up to `t`.
    pub(super) fn count_powered(&mut self, t: Millis) {
        if self.shape.autoscale.is_none() {
            return;
        }
        let n = self
            .state
            .power
            .values()
            .filter(|p| powered(p.state))
            .count() as u128;
        self.powered_ms += n * u128::from(t.saturating_sub(self.powered_at));
        self.powered_at = t;
    }

    /// A node asked for has booted: its agent registers.
    pub(super) fn join(&mut self, name: &str) -> Result<bool, EngineError> {
        let Some(i) = name
            .strip_prefix(GROUP)
            .and_then(|r| r.strip_prefix('-'))
            .and_then(|n| n.parse::<u32>().ok())
        else {
            return Ok(false);
        };
        register(&mut self.state, &self.shape, i - 1, self.now)?;
        self.up_gpus += u64::from(self.shape.gpus_per_node);
        Ok(true)
    }

    /// The leader's autoscaler, as it would decide now: nodes asked for
    /// join after the boot time; idle ones stop at once.
    pub(super) fn autoscale(&mut self) {
        let Some(a) = self.shape.autoscale else {
            return;
        };
        let reasons = &self.reasons;
        let waiting = |id: JobId| {
            reasons.get(id).is_some_and(|(r, _)| {
                matches!(
                    r,
                    crate::sched::PendingReason::Resources
                        | crate::sched::PendingReason::Priority
                        | crate::sched::PendingReason::ReservedForOthers
                        | crate::sched::PendingReason::Unsatisfiable(_)
                        | crate::sched::PendingReason::Topology(_)
                )
            })
        };
        let d =
            crate::state::power_decisions(&self.state, self.now, &waiting, &mut self.idle_since);
        if d.changes.is_empty() {
            return;
        }
        let mut stopped = Vec::new();
        for c in &d.changes {
            match c {
                crate::model::PowerChange::Resume { nodes, .. } => {
                    for n in nodes {
                        self.joins
                            .push(Reverse((self.now.saturating_add(a.boot_ms), n.clone())));
                    }
                }
                crate::model::PowerChange::Suspend { nodes } => {
                    stopped.extend(nodes.iter().cloned())
                }
                _ => {}
            }
        }
        let mut changes = d.changes;
        if !stopped.is_empty() {
            self.up_gpus = self
                .up_gpus
                .saturating_sub(stopped.len() as u64 * u64::from(self.shape.gpus_per_node));
            changes.push(crate::model::PowerChange::Suspended { nodes: stopped });
        }
        apply(
            &mut self.state,
            &Command::Power {
                changes,
                now: self.now,
            },
        );
    }
}
