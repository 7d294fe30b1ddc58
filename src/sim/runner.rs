//! The simulated executor: a task "runs" for the duration its job declares
//! and then ends, with no process behind it.
//!
//! A task's fate is a pure function of when it started and what it declared
//! (`GPUQ_SIM_DURATION_MS`, `GPUQ_SIM_EXIT`, the time limit), so nothing
//! ticks while it runs: `scan` compares each deadline with the clock when the
//! agent looks. The agent polls `scan` on every reconcile anyway, so a timer
//! per task (or a shared timer task) would only add wake-ups; this way 10,000
//! tasks cost 10,000 map entries and nothing else. An end is seen at the
//! agent's next reconcile, as a real task's exit is.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::agent::runner::{Observed, TaskRunner};
use crate::model::{TaskEnd, TaskKey};
use crate::net::agent_proto::DesiredTask;

/// The job env var naming how long each rank runs, in (uncompressed) ms.
pub const DURATION_ENV: &str = "GPUQ_SIM_DURATION_MS";
/// The job env var naming the exit code each rank ends with (0: completed).
pub const EXIT_ENV: &str = "GPUQ_SIM_EXIT";
/// How long a task runs when its job declares nothing.
pub const DEFAULT_DURATION: Duration = Duration::from_millis(1000);

/// Where the runner reads the time: the real clock, or one a test moves.
#[derive(Clone, Debug)]
pub enum SimClock {
    Real,
    Manual(Arc<ManualClock>),
}

impl SimClock {
    fn now(&self) -> Instant {
        match self {
            SimClock::Real => Instant::now(),
            SimClock::Manual(m) => m.now(),
        }
    }
}

/// A clock that only moves when told to (tests).
#[derive(Debug)]
pub struct ManualClock {
    base: Instant,
    offset: Mutex<Duration>,
}

impl ManualClock {
    pub fn new() -> Arc<ManualClock> {
        Arc::new(ManualClock {
            base: Instant::now(),
            offset: Mutex::new(Duration::ZERO),
        })
    }

    /// Moves the clock forward by `d`.
    pub fn advance(&self, d: Duration) {
        *self.offset.lock().unwrap_or_else(|p| p.into_inner()) += d;
    }

    fn now(&self) -> Instant {
        self.base + *self.offset.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// One simulated task.
#[derive(Clone, Debug)]
struct SimTask {
    /// When it ends by itself, and how.
    deadline: Instant,
    natural_end: TaskEnd,
    /// Set when it was stopped before its deadline.
    stopped: Option<TaskEnd>,
}

impl SimTask {
    fn observe(&self, now: Instant) -> Observed {
        match &self.stopped {
            Some(end) => Observed::Ended(end.clone()),
            None if now >= self.deadline => Observed::Ended(self.natural_end.clone()),
            None => Observed::Running,
        }
    }
}

/// A `TaskRunner` whose tasks take the time they declare, divided by
/// `compression`, and touch nothing on the host.
pub struct SimRunner {
    compression: f64,
    clock: SimClock,
    tasks: Mutex<HashMap<TaskKey, SimTask>>,
}

/// What a task declared, read from its job's env.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Declared {
    pub duration: Duration,
    pub exit_code: i32,
}

/// Reads `GPUQ_SIM_DURATION_MS` and `GPUQ_SIM_EXIT` from a job's env; a
/// value that is not a number is the user's mistake and names the variable.
pub fn declared(env: &[(String, String)]) -> Result<Declared, String> {
    let get = |name: &str| env.iter().rev().find(|(k, _)| k == name).map(|(_, v)| v);
    let duration =
        match get(DURATION_ENV) {
            None => DEFAULT_DURATION,
            Some(v) => Duration::from_millis(v.trim().parse::<u64>().map_err(|_| {
                format!("{DURATION_ENV}={v:?} is not a whole number of milliseconds")
            })?),
        };
    let exit_code = match get(EXIT_ENV) {
        None => 0,
        Some(v) if v.trim().is_empty() => 0,
        Some(v) => v
            .trim()
            .parse::<i32>()
            .map_err(|_| format!("{EXIT_ENV}={v:?} is not an exit code"))?,
    };
    Ok(Declared {
        duration,
        exit_code,
    })
}

impl SimRunner {
    /// A runner on the real clock. `compression` > 1 makes tasks end sooner:
    /// a task declaring 1 h ends after 3.6 s at 1000.
    pub fn new(compression: f64) -> Result<SimRunner, String> {
        SimRunner::with_clock(compression, SimClock::Real)
    }

    pub fn with_clock(compression: f64, clock: SimClock) -> Result<SimRunner, String> {
        if !(compression.is_finite() && compression > 0.0) {
            return Err(format!(
                "time compression {compression} must be a positive number (1 = real time)"
            ));
        }
        Ok(SimRunner {
            compression,
            clock,
            tasks: Mutex::new(HashMap::new()),
        })
    }

