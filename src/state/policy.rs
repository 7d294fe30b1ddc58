//! Policy in the replicated state: the admin changes (`Command::Policy`:
//! accounts, QoS, partitions, priority weights, the MASTER_PORT range), each
//! validated whole before anything changes, and what a pass reads of the
//! policy ([`State::policy_view`]). Fair-share charging is in `fairshare`,
//! preemption in `preempt`.

use std::collections::BTreeSet;
use std::sync::Arc;

use super::{CommandResult, Dirty, Rejection, State};
use crate::model::policy::{DEFAULT_ACCOUNT, DEFAULT_PARTITION, DEFAULT_QOS};
use crate::model::policy_change::{AccountPatch, Op, PartitionPatch, PolicyChange, QosPatch};
use crate::model::{Account, JobState, Partition, Qos};
use crate::sched::{ActiveJob, PolicyView};

fn refuse(msg: impl Into<String>) -> Rejection {
    Rejection::Policy(msg.into())
}

pub(super) fn check_name(kind: &str, name: &str) -> Result<(), Rejection> {
    if name.is_empty()
        || name.len() > 64
        || !name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
    {
        return Err(refuse(format!(
            "{kind} name {name:?} is not valid; use 1-64 letters, digits, '-', '_' or '.'"
        )));
    }
    Ok(())
}

/// `add` of something that exists, `modify`/`remove` of something that does not.
fn check_op(kind: &str, name: &str, op: Op, exists: bool, builtin: bool) -> Result<(), Rejection> {
    match op {
        Op::Add if exists => Err(refuse(format!(
            "{kind} {name} already exists; change it with `gpuq admin {kind} modify {name}`"
        ))),
        Op::Modify | Op::Remove if !exists => Err(refuse(format!(
            "{kind} {name} does not exist (see `gpuq admin {kind} list`)"
        ))),
        Op::Remove if builtin => Err(refuse(format!(
            "{kind} {name} is built in and cannot be removed; modify it instead"
        ))),
        _ => Ok(()),
    }
}

impl State {
    /// `gpuq admin ports set`: a new MASTER_PORT range for jobs started from
    /// now on. Ports running jobs hold stay theirs until those jobs end, in
    /// the new range or not; a port is never given twice on a node, since
    /// apply skips every port in use there whatever the range.
    fn set_master_ports(&mut self, range: &str) -> Result<String, Rejection> {
        let new: crate::model::PortRange = range.parse().map_err(|e| {
            refuse(format!(
                "master port range {range:?} refused: {e}; nothing was changed"
            ))
        })?;
        let cluster = self.cluster.as_mut().ok_or_else(|| {
            refuse("the cluster is not initialised yet; bootstrap it first (`gpuq server --bootstrap`)")
        })?;
        let old = std::mem::replace(&mut cluster.master_ports, new);
        Ok(format!(
            "MASTER_PORT range set to {new} ({} ports; was {old}); jobs running on ports outside it keep them until they end",
            new.len()
        ))
    }

    /// Jobs not yet ended for which `pred` holds, counted.
    fn unfinished_jobs(&self, pred: impl Fn(&crate::model::Job) -> bool) -> usize {
        let active = self
            .index
            .pending
            .iter()
            .copied()
            .chain(self.index.holding());
        active
            .filter_map(|id| self.jobs.get(&id))
            .filter(|j| matches!(j.state, JobState::Pending) || j.state.is_active())
            .filter(|j| pred(j))
            .count()
    }

