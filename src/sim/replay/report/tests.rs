//! The figures of hand-made runs worked out by hand, and what the written
//! files must hold.

use super::*;

const S: Millis = 1000;

fn job(
    id: &str,
    user: &str,
    gpus: u32,
    arrival: Millis,
    start: Option<Millis>,
    end: Option<Millis>,
) -> Outcome {
    Outcome {
        id: id.into(),
        user: user.into(),
        gpus,
        arrival: arrival * S,
        start: start.map(|t| t * S),
        end: end.map(|t| t * S),
        restarts: 0,
    }
}

fn sample(t: Millis, busy_gpus: u32, pending: u32, running: u32) -> Sample {
    Sample {
        t: t * S,
        busy_gpus,
        pending,
        running,
    }
}

/// 4 nodes x 8 GPUs; times in seconds:
///
/// | job | user  | GPUs | arrival | start | end |
/// |-----|-------|------|---------|-------|-----|
/// | a   | alice | 16   | 0       | 0     | 100 |
/// | b   | bob   | 8    | 0       | 0     | 50  |
/// | c   | alice | 32   | 10      | 100   | 200 |
/// | d   | bob   | 1    | 20      | 50    | 70  | (restarted once)
/// | f   | carol | 2    | 150     | -     | -   |
///
/// and `e` skipped. Busy GPUs: 24 to 50 s, 17 to 70, 16 to 100, 32 to 200.
fn hand_run() -> Run {
    let mut d = job("d", "bob", 1, 20, Some(50), Some(70));
    d.restarts = 1;
    Run {
        policy: "fifo".into(),
        nodes: 4,
        gpus_per_node: 8,
        jobs: vec![
            job("a", "alice", 16, 0, Some(0), Some(100)),
            job("b", "bob", 8, 0, Some(0), Some(50)),
            job("c", "alice", 32, 10, Some(100), Some(200)),
            d,
            job("f", "carol", 2, 150, None, None),
        ],
        samples: vec![
            sample(0, 24, 0, 2),
            sample(10, 24, 1, 2),
            sample(20, 24, 2, 2),
            sample(50, 17, 1, 2),
            sample(70, 16, 1, 1),
            sample(100, 32, 0, 1),
            sample(150, 32, 1, 1),
            sample(200, 0, 1, 0),
        ],
        skipped: vec!["e".into()],
        passes: 12,
        provisioned_gpu_ms: None,
    }
}