    /// How long a task declaring `d` runs here.
    pub fn compressed(&self, d: Duration) -> Duration {
        Duration::from_secs_f64(d.as_secs_f64() / self.compression)
    }

    /// Tasks known now (running or ended, not yet forgotten).
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<TaskKey, SimTask>> {
        self.tasks.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl TaskRunner for SimRunner {
    fn start(&self, task: &DesiredTask) -> Result<(), String> {
        let declared = declared(&task.env)?;
        // The declared duration is trace time and is compressed; the time
        // limit is the server's, on the wall clock (its backfill timeline
        // counts `start + limit` in wall ms), so it is not.
        let limit = task.time_limit_secs.map(Duration::from_secs);
        let runs_for = self.compressed(declared.duration);
        let (runs_for, natural_end) = match limit {
            Some(l) if l < runs_for => (l, TaskEnd::Timeout),
            _ if declared.exit_code == 0 => (runs_for, TaskEnd::Completed),
            _ => (
                runs_for,
                TaskEnd::Failed {
                    exit_code: Some(declared.exit_code),
                    signal: None,
                },
            ),
        };
        let deadline = self.clock.now() + runs_for;
        let key = task.key;
        // A repeated start of a known task changes nothing (the ledger never
        // asks, but a runner must not run a rank twice).
        self.lock().entry(key).or_insert(SimTask {
            deadline,
            natural_end,
            stopped: None,
        });
        Ok(())
    }

    fn stop(&self, key: TaskKey) {
        let now = self.clock.now();
        if let Some(t) = self.lock().get_mut(&key) {
            if t.observe(now) == Observed::Running {
                t.stopped = Some(TaskEnd::Cancelled);
            }
        }
    }

    fn scan(&self) -> Vec<(TaskKey, Observed)> {
        let now = self.clock.now();
        self.lock()
            .iter()
            .map(|(k, t)| (*k, t.observe(now)))
            .collect()
    }

    fn forget(&self, key: TaskKey) {
        self.lock().remove(&key);
    }
}

#[cfg(test)]
mod tests {
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

    fn task(job: u64, rank: u32, env: &[(&str, &str)]) -> DesiredTask {
        DesiredTask {
            key: key(job, rank),
            node_rank: 0,
            local_rank: 0,
            ntasks_per_node: 1,
            num_nodes: 1,
            nodelist: vec!["sim0001".into()],
            user: "alice".into(),
            job_name: "j".into(),
            program: Program::Command {
                argv: vec!["true".into()],
            },
            workdir: "/tmp".into(),
            env: env
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            output: None,
            error: None,
            gpus: vec![0],
            cpus: vec![],
            cpu_count: 1,
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

    fn runner(compression: f64) -> (SimRunner, Arc<ManualClock>) {
        let clock = ManualClock::new();
        let r = SimRunner::with_clock(compression, SimClock::Manual(clock.clone())).unwrap();
        (r, clock)
    }

    fn state(r: &SimRunner, key: TaskKey) -> Option<Observed> {
        r.scan()
            .into_iter()
            .find(|(k, _)| *k == key)
            .map(|(_, o)| o)
    }

    #[test]
    fn a_task_runs_for_its_declared_duration_then_completes() {
        let (r, clock) = runner(1.0);
        r.start(&task(1, 0, &[(DURATION_ENV, "5000")])).unwrap();
        assert_eq!(state(&r, key(1, 0)), Some(Observed::Running));
        clock.advance(Duration::from_millis(4999));
        assert_eq!(state(&r, key(1, 0)), Some(Observed::Running));
        clock.advance(Duration::from_millis(1));
        assert_eq!(
            state(&r, key(1, 0)),
            Some(Observed::Ended(TaskEnd::Completed))
        );
        // Ended tasks stay visible until forgotten.
        clock.advance(Duration::from_secs(60));
        assert_eq!(
            state(&r, key(1, 0)),
            Some(Observed::Ended(TaskEnd::Completed))
        );
    }

    #[test]
    fn without_a_declaration_a_task_runs_the_default() {
        let (r, clock) = runner(1.0);
        r.start(&task(1, 0, &[])).unwrap();
        clock.advance(DEFAULT_DURATION - Duration::from_millis(1));
        assert_eq!(state(&r, key(1, 0)), Some(Observed::Running));
        clock.advance(Duration::from_millis(1));
        assert_eq!(
            state(&r, key(1, 0)),
            Some(Observed::Ended(TaskEnd::Completed))
        );
    }

    #[test]
    fn compression_divides_the_duration() {
        let (r, clock) = runner(1000.0);
        // One hour of trace time is 3.6 s here.
        r.start(&task(1, 0, &[(DURATION_ENV, "3600000")])).unwrap();
        clock.advance(Duration::from_millis(3599));
        assert_eq!(state(&r, key(1, 0)), Some(Observed::Running));
        clock.advance(Duration::from_millis(1));
        assert_eq!(
            state(&r, key(1, 0)),
            Some(Observed::Ended(TaskEnd::Completed))
        );
        assert!(SimRunner::new(0.0).is_err());
        assert!(SimRunner::new(f64::NAN).is_err());
        assert!(SimRunner::new(-2.0).is_err());
    }

    #[test]
    fn a_declared_exit_code_fails_the_task_and_a_limit_times_it_out() {
        let (r, clock) = runner(10.0);
        r.start(&task(1, 0, &[(DURATION_ENV, "100"), (EXIT_ENV, "3")]))
            .unwrap();
        r.start(&task(2, 0, &[(DURATION_ENV, "100"), (EXIT_ENV, "0")]))
            .unwrap();
        let mut limited = task(3, 0, &[(DURATION_ENV, "3600000")]);
        limited.time_limit_secs = Some(60);
        r.start(&limited).unwrap();
        clock.advance(Duration::from_millis(10));
        assert_eq!(
            state(&r, key(1, 0)),
            Some(Observed::Ended(TaskEnd::Failed {
                exit_code: Some(3),
                signal: None
            }))
        );
        assert_eq!(
            state(&r, key(2, 0)),
            Some(Observed::Ended(TaskEnd::Completed))
        );
        assert_eq!(state(&r, key(3, 0)), Some(Observed::Running));
        // The limit is wall time: 60 s, not 60 s / 10.
        clock.advance(Duration::from_secs(6));
        assert_eq!(state(&r, key(3, 0)), Some(Observed::Running));
        clock.advance(Duration::from_secs(54));
        assert_eq!(
            state(&r, key(3, 0)),
            Some(Observed::Ended(TaskEnd::Timeout))
        );
    }

    #[test]
    fn bad_declarations_are_launch_failures_naming_the_variable() {
        let (r, _) = runner(1.0);
        let err = r.start(&task(1, 0, &[(DURATION_ENV, "ten")])).unwrap_err();
        assert!(err.contains(DURATION_ENV) && err.contains("ten"), "{err}");
        let err = r.start(&task(2, 0, &[(EXIT_ENV, "x")])).unwrap_err();
        assert!(err.contains(EXIT_ENV), "{err}");
        assert!(r.is_empty(), "nothing half-started");
    }

    #[test]
    fn stop_cancels_a_running_task_but_not_an_ended_one() {
        let (r, clock) = runner(1.0);
        r.start(&task(1, 0, &[(DURATION_ENV, "10000")])).unwrap();
        r.start(&task(2, 0, &[(DURATION_ENV, "10")])).unwrap();
        clock.advance(Duration::from_millis(100));
        r.stop(key(1, 0));
        r.stop(key(2, 0));
        r.stop(key(9, 0)); // unknown: nothing happens
        assert_eq!(
            state(&r, key(1, 0)),
            Some(Observed::Ended(TaskEnd::Cancelled))
        );
        assert_eq!(
            state(&r, key(2, 0)),
            Some(Observed::Ended(TaskEnd::Completed))
        );
        // Its deadline passing later does not turn a cancel into a completion.
        clock.advance(Duration::from_secs(60));
        assert_eq!(
            state(&r, key(1, 0)),
            Some(Observed::Ended(TaskEnd::Cancelled))
        );
        assert_eq!(r.len(), 2);
    }

    #[test]
    fn forget_drops_a_task_and_a_repeated_start_runs_nothing_twice() {
        let (r, clock) = runner(1.0);
        let t = task(1, 0, &[(DURATION_ENV, "1000")]);
        r.start(&t).unwrap();
        clock.advance(Duration::from_millis(600));
        r.start(&t).unwrap();
        clock.advance(Duration::from_millis(400));
        assert_eq!(
            state(&r, key(1, 0)),
            Some(Observed::Ended(TaskEnd::Completed)),
            "the second start did not restart the clock"
        );
        r.forget(key(1, 0));
        assert!(r.scan().is_empty());
        r.forget(key(1, 0)); // forgetting twice is harmless
    }

    #[test]
    fn attempts_and_ranks_are_separate_tasks() {
        let (r, _) = runner(1.0);
        let mut a = task(1, 0, &[]);
        r.start(&a).unwrap();
        a.key.rank = 1;
        r.start(&a).unwrap();
        a.key.attempt = 1;
        r.start(&a).unwrap();
        let mut keys: Vec<TaskKey> = r.scan().into_iter().map(|(k, _)| k).collect();
        keys.sort();
        let attempt_1 = TaskKey {
            attempt: 1,
            ..key(1, 1)
        };
        assert_eq!(keys, vec![key(1, 0), key(1, 1), attempt_1]);
    }
}
