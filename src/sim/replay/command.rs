//! `gpuq sim replay`: reads the trace, replays it under one policy (or two,
//! side by side, one thread each), prints the figures and writes the report.

use std::path::PathBuf;
use std::time::Instant;

use clap::Args;

use super::engine::{replay, Autoscale, EngineError, Progress, Shape};
use super::input::{self, Columns, InputError, ReadOptions};
use super::policy::{PolicyError, ReplayPolicy};
use super::report::{self, ReportError};
use super::Run;

// `gpuq sim replay TRACE ...`
#[derive(Args, Debug)]
pub struct ReplayArgs {
    /// The trace: a CSV file with a header line. The ITP trace
    /// (itp_all_clusters.csv) is recognised by its header; any other needs
    /// --columns.
    pub trace: PathBuf,
    /// Nodes of the replayed cluster.
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub nodes: u32,
    /// GPUs per node.
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u32).range(1..=64))]
    pub gpus_per_node: u32,
    /// Spread the nodes over L leaf switches, so placement is topology-aware.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
    pub topology_leaves: Option<u32>,
    /// The policy: a built-in (multifactor, the server's default; fifo,
    /// submit order with the server's backfill; slurm-like, submit order
    /// with Slurm's backfill: ten reservations, priority order) or a TOML
    /// file with any of: name, base (a built-in), packing (best-fit,
    /// first-fit), limit_factor, tick_secs, [backfill] (depth,
    /// max_job_test, max_times, default_time_limit_secs, estimates, order: shortest or
    /// priority) and [policy]
    /// (weights, accounts, qos, partitions as `gpuq admin` sets them).
    #[arg(long, default_value = "multifactor")]
    pub policy: String,
    /// A second policy, replayed on the same trace and shown side by side.
    #[arg(long)]
    pub compare: Option<String>,
    /// Which column holds what, for a trace other than ITP:
    /// arrival=COL,gpus=COL,duration=COL (or start=COL,end=COL) and
    /// optionally user=COL,limit=COL,id=COL.
    #[arg(long)]
    pub columns: Option<String>,
    /// Keep only rows whose column COL equals VALUE (repeatable), e.g.
    /// --where cluster=cluster04 for one ITP cluster.
    #[arg(long = "where", value_name = "COL=VALUE")]
    pub filter: Vec<String>,
    /// Replay only the first N jobs (after --where).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    pub limit: Option<u64>,
    /// Write summary.json and report.html into DIR.
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// No progress lines on stderr.
    #[arg(long, short)]
    pub quiet: bool,
    /// Replay the fleet as a node group that starts with MIN nodes, grows
    /// toward --nodes when jobs wait and stops idle nodes (the leader's own
    /// autoscaler), beside the same policy on a fixed fleet of --nodes
    /// (unless --compare names another).
    #[arg(long, value_name = "MIN")]
    pub autoscale: Option<u32>,
    /// With --autoscale: from a node being asked for to its taking work.
    #[arg(long, value_name = "D", default_value = "5m", value_parser = parse_secs)]
    pub boot_time: u64,
    /// With --autoscale: how long a node is idle before it is stopped.
    #[arg(long, value_name = "D", default_value = "10m", value_parser = parse_secs)]
    pub idle_time: u64,
}

fn parse_secs(s: &str) -> Result<u64, String> {
    crate::spec::time::parse_ttl(s)
        .map(|d| d.as_secs())
        .map_err(|e| e.to_string())
}

