//! The figures of a replay and its HTML report.
//!
//! [`summarize`] turns a [`Run`] into a [`Summary`]: utilisation from the
//! engine's load samples, wait and completion times from the jobs' outcomes,
//! the split by job size (where large jobs starve) and by user (where a
//! policy is unfair). Every figure is a pure function of the run, rounded to
//! a fixed number of decimals, so the same run always gives byte-identical
//! `summary.json` and two policies' files can be diffed. [`table`] prints the
//! main figures side by side for the terminal; [`write`] writes
//! `summary.json` and `report.html` (one self-contained page of inline SVG
//! charts).
//!
//! Times are seconds of virtual time from the trace's first arrival.

mod page;
mod svg;
#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::{Outcome, Run, Sample};
use crate::cli::table::Table;
use crate::model::Millis;
use crate::sim::report::quantile;

/// Runtime below which bounded slowdown counts a job as this long, ms, so
/// that a 1-second job waiting a minute does not dominate the mean.
const SLOWDOWN_BOUND_MS: Millis = 10_000;

/// The size classes, by GPUs, in the order they are reported. Class `0`
/// (CPU-only jobs) appears only when a run has such jobs.
pub const SIZE_CLASSES: [&str; 5] = ["0", "1", "2-8", "9-31", ">=32"];

/// The figures of one run (`summary.json`).
///
/// Wait figures count only jobs that started, completion time and slowdown
/// only jobs that ended: a job still pending or running when the replay
/// stopped is counted in `unfinished` (and `never_started`) but in no mean
/// or quantile, since its wait is not known yet. Quantiles are nearest-rank.
/// Figures without data (no jobs, an empty cluster) are 0, never NaN.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Summary {
    /// The policy's name, as the run gives it.
    pub policy: String,
    pub nodes: u32,
    pub gpus_per_node: u32,
    pub cluster_gpus: u64,
    /// Jobs replayed.
    pub jobs: usize,
    /// Jobs of the trace larger than the cluster, not replayed.
    pub skipped: usize,
    /// Jobs that ended.
    pub finished: usize,
    /// Jobs that had not ended when the replay stopped.
    pub unfinished: usize,
    /// Of the unfinished, those that never started.
    pub never_started: usize,
    /// Preemptions and requeues, all jobs together.
    pub restarts: u64,
    /// Scheduling passes the replay ran.
    pub passes: u64,
    /// From the first arrival to the last end (or the last load sample,
    /// whichever is later).
    pub span_s: f64,
    /// The arrival window: from the first arrival to the last.
    pub window_s: f64,
    /// GPU-hours held by jobs over the span.
    pub gpu_hours: f64,
    /// GPU-hours the fleet had powered over the span: an autoscaled
    /// fleet's as it grew and shrank, a fixed one's all of it.
    #[serde(default)]
    pub provisioned_gpu_hours: f64,
    /// GPU-time held over the cluster's GPU-time in the span (0..=1).
    pub gpu_utilisation: f64,
    /// The same within the arrival window, where the load is the trace's
    /// and not the drain of the last long jobs.
    pub window_utilisation: f64,
    /// Start minus arrival, jobs that started. With restarts, the last
    /// start.
    pub wait: Spread,
    /// End minus arrival, jobs that ended.
    pub jct: Spread,
    /// Mean of max(1, (wait + run) / max(run, 10 s)) over jobs that ended.
    pub bounded_slowdown_mean: f64,
    /// By GPUs asked: `1`, `2-8`, `9-31`, `>=32` always, `0` when there are
    /// CPU-only jobs.
    pub by_size: BTreeMap<String, SizeClass>,
    /// The longest wait of a job of 32 GPUs or more that started (see
    /// `by_size[">=32"].never_started` for those that never did).
    pub starvation_s: f64,
    /// Present when the jobs carry two users or more.
    pub fairness: Option<Fairness>,
    pub queue: Queue,
}

/// A distribution of durations, seconds.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Spread {
    /// How many jobs the figures are over.
    pub count: usize,
    pub mean_s: f64,
    pub p50_s: f64,
    pub p90_s: f64,
    pub p99_s: f64,
    pub max_s: f64,
}

/// The jobs of one size class and how long they waited.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct SizeClass {
    pub jobs: usize,
    /// Jobs of the class that never started.
    pub never_started: usize,
    pub wait: Spread,
}

/// How evenly the users were served.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Fairness {
    /// Jobs without a user are left out.
    pub users: BTreeMap<String, UserFigures>,
    /// Jain's index over the users' mean bounded slowdown: 1 when all users
    /// were slowed down alike, 1/n when one user took all of it. Over users
    /// with a finished job; 0 when none has one.
    pub jain_index: f64,
}