#[test]
fn hand_run_figures() {
    let s = summarize(&hand_run());
    assert_eq!(s.cluster_gpus, 32);
    assert_eq!((s.jobs, s.skipped, s.finished), (5, 1, 4));
    assert_eq!((s.unfinished, s.never_started, s.restarts), (1, 1, 1));
    assert_eq!(s.passes, 12);
    assert_eq!((s.span_s, s.window_s), (200.0, 150.0));
    // 24*50 + 17*20 + 16*30 + 32*100 = 5220 GPU-s of 32*200.
    assert_eq!(s.gpu_hours, 1.45);
    assert_eq!(s.gpu_utilisation, 0.815625);
    // To 150 s: 24*50 + 17*20 + 16*30 + 32*50 = 3620 of 32*150.
    assert_eq!(s.window_utilisation, 0.754167);
    // Waits 0, 0, 90, 30 (f never started: not counted).
    let wait = Spread {
        count: 4,
        mean_s: 30.0,
        p50_s: 30.0,
        p90_s: 90.0,
        p99_s: 90.0,
        max_s: 90.0,
    };
    assert_eq!(s.wait, wait);
    // JCT 100, 50, 190, 50.
    assert_eq!(
        (s.jct.count, s.jct.mean_s, s.jct.p50_s, s.jct.p99_s),
        (4, 97.5, 100.0, 190.0)
    );
    // Slowdowns 1, 1, 190/100, 50/20.
    assert_eq!(s.bounded_slowdown_mean, 1.6);
    let classes: Vec<(&str, usize, usize, usize, f64)> = s
        .by_size
        .iter()
        .map(|(k, c)| {
            (
                k.as_str(),
                c.jobs,
                c.never_started,
                c.wait.count,
                c.wait.mean_s,
            )
        })
        .collect();
    assert_eq!(
        classes,
        [
            ("1", 1, 0, 1, 30.0),
            ("2-8", 2, 1, 1, 0.0),
            ("9-31", 1, 0, 1, 0.0),
            (">=32", 1, 0, 1, 90.0),
        ]
    );
    assert_eq!(s.starvation_s, 90.0);
    // Pending: 1 for 10 s, 2 for 30, 1 for 50, 1 for 50: 170 job-s in 200.
    assert_eq!(
        s.queue,
        Queue {
            pending_mean: 0.85,
            pending_max: 2
        }
    );
    let f = s.fairness.expect("three users");
    let alice = &f.users["alice"];
    assert_eq!(
        (alice.jobs, alice.gpu_hours, alice.wait_mean_s),
        (2, 1.333333, 45.0)
    );
    assert_eq!(alice.bounded_slowdown_mean, 1.45);
    let bob = &f.users["bob"];
    assert_eq!(
        (bob.jobs, bob.gpu_hours, bob.wait_mean_s),
        (2, 0.116667, 15.0)
    );
    assert_eq!(bob.bounded_slowdown_mean, 1.75);
    assert_eq!(
        f.users["carol"],
        UserFigures {
            jobs: 1,
            ..Default::default()
        }
    );
    // Over alice and bob (carol has no finished job): 3.2^2 / (2 * 5.165).
    assert_eq!(f.jain_index, 0.991288);
}

#[test]
fn slowdown_is_bounded_below_by_ten_seconds_and_one() {
    // A 1 s job that waited 9 s: (9 + 1) / 10, not 10 / 1.
    let quick = job("q", "", 1, 0, Some(9), Some(10));
    assert_eq!(bounded_slowdown(&quick), Some(1.0));
    // Not waiting at all is 1, not 0.1.
    let instant = job("i", "", 1, 0, Some(0), Some(1));
    assert_eq!(bounded_slowdown(&instant), Some(1.0));
    assert_eq!(bounded_slowdown(&job("p", "", 1, 0, None, None)), None);
}

#[test]
fn jain_index_spans_one_to_one_over_n() {
    assert_eq!(jain(&[2.0, 2.0, 2.0]), 1.0);
    assert_eq!(jain(&[4.0, 0.0, 0.0, 0.0]), 0.25);
    assert_eq!(jain(&[]), 0.0);
}

#[test]
fn same_run_gives_identical_json() {
    let a = summary_json(&[summarize(&hand_run())]).unwrap();
    let b = summary_json(&[summarize(&hand_run())]).unwrap();
    assert_eq!(a, b);
    let back: Summary = serde_json::from_str(&a).unwrap();
    assert_eq!(back, summarize(&hand_run()));
}

#[test]
fn one_user_has_no_fairness_section() {
    let mut run = hand_run();
    for j in &mut run.jobs {
        j.user = if j.id == "a" {
            "alice".into()
        } else {
            String::new()
        };
    }
    assert_eq!(summarize(&run).fairness, None);
}

#[test]
fn cpu_jobs_get_their_own_class() {
    let mut run = hand_run();
    run.jobs.push(job("cpu", "bob", 0, 5, Some(5), Some(6)));
    let s = summarize(&run);
    assert_eq!(s.by_size["0"].jobs, 1);
    assert!(table(&[s]).contains("jobs 0 GPUs (CPU)"));
}

