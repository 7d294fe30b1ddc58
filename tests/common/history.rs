//! A history of client operations and what the cluster showed, checked for
//! the promises a failover must keep (in the spirit of Jepsen's checkers):
//!
//! - every acknowledged submission is present exactly once;
//! - a submission that definitely failed is absent, one whose outcome is
//!   unknown is present at most once;
//! - no job id was handed out twice;
//! - a job's state only moves along the model's transition table
//!   (`JobState::can_move_to`), as seen by any one observer.
//!
//! - job ids only grow: a submission acknowledged before another was sent
//!   has the smaller id (real-time order, as Jepsen's linearizability);
//!
//! and, with the agents' start/stop records of the tasks ([`TaskRun`], see
//! [`read_task_runs`]) and the cancellations clients made ([`CancelOp`]):
//!
//! - no GPU (node, index) was held by two tasks over overlapping intervals;
//! - no attempt of a job (job id, restart count) started twice;
//! - a job whose cancellation was acknowledged ended CANCELLED, and if it was
//!   cancelled while pending (its last attempt never got a placement) that
//!   attempt never started.
//!
//! Submissions are told apart by a unique job name (`key`), since an
//! unacknowledged one has no id the client knows. Times are seconds since
//! the epoch on this machine's clock, the one the task scripts read too.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Mutex;

use gpuq::model::{Job, JobState};

/// Seconds since the epoch, now.
pub fn now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// What kind of promise a violation breaks (the counts a chaos run prints).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Violation {
    /// An acknowledged submission is absent.
    Lost,
    /// A submission exists more than once, or a job attempt started twice.
    Duplicated,
    /// A submission that definitely failed exists.
    FailedButPresent,
    /// One job id for two jobs or two submissions.
    IdTwice,
    /// A later submission got a smaller id than an earlier acknowledged one.
    IdWentBack,
    /// A job state change the transition table forbids.
    BadTransition,
    /// One GPU held by two tasks at once.
    DoubleBooked,
    /// A job cancelled while pending started anyway.
    CancelledThenStarted,
    /// An acknowledged cancellation did not end the job CANCELLED.
    CancelLost,
    /// A task ran for a job that does not exist.
    UnknownJobRan,
}

/// Violations, each with its description.
pub type Violations = Vec<(Violation, String)>;

/// How many violations of `kind` there are.
pub fn count(v: &Violations, kind: Violation) -> usize {
    v.iter().filter(|(k, _)| *k == kind).count()
}

/// How an operation ended, as the client saw it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Acknowledged with this job id.
    Ok(u64),
    /// Definitely not applied (refused before it was proposed).
    Fail(String),
    /// Maybe applied: the answer was lost, or the write timed out.
    Unknown(String),
}

/// One client operation: a submission under a unique job name.
#[derive(Clone, Debug, Default)]
pub struct Op {
    pub key: String,
    /// `None` while in flight; an operation never completed is unknown.
    pub outcome: Option<Outcome>,
    /// When it was sent and when its answer came ([`now`]; 0 when unknown).
    pub invoked: f64,
    pub completed: f64,
}

/// One client cancellation of one job; `Outcome::Ok` carries the job id.
#[derive(Clone, Debug)]
pub struct CancelOp {
    pub job: u64,
    pub outcome: Option<Outcome>,
    pub invoked: f64,
    pub completed: f64,
}

/// One task as its job script recorded it: started on `node` with `gpus`
/// at `start`, stopped at `stop` (`None`: no stop record, so held to the end).
#[derive(Clone, Debug, PartialEq)]
pub struct TaskRun {
    pub job: u64,
    /// `GPUQ_RESTART_COUNT` of the attempt.
    pub attempt: u32,
    pub node: String,
    pub gpus: Vec<u32>,
    pub start: f64,
    pub stop: Option<f64>,
}

/// What one observer saw of one job, in the order it saw it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Observation {
    /// Who looked: a server and its process incarnation, e.g. `s2#3`. Each
    /// observer's view only moves forward; two observers may lag each other.
    pub observer: String,
    pub job: u64,
    pub state: JobState,
}