/// One user's share.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct UserFigures {
    pub jobs: usize,
    /// GPU-hours held (a job still running counts up to the span's end).
    pub gpu_hours: f64,
    /// Over the user's jobs that started.
    pub wait_mean_s: f64,
    /// Over the user's jobs that ended.
    pub bounded_slowdown_mean: f64,
}

/// Jobs waiting over the span.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Queue {
    /// Time-weighted over the span.
    pub pending_mean: f64,
    pub pending_max: u32,
}

/// Why the report could not be written.
#[derive(Debug, thiserror::Error)]
pub enum ReportError {
    #[error("cannot create the report directory {}: {source}; give --out a directory you can write to", path.display())]
    CreateDir {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot write {}: {source}; check that the directory is writable and the disk has space", path.display())]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot encode the summary for {}: {source}", path.display())]
    Encode {
        path: PathBuf,
        source: serde_json::Error,
    },
    #[error("no runs to report into {}: replay at least one policy", path.display())]
    NoRuns { path: PathBuf },
}

/// The figures of `run`.
pub fn summarize(run: &Run) -> Summary {
    let jobs = &run.jobs;
    let cluster_gpus = u64::from(run.nodes) * u64::from(run.gpus_per_node);
    let load = Load::new(&run.samples);
    let last_end = jobs.iter().filter_map(|j| j.end).max().unwrap_or(0);
    let span = last_end.max(load.last_t());
    let window = jobs.iter().map(|j| j.arrival).max().unwrap_or(0);
    let busy = load.integral(0, span, |s| s.busy_gpus);
    let window_busy = load.integral(0, window, |s| s.busy_gpus);
    let share = |held: f64, ms: Millis| {
        if cluster_gpus == 0 || ms == 0 {
            0.0
        } else {
            held / (cluster_gpus as f64 * ms as f64)
        }
    };

    let mut by_size: BTreeMap<String, SizeClass> = SIZE_CLASSES[1..]
        .iter()
        .map(|c| (c.to_string(), SizeClass::default()))
        .collect();
    let mut class_waits: BTreeMap<&str, Vec<f64>> = BTreeMap::new();
    for j in jobs {
        let class = by_size.entry(size_class(j.gpus).to_string()).or_default();
        class.jobs += 1;
        match wait_ms(j) {
            Some(w) => class_waits.entry(size_class(j.gpus)).or_default().push(w),
            None => class.never_started += 1,
        }
    }
    for (name, class) in &mut by_size {
        class.wait = spread(class_waits.get(name.as_str()).map_or(&[], |v| v));
    }
    let starvation_s = by_size[">=32"].wait.max_s;

    let waits: Vec<f64> = jobs.iter().filter_map(wait_ms).collect();
    let jcts: Vec<f64> = jobs.iter().filter_map(jct_ms).collect();
    let slowdowns: Vec<f64> = jobs.iter().filter_map(bounded_slowdown).collect();
    let finished = jobs.iter().filter(|j| j.end.is_some()).count();
    Summary {
        policy: run.policy.clone(),
        nodes: run.nodes,
        gpus_per_node: run.gpus_per_node,
        cluster_gpus,
        jobs: jobs.len(),
        skipped: run.skipped.len(),
        finished,
        unfinished: jobs.len() - finished,
        never_started: jobs.iter().filter(|j| j.start.is_none()).count(),
        restarts: jobs.iter().map(|j| u64::from(j.restarts)).sum(),
        passes: run.passes,
        span_s: secs(span as f64),
        window_s: secs(window as f64),
        gpu_hours: round6(busy / 3.6e6),
        provisioned_gpu_hours: round6(match run.provisioned_gpu_ms {
            Some(ms) => ms as f64 / 3.6e6,
            None => cluster_gpus as f64 * span as f64 / 3.6e6,
        }),
        gpu_utilisation: round6(share(busy, span)),
        window_utilisation: round6(share(window_busy, window)),
        wait: spread(&waits),
        jct: spread(&jcts),
        bounded_slowdown_mean: round6(mean(&slowdowns)),
        by_size,
        starvation_s,
        fairness: fairness(jobs, span),
        queue: Queue {
            pending_mean: round6(if span == 0 {
                0.0
            } else {
                load.integral(0, span, |s| s.pending) / span as f64
            }),
            pending_max: run.samples.iter().map(|s| s.pending).max().unwrap_or(0),
        },
    }
}

