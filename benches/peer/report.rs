//! The peer bench's other half: reads the Slurm peer's summary.txt files
//! (written by ../shared/peers/slurm/bench.sh, one per profile), picks Slurm's
//! best profile for each figure, and prints gpuq against it with the issue's
//! targets; writes target/bench/peer.json.

use serde_json::{json, Map, Value};

use crate::Cost;

/// p50 / p90 / max of a latency sample, in seconds.
#[derive(Clone, Copy, Debug)]
pub struct Stats {
    pub n: usize,
    pub p50: f64,
    pub p90: f64,
    pub max: f64,
}

impl Stats {
    /// bench.sh's definitions: p50 = a[(n+1)/2], p90 = a[round(0.9 n)] (1-based).
    pub fn of(v: &[f64]) -> Option<Stats> {
        let mut a = v.to_vec();
        a.sort_by(|x, y| x.partial_cmp(y).unwrap());
        let n = a.len();
        if n == 0 {
            return None;
        }
        let i90 = ((n as f64 * 0.9 + 0.5) as usize).clamp(1, n);
        Some(Stats {
            n,
            p50: a[n.div_ceil(2) - 1],
            p90: a[i90 - 1],
            max: a[n - 1],
        })
    }
}

/// A sample's stats as JSON (null when empty).
pub fn stats_json(v: &[f64]) -> Value {
    match Stats::of(v) {
        Some(s) => json!({"n": s.n, "p50": s.p50, "p90": s.p90, "max": s.max}),
        None => Value::Null,
    }
}

/// The median of per-repetition figures, as bench.sh's headline takes it.
pub fn median(v: &[f64]) -> Option<f64> {
    Stats::of(v).map(|s| s.p50)
}

/// The repetition with the median machine-wide cost.
pub fn median_cost(v: &[Cost]) -> Option<Cost> {
    let mut a = v.to_vec();
    a.sort_by(|x, y| x.machine_ms.partial_cmp(&y.machine_ms).unwrap());
    a.get(a.len().div_ceil(2).saturating_sub(1)).copied()
}

/// Everything the table shows.
#[derive(Default)]
pub struct Figures {
    pub slurm: Vec<Slurm>,
    pub shape: String,
    pub gpuq_seq: Option<f64>,
    pub gpuq_seq_e2e: Option<f64>,
    pub gpuq_seq_cost: Option<Cost>,
    pub gpuq_par: Option<f64>,
    pub gpuq_par_e2e: Option<f64>,
    pub gpuq_par_cost: Option<Cost>,
    pub gpuq_held: Option<f64>,
    /// The submit rates through `sbatch` (the Slurm front end), 1 and PAR
    /// submitters.
    pub gpuq_sbatch_seq: Option<f64>,
    pub gpuq_sbatch_par: Option<f64>,
    pub gpuq_held_drain: Option<f64>,
    pub gpuq_array: Option<f64>,
    pub gpuq_lat: Option<Stats>,
    pub gpuq_gang: Option<Stats>,
    /// `srun -N8` outside an allocation, to the last rank's first instruction.
    pub gpuq_srun: Option<Stats>,
    /// `srun -N8` as a step in a running allocation, likewise.
    pub gpuq_step: Option<Stats>,
    pub gpuq_peak_rss_mb: f64,
    /// Sequential process starts per second: `/bin/true`, `gpuq --version`.
    pub floor_true: Option<f64>,
    pub floor_gpuq: Option<f64>,
    pub detail: Map<String, Value>,
}

/// One Slurm profile's results: summary.txt as (key, value) lines.
pub struct Slurm {
    pub path: String,
    pub profile: String,
    pub version: String,
    pub host: String,
    cores: f64,
    lines: Vec<(String, String)>,
}

/// The summaries named in GPUQ_PEER_SLURM (comma-separated paths).
pub fn read_slurm() -> Vec<Slurm> {
    let Ok(paths) = std::env::var("GPUQ_PEER_SLURM") else {
        return Vec::new();
    };
    paths
        .split(',')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let text = std::fs::read_to_string(p)
                .unwrap_or_else(|e| panic!("GPUQ_PEER_SLURM: cannot read {p}: {e}"));
            Slurm::parse(p, &text)
        })
        .collect()
}