/// Every number in `v` is finite and the only null is `fairness`.
fn assert_no_nan(v: &serde_json::Value, path: &str) {
    match v {
        serde_json::Value::Null => assert!(path.ends_with("fairness"), "null at {path}"),
        serde_json::Value::Number(n) => {
            assert!(n.as_f64().is_some_and(f64::is_finite), "{path}")
        }
        serde_json::Value::Object(m) => {
            for (k, v) in m {
                assert_no_nan(v, &format!("{path}.{k}"));
            }
        }
        serde_json::Value::Array(a) => {
            for (i, v) in a.iter().enumerate() {
                assert_no_nan(v, &format!("{path}[{i}]"));
            }
        }
        _ => {}
    }
}

#[test]
fn empty_run_has_zero_figures() {
    for (nodes, gpus_per_node) in [(2, 8), (0, 0)] {
        let run = Run {
            policy: "empty".into(),
            nodes,
            gpus_per_node,
            jobs: vec![],
            samples: vec![],
            skipped: vec![],
            passes: 0,
            provisioned_gpu_ms: None,
        };
        let s = summarize(&run);
        assert_eq!((s.jobs, s.span_s, s.gpu_utilisation), (0, 0.0, 0.0));
        assert_eq!((s.wait.mean_s, s.bounded_slowdown_mean), (0.0, 0.0));
        assert_eq!(s.queue, Queue::default());
        let json = summary_json(std::slice::from_ref(&s)).unwrap();
        assert_no_nan(&serde_json::from_str(&json).unwrap(), "");
        let dir = tempfile::tempdir().unwrap();
        let paths = write(dir.path(), &[run]).unwrap();
        let html = std::fs::read_to_string(&paths[1]).unwrap();
        assert!(html.contains("no data"), "{html}");
        assert!(!table(&[s]).contains("NaN"));
    }
}

#[test]
fn write_puts_both_files_and_no_temporaries() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("new").join("report");
    let paths = write(&out, &[hand_run()]).unwrap();
    assert_eq!(paths, [out.join("summary.json"), out.join("report.html")]);
    let json = std::fs::read_to_string(&paths[0]).unwrap();
    assert_eq!(json, summary_json(&[summarize(&hand_run())]).unwrap());
    let names: Vec<String> = std::fs::read_dir(&out)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names.len(), 2, "{names:?}");
    // Writing again gives the same bytes.
    let html = std::fs::read(&paths[1]).unwrap();
    write(&out, &[hand_run()]).unwrap();
    assert_eq!(std::fs::read(&paths[1]).unwrap(), html);
}

#[test]
fn write_names_a_directory_it_cannot_create() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("plain-file");
    std::fs::write(&file, "x").unwrap();
    let out = file.join("report");
    let err = write(&out, &[hand_run()]).unwrap_err();
    assert!(matches!(err, ReportError::CreateDir { .. }), "{err:?}");
    let msg = err.to_string();
    assert!(
        msg.contains(&out.display().to_string()) && msg.contains("--out"),
        "{msg}"
    );
    let err = write(dir.path(), &[]).unwrap_err();
    assert!(matches!(err, ReportError::NoRuns { .. }), "{err:?}");
}

fn two_runs() -> Vec<Run> {
    let mut second = hand_run();
    second.policy = "backfill".into();
    // d backfills at 20 s instead of waiting for b.
    second.jobs[3].start = Some(20 * S);
    second.jobs[3].end = Some(40 * S);
    vec![hand_run(), second]
}

