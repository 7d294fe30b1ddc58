//! Services end to end: a server and an agent as real processes, replicas
//! as real jobs with their service's environment and ports, replaced when
//! they end (later and later in a crash loop), scaled, kept across a server
//! restart, and deleted; refusals name the input.

mod common;

use std::time::Duration;

use common::{stderr, wait_for, Cluster};

const LONG: Duration = Duration::from_secs(60);

/// An HTTP check of `/` every second, failing after two misses past a
/// one-second grace: quick enough for a test to see both verdicts.
const QUICK_HTTP_CHECK: [&str; 8] = [
    "--health-http",
    "/",
    "--health-interval",
    "1s",
    "--health-grace",
    "1s",
    "--health-failures",
    "2",
];

fn show(c: &Cluster, name: &str) -> serde_json::Value {
    let v: serde_json::Value =
        serde_json::from_str(&c.server.ok(&["service", "show", name, "--json"])).unwrap();
    v[0].clone()
}

/// Replica `index`'s field `key`.
fn replica(c: &Cluster, name: &str, index: usize, key: &str) -> serde_json::Value {
    show(c, name)["slots"][index][key].clone()
}

/// Gives the cluster's jobs ports no other test's cluster on this host
/// uses: a health check on 127.0.0.1 must reach its own replica.
fn own_ports(c: &Cluster, first: u16) {
    c.server
        .ok(&["admin", "ports", "set", &format!("{first}-{}", first + 99)]);
}

fn endpoints(c: &Cluster, name: &str) -> Vec<String> {
    c.server
        .ok(&["service", "endpoints", name])
        .lines()
        .map(str::to_string)
        .collect()
}

