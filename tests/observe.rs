//! The HTTP port of real daemons: `/metrics` scraped with curl while jobs
//! run, its figures checked against `gpuq queue`/`gpuq nodes`, its text
//! checked by `promtool check metrics`; the agents' per-GPU telemetry and
//! dcgm-exporter files follow the jobs holding the GPUs.

mod common;

use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::{http_url_in, Agent, Cluster, Server};

/// `curl URL` with `args`: (HTTP status, body).
pub fn curl(url: &str, args: &[&str]) -> (u16, String) {
    let out = Command::new("curl")
        .args(["-s", "-S", "--max-time", "20", "-w", "\n%{http_code}"])
        .args(args)
        .arg(url)
        .output()
        .expect("curl runs (Debian's curl package)");
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let (body, code) = text.rsplit_once('\n').unwrap_or(("", "0"));
    (code.trim().parse().unwrap_or(0), body.to_string())
}

/// Samples of a metrics page: `name{labels}` -> value, labels as written.
fn samples(page: &str) -> BTreeMap<String, f64> {
    page.lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .filter_map(|l| {
            let (key, value) = l.rsplit_once(' ')?;
            Some((key.to_string(), value.parse().ok()?))
        })
        .collect()
}

/// The sum of the samples of `name` whose labels contain every `want`.
fn sum(samples: &BTreeMap<String, f64>, name: &str, want: &[&str]) -> f64 {
    samples
        .iter()
        .filter(|(k, _)| k.split('{').next() == Some(name))
        .filter(|(k, _)| want.iter().all(|w| k.contains(w)))
        .map(|(_, v)| v)
        .sum()
}

