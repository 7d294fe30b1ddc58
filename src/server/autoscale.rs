//! Node groups grow and shrink (the leader's, like Slurm's power saving and
//! the Kubernetes cluster autoscaler). Every tick, for each group:
//!
//! - Nodes asked for that have not joined within the group's resume
//!   timeout are given up on (`PowerChange::Failed`), so their places are
//!   asked for again: a job never waits on a node that will not come.
//! - Demand: jobs pending for the group's `demand_secs` whose last pass
//!   left them waiting for capacity (Resources, Priority, reserved,
//!   unsatisfiable on the nodes up) and whose per-node shape one of its
//!   nodes holds. They need enough whole nodes for their GPUs (and their
//!   widest gang); nodes of the group on their way or idle count against
//!   that. The rest, up to `max`, are asked for in one call of the group's
//!   resume command, suspended nodes first, then the lowest free numbers.
//! - Nodes of the group idle (no job) for `idle_secs` while nothing waits
//!   for the group are drained and stopped by its suspend command, down
//!   to `min`.
//!
//! The decisions go through the log (`Command::Power`), so a new leader
//! knows what is on its way; the commands run here, on the leader, as
//! Slurm's ResumeProgram runs on slurmctld's host. What is in memory only
//! (how long a node has been idle, which jobs wait for which starting
//! nodes) starts afresh on a new leader.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use crate::clock::now_ms;
use crate::model::hostlist::compress_hostlist;
use crate::model::{JobId, NodeGroup, PowerChange};
use crate::sched::PendingReason;
use crate::state::Command;

use super::Api;

/// How often the groups are looked at.
const TICK: Duration = Duration::from_secs(1);

/// Runs the node groups' loop while this server leads, until `shutdown`.
pub async fn run(api: Arc<Api>, mut shutdown: watch::Receiver<bool>) {
    let mut idle_since: HashMap<String, u64> = HashMap::new();
    let mut tick = tokio::time::interval(TICK);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = shutdown.changed() => return,
        }
        if !api.is_leader() {
            idle_since.clear();
            continue;
        }
        let now = now_ms();
        let decisions = {
            let state = api.state();
            if state.policy.node_groups.is_empty() {
                continue;
            }
            let reasons = api.pending_reasons();
            let waiting = |id: JobId| {
                reasons.get(id).is_some_and(|(r, _)| {
                    matches!(
                        r,
                        PendingReason::Resources
                            | PendingReason::Priority
                            | PendingReason::ReservedForOthers
                            | PendingReason::Unsatisfiable(_)
                            | PendingReason::Topology(_)
                    )
                })
            };
            crate::state::power_decisions(&state, now, &waiting, &mut idle_since)
        };
        api.set_starting_for(decisions.starting_for);
        if decisions.changes.is_empty() {
            continue;
        }
        let cmd = Command::Power {
            changes: decisions.changes.clone(),
            now,
        };
        if let Err(e) = api.write(cmd).await {
            tracing::warn!("could not record node groups' power changes: {e:?}");
            continue;
        }
        for change in decisions.changes {
            let (nodes, resume) = match change {
                PowerChange::Resume { nodes, .. } => (nodes, true),
                PowerChange::Suspend { nodes } => (nodes, false),
                _ => continue,
            };
            // The group as the state has it now that the change is applied
            // (each node's power record names it).
            let g = {
                let s = api.state();
                let group = nodes
                    .first()
                    .and_then(|n| s.power.get(n))
                    .map(|p| p.group.clone());
                group.and_then(|g| s.policy.node_groups.get(&g).cloned())
            };
            let Some(g) = g else { continue };
            tokio::spawn(call(api.clone(), g, nodes, resume));
        }
    }
}

/// Runs the group's resume (or suspend) command for `nodes` and records
/// what came of it: a resume that fails gives its nodes up at once; a
/// suspend that ends marks them stopped (and if it fails, they stay
/// drained, with the failure in the log).
async fn call(api: Arc<Api>, g: NodeGroup, nodes: Vec<String>, resume: bool) {
    let (what, command) = match (resume, &g.suspend_command) {
        (true, _) => ("resume", g.resume_command.clone()),
        (false, Some(c)) => ("suspend", c.clone()),
        (false, None) => ("suspend", String::new()),
    };
    let list = compress_hostlist(&nodes);
    let outcome = if command.is_empty() {
        Ok(())
    } else {
        run_command(&command, &g, &nodes).await
    };
    let change = match (&outcome, resume) {
        (Ok(()), true) => return,
        (Ok(()), false) => PowerChange::Suspended { nodes },
        (Err(why), true) => {
            tracing::warn!(group = %g.name, "resume command for {list} failed: {why}");
            PowerChange::Failed {
                nodes,
                why: format!("the resume command failed: {why}"),
            }
        }
        (Err(why), false) => {
            tracing::warn!(
                group = %g.name,
                "{what} command for {list} failed: {why}; the nodes stay drained"
            );
            return;
        }
    };
    let cmd = Command::Power {
        changes: vec![change],
        now: now_ms(),
    };
    if let Err(e) = api.write(cmd).await {
        tracing::warn!("could not record the {what} of {list}: {e:?}");
    }
}

/// `COMMAND HOSTLIST` through `sh -c`, with the group's variables, within
/// the group's resume timeout.
async fn run_command(command: &str, g: &NodeGroup, names: &[String]) -> Result<(), String> {
    let list = compress_hostlist(names);
    let count = names.len();
    let child = tokio::process::Command::new("sh")
        .arg("-c")
        // The host list as the command's last argument, as Slurm's
        // ResumeProgram gets it.
        .arg(format!("{command} \"$@\""))
        .arg("gpuq-power")
        .arg(&list)
        .env("GPUQ_NODES", list)
        .env("GPUQ_NODE_NAMES", names.join(" "))
        .env("GPUQ_NODE_COUNT", count.to_string())
        .env("GPUQ_NODE_GROUP", &g.name)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| format!("could not start sh: {e}"))?;
    let limit = Duration::from_secs(g.resume_timeout_secs.max(1));
    let out = tokio::time::timeout(limit, child.wait_with_output())
        .await
        .map_err(|_| format!("it ran longer than {}s and was killed", limit.as_secs()))?
        .map_err(|e| format!("waiting for it: {e}"))?;
    if out.status.success() {
        return Ok(());
    }
    let stderr = String::from_utf8_lossy(&out.stderr);
    let tail: String = stderr
        .trim()
        .chars()
        .rev()
        .take(300)
        .collect::<Vec<_>>()
        .into_iter()
        .rev()
        .collect();
    Err(format!("{}: {tail}", out.status))
}
