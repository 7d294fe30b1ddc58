//! Latency histograms any room may fill: the log writer times its fsyncs,
//! the scheduler its passes, the leader a job's wait for its start. They
//! live here, low in the house, because the rooms that measure (`raft`,
//! `server`) are not the room that shows them (`http` writes them out in
//! Prometheus's text format): a histogram is a few atomics, filled without
//! a lock from any thread, and read as a consistent-enough [`Snapshot`].

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Upper bounds in seconds for durations from a fraction of a millisecond
/// to ten seconds: fsyncs, scheduling passes, HTTP requests.
pub const LATENCY_BUCKETS: &[f64] = &[
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
    5.0, 10.0,
];

/// Upper bounds in seconds for waits from a second to a day: how long jobs
/// queue before they start.
pub const WAIT_BUCKETS: &[f64] = &[
    1.0, 5.0, 15.0, 30.0, 60.0, 300.0, 900.0, 1800.0, 3600.0, 14400.0, 43200.0, 86400.0,
];

/// A cumulative histogram of observations in seconds.
#[derive(Debug)]
pub struct Histogram {
    bounds: &'static [f64],
    /// One count per bound, and one more for above the last (`+Inf`).
    counts: Vec<AtomicU64>,
    /// The sum of the observations, in nanoseconds (whole: atomics add
    /// integers, and a nanosecond is finer than any bound).
    sum_ns: AtomicU64,
}

/// A histogram as read at one moment: cumulative counts per bound.
#[derive(Clone, Debug, PartialEq)]
pub struct Snapshot {
    /// `(upper bound, observations at or below it)`, the bounds ascending.
    pub buckets: Vec<(f64, u64)>,
    /// Every observation (the `+Inf` bucket).
    pub count: u64,
    /// Their sum in seconds.
    pub sum: f64,
}

impl Histogram {
    /// An empty histogram with these upper bounds (ascending, in seconds).
    pub fn new(bounds: &'static [f64]) -> Histogram {
        Histogram {
            bounds,
            counts: (0..=bounds.len()).map(|_| AtomicU64::new(0)).collect(),
            sum_ns: AtomicU64::new(0),
        }
    }

    /// Records one observation of `secs` seconds (negative counts as 0).
    pub fn observe(&self, secs: f64) {
        let secs = if secs.is_finite() { secs.max(0.0) } else { 0.0 };
        let slot = self
            .bounds
            .iter()
            .position(|b| secs <= *b)
            .unwrap_or(self.bounds.len());
        self.counts[slot].fetch_add(1, Ordering::Relaxed);
        self.sum_ns
            .fetch_add((secs * 1e9) as u64, Ordering::Relaxed);
    }

    /// Records one observation of `d`.
    pub fn observe_duration(&self, d: Duration) {
        self.observe(d.as_secs_f64());
    }

    /// The counts so far, cumulative as Prometheus wants them.
    pub fn snapshot(&self) -> Snapshot {
        let mut running = 0;
        let mut buckets = Vec::with_capacity(self.bounds.len());
        for (bound, count) in self.bounds.iter().zip(&self.counts) {
            running += count.load(Ordering::Relaxed);
            buckets.push((*bound, running));
        }
        let count = running + self.counts[self.bounds.len()].load(Ordering::Relaxed);
        Snapshot {
            buckets,
            count,
            sum: self.sum_ns.load(Ordering::Relaxed) as f64 / 1e9,
        }
    }
}

impl Default for Histogram {
    /// A latency histogram ([`LATENCY_BUCKETS`]).
    fn default() -> Self {
        Histogram::new(LATENCY_BUCKETS)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn observations_land_in_every_bucket_at_or_above_them() {
        let h = Histogram::new(&[0.1, 1.0]);
        h.observe(0.05);
        h.observe(0.1);
        h.observe(0.5);
        h.observe(7.0);
        h.observe(-1.0);
        let s = h.snapshot();
        assert_eq!(s.buckets, vec![(0.1, 3), (1.0, 4)]);
        assert_eq!(s.count, 5);
        assert!((s.sum - 7.65).abs() < 1e-6, "{}", s.sum);
    }
}
