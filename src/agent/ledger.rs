//! The compute agent's ledger: what it was told (the desired tasks of the
//! current connection) and what it reported (starts and ends, in numbered
//! batches kept until the leader acknowledges them), and one reconcile step
//! between the two.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use super::runner::{Observed, TaskRunner};
use crate::model::{TaskEnd, TaskEvent, TaskEventKind, TaskKey};
use crate::net::agent_proto::DesiredTask;

/// Starts the tasks, up to the runner's `parallel_starts` at a time;
/// results in order.
fn start_all(
    runner: &dyn TaskRunner,
    tasks: Vec<(TaskKey, &DesiredTask)>,
) -> Vec<(TaskKey, Result<(), String>)> {
    let parallel = runner.parallel_starts().max(1);
    if tasks.len() <= 1 || parallel == 1 {
        return tasks
            .into_iter()
            .map(|(key, task)| (key, runner.start(task)))
            .collect();
    }
    let mut results = Vec::with_capacity(tasks.len());
    for chunk in tasks.chunks(parallel) {
        std::thread::scope(|scope| {
            let handles: Vec<_> = chunk
                .iter()
                .map(|&(key, task)| (key, scope.spawn(move || runner.start(task))))
                .collect();
            for (key, handle) in handles {
                let started = handle
                    .join()
                    .unwrap_or_else(|_| Err("the task's start panicked".to_string()));
                results.push((key, started));
            }
        });
    }
    results
}

/// The agent's memory of what it reported and what it was told.
#[derive(Default)]
pub(super) struct Ledger {
    /// The desired set of the current connection; `None` until it arrived.
    pub(super) desired: Option<HashMap<TaskKey, DesiredTask>>,
    /// Ranks of the leader's ending jobs on this node with no end committed
    /// (sent with the desired set): one this node does not have is reported
    /// ended here, since nothing else would ever end it.
    pub(super) stopping: BTreeSet<TaskKey>,
    /// Jobs being preempted: their tasks stop with their `--signal` first.
    pub(super) preempted: BTreeSet<crate::model::JobId>,
    started_reported: BTreeSet<TaskKey>,
    ended_reported: BTreeSet<TaskKey>,
    /// Ends the leader has committed.
    ended_committed: BTreeSet<TaskKey>,
    /// The time limit each running task was given (at its start, or since:
    /// `scontrol update TimeLimit=`); a task adopted from an earlier agent
    /// process is told the desired one once.
    limits: HashMap<TaskKey, Option<u64>>,
    /// Event batches not yet acknowledged, by sequence number.
    pub(super) unacked: BTreeMap<u64, Vec<TaskEvent>>,
    next_seq: u64,
}

