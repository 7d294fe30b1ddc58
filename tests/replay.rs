//! `gpuq sim replay` from the outside: the real binary on hand-made traces.
//!
//! - A bad trace is refused whole: exit 1, one message naming the line and
//!   the column, nothing written under `--out`.
//! - The same trace gives the same `summary.json` and report, byte for byte,
//!   and the report fetches nothing.
//! - Virtual time tells the truth: a trace run live (a real server, simulated
//!   agents, compressed wall time) and replayed start their jobs in the same
//!   order, but for starts closer together than the live run's timing noise.

mod common;

use std::collections::{BTreeSet, HashMap};
use std::path::Path;
use std::process::Output;
use std::time::{Duration, Instant};

use gpuq::model::JobState;
use gpuq::sim::replay::engine::{self, Shape};
use gpuq::sim::replay::input::{self, Columns, ReadOptions};
use gpuq::sim::replay::policy::ReplayPolicy;
use gpuq::sim::replay::report;
use gpuq::sim::workload::{self, DriveOptions, WorkItem};
use rand::{Rng, SeedableRng};

/// How the hand-made traces name their columns.
const COLUMNS: &str = "arrival=submit,gpus=gpus,duration=dur,limit=limit,user=user,id=id";
const HEADER: &str = "id,submit,gpus,dur,limit,user";

/// One job of a hand-made trace, in trace time.
#[derive(Clone, Debug)]
struct TraceRow {
    id: String,
    user: &'static str,
    arrival_ms: u64,
    gpus: u32,
    duration_ms: u64,
    /// `None`: the cell is empty and the policy's limit_factor decides.
    limit_s: Option<u64>,
}

/// Seconds with three decimals: the trace keeps every millisecond.
fn secs(ms: u64) -> String {
    format!("{}.{:03}", ms / 1000, ms % 1000)
}

/// The rows as a CSV file the replay reads with [`COLUMNS`]; every third
/// duration is written as Slurm's `HH:MM:SS` when it is whole seconds.
fn csv(rows: &[TraceRow]) -> String {
    let mut text = format!("{HEADER}\n");
    for (i, r) in rows.iter().enumerate() {
        let dur = if i % 3 == 2 && r.duration_ms % 1000 == 0 {
            let s = r.duration_ms / 1000;
            format!("{:02}:{:02}:{:02}", s / 3600, s / 60 % 60, s % 60)
        } else {
            secs(r.duration_ms)
        };
        let limit = r.limit_s.map_or_else(String::new, |l| l.to_string());
        text.push_str(&format!(
            "{},{},{},{dur},{limit},{}\n",
            r.id,
            secs(r.arrival_ms),
            r.gpus,
            r.user
        ));
    }
    text
}

/// `gpuq sim replay TRACE ARGS`.
fn replay_bin(trace: &Path, args: &[&str]) -> Output {
    common::gpuq_command()
        .args(["sim", "replay"])
        .arg(trace)
        .args(args)
        .output()
        .expect("run gpuq sim replay")
}

/// A quiet replay of a [`COLUMNS`] trace on 4 nodes x 8 GPUs with `args`,
/// into `out`, which must succeed.
fn replay_4x8(trace: &Path, args: &[&str], out: &Path) {
    let mut all = vec!["--columns", COLUMNS, "--nodes", "4", "--gpus-per-node", "8"];
    all.extend_from_slice(args);
    all.extend(["--quiet", "--out", out.to_str().unwrap()]);
    let o = replay_bin(trace, &all);
    assert!(o.status.success(), "{}", common::stderr(&o));
}

/// What a directory holds, by name (empty when it does not exist).
fn listing(dir: &Path) -> Vec<String> {
    match std::fs::read_dir(dir) {
        Ok(entries) => entries
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect(),
        Err(_) => Vec::new(),
    }
}

