//! Node liveness, kept by the leader in memory: a node whose agent has not
//! been heard from for the TTL is committed as down (its tasks are lost and
//! their jobs requeue per policy). Heartbeats never enter the log. After this
//! server becomes leader, every node gets a full TTL of grace, since the new
//! leader has heard nobody yet; so it does after this server turned agents
//! away for having lost its lease, however briefly.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::watch;

use crate::clock::now_ms;
use crate::state::{Command, NodeStatus};

use super::Api;

/// Runs the liveness check while this server leads, until `shutdown`.
pub async fn run(api: Arc<Api>, ttl: Duration, mut shutdown: watch::Receiver<bool>) {
    let mut leader_since: Option<Instant> = None;
    let mut tick =
        tokio::time::interval((ttl / 4).clamp(Duration::from_millis(100), Duration::from_secs(1)));
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = shutdown.changed() => return,
        }
        if !api.is_leader() {
            leader_since = None;
            continue;
        }
        // A lease lost and regained between two ticks closed the agents'
        // sessions all the same: their grace runs from then.
        let since = *leader_since.get_or_insert_with(Instant::now);
        let since = api.hub.deposed_at().map_or(since, |d| d.max(since));
        let silent: Vec<String> = {
            let state = api.state();
            state
                .nodes
                .iter()
                .filter(|(_, n)| !matches!(n.status, NodeStatus::Down { .. }))
                // A node its group stopped is silent on purpose.
                .filter(|(name, _)| {
                    state.power.get(*name).is_none_or(|p| {
                        !matches!(
                            p.state,
                            crate::model::PowerState::Suspending
                                | crate::model::PowerState::Suspended
                        )
                    })
                })
                .filter(|(name, _)| {
                    let heard = api.hub.last_seen(name).map_or(since, |t| t.max(since));
                    heard.elapsed() > ttl
                })
                .map(|(name, _)| name.clone())
                .collect()
        };
        // An allocation runs nothing whose shim would keep its time limit,
        // and a limit lowered while running is newer than its shims': the
        // leader ends such jobs when the limit has passed.
        let now = now_ms();
        let expired: Vec<crate::model::JobId> = api
            .state()
            .jobs
            .values()
            .filter(|j| crate::state::past_limit_unwatched(j, now))
            .map(|j| j.id)
            .collect();
        if !expired.is_empty() {
            if let Err(e) = api.write(Command::Expire { jobs: expired, now }).await {
                tracing::warn!("could not end expired allocations: {e:?}");
            }
        }
        // An interactive allocation whose client stopped renewing it
        // (killed, its network gone) is released, not held to its limit.
        let limit = api.inactive_limit_secs();
        let inactive: Vec<crate::model::JobId> = api
            .state()
            .jobs
            .values()
            .filter(|j| crate::state::past_inactive_limit(j, now, limit))
            .map(|j| j.id)
            .collect();
        if !inactive.is_empty() {
            let cmd = Command::ReleaseInactive {
                jobs: inactive,
                now,
                limit_secs: limit,
            };
            if let Err(e) = api.write(cmd).await {
                tracing::warn!("could not release inactive allocations: {e:?}");
            }
        }
        // Jobs whose GPUs sat idle past their QoS's idle time, where the
        // QoS says to cancel them (off unless an admin turned it on).
        for (id, by) in idle_to_cancel(&api) {
            tracing::info!(job = %id, %by, "cancelling an idle job");
            let cmd = Command::Cancel {
                by,
                admin: true,
                ids: vec![id],
                now: now_ms(),
            };
            if let Err(e) = api.write(cmd).await {
                tracing::warn!(job = %id, "could not cancel the idle job: {e:?}");
            }
        }
        for node in silent {
            let reason = format!("no heartbeat from its agent for {} s", ttl.as_secs_f64());
            tracing::warn!(%node, %reason, "node is down");
            let cmd = Command::NodeDown {
                node: node.clone(),
                reason,
                now: now_ms(),
            };
            if let Err(e) = api.write(cmd).await {
                tracing::warn!(%node, "could not mark the node down: {e:?}");
            }
        }
    }
}

/// Running jobs flagged idle whose QoS cancels idle jobs, each with who
/// cancels it, as its reason will say.
fn idle_to_cancel(api: &Api) -> Vec<(crate::model::JobId, String)> {
    let s = api.state();
    if !s.policy.qos.values().any(|q| q.cancel_idle) {
        return Vec::new();
    }
    let used = api.hub.all_gpu_use();
    s.jobs
        .values()
        .filter(|j| j.state == crate::model::JobState::Running)
        .filter_map(|j| {
            let name = j
                .spec
                .qos
                .as_deref()
                .unwrap_or(crate::model::policy::DEFAULT_QOS);
            if !s.policy.qos.get(name).is_some_and(|q| q.cancel_idle) {
                return None;
            }
            let limit = api.idle_limit_secs(j, &s.policy)?;
            let idle = used.get(&j.id)?.idle_secs;
            (idle >= limit).then(|| {
                let by = format!("QoS {name}'s idle-GPU rule (its GPUs idle for {idle} s)");
                (j.id, by)
            })
        })
        .collect()
}
