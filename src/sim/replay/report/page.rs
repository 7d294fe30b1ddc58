//! `report.html`: one self-contained page (inline CSS and SVG, no script,
//! no fonts or files from elsewhere) with the figures side by side and the
//! charts that show where two policies differ: utilisation and queue over
//! time, wait CDFs per size class, the JCT CDF and each user's mean wait.
//! Series are downsampled (time-weighted buckets, a few hundred points per
//! CDF) so a 100,000-job run stays a page of a few hundred kB.

use std::collections::BTreeSet;
use std::fmt::Write;

use super::svg::{bar_chart, colour, escape, line_chart, tick_number, Axis, Series};
use super::{class_label, figures, present_classes, size_class, Load, Summary};
use crate::model::Millis;
use crate::sim::replay::{Run, Sample};

/// Time buckets of the utilisation and queue charts.
const TIME_BUCKETS: usize = 600;
/// Steps per CDF curve, at most.
const CDF_POINTS: usize = 200;
/// Users shown in the per-user chart (those with the most jobs).
const MAX_USERS: usize = 40;

const WIDE: f64 = 960.0;
const HALF: f64 = 470.0;

const STYLE: &str = "body{font-family:system-ui,-apple-system,'Segoe UI',sans-serif;margin:24px auto;max-width:980px;color:#222}\
h1{font-size:22px;margin-bottom:4px}h2{font-size:17px;margin:28px 0 6px}\
.meta{color:#555;margin:2px 0}.note{color:#666;font-size:13px}\
table{border-collapse:collapse;font-size:13px}td,th{padding:3px 10px;border-bottom:1px solid #e4e4e4}\
th{text-align:left;background:#f4f4f4}td.n,th.n{text-align:right;font-variant-numeric:tabular-nums}\
.grid2{display:grid;grid-template-columns:1fr 1fr;gap:12px 20px}\
svg{display:block;font-size:11px;font-family:system-ui,sans-serif}\
svg .title{font-size:13px;font-weight:600}svg .label{font-size:12px;fill:#333}\
svg .grid{stroke:#e6e6e6}svg .axis{stroke:#555}svg text.note{fill:#999;font-size:14px}";

/// The page of `runs`, whose summaries are `summaries` (same order).
pub(super) fn render(runs: &[Run], summaries: &[Summary]) -> String {
    let names: Vec<&str> = runs.iter().map(|r| r.policy.as_str()).collect();
    let legend = &names[..];
    let title = format!("gpuq replay: {}", names.join(" vs "));
    let mut out = String::new();
    let _ = write!(
        out,
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>{}</title><style>{STYLE}</style></head><body>\n",
        escape(&title)
    );
    header(&mut out, &title, summaries);
    figures_table(&mut out, summaries);

    out.push_str("<h2>Utilisation over time</h2>\n");
    out.push_str(&time_chart(
        "GPUs busy / cluster GPUs",
        runs,
        legend,
        Quantity::Utilisation,
    ));
    out.push_str("<h2>Queue length over time</h2>\n");
    out.push_str(&time_chart("Jobs pending", runs, legend, Quantity::Pending));
    out.push_str(
        "<p class=\"note\">Time-weighted mean per bucket of the replay's span.</p>\n\
         <h2>Wait by job size</h2>\n<p class=\"note\">Share of each class's jobs started within the wait on the x axis (log scale). A curve that ends below 1: jobs that never started.</p>\n<div class=\"grid2\">\n",
    );
    let classes = std::iter::once("all").chain(present_classes(summaries));
    for class in classes {
        let label = match class {
            "all" => "All jobs".to_string(),
            c => class_label(c),
        };
        out.push_str(&cdf_chart(
            &label,
            HALF,
            runs,
            legend,
            |j| class == "all" || size_class(j.gpus) == class,
            Time::Wait,
        ));
        out.push('\n');
    }
    out.push_str("</div>\n<h2>Job completion time</h2>\n<p class=\"note\">Share of jobs ended within the time from arrival on the x axis (log scale).</p>\n");
    out.push_str(&cdf_chart(
        "Job completion time (arrival to end)",
        WIDE,
        runs,
        legend,
        |_| true,
        Time::Completion,
    ));
    out.push('\n');
    users_chart(&mut out, summaries, legend);
    out.push_str("</body></html>\n");
    out
}