#[test]
fn a_bad_trace_is_refused_whole_naming_its_line_and_column() {
    let dir = tempfile::tempdir().unwrap();
    let good = "a,0,4,3600,7200,alice\nb,60,8,1800,,bob\n";
    // (what is wrong, the file, --columns, what the one message must say).
    // Lines count from the header as line 1, blank lines included.
    let cases: [(&str, String, Option<&str>, &[&str]); 5] = [
        (
            "no column named by --columns",
            "id,submit,gpus,limit,user\na,0,4,7200,alice\n".to_string(),
            Some(COLUMNS),
            &["line 1", "no column `dur`", "--columns duration=dur"],
        ),
        (
            "a row short of a column",
            format!("{HEADER}\n{good}c,120,2,7200,carol\n"),
            Some(COLUMNS),
            &["line 4", "5 fields where the header has 6"],
        ),
        (
            "a negative duration",
            format!("{HEADER}\n{good}\nc,120,2,-30,,carol\nd,180,1,60,,dave\n"),
            Some(COLUMNS),
            &["line 5", "column `dur`", "\"-30\"", "negative"],
        ),
        (
            "an unparseable time",
            format!("{HEADER}\n{good}c,120,2,60,,carol\nd,2021-02-30 10:00:00,1,60,,dave\n"),
            Some(COLUMNS),
            &[
                "line 5",
                "column `submit`",
                "\"2021-02-30 10:00:00\"",
                "not a time",
            ],
        ),
        (
            "a header that is not ITP's, without --columns",
            format!("{HEADER}\n{good}"),
            None,
            &["line 1", "not the ITP trace's", "--columns arrival=COL"],
        ),
    ];
    for (i, (what, text, columns, says)) in cases.iter().enumerate() {
        let trace = dir.path().join(format!("bad{i}.csv"));
        std::fs::write(&trace, text).unwrap();
        // Half the cases give a dir that exists (it must stay empty), half
        // one that does not (it must not be made).
        let out = dir.path().join(format!("out{i}"));
        if i % 2 == 1 {
            std::fs::create_dir(&out).unwrap();
        }
        let mut args = vec!["--out", out.to_str().unwrap()];
        if let Some(c) = columns {
            args.extend(["--columns", c]);
        }
        let o = replay_bin(&trace, &args);
        let err = common::stderr(&o);
        assert_eq!(o.status.code(), Some(1), "{what}: {err}");
        let lines: Vec<&str> = err.lines().filter(|l| !l.trim().is_empty()).collect();
        assert_eq!(lines.len(), 1, "{what}: one message, got {err}");
        assert!(lines[0].starts_with("gpuq: "), "{what}: {err}");
        assert!(lines[0].contains(trace.to_str().unwrap()), "{what}: {err}");
        for s in *says {
            assert!(lines[0].contains(s), "{what}: {s:?} missing from {err}");
        }
        assert!(o.stdout.is_empty(), "{what}: stdout {:?}", o.stdout);
        assert_eq!(out.exists(), i % 2 == 1, "{what}: {}", out.display());
        assert_eq!(listing(&out), Vec::<String>::new(), "{what}");
    }
}

/// `n` jobs of 1 to 32 GPUs from four users, a few hours of arrivals;
/// about a third have no limit of their own.
fn mixed_trace(n: usize, seed: u64) -> Vec<TraceRow> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let users = ["alice", "bob", "carol", "dave"];
    let mut at = 0;
    (0..n)
        .map(|i| {
            at += rng.gen_range(0..600_000);
            let duration_ms = if i % 3 == 2 {
                rng.gen_range(1..240) * 60_000
            } else {
                rng.gen_range(1_000..14_400_000)
            };
            TraceRow {
                id: format!("m{i:03}"),
                user: users[rng.gen_range(0..users.len())],
                arrival_ms: at,
                gpus: [1, 1, 2, 4, 8, 8, 12, 16, 24, 32][rng.gen_range(0..10)],
                duration_ms,
                limit_s: (i % 3 != 0)
                    .then(|| (duration_ms * rng.gen_range(10..40)).div_ceil(10_000)),
            }
        })
        .collect()
}

/// Every `src=`, `href=` and CSS `url(` target in an HTML page.
fn fetched(html: &str) -> Vec<String> {
    let mut found = Vec::new();
    for key in ["src=", "href=", "url("] {
        let mut rest = html;
        while let Some(at) = rest.find(key) {
            rest = &rest[at + key.len()..];
            let value = rest.trim_start_matches(['"', '\'']);
            let end = value
                .find(['"', '\'', ')', ' ', '>'])
                .unwrap_or(value.len());
            found.push(value[..end].to_string());
        }
    }
    found
}