fn first_number(s: &str) -> Option<f64> {
    s.split_whitespace()
        .next()?
        .trim_end_matches('%')
        .parse()
        .ok()
}

/// The number after `marker` in `s`.
fn number_after(s: &str, marker: &str) -> Option<f64> {
    first_number(s.split_once(marker)?.1)
}

impl Slurm {
    fn parse(path: &str, text: &str) -> Slurm {
        let mut s = Slurm {
            path: path.into(),
            profile: "?".into(),
            version: "?".into(),
            host: String::new(),
            cores: 2.0,
            lines: Vec::new(),
        };
        for line in text.lines() {
            if let Some(h) = line.strip_prefix("# ") {
                if let Some((v, rest)) = h.split_once(" | profile=") {
                    s.version = v.trim().to_string();
                    s.profile = rest.split_whitespace().next().unwrap_or("?").to_string();
                } else if let Some(host) = h.strip_prefix("host: ") {
                    s.host = host.to_string();
                    s.cores = first_number(host).unwrap_or(2.0);
                }
                continue;
            }
            if let Some((k, v)) = line.split_once(char::is_whitespace) {
                s.lines.push((k.to_string(), v.trim().to_string()));
            }
        }
        s
    }

    fn get(&self, key: &str) -> Option<&str> {
        self.lines
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    /// The values of `{test}.r{N}.{suffix}` over the repetitions.
    fn reps(&self, test: &str, suffix: &str) -> Vec<(String, &str)> {
        self.lines
            .iter()
            .filter_map(|(k, v)| {
                let rest = k.strip_prefix(test)?.strip_prefix(".r")?;
                let (r, s) = rest.split_once('.')?;
                (s == suffix).then(|| (r.to_string(), v.as_str()))
            })
            .collect()
    }

    fn rep_median(
        &self,
        test: &str,
        suffix: &str,
        pick: impl Fn(&str) -> Option<f64>,
    ) -> Option<f64> {
        let v: Vec<f64> = self
            .reps(test, suffix)
            .iter()
            .filter_map(|(_, v)| pick(v))
            .collect();
        median(&v)
    }

    fn p50(&self, key: &str) -> Option<f64> {
        self.get(key).and_then(|v| number_after(v, "p50="))
    }

    /// (slurmctld, machine-wide) CPU-ms per job of `test` (seq or par), the
    /// median repetition by machine-wide cost.
    fn cost(&self, test: &str) -> Option<(f64, f64)> {
        let mut v = Vec::new();
        for (r, rate) in self.reps(&format!("a.{test}"), "submit_rate_jobs_s") {
            let jobs = number_after(rate, "(")?;
            let ph = format!("{test}.r{r}");
            let ctl = self.get(&format!("{ph}.slurmctld_cpu_s"))?;
            let wall = number_after(ctl, "(wall")?;
            let util = first_number(self.get(&format!("{ph}.machine_cpu_util"))?)? / 100.0;
            v.push((
                first_number(ctl)? * 1e3 / jobs,
                util * self.cores * wall * 1e3 / jobs,
            ));
        }
        v.sort_by(|a, b| a.1.partial_cmp(&b.1).unwrap());
        v.get(v.len().div_ceil(2).saturating_sub(1)).copied()
    }
}

#[derive(Clone, Copy)]
enum Target {
    None,
    /// gpuq/Slurm at least this.
    Ratio(f64),
    /// gpuq's figure at most this (in the row's unit).
    AtMost(f64),
}

/// One table row: Slurm's best (value, profile) and gpuq's value.
struct Row {
    figure: &'static str,
    unit: &'static str,
    slurm: Option<(f64, String)>,
    gpuq: Option<f64>,
    target: Target,
}

/// Slurm's best value over the profiles: the highest, or the lowest.
fn best(f: &Figures, higher: bool, pick: impl Fn(&Slurm) -> Option<f64>) -> Option<(f64, String)> {
    f.slurm
        .iter()
        .filter_map(|s| Some((pick(s)?, s.profile.clone())))
        .reduce(|a, b| if (b.0 > a.0) == higher { b } else { a })
}

fn rows(f: &Figures) -> Vec<Row> {
    let ms = |s: Option<Stats>| s.map(|s| s.p50 * 1e3);
    let rate = |v: &str| first_number(v);
    let arrow = |v: &str| number_after(v, "=>");
    // CPU per job comes from the profile with the best end-to-end figure.
    let e2e_best = best(f, true, |s| {
        s.rep_median("b.seq", "first_submit_to_empty_s", arrow)
    });
    let cost_of = |i: usize| {
        let (_, profile) = e2e_best.as_ref()?;
        let s = f.slurm.iter().find(|s| &s.profile == profile)?;
        let c = s.cost("seq")?;
        Some((if i == 0 { c.0 } else { c.1 }, profile.clone()))
    };
    vec![
        Row {
            figure: "submit, 1 CLI, jobs running meanwhile",
            unit: "jobs/s",
            slurm: best(f, true, |s| {
                s.rep_median("a.seq", "submit_rate_jobs_s", rate)
            }),
            gpuq: f.gpuq_seq,
            target: Target::Ratio(3.0),
        },
        Row {
            figure: "submit, 4 CLIs, jobs running meanwhile",
            unit: "jobs/s",
            slurm: best(f, true, |s| {
                s.rep_median("a.par", "submit_rate_jobs_s", rate)
            }),
            gpuq: f.gpuq_par,
            target: Target::Ratio(5.0),
        },
        Row {
            figure: "sbatch, 1 CLI, jobs running meanwhile",
            unit: "jobs/s",
            slurm: best(f, true, |s| {
                s.rep_median("a.seq", "submit_rate_jobs_s", rate)
            }),
            gpuq: f.gpuq_sbatch_seq,
            target: Target::Ratio(3.0),
        },
        Row {
            figure: "sbatch, 4 CLIs, jobs running meanwhile",
            unit: "jobs/s",
            slurm: best(f, true, |s| {
                s.rep_median("a.par", "submit_rate_jobs_s", rate)
            }),
            gpuq: f.gpuq_sbatch_par,
            target: Target::Ratio(5.0),
        },
        Row {
            figure: "pure submit, 1 CLI (held jobs)",
            unit: "jobs/s",
            slurm: best(f, true, |s| {
                s.rep_median("a.held", "submit_rate_jobs_s", rate)
            }),
            gpuq: f.gpuq_held,
            target: Target::Ratio(3.0),
        },
        Row {
            figure: "end to end, 1 submitter: submit -> queue empty",
            unit: "jobs/s",
            slurm: e2e_best.clone(),
            gpuq: f.gpuq_seq_e2e,
            target: Target::Ratio(5.0),
        },
        Row {
            figure: "  CPU-ms/job: slurmctld | gpuq server",
            unit: "ms",
            slurm: cost_of(0),
            gpuq: f.gpuq_seq_cost.map(|c| c.server_ms),
            target: Target::None,
        },
        Row {
            figure: "  CPU-ms/job: gpuq server+agents (no Slurm)",
            unit: "ms",
            slurm: None,
            gpuq: f.gpuq_seq_cost.map(|c| c.server_ms + c.agents_ms),
            target: Target::None,
        },
        Row {
            figure: "  CPU-ms/job: whole machine",
            unit: "ms",
            slurm: cost_of(1),
            gpuq: f.gpuq_seq_cost.map(|c| c.machine_ms),
            target: Target::None,
        },
        Row {
            figure: "end to end, 4 submitters",
            unit: "jobs/s",
            slurm: best(f, true, |s| {
                s.rep_median("b.par", "first_submit_to_empty_s", arrow)
            }),
            gpuq: f.gpuq_par_e2e,
            target: Target::Ratio(5.0),
        },
        Row {
            figure: "end to end, one N-task array",
            unit: "jobs/s",
            slurm: best(f, true, |s| {
                s.rep_median("b.array", "submit_to_empty_s", arrow)
            }),
            gpuq: f.gpuq_array,
            target: Target::Ratio(5.0),
        },
        Row {
            figure: "held: release all -> queue empty",
            unit: "jobs/s",
            slurm: best(f, true, |s| {
                s.rep_median("b.held", "release_to_empty_s", arrow)
            }),
            gpuq: f.gpuq_held_drain,
            target: Target::None,
        },
        Row {
            figure: "idle: submit -> running p50 (Slurm: sbatch)",
            unit: "ms",
            slurm: best(f, false, |s| {
                s.p50("c.sbatch_to_running_s").map(|v| v * 1e3)
            }),
            gpuq: ms(f.gpuq_lat),
            target: Target::AtMost(20.0),
        },
        Row {
            figure: "idle: submit -> running p50 (Slurm: srun -N1)",
            unit: "ms",
            slurm: best(f, false, |s| {
                s.p50("c.srun_to_task_start_s").map(|v| v * 1e3)
            }),
            gpuq: ms(f.gpuq_lat),
            target: Target::AtMost(20.0),
        },
        Row {
            figure: "8x8 GPUs: submit -> last rank p50 (sbatch)",
            unit: "ms",
            slurm: best(f, false, |s| {
                s.p50("d.sbatch_all_to_last_rank_s").map(|v| v * 1e3)
            }),
            gpuq: ms(f.gpuq_gang),
            target: Target::AtMost(50.0),
        },
        Row {
            figure: "8x8 GPUs: submit -> last rank p50 (srun -N8)",
            unit: "ms",
            slurm: best(f, false, |s| {
                s.p50("d.srun_all_to_last_rank_s").map(|v| v * 1e3)
            }),
            gpuq: ms(f.gpuq_gang),
            target: Target::AtMost(50.0),
        },
        Row {
            figure: "8x8 GPUs: srun -N8 (its own allocation) -> last rank p50",
            unit: "ms",
            slurm: best(f, false, |s| {
                s.p50("d.srun_all_to_last_rank_s").map(|v| v * 1e3)
            }),
            gpuq: ms(f.gpuq_srun),
            target: Target::AtMost(20.0),
        },
        Row {
            figure: "8x8 GPUs: srun -N8 step in an allocation -> last rank p50",
            unit: "ms",
            slurm: None,
            gpuq: ms(f.gpuq_step),
            target: Target::AtMost(20.0),
        },
        Row {
            figure: "control daemon peak RSS",
            unit: "MB",
            slurm: best(f, false, |s| {
                s.get("slurmctld.peak_rss_mb").and_then(first_number)
            }),
            gpuq: Some(f.gpuq_peak_rss_mb),
            target: Target::None,
        },
        Row {
            figure: "floor: sequential starts of /bin/true",
            unit: "procs/s",
            slurm: None,
            gpuq: f.floor_true,
            target: Target::None,
        },
        Row {
            figure: "floor: sequential starts of gpuq --version",
            unit: "procs/s",
            slurm: None,
            gpuq: f.floor_gpuq,
            target: Target::None,
        },
    ]
}

fn cmd_line(cmd: &str, args: &[&str]) -> String {
    std::process::Command::new(cmd)
        .args(args)
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_else(|| "?".into())
}

fn machine() -> String {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .unwrap_or_default()
        .lines()
        .find_map(|l| {
            l.strip_prefix("model name")?
                .split_once(':')
                .map(|x| x.1.trim().to_string())
        })
        .unwrap_or_else(|| "?".into());
    let mem_kb: f64 = std::fs::read_to_string("/proc/meminfo")
        .unwrap_or_default()
        .lines()
        .find_map(|l| {
            l.strip_prefix("MemTotal:")?
                .split_whitespace()
                .next()?
                .parse()
                .ok()
        })
        .unwrap_or(0.0);
    format!(
        "{} cores ({cpu}), {:.0} GiB, kernel {}",
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        mem_kb / 1048576.0,
        cmd_line("uname", &["-r"])
    )
}

fn fmt(v: Option<f64>) -> String {
    match v {
        Some(v) if v >= 100.0 => format!("{v:.0}"),
        Some(v) if v >= 10.0 => format!("{v:.1}"),
        Some(v) => format!("{v:.2}"),
        None => "-".into(),
    }
}

/// Prints the table and writes target/bench/peer.json.
pub fn print_and_write(f: &Figures) {
    let gpuq_version = cmd_line(&crate::common::gpuq_bin().to_string_lossy(), &["--version"]);
    let rev = cmd_line(
        "git",
        &[
            "-C",
            env!("CARGO_MANIFEST_DIR"),
            "rev-parse",
            "--short",
            "HEAD",
        ],
    );
    let profiles: Vec<&str> = f.slurm.iter().map(|s| s.profile.as_str()).collect();
    let slurm_version = f
        .slurm
        .first()
        .map_or("no Slurm results", |s| s.version.as_str());
    println!(
        "# gpuq peer bench: {gpuq_version} ({rev}) vs {slurm_version} (profiles: {})",
        if profiles.is_empty() {
            "none".to_string()
        } else {
            profiles.join(", ")
        }
    );
    println!("# host: {}", machine());
    println!("# shape: {} (Slurm: as its summary says)", f.shape);
    for s in &f.slurm {
        println!("# Slurm {}: {}", s.profile, s.path);
    }
    println!(
        "{:<48} {:>8} {:>16} {:>10} {:>10} {:>12}",
        "figure", "unit", "Slurm best", "gpuq", "gpuq/Slurm", "target"
    );
    let mut json_rows = Vec::new();
    for r in rows(f) {
        let ratio = match (r.slurm.as_ref(), r.gpuq) {
            (Some((s, _)), Some(g)) if *s > 0.0 => Some(g / s),
            _ => None,
        };
        let (target, met) = match r.target {
            Target::None => (String::new(), None),
            Target::Ratio(k) => (format!(">= {k}x"), ratio.map(|x| x >= k)),
            Target::AtMost(v) => (format!("<= {v} {}", r.unit), r.gpuq.map(|g| g <= v)),
        };
        let mark = match met {
            Some(true) => " met",
            Some(false) => " MISSED",
            None => "",
        };
        let slurm = r
            .slurm
            .as_ref()
            .map_or("-".to_string(), |(v, p)| format!("{} {p}", fmt(Some(*v))));
        println!(
            "{:<48} {:>8} {:>16} {:>10} {:>10} {:>12}{mark}",
            r.figure,
            r.unit,
            slurm,
            fmt(r.gpuq),
            ratio.map_or("-".into(), |x| format!("{x:.2}x")),
            target
        );
        json_rows.push(json!({
            "figure": r.figure.trim(), "unit": r.unit,
            "slurm": r.slurm.as_ref().map(|x| x.0), "slurm_profile": r.slurm.as_ref().map(|x| x.1.clone()),
            "gpuq": r.gpuq, "ratio_gpuq_over_slurm": ratio, "target": target, "met": met,
        }));
    }
    println!("# ratios are gpuq/Slurm: above 1 is better for rates, below 1 for times and costs");
    let cost = |c: Option<Cost>| {
        c.map(|c| {
            json!({"server_ms": c.server_ms, "agents_ms": c.agents_ms, "machine_ms": c.machine_ms,
                   "machine_util": c.machine_util, "wall_s": c.wall_s})
        })
    };
    let mut detail = f.detail.clone();
    detail.insert("seq.cost_per_job".into(), json!(cost(f.gpuq_seq_cost)));
    detail.insert("par.cost_per_job".into(), json!(cost(f.gpuq_par_cost)));
    let out = json!({
        "bench": "peer",
        "host": machine(),
        "gpuq": {"version": gpuq_version, "rev": rev},
        "shape": f.shape,
        "slurm": f.slurm.iter().map(|s| json!({"profile": s.profile, "version": s.version, "host": s.host, "summary": s.path})).collect::<Vec<_>>(),
        "rows": json_rows,
        "gpuq_detail": detail,
    });
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("target/bench");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("peer.json"),
        serde_json::to_string_pretty(&out).unwrap(),
    )
    .unwrap();
}