fn header(out: &mut String, title: &str, summaries: &[Summary]) {
    let _ = writeln!(out, "<h1>{}</h1>", escape(title));
    let shapes: BTreeSet<String> = summaries
        .iter()
        .map(|s| {
            format!(
                "{} nodes × {} GPUs = {} GPUs",
                s.nodes, s.gpus_per_node, s.cluster_gpus
            )
        })
        .collect();
    let jobs: BTreeSet<String> = summaries
        .iter()
        .map(|s| {
            format!(
                "{} jobs replayed, {} skipped (larger than the cluster)",
                s.jobs, s.skipped
            )
        })
        .collect();
    let list = |set: BTreeSet<String>| set.into_iter().collect::<Vec<_>>().join(" / ");
    let _ = writeln!(out, "<p class=\"meta\">Trace: {}</p>", escape(&list(jobs)));
    let _ = writeln!(
        out,
        "<p class=\"meta\">Cluster: {}</p>",
        escape(&list(shapes))
    );
    out.push_str("<p class=\"meta\">Times are virtual, from the trace's first arrival.</p>\n");
}

fn figures_table(out: &mut String, summaries: &[Summary]) {
    let ratio = summaries.len() == 2;
    out.push_str("<h2>Figures</h2>\n<table><tr><th>figure</th>");
    for (i, s) in summaries.iter().enumerate() {
        let _ = write!(
            out,
            "<th class=\"n\" style=\"color:{}\">{}</th>",
            colour(i),
            escape(&s.policy)
        );
    }
    if ratio {
        out.push_str("<th class=\"n\">ratio</th>");
    }
    out.push_str("</tr>\n");
    for f in figures(summaries) {
        let _ = write!(out, "<tr><td>{}</td>", escape(&f.label));
        for v in &f.values {
            let _ = write!(out, "<td class=\"n\">{}</td>", escape(&f.unit.format(*v)));
        }
        if ratio {
            let _ = write!(out, "<td class=\"n\">{}</td>", f.ratio());
        }
        out.push_str("</tr>\n");
    }
    out.push_str("</table>\n");
}

#[derive(Clone, Copy)]
enum Quantity {
    Utilisation,
    Pending,
}

/// Busy share or pending jobs over time, all runs on one time axis.
fn time_chart(title: &str, runs: &[Run], legend: &[&str], quantity: Quantity) -> String {
    let spans: Vec<Millis> = runs.iter().map(span).collect();
    let total = spans.iter().copied().max().unwrap_or(0);
    let (unit, per) = time_unit(total as f64 / 1e3);
    let series: Vec<Series> = runs
        .iter()
        .zip(&spans)
        .enumerate()
        .map(|(i, (run, end))| {
            let cluster = f64::from(run.nodes) * f64::from(run.gpus_per_node);
            let load = Load::new(&run.samples);
            let points = buckets(&load, *end, total, |s| match quantity {
                Quantity::Utilisation => s.busy_gpus,
                Quantity::Pending => s.pending,
            })
            .into_iter()
            .map(|(t, v)| {
                let v = match quantity {
                    Quantity::Utilisation if cluster > 0.0 => v / cluster * 100.0,
                    Quantity::Utilisation => 0.0,
                    Quantity::Pending => v,
                };
                (t / 1e3 / per, v)
            })
            .collect();
            Series { run: i, points }
        })
        .collect();
    let mut x = Axis::linear(
        &format!("time since first arrival ({unit})"),
        total as f64 / 1e3 / per,
        tick_number,
    );
    x.end_at(total as f64 / 1e3 / per);
    let y = match quantity {
        Quantity::Utilisation => Axis::linear("GPUs busy (%)", 100.0, |v| format!("{v:.0}%")),
        Quantity::Pending => {
            let top = series
                .iter()
                .flat_map(|s| s.points.iter().map(|p| p.1))
                .fold(0.0, f64::max);
            // At least 0..5, so a short queue gets whole-job ticks.
            Axis::linear("jobs pending", top.max(5.0), tick_number)
        }
    };
    line_chart(title, WIDE, 280.0, &x, &y, legend, &series)
}