/// `promtool check metrics` on `page`; panics with its complaints. Where
/// promtool is missing it says so, and fails in CI (`.ci/run` installs it).
fn promtool_accepts(page: &str) {
    let child = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn();
    let mut child = match child {
        Ok(c) => c,
        Err(_) => {
            assert!(
                std::env::var_os("CI").is_none(),
                "promtool is missing and CI installs it (Debian's prometheus)"
            );
            eprintln!("NOT RUN: promtool check metrics (install Debian's prometheus)");
            return;
        }
    };
    use std::io::Write;
    child
        .stdin
        .take()
        .unwrap()
        .write_all(page.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "promtool check metrics refused the page: {}{}\n{page}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

fn http_url(log: &str) -> String {
    http_url_in(log).unwrap_or_else(|| panic!("no http= in the daemon's ready line:\n{log}"))
}

/// Two nodes of 4 GPUs: a busy job (2 GPUs at 90%), an idle one (1 GPU,
/// a sleep), and a job too big to start; the server's page agrees with
/// `gpuq queue` and `gpuq nodes`, and the agents' pages label each GPU with
/// the job holding it.
#[test]
fn metrics_agree_with_queue_and_nodes_while_jobs_run() {
    let dir = common::shared_tempdir();
    let server = Server::bootstrap(&dir.path().join("server"));
    let token = server.ok(&["token", "create"]).trim().to_string();
    let map = dir.path().join("dcgm");
    let agents: Vec<Agent> = (1..=2)
        .map(|i| {
            let name = format!("n{i}");
            let extra = format!("dcgm_job_map_dir = \"{}/{name}\"", map.display());
            Agent::start_with(&server, &dir.path().join(&name), &name, 4, &token, &extra)
        })
        .collect();
    let cluster = Cluster {
        server,
        agents,
        dir: dir.path().to_path_buf(),
    };
    let busy = cluster.submit(&[
        "--gpus",
        "2",
        "--export=ALL,GPUQ_FAKE_GPU_UTIL=90",
        "--",
        "sleep",
        "60",
    ]);
    let idle = cluster.submit(&["--gpus", "1", "--", "sleep", "60"]);
    let big = cluster.submit(&["--nodes", "2", "--gpus", "4", "--", "sleep", "1"]);
    cluster.wait_started(&busy, Duration::from_secs(30));
    cluster.wait_started(&idle, Duration::from_secs(30));

    let url = http_url(&cluster.server.log());
    let (code, page) = curl(&format!("{url}/metrics"), &[]);
    assert_eq!(code, 200, "{page}");
    promtool_accepts(&page);
    let s = samples(&page);

    let queue: serde_json::Value =
        serde_json::from_str(&cluster.server.ok(&["queue", "--json"])).unwrap();
    let count = |state: &str| {
        queue
            .as_array()
            .unwrap()
            .iter()
            .filter(|j| j["state"] == state)
            .count() as f64
    };
    assert_eq!(
        sum(&s, "gpuq_jobs", &["state=\"RUNNING\""]),
        count("RUNNING")
    );
    assert_eq!(
        sum(&s, "gpuq_jobs", &["state=\"PENDING\""]),
        count("PENDING")
    );
    assert_eq!(count("PENDING"), 1.0, "{queue}");
    let reason = queue
        .as_array()
        .unwrap()
        .iter()
        .find(|j| j["id"].as_u64().map(|i| i.to_string()).as_deref() == Some(big.as_str()))
        .and_then(|j| j["reason_code"].as_str())
        .unwrap_or("None")
        .to_string();
    assert_eq!(
        sum(&s, "gpuq_jobs_pending", &[&format!("reason=\"{reason}\"")]),
        1.0,
        "pending by reason {reason}:\n{page}"
    );
    assert!(sum(&s, "gpuq_jobs_submitted_total", &[]) >= 3.0);
    assert!(sum(&s, "gpuq_jobs_started_total", &[]) >= 2.0);
    assert!(sum(&s, "gpuq_job_time_to_start_seconds_count", &[]) >= 2.0);
    assert!(sum(&s, "gpuq_scheduler_pass_seconds_count", &[]) >= 1.0);
    assert!(sum(&s, "gpuq_raft_log_write_seconds_count", &[]) >= 1.0);
    assert_eq!(sum(&s, "gpuq_raft_is_leader", &[]), 1.0);
    assert!(sum(&s, "gpuq_raft_commit_index", &[]) >= 1.0);

    let nodes: serde_json::Value =
        serde_json::from_str(&cluster.server.ok(&["nodes", "--json"])).unwrap();
    for n in nodes.as_array().unwrap() {
        let name = n["name"].as_str().unwrap();
        let node = format!("node=\"{name}\"");
        assert_eq!(
            sum(&s, "gpuq_node_gpus_allocated", &[&node]),
            n["gpus_used"].as_f64().unwrap(),
            "{name}:\n{page}"
        );
        assert_eq!(sum(&s, "gpuq_node_gpus", &[&node]), 4.0);
        assert!(sum(&s, "gpuq_node_heartbeat_age_seconds", &[&node]) < 10.0);
    }
    assert_eq!(sum(&s, "gpuq_node_gpus_allocated", &[]), 3.0);
    assert_eq!(sum(&s, "gpuq_nodes", &["state=\"up\""]), 2.0);

    // The agents: each GPU labelled with its holder; the busy job's GPUs
    // at 90%, the idle job's at 0; dcgm-exporter's files name the jobs.
    let mut seen = BTreeMap::new();
    for a in &cluster.agents {
        let (code, page) = curl(&format!("{}/metrics", http_url(&a.log())), &[]);
        assert_eq!(code, 200, "{page}");
        promtool_accepts(&page);
        let s = samples(&page);
        for job in [&busy, &idle] {
            let held = format!("job=\"{job}\"");
            let gpus = sum(&s, "gpuq_gpu_healthy", &[&held]);
            if gpus > 0.0 {
                let util = sum(&s, "gpuq_gpu_utilization_ratio", &[&held]) / gpus;
                seen.insert(job.clone(), (gpus, util));
                let files: Vec<String> = std::fs::read_dir(map.join(&a.name))
                    .unwrap()
                    .map(|e| std::fs::read_to_string(e.unwrap().path()).unwrap())
                    .collect();
                assert_eq!(
                    files.iter().filter(|f| f.trim() == job.as_str()).count() as f64,
                    gpus,
                    "dcgm map of {} for job {job}: {files:?}",
                    a.name
                );
            }
        }
    }
    assert_eq!(seen.get(&busy), Some(&(2.0, 0.9)), "{seen:?}");
    assert_eq!(seen.get(&idle), Some(&(1.0, 0.0)), "{seen:?}");
}

/// A port in use is a clear startup error naming the key.
#[test]
fn a_taken_http_port_stops_the_server_naming_the_key() {
    let dir = common::shared_tempdir();
    let d = dir.path();
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port();
    let cfg = d.join("server.toml");
    std::fs::write(
        &cfg,
        format!(
            "[server]\nnode_name = \"s1\"\ndata_dir = \"{0}/data\"\nsocket = \"{0}/gpuq.sock\"\n\
             listen = \"127.0.0.1:{1}\"\n",
            d.display(),
            common::free_port()
        ),
    )
    .unwrap();
    let mut child = common::gpuq_command()
        .env("GPUQ_HTTP_LISTEN", format!("127.0.0.1:{port}"))
        .args(["server", "--bootstrap", "--config"])
        .arg(&cfg)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    common::wait_for("the server to exit", Duration::from_secs(30), || {
        child.try_wait().unwrap().is_some()
    });
    let out = child.wait_with_output().unwrap();
    let log = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(!out.status.success(), "{log}");
    assert!(
        log.contains(&format!("server.http_listen = 127.0.0.1:{port}")) && log.contains("in use"),
        "{log}"
    );
    drop(taken);
}

/// `curl` with a bearer token (none when empty) and a method.
fn call(url: &str, token: &str, method: &str, body: Option<&str>) -> (u16, serde_json::Value) {
    let auth = format!("Authorization: Bearer {token}");
    let mut args = vec!["-X", method];
    if !token.is_empty() {
        args.extend(["-H", &auth]);
    }
    if let Some(b) = body {
        args.extend(["-H", "Content-Type: application/json", "--data-binary", b]);
    }
    let (code, text) = curl(url, &args);
    (code, serde_json::from_str(&text).unwrap_or_default())
}

/// Submit, list and cancel through curl with user tokens: a user's token
/// cannot cancel another's job; no token, an expired, a forged and a
/// revoked token are refused (401) and logged; a read-only token reads.
#[test]
fn the_api_takes_user_tokens_and_keeps_users_apart() {
    let dir = common::shared_tempdir();
    let c = Cluster::start(dir.path(), 1, 2);
    let url = http_url(&c.server.log());
    let jobs = format!("{url}/api/v1/jobs");
    let token = |args: &[&str]| {
        let mut full = vec!["token", "create", "--role", "user"];
        full.extend_from_slice(args);
        c.server.ok(&full).trim().to_string()
    };
    let alice = token(&["--user", "alice"]);
    let bob = token(&["--user", "bob", "--ttl", "1h"]);
    let reader = token(&["--user", "alice", "--read-only"]);
    let expiring = token(&["--user", "alice", "--ttl", "1s"]);
    assert!(alice.starts_with("gpuqapi1-"), "{alice}");

    let body = r#"{"args": ["--hold", "--gpus", "1"], "command": ["sleep", "30"]}"#;
    let (code, a) = call(&jobs, &alice, "POST", Some(body));
    assert_eq!(code, 201, "{a}");
    let a = a["id"].as_u64().unwrap();
    let (code, b) = call(&jobs, &bob, "POST", Some(body));
    assert_eq!(code, 201, "{b}");
    let b = b["id"].as_u64().unwrap();
    assert_eq!(c.job(&a.to_string())["user"], "alice");

    let (code, list) = call(&jobs, &reader, "GET", None);
    assert_eq!(code, 200, "{list}");
    let ids: Vec<u64> = list["jobs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|j| j["id"].as_u64().unwrap())
        .collect();
    assert_eq!(ids, vec![a, b]);
    let (code, who) = call(&format!("{url}/api/v1/whoami"), &reader, "GET", None);
    assert_eq!(
        (code, &who["user"], &who["read_only"]),
        (200, &"alice".into(), &true.into())
    );

    // Alice cannot cancel Bob's job; the refusal is logged.
    let (code, e) = call(&format!("{jobs}/{b}"), &alice, "DELETE", None);
    assert_eq!(code, 403, "{e}");
    assert_eq!(c.job(&b.to_string())["state"], "PENDING");
    // Reads and writes refused for what a token is not.
    // Its last character changed (to one it is not: a token ending in X
    // would otherwise be forged into itself).
    let last = if alice.ends_with('X') { "Y" } else { "X" };
    let forged = format!("{}{last}", &alice[..alice.len() - 1]);
    std::thread::sleep(Duration::from_millis(1200));
    for (what, t, want) in [
        ("no token", "", 401),
        ("forged", forged.as_str(), 401),
        ("expired", expiring.as_str(), 401),
        ("read-only", reader.as_str(), 403),
        ("junk", "hello", 401),
    ] {
        let (code, e) = call(&format!("{jobs}/{a}/cancel"), t, "POST", None);
        assert_eq!(code, want, "{what}: {e}");
        assert!(e["error"].is_string(), "{what}: {e}");
    }
    assert_eq!(c.job(&a.to_string())["state"], "PENDING");
    let log = c.server.log();
    for why in [
        "no token",
        "secret is wrong",
        "expired",
        "read-only",
        "not a gpuq API token",
    ] {
        assert!(log.contains(why), "the refusal '{why}' is logged:\n{log}");
    }
    assert!(
        log.contains("http request refused") && log.contains("user=alice"),
        "{log}"
    );

    // Alice cancels her own.
    let (code, e) = call(&format!("{jobs}/{a}"), &alice, "DELETE", None);
    assert_eq!(code, 200, "{e}");
    assert_eq!(e["ids"], serde_json::json!([a]));
    assert_eq!(c.job(&a.to_string())["state"], "CANCELLED");

    // Listed without secrets, and revoked.
    let listed = c.server.ok(&["token", "list", "--role", "user", "--json"]);
    let listed: serde_json::Value = serde_json::from_str(&listed).unwrap();
    assert_eq!(listed.as_array().unwrap().len(), 4, "{listed}");
    let secret = alice.split('.').nth(1).unwrap();
    assert!(!listed.to_string().contains(secret));
    let id = alice
        .trim_start_matches("gpuqapi1-")
        .split('.')
        .next()
        .unwrap();
    c.server.ok(&["token", "revoke", id]);
    let (code, e) = call(&jobs, &alice, "GET", None);
    assert_eq!(code, 401, "{e}");
    // An API token has no use count.
    let out = c.server.cli(&[
        "token", "create", "--role", "user", "--user", "bob", "--uses", "1",
    ]);
    assert!(!out.status.success());
}

/// The web page in headless Chromium on a cluster with jobs running: the
/// queue lists them, the GPU map shows each job on its GPUs, the
/// utilisation chart draws their GPUs under the cluster's total, and a job
/// cancelled from the page (with a token) ends CANCELLED. A screenshot is
/// kept in target/observe-web.png.
#[test]
fn the_web_page_shows_jobs_on_the_gpu_map_and_cancels() {
    let dir = common::shared_tempdir();
    let c = Cluster::start(dir.path(), 2, 4);
    let url = http_url(&c.server.log());
    let two = c.submit(&["--gpus", "2", "--", "sleep", "120"]);
    let one = c.submit(&["--gpus", "1", "--", "sleep", "120"]);
    let big = c.submit(&["--nodes", "2", "--gpus", "4", "--", "sleep", "1"]);
    c.server.ok(&[
        "admin",
        "reservation",
        "create",
        "fw",
        "--nodes",
        "n2",
        "--start",
        "now+1d",
        "--duration",
        "2h",
        "--maint",
    ]);
    c.wait_started(&two, Duration::from_secs(30));
    c.wait_started(&one, Duration::from_secs(30));
    let Some(mut page) = common::browser::Browser::open(&format!("{url}/")) else {
        assert!(
            std::env::var_os("CI").is_none(),
            "chromium is missing and CI installs it"
        );
        eprintln!("NOT RUN: the web page test needs Debian's chromium");
        return;
    };
    let first = page.wait(
        "the first render",
        "document.body.dataset.loaded === 'yes'",
        Duration::from_secs(30),
    );
    eprintln!(
        "figure: the page's first render took {} ms",
        first.as_millis()
    );
    page.wait(
        "the running jobs on the GPU map",
        &format!(
            "document.querySelectorAll('.gpu[data-job=\"{two}\"]').length === 2 && \
             document.querySelectorAll('.gpu[data-job=\"{one}\"]').length === 1"
        ),
        Duration::from_secs(15),
    );
    let rows = page.eval("[...document.querySelectorAll('#queue tbody tr')].map(r => r.dataset.job + ' ' + r.cells[3].textContent + ' ' + r.cells[6].textContent)");
    let rows: Vec<String> = serde_json::from_value(rows).unwrap();
    assert!(
        rows.iter()
            .any(|r| r.starts_with(&format!("{two} RUNNING"))),
        "{rows:?}"
    );
    assert!(
        rows.iter()
            .any(|r| r.starts_with(&format!("{big} PENDING"))),
        "{rows:?}"
    );
    let gpus = page.eval("document.querySelectorAll('#nodes .gpu').length");
    assert_eq!(gpus, 8);
    let resv = page
        .eval("[...document.querySelectorAll('#reservations tbody tr')].map(r => r.textContent)");
    let resv: Vec<String> = serde_json::from_value(resv).unwrap();
    assert!(
        resv.len() == 1 && resv[0].starts_with("fwplanned") && resv[0].contains("n2maint"),
        "{resv:?}"
    );
    // The chart: a bar per bucket of the last day, the last ones holding
    // the running jobs' GPUs, under a line at the cluster's 8.
    page.wait(
        "the running jobs on the utilisation chart",
        "[...document.querySelectorAll('#utilisation svg rect.bucket')]\
         .some(r => Number(r.getAttribute('data-gpus')) > 0)",
        Duration::from_secs(15),
    );
    let bars = page.eval("document.querySelectorAll('#utilisation svg rect.bucket').length");
    assert_eq!(bars, 96);
    let total = page
        .eval("document.querySelector('#utilisation svg line.total').getAttribute('data-gpus')");
    assert_eq!(total, "8");
    assert_eq!(page.eval("document.getElementById('error').hidden"), true);
    let png = page.screenshot();
    let shot = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/observe-web.png");
    std::fs::write(&shot, &png).unwrap();
    assert!(png.starts_with(b"\x89PNG"), "a PNG in {}", shot.display());

    // Without a token there is nothing to click; with one, cancel.
    assert_eq!(
        page.eval("document.querySelectorAll('button.cancel').length"),
        0
    );
    let token = c.server.ok(&["token", "create", "--role", "user"]);
    page.eval(&format!(
        "document.getElementById('token').value = {:?}; \
         document.getElementById('token-form').requestSubmit(); true",
        token.trim()
    ));
    let button = format!("button.cancel[data-job=\"{one}\"]");
    page.wait(
        "a cancel button",
        &format!("!!document.querySelector('{button}')"),
        Duration::from_secs(15),
    );
    page.eval(&format!("document.querySelector('{button}').click(); true"));
    c.wait_state(&one, "CANCELLED", Duration::from_secs(30));
    assert_eq!(c.job(&two)["state"], "RUNNING");
}

/// `GET /api/v1/utilisation` (loopback, no token): the last hour in 60
/// buckets adds up to exactly the running job's GPU-milliseconds since its
/// start, under the cluster's total; defaults of 24 h in 96 buckets; a
/// parameter out of range is refused with 400 naming it and the range.
#[test]
fn the_utilisation_route_counts_running_jobs_and_refuses_bad_parameters() {
    let dir = common::shared_tempdir();
    let c = Cluster::start(dir.path(), 1, 4);
    let url = http_url(&c.server.log());
    let route = format!("{url}/api/v1/utilisation");
    let job = c.submit(&["--gpus", "2", "--", "sleep", "120"]);
    c.wait_started(&job, Duration::from_secs(30));
    let started = c.job(&job)["start_time"].as_u64().unwrap();

    let (code, u) = call(&format!("{route}?hours=1&buckets=60"), "", "GET", None);
    assert_eq!(code, 200, "{u}");
    assert_eq!(
        (&u["total_gpus"], &u["bucket_ms"]),
        (&4.into(), &60_000.into())
    );
    let allocated: Vec<f64> = serde_json::from_value(u["allocated"].clone()).unwrap();
    assert_eq!(allocated.len(), 60);
    assert!(allocated[59] > 0.0, "{allocated:?}");
    let now = u["from"].as_u64().unwrap() + 3_600_000;
    let gpu_ms: f64 = allocated.iter().map(|g| g * 60_000.0).sum();
    let want = 2.0 * now.saturating_sub(started) as f64;
    assert!(
        want > 0.0 && (gpu_ms - want).abs() < 1.0,
        "{gpu_ms} GPU-ms, want {want}"
    );

    let (code, u) = call(&route, "", "GET", None);
    assert_eq!(code, 200, "{u}");
    assert_eq!(u["allocated"].as_array().map(Vec::len), Some(96));
    assert_eq!(u["bucket_ms"], 15 * 60_000);
    for (query, name, range) in [
        ("hours=0", "hours", "from 1 to 720"),
        ("hours=721", "hours", "from 1 to 720"),
        ("hours=day", "hours", "from 1 to 720"),
        ("buckets=0", "buckets", "from 1 to 1000"),
        ("hours=2&buckets=1001", "buckets", "from 1 to 1000"),
    ] {
        let (code, e) = call(&format!("{route}?{query}"), "", "GET", None);
        assert_eq!(code, 400, "{query}: {e}");
        let why = e["error"].as_str().unwrap_or_default();
        assert!(why.starts_with(name) && why.contains(range), "{query}: {e}");
    }
}

/// Beyond loopback the server's HTTP port is TLS with its certificate
/// (named for its node name, signed by the cluster CA), and a request from
/// another address needs a token even to read.
#[test]
fn beyond_loopback_the_http_port_is_tls_and_wants_a_token() {
    let dir = common::shared_tempdir();
    let d = dir.path();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let cfg = d.join("server.toml");
    std::fs::write(
        &cfg,
        format!(
            "[server]\nnode_name = \"s1\"\ndata_dir = \"{0}/data\"\nsocket = \"{0}/gpuq.sock\"\n\
             listen = \"127.0.0.1:{1}\"\n",
            d.display(),
            common::free_port()
        ),
    )
    .unwrap();
    let log = std::fs::File::create(d.join("server.log")).unwrap();
    let mut child = common::gpuq_command()
        .env("GPUQ_HTTP_LISTEN", format!("0.0.0.0:{port}"))
        .args(["server", "--bootstrap", "--config"])
        .arg(&cfg)
        .stderr(log)
        .spawn()
        .unwrap();
    let read_log = || std::fs::read_to_string(d.join("server.log")).unwrap_or_default();
    common::wait_for("the server", Duration::from_secs(30), || {
        read_log().contains("server ready")
    });
    assert!(
        read_log().contains(&format!("http=https://0.0.0.0:{port}")),
        "{}",
        read_log()
    );
    let ca = d.join("data/tls/ca.crt");
    let resolve = format!("s1:{port}:127.0.0.1");
    let https = format!("https://s1:{port}/healthz");
    let (code, body) = curl(
        &https,
        &["--cacert", ca.to_str().unwrap(), "--resolve", &resolve],
    );
    assert_eq!(code, 200, "{body}");
    // Plain HTTP gets no answer; an unknown CA is refused by the client.
    let (code, _) = curl(&format!("http://127.0.0.1:{port}/healthz"), &[]);
    assert_ne!(code, 200);
    let (code, _) = curl(&https, &["--resolve", &resolve]);
    assert_ne!(code, 200);
    // From this host's other address, when it has one: a token is needed.
    let other = std::net::UdpSocket::bind("0.0.0.0:0").and_then(|s| {
        s.connect("192.0.2.1:9")?;
        s.local_addr()
    });
    if let Some(ip) = other.ok().map(|a| a.ip()).filter(|ip| !ip.is_loopback()) {
        let resolve = format!("s1:{port}:{ip}");
        let (code, body) = curl(
            &format!("https://s1:{port}/api/v1/jobs"),
            &["--cacert", ca.to_str().unwrap(), "--resolve", &resolve],
        );
        assert_eq!(code, 401, "{body}");
    }
    let _ = child.kill();
    let _ = child.wait();
}

/// A job holding idle GPUs (a sleep) is flagged once they were idle for
/// the servers' idle_gpu_secs; a busy one (the fake GPUs' controllable
/// load) is not, and `gpuq show` reports both jobs' mean utilisation.
#[test]
fn idle_gpu_jobs_are_flagged_and_busy_ones_are_not() {
    let dir = common::shared_tempdir();
    let c = Cluster::start_with_config(dir.path(), 1, 4, 10, "idle_gpu_secs = 3");
    let busy = c.submit(&[
        "--gpus",
        "2",
        "--export=ALL,GPUQ_FAKE_GPU_UTIL=80",
        "--",
        "sleep",
        "60",
    ]);
    let idle = c.submit(&["--gpus", "1", "--", "sleep", "60"]);
    c.wait_started(&busy, Duration::from_secs(30));
    c.wait_started(&idle, Duration::from_secs(30));
    common::wait_for("the idle job flagged", Duration::from_secs(30), || {
        c.job(&idle)["gpu_use"]["idle"] == true
    });
    let b = c.job(&busy);
    assert_eq!(b["gpu_use"]["mean_util_pct"], 80, "{b}");
    assert!(b["gpu_use"]["idle"].is_null(), "{b}");
    let i = c.job(&idle);
    assert_eq!(i["gpu_use"]["mean_util_pct"], 0, "{i}");
    let shown = c.server.ok(&["show", &idle]);
    assert!(shown.contains("GpuIdle"), "{shown}");
    let queue = c.server.ok(&["queue"]);
    let line = |id: &str| {
        queue
            .lines()
            .find(|l| l.split_whitespace().next() == Some(id))
            .unwrap_or_default()
            .to_string()
    };
    assert!(line(&idle).contains("GPUs idle for"), "{queue}");
    assert!(!line(&busy).contains("idle"), "{queue}");

    // Once over, the use stays with the job: the leader puts its agent's
    // last report into the command carrying the ends.
    c.server.ok(&["cancel", &busy]);
    let ended = c.wait_state(&busy, "CANCELLED", Duration::from_secs(30));
    assert_eq!(ended["gpu_use"]["mean_util_pct"], 80, "{ended}");
    let acct: serde_json::Value = serde_json::from_str(&c.server.ok(&["acct", "--json"])).unwrap();
    let row = acct
        .as_array()
        .and_then(|rows| {
            rows.iter()
                .find(|r| r["id"].as_u64().map(|i| i.to_string()) == Some(busy.clone()))
        })
        .cloned()
        .unwrap_or_default();
    assert_eq!(row["gpu_use"]["mean_util_pct"], 80, "{acct}");
    let table = c.server.ok(&["acct"]);
    let acct_line = table
        .lines()
        .find(|l| l.split_whitespace().next() == Some(busy.as_str()))
        .unwrap_or_default();
    assert!(acct_line.contains("80%"), "{table}");
}