    pub(super) fn apply_policy(
        &mut self,
        change: &PolicyChange,
        by: &str,
        now: crate::model::Millis,
        dirty: &mut Dirty,
    ) -> Result<CommandResult, Rejection> {
        let what = match change {
            PolicyChange::Account { op, name, patch } => self.change_account(*op, name, patch)?,
            PolicyChange::Qos { op, name, patch } => self.change_qos(*op, name, patch)?,
            PolicyChange::Partition { op, name, patch } => {
                self.change_partition(*op, name, patch)?
            }
            PolicyChange::Priority(p) => {
                if p.half_life_secs == Some(0) {
                    return Err(refuse("the half-life must be positive, e.g. 7d"));
                }
                if p.max_age_secs == Some(0) {
                    return Err(refuse("the maximum age must be positive, e.g. 7d"));
                }
                let w = &mut Arc::make_mut(&mut self.policy).weights;
                let set = |slot: &mut u32, v: Option<u32>| {
                    if let Some(v) = v {
                        *slot = v;
                    }
                };
                set(&mut w.age, p.age);
                set(&mut w.fairshare, p.fairshare);
                set(&mut w.job_size, p.job_size);
                set(&mut w.qos, p.qos);
                set(&mut w.partition, p.partition);
                if let Some(v) = p.max_age_secs {
                    w.max_age_secs = v;
                }
                if let Some(v) = p.half_life_secs {
                    Arc::make_mut(&mut self.policy).half_life_secs = v;
                }
                "priority weights updated".to_string()
            }
            PolicyChange::MasterPorts { range } => self.set_master_ports(range)?,
            PolicyChange::Reservation { op, name, patch } => {
                self.change_reservation(*op, name, patch, by, now)?
            }
            PolicyChange::NodeGroup { op, name, patch } => {
                self.change_node_group(*op, name, patch)?
            }
        };
        dirty.meta = true;
        Ok(CommandResult::PolicyUpdated { what })
    }

    fn change_account(
        &mut self,
        op: Op,
        name: &str,
        p: &AccountPatch,
    ) -> Result<String, Rejection> {
        check_name("account", name)?;
        let builtin = name == DEFAULT_ACCOUNT;
        let current = self.policy.account(name);
        check_op("account", name, op, current.is_some(), builtin)?;
        if op == Op::Remove {
            if let Some(child) = self
                .policy
                .accounts
                .values()
                .find(|a| a.parent.as_deref() == Some(name))
            {
                return Err(refuse(format!(
                    "account {name} has a child account {}; remove or move it first",
                    child.name
                )));
            }
            let n = self.unfinished_jobs(|j| j.spec.account.as_deref() == Some(name));
            if n > 0 {
                return Err(refuse(format!(
                    "account {name} has {n} pending or running jobs; wait for them or cancel them first"
                )));
            }
            Arc::make_mut(&mut self.policy).accounts.remove(name);
            Arc::make_mut(&mut self.policy)
                .default_accounts
                .retain(|_, a| a != name);
            return Ok(format!("account {name} removed"));
        }
        let mut a = current.unwrap_or_else(|| Account::new(name));
        if let Some(parent) = &p.parent {
            a.parent = (!parent.is_empty()).then(|| parent.clone());
        }
        if let Some(s) = p.shares {
            if s == 0 {
                return Err(refuse("--shares must be at least 1"));
            }
            a.shares = s;
        }
        for u in &p.add_users {
            check_name("user", u)?;
            a.users.insert(u.clone());
        }
        for u in &p.remove_users {
            a.users.remove(u);
        }
        if let Some(l) = p.max_gpus {
            a.max_gpus = l.get32();
        }
        if let Some(g) = p.guaranteed_gpus {
            a.guaranteed_gpus = g;
        }
        if let Some(max) = a.max_gpus {
            if a.guaranteed_gpus > max {
                return Err(refuse(format!(
                    "account {name}: the guarantee ({}) is over the cap (--max-gpus {max})",
                    a.guaranteed_gpus
                )));
            }
        }
        if let Some(parent) = &a.parent {
            if self.policy.account(parent).is_none() {
                return Err(refuse(format!(
                    "parent account {parent} does not exist; add it first"
                )));
            }
            // Walk up from the parent: reaching this account is a cycle.
            let mut seen = BTreeSet::new();
            let mut cur = Some(parent.clone());
            while let Some(c) = cur {
                if c == name {
                    return Err(refuse(format!(
                        "account {name} cannot have parent {parent}: {parent} is below {name}"
                    )));
                }
                if !seen.insert(c.clone()) {
                    break;
                }
                cur = self.policy.account(&c).and_then(|x| x.parent);
            }
        }
        for u in &p.default_for {
            if !a.admits(u) {
                return Err(refuse(format!(
                    "user {u} is not in account {name}; add them with --add-user {u}"
                )));
            }
        }
        for u in &p.default_for {
            Arc::make_mut(&mut self.policy)
                .default_accounts
                .insert(u.clone(), name.to_string());
        }
        Arc::make_mut(&mut self.policy)
            .accounts
            .insert(name.to_string(), a);
        Ok(format!(
            "account {name} {}",
            if op == Op::Add { "added" } else { "modified" }
        ))
    }