#[test]
fn the_same_trace_gives_the_same_summary_and_a_self_contained_report() {
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("mixed.csv");
    std::fs::write(&trace, csv(&mixed_trace(60, 7))).unwrap();
    let run = |out: &str| {
        let out = dir.path().join(out);
        replay_4x8(
            &trace,
            &["--policy", "fifo", "--compare", "multifactor"],
            &out,
        );
        let read = |name: &str| std::fs::read(out.join(name)).unwrap();
        (read("summary.json"), read("report.html"))
    };
    let (json1, html1) = run("d1");
    let (json2, html2) = run("d2");
    assert!(json1 == json2, "summary.json differs between two runs");
    assert!(html1 == html2, "report.html differs between two runs");

    let summary: serde_json::Value = serde_json::from_slice(&json1).unwrap();
    let runs = summary["runs"].as_array().expect("one summary per policy");
    let policies: Vec<&str> = runs.iter().filter_map(|r| r["policy"].as_str()).collect();
    assert_eq!(policies, ["fifo", "multifactor"]);
    for r in runs {
        assert_eq!(r["jobs"], 60, "{r}");
        assert_eq!(r["finished"], 60, "{r}");
        assert_eq!(r["cluster_gpus"], 32, "{r}");
        assert!(
            r["wait"]["max_s"].as_f64().unwrap() > 0.0,
            "a queue formed: {r}"
        );
    }

    let html = String::from_utf8(html1).unwrap();
    assert!(html.contains("<svg"), "charts are inline");
    let remote: Vec<String> = fetched(&html)
        .into_iter()
        .filter(|t| t.starts_with("http:") || t.starts_with("https:") || t.starts_with("//"))
        .collect();
    assert!(remote.is_empty(), "the report fetches {remote:?}");
}

/// The live run's compression: one wall second is ten trace minutes.
const COMPRESSION: u64 = 600;
/// How often the simulated agents look at their tasks, wall ms: a task's
/// end is seen up to this late.
const RECONCILE_MS: u64 = 10;
/// Starts closer than this in the live run, wall ms, are not ordered by the
/// comparison: see [`live_and_replayed_runs_start_jobs_in_the_same_order`].
const NOISE_WALL_MS: u64 = 150;

/// 200 jobs for 4 x 8 GPUs at about 75% offered load, planned in wall ms
/// and scaled by [`COMPRESSION`], so the trace holds the live run exactly:
/// 0.2 to 1.5 s of run, limits of whole wall seconds at least 0.5 s above
/// the run (the live limit is wall time; a live job never meets it).
fn live_trace() -> Vec<TraceRow> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(3);
    let mut at = 0;
    (0..200)
        .map(|i| {
            if i > 0 {
                at += rng.gen_range(50..500);
            }
            let run = rng.gen_range(200..1500);
            TraceRow {
                id: format!("j{i:03}"),
                user: ["alice", "bob", "carol"][i % 3],
                arrival_ms: at * COMPRESSION,
                gpus: [1, 1, 2, 2, 4, 4, 8, 8, 16, 32][rng.gen_range(0..10)],
                duration_ms: run * COMPRESSION,
                limit_s: Some((run + 500).div_ceil(1000) * COMPRESSION),
            }
        })
        .collect()
}

/// The trace as the workload driver submits it: at its wall offset, its
/// trace duration declared (the agents divide it), its limit in wall s.
fn live_items(rows: &[TraceRow]) -> Vec<WorkItem> {
    rows.iter()
        .map(|r| {
            let (nodes, per_node) = gpuq::sim::trace::shape_for(r.gpus);
            let run = Duration::from_millis(r.duration_ms);
            let mut spec = workload::sim_spec(&r.id, nodes, per_node, run, 0);
            spec.time_limit_secs = r.limit_s.map(|l| l / COMPRESSION);
            WorkItem {
                at: Duration::from_millis(r.arrival_ms / COMPRESSION),
                spec,
            }
        })
        .collect()
}

/// What the live run did, per job id: its start and how much longer than
/// declared it held its GPUs, both in wall ms.
struct Live {
    start: HashMap<String, u64>,
    overrun: Vec<u64>,
    wall: Duration,
}

/// The trace on a real server and 4 simulated 8-GPU agents, FIFO set as an
/// admin would (every priority weight 0).
fn run_live(rows: &[TraceRow]) -> Live {
    let dir = tempfile::tempdir().unwrap();
    let server = common::Server::bootstrap(&dir.path().join("server"));
    let token = server.ok(&["token", "create"]).trim().to_string();
    let (comp, rec) = (COMPRESSION.to_string(), RECONCILE_MS.to_string());
    let flags = ["--compression", &comp, "--reconcile-ms", &rec];
    let mut sim = common::SimAgents::spawn(&server, &dir.path().join("sim"), 4, &token, &flags);
    sim.wait_connected(&server, Duration::from_secs(60));
    let zero = ["--age", "0", "--fairshare", "0", "--job-size", "0"];
    let zero = [&zero[..], &["--qos", "0", "--partition", "0"]].concat();
    server.ok(&[&["admin", "priority", "set"], &zero[..]].concat());

    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    // One client: submissions reach the leader in trace order.
    let opts = DriveOptions {
        clients: 1,
        poll_every: Duration::from_millis(100),
        drain_timeout: Duration::from_secs(120),
    };
    let began = Instant::now();
    let records = runtime
        .block_on(workload::drive(&server.socket, live_items(rows), &opts))
        .unwrap_or_else(|e| panic!("{e:#}\n--- server ---\n{}", server.log()));
    let wall = began.elapsed();
    drop(sim);

    assert_eq!(records.len(), rows.len());
    let origin = records.iter().map(|r| r.submit_time).min().unwrap();
    let declared: HashMap<&str, u64> = rows
        .iter()
        .map(|r| (r.id.as_str(), r.duration_ms / COMPRESSION))
        .collect();
    let mut live = Live {
        start: HashMap::new(),
        overrun: Vec::new(),
        wall,
    };
    for r in &records {
        assert_eq!(r.state, JobState::Completed, "{r:?}");
        let (start, end) = (r.start_time.unwrap(), r.end_time.unwrap());
        live.start.insert(r.name.clone(), start - origin);
        live.overrun
            .push((end - start).saturating_sub(declared[r.name.as_str()]));
    }
    live
}