/// Why a replay stopped; [`ReplayError::is_input`] tells a user's mistake.
#[derive(Debug, thiserror::Error)]
pub enum ReplayError {
    #[error(transparent)]
    Input(#[from] InputError),
    #[error(transparent)]
    Policy(#[from] PolicyError),
    #[error(transparent)]
    Engine(#[from] EngineError),
    #[error(transparent)]
    Report(#[from] ReportError),
    #[error("no job of the trace fits the cluster ({nodes} nodes x {gpus} GPUs): all {skipped} are larger; give more --nodes")]
    NothingFits {
        nodes: u32,
        gpus: u32,
        skipped: usize,
    },
}

impl ReplayError {
    /// Whether the user can fix it by changing the command or its files.
    pub fn is_input(&self) -> bool {
        !matches!(self, ReplayError::Engine(_))
    }
}

/// Runs `gpuq sim replay`; the figures go to stdout, progress to stderr.
pub fn run(a: ReplayArgs) -> Result<(), ReplayError> {
    let mut policies = vec![ReplayPolicy::load(&a.policy)?];
    if let Some(c) = &a.compare {
        policies.push(ReplayPolicy::load(c)?);
    }
    let opts = ReadOptions {
        columns: a.columns.as_deref().map(Columns::parse).transpose()?,
        limit: a.limit.map(|l| l as usize),
        filter: a
            .filter
            .iter()
            .map(|f| input::parse_filter(f))
            .collect::<Result<_, _>>()?,
    };
    let read_began = Instant::now();
    let trace = input::read(&a.trace, &opts)?;
    if !a.quiet {
        eprintln!(
            "read {} jobs of {} rows from {} in {:.2} s",
            trace.jobs.len(),
            trace.rows,
            a.trace.display(),
            read_began.elapsed().as_secs_f64()
        );
    }
    let fixed = Shape {
        nodes: a.nodes,
        gpus_per_node: a.gpus_per_node,
        topology_leaves: a.topology_leaves,
        autoscale: None,
    };
    // Each run: a policy on a fleet. With --autoscale the first is on the
    // autoscaled fleet and, without --compare, the same policy on the
    // fixed fleet beside it.
    let mut plans: Vec<(ReplayPolicy, Shape)> = Vec::new();
    match a.autoscale {
        Some(min) => {
            let scaled = Shape {
                autoscale: Some(Autoscale {
                    min,
                    boot_ms: a.boot_time.saturating_mul(1000),
                    idle_secs: a.idle_time,
                    demand_secs: 0,
                }),
                ..fixed.clone()
            };
            let mut first = policies.remove(0);
            let base = first.name.clone();
            first.name = format!("{base} autoscaled {min}-{}", a.nodes);
            plans.push((first.clone(), scaled));
            match policies.pop() {
                Some(other) => plans.push((other, fixed.clone())),
                None => {
                    first.name = format!("{base} fixed {}", a.nodes);
                    plans.push((first, fixed.clone()));
                }
            }
        }
        None => plans.extend(policies.into_iter().map(|p| (p, fixed.clone()))),
    }
    let began = Instant::now();
    let runs: Vec<Result<(Run, std::time::Duration), EngineError>> = std::thread::scope(|s| {
        let handles: Vec<_> = plans
            .iter()
            .map(|(p, shape)| {
                let (trace, quiet) = (&trace.jobs, a.quiet);
                s.spawn(move || {
                    let mut last = Instant::now();
                    let mut pass_time = std::time::Duration::ZERO;
                    let run = replay(trace, shape, p, &mut |pr: &Progress| {
                        pass_time = pr.pass_time;
                        if !quiet && last.elapsed().as_secs_f64() >= 2.0 {
                            last = Instant::now();
                            eprintln!("{}: {}", p.name, progress_line(pr));
                        }
                    });
                    run.map(|r| (r, pass_time))
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| match h.join() {
                Ok(r) => r,
                Err(panic) => std::panic::resume_unwind(panic),
            })
            .collect()
    });
    let (runs, pass_times): (Vec<Run>, Vec<std::time::Duration>) = runs
        .into_iter()
        .collect::<Result<Vec<_>, _>>()?
        .into_iter()
        .unzip();
    let wall = began.elapsed().as_secs_f64();
    let skipped = runs[0].skipped.len();
    if skipped == trace.jobs.len() {
        return Err(ReplayError::NothingFits {
            nodes: a.nodes,
            gpus: a.gpus_per_node,
            skipped,
        });
    }
    let summaries: Vec<_> = runs.iter().map(report::summarize).collect();
    print!("{}", report::table(&summaries));
    let replayed = trace.jobs.len() - skipped;
    println!(
        "replayed {replayed} jobs ({skipped} larger than the cluster, skipped) on {} nodes x {} GPUs \
         in {wall:.2} s of wall time: {:.0} jobs/s, {} passes",
        a.nodes,
        a.gpus_per_node,
        (replayed * runs.len()) as f64 / wall.max(1e-9),
        runs.iter().map(|r| r.passes).sum::<u64>(),
    );
    for (run, t) in runs.iter().zip(&pass_times) {
        println!(
            "{}: {} passes took {:.2} s of the replay's {wall:.2} s ({:.0}%)",
            run.policy,
            run.passes,
            t.as_secs_f64(),
            100.0 * t.as_secs_f64() / wall.max(1e-9)
        );
    }
    if let Some(dir) = &a.out {
        for path in report::write(dir, &runs)? {
            println!("wrote {}", path.display());
        }
    }
    Ok(())
}

fn progress_line(p: &Progress) -> String {
    format!(
        "day {:.2}, {}/{} jobs arrived, {} pending, {} running, {} passes",
        p.now as f64 / 86_400_000.0,
        p.arrived,
        p.jobs,
        p.pending,
        p.running,
        p.passes
    )
}