/// Writes `summary.json` and `report.html` of `runs` into `dir` (created
/// when missing) and returns their paths. With one run `summary.json` is
/// its [`Summary`]; with more it is `{"runs": [Summary, ...]}` in the order
/// given. Each file is written under a temporary name and renamed, so a
/// failure leaves no half-written file.
pub fn write(dir: &Path, runs: &[Run]) -> Result<Vec<PathBuf>, ReportError> {
    if runs.is_empty() {
        return Err(ReportError::NoRuns {
            path: dir.to_path_buf(),
        });
    }
    std::fs::create_dir_all(dir).map_err(|source| ReportError::CreateDir {
        path: dir.to_path_buf(),
        source,
    })?;
    let summaries: Vec<Summary> = runs.iter().map(summarize).collect();
    let json_path = dir.join("summary.json");
    let json = summary_json(&summaries).map_err(|source| ReportError::Encode {
        path: json_path.clone(),
        source,
    })?;
    let files = [
        (json_path, json),
        (dir.join("report.html"), page::render(runs, &summaries)),
    ];
    let temps: Vec<PathBuf> = files
        .iter()
        .map(|(path, _)| dir.join(format!(".{}.tmp", file_name(path))))
        .collect();
    let result = (|| {
        for ((path, text), temp) in files.iter().zip(&temps) {
            std::fs::write(temp, text).map_err(|source| ReportError::Write {
                path: path.clone(),
                source,
            })?;
        }
        for ((path, _), temp) in files.iter().zip(&temps) {
            std::fs::rename(temp, path).map_err(|source| ReportError::Write {
                path: path.clone(),
                source,
            })?;
        }
        Ok(())
    })();
    if result.is_err() {
        for temp in &temps {
            let _ = std::fs::remove_file(temp);
        }
    }
    result.map(|()| files.into_iter().map(|(path, _)| path).collect())
}

/// The text of `summary.json` for `summaries` (see [`write`]).
pub fn summary_json(summaries: &[Summary]) -> Result<String, serde_json::Error> {
    #[derive(Serialize)]
    struct Runs<'a> {
        runs: &'a [Summary],
    }
    let mut text = match summaries {
        [one] => serde_json::to_string_pretty(one)?,
        runs => serde_json::to_string_pretty(&Runs { runs })?,
    };
    text.push('\n');
    Ok(text)
}

/// The main figures side by side, a column per policy, and a `ratio`
/// column (second / first) when there are two.
pub fn table(summaries: &[Summary]) -> String {
    let mut headers = vec!["figure".to_string()];
    headers.extend(summaries.iter().map(|s| s.policy.clone()));
    let ratio = summaries.len() == 2;
    if ratio {
        headers.push("ratio".into());
    }
    let headers: Vec<&str> = headers.iter().map(String::as_str).collect();
    let mut t = Table::new(&headers);
    for f in figures(summaries) {
        let mut row = vec![f.label.clone()];
        row.extend(f.values.iter().map(|&v| f.unit.format(v)));
        if ratio {
            row.push(f.ratio());
        }
        t.row(row);
    }
    t.render()
}

/// One row of the side-by-side figures (the terminal table and the page's).
struct Figure {
    label: String,
    unit: Unit,
    /// One per summary.
    values: Vec<f64>,
}

impl Figure {
    /// Second over first, `-` where the first is 0 and the second is not.
    fn ratio(&self) -> String {
        match self.values[..] {
            [a, b] if a == b => "1.00".into(),
            [a, b] if a != 0.0 => format!("{:.2}", b / a),
            _ => "-".into(),
        }
    }
}

#[derive(Clone, Copy)]
enum Unit {
    Count,
    Seconds,
    Percent,
    Number,
}

impl Unit {
    fn format(self, v: f64) -> String {
        match self {
            Unit::Count => format!("{v:.0}"),
            Unit::Seconds => human_duration(v),
            Unit::Percent => format!("{:.1}%", v * 100.0),
            Unit::Number => format!("{v:.3}"),
        }
    }
}

/// `12.3 s`, `4.5 min`, `3.2 h`, `1.5 d`.
fn human_duration(s: f64) -> String {
    if s < 60.0 {
        format!("{s:.1} s")
    } else if s < 3600.0 {
        format!("{:.1} min", s / 60.0)
    } else if s < 86_400.0 {
        format!("{:.1} h", s / 3600.0)
    } else {
        format!("{:.1} d", s / 86_400.0)
    }
}