/// A job as it exists at the end.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FinalJob {
    pub id: u64,
    pub name: String,
    pub state: JobState,
    /// Its restart count: the number of its last attempt.
    pub attempt: u32,
    /// Whether its last attempt was given a placement (it may have started).
    pub placed: bool,
}

impl FinalJob {
    /// The checker's view of a job a server returned.
    pub fn of(j: &Job) -> FinalJob {
        FinalJob {
            id: j.id.0,
            name: j.spec.name.clone(),
            state: j.state,
            attempt: j.restart_count,
            placed: j.run.as_ref().is_some_and(|r| r.attempt == j.restart_count),
        }
    }

    /// The checker's view of every job a server returned.
    pub fn all(jobs: &[Job]) -> Vec<FinalJob> {
        jobs.iter().map(FinalJob::of).collect()
    }

    /// A job that never ran (for hand-written histories).
    pub fn new(id: u64, name: &str, state: JobState) -> FinalJob {
        FinalJob {
            id,
            name: name.into(),
            state,
            attempt: 0,
            placed: false,
        }
    }
}

/// The recorded history; shared by client threads.
#[derive(Default)]
pub struct History {
    ops: Mutex<Vec<Op>>,
    cancels: Mutex<Vec<CancelOp>>,
    seen: Mutex<Vec<Observation>>,
}

impl History {
    pub fn new() -> History {
        History::default()
    }

    /// Records that a submission of `key` is about to be sent.
    pub fn invoke(&self, key: &str) -> usize {
        let mut ops = self.ops.lock().unwrap();
        ops.push(Op {
            key: key.to_string(),
            outcome: None,
            invoked: now(),
            completed: 0.0,
        });
        ops.len() - 1
    }

    /// Records how operation `op` ended.
    pub fn complete(&self, op: usize, outcome: Outcome) {
        let mut ops = self.ops.lock().unwrap();
        ops[op].outcome = Some(outcome);
        ops[op].completed = now();
    }

    /// Records that a cancellation of `job` is about to be sent.
    pub fn invoke_cancel(&self, job: u64) -> usize {
        let mut c = self.cancels.lock().unwrap();
        c.push(CancelOp {
            job,
            outcome: None,
            invoked: now(),
            completed: 0.0,
        });
        c.len() - 1
    }

    /// Records how cancellation `op` ended.
    pub fn complete_cancel(&self, op: usize, outcome: Outcome) {
        let mut c = self.cancels.lock().unwrap();
        c[op].outcome = Some(outcome);
        c[op].completed = now();
    }

    /// The cancellations so far.
    pub fn cancels(&self) -> Vec<CancelOp> {
        self.cancels.lock().unwrap().clone()
    }

    /// Records what `observer` saw of `job` now.
    pub fn observe(&self, observer: &str, job: u64, state: JobState) {
        self.seen.lock().unwrap().push(Observation {
            observer: observer.to_string(),
            job,
            state,
        });
    }

    /// The operations so far.
    pub fn ops(&self) -> Vec<Op> {
        self.ops.lock().unwrap().clone()
    }

    /// Counts of outcomes: (ok, fail, unknown).
    pub fn counts(&self) -> (usize, usize, usize) {
        let ops = self.ops.lock().unwrap();
        let ok = ops
            .iter()
            .filter(|o| matches!(o.outcome, Some(Outcome::Ok(_))))
            .count();
        let fail = ops
            .iter()
            .filter(|o| matches!(o.outcome, Some(Outcome::Fail(_))))
            .count();
        (ok, fail, ops.len() - ok - fail)
    }

    /// Checks the history against the jobs that exist at the end; every
    /// violation is described.
    pub fn check(&self, jobs: &[FinalJob]) -> Result<(), Vec<String>> {
        let ops = self.ops.lock().unwrap().clone();
        let seen = self.seen.lock().unwrap().clone();
        check(&ops, &seen, jobs)
    }

