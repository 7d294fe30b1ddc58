//! GPUs allocated over time, for the web page's chart: the last hours cut
//! into equal buckets, each the mean number of GPUs held during it (every
//! run's GPU-milliseconds inside the bucket over the bucket's length).
//!
//! Nothing new is stored: the runs are `gpuq acct`'s records (start, end,
//! GPUs of a job's last attempt) from the active set and the history
//! archive, read on whichever server answers. So an earlier attempt of a
//! requeued job is not counted, as `acct` charges only the last one; a job
//! still holding its GPUs counts up to now.

use crate::clock::now_ms;
use crate::model::acct::{AcctFilter, AcctRecord};
use crate::model::{JobState, Millis};
use crate::net::proto::{ApiResponse, ErrorKind, UTILISATION_BUCKETS, UTILISATION_HOURS};

use super::Api;

/// Equal buckets from `from`, oldest first.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Buckets {
    from: Millis,
    bucket_ms: u64,
    count: usize,
}

impl Buckets {
    /// `count` buckets covering the `hours` before `to` (less the
    /// remainder of a division that is not exact, at the old end).
    fn ending_at(to: Millis, hours: u32, count: u32) -> Buckets {
        let count = u64::from(count.max(1));
        let bucket_ms = (u64::from(hours) * 3_600_000 / count).max(1);
        Buckets {
            from: to.saturating_sub(bucket_ms * count),
            bucket_ms,
            count: count as usize,
        }
    }

    fn to(self) -> Millis {
        self.from + self.bucket_ms * self.count as u64
    }
}

/// GPUs held from `start` until `end` (`None`: still held).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Hold {
    start: Millis,
    end: Option<Millis>,
    gpus: u64,
}

impl Hold {
    /// A record's run; `None` for a job that never started.
    fn of(record: &AcctRecord) -> Option<Hold> {
        Some(Hold {
            start: record.start_time?,
            end: record.end_time,
            gpus: u64::from(record.gpus),
        })
    }
}

/// The mean GPUs held in each bucket. A hold still open counts up to the
/// buckets' end (now).
fn mean_allocated(holds: impl IntoIterator<Item = Hold>, b: Buckets) -> Vec<f64> {
    let mut gpu_ms = vec![0u64; b.count];
    for h in holds {
        let start = h.start.max(b.from);
        let end = h.end.unwrap_or(Millis::MAX).min(b.to());
        if start >= end || h.gpus == 0 {
            continue;
        }
        let first = ((start - b.from) / b.bucket_ms) as usize;
        let last = (((end - 1 - b.from) / b.bucket_ms) as usize).min(b.count - 1);
        for (i, slot) in gpu_ms.iter_mut().enumerate().take(last + 1).skip(first) {
            let lo = b.from + i as u64 * b.bucket_ms;
            let inside = end.min(lo + b.bucket_ms) - start.max(lo);
            *slot = slot.saturating_add(h.gpus.saturating_mul(inside));
        }
    }
    gpu_ms
        .into_iter()
        .map(|ms| ms as f64 / b.bucket_ms as f64)
        .collect()
}

impl Api {
    /// `ApiRequest::Utilisation`: every user may ask, since it names no
    /// job (as `gpuq nodes` shows every node's GPUs in use).
    pub(super) async fn utilisation(&self, hours: u32, buckets: u32) -> ApiResponse {
        if !UTILISATION_HOURS.contains(&hours) || !UTILISATION_BUCKETS.contains(&buckets) {
            let (h, b) = (UTILISATION_HOURS, UTILISATION_BUCKETS);
            return ApiResponse::error(
                ErrorKind::BadInput,
                format!(
                    "{hours} hours in {buckets} buckets is out of range: give hours from {} to \
                     {} and buckets from {} to {}",
                    h.start(),
                    h.end(),
                    b.start(),
                    b.end()
                ),
            );
        }
        let b = Buckets::ending_at(now_ms(), hours, buckets);
        // Jobs that hold GPUs, or held them and ended inside the window.
        let filter = AcctFilter {
            states: JobState::ALL
                .into_iter()
                .filter(|s| s.is_active() || s.is_final())
                .collect(),
            since: Some(b.from),
            active: true,
            ..AcctFilter::default()
        };
        let records = match self.acct_records(&filter).await {
            Ok(records) => records,
            Err(resp) => return resp,
        };
        let total_gpus = {
            let s = self.state();
            s.nodes
                .values()
                .map(|n| n.inventory.gpus.len() as u64)
                .sum()
        };
        ApiResponse::Utilisation {
            from: b.from,
            bucket_ms: b.bucket_ms,
            allocated: mean_allocated(records.values().filter_map(Hold::of), b),
            total_gpus,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Four buckets of 10 s from t = 100 s.
    const B: Buckets = Buckets {
        from: 100_000,
        bucket_ms: 10_000,
        count: 4,
    };

    fn hold(start: Millis, end: Option<Millis>, gpus: u64) -> Hold {
        Hold { start, end, gpus }
    }

    #[test]
    fn buckets_end_now_and_cover_the_hours() {
        let b = Buckets::ending_at(100 * 3_600_000, 24, 96);
        assert_eq!((b.bucket_ms, b.count), (15 * 60_000, 96));
        assert_eq!((b.from, b.to()), (76 * 3_600_000, 100 * 3_600_000));
        let b = Buckets::ending_at(100 * 3_600_000, 1, 7);
        assert_eq!(b.to(), 100 * 3_600_000);
        assert!(b.from >= 99 * 3_600_000 && b.bucket_ms == 514_285, "{b:?}");
    }

    #[test]
    fn a_run_half_in_a_bucket_counts_half() {
        // 4 GPUs from 105 s to 115 s: half of bucket 0, half of bucket 1.
        let got = mean_allocated([hold(105_000, Some(115_000), 4)], B);
        assert_eq!(got, vec![2.0, 2.0, 0.0, 0.0]);
        // Whole buckets count whole, and runs add up.
        let got = mean_allocated(
            [
                hold(110_000, Some(130_000), 2),
                hold(120_000, Some(125_000), 8),
            ],
            B,
        );
        assert_eq!(got, vec![0.0, 2.0, 6.0, 0.0]);
    }

    #[test]
    fn a_running_job_counts_up_to_now() {
        // Started at 125 s, still running at 140 s (the buckets' end).
        let got = mean_allocated([hold(125_000, None, 2)], B);
        assert_eq!(got, vec![0.0, 0.0, 1.0, 2.0]);
        // Started before the window: every bucket full.
        let got = mean_allocated([hold(1_000, None, 3)], B);
        assert_eq!(got, vec![3.0; 4]);
    }

    #[test]
    fn runs_outside_the_window_and_empty_history_give_zeros() {
        assert_eq!(mean_allocated([], B), vec![0.0; 4]);
        let outside = [
            hold(10_000, Some(100_000), 8),  // ended as the window starts
            hold(140_000, None, 8),          // starts at its end
            hold(110_000, Some(120_000), 0), // held no GPU
        ];
        assert_eq!(mean_allocated(outside, B), vec![0.0; 4]);
    }
}
