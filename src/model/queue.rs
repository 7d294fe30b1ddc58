//! What decides when a job may start besides resources: dependencies,
//! `--begin`, holds, arrays; and `--signal`, the warning before its time
//! limit. Pure data; `spec` parses it, `state` evaluates it.

use std::fmt;

use serde::{Deserialize, Serialize};

use super::{JobId, Millis};

/// The scheduling options of a spec (`--dependency`, `--begin`, `--hold`,
/// `--array`). The default is none of them.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct QueueSpec {
    /// Every one must hold before the job starts (`afterok:1:2,afterany:3`).
    pub dependency: Vec<Dependency>,
    /// Not before this time (`--begin`, resolved to an absolute time by the CLI).
    pub begin_time: Option<Millis>,
    /// Submitted held (`--hold`): waits until `gpuq release`.
    pub hold: bool,
    /// An array job (`--array 0-99%8`): one task job per index.
    pub array: Option<ArraySpec>,
}

/// The kinds of `--dependency` (Slurm's words).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DependencyKind {
    /// The jobs have started (or ended).
    After,
    /// The jobs have ended, however.
    AfterAny,
    /// The jobs completed with exit code 0.
    AfterOk,
    /// The jobs ended in failure (not COMPLETED, not cancelled before start).
    AfterNotOk,
    /// No other job of the same user and name runs.
    Singleton,
}

impl DependencyKind {
    pub const ALL: [DependencyKind; 5] = [
        DependencyKind::After,
        DependencyKind::AfterAny,
        DependencyKind::AfterOk,
        DependencyKind::AfterNotOk,
        DependencyKind::Singleton,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            DependencyKind::After => "after",
            DependencyKind::AfterAny => "afterany",
            DependencyKind::AfterOk => "afterok",
            DependencyKind::AfterNotOk => "afternotok",
            DependencyKind::Singleton => "singleton",
        }
    }
}

/// One term of `--dependency`: a kind and the jobs it speaks of (none for
/// `singleton`). A job id that names an array means all of its tasks.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Dependency {
    pub kind: DependencyKind,
    #[serde(default)]
    pub jobs: Vec<JobId>,
}

impl fmt::Display for Dependency {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.kind.as_str())?;
        for j in &self.jobs {
            write!(f, ":{j}")?;
        }
        Ok(())
    }
}

/// `--array`: the task indices, in order, and the throttle.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ArraySpec {
    /// Distinct indices, ascending.
    pub indices: Vec<u32>,
    /// `%N`: at most this many tasks run at once.
    #[serde(default)]
    pub throttle: Option<u32>,
}

/// The most tasks one array may have (Slurm's `MaxArraySize` default is 1001;
/// ours is larger because a task costs one record, not a process).
pub const MAX_ARRAY_TASKS: usize = 100_000;

/// Which array a task job belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ArrayTask {
    /// The array job id: the id of its first task (Slurm's `ArrayJobId`).
    pub array_job: JobId,
    /// This task's index (`SLURM_ARRAY_TASK_ID`).
    pub index: u32,
    /// The array's `%N` throttle.
    #[serde(default)]
    pub throttle: Option<u32>,
    /// The array's task count, lowest and highest index
    /// (`SLURM_ARRAY_TASK_COUNT/MIN/MAX`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub span: Option<(u32, u32, u32)>,
}

/// `--signal [B:]SIG@SECS`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SignalSpec {
    /// The signal number (e.g. 10 for USR1).
    pub signal: i32,
    /// Seconds before the time limit it is sent.
    pub secs_before: u64,
    /// `B:`: to the batch shell only, not to every process of the task.
    #[serde(default)]
    pub batch_only: bool,
}

/// A job as users name it: `12` (a job, or all tasks of array 12) or `12_3`
/// (task 3 of array 12).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct JobRef {
    pub id: JobId,
    /// The array task index, for `12_3`.
    #[serde(default)]
    pub task: Option<u32>,
}

impl JobRef {
    /// Parses `12` or `12_3`.
    pub fn parse(input: &str) -> Result<JobRef, String> {
        let bad =
            || format!("{input:?} is not a job id; give a number (12) or an array task (12_3)");
        let num = |s: &str| s.trim().parse::<u64>().ok().filter(|&n| n > 0);
        match input.split_once('_') {
            Some((a, t)) => Ok(JobRef {
                id: JobId(num(a).ok_or_else(bad)?),
                task: Some(t.trim().parse::<u32>().map_err(|_| bad())?),
            }),
            None => Ok(JobRef {
                id: JobId(num(input).ok_or_else(bad)?),
                task: None,
            }),
        }
    }
}

impl fmt::Display for JobRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.task {
            Some(t) => write!(f, "{}_{t}", self.id),
            None => write!(f, "{}", self.id),
        }
    }
}
