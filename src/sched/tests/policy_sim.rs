//! A long simulated run of policy with the real scheduler and the real
//! apply (no processes): 16 DGX nodes, two accounts with shares 3:1 that
//! always have work queued, a steady stream of 1- to 8-GPU jobs, and now and
//! then an urgent job of a QoS that preempts `normal`. Simulated minutes; a
//! job's ranks end by its duration, a preempted job's ranks a minute after
//! it was signalled (its grace).
//!
//! Asserted: over the second half of the run the GPU time the two accounts
//! got is within 10% of 3:1; every preemption made its job fit and took at
//! most one victim more than the fewest that would have (checked by brute
//! force over its victims, on the state as it was); every preempted job
//! was requeued with its id and later completed. Printed: utilisation, mean
//! wait, and the wait of 8-GPU jobs.

use std::collections::BTreeMap;

use super::*;
use crate::model::policy_change::{AccountPatch, Op, PolicyChange, PriorityPatch, QosPatch};
use crate::model::{JobState, TaskEnd, TaskEvent, TaskEventKind, TaskKey};
use crate::sched::Preemption;
use crate::state::{Command, CommandResult, Dirty, State};

const NODES: usize = 16;
const MINUTE: Millis = 60_000;
const RUN_MINUTES: u64 = 6 * 24 * 60;

struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        (z ^ (z >> 31)) % n
    }
}

fn apply(state: &mut State, cmd: Command) -> CommandResult {
    let r = state.apply(&cmd, &mut Dirty::default());
    assert!(
        !matches!(r, CommandResult::Rejected(_)),
        "{cmd:?} rejected: {r:?}"
    );
    r
}

fn admin(state: &mut State, change: PolicyChange) {
    apply(
        state,
        Command::Policy {
            change,
            by: "root".into(),
            now: 0,
        },
    );
}

/// Whether `job` fits once `victims` are gone, on the state's nodes alone.
fn fits_without(state: &State, job: JobId, victims: &[JobId]) -> bool {
    let mut view = state.cluster_view();
    view.pending.retain(|j| j.id == job);
    view.policy = Default::default();
    for v in victims {
        if let Some(run) = state.job(*v).and_then(|j| j.run.as_ref()) {
            for na in &run.allocation.nodes {
                if let Some(n) = view.nodes.iter_mut().find(|n| n.name == na.node) {
                    n.used.release(na);
                }
            }
        }
    }
    !plan(&view, 0).allocations.is_empty()
}

/// The fewest of `victims` whose stopping makes `job` fit.
fn fewest_needed(state: &State, job: JobId, victims: &[JobId]) -> usize {
    let n = victims.len();
    (0u32..1 << n)
        .filter(|mask| {
            let subset: Vec<JobId> = (0..n)
                .filter(|i| mask & (1 << i) != 0)
                .map(|i| victims[i])
                .collect();
            fits_without(state, job, &subset)
        })
        .map(|m| m.count_ones() as usize)
        .min()
        .unwrap_or(usize::MAX)
}