/// The replay's span, as the summary counts it (ms).
fn span(run: &Run) -> Millis {
    let last_end = run.jobs.iter().filter_map(|j| j.end).max().unwrap_or(0);
    last_end.max(run.samples.iter().map(|s| s.t).max().unwrap_or(0))
}

/// The time-weighted mean of `count` in each of up to [`TIME_BUCKETS`]
/// equal buckets of `[0, total)`, over the part of each before `end`:
/// (bucket middle ms, mean).
pub(super) fn buckets(
    load: &Load,
    end: Millis,
    total: Millis,
    count: impl Fn(&Sample) -> u32,
) -> Vec<(f64, f64)> {
    let n = TIME_BUCKETS.min(total as usize) as u128;
    if n == 0 {
        return Vec::new();
    }
    // Bucket k is [edge(k), edge(k + 1)); ceil makes k = t * n / total hold.
    let edge = |k: u128| (k * u128::from(total)).div_ceil(n) as Millis;
    let mut sum = vec![0.0; n as usize];
    for (mut a, b, s) in load.steps(0, end.min(total)) {
        let v = f64::from(count(s));
        while a < b {
            let k = u128::from(a) * n / u128::from(total);
            let to = b.min(edge(k + 1));
            sum[k as usize] += v * (to - a) as f64;
            a = to;
        }
    }
    (0..n)
        .filter_map(|k| {
            let (a, b) = (edge(k), edge(k + 1).min(end));
            (a < b).then(|| ((a + b) as f64 / 2.0, sum[k as usize] / (b - a) as f64))
        })
        .collect()
}

/// A unit for `seconds` of time: its name and length in seconds.
fn time_unit(seconds: f64) -> (&'static str, f64) {
    if seconds <= 2.0 * 3600.0 {
        ("min", 60.0)
    } else if seconds <= 3.0 * 86_400.0 {
        ("h", 3600.0)
    } else {
        ("days", 86_400.0)
    }
}

#[derive(Clone, Copy)]
enum Time {
    Wait,
    Completion,
}

/// CDFs of wait or completion time of the jobs `keep` selects, one curve
/// per run, over all selected jobs (unstarted or unfinished ones keep the
/// curve below 1).
fn cdf_chart(
    title: &str,
    width: f64,
    runs: &[Run],
    legend: &[&str],
    keep: impl Fn(&crate::sim::replay::Outcome) -> bool,
    time: Time,
) -> String {
    let mut max_s: f64 = 0.0;
    let series: Vec<Series> = runs
        .iter()
        .enumerate()
        .map(|(i, run)| {
            let jobs: Vec<_> = run.jobs.iter().filter(|j| keep(j)).collect();
            let mut v: Vec<f64> = jobs
                .iter()
                .filter_map(|j| {
                    match time {
                        Time::Wait => j.start,
                        Time::Completion => j.end,
                    }
                    .map(|t| t.saturating_sub(j.arrival) as f64 / 1e3)
                })
                .collect();
            v.sort_by(f64::total_cmp);
            max_s = max_s.max(v.last().copied().unwrap_or(0.0));
            Series {
                run: i,
                points: cdf(&v, jobs.len()),
            }
        })
        .collect();
    let what = match time {
        Time::Wait => "wait",
        Time::Completion => "arrival to end",
    };
    let x = Axis::log_seconds(&format!("{what} (log scale)"), max_s);
    let y = Axis::linear("share of jobs", 1.0, tick_number);
    line_chart(title, width, 260.0, &x, &y, legend, &series)
}

