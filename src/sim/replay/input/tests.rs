use std::path::PathBuf;

use super::*;

/// A trace file in its own temporary directory (kept alive with it).
struct Csv {
    _dir: tempfile::TempDir,
    path: PathBuf,
}

fn csv(text: &str) -> Csv {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("trace.csv");
    std::fs::write(&path, text).expect("write trace");
    Csv { _dir: dir, path }
}

fn with(spec: &str) -> ReadOptions {
    ReadOptions {
        columns: Some(Columns::parse(spec).expect("spec")),
        ..ReadOptions::default()
    }
}

fn read_err(text: &str, opts: &ReadOptions) -> String {
    let file = csv(text);
    read(&file.path, opts).unwrap_err().to_string()
}

fn ids(trace: &Trace) -> Vec<&str> {
    trace.jobs.iter().map(|j| j.id.as_str()).collect()
}

const SIMPLE: &str = "arrival=t,gpus=g,duration=d";

#[test]
fn column_specs_name_fields_in_any_order() {
    let c = Columns::parse(" gpus = n , arrival=submit,duration=run,user=who,id=jid,limit=tl ,")
        .unwrap();
    assert_eq!(c.arrival, "submit");
    assert_eq!(c.gpus, "n");
    assert_eq!(c.duration.as_deref(), Some("run"));
    assert_eq!(c.user.as_deref(), Some("who"));
    assert_eq!(c.id.as_deref(), Some("jid"));
    assert_eq!(c.limit.as_deref(), Some("tl"));
    assert_eq!((c.start, c.end), (None, None));
    let c = Columns::parse("arrival=a,gpus=g,start=s,end=e").unwrap();
    assert_eq!((c.duration, c.start.as_deref()), (None, Some("s")));
}

#[test]
fn column_spec_mistakes_name_the_field_and_the_valid_ones() {
    let cases = [
        (
            "arrival=a,gpus=g,duration=d,owner=u",
            &["`owner`", "arrival, gpus"][..],
        ),
        ("arrival=a,gpus=g,duration=d,gpus=h", &["`gpus`", "twice"]),
        (
            "arrival=a,gpus,duration=d",
            &["`gpus`", "no `=`", "arrival, gpus"],
        ),
        ("arrival=a,gpus=,duration=d", &["`gpus`", "gpus=COLUMN"]),
        ("gpus=g,duration=d", &["`arrival`", "required"]),
        ("arrival=a,duration=d", &["`gpus`", "required"]),
        (
            "arrival=a,gpus=g",
            &["duration=COLUMN", "start=COLUMN and end=COLUMN"],
        ),
        ("arrival=a,gpus=g,start=s", &["duration=COLUMN"]),
    ];
    for (spec, wants) in cases {
        let err = Columns::parse(spec).unwrap_err().to_string();
        for want in wants {
            assert!(err.contains(want), "{spec}: {err}");
        }
    }
}

#[test]
fn where_filters_parse_as_column_equals_value() {
    assert_eq!(
        parse_filter("cluster=c4").unwrap(),
        ("cluster".into(), "c4".into())
    );
    assert_eq!(
        parse_filter("part=a=b").unwrap(),
        ("part".into(), "a=b".into())
    );
    assert_eq!(
        parse_filter("state=").unwrap(),
        ("state".into(), String::new())
    );
    for bad in ["cluster", "=c4", ""] {
        let err = parse_filter(bad).unwrap_err().to_string();
        assert!(err.contains("COLUMN=VALUE"), "{bad}: {err}");
    }
}

#[test]
fn quoted_fields_crlf_and_blank_lines() {
    let file = csv("\u{feff}id,\"t\",g,d,who\r\n\
         \r\n\
         \"a,1\", 5 ,1,10,\"say \"\"hi\"\"\"\r\n\
         \"b\",6,2,20,  \"x, y\"  \r\n\
         \n\
         c,7,0,0,\"\"\r\n");
    let trace = read(
        &file.path,
        &with("arrival=t,gpus=g,duration=d,id=id,user=who"),
    )
    .unwrap();
    assert_eq!(ids(&trace), ["a,1", "b", "c"]);
    let users: Vec<&str> = trace.jobs.iter().map(|j| j.user.as_str()).collect();
    assert_eq!(users, ["say \"hi\"", "x, y", ""]);
    assert_eq!(trace.rows, 3);
    assert_eq!(trace.jobs[1].line, 4, "lines count blank ones, header is 1");
    assert_eq!(trace.jobs[2].gpus, 0, "a CPU job keeps 0 GPUs");
    assert_eq!(trace.jobs[2].duration, 0, "a zero duration is allowed");
}

