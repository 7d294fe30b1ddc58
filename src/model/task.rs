//! One task (rank) of one attempt of a job, as every role names it: the
//! leader's desired state, the agent's ledger, the shim's task directory and
//! the events that come back all carry the same `TaskKey`, so there is
//! nothing to convert between them.
//!
//! The key is flattened into the messages and files that carry it: its
//! fields sit next to theirs as `job`, `attempt` and `rank`, exactly as they
//! did before the key was a type, so MessagePack on the wire and in the log
//! and the JSON of task directories read the same either way. A job step's
//! task (`srun` inside an allocation) adds `step`, which is left out when
//! absent, so a job's own ranks keep those bytes.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use super::{JobId, TaskEnd};

/// Names one task of one attempt of a job: `(job, attempt, rank)`, and for
/// a task of a job step, the step.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct TaskKey {
    pub job: JobId,
    /// The job's restart count when this task was started.
    pub attempt: u32,
    /// Global rank of the task within the job (RANK), or within its step.
    pub rank: u32,
    /// The job step (`srun` in an allocation) the task belongs to; `None`
    /// for the job's own ranks (or its batch script).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step: Option<u32>,
}

impl TaskKey {
    /// Rank `rank` of the job itself (not of a step).
    pub fn of_job(job: JobId, attempt: u32, rank: u32) -> TaskKey {
        TaskKey {
            job,
            attempt,
            rank,
            step: None,
        }
    }
}

/// `<job>.<attempt>.<rank>`, or `<job>.<attempt>.s<step>.<rank>` for a
/// step's task, as in logs and task directory names.
impl fmt::Display for TaskKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.step {
            None => write!(f, "{}.{}.{}", self.job, self.attempt, self.rank),
            Some(step) => write!(f, "{}.{}.s{step}.{}", self.job, self.attempt, self.rank),
        }
    }
}

impl FromStr for TaskKey {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad =
            || format!("{s:?} is not a task key of the form <job>.<attempt>[.s<step>].<rank>");
        let parts: Vec<&str> = s.split('.').collect();
        let (job, attempt, step, rank) = match parts[..] {
            [job, attempt, rank] => (job, attempt, None, rank),
            [job, attempt, step, rank] => {
                let step = step.strip_prefix('s').ok_or_else(bad)?;
                (job, attempt, Some(step.parse().map_err(|_| bad())?), rank)
            }
            _ => return Err(bad()),
        };
        Ok(TaskKey {
            job: JobId(job.parse().map_err(|_| bad())?),
            attempt: attempt.parse().map_err(|_| bad())?,
            rank: rank.parse().map_err(|_| bad())?,
            step,
        })
    }
}

/// How a task's standard streams are connected, from the step that asks
/// for it to the shim that sets it up.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TaskIo {
    /// stdin from /dev/null, stdout and stderr to files (batch work).
    #[default]
    Files,
    /// stdin, stdout and stderr on pipes the shim relays to whoever attaches
    /// (`gpuq exec` without `--pty`); the output is kept in files too.
    Pipes,
    /// A pseudo-terminal the shim relays (`srun --pty`, `gpuq run --pty`,
    /// `gpuq exec --pty`); its output is kept in a file too.
    Pty,
}

impl TaskIo {
    /// Whether a client can attach to the task's streams.
    pub fn is_interactive(self) -> bool {
        self != TaskIo::Files
    }

    /// For `skip_serializing_if`: older peers never see the field.
    pub fn is_files(&self) -> bool {
        *self == TaskIo::Files
    }
}

/// A start or end of one task.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskEvent {
    #[serde(flatten)]
    pub key: TaskKey,
    pub kind: TaskEventKind,
}

/// What happened to the task.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum TaskEventKind {
    Started,
    Ended(TaskEnd),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_round_trips_through_its_text() {
        let key = TaskKey {
            job: JobId(42),
            attempt: 3,
            rank: 17,
            step: None,
        };
        assert_eq!(key.to_string(), "42.3.17");
        assert_eq!(key.to_string().parse::<TaskKey>(), Ok(key));
        let step = TaskKey {
            step: Some(2),
            ..key
        };
        assert_eq!(step.to_string(), "42.3.s2.17");
        assert_eq!(step.to_string().parse::<TaskKey>(), Ok(step));
        for bad in [
            "42.3",
            "42.3.17.1",
            "a.b.c",
            "",
            "42..1",
            "shim.log",
            "42.3.s.1",
            "42.3.sx.1",
        ] {
            assert!(bad.parse::<TaskKey>().is_err(), "{bad}");
        }
    }

    /// How a `TaskEvent` was declared before the key was a type.
    #[derive(Serialize, Deserialize, Debug, PartialEq)]
    struct EventBefore {
        job: JobId,
        attempt: u32,
        rank: u32,
        kind: TaskEventKind,
    }

    #[test]
    fn an_event_has_the_bytes_it_had_before_the_key_was_a_type() {
        let kinds = [
            TaskEventKind::Started,
            TaskEventKind::Ended(TaskEnd::Failed {
                exit_code: Some(3),
                signal: None,
            }),
            TaskEventKind::Ended(TaskEnd::Lost {
                reason: "gone".into(),
            }),
        ];
        for kind in kinds {
            let before = EventBefore {
                job: JobId(70_000),
                attempt: 2,
                rank: 300,
                kind: kind.clone(),
            };
            let now = TaskEvent {
                key: TaskKey {
                    job: JobId(70_000),
                    attempt: 2,
                    rank: 300,
                    step: None,
                },
                kind,
            };
            let old_bytes = rmp_serde::to_vec_named(&before).unwrap();
            assert_eq!(rmp_serde::to_vec_named(&now).unwrap(), old_bytes);
            assert_eq!(rmp_serde::from_slice::<TaskEvent>(&old_bytes).unwrap(), now);
            assert_eq!(
                serde_json::to_string(&now).unwrap(),
                serde_json::to_string(&before).unwrap()
            );
        }
    }
}