/// The rows both tables show, in order.
fn figures(summaries: &[Summary]) -> Vec<Figure> {
    let mut rows = Vec::new();
    let mut row = |label: &str, unit: Unit, get: &dyn Fn(&Summary) -> f64| {
        rows.push(Figure {
            label: label.to_string(),
            unit,
            values: summaries.iter().map(get).collect(),
        })
    };
    use Unit::*;
    row("cluster GPUs", Count, &|s| s.cluster_gpus as f64);
    row("jobs replayed", Count, &|s| s.jobs as f64);
    row("jobs skipped (too large)", Count, &|s| s.skipped as f64);
    row("jobs unfinished", Count, &|s| s.unfinished as f64);
    row("restarts", Count, &|s| s.restarts as f64);
    row("span", Seconds, &|s| s.span_s);
    row("GPU utilisation", Percent, &|s| s.gpu_utilisation);
    row("GPU-hours used", Number, &|s| s.gpu_hours);
    row("GPU-hours provisioned", Number, &|s| {
        s.provisioned_gpu_hours
    });
    row("used / provisioned", Percent, &|s| {
        if s.provisioned_gpu_hours > 0.0 {
            s.gpu_hours / s.provisioned_gpu_hours
        } else {
            0.0
        }
    });
    row("utilisation, arrival window", Percent, &|s| {
        s.window_utilisation
    });
    row("wait mean", Seconds, &|s| s.wait.mean_s);
    row("wait p50", Seconds, &|s| s.wait.p50_s);
    row("wait p90", Seconds, &|s| s.wait.p90_s);
    row("wait p99", Seconds, &|s| s.wait.p99_s);
    row("wait max", Seconds, &|s| s.wait.max_s);
    row("JCT mean", Seconds, &|s| s.jct.mean_s);
    row("JCT p50", Seconds, &|s| s.jct.p50_s);
    row("JCT p99", Seconds, &|s| s.jct.p99_s);
    row("bounded slowdown mean", Number, &|s| {
        s.bounded_slowdown_mean
    });
    for class in present_classes(summaries) {
        let name = class_label(class);
        let get = move |s: &Summary, f: fn(&SizeClass) -> f64| s.by_size.get(class).map_or(0.0, f);
        row(&format!("jobs {name}"), Count, &|s| {
            get(s, |c| c.jobs as f64)
        });
        row(&format!("wait mean {name}"), Seconds, &|s| {
            get(s, |c| c.wait.mean_s)
        });
        row(&format!("wait p99 {name}"), Seconds, &|s| {
            get(s, |c| c.wait.p99_s)
        });
    }
    row("starvation (max wait >=32)", Seconds, &|s| s.starvation_s);
    row("queue mean (pending jobs)", Number, &|s| {
        s.queue.pending_mean
    });
    row("queue max (pending jobs)", Count, &|s| {
        f64::from(s.queue.pending_max)
    });
    if summaries.iter().any(|s| s.fairness.is_some()) {
        row("Jain index (users' slowdown)", Number, &|s| {
            s.fairness.as_ref().map_or(0.0, |f| f.jain_index)
        });
    }
    rows
}

/// The size classes any of `summaries` has, in report order.
fn present_classes(summaries: &[Summary]) -> Vec<&'static str> {
    let keys: BTreeSet<&str> = summaries
        .iter()
        .flat_map(|s| s.by_size.keys().map(String::as_str))
        .collect();
    SIZE_CLASSES
        .into_iter()
        .filter(|c| keys.contains(c))
        .collect()
}

/// The size class of a job asking for `gpus`.
pub fn size_class(gpus: u32) -> &'static str {
    match gpus {
        0 => "0",
        1 => "1",
        2..=8 => "2-8",
        9..=31 => "9-31",
        _ => ">=32",
    }
}

/// How the report names a size class: `1 GPU`, `2-8 GPUs`, `0 GPUs (CPU)`.
fn class_label(class: &str) -> String {
    match class {
        "0" => "0 GPUs (CPU)".into(),
        "1" => "1 GPU".into(),
        c => format!("{c} GPUs"),
    }
}

/// Start minus arrival, ms, when it started.
fn wait_ms(j: &Outcome) -> Option<f64> {
    Some(j.start?.saturating_sub(j.arrival) as f64)
}

/// End minus arrival, ms, when it ended.
fn jct_ms(j: &Outcome) -> Option<f64> {
    Some(j.end?.saturating_sub(j.arrival) as f64)
}

/// max(1, (wait + run) / max(run, 10 s)), when it ended.
fn bounded_slowdown(j: &Outcome) -> Option<f64> {
    let (start, end) = (j.start?, j.end?);
    let run = end.saturating_sub(start).max(SLOWDOWN_BOUND_MS) as f64;
    Some((end.saturating_sub(j.arrival) as f64 / run).max(1.0))
}