#[test]
fn split_rejects_broken_quotes() {
    let mut out = Vec::new();
    assert!(split("a,\"b", &mut out).is_none());
    assert!(split("a,\"b\"c,d", &mut out).is_none());
    assert!(split("\"\",x", &mut out).is_some());
    assert_eq!(out, ["", "x"]);
    let err = read_err("t,g,d\n1,1,1\n2,\"1,1\n", &with(SIMPLE));
    assert!(err.contains("line 3") && err.contains("quoted"), "{err}");
}

#[test]
fn timestamps_convert_to_utc_epoch_ms() {
    let epoch = 1_614_816_000_000; // 2021-03-04T00:00:00Z
    for s in [
        "2021-03-04 00:00:00Z",
        "2021-03-04T00:00:00Z",
        "2021-03-04 00:00:00",
        "2021-03-04",
        "2021-03-04T01:30:00+01:30",
        "2021-03-03T20:00:00-04:00",
        "2021-03-04 05:30:00 +0530",
        "2021-03-04t00:00:00z",
        "1614816000",
        "1614816000.0",
    ] {
        assert_eq!(parse_time(s), Some(epoch), "{s}");
    }
    assert_eq!(parse_time("2021-03-04 00:00:00.25Z"), Some(epoch + 250));
    assert_eq!(parse_time("2021-03-04 00:00:00.1235"), Some(epoch + 124));
    assert_eq!(parse_time("1614816000.5"), Some(epoch + 500));
    assert_eq!(parse_time("1970-01-01 00:00:00"), Some(0));
    assert_eq!(parse_time("1969-12-31 23:59:59"), Some(-1000));
    assert_eq!(parse_time("2000-02-29 12:00:00"), Some(951_825_600_000));
    assert_eq!(parse_time("2020-02-29 00:00:00"), Some(1_582_934_400_000));
    assert_eq!(parse_time("1e3"), Some(1_000_000));
    for bad in [
        "",
        "NaN",
        "inf",
        "yesterday",
        "2021-02-29 00:00:00",
        "1900-02-29",
        "2021-13-01 00:00:00",
        "2021-03-04 24:00:00",
        "2021-03-04 00:60:00",
        "2021-03-04 00:00:00+25:00",
        "2021-03-04 00:00:00 UTC",
        "21-03-04 00:00:00",
    ] {
        assert_eq!(parse_time(bad), None, "{bad}");
    }
}

#[test]
fn durations_take_seconds_or_slurm_clocks() {
    let cases = [
        ("90", 90_000),
        ("1.5", 1_500),
        ("0", 0),
        ("03:04", 184_000),
        ("02:03:04", 7_384_000),
        ("1-02:03:04", 93_784_000),
        ("2-00", 172_800_000),
        ("1-01:30", 91_800_000),
        ("00:00:01.5", 1_500),
        ("100:00:00", 360_000_000),
    ];
    for (s, ms) in cases {
        assert_eq!(parse_duration(s), Ok(ms), "{s}");
    }
    assert_eq!(parse_duration("-5"), Err(NEGATIVE));
    assert_eq!(parse_duration("-01:00:00"), Err(NEGATIVE));
    for bad in [
        "",
        "abc",
        "NaN",
        "1:2:3:4",
        "1-",
        "x-01:00:00",
        "01:aa",
        "5m",
    ] {
        assert_eq!(parse_duration(bad), Err(NOT_DURATION), "{bad}");
    }
    assert_eq!(parse_limit(""), Ok(None));
    assert_eq!(parse_limit("UNLIMITED"), Ok(None));
    assert_eq!(parse_limit("1:00:00"), Ok(Some(3_600_000)));
}

