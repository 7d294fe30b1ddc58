//! Node groups end to end (`gpuq admin nodegroup`): a server with no nodes,
//! a group whose resume command starts real `gpuq agent` processes with
//! fake GPUs under the names it is given, and whose suspend command kills
//! them. Demand for four 8-GPU nodes calls it once with four names; the
//! agents join and the jobs run; idle, they are suspended; a node that
//! never joins is given up on and the job runs on another.

mod common;

use std::path::Path;
use std::time::Duration;

use common::{gpuq_bin, stderr, Cluster};

const LONG: Duration = Duration::from_secs(90);

/// The resume script: starts an agent per name (except those listed in
/// `skip`), each in its own dir, and logs the call.
fn resume_script(dir: &Path, join: &str, token: &str) -> String {
    let d = dir.display();
    format!(
        r#"echo "$GPUQ_NODE_COUNT $1" >> {d}/calls
for n in $GPUQ_NODE_NAMES; do
  if grep -qx "$n" {d}/skip 2>/dev/null; then continue; fi
  mkdir -p {d}/$n
  cat > {d}/$n/agent.toml <<EOT
[agent]
node_name = "$n"
data_dir = "{d}/$n/data"
socket = "{d}/$n/agent.sock"
allow_root = true
kill_grace_secs = 1
cpus = 64
memory_mb = 524288
gpus = {{ fake = {{ count = 8 }} }}
EOT
  setsid {bin} agent --config {d}/$n/agent.toml --join {join} --token {token} \
    </dev/null >/dev/null 2>>{d}/$n/agent.log &
  echo $! > {d}/$n/pid
done
"#,
        bin = gpuq_bin().display(),
    )
}

/// The suspend script: kills the named agents and logs the call.
fn suspend_script(dir: &Path) -> String {
    let d = dir.display();
    format!(
        r#"echo "$GPUQ_NODE_COUNT $1" >> {d}/suspends
for n in $GPUQ_NODE_NAMES; do
  kill "$(cat {d}/$n/pid)" 2>/dev/null
done
"#
    )
}

fn lines(path: &Path) -> Vec<String> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(str::to_string)
        .collect()
}

fn node_states(c: &Cluster) -> Vec<(String, String)> {
    let v: serde_json::Value = serde_json::from_str(&c.server.ok(&["nodes", "--json"])).unwrap();
    v.as_array()
        .unwrap()
        .iter()
        .map(|n| {
            (
                n["name"].as_str().unwrap().to_string(),
                n["state"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

#[test]
fn a_node_group_grows_for_waiting_jobs_and_shrinks_when_idle() {
    let dir = tempfile::tempdir().unwrap();
    let c = Cluster::start(dir.path(), 0, 8);
    let s = &c.server;
    let g = dir.path().join("group");
    std::fs::create_dir_all(&g).unwrap();
    let token = s.ok(&["token", "create"]).trim().to_string();
    std::fs::write(g.join("resume.sh"), resume_script(&g, &s.addr(), &token)).unwrap();
    std::fs::write(g.join("suspend.sh"), suspend_script(&g)).unwrap();
    let resume = format!("sh {}/resume.sh", g.display());
    let suspend = format!("sh {}/suspend.sh", g.display());

    // Bad input: exit 1, the input named.
    for (args, text) in [
        (
            vec!["--gpus", "8", "--cpus", "64", "--mem", "512G"],
            "--max",
        ),
        (
            vec!["--gpus", "8", "--cpus", "64", "--mem", "512G", "--max", "4"],
            "--resume-command",
        ),
        (
            vec![
                "--gpus",
                "8",
                "--cpus",
                "64",
                "--mem",
                "512G",
                "--max",
                "2",
                "--min",
                "3",
                "--resume-command",
                "true",
            ],
            "--min 3 is over --max 2",
        ),
    ] {
        let mut full = vec!["admin", "nodegroup", "add", "burst"];
        full.extend(args);
        let out = s.cli(&full);
        assert_eq!(out.status.code(), Some(1), "{full:?}: {}", stderr(&out));
        assert!(stderr(&out).contains(text), "{full:?}: {}", stderr(&out));
    }

    s.ok(&[
        "admin",
        "nodegroup",
        "add",
        "burst",
        "--gpus",
        "8",
        "--cpus",
        "64",
        "--mem",
        "512G",
        "--max",
        "6",
        "--resume-command",
        &resume,
        "--suspend-command",
        &suspend,
        "--idle-time",
        "3s",
        "--demand-time",
        "1s",
        "--resume-timeout",
        "60s",
    ]);
    assert!(s
        .ok(&["admin", "nodegroup", "list"])
        .contains("burst-001..burst-006"));

    // Four 8-GPU jobs on a cluster with no nodes: one call for four nodes.
    let jobs: Vec<String> = (0..4)
        .map(|_| c.submit(&["--gpus-per-node", "8", "-t", "5", "--", "sleep", "2"]))
        .collect();
    common::wait_for("the four nodes to be asked for", LONG, || {
        !lines(&g.join("calls")).is_empty()
    });
    for id in &jobs {
        c.wait_state(id, "COMPLETED", LONG);
    }
    assert_eq!(lines(&g.join("calls")), ["4 burst-[001-004]"]);
    let ran_on: std::collections::BTreeSet<String> = jobs
        .iter()
        .map(|id| {
            c.job(id)["run"]["allocation"]["nodes"][0]["node"]
                .as_str()
                .unwrap()
                .to_string()
        })
        .collect();
    assert_eq!(ran_on.len(), 4, "{ran_on:?}");

    // Idle for the idle time: suspended, all four in one call.
    common::wait_for("the idle nodes to be suspended", LONG, || {
        node_states(&c)
            .iter()
            .filter(|(_, st)| st == "powered_down")
            .count()
            == 4
    });
    let suspended: Vec<String> = lines(&g.join("suspends"));
    assert_eq!(
        suspended
            .iter()
            .map(|l| l.split(' ').next().unwrap().parse::<u32>().unwrap())
            .sum::<u32>(),
        4,
        "{suspended:?}"
    );

    // burst-001, first to be asked for again, never comes: given up on
    // after the timeout, and the job runs on another node.
    std::fs::write(g.join("skip"), "burst-001\n").unwrap();
    s.ok(&[
        "admin",
        "nodegroup",
        "modify",
        "burst",
        "--resume-timeout",
        "4s",
    ]);
    let late = c.submit(&["--gpus-per-node", "8", "-t", "5", "--", "true"]);
    // While its node is on the way, the job says so.
    common::wait_for("the NodesStarting reason", LONG, || {
        let j = c.job(&late);
        j["reason_code"] == "NodesStarting"
            && j["reason"]
                .as_str()
                .is_some_and(|r| r.contains("nodes of group burst"))
    });
    c.wait_state(&late, "COMPLETED", LONG);
    let calls = lines(&g.join("calls"));
    assert!(calls[1].contains("burst-001"), "{calls:?}");
    let node = c.job(&late)["run"]["allocation"]["nodes"][0]["node"]
        .as_str()
        .unwrap()
        .to_string();
    assert_ne!(node, "burst-001");
    assert!(
        node_states(&c).contains(&("burst-001".to_string(), "failed".to_string())),
        "{:?}",
        node_states(&c)
    );

    // Kill what is left (suspended agents are dead already).
    for n in 1..=6 {
        let pid = g.join(format!("burst-{n:03}/pid"));
        if let Ok(p) = std::fs::read_to_string(pid) {
            let _ = std::process::Command::new("kill").arg(p.trim()).status();
        }
    }
}