/// Pairs of jobs by their start order in two runs.
#[derive(Debug, Default)]
struct Pairs {
    /// Ordered in both (their live starts more than the window apart).
    compared: usize,
    /// Live starts within the window of each other: not ordered.
    ignored: usize,
    /// Compared, and in a different order in the replay.
    discordant: Vec<(String, String)>,
    /// Of the compared, those that waited in the queue together in either
    /// run: the pairs the scheduler had to order.
    waited_together: usize,
    /// Of those, the discordant.
    waited_discordant: usize,
}

/// Compares the start order of `live` and `replay` (trace ms), leaving out
/// pairs whose live starts are `window` ms or less apart.
fn pairs(
    arrival: &HashMap<String, u64>,
    live: &HashMap<String, u64>,
    replay: &HashMap<String, u64>,
    window: u64,
) -> Pairs {
    let mut ids: Vec<&String> = live.keys().collect();
    ids.sort();
    let mut p = Pairs::default();
    for (n, a) in ids.iter().enumerate() {
        for b in &ids[n + 1..] {
            let (la, lb) = (live[*a], live[*b]);
            if la.abs_diff(lb) <= window {
                p.ignored += 1;
                continue;
            }
            p.compared += 1;
            let both_in = arrival[*a].max(arrival[*b]);
            let waited = |s: &HashMap<String, u64>| both_in < s[*a].min(s[*b]);
            let waited = waited(live) || waited(replay);
            p.waited_together += usize::from(waited);
            if la.cmp(&lb) != replay[*a].cmp(&replay[*b]) {
                p.waited_discordant += usize::from(waited);
                p.discordant.push(((*a).clone(), (*b).clone()));
            }
        }
    }
    p
}

/// Pairs (earlier arrival, later arrival) where the later started strictly
/// first: backfill's work. Ids sort in arrival order.
fn overtakes(start: &HashMap<String, u64>) -> BTreeSet<(&str, &str)> {
    let mut ids: Vec<&String> = start.keys().collect();
    ids.sort();
    let mut found = BTreeSet::new();
    for (i, a) in ids.iter().enumerate() {
        for b in ids[i + 1..].iter().filter(|b| start[**b] < start[*a]) {
            found.insert((a.as_str(), b.as_str()));
        }
    }
    found
}

/// A quantile of `v` (sorted here), nearest rank.
fn pct(v: &[u64], p: f64) -> u64 {
    let mut v = v.to_vec();
    v.sort_unstable();
    v[((v.len() - 1) as f64 * p).round() as usize]
}