    /// Every check: the submissions' ([`check_submissions`]), the tasks'
    /// ([`check_runs`]) and the cancellations' ([`check_cancels`]).
    pub fn check_all(&self, jobs: &[FinalJob], runs: &[TaskRun]) -> Violations {
        let ops = self.ops();
        let seen = self.seen.lock().unwrap().clone();
        let mut v = check_submissions(&ops, &seen, jobs);
        v.extend(check_runs(runs, jobs));
        v.extend(check_cancels(&self.cancels(), runs, jobs));
        v
    }
}

/// The states reachable from `from` in one or more steps of the model's
/// transition table (an observer may miss the states in between).
fn reachable(from: JobState) -> BTreeSet<&'static str> {
    let mut out = BTreeSet::new();
    let mut todo = vec![from];
    while let Some(s) = todo.pop() {
        for next in JobState::ALL {
            if s.can_move_to(next) && out.insert(next.as_str()) {
                todo.push(next);
            }
        }
    }
    out
}

/// The submissions' checker, on plain data, as descriptions.
pub fn check(ops: &[Op], seen: &[Observation], jobs: &[FinalJob]) -> Result<(), Vec<String>> {
    let bad = check_submissions(ops, seen, jobs);
    if bad.is_empty() {
        Ok(())
    } else {
        Err(bad.into_iter().map(|(_, s)| s).collect())
    }
}

/// The submissions' checker, on plain data: presence, ids, transitions.
pub fn check_submissions(ops: &[Op], seen: &[Observation], jobs: &[FinalJob]) -> Violations {
    use Violation::*;
    let mut bad = Vec::new();
    let mut by_name: HashMap<&str, Vec<&FinalJob>> = HashMap::new();
    let mut ids = BTreeSet::new();
    for j in jobs {
        by_name.entry(j.name.as_str()).or_default().push(j);
        if !ids.insert(j.id) {
            bad.push((IdTwice, format!("job id {} exists twice", j.id)));
        }
    }
    let mut acked: BTreeMap<u64, &str> = BTreeMap::new();
    for op in ops {
        let present = by_name.get(op.key.as_str()).map_or(&[][..], |v| &v[..]);
        match &op.outcome {
            Some(Outcome::Ok(id)) => {
                if let Some(other) = acked.insert(*id, &op.key) {
                    bad.push((
                        IdTwice,
                        format!(
                            "job id {id} was given to two submissions: {other} and {}",
                            op.key
                        ),
                    ));
                }
                match present {
                    [j] if j.id == *id => {}
                    [] => bad.push((
                        Lost,
                        format!("acknowledged submission {} (job {id}) was lost", op.key),
                    )),
                    [j] => bad.push((
                        Duplicated,
                        format!(
                            "acknowledged submission {} was job {id} but exists as job {}",
                            op.key, j.id
                        ),
                    )),
                    many => bad.push((
                        Duplicated,
                        format!(
                            "acknowledged submission {} exists {} times: {:?}",
                            op.key,
                            many.len(),
                            many.iter().map(|j| j.id).collect::<Vec<_>>()
                        ),
                    )),
                }
            }
            Some(Outcome::Fail(why)) => {
                if !present.is_empty() {
                    bad.push((
                        FailedButPresent,
                        format!(
                            "submission {} failed ({why}) yet exists as job {:?}",
                            op.key,
                            present.iter().map(|j| j.id).collect::<Vec<_>>()
                        ),
                    ));
                }
            }
            Some(Outcome::Unknown(_)) | None => {
                if present.len() > 1 {
                    bad.push((
                        Duplicated,
                        format!(
                            "unacknowledged submission {} exists {} times",
                            op.key,
                            present.len()
                        ),
                    ));
                }
            }
        }
    }
    // Each observer's sequence of states per job, plus the final state as
    // the last word of an observer that sees everything.
    let mut last: HashMap<(&str, u64), JobState> = HashMap::new();
    let finals = jobs.iter().map(|j| Observation {
        observer: String::new(),
        job: j.id,
        state: j.state,
    });
    let all: Vec<Observation> = seen.iter().cloned().chain(finals).collect();
    for o in &all {
        if o.observer.is_empty() {
            // The final view must be reachable from what anyone saw last.
            for ((_, job), prev) in last.iter().filter(|((_, j), _)| *j == o.job) {
                if *prev != o.state && !reachable(*prev).contains(o.state.as_str()) {
                    bad.push((
                        BadTransition,
                        format!("job {job} ended {} after being seen {}", o.state, prev),
                    ));
                }
            }
            continue;
        }
        if let Some(prev) = last.insert((o.observer.as_str(), o.job), o.state) {
            if prev != o.state && !reachable(prev).contains(o.state.as_str()) {
                bad.push((
                    BadTransition,
                    format!(
                        "job {} moved {} -> {} as seen by {}, which the transition table forbids",
                        o.job, prev, o.state, o.observer
                    ),
                ));
            }
        }
    }
    bad.extend(check_id_order(ops));
    bad
}

