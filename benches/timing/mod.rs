//! Repeated timing for the scheduling benches (`place`, `mig`, `elastic`):
//! the number of passes from `GPUQ_BENCH_N`, and percentiles of them.

use std::time::{Duration, Instant};

/// `GPUQ_BENCH_N`, else `default`.
pub fn passes(default: usize) -> usize {
    std::env::var("GPUQ_BENCH_N")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// How long each of `passes` runs of `f` took, sorted.
pub struct Times(Vec<Duration>);

impl Times {
    pub fn of<T>(passes: usize, mut f: impl FnMut() -> T) -> Times {
        let mut times: Vec<Duration> = (0..passes.max(1))
            .map(|_| {
                let t = Instant::now();
                std::hint::black_box(f());
                t.elapsed()
            })
            .collect();
        times.sort();
        Times(times)
    }

    /// The `p`th percentile (nearest rank below).
    pub fn pct(&self, p: usize) -> Duration {
        self.0[(self.0.len() * p / 100).min(self.0.len() - 1)]
    }
}
