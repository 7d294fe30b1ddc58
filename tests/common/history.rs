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
//! Submissions are told apart by a unique job name (`key`), since an
//! unacknowledged one has no id the client knows.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Mutex;

use gpuq::model::JobState;

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
#[derive(Clone, Debug)]
pub struct Op {
    pub key: String,
    /// `None` while in flight; an operation never completed is unknown.
    pub outcome: Option<Outcome>,
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
}

/// The recorded history; shared by client threads.
#[derive(Default)]
pub struct History {
    ops: Mutex<Vec<Op>>,
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
        });
        ops.len() - 1
    }

    /// Records how operation `op` ended.
    pub fn complete(&self, op: usize, outcome: Outcome) {
        self.ops.lock().unwrap()[op].outcome = Some(outcome);
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

/// The checker, on plain data.
pub fn check(ops: &[Op], seen: &[Observation], jobs: &[FinalJob]) -> Result<(), Vec<String>> {
    let mut bad = Vec::new();
    let mut by_name: HashMap<&str, Vec<&FinalJob>> = HashMap::new();
    let mut ids = BTreeSet::new();
    for j in jobs {
        by_name.entry(j.name.as_str()).or_default().push(j);
        if !ids.insert(j.id) {
            bad.push(format!("job id {} exists twice", j.id));
        }
    }
    let mut acked: BTreeMap<u64, &str> = BTreeMap::new();
    for op in ops {
        let present = by_name.get(op.key.as_str()).map_or(&[][..], |v| &v[..]);
        match &op.outcome {
            Some(Outcome::Ok(id)) => {
                if let Some(other) = acked.insert(*id, &op.key) {
                    bad.push(format!(
                        "job id {id} was given to two submissions: {other} and {}",
                        op.key
                    ));
                }
                match present {
                    [j] if j.id == *id => {}
                    [] => bad.push(format!(
                        "acknowledged submission {} (job {id}) was lost",
                        op.key
                    )),
                    [j] => bad.push(format!(
                        "acknowledged submission {} was job {id} but exists as job {}",
                        op.key, j.id
                    )),
                    many => bad.push(format!(
                        "acknowledged submission {} exists {} times: {:?}",
                        op.key,
                        many.len(),
                        many.iter().map(|j| j.id).collect::<Vec<_>>()
                    )),
                }
            }
            Some(Outcome::Fail(why)) => {
                if !present.is_empty() {
                    bad.push(format!(
                        "submission {} failed ({why}) yet exists as job {:?}",
                        op.key,
                        present.iter().map(|j| j.id).collect::<Vec<_>>()
                    ));
                }
            }
            Some(Outcome::Unknown(_)) | None => {
                if present.len() > 1 {
                    bad.push(format!(
                        "unacknowledged submission {} exists {} times",
                        op.key,
                        present.len()
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
                    bad.push(format!(
                        "job {job} ended {} after being seen {}",
                        o.state, prev
                    ));
                }
            }
            continue;
        }
        if let Some(prev) = last.insert((o.observer.as_str(), o.job), o.state) {
            if prev != o.state && !reachable(prev).contains(o.state.as_str()) {
                bad.push(format!(
                    "job {} moved {} -> {} as seen by {}, which the transition table forbids",
                    o.job, prev, o.state, o.observer
                ));
            }
        }
    }
    if bad.is_empty() {
        Ok(())
    } else {
        Err(bad)
    }
}
