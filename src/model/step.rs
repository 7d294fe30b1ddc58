//! How a job uses its allocation (`Launch`), and job steps: `srun` inside an
//! allocation starts tasks on some of the job's nodes, within the GPUs,
//! CPUs and memory the job already holds. A step is part of the job's
//! current attempt (`JobRun::steps`) and is replicated like the rest of it:
//! its start is a command, its tasks come back as task events keyed by
//! `TaskKey { step: Some(id), .. }`, and it ends when all of them have.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use super::{Millis, Program, TaskEnd};

/// What runs in a job's allocation by itself.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Launch {
    /// Every rank runs the program: nodes × tasks per node copies, as
    /// `srun` starts them (`gpuq submit`).
    #[default]
    Ranks,
    /// The program (a batch script) runs once, on the first node, as
    /// Slurm's batch step; the rest of the allocation waits for job steps
    /// (`sbatch`). The job ends when the script does.
    Batch,
    /// Nothing runs until a step is started; the allocation is held until
    /// it is released or its time runs out (`salloc`, `srun` outside an
    /// allocation).
    Allocation,
}

impl Launch {
    pub fn is_ranks(&self) -> bool {
        *self == Launch::Ranks
    }

    /// The local ranks a node with `node_rank` runs by itself, out of
    /// `per_node` tasks per node.
    pub fn local_ranks(&self, node_rank: u32, per_node: u32) -> std::ops::Range<u32> {
        match self {
            Launch::Ranks => 0..per_node.max(1),
            Launch::Batch if node_rank == 0 => 0..1,
            Launch::Batch | Launch::Allocation => 0..0,
        }
    }

    /// How many tasks the job runs by itself, of `total` ranks.
    pub fn launched(&self, total: u64) -> u64 {
        match self {
            Launch::Ranks => total,
            Launch::Batch => 1,
            Launch::Allocation => 0,
        }
    }
}

/// The most steps one attempt of a job may start.
pub const MAX_STEPS: usize = 10_000;

/// What `srun` asks for inside an allocation.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StepSpec {
    /// Shown by `sacct` (`--job-name`, default the program's name).
    pub name: String,
    pub program: Program,
    /// The job's node ranks the step runs on, in step order (its node 0
    /// first).
    pub nodes: Vec<u32>,
    /// Tasks on each of those nodes (block distribution): the step's
    /// ranks are numbered node by node.
    pub tasks: Vec<u32>,
    /// CPUs per task, for `SLURM_CPUS_PER_TASK`.
    pub cpus_per_task: u32,
    /// GPUs each task sees, out of its node's; `None`: all of them.
    #[serde(default)]
    pub gpus_per_task: Option<u32>,
    pub workdir: String,
    pub env: Vec<(String, String)>,
    /// Output patterns; `None`: kept on the node for `srun` to stream.
    #[serde(default)]
    pub output: Option<String>,
    #[serde(default)]
    pub error: Option<String>,
    /// Stop the other tasks when one fails (`srun -K`).
    #[serde(default)]
    pub kill_on_bad_exit: bool,
    /// How its tasks' standard streams are connected: a terminal for
    /// `srun --pty` (its one task), whose output still lands in the spool.
    #[serde(default, skip_serializing_if = "super::TaskIo::is_files")]
    pub io: super::TaskIo,
    /// The image the step's tasks run in (`srun --container-image`);
    /// `None`: the job's, if it has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub container: Option<super::ContainerSpec>,
}

impl StepSpec {
    pub fn ntasks(&self) -> u32 {
        self.tasks.iter().sum()
    }

    /// Where step rank `rank` runs: (index into `nodes`, local rank).
    pub fn place(&self, rank: u32) -> Option<(usize, u32)> {
        let mut first = 0;
        for (i, &n) in self.tasks.iter().enumerate() {
            if rank < first + n {
                return Some((i, rank - first));
            }
            first += n;
        }
        None
    }

    /// The step's ranks on the job's node `node_rank` (none when it does
    /// not run there).
    pub fn ranks_on(&self, node_rank: u32) -> std::ops::Range<u32> {
        match self.nodes.iter().position(|&n| n == node_rank) {
            Some(i) => {
                let first = self.first_rank(i);
                first..first + self.tasks[i]
            }
            None => 0..0,
        }
    }

    /// The step's first rank on its `i`th node.
    pub fn first_rank(&self, i: usize) -> u32 {
        self.tasks[..i.min(self.tasks.len())].iter().sum()
    }