impl Ledger {
    /// One reconcile step: returns the new events to send.
    pub(super) fn reconcile(&mut self, runner: &dyn TaskRunner) -> Vec<TaskEvent> {
        let observed = runner.scan();
        let mut events = Vec::new();
        let mut seen = BTreeSet::new();
        // A task still stopping holds its GPUs: start nothing new on this
        // node until it is gone (a requeued job's stale rank, a cancel).
        let stopping = self.desired.as_ref().is_some_and(|d| {
            observed
                .iter()
                .any(|(k, o)| *o == Observed::Running && !d.contains_key(k))
        });
        for (key, obs) in observed {
            seen.insert(key);
            let desired = self.desired.as_ref().map(|d| d.contains_key(&key));
            match obs {
                Observed::Running => {
                    if self.started_reported.insert(key) {
                        events.push(TaskEvent {
                            key,
                            kind: TaskEventKind::Started,
                        });
                    }
                    let wanted = self.desired.as_ref().and_then(|d| d.get(&key));
                    if let Some(limit) = wanted.map(|t| t.time_limit_secs) {
                        if self.limits.insert(key, limit) != Some(limit) {
                            runner.set_time_limit(key, limit);
                        }
                    }
                    if desired == Some(false) {
                        if self.preempted.contains(&key.job) {
                            runner.stop_preempted(key);
                        } else {
                            runner.stop(key);
                        }
                    }
                }
                Observed::Ended(end) => {
                    if self.started_reported.insert(key)
                        && !matches!(end, TaskEnd::LaunchFailed { .. })
                    {
                        events.push(TaskEvent {
                            key,
                            kind: TaskEventKind::Started,
                        });
                    }
                    if self.ended_reported.insert(key) {
                        events.push(TaskEvent {
                            key,
                            kind: TaskEventKind::Ended(end),
                        });
                    }
                    self.limits.remove(&key);
                    if self.ended_committed.contains(&key) && desired == Some(false) {
                        runner.forget(key);
                        self.started_reported.remove(&key);
                        self.ended_reported.remove(&key);
                        self.ended_committed.remove(&key);
                    }
                }
            }
        }
        // An ending job's rank that this node does not have: cancelled
        // before any desired set carried it here (a cancel right after the
        // schedule, across a leader change), or its directory is gone.
        // Reconcile runs one step at a time, so a task being started now
        // would be in `seen`.
        for &key in &self.stopping {
            if seen.contains(&key) || !self.ended_reported.insert(key) {
                continue;
            }
            let end = if self.started_reported.contains(&key) {
                TaskEnd::Lost {
                    reason: "its task directory is gone from the node".into(),
                }
            } else {
                TaskEnd::Cancelled
            };
            tracing::info!(task = %key, "an ending job's task that this node does not have: reported ended");
            events.push(TaskEvent {
                key,
                kind: TaskEventKind::Ended(end),
            });
        }
        // Ends of tasks with no directory, once committed and neither
        // desired nor stopping any more, are forgotten.
        let listed = |k: &TaskKey| {
            self.stopping.contains(k) || self.desired.as_ref().is_some_and(|d| d.contains_key(k))
        };
        let done: Vec<TaskKey> = self
            .ended_committed
            .iter()
            .filter(|k| !seen.contains(*k) && !listed(k))
            .copied()
            .collect();
        for key in done {
            self.ended_committed.remove(&key);
            self.ended_reported.remove(&key);
            self.started_reported.remove(&key);
        }
        let to_start: Vec<(TaskKey, &DesiredTask)> = match &self.desired {
            Some(desired) if !stopping => desired
                .iter()
                .filter(|(key, _)| !seen.contains(*key) && !self.ended_reported.contains(*key))
                .map(|(key, task)| (*key, task))
                .collect(),
            _ => Vec::new(),
        };
        let limits: Vec<(TaskKey, Option<u64>)> = to_start
            .iter()
            .map(|(k, t)| (*k, t.time_limit_secs))
            .collect();
        for ((key, started), (_, limit)) in start_all(runner, to_start).into_iter().zip(limits) {
            match started {
                // Launched: report it now rather than at the next scan.
                Ok(()) => {
                    self.limits.insert(key, limit);
                    if self.started_reported.insert(key) {
                        events.push(TaskEvent {
                            key,
                            kind: TaskEventKind::Started,
                        });
                    }
                }
                Err(reason) => {
                    tracing::warn!(job = key.job.0, rank = key.rank, %reason, "task could not start");
                    self.started_reported.insert(key);
                    self.ended_reported.insert(key);
                    events.push(TaskEvent {
                        key,
                        kind: TaskEventKind::Ended(TaskEnd::LaunchFailed { reason }),
                    });
                }
            }
        }
        events
    }

    pub(super) fn queue(&mut self, events: Vec<TaskEvent>) -> Option<(u64, Vec<TaskEvent>)> {
        if events.is_empty() {
            return None;
        }
        self.next_seq += 1;
        self.unacked.insert(self.next_seq, events.clone());
        Some((self.next_seq, events))
    }

