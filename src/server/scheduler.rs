//! The leader's scheduling loop: on state changes (debounced while busy) and every
//! second, it reads the applied state, calls the pure `sched::plan`, and
//! proposes the allocations as one `Command::Schedule`. Apply re-validates
//! each allocation, so a stale plan can only start less, never oversubscribe.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::watch;

use crate::clock::now_ms;
use crate::state::{Command, CommandResult};

use super::Api;

/// How long a burst of state changes is collected before a pass.
const DEBOUNCE: Duration = Duration::from_millis(2);
/// A change this long after the last pass finds an idle scheduler:
/// it is passed on at once, not debounced (a lone submit's latency).
const QUIET: Duration = Duration::from_millis(50);

/// Runs scheduling passes while this server leads, until `shutdown`.
pub async fn run(api: Arc<Api>, mut shutdown: watch::Receiver<bool>) {
    let mut metrics = api.metrics();
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    let mut last_seen_index = None;
    let mut last_pass: Option<Instant> = None;
    loop {
        tokio::select! {
            r = metrics.changed() => if r.is_err() { return },
            _ = tick.tick() => {}
            _ = shutdown.changed() => return,
        }
        if !api.is_leader() {
            continue;
        }
        if last_pass.is_some_and(|t| t.elapsed() < QUIET) {
            tokio::time::sleep(DEBOUNCE).await;
        }
        let index = api.applied_index();
        let periodic = last_seen_index == Some(index);
        last_seen_index = Some(index);
        let mut plan = {
            let state = api.state();
            // Most applied entries (task events, heartbeats of progress) leave
            // nothing pending: skip the pass.
            if !state.has_work() {
                drop(state);
                api.set_pending_reasons(Default::default());
                continue;
            }
            last_pass = Some(Instant::now());
            // The nodes and pending jobs are borrowed from the state's index,
            // which keeps them between passes; the read lock is held for the
            // pass, so it must stay short.
            let input = state.sched_input();
            let began = Instant::now();
            let plan =
                crate::sched::plan_ref(&input.view(), now_ms(), crate::sched::Packing::BestFit);
            api.observed.pass_seconds.observe_duration(began.elapsed());
            plan
        };
        api.set_pending_reasons(crate::sched::PendingReasons::take(&mut plan));
        if !plan.preemptions.is_empty() {
            let cmd = Command::Preempt {
                preemptions: plan.preemptions,
                now: now_ms(),
            };
            match api.write(cmd).await {
                Ok(CommandResult::Preempted { stopped, skipped }) => {
                    tracing::info!(?stopped, ?skipped, "preempted jobs");
                }
                Ok(other) => tracing::warn!("unexpected preempt result {other:?}"),
                Err(e) => tracing::debug!("preemption not committed: {e:?}"),
            }
        }
        if !plan.growths.is_empty() {
            let cmd = Command::Resize {
                growths: std::mem::take(&mut plan.growths),
                now: now_ms(),
            };
            match api.write(cmd).await {
                Ok(CommandResult::Resized { grown, skipped }) => {
                    tracing::info!(?grown, ?skipped, "elastic jobs grew");
                }
                Ok(other) => tracing::warn!("unexpected resize result {other:?}"),
                Err(e) => tracing::debug!("growth not committed: {e:?}"),
            }
        }
        if plan.allocations.is_empty() {
            continue;
        }
        let n = plan.allocations.len();
        match api
            .write(Command::Schedule {
                allocations: plan.allocations,
                now: now_ms(),
            })
            .await
        {
            Ok(CommandResult::Scheduled { started, skipped }) => {
                api.observed.started(&api, &started);
                tracing::debug!(
                    planned = n,
                    started = started.len(),
                    periodic,
                    "scheduling pass"
                );
                for (job, why) in skipped {
                    tracing::debug!(%job, %why, "allocation no longer fits");
                }
            }
            Ok(other) => tracing::warn!("unexpected schedule result {other:?}"),
            Err(e) => tracing::debug!("schedule not committed: {e:?}"),
        }
    }
}