/// The same 200-job trace run live on simulated agents in compressed time
/// and replayed in virtual time starts its jobs in the same order.
///
/// The live run's timing noise, and how it is allowed for. Each start that
/// waits on an end is late by a scheduling round or two: the agent sees the
/// end at its next reconcile (up to [`RECONCILE_MS`]), the end is committed,
/// the leader passes (at once, or 2 ms later when it passed within its
/// 50 ms quiet period) and commits the start; about 25 ms of wall time in
/// all (the part on the agents is printed as the overrun). Starts the live
/// run made within [`NOISE_WALL_MS`] of each other (two 50 ms rounds and a
/// reconcile, rounded up: 90 trace s here) are not ordered.
///
/// Lateness also adds up along a chain of ends (a full-cluster job waits
/// for every end before it), by a few hundred ms of wall time over the
/// run. Where that moves an end past an arrival, the live pass sees a job
/// the replay's pass had not (or the reverse) and backfill may decide
/// otherwise, each decision right for its own timeline; the divergence
/// then carries on for a few jobs. So a small share of the compared pairs
/// may differ (under 2%; about 0.4 to 1% measured), and most of the
/// replay's backfill overtakes must happen live too (half; 59 to 77%
/// measured with ten reservations in priority order, 88% with the default
/// one reservation, shortest first): a live run that did not backfill would
/// fail that.
#[test]
fn live_and_replayed_runs_start_jobs_in_the_same_order() {
    let rows = live_trace();
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("live.csv");
    std::fs::write(&trace, csv(&rows)).unwrap();

    // The replay, as `gpuq sim replay` runs it; the binary's summary must be
    // this run's, so the starts compared are the command's.
    let opts = ReadOptions {
        columns: Some(Columns::parse(COLUMNS).unwrap()),
        ..ReadOptions::default()
    };
    let read = input::read(&trace, &opts).unwrap();
    let shape = Shape {
        nodes: 4,
        gpus_per_node: 8,
        topology_leaves: Some(1),
        autoscale: None,
    };
    let fifo = ReplayPolicy::load("fifo").unwrap();
    let run = engine::replay(&read.jobs, &shape, &fifo, &mut |_| {}).unwrap();
    let out = dir.path().join("out");
    replay_4x8(
        &trace,
        &["--topology-leaves", "1", "--policy", "fifo"],
        &out,
    );
    let summary = report::summarize(&run);
    assert_eq!(
        std::fs::read_to_string(out.join("summary.json")).unwrap(),
        report::summary_json(std::slice::from_ref(&summary)).unwrap()
    );
    assert_eq!((summary.jobs, summary.finished), (200, 200));
    let replayed: HashMap<String, u64> = run
        .jobs
        .iter()
        .map(|j| (j.id.clone(), j.start.unwrap()))
        .collect();

    let live = run_live(&rows);
    let live_trace_ms: HashMap<String, u64> = live
        .start
        .iter()
        .map(|(id, ms)| (id.clone(), ms * COMPRESSION))
        .collect();
    let window = NOISE_WALL_MS * COMPRESSION;
    let arrival: HashMap<String, u64> = rows.iter().map(|r| (r.id.clone(), r.arrival_ms)).collect();
    let p = pairs(&arrival, &live_trace_ms, &replayed, window);
    let share = p.discordant.len() as f64 / p.compared.max(1) as f64;
    let lag: Vec<u64> = replayed
        .iter()
        .map(|(id, r)| live_trace_ms[id].abs_diff(*r) / COMPRESSION)
        .collect();
    let (backfilled, backfilled_live) = (overtakes(&replayed), overtakes(&live_trace_ms));
    let kept = backfilled.intersection(&backfilled_live).count();
    println!(
        "live run: 200 jobs in {:.1} s of wall time at compression {COMPRESSION}; a job held its \
         GPUs longer than declared by p50 {} / p99 {} / max {} ms of wall time; its start differed from the \
         replay's by p50 {} / p90 {} / max {} ms of wall time",
        live.wall.as_secs_f64(),
        pct(&live.overrun, 0.5),
        pct(&live.overrun, 0.99),
        pct(&live.overrun, 1.0),
        pct(&lag, 0.5),
        pct(&lag, 0.9),
        pct(&lag, 1.0),
    );
    println!(
        "start order: {} pairs compared, {} within the noise window ({NOISE_WALL_MS} ms wall = {} \
         trace s) left out, {} discordant ({:.2}%); of the {} that waited together, {} \
         discordant; overtakes by backfill: replay {}, live {}, both {kept}",
        p.compared,
        p.ignored,
        window / 1000,
        p.discordant.len(),
        share * 100.0,
        p.waited_together,
        p.waited_discordant,
        backfilled.len(),
        backfilled_live.len(),
    );
    for (a, b) in p.discordant.iter().take(10) {
        println!(
            "  discordant {a} {b}: live {} {} ms, replay {} {} ms (wall)",
            live.start[a],
            live.start[b],
            replayed[a] / COMPRESSION,
            replayed[b] / COMPRESSION
        );
    }
    assert!(
        backfilled.len() >= 50,
        "the trace must exercise backfill for the order to mean anything: {} overtakes",
        backfilled.len()
    );
    assert!(share < 0.02, "{:.2}% of pairs discordant", share * 100.0);
    // Half, not more: a late end upstream flips a few overtakes (59% to 85%
    // kept over runs on 2 busy cores); a live run that never backfilled
    // would keep none.
    assert!(
        kept * 2 >= backfilled.len(),
        "only {kept} of the replay's {} backfill overtakes happened live",
        backfilled.len()
    );
}