#[test]
fn fair_share_converges_and_preemption_takes_what_is_needed() {
    let mut state = State::default();
    for i in 0..NODES {
        apply(
            &mut state,
            Command::RegisterNode {
                inventory: dgx(&format!("n{i:02}")).build().inventory,
                addr: format!("10.0.0.{i}:7421"),
                preflight: false,
                now: 0,
                cert_sha256: String::new(),
            },
        );
    }
    for (name, shares) in [("ml", 3), ("cv", 1)] {
        admin(
            &mut state,
            PolicyChange::Account {
                op: Op::Add,
                name: name.into(),
                patch: AccountPatch {
                    shares: Some(shares),
                    add_users: vec!["u".into()],
                    ..Default::default()
                },
            },
        );
    }
    admin(
        &mut state,
        PolicyChange::Qos {
            op: Op::Add,
            name: "urgent".into(),
            patch: QosPatch {
                priority: Some(100),
                preempts: Some(vec!["normal".into()]),
                ..Default::default()
            },
        },
    );
    admin(
        &mut state,
        PolicyChange::Priority(PriorityPatch {
            half_life_secs: Some(12 * 3600),
            ..Default::default()
        }),
    );

    let mut rng = Rng(7);
    let mut duration: BTreeMap<JobId, Millis> = BTreeMap::new();
    let mut stop_at: BTreeMap<JobId, Millis> = BTreeMap::new();
    let mut preempted: Vec<JobId> = Vec::new();
    let mut preemptions = 0;
    let mut gpu_ms: BTreeMap<String, u64> = BTreeMap::new();
    let mut busy_gpu_ms = 0u64;
    let (mut waits, mut big_waits) = (Vec::new(), Vec::new());
    let half = RUN_MINUTES * MINUTE / 2;

    for minute in 0..RUN_MINUTES {
        let now = minute * MINUTE;
        // End what is due: ranks report as an agent would.
        let due: Vec<(JobId, bool)> = state
            .jobs
            .values()
            .filter(|j| j.state.is_active())
            .filter_map(|j| {
                let until = if j.state == JobState::Completing {
                    stop_at.get(&j.id).copied()?
                } else {
                    j.start_time? + duration[&j.id]
                };
                (until <= now).then_some((j.id, j.state == JobState::Completing))
            })
            .collect();
        for (id, stopped) in due {
            let job = state.job(id).unwrap();
            let run = job.run.clone().unwrap();
            let start = job.start_time.unwrap();
            let gpus: u64 = run.allocation.gpus();
            let from = start.max(half);
            if now > from {
                *gpu_ms.entry(job.spec.account.clone().unwrap()).or_default() +=
                    gpus * (now - from);
            }
            busy_gpu_ms += gpus * (now - start);
            for (rank, na) in run.allocation.nodes.iter().enumerate() {
                let end = if stopped {
                    TaskEnd::Cancelled
                } else {
                    TaskEnd::Completed
                };
                apply(
                    &mut state,
                    Command::TaskEvents {
                        node: na.node.clone(),
                        events: vec![
                            TaskEvent {
                                key: TaskKey {
                                    job: id,
                                    attempt: run.attempt,
                                    rank: rank as u32,
                                    step: None,
                                },
                                kind: TaskEventKind::Started,
                            },
                            TaskEvent {
                                key: TaskKey {
                                    job: id,
                                    attempt: run.attempt,
                                    rank: rank as u32,
                                    step: None,
                                },
                                kind: TaskEventKind::Ended(end),
                            },
                        ],
                        now,
                        gpu_use: Vec::new(),
                    },
                );
            }
        }
        // Keep both accounts' queues full; an urgent job every 3 hours.
        for account in ["ml", "cv"] {
            let queued = state
                .jobs
                .values()
                .filter(|j| j.state == JobState::Pending)
                .filter(|j| j.spec.account.as_deref() == Some(account))
                .count();
            for _ in queued..12 {
                let gpus = [1, 2, 4, 8][rng.below(4) as usize];
                let mut spec = crate::sim::workload::sim_spec("j", 1, gpus, Default::default(), 0);
                spec.account = Some(account.into());
                let CommandResult::Submitted { id } = apply(
                    &mut state,
                    Command::Submit {
                        user: "u".into(),
                        spec: Box::new(spec),
                        now,
                    },
                ) else {
                    panic!("not submitted")
                };
                duration.insert(id, (10 + rng.below(110)) * MINUTE);
            }
        }
        if minute % 180 == 90 && minute < RUN_MINUTES - 600 {
            let mut spec = crate::sim::workload::sim_spec("urgent", 2, 8, Default::default(), 0);
            spec.qos = Some("urgent".into());
            spec.account = Some("cv".into());
            if let CommandResult::Submitted { id } = apply(
                &mut state,
                Command::Submit {
                    user: "u".into(),
                    spec: Box::new(spec),
                    now,
                },
            ) {
                duration.insert(id, 30 * MINUTE);
            }
        }
        // One pass.
        let p = plan(&state.cluster_view(), now);
        for Preemption { job, victims, .. } in &p.preemptions {
            assert!(
                fits_without(&state, *job, victims),
                "job {job} does not fit after preempting {victims:?}"
            );
            let needed = fewest_needed(&state, *job, victims);
            assert!(
                victims.len() <= needed + 1,
                "job {job}: {} victims where {needed} would do",
                victims.len()
            );
            preemptions += 1;
        }
        if !p.preemptions.is_empty() {
            let CommandResult::Preempted { stopped, .. } = apply(
                &mut state,
                Command::Preempt {
                    preemptions: p.preemptions.clone(),
                    now,
                },
            ) else {
                panic!("not preempted")
            };
            for v in stopped {
                stop_at.insert(v, now + MINUTE);
                preempted.push(v);
            }
        }
        if !p.allocations.is_empty() {
            apply(
                &mut state,
                Command::Schedule {
                    allocations: p.allocations.clone(),
                    now,
                },
            );
            for a in &p.allocations {
                let j = state.job(a.job).unwrap();
                if j.restart_count == 0 {
                    let wait = now - j.submit_time;
                    waits.push(wait);
                    if j.spec.total_gpus() >= 8 {
                        big_waits.push(wait);
                    }
                }
            }
        }
    }

    let (ml, cv) = (gpu_ms["ml"] as f64, gpu_ms["cv"] as f64);
    let share = ml / (ml + cv);
    let total_gpu_ms = (NODES * 8) as f64 * (RUN_MINUTES * MINUTE) as f64;
    let mean = |v: &[u64]| v.iter().sum::<u64>() as f64 / v.len().max(1) as f64 / 60_000.0;
    println!(
        "policy sim: {} days, {NODES} nodes; ml share of GPU time {share:.3} (configured 0.75); \
         utilisation {:.1}%; mean wait {:.1} min; 8+-GPU job wait {:.1} min; {preemptions} \
         preemptions, {} victims",
        RUN_MINUTES / 1440,
        100.0 * busy_gpu_ms as f64 / total_gpu_ms,
        mean(&waits),
        mean(&big_waits),
        preempted.len()
    );
    assert!(
        (share - 0.75).abs() <= 0.075,
        "ml got {share:.3} of the GPU time; its share is 0.75"
    );
    assert!(preemptions > 0, "the urgent jobs never preempted");
    for v in &preempted {
        let j = state.job(*v).unwrap();
        assert!(
            !j.preemptions.is_empty(),
            "job {v} has no preemption record"
        );
        assert!(j.restart_count > 0, "job {v} was not requeued");
    }
    let done = preempted
        .iter()
        .filter(|v| state.job(**v).unwrap().state == JobState::Completed)
        .count();
    assert!(
        done * 10 >= preempted.len() * 8,
        "only {done} of {} preempted jobs completed later",
        preempted.len()
    );
}
