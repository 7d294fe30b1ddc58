//! Accounting over the history archive: jobs run, leave memory after the
//! retention window, and `gpuq show` and `gpuq acct` still answer for them,
//! with filters and summaries, across a server restart.

mod common;

use std::time::Duration;

use common::{require_root, stderr, wait_for, Cluster};

const LONG: Duration = Duration::from_secs(60);

fn json(c: &Cluster, args: &[&str]) -> serde_json::Value {
    serde_json::from_str(&c.server.ok(args)).unwrap_or_else(|e| panic!("{args:?}: {e}"))
}

fn ids(v: &serde_json::Value) -> Vec<String> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|r| r["id"].to_string())
        .collect()
}

#[test]
fn finished_jobs_are_archived_and_acct_reports_them() {
    if !require_root("finished_jobs_are_archived_and_acct_reports_them") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let mut c = Cluster::start_with_config(dir.path(), 1, 8, 10, "history_retention_secs = 1");
    let ok = c.submit(&["--gpus-per-node", "2", "--", "sleep", "1"]);
    // Submit refuses an account that does not exist or does not list the
    // user (added after `ok`, which was charged to `default`).
    c.server
        .ok(&["admin", "account", "add", "vision", "--add-user", "root"]);
    let bad = c.submit(&["--account", "vision", "--", "sh", "-c", "exit 3"]);
    c.wait_state(&ok, "COMPLETED", LONG);
    c.wait_state(&bad, "FAILED", LONG);

    // After the retention window they leave the active set...
    wait_for("both jobs to be archived", LONG, || {
        let q: serde_json::Value =
            serde_json::from_str(&c.server.ok(&["queue", "--all", "--json"])).unwrap();
        q.as_array().unwrap().is_empty()
    });
    // ...and show still answers from the archive.
    assert_eq!(c.job(&ok)["state"], "COMPLETED");
    assert_eq!(c.job(&bad)["exit_code"], 3);

    let all = json(&c, &["acct", "--json"]);
    assert_eq!(ids(&all), vec![ok.clone(), bad.clone()]);
    let r = &all[0];
    assert_eq!(r["user"], "root");
    assert_eq!(r["account"], "default");
    assert_eq!(r["state"], "COMPLETED");
    assert_eq!(r["exit_code"], 0);
    assert_eq!(r["nodes"], serde_json::json!(["n1"]));
    assert_eq!(r["gpus"], 2);
    let (start, end) = (
        r["start_time"].as_u64().unwrap(),
        r["end_time"].as_u64().unwrap(),
    );
    assert!(r["submit_time"].as_u64().unwrap() <= start && start < end);
    assert_eq!(r["elapsed_secs"].as_u64().unwrap(), (end - start) / 1000);
    let gpu_hours = r["gpu_hours"].as_f64().unwrap();
    assert!((gpu_hours - 2.0 * (end - start) as f64 / 3.6e6).abs() < 1e-9);
    assert!(
        r["elapsed_secs"].as_u64().unwrap() >= 1,
        "it slept a second"
    );
    assert_eq!(all[1]["account"], "vision");
    assert_eq!(all[1]["exit_code"], 3);

    // Filters.
    assert_eq!(
        ids(&json(&c, &["acct", "--state", "FAILED", "--json"])),
        vec![bad.clone()]
    );
    assert_eq!(
        ids(&json(&c, &["acct", "-A", "vision", "--json"])),
        vec![bad.clone()]
    );
    assert_eq!(ids(&json(&c, &["acct", "-u", "root", "--json"])).len(), 2);
    assert!(ids(&json(&c, &["acct", "-u", "nobody", "--json"])).is_empty());
    assert!(ids(&json(&c, &["acct", "-S", "2099-01-01", "--json"])).is_empty());
    assert!(ids(&json(&c, &["acct", "-E", "2000-01-01", "--json"])).is_empty());
    assert_eq!(
        ids(&json(&c, &["acct", "-S", "now-1h", "-E", "now", "--json"])).len(),
        2
    );
    let table = c.server.ok(&["acct"]);
    assert!(
        table.starts_with("JOBID") && table.contains("vision"),
        "{table}"
    );

    // Summary: per account, and per user within it.
    let sum = json(&c, &["acct", "--summary", "--json"]);
    let rows = sum.as_array().unwrap();
    let row = |account: &str, user: Option<&str>| {
        rows.iter()
            .find(|r| r["account"] == account && r["user"].as_str() == user)
            .unwrap_or_else(|| panic!("no {account}/{user:?} row in {sum}"))
    };
    assert_eq!(row("default", None)["jobs"], 1);
    assert_eq!(row("default", Some("root"))["by_state"]["COMPLETED"], 1);
    assert_eq!(row("vision", None)["by_state"]["FAILED"], 1);
    assert!((row("default", None)["gpu_hours"].as_f64().unwrap() - gpu_hours).abs() < 1e-9);

    // A user's mistake: a clear message, non-zero exit.
    let out = c.server.cli(&["acct", "-S", "yesterday"]);
    assert!(!out.status.success());
    assert!(stderr(&out).contains("YYYY-MM-DD"), "{}", stderr(&out));
    let out = c.server.cli(&["acct", "-S", "now", "-E", "now-1d"]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(stderr(&out).contains("--since is after --until"));

    // The archive is durable: a restarted server still answers.
    c.server.kill();
    c.server.start();
    assert_eq!(ids(&json(&c, &["acct", "--json"])), vec![ok.clone(), bad]);
    assert_eq!(c.job(&ok)["state"], "COMPLETED");
}