/// Ids only grow: a submission acknowledged before another was sent has the
/// smaller id (ids come from a counter in apply, and the later one commits
/// later in the log, whichever server led).
pub fn check_id_order(ops: &[Op]) -> Violations {
    let mut acked: Vec<(&Op, u64)> = ops
        .iter()
        .filter_map(|o| match o.outcome {
            Some(Outcome::Ok(id)) => Some((o, id)),
            _ => None,
        })
        .collect();
    let mut by_completion = acked.clone();
    by_completion.sort_by(|a, b| a.0.completed.total_cmp(&b.0.completed));
    acked.sort_by(|a, b| a.0.invoked.total_cmp(&b.0.invoked));
    // Sweep in invocation order, folding in every op completed before it.
    let mut bad = Vec::new();
    let mut done = by_completion.iter().peekable();
    let mut highest: Option<(&Op, u64)> = None;
    for (op, id) in &acked {
        while let Some((prev, pid)) = done.peek().copied() {
            if prev.completed >= op.invoked {
                break;
            }
            if highest.is_none_or(|(_, h)| *pid > h) {
                highest = Some((*prev, *pid));
            }
            done.next();
        }
        if let Some((prev, h)) = highest {
            if h >= *id {
                bad.push((
                    Violation::IdWentBack,
                    format!(
                        "submission {} got job {id} although {} was acknowledged as job {h} before it was sent",
                        op.key, prev.key
                    ),
                ));
            }
        }
    }
    bad
}

/// The tasks' checker: no GPU held twice at once, no attempt started twice,
/// no task of a job that does not exist.
pub fn check_runs(runs: &[TaskRun], jobs: &[FinalJob]) -> Violations {
    let mut bad = Vec::new();
    let known: BTreeSet<u64> = jobs.iter().map(|j| j.id).collect();
    let mut attempts: BTreeMap<(u64, u32), usize> = BTreeMap::new();
    let mut by_gpu: BTreeMap<(&str, u32), Vec<&TaskRun>> = BTreeMap::new();
    for r in runs {
        *attempts.entry((r.job, r.attempt)).or_default() += 1;
        if !known.contains(&r.job) {
            bad.push((
                Violation::UnknownJobRan,
                format!(
                    "a task of job {} ran on {}, and no such job exists",
                    r.job, r.node
                ),
            ));
        }
        for g in &r.gpus {
            by_gpu.entry((r.node.as_str(), *g)).or_default().push(r);
        }
    }
    for ((job, attempt), n) in attempts {
        if n > 1 {
            bad.push((
                Violation::Duplicated,
                format!("attempt {attempt} of job {job} started {n} times"),
            ));
        }
    }
    for ((node, gpu), mut held) in by_gpu {
        held.sort_by(|a, b| a.start.total_cmp(&b.start));
        let mut holder: Option<&TaskRun> = None;
        for r in held {
            if let Some(h) = holder {
                if h.stop.is_none_or(|stop| stop > r.start) {
                    bad.push((
                        Violation::DoubleBooked,
                        format!(
                            "GPU {gpu} of {node} was held by job {} (from {:.3} to {}) when job {} started on it at {:.3}",
                            h.job,
                            h.start,
                            h.stop.map_or("the end".into(), |s| format!("{s:.3}")),
                            r.job,
                            r.start
                        ),
                    ));
                }
            }
            let ends_later = |r: &TaskRun| r.stop.unwrap_or(f64::INFINITY);
            if holder.is_none_or(|h| ends_later(r) > ends_later(h)) {
                holder = Some(r);
            }
        }
    }
    bad
}

