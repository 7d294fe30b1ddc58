//! Elastic jobs in the replicated state (see `model::elastic`): a pass's
//! growths (`Command::Resize`) and a preemption's shrinks (`Command::Preempt`)
//! start a size change; once every rank of the attempt has stopped, the
//! next attempt starts on the new nodes, RUNNING throughout.

use std::sync::Arc;

use super::{CommandResult, Dirty, State};
use crate::model::{Allocation, JobId, JobRun, JobState, Millis, Resize, ResizeRecord};
use crate::sched::Growth;

impl State {
    /// Grows each running elastic job by the nodes the pass found for it,
    /// each re-checked against the nodes as they are now. Its allocation
    /// holds its nodes and the new ones from here on.
    pub(super) fn apply_resize(
        &mut self,
        growths: &[Growth],
        now: Millis,
        dirty: &mut Dirty,
    ) -> CommandResult {
        let mut grown = Vec::new();
        let mut skipped = Vec::new();
        for g in growths {
            match self.check_growth(g) {
                Ok(to) => {
                    let why = format!("grew into {} free node(s)", g.added.nodes.len());
                    self.begin_resize(g.job, to, None, why, now, dirty);
                    grown.push(g.job);
                }
                Err(why) => skipped.push((g.job, why)),
            }
        }
        CommandResult::Resized { grown, skipped }
    }

    /// The allocation `g` grows its job to, if it may.
    fn check_growth(&self, g: &Growth) -> Result<Allocation, String> {
        let job = self.jobs.get(&g.job).ok_or("no such job")?;
        let range = job.spec.placement.elastic.ok_or("not an elastic job")?;
        let run = job.run.as_ref().ok_or("not running")?;
        if job.state != JobState::Running || run.resize.is_some() || run.preempted_for.is_some() {
            return Err(format!("job is {} or changing size", job.state));
        }
        let have = run.allocation.nodes.len();
        if !range.holds((have + g.added.nodes.len()) as u32) {
            return Err(format!(
                "{} more nodes leave its range {range}",
                g.added.nodes.len()
            ));
        }
        if g.added
            .nodes
            .iter()
            .any(|a| run.allocation.nodes.iter().any(|n| n.node == a.node))
        {
            return Err("a grown node is one it has".into());
        }
        // The added nodes as a job of their own: the same shape, free now.
        let mut part = crate::sched::PendingJob::from(job);
        part.nodes = g.added.nodes.len() as u32;
        part.placement.elastic = None;
        let added = Allocation {
            job: g.job,
            nodes: g.added.nodes.clone(),
        };
        crate::sched::check_allocation_by(|n| self.index.node_views.get(n), &added, &part)?;
        let mut to = (*run.allocation).clone();
        to.nodes.extend(added.nodes);
        Ok(to)
    }

    /// Starts changing job `id`'s size to `to`: its ranks are told to stop,
    /// and its allocation holds the nodes of both sizes until they have.
    pub(super) fn begin_resize(
        &mut self,
        id: JobId,
        to: Allocation,
        for_job: Option<JobId>,
        why: String,
        now: Millis,
        dirty: &mut Dirty,
    ) {
        let Some(run) = self.jobs.get_mut(&id).and_then(|j| j.run.as_mut()) else {
            return;
        };
        let mut held = (*run.allocation).clone();
        for n in &to.nodes {
            if !held.nodes.iter().any(|h| h.node == n.node) {
                held.nodes.push(n.clone());
            }
        }
        run.allocation = Arc::new(held);
        run.resize = Some(Resize {
            to: Arc::new(to),
            for_job,
            why,
        });
        dirty.jobs.insert(id);
        // A job with no rank running (all ended already) resizes at once.
        self.finish_if_all_ended(id, now, dirty);
    }

    /// Once every rank of a resizing job's attempt has stopped: its next
    /// attempt, on the new nodes, with the same rank-0 node and port.
    /// Returns whether it did.
    pub(super) fn finish_resize(&mut self, id: JobId, now: Millis, dirty: &mut Dirty) -> bool {
        let Some(job) = self.jobs.get_mut(&id) else {
            return false;
        };
        if job.state != JobState::Running {
            return false;
        }
        let Some(run) = job.run.as_mut() else {
            return false;
        };
        let Some(resize) = run.resize.take() else {
            return false;
        };
        // The old attempt's nodes come first in the allocation held now.
        let from_gpus = (run.allocation.nodes.iter())
            .take(job.spec.nodes as usize)
            .map(|n| n.gpus.len() as u64)
            .sum();
        let attempt = job.restart_count + job.resizes.len() as u32 + 1;
        let to = resize.to;
        job.resizes.push(ResizeRecord {
            at: now,
            attempt,
            from_nodes: job.spec.nodes,
            to_nodes: to.nodes.len() as u32,
            from_gpus,
            to_gpus: to.gpus(),
            why: resize.why,
        });
        job.spec.nodes = to.nodes.len() as u32;
        *run = JobRun {
            attempt,
            allocation: to,
            // Rank 0 is never given back: its address and port stay.
            master_addr: run.master_addr.clone(),
            master_port: run.master_port,
            started: Default::default(),
            ended: Default::default(),
            final_state: None,
            requeue: false,
            kill_grace_secs: run.kill_grace_secs,
            preempted_for: None,
            steps: Vec::new(),
            limit_changed: run.limit_changed,
            renewed_at: run.renewed_at,
            gpu_use: Default::default(),
            named_ports: run.named_ports.clone(),
            resize: None,
            // Elastic jobs take whole GPUs (`spec::placement::resolve`).
            charged_milli_gpus: None,
        };
        job.reason = None;
        dirty.jobs.insert(id);
        true
    }
}