    fn change_qos(&mut self, op: Op, name: &str, p: &QosPatch) -> Result<String, Rejection> {
        check_name("qos", name)?;
        let current = self.policy.qos(name);
        check_op("qos", name, op, current.is_some(), name == DEFAULT_QOS)?;
        if op == Op::Remove {
            let n = self.unfinished_jobs(|j| j.spec.qos.as_deref() == Some(name));
            if n > 0 {
                return Err(refuse(format!(
                    "QoS {name} has {n} pending or running jobs; wait for them or cancel them first"
                )));
            }
            Arc::make_mut(&mut self.policy).qos.remove(name);
            for q in Arc::make_mut(&mut self.policy).qos.values_mut() {
                q.preempts.remove(name);
            }
            return Ok(format!("qos {name} removed"));
        }
        let mut q = current.unwrap_or_else(|| Qos::new(name));
        if let Some(v) = p.priority {
            q.priority = v;
        }
        if let Some(list) = &p.preempts {
            for other in list {
                if other == name {
                    return Err(refuse(format!("QoS {name} cannot preempt itself")));
                }
                if self.policy.qos(other).is_none() {
                    return Err(refuse(format!(
                        "QoS {other} (in --preempts) does not exist; add it first"
                    )));
                }
            }
            q.preempts = list.iter().cloned().collect();
        }
        if let Some(m) = p.preempt_mode {
            q.preempt_mode = m;
        }
        if let Some(l) = p.grace_secs {
            q.grace_secs = l.get();
        }
        if let Some(l) = p.max_gpus_per_user {
            q.max_gpus_per_user = l.get32();
        }
        if let Some(l) = p.max_gpus_per_job {
            q.max_gpus_per_job = l.get32();
        }
        if let Some(list) = &p.allowed_accounts {
            if let Some(missing) = list.iter().find(|a| self.policy.account(a).is_none()) {
                return Err(refuse(format!(
                    "account {missing} (in --allow-accounts) does not exist; add it first"
                )));
            }
            q.allowed_accounts = list.iter().cloned().collect();
        }
        if let Some(list) = &p.allowed_users {
            q.allowed_users = list.iter().cloned().collect();
        }
        if let Some(l) = p.idle_gpu_secs {
            q.idle_gpu_secs = l.get();
        }
        if let Some(c) = p.cancel_idle {
            q.cancel_idle = c;
        }
        if q.cancel_idle && q.idle_gpu_secs == Some(0) {
            return Err(refuse(format!(
                "QoS {name} cancels idle jobs but never flags one (--idle-gpu-time 0): \
                 give a time, or --cancel-idle false"
            )));
        }
        Arc::make_mut(&mut self.policy)
            .qos
            .insert(name.to_string(), q);
        Ok(format!(
            "qos {name} {}",
            if op == Op::Add { "added" } else { "modified" }
        ))
    }

