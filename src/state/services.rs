//! Services in apply (`gpuq service`): creating, scaling and deleting them,
//! and keeping one job per replica index. A replica is an ordinary job whose
//! `replica_of` names its service and index; when it ends, however it ends
//! (exit, failure, lost node, time limit, a user's cancel), apply queues the
//! next job for its index, not before a delay that doubles with each quick
//! failure in a row (`model::service`). Cancels that scaling or deleting
//! make end replicas the service no longer wants, so nothing replaces them.
//! All of it is here, in the deterministic apply: a server failover loses
//! no service, and no controller loop is needed to converge.

use std::collections::BTreeSet;

use super::{CommandResult, Dirty, Rejection, State};
use crate::model::{
    check_port_names, check_service_name, JobId, JobSpec, JobState, Millis, ReplicaOf, Service,
    ServiceSettings, MAX_REPLICAS, QUICK_FAILURE_SECS,
};

impl State {
    pub(super) fn service_create(
        &mut self,
        user: &str,
        name: &str,
        spec: &JobSpec,
        settings: &ServiceSettings,
        now: Millis,
        dirty: &mut Dirty,
    ) -> Result<CommandResult, Rejection> {
        check_service_name(name).map_err(Rejection::Service)?;
        if let Some(h) = &settings.health {
            h.check().map_err(Rejection::Service)?;
        }
        self.check_ports(&settings.ports)?;
        if self.services.contains_key(name) {
            return Err(Rejection::Service(format!(
                "service {name} exists already: change its size with `gpuq service scale {name} N`, \
                 or delete it first"
            )));
        }
        check_replicas(settings.replicas)?;
        let spec = self.admit_template(user, spec)?;
        self.services.insert(
            name.to_string(),
            Service {
                name: name.to_string(),
                user: user.to_string(),
                spec,
                replicas: settings.replicas,
                restart_delay_secs: settings.restart_delay_secs,
                created: now,
                slots: Default::default(),
                health: settings.health.clone(),
                version: 1,
                previous: None,
                roll_halted: None,
                ports: settings.ports.clone(),
            },
        );
        dirty.meta = true;
        let queued = self.fill_replicas(name, now, dirty);
        Ok(CommandResult::ServiceChanged {
            queued,
            cancelled: Vec::new(),
        })
    }

    pub(super) fn service_scale(
        &mut self,
        by: &str,
        admin: bool,
        name: &str,
        replicas: u32,
        now: Millis,
        dirty: &mut Dirty,
    ) -> Result<CommandResult, Rejection> {
        self.service_owned(by, admin, name)?;
        check_replicas(replicas)?;
        if let Some(s) = self.services.get_mut(name) {
            s.replicas = replicas;
        }
        dirty.meta = true;
        let why = format!("service {name} scaled to {replicas} replicas by {by}");
        let cancelled = self.stop_replicas(name, |index| index >= replicas, &why, now, dirty);
        let queued = self.fill_replicas(name, now, dirty);
        Ok(CommandResult::ServiceChanged { queued, cancelled })
    }

    pub(super) fn service_delete(
        &mut self,
        by: &str,
        admin: bool,
        name: &str,
        now: Millis,
        dirty: &mut Dirty,
    ) -> Result<CommandResult, Rejection> {
        self.service_owned(by, admin, name)?;
        let why = format!("service {name} deleted by {by}");
        let cancelled = self.stop_replicas(name, |_| true, &why, now, dirty);
        self.services.remove(name);
        dirty.meta = true;
        Ok(CommandResult::ServiceChanged {
            queued: Vec::new(),
            cancelled,
        })
    }

