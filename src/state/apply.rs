//! `State::apply`: the deterministic transition function over the log.

use super::{ClusterRecord, Command, CommandResult, Dirty, Rejection, State};
use crate::model::JobState;

impl State {
    /// Applies one command, recording touched records in `dirty`. A rejected
    /// command changes nothing.
    pub fn apply(&mut self, cmd: &Command, dirty: &mut Dirty) -> CommandResult {
        // The records this command touches, to keep the indexes in step.
        let mut mine = Dirty::default();
        let r = match self.try_apply(cmd, &mut mine) {
            Ok(r) => r,
            Err(why) => CommandResult::Rejected(why),
        };
        if !matches!(cmd, Command::Batch(_)) {
            if !self.services.is_empty() {
                // Taken, not copied: this runs after every command.
                let touched = std::mem::take(&mut mine.jobs);
                self.replace_ended_replicas(&touched, &mut mine);
                mine.jobs.extend(touched);
            }
            for id in &mine.jobs {
                self.reindex_job(*id);
            }
            for n in &mine.nodes {
                self.refresh_node_view(n);
            }
        }
        dirty.merge(mine);
        r
    }

    fn try_apply(&mut self, cmd: &Command, dirty: &mut Dirty) -> Result<CommandResult, Rejection> {
        match cmd {
            Command::InitCluster {
                name,
                ca_cert_pem,
                ca_key_pem,
                master_ports,
                now,
            } => {
                if self.cluster.is_some() {
                    return Err(Rejection::AlreadyInitialized);
                }
                self.cluster = Some(ClusterRecord {
                    name: name.clone(),
                    ca_cert_pem: ca_cert_pem.clone(),
                    ca_key_pem: ca_key_pem.clone(),
                    created_at: *now,
                    master_ports: *master_ports,
                });
                dirty.meta = true;
                Ok(CommandResult::Initialized)
            }
            Command::Submit { user, spec, now } => {
                let id = self.submit(user, spec, *now, dirty)?;
                Ok(CommandResult::Submitted { id })
            }
            Command::SubmitMany { user, specs, now } => Ok(CommandResult::SubmittedMany {
                ids: self.submit_many(user, specs, *now, dirty)?,
            }),
            Command::Hold {
                by,
                admin,
                ids,
                hold,
            } => Ok(CommandResult::Held {
                ids: self.set_held(by, *admin, ids, *hold, dirty)?,
                hold: *hold,
            }),
            Command::Cancel {
                by,
                admin,
                ids,
                now,
            } => {
                if ids.is_empty() {
                    return Err(Rejection::Empty);
                }
                // Check every id before touching any: all or nothing.
                for id in ids {
                    let job = self.jobs.get(id).ok_or(Rejection::NoSuchJob(*id))?;
                    if !admin && job.user != *by {
                        return Err(Rejection::NotOwner {
                            id: *id,
                            owner: job.user.clone(),
                        });
                    }
                    if job.state.is_final() || job.state == JobState::Completing {
                        return Err(Rejection::AlreadyEnded {
                            id: *id,
                            state: job.state,
                        });
                    }
                }
                let mut done = Vec::with_capacity(ids.len());
                for id in ids {
                    let reason = format!("cancelled by {by}");
                    if let Some(job) = self.jobs.get_mut(id) {
                        job.cancelled_by = Some(by.clone());
                    }
                    // A running job stops its ranks first (COMPLETING); a
                    // pending one ends at once.
                    if self.begin_ending(*id, JobState::Cancelled, reason, *now, dirty) {
                        done.push(*id);
                    }
                }
                Ok(CommandResult::Cancelled { ids: done })
            }
            Command::CreateToken { record } => {
                if self.tokens.contains_key(&record.id) {
                    return Err(Rejection::DuplicateToken(record.id.clone()));
                }
                self.tokens.insert(record.id.clone(), record.clone());
                dirty.tokens.insert(record.id.clone());
                Ok(CommandResult::TokenCreated)
            }
            Command::RevokeToken { id, .. } => {
                if let Some(t) = self.api_tokens.get_mut(id) {
                    t.revoked = true;
                    dirty.meta = true;
                    return Ok(CommandResult::TokenRevoked);
                }
                let t = self
                    .tokens
                    .get_mut(id)
                    .ok_or_else(|| Rejection::NoSuchToken(id.clone()))?;
                t.revoked = true;
                dirty.tokens.insert(id.clone());
                Ok(CommandResult::TokenRevoked)
            }
            Command::CreateApiToken { record } => {
                if self.api_tokens.contains_key(&record.id) || self.tokens.contains_key(&record.id)
                {
                    return Err(Rejection::DuplicateToken(record.id.clone()));
                }
                self.api_tokens.insert(record.id.clone(), record.clone());
                dirty.meta = true;
                Ok(CommandResult::ApiTokenCreated)
            }
            Command::RegisterNode {
                inventory,
                addr,
                preflight,
                now,
                cert_sha256,
            } => self.register_node(inventory, addr, *preflight, cert_sha256, *now, dirty),
            Command::AllowReplace { node, .. } => {
                let n = self
                    .nodes
                    .get_mut(node)
                    .ok_or_else(|| Rejection::NoSuchNode(node.clone()))?;
                n.replace_allowed = true;
                dirty.nodes.insert(node.clone());
                Ok(CommandResult::NodeUpdated)
            }
            Command::Schedule { allocations, now } => {
                Ok(self.apply_schedule(allocations, *now, dirty))
            }
            Command::ServiceCreate {
                user,
                name,
                spec,
                settings,
                now,
            } => self.service_create(user, name, spec, settings, *now, dirty),
            Command::ServiceScale {
                by,
                admin,
                name,
                replicas,
                now,
            } => self.service_scale(by, *admin, name, *replicas, *now, dirty),
            Command::ServiceDelete {
                by,
                admin,
                name,
                now,
            } => self.service_delete(by, *admin, name, *now, dirty),
            Command::ServiceUpdate {
                by,
                admin,
                name,
                spec,
                now,
            } => self.service_update(by, *admin, name, spec.as_deref(), *now, dirty),
            Command::ServiceApply {
                by,
                admin,
                name,
                spec,
                settings,
                now,
            } => self.service_apply(by, *admin, name, spec, settings, *now, dirty),
            Command::Power { changes, now } => Ok(self.apply_power(changes, *now, dirty)),
            Command::Resize { growths, now } => Ok(self.apply_resize(growths, *now, dirty)),
            Command::ServiceReplicaReady {
                name,
                index,
                job,
                now,
            } => Ok(CommandResult::ServiceChanged {
                queued: self
                    .replica_ready(name, *index, *job, *now, dirty)
                    .into_iter()
                    .collect(),
                cancelled: Vec::new(),
            }),
            Command::TaskEvents {
                node,
                events,
                now,
                gpu_use,
            } => Ok(self.apply_task_events(node, events, gpu_use, *now, dirty)),
            Command::NodeDown { node, reason, now } => {
                Ok(self.node_down(node, reason, *now, dirty))
            }
            Command::SetDrain {
                node,
                drain,
                by,
                user,
                requeue_now,
                now,
            } => Ok(self.set_drain(
                node,
                drain.as_deref().map(|d| (d, user.as_deref())),
                *by,
                *requeue_now,
                *now,
                dirty,
            )),
            Command::Archive { before } => Ok(self.archive(*before, dirty)),
            Command::GpuHealth { node, gpus, now } => Ok(self.gpu_health(node, gpus, *now, dirty)),
            Command::Policy { change, by, now } => self.apply_policy(change, by, *now, dirty),
            Command::Preempt { preemptions, now } => {
                Ok(self.apply_preempt(preemptions, *now, dirty))
            }
            Command::Batch(cmds) => Ok(CommandResult::Batch(
                cmds.iter()
                    .map(|c| match c {
                        Command::Batch(_) => CommandResult::Rejected(Rejection::NestedBatch),
                        c => self.apply(c, dirty),
                    })
                    .collect(),
            )),
            Command::StepStart {
                by,
                admin,
                job,
                spec,
                now,
            } => self.start_step(by, *admin, *job, spec, *now, dirty),
            Command::StepCancel {
                by,
                admin,
                job,
                step,
                ..
            } => self.cancel_step(by, *admin, *job, *step, dirty),
            Command::Requeue {
                by,
                admin,
                ids,
                hold,
                now,
            } => self.requeue(by, *admin, ids, *hold, *now, dirty),
            Command::Expire { jobs, now } => Ok(self.expire(jobs, *now, dirty)),
            Command::Update {
                by,
                admin,
                ids,
                change,
            } => self.update(by, *admin, ids, change, dirty),
            Command::Release {
                by,
                admin,
                job,
                now,
            } => self.release(by, *admin, *job, *now, dirty),
            Command::Keepalive {
                by,
                admin,
                job,
                now,
            } => self.keep_alive(by, *admin, *job, *now, dirty),
            Command::ReleaseInactive {
                jobs,
                now,
                limit_secs,
            } => Ok(self.release_inactive(jobs, *now, *limit_secs, dirty)),
            Command::SetMig {
                node,
                layout,
                user,
                requeue_now,
                now,
            } => self.set_mig(node, layout, user.as_deref(), *requeue_now, *now, dirty),
            Command::MigFailed { node, error, now } => self.mig_failed(node, error, *now, dirty),
            Command::SetShare { node, slots, .. } => self.set_share(node, *slots, dirty),
            Command::TokenUsed { id, .. } => {
                let t = self
                    .tokens
                    .get_mut(id)
                    .ok_or_else(|| Rejection::NoSuchToken(id.clone()))?;
                // The count decides here, in log order: of two joins racing
                // for a single-use token's last use, one is refused.
                if t.used_up() {
                    return Err(Rejection::TokenUsedUp(id.clone()));
                }
                t.uses += 1;
                dirty.tokens.insert(id.clone());
                Ok(CommandResult::TokenUsed)
            }
        }
    }
}