    fn change_partition(
        &mut self,
        op: Op,
        name: &str,
        p: &PartitionPatch,
    ) -> Result<String, Rejection> {
        check_name("partition", name)?;
        let current = self.policy.partition(name);
        check_op(
            "partition",
            name,
            op,
            current.is_some(),
            name == DEFAULT_PARTITION,
        )?;
        if op == Op::Remove {
            let n = self.unfinished_jobs(|j| j.spec.partition.as_deref() == Some(name));
            if n > 0 {
                return Err(refuse(format!(
                    "partition {name} has {n} pending or running jobs; wait for them or cancel them first"
                )));
            }
            Arc::make_mut(&mut self.policy).partitions.remove(name);
            return Ok(format!("partition {name} removed"));
        }
        let mut part = current.unwrap_or_else(|| Partition::new(name));
        if let Some(nodes) = &p.nodes {
            if nodes.is_empty() {
                part.nodes = None;
            } else {
                crate::model::expand_hostlist(nodes)
                    .map_err(|e| refuse(format!("--nodes {nodes:?}: {e}")))?;
                part.nodes = Some(nodes.clone());
            }
        }
        if let Some(l) = p.default_time_secs {
            part.default_time_secs = l.get();
        }
        if let Some(l) = p.max_time_secs {
            part.max_time_secs = l.get();
        }
        if let (Some(d), Some(m)) = (part.default_time_secs, part.max_time_secs) {
            if d > m {
                return Err(refuse(format!(
                    "partition {name}: the default time is over the maximum time"
                )));
            }
        }
        if let Some(v) = p.priority {
            part.priority = v;
        }
        if let Some(s) = p.state {
            part.state = s;
        }
        if let Some(d) = p.default {
            if d {
                for other in Arc::make_mut(&mut self.policy).partitions.values_mut() {
                    other.default = false;
                }
            }
            part.default = d;
        }
        Arc::make_mut(&mut self.policy)
            .partitions
            .insert(name.to_string(), part);
        Ok(format!(
            "partition {name} {}",
            if op == Op::Add { "added" } else { "modified" }
        ))
    }

    /// What a pass needs of the policy: the policy, usage and the jobs that
    /// hold resources.
    pub fn policy_view(&self) -> PolicyView {
        let running = self
            .index
            .holding()
            .filter_map(|id| active_job(self.jobs.get(&id)?))
            .collect();
        self.policy_view_of(running)
    }

    /// [`State::policy_view`] with its running jobs given.
    pub(super) fn policy_view_of(&self, running: Vec<ActiveJob>) -> PolicyView {
        PolicyView {
            policy: Arc::clone(&self.policy),
            usage: self.usage.clone(),
            running,
        }
    }
}

/// A job holding resources as the policy sees it, if it is one.
pub(super) fn active_job(j: &crate::model::Job) -> Option<ActiveJob> {
    let run = j.run.as_ref().filter(|_| j.state.is_active())?;
    Some(ActiveJob {
        id: j.id,
        user: j.user.as_str().into(),
        account: j.spec.account.as_deref().unwrap_or_default().into(),
        qos: j.spec.qos.as_deref().unwrap_or_default().into(),
        gpus: run.allocation.gpus(),
        start_time: j.start_time.unwrap_or(0),
        allocation: run.allocation.clone(),
        completing: j.state == JobState::Completing,
        // A shrinking elastic job stops its ranks for its preemptor too.
        preempted_for: (run.preempted_for).or(run.resize.as_ref().and_then(|r| r.for_job)),
        elastic: j.spec.placement.elastic.map(|range| {
            Box::new(crate::sched::ElasticRun {
                shape: crate::sched::PendingJob {
                    id: j.id,
                    user: j.user.as_str().into(),
                    ..crate::sched::PendingJob::of_spec(&j.spec)
                },
                range,
                end: (j.spec.time_limit_secs).map(|s| {
                    j.start_time
                        .unwrap_or(0)
                        .saturating_add(s.saturating_mul(1000))
                }),
                since: (j.resizes.last().map(|r| r.at))
                    .max(j.start_time)
                    .unwrap_or(0),
                resizing_to: run.resize.as_ref().map(|r| r.to.clone()),
            })
        }),
    })
}