    /// Checks the shape against a job of `job_nodes` nodes; a sentence
    /// naming the problem and the fix.
    pub fn check(&self, job_nodes: u32) -> Result<(), String> {
        if self.nodes.is_empty() || self.nodes.len() != self.tasks.len() {
            return Err("a step needs at least one node and a task count per node".into());
        }
        if let Some(n) = self.nodes.iter().find(|&&n| n >= job_nodes) {
            return Err(format!(
                "the step asks for node {n} of the allocation, which has {job_nodes} node(s)"
            ));
        }
        let distinct: BTreeSet<u32> = self.nodes.iter().copied().collect();
        if distinct.len() != self.nodes.len() {
            return Err("a step names one of the allocation's nodes twice".into());
        }
        if self.tasks.contains(&0) {
            return Err("every node of a step runs at least one task".into());
        }
        if self.ntasks() > 1 << 16 {
            return Err(format!("{} tasks in one step is too many", self.ntasks()));
        }
        Ok(())
    }
}

/// One job step of an attempt, as the state keeps it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Step {
    /// 0, 1, ... in the order the attempt started them (`ID.0`).
    pub id: u32,
    pub spec: StepSpec,
    pub start_time: Millis,
    #[serde(default)]
    pub end_time: Option<Millis>,
    /// What was left of the job's time limit when the step started: its
    /// tasks' limit (the job's own end stops them too).
    #[serde(default)]
    pub time_limit_secs: Option<u64>,
    /// Step ranks whose start was reported.
    #[serde(default)]
    pub started: BTreeSet<u32>,
    /// Step ranks whose end was reported, and how.
    #[serde(default)]
    pub ended: BTreeMap<u32, TaskEnd>,
    /// Its tasks are to stop (`srun` interrupted, `scancel ID.STEP`, a bad
    /// exit under `-K`).
    #[serde(default)]
    pub cancelled: bool,
}

impl Step {
    pub fn is_over(&self) -> bool {
        self.end_time.is_some()
    }

    /// Every task has ended.
    pub fn all_ended(&self) -> bool {
        self.ended.len() as u64 >= u64::from(self.spec.ntasks())
    }

    /// The step's exit status as `srun` reports it: the highest exit code
    /// of its tasks, 128 + N for a task killed by signal N.
    pub fn exit_code(&self) -> i32 {
        self.ended
            .values()
            .map(TaskEnd::exit_code)
            .max()
            .unwrap_or(0)
    }

    /// How it ended: the first non-successful task end, else Completed.
    pub fn outcome(&self) -> TaskEnd {
        self.ended
            .values()
            .find(|e| **e != TaskEnd::Completed)
            .cloned()
            .unwrap_or(TaskEnd::Completed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(nodes: &[u32], tasks: &[u32]) -> StepSpec {
        StepSpec {
            name: "s".into(),
            program: Program::Command {
                argv: vec!["true".into()],
            },
            nodes: nodes.to_vec(),
            tasks: tasks.to_vec(),
            cpus_per_task: 1,
            gpus_per_task: None,
            workdir: "/".into(),
            env: Vec::new(),
            output: None,
            error: None,
            kill_on_bad_exit: false,
            io: Default::default(),
            container: None,
        }
    }

    #[test]
    fn ranks_are_placed_node_by_node() {
        let s = spec(&[1, 0], &[2, 3]);
        assert_eq!(s.ntasks(), 5);
        assert_eq!(s.place(0), Some((0, 0)));
        assert_eq!(s.place(1), Some((0, 1)));
        assert_eq!(s.place(2), Some((1, 0)));
        assert_eq!(s.place(4), Some((1, 2)));
        assert_eq!(s.place(5), None);
        assert_eq!(s.first_rank(1), 2);
    }

    #[test]
    fn bad_shapes_are_refused() {
        assert!(spec(&[0, 1], &[1, 1]).check(2).is_ok());
        assert!(spec(&[2], &[1]).check(2).unwrap_err().contains("node 2"));
        assert!(spec(&[0, 0], &[1, 1]).check(2).is_err());
        assert!(spec(&[0], &[0]).check(2).is_err());
        assert!(spec(&[], &[]).check(2).is_err());
    }

    #[test]
    fn launches_run_their_own_ranks() {
        assert_eq!(Launch::Ranks.local_ranks(3, 4), 0..4);
        assert_eq!(Launch::Batch.local_ranks(0, 4), 0..1);
        assert!(Launch::Batch.local_ranks(1, 4).is_empty());
        assert!(Launch::Allocation.local_ranks(0, 4).is_empty());
        assert_eq!(Launch::Batch.launched(16), 1);
    }

    #[test]
    fn exit_code_is_the_highest_with_signals_as_128_plus() {
        let mut step = Step {
            id: 0,
            spec: spec(&[0], &[3]),
            start_time: 0,
            end_time: None,
            time_limit_secs: None,
            started: BTreeSet::new(),
            ended: BTreeMap::new(),
            cancelled: false,
        };
        step.ended.insert(0, TaskEnd::Completed);
        step.ended.insert(
            1,
            TaskEnd::Failed {
                exit_code: Some(3),
                signal: None,
            },
        );
        assert_eq!(step.exit_code(), 3);
        step.ended.insert(
            2,
            TaskEnd::Failed {
                exit_code: None,
                signal: Some(9),
            },
        );
        assert_eq!(step.exit_code(), 137);
        assert!(step.all_ended());
    }
}