#[test]
fn replicas_run_as_jobs_are_replaced_when_they_end_and_follow_scale_and_delete() {
    let dir = common::shared_tempdir();
    let mut c = Cluster::start(dir.path(), 1, 4);
    let w = dir.path().join("w");
    std::fs::create_dir_all(&w).unwrap();
    let wd = w.to_str().unwrap();

    // Refusals name the input, and create nothing.
    for (args, says) in [
        (vec!["Web"], "lowercase"),
        (vec!["web", "--replicas", "5000"], "at most 1000"),
        (vec!["web", "--gpus-per-node", "9"], "largest node has 4"),
        (vec!["web", "--restart-delay", "soon"], "--restart-delay"),
    ] {
        let mut all = vec!["service", "create"];
        all.extend(args);
        all.extend(["--", "sleep", "1"]);
        let out = c.server.cli(&all);
        assert_eq!(out.status.code(), Some(1), "{all:?}: {}", stderr(&out));
        assert!(stderr(&out).contains(says), "{all:?}: {}", stderr(&out));
    }
    let out = c.server.cli(&["service", "scale", "nope", "2"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains("service nope does not exist"),
        "{}",
        stderr(&out)
    );
    assert_eq!(c.server.ok(&["service", "list", "--json"]).trim(), "[]");

    // Two replicas, each writing what it was given, then serving.
    let script = format!(
        "echo \"$GPUQ_SERVICE $GPUQ_REPLICA $PORT\" > {wd}/r$GPUQ_REPLICA-$GPUQ_JOB_ID; exec sleep 300"
    );
    let out = c.server.ok(&[
        "service",
        "create",
        "web",
        "--replicas",
        "2",
        "--gpus",
        "1",
        "--restart-delay",
        "1s",
        "-D",
        wd,
        "--wrap",
        &script,
    ]);
    assert!(out.contains("service web created"), "{out}");
    let dup = c.server.cli(&["service", "create", "web", "--", "true"]);
    assert!(stderr(&dup).contains("exists already"), "{}", stderr(&dup));
    wait_for("two endpoints", LONG, || endpoints(&c, "web").len() == 2);
    let eps = endpoints(&c, "web");
    let ports: Vec<&str> = eps.iter().map(|e| e.rsplit(':').next().unwrap()).collect();
    assert_ne!(ports[0], ports[1], "each replica has its own port: {eps:?}");
    for i in 0..2 {
        let job = replica(&c, "web", i, "job").to_string();
        let file = w.join(format!("r{i}-{job}"));
        wait_for("the replica's file", LONG, || file.exists());
        let said = std::fs::read_to_string(&file).unwrap();
        let fields: Vec<&str> = said.split_whitespace().collect();
        assert_eq!(fields[..2], ["web", &i.to_string()[..]], "{said}");
        assert!(ports.contains(&fields[2]), "{said} vs {eps:?}");
    }
    // The replicas are jobs in the queue, named NAME-INDEX.
    let queue = c.server.ok(&["queue"]);
    assert!(
        queue.contains("web-0") && queue.contains("web-1"),
        "{queue}"
    );

    // A replica that ends (here: cancelled as a user would) is replaced.
    let first = replica(&c, "web", 0, "job");
    c.server.ok(&["cancel", &first.to_string()]);
    wait_for("replica 0 replaced and running", LONG, || {
        let r = &show(&c, "web")["slots"][0];
        r["job"] != first && r["state"] == "RUNNING"
    });
    assert_eq!(replica(&c, "web", 0, "restarts"), 1);

    // The service outlives its server's restart.
    c.server.kill();
    c.server.start();
    assert_eq!(show(&c, "web")["replicas"], 2);
    wait_for("two endpoints after the restart", LONG, || {
        endpoints(&c, "web").len() == 2
    });

    // A watcher sees each change of the list, and ends with the service.
    let mut watch = common::gpuq_command()
        .args(["service", "endpoints", "web", "--watch", "--json"])
        .env("GPUQ_SOCKET", &c.server.socket)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = std::io::BufRead::lines(std::io::BufReader::new(watch.stdout.take().unwrap()));
    let mut next_list = || -> Vec<serde_json::Value> {
        serde_json::from_str(&lines.next().unwrap().unwrap()).unwrap()
    };
    assert_eq!(next_list().len(), 2);

    // Scale down: the higher index stops and is not replaced.
    let second = replica(&c, "web", 1, "job").to_string();
    c.server.ok(&["service", "scale", "web", "1"]);
    c.wait_state(&second, "CANCELLED", LONG);
    wait_for("one endpoint", LONG, || endpoints(&c, "web").len() == 1);
    assert_eq!(show(&c, "web")["slots"].as_array().map(Vec::len), Some(1));
    assert_eq!(next_list().len(), 1, "the watcher saw the scale-down");

    // A replica that keeps failing at once is restarted later and later.
    c.server.ok(&[
        "service",
        "create",
        "crash",
        "--restart-delay",
        "1s",
        "--",
        "false",
    ]);
    wait_for("a crash loop", LONG, || {
        replica(&c, "crash", 0, "reason")
            .as_str()
            .is_some_and(|r| r.contains("crash loop"))
    });
    let list = c.server.ok(&["service", "list"]);
    assert!(list.contains("crash") && list.contains("1/1"), "{list}");

    // Delete: every replica stops; nothing replaces them.
    let last = replica(&c, "web", 0, "job").to_string();
    c.server.ok(&["service", "delete", "web"]);
    c.server.ok(&["service", "delete", "crash"]);
    c.wait_state(&last, "CANCELLED", LONG);
    assert_eq!(c.server.ok(&["service", "list", "--json"]).trim(), "[]");
    let ended = watch.wait().unwrap();
    assert!(
        ended.success(),
        "the watcher ends with its service: {ended}"
    );
    std::thread::sleep(Duration::from_secs(2));
    let queue = c.server.ok(&["queue"]);
    assert!(
        !queue.contains("web-") && !queue.contains("crash-"),
        "{queue}"
    );
}

#[test]
fn health_checks_gate_endpoints_and_replace_replicas_that_fail_them() {
    let dir = common::shared_tempdir();
    let c = Cluster::start(dir.path(), 1, 4);
    own_ports(&c, 43100);
    let check = QUICK_HTTP_CHECK;
    let bad = c.server.cli(&[
        "service",
        "create",
        "x",
        "--health-http",
        "healthz",
        "--",
        "true",
    ]);
    assert_eq!(bad.status.code(), Some(1));
    assert!(stderr(&bad).contains("--health-http"), "{}", stderr(&bad));

    // Serves on its PORT: healthy, and an endpoint.
    let mut args = vec!["service", "create", "web"];
    args.extend(check);
    args.extend([
        "-D",
        dir.path().to_str().unwrap(),
        "--wrap",
        "exec python3 -m http.server $PORT --bind 127.0.0.1",
    ]);
    c.server.ok(&args);
    wait_for("the server healthy", LONG, || {
        replica(&c, "web", 0, "healthy") == true
    });
    assert_eq!(endpoints(&c, "web").len(), 1);

    // The same over HTTP: read anonymously on loopback; a scale needs a
    // token.
    let url = common::http_url_in(&c.server.log()).expect("the server's http= address");
    let curl = |args: &[&str]| {
        let out = std::process::Command::new("curl")
            .args(["-s", "-w", "\n%{http_code}"])
            .args(args)
            .output()
            .expect("curl");
        let text = String::from_utf8_lossy(&out.stdout).to_string();
        let (body, code) = text.rsplit_once('\n').unwrap_or_default();
        (code.to_string(), body.to_string())
    };
    let (code, body) = curl(&[&format!("{url}/api/v1/services/web")]);
    assert_eq!(code, "200", "{body}");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert!(v["services"][0]["slots"][0]["endpoint"].is_string(), "{v}");
    let scale = format!("{url}/api/v1/services/web/scale?replicas=2");
    let (code, _) = curl(&["-X", "POST", &scale]);
    assert_eq!(code, "401");
    let token = c.server.ok(&["token", "create", "--role", "user"]);
    let auth = format!("Authorization: Bearer {}", token.trim());
    let (code, body) = curl(&["-X", "POST", "-H", &auth, &scale]);
    assert_eq!(code, "200", "{body}");
    assert_eq!(show(&c, "web")["replicas"], 2);
    let (code, body) = curl(&["-H", &auth, &format!("{url}/api/v1/services/nope")]);
    assert_eq!(code, "404", "{body}");

    // A command check: healthy once the replica made its file.
    let ready_dir = dir.path().join("ready");
    std::fs::create_dir_all(&ready_dir).unwrap();
    c.server.ok(&[
        "service",
        "create",
        "cmd",
        "--health-cmd",
        "test -e ready-$GPUQ_REPLICA",
        "--health-interval",
        "1s",
        "--health-grace",
        "1s",
        "-D",
        ready_dir.to_str().unwrap(),
        "--wrap",
        "sleep 2; touch ready-$GPUQ_REPLICA; exec sleep 300",
    ]);
    wait_for("the replica running", LONG, || {
        replica(&c, "cmd", 0, "state") == "RUNNING"
    });
    assert!(
        endpoints(&c, "cmd").is_empty(),
        "not before its file exists"
    );
    wait_for("the command check passing", LONG, || {
        replica(&c, "cmd", 0, "healthy") == true
    });
    assert_eq!(endpoints(&c, "cmd").len(), 1);
    let both = c.server.cli(&[
        "service",
        "create",
        "both",
        "--health-cmd",
        "true",
        "--health-http",
        "/",
        "--",
        "true",
    ]);
    assert_eq!(both.status.code(), Some(1), "{}", stderr(&both));

    // Never listens: never an endpoint, stopped after two failed checks
    // past its grace, and replaced.
    let mut args = vec!["service", "create", "deaf"];
    args.extend(check);
    args.extend(["--restart-delay", "1s", "--", "sleep", "300"]);
    c.server.ok(&args);
    let first = replica(&c, "deaf", 0, "job");
    wait_for("the deaf replica running", LONG, || {
        replica(&c, "deaf", 0, "state") == "RUNNING"
    });
    assert!(endpoints(&c, "deaf").is_empty());
    let ended = c.wait_state(&first.to_string(), "CANCELLED", LONG);
    let reason = ended["reason"].as_str().unwrap_or_default();
    assert!(
        reason.contains("health check") && reason.contains("2 failed checks"),
        "{ended}"
    );
    wait_for("the deaf replica replaced", LONG, || {
        replica(&c, "deaf", 0, "job") != first
    });
    assert!(endpoints(&c, "deaf").is_empty());
}

#[test]
fn an_update_rolls_healthy_replicas_halts_on_a_broken_version_and_rolls_back() {
    let dir = common::shared_tempdir();
    let c = Cluster::start(dir.path(), 1, 8);
    own_ports(&c, 43200);
    let wd = dir.path().to_str().unwrap();
    let serve =
        |version: &str| format!("V={version}; exec python3 -m http.server $PORT --bind 127.0.0.1");
    let check = QUICK_HTTP_CHECK;
    let mut args = vec!["service", "create", "web", "--replicas", "2", "-D", wd];
    args.extend(check);
    let v1 = serve("1");
    args.extend(["--wrap", &v1]);
    c.server.ok(&args);
    wait_for("two healthy replicas", LONG, || {
        endpoints(&c, "web").len() == 2
    });

    // Version 2 rolls one replica at a time; two always serve.
    let v2 = serve("2");
    c.server
        .ok(&["service", "update", "web", "-D", wd, "--wrap", &v2]);
    wait_for("the roll to version 2 done", LONG, || {
        assert!(
            endpoints(&c, "web").len() >= 2,
            "a replica stopped before its successor served"
        );
        let s = show(&c, "web");
        s["version"] == 2
            && s["roll"].is_null()
            && s["slots"].as_array().is_some_and(|v| {
                v.iter()
                    .all(|r| r["version"] == 2 && r["endpoint"].is_string())
            })
    });

    // Version 3 never serves: its first replica fails its checks, the roll
    // halts, and version 2 goes on serving.
    c.server
        .ok(&["service", "update", "web", "--", "sleep", "300"]);
    wait_for("the roll halted", LONG, || {
        show(&c, "web")["roll"]
            .as_str()
            .is_some_and(|r| r.starts_with("halted") && r.contains("health check"))
    });
    assert_eq!(endpoints(&c, "web").len(), 2);
    let shown = c.server.ok(&["service", "show", "web"]);
    assert!(shown.contains("Update: halted"), "{shown}");

    // Back to version 2's spec (as version 4).
    c.server.ok(&["service", "rollback", "web"]);
    wait_for("the rollback done", LONG, || {
        let s = show(&c, "web");
        s["version"] == 4 && s["roll"].is_null() && endpoints(&c, "web").len() == 2
    });
    let out = c.server.cli(&["service", "rollback", "nope"]);
    assert_eq!(out.status.code(), Some(1));
}

#[test]
fn applying_a_file_creates_changes_only_what_differs_and_twice_changes_nothing() {
    let dir = common::shared_tempdir();
    let c = Cluster::start(dir.path(), 1, 4);
    let wd = dir.path().to_str().unwrap();
    let file = dir.path().join("web.toml");
    let write = |replicas: u32, version: &str| {
        let text = format!(
            "name = \"web\"\nreplicas = {replicas}\nrestart_delay = \"1s\"\n\
             job = \"--gpus 1 -D {wd} --wrap 'V={version}; exec sleep 300'\"\n"
        );
        std::fs::write(&file, text).unwrap();
    };
    let apply = || c.server.ok(&["service", "apply", file.to_str().unwrap()]);
    write(1, "1");
    assert!(apply().contains("created with 1 replicas"));
    assert!(apply().contains("unchanged"), "the same file twice");
    write(2, "1");
    let out = apply();
    assert!(
        out.contains("replicas 1 -> 2") && !out.contains("version"),
        "{out}"
    );
    wait_for("two replicas running", LONG, || {
        endpoints(&c, "web").len() == 2
    });
    write(2, "2");
    assert!(apply().contains("version 2"));
    wait_for("the roll done", LONG, || {
        let s = show(&c, "web");
        s["roll"].is_null()
            && s["slots"]
                .as_array()
                .is_some_and(|v| v.iter().all(|r| r["version"] == 2))
    });
    assert!(apply().contains("unchanged"));

    std::fs::write(&file, "name = \"web\"\nreplica = 2\njob = \"-- true\"\n").unwrap();
    let out = c.server.cli(&["service", "apply", file.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains("replica"), "{}", stderr(&out));

    // A health check that can never pass is refused, and nothing is made.
    for bad in [
        vec!["--health-http", "healthz"],
        vec!["--health-cmd", " "],
        vec!["--health-http", "/h", "--health-interval", "0s"],
    ] {
        let mut args = vec!["service", "create", "sick"];
        args.extend(bad.iter().copied());
        args.extend(["--", "true"]);
        let out = c.server.cli(&args);
        assert_eq!(out.status.code(), Some(1), "{bad:?}: {}", stderr(&out));
        assert!(
            stderr(&out).contains("--health"),
            "{bad:?}: {}",
            stderr(&out)
        );
    }
    assert!(!c.server.ok(&["service", "list"]).contains("sick"));
    // More replicas than the cluster holds: accepted, and the ones that
    // cannot run say why.
    c.server.ok(&[
        "service",
        "create",
        "big",
        "--replicas",
        "3",
        "--gpus",
        "4",
        "--",
        "sleep",
        "300",
    ]);
    wait_for("the pending replicas' reasons", LONG, || {
        let slots = show(&c, "big")["slots"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        slots.len() == 3
            && slots.iter().all(|r| {
                r["state"] != "PENDING"
                    || r["reason"].as_str().is_some_and(|why| {
                        why.contains("resources") || why.contains("higher-priority")
                    })
            })
            && slots.iter().any(|r| r["state"] == "PENDING")
    });
}

#[test]
fn a_service_of_a_higher_qos_preempts_batch_work_and_is_accounted() {
    let dir = common::shared_tempdir();
    let c = Cluster::start(dir.path(), 1, 2);
    c.server
        .ok(&["admin", "qos", "add", "batch", "--preempt-mode", "requeue"]);
    c.server.ok(&[
        "admin",
        "qos",
        "add",
        "serving",
        "--priority",
        "10",
        "--preempts",
        "batch",
    ]);
    let batch = c.submit(&["--qos", "batch", "--gpus", "2", "--", "sleep", "300"]);
    c.wait_started(&batch, LONG);
    c.server.ok(&[
        "service", "create", "web", "--qos", "serving", "--gpus", "1", "--", "sleep", "300",
    ]);
    // The replica takes a GPU from the batch job, which goes back to the
    // queue with the same id.
    wait_for("the replica running", LONG, || {
        replica(&c, "web", 0, "state") == "RUNNING"
    });
    let b = c.job(&batch);
    assert!(b["state"] == "PENDING" || b["state"] == "COMPLETING", "{b}");
    // Its GPU-hours are a job's: deleting the service ends the replica,
    // and accounting has it.
    let job = replica(&c, "web", 0, "job").to_string();
    c.server.ok(&["service", "delete", "web"]);
    c.wait_state(&job, "CANCELLED", LONG);
    let acct = c.server.ok(&["acct"]);
    assert!(
        acct.lines()
            .any(|l| l.split_whitespace().next() == Some(job.as_str())),
        "{acct}"
    );
}

#[test]
fn a_replica_whose_node_is_lost_moves_to_another_node_after_the_node_ttl() {
    let dir = common::shared_tempdir();
    // Two 4-GPU nodes, declared down after 3 s of silence; the replica
    // takes a whole node, so it can only move to the other one.
    let mut c = Cluster::start_with_ttl(dir.path(), 2, 4, 3);
    c.server.ok(&[
        "service",
        "create",
        "web",
        "--gpus-per-node",
        "4",
        "--restart-delay",
        "1s",
        "--",
        "sleep",
        "300",
    ]);
    wait_for("the replica running", LONG, || {
        replica(&c, "web", 0, "state") == "RUNNING"
    });
    let lost = replica(&c, "web", 0, "node").as_str().unwrap().to_string();
    let i = c.agents.iter().position(|a| a.name == lost).unwrap();
    c.agents[i].kill();
    wait_for("the replica running on the other node", LONG, || {
        let r = &show(&c, "web")["slots"][0];
        r["state"] == "RUNNING" && r["node"].is_string() && r["node"] != lost.as_str()
    });
    let moved = replica(&c, "web", 0, "node");
    let eps = endpoints(&c, "web");
    assert_eq!(eps.len(), 1, "{eps:?}");
    let nodes: serde_json::Value =
        serde_json::from_str(&c.server.ok(&["nodes", "--json"])).unwrap();
    let lost_node = nodes
        .as_array()
        .and_then(|ns| ns.iter().find(|n| n["name"] == lost.as_str()))
        .cloned()
        .unwrap_or_default();
    assert_ne!(lost_node["connected"], true, "{lost_node}");
    assert_ne!(moved, lost.as_str());
}

#[test]
fn named_ports_give_each_replica_its_own_port_variables_and_endpoints() {
    let dir = common::shared_tempdir();
    let c = Cluster::start(dir.path(), 1, 4);
    let w = dir.path().join("w");
    std::fs::create_dir_all(&w).unwrap();
    let wd = w.to_str().unwrap();
    for (port, says) in [("9000", "with a letter"), ("a-b", "with a letter")] {
        let out = c
            .server
            .cli(&["service", "create", "bad", "--port", port, "--", "true"]);
        assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
        assert!(stderr(&out).contains(says), "{}", stderr(&out));
    }
    let out = c.server.cli(&[
        "service", "create", "bad", "--port", "http", "--port", "HTTP", "--", "true",
    ]);
    assert!(stderr(&out).contains("given twice"), "{}", stderr(&out));
    assert_eq!(c.server.ok(&["service", "list", "--json"]).trim(), "[]");

    let script =
        format!("echo \"$PORT $PORT_METRICS $PORT_ADMIN\" > {wd}/r$GPUQ_REPLICA; exec sleep 300");
    c.server.ok(&[
        "service",
        "create",
        "web",
        "--replicas",
        "2",
        "--port",
        "metrics",
        "--port",
        "admin",
        "--wrap",
        &script,
    ]);
    wait_for("two endpoints", LONG, || endpoints(&c, "web").len() == 2);
    let mut ports = Vec::new();
    for i in 0..2 {
        let file = w.join(format!("r{i}"));
        wait_for("the replica's file", LONG, || {
            std::fs::read_to_string(&file).is_ok_and(|t| t.ends_with('\n'))
        });
        let said = std::fs::read_to_string(&file).unwrap();
        let fields: Vec<u16> = said
            .split_whitespace()
            .map(|p| p.parse().unwrap())
            .collect();
        assert_eq!(fields.len(), 3, "PORT, PORT_METRICS and PORT_ADMIN: {said}");
        ports.extend(fields);
    }
    let unique: std::collections::BTreeSet<_> = ports.iter().collect();
    assert_eq!(
        unique.len(),
        6,
        "each port on the node is its own: {ports:?}"
    );

    // The endpoints list them: NAME=host:port after each replica's.
    for line in endpoints(&c, "web") {
        assert!(
            line.contains(" admin=") && line.contains(" metrics="),
            "{line}"
        );
    }
    let json: serde_json::Value =
        serde_json::from_str(&c.server.ok(&["service", "endpoints", "web", "--json"])).unwrap();
    let first = &json[0];
    let metrics = first["ports"]["metrics"].as_str().unwrap_or_default();
    let port: u16 = metrics.rsplit(':').next().unwrap().parse().unwrap();
    assert!(ports.contains(&port), "{json}");
    assert!(first["endpoint"].is_string(), "{json}");
}

#[test]
fn a_leader_failover_loses_no_service_and_its_replicas_keep_running() {
    let dir = common::shared_tempdir();
    let root = dir.path().join("servers");
    let mut set = common::ServerSet::start_with(&root, 3, common::nemesis::RAFT_FAST);
    let li = set.leader();
    let token = set.servers[li].ok(&["token", "create"]).trim().to_string();
    let _agent = common::Agent::start(&set.servers[li], &dir.path().join("n1"), "n1", 4, &token);
    let w = dir.path().join("w");
    std::fs::create_dir_all(&w).unwrap();
    let starts = w.join("starts");
    let script = format!("echo $GPUQ_JOB_ID >> {}; exec sleep 300", starts.display());
    set.servers[li].ok(&[
        "service",
        "create",
        "web",
        "--replicas",
        "2",
        "--restart-delay",
        "1s",
        "--wrap",
        &script,
    ]);
    let read = |s: &common::Server| -> serde_json::Value {
        let out = s.cli(&["service", "show", "web", "--json"]);
        serde_json::from_slice::<serde_json::Value>(&out.stdout).unwrap_or_default()[0].clone()
    };
    let serving = |v: &serde_json::Value| {
        v["slots"].as_array().map_or(0, |s| {
            s.iter().filter(|r| r["endpoint"].is_string()).count()
        })
    };
    wait_for("two replicas running", LONG, || {
        serving(&read(&set.servers[li])) == 2
    });
    wait_for("both replicas started", LONG, || {
        std::fs::read_to_string(&starts).is_ok_and(|t| t.lines().count() == 2)
    });
    let jobs = |v: &serde_json::Value| -> Vec<serde_json::Value> {
        v["slots"]
            .as_array()
            .map(|s| s.iter().map(|r| r["job"].clone()).collect())
            .unwrap_or_default()
    };
    let before = jobs(&read(&set.servers[li]));

    // The leader dies: the new one has the service, its replicas are the
    // same jobs, and none of them was started again.
    set.servers[li].kill();
    let nl = set.leader();
    assert_ne!(nl, li);
    let after = read(&set.servers[nl]);
    assert_eq!(after["replicas"], 2, "{after}");
    assert_eq!(jobs(&after), before, "{after}");
    assert_eq!(serving(&after), 2, "{after}");
    assert_eq!(
        std::fs::read_to_string(&starts).unwrap().lines().count(),
        2,
        "no replica restarted"
    );
    // And it still takes changes: a third replica starts.
    set.servers[nl].ok(&["service", "scale", "web", "3"]);
    wait_for("three replicas running", LONG, || {
        serving(&read(&set.servers[nl])) == 3
    });
    wait_for("the new replica started, and no other", LONG, || {
        std::fs::read_to_string(&starts).is_ok_and(|t| t.lines().count() == 3)
    });
    let after = read(&set.servers[nl]);
    assert_eq!(jobs(&after)[..2], before[..], "{after}");
}