    /// After a command: each replica among `touched` that has ended gets
    /// its index's next job, if its service still wants the index.
    pub(super) fn replace_ended_replicas(&mut self, touched: &BTreeSet<JobId>, dirty: &mut Dirty) {
        for id in touched {
            let Some(job) = self.jobs.get(id) else {
                continue;
            };
            let Some(ReplicaOf { service, index }) = job.replica_of.clone() else {
                continue;
            };
            if job.state == JobState::Running {
                // A new version's replica that needs no health check is
                // ready once its first rank has started.
                if !job.run.as_ref().is_some_and(|r| r.started.contains(&0)) {
                    continue;
                }
                let now = job.start_time.unwrap_or(job.submit_time);
                let ready = self.services.get(&service).is_some_and(|s| {
                    s.health.is_none() && s.slots.get(&index).and_then(|x| x.next) == Some(*id)
                });
                if ready {
                    self.replica_ready(&service, index, *id, now, dirty);
                }
                continue;
            }
            if !ended(job.state) {
                continue;
            }
            let now = job.end_time.unwrap_or(job.submit_time);
            let quick = job
                .start_time
                .is_none_or(|start| now.saturating_sub(start) < QUICK_FAILURE_SECS * 1000);
            let why = job.reason.clone().unwrap_or_else(|| job.state.to_string());
            let Some(s) = self.services.get_mut(&service) else {
                continue;
            };
            let slot = s.slots.entry(index).or_default();
            if slot.next == Some(*id) {
                // The new version failed before it was ready: the roll
                // stops, the old replicas go on serving.
                slot.next = None;
                s.roll_halted = Some(format!(
                    "version {}'s replica {index} ended before it was ready: {why}; \
                     `gpuq service rollback {service}` goes back",
                    s.version
                ));
                dirty.meta = true;
                continue;
            }
            if slot.job != Some(*id) {
                continue;
            }
            if quick && slot.version == s.version && s.rolling() {
                // A replica of the new version failed soon after it took
                // its place: the roll goes no further.
                s.roll_halted = Some(format!(
                    "version {}'s replica {index} failed soon after it started: {why}; \
                     `gpuq service rollback {service}` goes back",
                    s.version
                ));
            }
            let slot = s.slots.entry(index).or_default();
            slot.job = None;
            slot.quick_failures = if quick { slot.quick_failures + 1 } else { 0 };
            let slot = slot.clone();
            dirty.meta = true;
            if index < s.replicas {
                let delay = s.restart_delay(&slot);
                let reason = if slot.quick_failures > 1 {
                    format!(
                        "replica {index} restarting in {delay} s (crash loop: {} quick exits in \
                         a row) after: {why}",
                        slot.quick_failures
                    )
                } else {
                    format!("replica {index} restarting in {delay} s after: {why}")
                };
                self.queue_replica(&service, index, now, Some((delay, reason)), false, dirty);
            } else {
                s.slots.remove(&index);
            }
        }
    }

    /// Queues a job for every index below the service's count that has
    /// none. Returns the jobs queued.
    fn fill_replicas(&mut self, name: &str, now: Millis, dirty: &mut Dirty) -> Vec<JobId> {
        let Some(s) = self.services.get(name) else {
            return Vec::new();
        };
        let missing: Vec<u32> = (0..s.replicas)
            .filter(|i| {
                let job = s.slots.get(i).and_then(|slot| slot.job);
                job.is_none_or(|j| self.jobs.get(&j).is_none_or(|j| ended(j.state)))
            })
            .collect();
        missing
            .into_iter()
            .filter_map(|index| self.queue_replica(name, index, now, None, false, dirty))
            .collect()
    }

    /// Queues index `index`'s next job; with `after`, not before its delay
    /// (seconds) and with its reason. `next`: the current version's job of
    /// a rolling update, beside the index's job; else the index's job, of
    /// the version the index runs (the current one for a new index).
    pub(super) fn queue_replica(
        &mut self,
        name: &str,
        index: u32,
        now: Millis,
        after: Option<(u64, String)>,
        next: bool,
        dirty: &mut Dirty,
    ) -> Option<JobId> {
        let s = self.services.get(name)?;
        let user = s.user.clone();
        let version = match s.slots.get(&index) {
            Some(slot) if !next && s.previous.as_ref().is_some_and(|p| p.0 == slot.version) => {
                slot.version
            }
            _ => s.version,
        };
        let mut spec = s.spec_of(version).clone();
        spec.name = format!("{name}-{index}");
        let restart = after.is_some();
        if let Some((delay, _)) = &after {
            spec.queue.begin_time = Some(now + delay * 1000);
        }
        let id = self.queue_admitted(&user, &spec, now, dirty);
        if let Some(job) = self.jobs.get_mut(&id) {
            job.replica_of = Some(ReplicaOf {
                service: name.to_string(),
                index,
            });
            job.reason = after.map(|(_, why)| why);
        }
        let slot = self.services.get_mut(name)?.slots.entry(index).or_default();
        if next {
            slot.next = Some(id);
        } else {
            slot.job = Some(id);
            slot.version = version;
            slot.restarts += u32::from(restart);
        }
        dirty.meta = true;
        Some(id)
    }