    pub(super) fn committed(&mut self, seq: u64) {
        let acked: Vec<u64> = self.unacked.range(..=seq).map(|(s, _)| *s).collect();
        for s in acked {
            if let Some(batch) = self.unacked.remove(&s) {
                for ev in batch {
                    if let TaskEventKind::Ended(_) = ev.kind {
                        self.ended_committed.insert(ev.key);
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use super::*;
    use crate::model::{JobId, Program};

    fn key(job: u64, rank: u32) -> TaskKey {
        TaskKey {
            job: JobId(job),
            attempt: 0,
            rank,
            step: None,
        }
    }

    #[derive(Default)]
    struct FakeRunner {
        tasks: Mutex<BTreeMap<TaskKey, Observed>>,
        started: Mutex<Vec<TaskKey>>,
        stopped: Mutex<Vec<TaskKey>>,
        limits: Mutex<Vec<(TaskKey, Option<u64>)>>,
        refuse: Mutex<bool>,
        parallel: usize,
    }

    impl TaskRunner for FakeRunner {
        fn parallel_starts(&self) -> usize {
            self.parallel
        }
        fn start(&self, task: &DesiredTask) -> Result<(), String> {
            if *self.refuse.lock().unwrap() {
                return Err("no shim".into());
            }
            self.started.lock().unwrap().push(task.key);
            self.tasks
                .lock()
                .unwrap()
                .insert(task.key, Observed::Running);
            Ok(())
        }
        fn stop(&self, key: TaskKey) {
            self.stopped.lock().unwrap().push(key);
        }
        fn set_time_limit(&self, key: TaskKey, secs: Option<u64>) {
            self.limits.lock().unwrap().push((key, secs));
        }
        fn scan(&self) -> Vec<(TaskKey, Observed)> {
            self.tasks
                .lock()
                .unwrap()
                .iter()
                .map(|(k, v)| (*k, v.clone()))
                .collect()
        }
        fn forget(&self, key: TaskKey) {
            self.tasks.lock().unwrap().remove(&key);
        }
    }

    fn task(job: u64, rank: u32) -> DesiredTask {
        DesiredTask {
            key: key(job, rank),
            node_rank: 0,
            local_rank: rank,
            ntasks_per_node: 2,
            num_nodes: 1,
            nodelist: vec!["n1".into()],
            user: "alice".into(),
            job_name: "j".into(),
            program: Program::Command {
                argv: vec!["true".into()],
            },
            workdir: "/tmp".into(),
            env: vec![],
            output: None,
            error: None,
            gpus: vec![0, 1],
            cpus: vec![],
            cpu_count: 2,
            memory_mb: 1024,
            time_limit_secs: None,
            master_addr: "127.0.0.1".into(),
            master_port: 29500,
            signal: None,
            array: None,
            kill_grace_secs: None,
            facts: None,
            health: None,
            container: None,
            gpu_devices: Vec::new(),
        }
    }

    fn desire(ledger: &mut Ledger, tasks: &[DesiredTask]) {
        ledger.desired = Some(tasks.iter().map(|t| (t.key, t.clone())).collect());
    }

    #[test]
    fn a_running_task_is_told_its_changed_time_limit_once() {
        let runner = FakeRunner::default();
        let mut ledger = Ledger::default();
        let mut t = task(1, 0);
        t.time_limit_secs = Some(60);
        desire(&mut ledger, std::slice::from_ref(&t));
        ledger.reconcile(&runner);
        ledger.reconcile(&runner);
        assert!(
            runner.limits.lock().unwrap().is_empty(),
            "it started with its limit"
        );
        t.time_limit_secs = Some(600);
        desire(&mut ledger, std::slice::from_ref(&t));
        ledger.reconcile(&runner);
        ledger.reconcile(&runner);
        assert_eq!(*runner.limits.lock().unwrap(), vec![(key(1, 0), Some(600))]);
        // A task adopted from an earlier agent process is told once.
        let mut fresh = Ledger::default();
        desire(&mut fresh, std::slice::from_ref(&t));
        fresh.reconcile(&runner);
        fresh.reconcile(&runner);
        assert_eq!(runner.limits.lock().unwrap().len(), 2);
        assert_eq!(runner.started.lock().unwrap().len(), 1, "not started again");
    }

    #[test]
    fn an_ending_jobs_rank_this_node_never_had_is_reported_ended_once() {
        let runner = FakeRunner::default();
        let mut ledger = Ledger::default();
        // Job 1 rank 0 runs here; job 2 rank 0 was cancelled before any
        // desired set carried it here.
        desire(&mut ledger, &[task(1, 0)]);
        ledger.reconcile(&runner);
        desire(&mut ledger, &[]);
        ledger.stopping = [key(1, 0), key(2, 0)].into_iter().collect();
        let ev = ledger.reconcile(&runner);
        assert_eq!(
            ev,
            vec![TaskEvent {
                key: key(2, 0),
                kind: TaskEventKind::Ended(TaskEnd::Cancelled)
            }],
            "the running one is stopped, not reported ended"
        );
        assert_eq!(*runner.stopped.lock().unwrap(), vec![key(1, 0)]);
        assert!(ledger.reconcile(&runner).is_empty(), "no repeats");
        let (seq, _) = ledger.queue(ev).unwrap();
        ledger.committed(seq);
        // Committed and no longer listed: forgotten.
        ledger.stopping.clear();
        ledger.reconcile(&runner);
        assert!(!ledger.ended_reported.contains(&key(2, 0)));
        assert!(!ledger.ended_committed.contains(&key(2, 0)));
        assert!(runner
            .started
            .lock()
            .unwrap()
            .iter()
            .all(|k| *k != key(2, 0)));
    }

    #[test]
    fn starts_desired_tasks_once_and_reports_each_event_once() {
        let runner = FakeRunner::default();
        let mut ledger = Ledger::default();
        desire(&mut ledger, &[task(1, 0), task(1, 1)]);
        let ev = ledger.reconcile(&runner);
        assert_eq!(runner.started.lock().unwrap().len(), 2);
        assert_eq!(ev.len(), 2, "starts are reported as they are launched");
        assert!(ev.iter().all(|e| e.kind == TaskEventKind::Started));
        assert!(ledger.reconcile(&runner).is_empty(), "no repeats");
        assert_eq!(
            runner.started.lock().unwrap().len(),
            2,
            "never started twice"
        );

        runner
            .tasks
            .lock()
            .unwrap()
            .insert(key(1, 0), Observed::Ended(TaskEnd::Completed));
        let ev = ledger.reconcile(&runner);
        assert_eq!(
            ev,
            vec![TaskEvent {
                key: key(1, 0),
                kind: TaskEventKind::Ended(TaskEnd::Completed)
            }]
        );
        // Still desired (the other rank runs): kept, not restarted.
        ledger.reconcile(&runner);
        assert_eq!(runner.started.lock().unwrap().len(), 2);
        assert!(runner.tasks.lock().unwrap().contains_key(&key(1, 0)));
    }

    #[test]
    fn parallel_starts_start_each_task_once_and_report_each_start() {
        let runner = FakeRunner {
            parallel: 3,
            ..FakeRunner::default()
        };
        let mut ledger = Ledger::default();
        let tasks: Vec<DesiredTask> = (0..7).map(|rank| task(5, rank)).collect();
        desire(&mut ledger, &tasks);
        let ev = ledger.reconcile(&runner);
        let mut started = runner.started.lock().unwrap().clone();
        started.sort();
        let want: Vec<TaskKey> = (0..7).map(|rank| key(5, rank)).collect();
        assert_eq!(started, want, "every rank started exactly once");
        let mut reported: Vec<TaskKey> = ev
            .iter()
            .filter(|e| e.kind == TaskEventKind::Started)
            .map(|e| e.key)
            .collect();
        reported.sort();
        assert_eq!(reported, want, "each start reported once");
        assert!(ledger.reconcile(&runner).is_empty());

        // Refused starts, in parallel too, are each one launch failure.
        let runner = FakeRunner {
            parallel: 3,
            ..FakeRunner::default()
        };
        *runner.refuse.lock().unwrap() = true;
        let mut ledger = Ledger::default();
        desire(&mut ledger, &tasks[..4]);
        let ev = ledger.reconcile(&runner);
        assert_eq!(ev.len(), 4);
        assert!(ev
            .iter()
            .all(|e| matches!(e.kind, TaskEventKind::Ended(TaskEnd::LaunchFailed { .. }))));
    }

    #[test]
    fn forgets_ended_tasks_only_after_commit_and_when_not_desired() {
        let runner = FakeRunner::default();
        let mut ledger = Ledger::default();
        desire(&mut ledger, &[task(2, 0)]);
        ledger.reconcile(&runner);
        runner
            .tasks
            .lock()
            .unwrap()
            .insert(key(2, 0), Observed::Ended(TaskEnd::Completed));
        let ev = ledger.reconcile(&runner);
        let (seq, _) = ledger.queue(ev).unwrap();
        desire(&mut ledger, &[]);
        ledger.reconcile(&runner);
        assert!(
            runner.tasks.lock().unwrap().contains_key(&key(2, 0)),
            "kept until committed"
        );
        ledger.committed(seq);
        assert!(ledger.unacked.is_empty());
        ledger.reconcile(&runner);
        assert!(
            runner.tasks.lock().unwrap().is_empty(),
            "forgotten after commit"
        );
    }

    #[test]
    fn stops_undesired_tasks_but_not_while_disconnected() {
        let runner = FakeRunner::default();
        let mut ledger = Ledger::default();
        runner
            .tasks
            .lock()
            .unwrap()
            .insert(key(3, 0), Observed::Running);
        // No desired state yet (no leader): observe only.
        let ev = ledger.reconcile(&runner);
        assert_eq!(ev.len(), 1, "the re-adopted task's start is reported");
        assert!(runner.stopped.lock().unwrap().is_empty());
        desire(&mut ledger, &[]);
        ledger.reconcile(&runner);
        assert_eq!(*runner.stopped.lock().unwrap(), vec![key(3, 0)]);
    }

    #[test]
    fn a_launch_failure_is_reported_as_the_rank_ending() {
        let runner = FakeRunner::default();
        *runner.refuse.lock().unwrap() = true;
        let mut ledger = Ledger::default();
        desire(&mut ledger, &[task(4, 0)]);
        let ev = ledger.reconcile(&runner);
        assert!(matches!(
            &ev[..],
            [TaskEvent {
                kind: TaskEventKind::Ended(TaskEnd::LaunchFailed { .. }),
                ..
            }]
        ));
        assert!(
            ledger.reconcile(&runner).is_empty(),
            "not retried in this attempt"
        );
    }
}
