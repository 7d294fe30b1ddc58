//! `State::apply`: the deterministic transition function over the log.

use super::{ClusterRecord, Command, CommandResult, Dirty, Rejection, State};
use crate::model::{Job, JobId, JobState};

impl State {
    /// Applies one command, recording touched records in `dirty`. A rejected
    /// command changes nothing.
    pub fn apply(&mut self, cmd: &Command, dirty: &mut Dirty) -> CommandResult {
        match self.try_apply(cmd, dirty) {
            Ok(r) => r,
            Err(why) => CommandResult::Rejected(why),
        }
    }

    fn try_apply(&mut self, cmd: &Command, dirty: &mut Dirty) -> Result<CommandResult, Rejection> {
        match cmd {
            Command::InitCluster {
                name,
                ca_cert_pem,
                ca_key_pem,
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
                });
                dirty.meta = true;
                Ok(CommandResult::Initialized)
            }
            Command::Submit { user, spec, now } => {
                spec.check_invariants().map_err(Rejection::InvalidSpec)?;
                let mut spec = spec.clone();
                self.policy
                    .resolve(user, &mut spec)
                    .map_err(Rejection::Policy)?;
                let id = JobId(self.counters.next_job_id);
                self.counters.next_job_id += 1;
                self.jobs.insert(
                    id,
                    Job {
                        id,
                        user: user.clone(),
                        spec: *spec,
                        state: JobState::Pending,
                        submit_time: *now,
                        start_time: None,
                        end_time: None,
                        restart_count: 0,
                        reason: None,
                        exit_code: None,
                        cancelled_by: None,
                        run: None,
                        preemptions: Vec::new(),
                    },
                );
                dirty.meta = true;
                dirty.jobs.insert(id);
                Ok(CommandResult::Submitted { id })
            }
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
                let t = self
                    .tokens
                    .get_mut(id)
                    .ok_or_else(|| Rejection::NoSuchToken(id.clone()))?;
                t.revoked = true;
                dirty.tokens.insert(id.clone());
                Ok(CommandResult::TokenRevoked)
            }
            Command::RegisterNode {
                inventory,
                addr,
                preflight,
                now,
            } => Ok(self.register_node(inventory, addr, *preflight, *now, dirty)),
            Command::Schedule { allocations, now } => {
                Ok(self.apply_schedule(allocations, *now, dirty))
            }
            Command::TaskEvents { node, events, now } => {
                Ok(self.apply_task_events(node, events, *now, dirty))
            }
            Command::NodeDown { node, reason, now } => {
                Ok(self.node_down(node, reason, *now, dirty))
            }
            Command::SetDrain {
                node,
                drain,
                by,
                requeue_now,
                now,
            } => Ok(self.set_drain(node, drain.as_deref(), *by, *requeue_now, *now, dirty)),
            Command::GpuHealth { node, gpus, now } => Ok(self.gpu_health(node, gpus, *now, dirty)),
            Command::Policy { change, .. } => self.apply_policy(change, dirty),
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
            Command::TokenUsed { id, .. } => {
                let t = self
                    .tokens
                    .get_mut(id)
                    .ok_or_else(|| Rejection::NoSuchToken(id.clone()))?;
                t.uses += 1;
                dirty.tokens.insert(id.clone());
                Ok(CommandResult::TokenUsed)
            }
        }
    }
}