/// A staircase through at most [`CDF_POINTS`] steps of the sorted values
/// `v`, as shares of `total` jobs.
fn cdf(v: &[f64], total: usize) -> Vec<(f64, f64)> {
    if v.is_empty() || total == 0 {
        return Vec::new();
    }
    let steps = CDF_POINTS.min(v.len());
    let mut points = Vec::with_capacity(2 * steps);
    let mut last = 0.0;
    for k in 0..steps {
        // Evenly spread ranks; the last is the largest value.
        let i = if steps == 1 {
            v.len() - 1
        } else {
            ((k * (v.len() - 1)) as f64 / (steps - 1) as f64).round() as usize
        };
        // A step's height counts every value equal to it.
        let top = v.partition_point(|x| *x <= v[i]);
        let share = top as f64 / total as f64;
        if share > last {
            points.push((v[i], last));
            points.push((v[i], share));
            last = share;
        }
    }
    // The share holds beyond the longest: on to the axis' end.
    points.push((f64::MAX, last));
    points
}

/// Each user's mean wait, a bar per run, when any run has users.
fn users_chart(out: &mut String, summaries: &[Summary], legend: &[&str]) {
    if summaries.iter().all(|s| s.fairness.is_none()) {
        return;
    }
    let mut users: Vec<(usize, &str)> = Vec::new();
    let all: BTreeSet<&str> = summaries
        .iter()
        .filter_map(|s| s.fairness.as_ref())
        .flat_map(|f| f.users.keys().map(String::as_str))
        .collect();
    for user in &all {
        let jobs = summaries
            .iter()
            .filter_map(|s| s.fairness.as_ref()?.users.get(*user))
            .map(|u| u.jobs)
            .max()
            .unwrap_or(0);
        users.push((jobs, user));
    }
    // Most jobs first, then by name.
    users.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(b.1)));
    users.truncate(MAX_USERS);
    let groups: Vec<(String, Vec<f64>)> = users
        .iter()
        .map(|(_, user)| {
            let waits = summaries
                .iter()
                .map(|s| {
                    s.fairness
                        .as_ref()
                        .and_then(|f| f.users.get(*user))
                        .map_or(0.0, |u| u.wait_mean_s)
                })
                .collect();
            (user.to_string(), waits)
        })
        .collect();
    let max_s = groups
        .iter()
        .flat_map(|g| g.1.iter().copied())
        .fold(0.0, f64::max);
    let (unit, per) = duration_unit(max_s);
    let scaled: Vec<(String, Vec<f64>)> = groups
        .into_iter()
        .map(|(u, w)| (u, w.into_iter().map(|s| s / per).collect()))
        .collect();
    out.push_str("<h2>Mean wait by user</h2>\n");
    if all.len() > MAX_USERS {
        let _ = writeln!(
            out,
            "<p class=\"note\">The {MAX_USERS} users with the most jobs, of {}.</p>",
            all.len()
        );
    }
    let x = Axis::linear(&format!("mean wait ({unit})"), max_s / per, tick_number);
    out.push_str(&bar_chart("Mean wait by user", WIDE, &x, legend, &scaled));
    out.push('\n');
}

/// A unit for durations up to `max_s`: its name and length in seconds.
fn duration_unit(max_s: f64) -> (&'static str, f64) {
    if max_s < 120.0 {
        ("s", 1.0)
    } else if max_s < 2.0 * 3600.0 {
        ("min", 60.0)
    } else if max_s < 2.0 * 86_400.0 {
        ("h", 3600.0)
    } else {
        ("days", 86_400.0)
    }
}
