//! Rolling updates of services in apply (`gpuq service update|rollback`).
//! An update makes the new spec the service's next version; then, one index
//! at a time, a job of the new version starts beside the index's job, and
//! once it is ready (running, and reported healthy where the service has a
//! health check: `ServiceReplicaReady` from the leader) it takes the index
//! and the old job is stopped. So no replica stops before its successor
//! serves: never fewer ready replicas than wanted. A new replica that ends
//! before it is ready halts the roll with its reason, leaving the old ones
//! serving; `rollback` rolls to the version before the same way.

use super::{CommandResult, Dirty, Rejection, State};
use crate::model::{JobId, JobSpec, JobState, Millis, ServiceSettings};

impl State {
    /// A new version of `name` (`spec`), or the one before (`None`:
    /// rollback), rolled out one replica at a time.
    pub(super) fn service_update(
        &mut self,
        by: &str,
        admin: bool,
        name: &str,
        spec: Option<&JobSpec>,
        now: Millis,
        dirty: &mut Dirty,
    ) -> Result<CommandResult, Rejection> {
        self.service_owned(by, admin, name)?;
        let s = &self.services[name];
        let new = match spec {
            Some(spec) => self.admit_template(&s.user, spec)?,
            None => match &s.previous {
                Some((_, spec)) => spec.clone(),
                None => {
                    return Err(Rejection::Service(format!(
                        "service {name} has no earlier version to roll back to"
                    )))
                }
            },
        };
        // A roll under way is superseded: its new replicas stop.
        let superseded: Vec<JobId> = s.slots.values().filter_map(|x| x.next).collect();
        let Some(s) = self.services.get_mut(name) else {
            return Err(Rejection::NoSuchService(name.to_string()));
        };
        let old = std::mem::replace(&mut s.spec, new);
        s.previous = Some((s.version, old));
        s.version += 1;
        s.roll_halted = None;
        let version = s.version;
        for slot in s.slots.values_mut() {
            slot.next = None;
        }
        dirty.meta = true;
        let why = format!("superseded by version {version} of service {name}");
        for id in &superseded {
            self.begin_ending(*id, JobState::Cancelled, why.clone(), now, dirty);
        }
        let queued = self.roll_step(name, now, dirty).into_iter().collect();
        Ok(CommandResult::ServiceChanged {
            queued,
            cancelled: superseded,
        })
    }

    /// Index `index`'s new-version job `job` is ready: it takes the index,
    /// the old job stops, and the roll moves on.
    pub(super) fn replica_ready(
        &mut self,
        name: &str,
        index: u32,
        job: JobId,
        now: Millis,
        dirty: &mut Dirty,
    ) -> Option<JobId> {
        let s = self.services.get_mut(name)?;
        let version = s.version;
        let slot = s.slots.get_mut(&index)?;
        if slot.next != Some(job) {
            return None;
        }
        let old = slot.job.replace(job);
        slot.next = None;
        slot.version = version;
        dirty.meta = true;
        if let Some(old) = old {
            let why = format!("replaced by version {version} of service {name}");
            if let Some(j) = self.jobs.get_mut(&old) {
                j.cancelled_by = Some(why.clone());
            }
            self.begin_ending(old, JobState::Cancelled, why, now, dirty);
        }
        self.roll_step(name, now, dirty)
    }

    /// Starts the next index's new-version job, if the roll goes on and
    /// none is starting.
    fn roll_step(&mut self, name: &str, now: Millis, dirty: &mut Dirty) -> Option<JobId> {
        let s = self.services.get(name)?;
        if !s.rolling() || s.slots.values().any(|x| x.next.is_some()) {
            return None;
        }
        let (&index, _) = s
            .slots
            .iter()
            .find(|(i, x)| **i < s.replicas && x.version < s.version)?;
        self.queue_replica(name, index, now, None, true, dirty)
    }
}

impl State {
    /// `gpuq service apply`: creates `name` as given, or changes it to be
    /// as given (a rolling update for a new spec, a scale for a new count,
    /// the rest set), or changes nothing. Returns the changes made, in
    /// words.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn service_apply(
        &mut self,
        by: &str,
        admin: bool,
        name: &str,
        spec: &JobSpec,
        settings: &ServiceSettings,
        now: Millis,
        dirty: &mut Dirty,
    ) -> Result<CommandResult, Rejection> {
        let ServiceSettings {
            replicas,
            restart_delay_secs: delay,
            health,
            ports,
        } = settings.clone();
        let Some(s) = self.services.get(name) else {
            let r = self.service_create(by, name, spec, settings, now, dirty)?;
            let CommandResult::ServiceChanged { queued, cancelled } = r else {
                return Ok(r);
            };
            return Ok(CommandResult::ServiceApplied {
                changes: vec![format!("created with {replicas} replicas")],
                queued,
                cancelled,
            });
        };
        self.service_owned(by, admin, name)?;
        if let Some(h) = &health {
            h.check().map_err(Rejection::Service)?;
        }
        self.check_ports(&ports)?;
        let admitted = self.admit_template(&s.user, spec)?;
        let (new_spec, new_count) = (admitted != s.spec, replicas != s.replicas);
        let (old_count, old_delay) = (s.replicas, s.restart_delay_secs);
        let new_health = health != s.health;
        let new_ports = ports != s.ports;
        let mut changes = Vec::new();
        let (mut queued, mut cancelled) = (Vec::new(), Vec::new());
        if delay != old_delay || new_health || new_ports {
            let s = self.services.get_mut(name).expect("checked above");
            s.restart_delay_secs = delay;
            s.health = health;
            s.ports = ports;
            dirty.meta = true;
            if new_ports {
                changes.push("named ports (new replicas get them)".to_string());
            }
            if delay != old_delay {
                changes.push(format!("restart delay {old_delay} s -> {delay} s"));
            }
            if new_health {
                changes.push("health check (new replicas check it)".to_string());
            }
        }
        if new_count {
            changes.push(format!("replicas {old_count} -> {replicas}"));
            let r = self.service_scale(by, admin, name, replicas, now, dirty)?;
            merge(r, &mut queued, &mut cancelled);
        }
        if new_spec {
            let r = self.service_update(by, admin, name, Some(&admitted), now, dirty)?;
            changes.push(format!("version {}", self.services[name].version));
            merge(r, &mut queued, &mut cancelled);
        }
        Ok(CommandResult::ServiceApplied {
            changes,
            queued,
            cancelled,
        })
    }
}

/// Adds a service command's jobs to `queued` and `cancelled`.
fn merge(r: CommandResult, queued: &mut Vec<JobId>, cancelled: &mut Vec<JobId>) {
    if let CommandResult::ServiceChanged {
        queued: q,
        cancelled: c,
    } = r
    {
        queued.extend(q);
        cancelled.extend(c);
    }
}