#[test]
fn durations_from_start_and_end_and_limits() {
    let file = csv("submit,begin,finish,n,tl\n\
         2021-03-04 00:00:00,2021-03-04 00:10:00,2021-03-04 01:10:00,4,UNLIMITED\n\
         2021-03-04 00:00:30Z,2021-03-04T02:00:00+02:00,2021-03-04 00:00:05,1,\n\
         2021-03-04 00:01:00,1614816000,1614816000.25,8,1-00:00:00\n");
    let opts = with("arrival=submit,gpus=n,start=begin,end=finish,limit=tl");
    let trace = read(&file.path, &opts).unwrap();
    let got: Vec<_> = trace
        .jobs
        .iter()
        .map(|j| (j.id.as_str(), j.arrival, j.duration, j.limit))
        .collect();
    assert_eq!(
        got,
        [
            ("2", 0, 3_600_000, None),
            ("3", 30_000, 5_000, None),
            ("4", 60_000, 250, Some(86_400_000)),
        ]
    );
    let err = read_err(
        "submit,begin,finish,n\n0,100,50,1\n",
        &with("arrival=submit,gpus=n,start=begin,end=finish"),
    );
    assert!(
        err.contains("line 2") && err.contains("before the start"),
        "{err}"
    );
    assert!(err.contains("`finish`") && err.contains("`begin`"), "{err}");
}

#[test]
fn jobs_sort_by_arrival_then_line_and_start_at_zero() {
    let file = csv("t,g,d\n500,1,1\n200,1,1\n300.5,1,1\n200,1,1\n1000,1,1\n");
    let trace = read(&file.path, &with(SIMPLE)).unwrap();
    assert_eq!(ids(&trace), ["3", "5", "4", "2", "6"]);
    let arrivals: Vec<u64> = trace.jobs.iter().map(|j| j.arrival).collect();
    assert_eq!(arrivals, [0, 0, 100_500, 300_000, 800_000]);
}

#[test]
fn filter_and_limit_keep_the_first_matching_arrivals() {
    let file = csv("t,g,d,team\n\
         50,1,1,a\n\
         10,2,1,b\n\
         40,3,1,a\n\
         30,4,1,a\n\
         20,5,1,b\n");
    let mut opts = with(SIMPLE);
    opts.filter = vec![parse_filter("team=a").unwrap()];
    opts.limit = Some(2);
    let trace = read(&file.path, &opts).unwrap();
    assert_eq!(ids(&trace), ["5", "4"]);
    assert_eq!(
        trace.jobs[1].arrival, 10_000,
        "relative to the earliest kept"
    );
    assert_eq!((trace.rows, trace.filtered_out), (5, 2));

    opts.filter.push(parse_filter("g=3").unwrap());
    opts.limit = None;
    let trace = read(&file.path, &opts).unwrap();
    assert_eq!(ids(&trace), ["4"], "every --where must match");
    assert_eq!(trace.filtered_out, 4);

    opts.filter = vec![parse_filter("team=c").unwrap()];
    let err = read(&file.path, &opts).unwrap_err().to_string();
    assert!(err.contains("team=c") && err.contains("5 rows"), "{err}");
    opts.filter = vec![parse_filter("group=a").unwrap()];
    let err = read(&file.path, &opts).unwrap_err().to_string();
    assert!(
        err.contains("`group`") && err.contains("t,g,d,team"),
        "{err}"
    );
}

#[test]
fn bad_rows_name_the_line_and_column() {
    let cases = [
        ("t,g,d\n1,1,1\n2,1,-5\n", "line 3, column `d`", "negative"),
        (
            "t,g,d\n1,1,1\n2,1,NaN\n",
            "line 3, column `d`",
            "not a duration",
        ),
        ("t,g,d\nsoon,1,1\n", "line 2, column `t`", "not a time"),
        (
            "t,g,d\n1,1.5,1\n",
            "line 2, column `g`",
            "whole number of GPUs",
        ),
        (
            "t,g,d\n1,-1,1\n",
            "line 2, column `g`",
            "whole number of GPUs",
        ),
        (
            "t,g,d\n1,1,1\n\n1,1\n",
            "line 4",
            "2 fields where the header has 3",
        ),
        ("t,g,d\n1,1,1,\n", "line 2", "4 fields"),
    ];
    for (text, place, problem) in cases {
        let err = read_err(text, &with(SIMPLE));
        assert!(err.contains("trace.csv"), "{err}");
        assert!(err.contains(place) && err.contains(problem), "{err}");
    }
    let err = read_err(
        "t,g,d,tl\n1,1,1,forever\n",
        &with("arrival=t,gpus=g,duration=d,limit=tl"),
    );
    assert!(err.contains("line 2, column `tl`"), "{err}");
}