#[test]
fn two_runs_compare_side_by_side() {
    let runs = two_runs();
    let summaries: Vec<Summary> = runs.iter().map(summarize).collect();
    let text = table(&summaries);
    let header = text.lines().next().unwrap();
    assert!(
        header.contains("fifo") && header.contains("backfill") && header.contains("ratio"),
        "{text}"
    );
    // Mean wait 30 s against (0 + 0 + 90 + 0) / 4.
    let wait = text.lines().find(|l| l.starts_with("wait mean ")).unwrap();
    assert!(
        wait.contains("30.0 s") && wait.contains("22.5 s") && wait.ends_with("0.75"),
        "{wait}"
    );
    assert!(!table(&summaries[..1]).contains("ratio"));

    let dir = tempfile::tempdir().unwrap();
    let paths = write(dir.path(), &runs).unwrap();
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&paths[0]).unwrap()).unwrap();
    assert_eq!(json["runs"][1]["policy"], "backfill");
    let html = std::fs::read_to_string(&paths[1]).unwrap();
    assert!(html.contains("fifo vs backfill"));
    // Each of the 9 charts' legends names both policies, the second in its
    // own colour and dashed.
    for name in ["fifo", "backfill"] {
        let legends = html.matches(&format!(r#"class="legend">{name}<"#)).count();
        assert_eq!(legends, 9, "{name}");
    }
    let second = format!(
        r#"stroke="{}" stroke-width="2.5" stroke-dasharray"#,
        svg::colour(1)
    );
    assert_eq!(html.matches(&second).count(), 8);
    assert!(html.contains(r#"<th class="n">ratio</th>"#));
}

#[test]
fn html_has_every_chart_and_escapes_trace_text() {
    let mut run = hand_run();
    run.policy = "a&b".into();
    run.jobs[0].user = "<script>".into();
    run.jobs[2].user = "<script>".into();
    let html = page::render(&[run.clone()], &[summarize(&run)]);
    // Utilisation, queue, wait (all and four classes), JCT, users.
    assert_eq!(html.matches("<svg").count(), 9, "{html}");
    assert!(!html.contains("<script"), "{html}");
    assert!(html.contains("&lt;script&gt;") && html.contains("a&amp;b"));
    for external in ["http://", "https://", "src="] {
        let outside = html.replace("http://www.w3.org/2000/svg", "");
        assert!(!outside.contains(external), "{external}");
    }
}

#[test]
fn large_run_stays_small() {
    // 100,000 jobs on 64 x 8 GPUs, a sample per start and end.
    let n = 100_000u64;
    let mut jobs = Vec::new();
    let mut samples = Vec::new();
    for i in 0..n {
        let gpus = [1, 4, 8, 16, 64][i as usize % 5];
        let arrival = i * 30 * S;
        let start = arrival + (i % 97) * 60 * S;
        jobs.push(Outcome {
            id: i.to_string(),
            user: format!("user{}", i % 50),
            gpus,
            arrival,
            start: Some(start),
            end: Some(start + (i % 13 + 1) * 600 * S),
            restarts: 0,
        });
        samples.push(Sample {
            t: arrival,
            busy_gpus: (i % 512) as u32,
            pending: (i % 40) as u32,
            running: 1,
        });
    }
    let run = Run {
        policy: "big".into(),
        nodes: 64,
        gpus_per_node: 8,
        jobs,
        samples,
        skipped: vec![],
        passes: n,
        provisioned_gpu_ms: None,
    };
    let mut other = run.clone();
    other.policy = "other".into();
    let summaries = [summarize(&run), summarize(&other)];
    let html = page::render(&[run, other], &summaries);
    assert!(html.len() < 2_000_000, "{} bytes", html.len());
    assert!(html.contains("The 40 users with the most jobs, of 50."));
}

#[test]
fn buckets_are_time_weighted_means() {
    // 10 busy for the first 3 ms of 6, then 0: two buckets of 3 ms.
    let load = Load::new(&[
        Sample {
            t: 0,
            busy_gpus: 10,
            pending: 0,
            running: 1,
        },
        Sample {
            t: 3,
            busy_gpus: 0,
            pending: 0,
            running: 0,
        },
    ]);
    let b = page::buckets(&load, 6, 6, |s| s.busy_gpus);
    assert_eq!(b.len(), 6);
    assert_eq!(b.iter().map(|p| p.1).sum::<f64>(), 30.0);
    // A run shorter than the axis stops at its own end.
    let b = page::buckets(&load, 2, 6, |s| s.busy_gpus);
    assert_eq!(b, [(0.5, 10.0), (1.5, 10.0)]);
}
