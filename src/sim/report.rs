//! The figures a workload produced: queueing delay, completion time,
//! utilisation and large jobs' wait, from the jobs' own leader-stamped times
//! (see [`super::workload`]).

use std::collections::BTreeMap;

use serde::Serialize;

use super::workload::JobRecord;
use crate::model::JobState;

/// What a workload did, in wall ms (and trace seconds where it says so).
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Report {
    pub jobs: usize,
    pub completed: usize,
    /// Jobs not ended when the driver stopped waiting.
    pub unfinished: usize,
    pub fleet_gpus: u64,
    pub compression: f64,
    /// From the first submit to the last end, wall seconds.
    pub makespan_s: f64,
    /// GPU-time held by jobs over fleet GPU-time in the makespan.
    pub gpu_utilisation: f64,
    /// The same within the arrival window (first to last submit), where the
    /// load is the trace's and not the drain's tail of long jobs.
    pub window_utilisation: f64,
    /// The arrival window, wall seconds.
    pub window_s: f64,
    pub queue_delay_mean_ms: f64,
    pub queue_delay_p99_ms: f64,
    pub jct_mean_ms: f64,
    /// Wait of jobs with 32 GPUs or more.
    pub large_jobs: usize,
    pub large_wait_mean_ms: f64,
    pub large_wait_p99_ms: f64,
    pub ack_p50_ms: f64,
    pub ack_p99_ms: f64,
    /// How far behind schedule the driver submitted, at worst.
    pub max_submit_lag_ms: f64,
    /// Per class (job name): jobs and mean queueing delay, ms.
    pub by_name: BTreeMap<String, (usize, f64)>,
}

/// The `p` quantile (0..=1) of `v`, nearest rank; 0 for none.
pub fn quantile(v: &[f64], p: f64) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    let mut s = v.to_vec();
    s.sort_by(|a, b| a.total_cmp(b));
    s[((s.len() as f64 - 1.0) * p).round() as usize]
}

fn mean(v: &[f64]) -> f64 {
    if v.is_empty() {
        0.0
    } else {
        v.iter().sum::<f64>() / v.len() as f64
    }
}

/// Summarises `records` on a fleet of `fleet_gpus`.
pub fn report(records: &[JobRecord], fleet_gpus: u64, compression: f64) -> Report {
    let ms = |a: u64, b: u64| b.saturating_sub(a) as f64;
    let waits: Vec<f64> = records
        .iter()
        .filter_map(|r| Some(ms(r.submit_time, r.start_time?)))
        .collect();
    let jcts: Vec<f64> = records
        .iter()
        .filter_map(|r| Some(ms(r.submit_time, r.end_time?)))
        .collect();
    let large: Vec<f64> = records
        .iter()
        .filter(|r| r.gpus >= 32)
        .filter_map(|r| Some(ms(r.submit_time, r.start_time?)))
        .collect();
    let first = records.iter().map(|r| r.submit_time).min().unwrap_or(0);
    let last = records
        .iter()
        .filter_map(|r| r.end_time)
        .max()
        .unwrap_or(first);
    let makespan_ms = ms(first, last);
    let busy: f64 = records
        .iter()
        .filter_map(|r| Some(r.gpus as f64 * ms(r.start_time?, r.end_time?)))
        .sum();
    let last_submit = records.iter().map(|r| r.submit_time).max().unwrap_or(first);
    let window_ms = ms(first, last_submit);
    let window_busy: f64 = records
        .iter()
        .filter_map(|r| {
            let (s, e) = (r.start_time?, r.end_time.unwrap_or(last_submit));
            Some(r.gpus as f64 * ms(s, e.min(last_submit)))
        })
        .sum();
    let acks: Vec<f64> = records.iter().map(|r| r.ack.as_secs_f64() * 1e3).collect();
    let mut by_name: BTreeMap<String, Vec<f64>> = BTreeMap::new();
    for r in records {
        if let Some(s) = r.start_time {
            by_name
                .entry(r.name.clone())
                .or_default()
                .push(ms(r.submit_time, s));
        }
    }
    Report {
        jobs: records.len(),
        completed: records
            .iter()
            .filter(|r| r.state == JobState::Completed)
            .count(),
        unfinished: records.iter().filter(|r| !r.state.is_final()).count(),
        fleet_gpus,
        compression,
        makespan_s: makespan_ms / 1e3,
        gpu_utilisation: if fleet_gpus == 0 || makespan_ms == 0.0 {
            0.0
        } else {
            busy / (fleet_gpus as f64 * makespan_ms)
        },
        window_utilisation: if fleet_gpus == 0 || window_ms == 0.0 {
            0.0
        } else {
            window_busy / (fleet_gpus as f64 * window_ms)
        },
        window_s: window_ms / 1e3,
        queue_delay_mean_ms: mean(&waits),
        queue_delay_p99_ms: quantile(&waits, 0.99),
        jct_mean_ms: mean(&jcts),
        large_jobs: records.iter().filter(|r| r.gpus >= 32).count(),
        large_wait_mean_ms: mean(&large),
        large_wait_p99_ms: quantile(&large, 0.99),
        ack_p50_ms: quantile(&acks, 0.5),
        ack_p99_ms: quantile(&acks, 0.99),
        max_submit_lag_ms: records
            .iter()
            .map(|r| r.sent.saturating_sub(r.planned).as_secs_f64() * 1e3)
            .fold(0.0, f64::max),
        by_name: by_name
            .into_iter()
            .map(|(k, v)| (k, (v.len(), mean(&v))))
            .collect(),
    }
}