/// The cancellations' checker: an acknowledged cancellation ends its job
/// CANCELLED, and a job cancelled while pending (its last attempt had no
/// placement at the end) never started that attempt.
pub fn check_cancels(cancels: &[CancelOp], runs: &[TaskRun], jobs: &[FinalJob]) -> Violations {
    let mut bad = Vec::new();
    let by_id: HashMap<u64, &FinalJob> = jobs.iter().map(|j| (j.id, j)).collect();
    let acked: BTreeSet<u64> = cancels
        .iter()
        .filter(|c| matches!(c.outcome, Some(Outcome::Ok(_))))
        .map(|c| c.job)
        .collect();
    for id in acked {
        let Some(j) = by_id.get(&id) else {
            bad.push((
                Violation::CancelLost,
                format!("job {id} was acknowledged cancelled and no longer exists"),
            ));
            continue;
        };
        if j.state != JobState::Cancelled {
            bad.push((
                Violation::CancelLost,
                format!("job {id} was acknowledged cancelled and ended {}", j.state),
            ));
            continue;
        }
        if j.placed {
            continue;
        }
        for r in runs
            .iter()
            .filter(|r| r.job == id && r.attempt >= j.attempt)
        {
            bad.push((
                Violation::CancelledThenStarted,
                format!(
                    "job {id} was cancelled while pending (attempt {}), yet attempt {} started on {} at {:.3}",
                    j.attempt, r.attempt, r.node, r.start
                ),
            ));
        }
    }
    bad
}

/// A job script that appends `start JOB ATTEMPT NODE GPUS TIME` to
/// `records`, runs `body` (a shell command, e.g. `sleep 2`) and appends the
/// matching `stop` line when it ends or is sent SIGTERM (how the shim stops a
/// task; its 1 s grace leaves the trap time to write; the trap ignores a
/// second SIGTERM, which would kill its `date` and leave a stop line with no
/// time). One-node jobs only:
/// GPUQ_NODELIST names the node.
pub fn recording_script(records: &std::path::Path, body: &str) -> String {
    let line = "$GPUQ_JOB_ID $GPUQ_RESTART_COUNT $GPUQ_NODELIST ${CUDA_VISIBLE_DEVICES:--}";
    format!(
        "r={r}; echo \"start {line} $(date +%s.%N)\" >> $r; \
         trap 'trap \"\" TERM; echo \"stop {line} $(date +%s.%N)\" >> $r; exit 143' TERM; \
         {body} & wait $!; echo \"stop {line} $(date +%s.%N)\" >> $r",
        r = records.display()
    )
}

/// The tasks `recording_script` recorded, each start paired with the first
/// later stop of the same job, attempt and node.
pub fn read_task_runs(records: &std::path::Path) -> Vec<TaskRun> {
    let text = std::fs::read_to_string(records).unwrap_or_default();
    let mut runs: Vec<TaskRun> = Vec::new();
    for line in text.lines() {
        let w: Vec<&str> = line.split_whitespace().collect();
        let [what, job, attempt, node, gpus, time] = w[..] else {
            panic!("a malformed task record: {line:?}");
        };
        let (Ok(job), Ok(attempt), Ok(time)) = (job.parse(), attempt.parse(), time.parse()) else {
            panic!("a malformed task record: {line:?}");
        };
        match what {
            "start" => runs.push(TaskRun {
                job,
                attempt,
                node: node.to_string(),
                gpus: gpus.split(',').filter_map(|g| g.parse().ok()).collect(),
                start: time,
                stop: None,
            }),
            "stop" => {
                let open = runs.iter_mut().find(|r| {
                    r.job == job && r.attempt == attempt && r.node == node && r.stop.is_none()
                });
                if let Some(r) = open {
                    r.stop = Some(time);
                }
            }
            _ => panic!("a malformed task record: {line:?}"),
        }
    }
    runs
}