    /// Cancels the live replicas of `name` whose index `which` picks, with
    /// `why` as their reason; they are not replaced once the service no
    /// longer wants their index.
    fn stop_replicas(
        &mut self,
        name: &str,
        which: impl Fn(u32) -> bool,
        why: &str,
        now: Millis,
        dirty: &mut Dirty,
    ) -> Vec<JobId> {
        let Some(s) = self.services.get(name) else {
            return Vec::new();
        };
        let jobs: Vec<JobId> = s
            .slots
            .iter()
            .filter(|(i, _)| which(**i))
            .flat_map(|(_, slot)| slot.job.into_iter().chain(slot.next))
            .filter(|j| {
                self.jobs
                    .get(j)
                    .is_some_and(|j| matches!(j.state, JobState::Pending | JobState::Running))
            })
            .collect();
        for id in &jobs {
            if let Some(job) = self.jobs.get_mut(id) {
                job.cancelled_by = Some(why.to_string());
            }
            self.begin_ending(*id, JobState::Cancelled, why.to_string(), now, dirty);
        }
        if let Some(s) = self.services.get_mut(name) {
            s.slots
                .retain(|i, slot| !which(*i) || slot.job.is_some_and(|j| jobs.contains(&j)));
            for slot in s.slots.values_mut() {
                slot.next = slot.next.filter(|j| !jobs.contains(j));
            }
        }
        jobs
    }

    /// A replica template as a submit admits a job, less what a replica
    /// cannot be: an array, or held back by dependencies or a hold.
    pub(super) fn admit_template(&self, user: &str, spec: &JobSpec) -> Result<JobSpec, Rejection> {
        if spec.queue.array.is_some() {
            return Err(Rejection::Service(
                "a service cannot be an array: --replicas N runs N copies; drop --array".into(),
            ));
        }
        if let Some(r) = spec.placement.elastic {
            return Err(Rejection::Service(format!(
                "a service's replicas have a fixed size: --nodes {r} is for elastic batch jobs; \
                 give --nodes N and scale with --replicas"
            )));
        }
        if !spec.queue.dependency.is_empty() || spec.queue.hold {
            return Err(Rejection::Service(
                "a service's replicas start at once: drop --dependency and --hold".into(),
            ));
        }
        self.admit(user, spec)
    }

    /// Named ports that are well formed and fit, with `PORT`, in the
    /// cluster's port range.
    pub(super) fn check_ports(&self, names: &[String]) -> Result<(), Rejection> {
        check_port_names(names).map_err(Rejection::Service)?;
        let range = self.master_ports();
        if names.len() as u32 + 1 > range.len() {
            return Err(Rejection::Service(format!(
                "{} named ports and PORT need {} ports on a node; the cluster's port range \
                 {range} has {} (an admin widens it with `gpuq admin ports set FIRST-LAST`)",
                names.len(),
                names.len() + 1,
                range.len()
            )));
        }
        Ok(())
    }

    pub(super) fn service_owned(&self, by: &str, admin: bool, name: &str) -> Result<(), Rejection> {
        let s = self
            .services
            .get(name)
            .ok_or_else(|| Rejection::NoSuchService(name.to_string()))?;
        if !admin && s.user != by {
            return Err(Rejection::NotServiceOwner {
                name: name.to_string(),
                owner: s.user.clone(),
            });
        }
        Ok(())
    }
}

/// Whether a replica's job is over: in a final state, or NODE_FAIL or
/// PREEMPTED and not requeued (those two are final only until a requeue,
/// which keeps the job, so a requeued replica is left to run again).
fn ended(state: JobState) -> bool {
    state.is_final() || matches!(state, JobState::NodeFail | JobState::Preempted)
}

fn check_replicas(replicas: u32) -> Result<(), Rejection> {
    if replicas > MAX_REPLICAS {
        return Err(Rejection::Service(format!(
            "{replicas} replicas: a service may have at most {MAX_REPLICAS}"
        )));
    }
    Ok(())
}