#[test]
fn bad_files_and_headers_say_what_to_do() {
    let err = read_err("t,gpus,d\n1,1,1\n", &with(SIMPLE));
    assert!(
        err.contains("line 1") && err.contains("no column `g`"),
        "{err}"
    );
    assert!(
        err.contains("--columns gpus=g") && err.contains("t,gpus,d"),
        "{err}"
    );

    let err = read_err("\n\nsubmit,n\n1,1\n", &ReadOptions::default());
    assert!(err.contains("line 3") && err.contains("--columns"), "{err}");
    assert!(
        err.contains("submit,n") && err.contains("not the ITP"),
        "{err}"
    );

    for empty in ["", "\n\n", "t,g,d\n", "t,g,d\r\n\r\n"] {
        let err = read_err(empty, &with(SIMPLE));
        assert!(err.contains("has no jobs"), "{empty:?}: {err}");
    }

    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("nope.csv");
    let err = read(&missing, &with(SIMPLE)).unwrap_err().to_string();
    assert!(
        err.contains("cannot read") && err.contains("nope.csv"),
        "{err}"
    );

    let mut hand_made = Columns::parse(SIMPLE).unwrap();
    hand_made.duration = None;
    let opts = ReadOptions {
        columns: Some(hand_made),
        ..ReadOptions::default()
    };
    let err = read_err("t,g,d\n1,1,1\n", &opts);
    assert!(err.contains("duration=COLUMN"), "{err}");
}

#[test]
fn id_and_user_default_when_the_trace_has_none() {
    let file = csv("t,g,d\n0,1,1\n");
    let trace = read(&file.path, &with(SIMPLE)).unwrap();
    assert_eq!(trace.jobs[0].id, "2");
    assert_eq!(trace.jobs[0].user, "");
    assert_eq!(trace.jobs[0].limit, None);
}

#[test]
fn the_itp_header_is_detected_and_its_cluster_is_the_user() {
    let file = csv(
        "job_id,cluster,submit_time_s,num_gpus,runtime_s,min_nodes_8gpu\n\
         x,cluster07,1999,8,13423,1\n\
         y,cluster02,1000,16,5,2\n",
    );
    let trace = read(&file.path, &ReadOptions::default()).unwrap();
    assert_eq!(
        trace.jobs[0],
        TraceJob {
            id: "y".into(),
            arrival: 0,
            gpus: 16,
            duration: 5_000,
            user: "cluster02".into(),
            limit: None,
            line: 3,
        }
    );
    assert_eq!(trace.jobs[1].arrival, 999_000);
}

#[test]
fn the_shipped_itp_trace_reads_whole() {
    let path =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/traces/itp/itp_all_clusters.csv");
    let trace = read(&path, &ReadOptions::default()).unwrap();
    assert_eq!(trace.jobs.len(), 69_351, "the README's job count");
    assert_eq!((trace.rows, trace.filtered_out), (69_351, 0));
    assert_eq!(trace.jobs[0].arrival, 0);
    assert!(trace.jobs.windows(2).all(|w| w[0].arrival <= w[1].arrival));
    assert!(trace.jobs.iter().all(|j| j.user.starts_with("cluster")));
    assert_eq!(trace.jobs.iter().filter(|j| j.gpus > 8).count(), 806);

    let opts = ReadOptions {
        filter: vec![parse_filter("cluster=cluster04").unwrap()],
        limit: Some(100),
        ..ReadOptions::default()
    };
    let c4 = read(&path, &opts).unwrap();
    assert_eq!(
        c4.filtered_out,
        69_351 - 15_802,
        "the README's cluster04 count"
    );
    assert_eq!(c4.jobs.len(), 100);
    assert_eq!(c4.jobs[0].arrival, 0);
}