impl std::fmt::Display for Report {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let trace_s = |ms: f64| ms * self.compression / 1e3;
        writeln!(
            f,
            "jobs {} (completed {}, unfinished {}) on {} GPUs, compression {}",
            self.jobs, self.completed, self.unfinished, self.fleet_gpus, self.compression
        )?;
        writeln!(
            f,
            "makespan {:.1} s wall; GPU utilisation {:.1}% (arrival window {:.1} s: {:.1}%)",
            self.makespan_s,
            self.gpu_utilisation * 100.0,
            self.window_s,
            self.window_utilisation * 100.0
        )?;
        writeln!(f, "{:<26} {:>12} {:>14}", "figure", "wall ms", "trace s")?;
        for (name, v) in [
            ("queueing delay, mean", self.queue_delay_mean_ms),
            ("queueing delay, p99", self.queue_delay_p99_ms),
            ("job completion, mean", self.jct_mean_ms),
            ("wait >=32 GPUs, mean", self.large_wait_mean_ms),
            ("wait >=32 GPUs, p99", self.large_wait_p99_ms),
        ] {
            writeln!(f, "{name:<26} {v:>12.1} {:>14.1}", trace_s(v))?;
        }
        write!(
            f,
            "large jobs {}; submit ack p50 {:.2} ms p99 {:.2} ms; worst submit lag {:.1} ms",
            self.large_jobs, self.ack_p50_ms, self.ack_p99_ms, self.max_submit_lag_ms
        )
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn record(gpus: u64, submit: u64, start: Option<u64>, end: Option<u64>) -> JobRecord {
        JobRecord {
            id: submit,
            name: format!("{gpus}g"),
            gpus,
            planned: Duration::ZERO,
            sent: Duration::from_millis(3),
            ack: Duration::from_millis(1),
            state: if end.is_some() {
                JobState::Completed
            } else {
                JobState::Pending
            },
            submit_time: submit,
            start_time: start,
            end_time: end,
        }
    }

    #[test]
    fn report_figures() {
        // 16 GPUs for 10 s; two jobs of 8 GPUs each busy 5 s of it.
        let records = vec![
            record(8, 0, Some(0), Some(5000)),
            record(8, 0, Some(5000), Some(10000)),
            record(32, 1000, Some(2000), Some(3000)),
            record(1, 9000, None, None),
        ];
        let r = report(&records, 64, 10.0);
        assert_eq!(r.jobs, 4);
        assert_eq!(r.completed, 3);
        assert_eq!(r.unfinished, 1);
        assert_eq!(r.makespan_s, 10.0);
        let busy = 8.0 * 5000.0 * 2.0 + 32.0 * 1000.0;
        assert!((r.gpu_utilisation - busy / (64.0 * 10000.0)).abs() < 1e-9);
        // The window ends at the last submit (9 s): the second 8-GPU job
        // counts 4 s of its 5.
        let window_busy = 8.0 * 5000.0 + 8.0 * 4000.0 + 32.0 * 1000.0;
        assert!((r.window_utilisation - window_busy / (64.0 * 9000.0)).abs() < 1e-9);
        assert_eq!(r.window_s, 9.0);
        assert_eq!(r.queue_delay_mean_ms, (0.0 + 5000.0 + 1000.0) / 3.0);
        assert_eq!(r.queue_delay_p99_ms, 5000.0);
        assert_eq!(r.jct_mean_ms, (5000.0 + 10000.0 + 2000.0) / 3.0);
        assert_eq!((r.large_jobs, r.large_wait_mean_ms), (1, 1000.0));
        assert_eq!(r.max_submit_lag_ms, 3.0);
        assert_eq!(r.by_name["8g"], (2, 2500.0));
        let text = r.to_string();
        assert!(
            text.contains("utilisation") && text.contains("trace s"),
            "{text}"
        );
        assert_eq!(report(&[], 0, 1.0).gpu_utilisation, 0.0);
    }

    #[test]
    fn quantiles() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(quantile(&v, 0.5), 51.0);
        assert_eq!(quantile(&v, 0.99), 99.0);
        assert_eq!(quantile(&v, 1.0), 100.0);
        assert_eq!(quantile(&[], 0.5), 0.0);
    }
}