fn fairness(jobs: &[Outcome], span: Millis) -> Option<Fairness> {
    #[derive(Default)]
    struct Acc {
        jobs: usize,
        gpu_ms: f64,
        waits: Vec<f64>,
        slowdowns: Vec<f64>,
    }
    let mut acc: BTreeMap<&str, Acc> = BTreeMap::new();
    for j in jobs.iter().filter(|j| !j.user.is_empty()) {
        let a = acc.entry(j.user.as_str()).or_default();
        a.jobs += 1;
        if let Some(start) = j.start {
            let held = j.end.unwrap_or(span).saturating_sub(start);
            a.gpu_ms += f64::from(j.gpus) * held as f64;
        }
        a.waits.extend(wait_ms(j));
        a.slowdowns.extend(bounded_slowdown(j));
    }
    if acc.len() < 2 {
        return None;
    }
    let means: Vec<f64> = acc
        .values()
        .filter(|a| !a.slowdowns.is_empty())
        .map(|a| mean(&a.slowdowns))
        .collect();
    let users = acc
        .into_iter()
        .map(|(user, a)| {
            let figures = UserFigures {
                jobs: a.jobs,
                gpu_hours: round6(a.gpu_ms / 3.6e6),
                wait_mean_s: secs(mean(&a.waits)),
                bounded_slowdown_mean: round6(mean(&a.slowdowns)),
            };
            (user.to_string(), figures)
        })
        .collect();
    Some(Fairness {
        users,
        jain_index: round6(jain(&means)),
    })
}

/// Jain's fairness index of `x`: (sum x)^2 / (n * sum x^2); 0 for none.
fn jain(x: &[f64]) -> f64 {
    let squares: f64 = x.iter().map(|v| v * v).sum();
    if squares == 0.0 {
        return 0.0;
    }
    let sum: f64 = x.iter().sum();
    sum * sum / (x.len() as f64 * squares)
}

/// Mean, nearest-rank quantiles and max of durations in ms, as seconds.
fn spread(ms: &[f64]) -> Spread {
    let mut sorted = ms.to_vec();
    sorted.sort_by(f64::total_cmp);
    Spread {
        count: ms.len(),
        mean_s: secs(mean(ms)),
        p50_s: secs(quantile(&sorted, 0.5)),
        p90_s: secs(quantile(&sorted, 0.9)),
        p99_s: secs(quantile(&sorted, 0.99)),
        max_s: secs(sorted.last().copied().unwrap_or(0.0)),
    }
}

fn mean(v: &[f64]) -> f64 {
    if v.is_empty() {
        0.0
    } else {
        v.iter().sum::<f64>() / v.len() as f64
    }
}

/// Milliseconds as seconds, to the millisecond.
fn secs(ms: f64) -> f64 {
    finite(ms.round() / 1e3)
}

/// Six decimals, so the JSON does not carry float noise.
fn round6(x: f64) -> f64 {
    finite((x * 1e6).round() / 1e6)
}

fn finite(x: f64) -> f64 {
    if x.is_finite() {
        x
    } else {
        0.0
    }
}

fn file_name(path: &Path) -> String {
    path.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// The cluster's load as a step function of time: each sample's counts hold
/// from its `t` to the next sample's (0 before the first).
struct Load {
    samples: Vec<Sample>,
}

impl Load {
    fn new(samples: &[Sample]) -> Load {
        let mut samples = samples.to_vec();
        // Stable: of samples at the same instant the last one holds.
        samples.sort_by_key(|s| s.t);
        Load { samples }
    }

    fn last_t(&self) -> Millis {
        self.samples.last().map_or(0, |s| s.t)
    }

    /// The steps within `[from, to)`: (start, end, sample), non-empty.
    fn steps(&self, from: Millis, to: Millis) -> impl Iterator<Item = (Millis, Millis, &Sample)> {
        let next = self
            .samples
            .iter()
            .skip(1)
            .map(|s| s.t)
            .chain([Millis::MAX]);
        self.samples
            .iter()
            .zip(next)
            .map(move |(s, end)| (s.t.max(from), end.min(to), s))
            .filter(|(a, b, _)| a < b)
    }

    /// The integral of `count` over `[from, to)`, in count x ms.
    fn integral(&self, from: Millis, to: Millis, count: impl Fn(&Sample) -> u32) -> f64 {
        self.steps(from, to)
            .map(|(a, b, s)| f64::from(count(s)) * (b - a) as f64)
            .sum()
    }
}
