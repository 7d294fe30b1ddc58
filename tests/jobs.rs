//! Agents run real jobs: a server and agents with fake GPUs as real processes
//! on loopback, tasks as real processes under shims.

mod common;

use std::collections::BTreeSet;
use std::time::Duration;

use common::{cli_as, ensure_user, require_root, shared_tempdir, stderr, Cluster};

const LONG: Duration = Duration::from_secs(60);

fn read(path: &std::path::Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()))
}

/// `KEY=VALUE` lines of a task's output.
fn env_of(text: &str) -> std::collections::BTreeMap<String, String> {
    text.lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

#[test]
fn sixteen_one_gpu_jobs_get_distinct_gpus_and_the_seventeenth_waits() {
    let dir = tempfile::tempdir().unwrap();
    let c = Cluster::start(dir.path(), 2, 8);
    let out = dir.path().join("out");
    std::fs::create_dir_all(&out).unwrap();
    let gate = dir.path().join("gate");
    let script = format!(
        "echo \"$GPUQ_NODELIST $CUDA_VISIBLE_DEVICES\"; while [ ! -e {} ]; do sleep 0.1; done",
        gate.display()
    );
    let chdir = out.to_str().unwrap();
    let ids: Vec<String> = (0..17)
        .map(|_| {
            c.submit(&[
                "--gpus-per-node",
                "1",
                "-D",
                chdir,
                "--",
                "sh",
                "-c",
                &script,
            ])
        })
        .collect();
    for id in &ids[..16] {
        c.wait_state(id, "RUNNING", LONG);
    }
    let waiting = c.job(&ids[16]);
    assert_eq!(waiting["state"], "PENDING");
    let reason = waiting["reason"].as_str().unwrap_or_default().to_string();
    assert!(
        reason.contains("resources") || reason.contains("Resources"),
        "{reason}"
    );

    // Each running job wrote its node and GPU: 16 distinct pairs.
    common::wait_for("16 outputs", LONG, || {
        ids[..16].iter().all(|id| {
            std::fs::read_to_string(out.join(format!("gpuq-{id}.out"))).is_ok_and(|s| !s.is_empty())
        })
    });
    let pairs: BTreeSet<String> = ids[..16]
        .iter()
        .map(|id| read(&out.join(format!("gpuq-{id}.out"))).trim().to_string())
        .collect();
    assert_eq!(pairs.len(), 16, "{pairs:?}");
    assert!(
        pairs.iter().all(|p| !p.contains(',')),
        "each sees exactly one GPU: {pairs:?}"
    );

    std::fs::write(&gate, "").unwrap();
    c.wait_state(&ids[16], "COMPLETED", LONG);
    for id in &ids[..16] {
        let j = c.wait_state(id, "COMPLETED", LONG);
        assert_eq!(j["exit_code"], 0);
    }
}

#[test]
fn a_two_node_gang_gets_the_torchrun_contract_and_rendezvous() {
    let dir = tempfile::tempdir().unwrap();
    let c = Cluster::start(dir.path(), 2, 8);
    let work = dir.path().join("work");
    std::fs::create_dir_all(&work).unwrap();
    let script = work.join("rdzv.py");
    std::fs::write(
        &script,
        r#"#!/usr/bin/env python3
#GPUQ --nodes 2 --gpus-per-node 8
#GPUQ --output out-%t.txt
import os, socket, time
keys = ["WORLD_SIZE", "RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "NODE_RANK", "MASTER_ADDR",
        "MASTER_PORT", "PET_NNODES", "PET_NODE_RANK", "PET_NPROC_PER_NODE", "PET_MASTER_ADDR",
        "PET_MASTER_PORT", "GPUQ_JOB_ID", "GPUQ_NUM_NODES", "GPUQ_NODELIST", "GPUQ_NODE_RANK",
        "GPUQ_RESTART_COUNT", "CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER"]
for k in keys:
    print(f"{k}={os.environ.get(k, '')}", flush=True)
addr, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
if os.environ["RANK"] == "0":
    s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((addr, port)); s.listen(1); s.settimeout(30)
    conn, _ = s.accept(); msg = conn.recv(100).decode(); conn.sendall(b"welcome")
    print(f"GOT={msg}", flush=True)
else:
    for _ in range(300):
        try:
            s = socket.create_connection((addr, port), timeout=1); break
        except OSError:
            time.sleep(0.1)
    s.sendall(b"hello from rank 1"); print(f"GOT={s.recv(100).decode()}", flush=True)
"#,
    )
    .unwrap();
    let id = c.submit(&["-D", work.to_str().unwrap(), script.to_str().unwrap()]);
    let job = c.wait_state(&id, "COMPLETED", LONG);
    assert_eq!(job["exit_code"], 0);
    let r0 = env_of(&read(&work.join("out-0.txt")));
    let r1 = env_of(&read(&work.join("out-1.txt")));
    assert_eq!(r0["GOT"], "hello from rank 1");
    assert_eq!(r1["GOT"], "welcome");
    for (r, env) in [(0, &r0), (1, &r1)] {
        assert_eq!(env["WORLD_SIZE"], "2");
        assert_eq!(env["RANK"], r.to_string());
        assert_eq!(env["NODE_RANK"], r.to_string());
        assert_eq!(env["LOCAL_RANK"], "0");
        assert_eq!(env["LOCAL_WORLD_SIZE"], "1");
        assert_eq!(env["PET_NNODES"], "2");
        assert_eq!(env["PET_NODE_RANK"], r.to_string());
        assert_eq!(env["PET_NPROC_PER_NODE"], "8");
        assert_eq!(env["GPUQ_NUM_NODES"], "2");
        assert_eq!(env["GPUQ_JOB_ID"], id);
        assert_eq!(env["GPUQ_RESTART_COUNT"], "0");
        assert_eq!(env["CUDA_VISIBLE_DEVICES"], "0,1,2,3,4,5,6,7");
        assert_eq!(env["CUDA_DEVICE_ORDER"], "PCI_BUS_ID");
    }
    for k in [
        "MASTER_ADDR",
        "MASTER_PORT",
        "PET_MASTER_ADDR",
        "PET_MASTER_PORT",
        "GPUQ_NODELIST",
    ] {
        assert_eq!(r0[k], r1[k], "{k} is the same on every rank");
    }
    assert_eq!(r0["MASTER_PORT"], r0["PET_MASTER_PORT"]);
    assert_eq!(r0["GPUQ_NODELIST"], "n[1-2]");
}

#[test]
fn ntasks_per_node_splits_the_gpus() {
    let dir = tempfile::tempdir().unwrap();
    let c = Cluster::start(dir.path(), 1, 8);
    let work = dir.path().join("w");
    std::fs::create_dir_all(&work).unwrap();
    let id = c.submit(&[
        "--gpus-per-node",
        "8",
        "--ntasks-per-node",
        "4",
        "-D",
        work.to_str().unwrap(),
        "--output",
        "t-%t.out",
        "--",
        "sh",
        "-c",
        "echo \"$RANK $LOCAL_RANK $LOCAL_WORLD_SIZE $CUDA_VISIBLE_DEVICES $$\"",
    ]);
    c.wait_state(&id, "COMPLETED", LONG);
    let mut gpus = BTreeSet::new();
    let mut pids = BTreeSet::new();
    for t in 0..4 {
        let line = read(&work.join(format!("t-{t}.out")));
        let f: Vec<&str> = line.split_whitespace().collect();
        assert_eq!(f[0], t.to_string());
        assert_eq!(f[1], t.to_string());
        assert_eq!(f[2], "4");
        let mine: Vec<&str> = f[3].split(',').collect();
        assert_eq!(mine.len(), 2, "two GPUs each: {line}");
        for g in mine {
            assert!(gpus.insert(g.to_string()), "GPU {g} given twice");
        }
        pids.insert(f[4].to_string());
    }
    assert_eq!(gpus.len(), 8);
    assert_eq!(pids.len(), 4, "four processes");
}

#[test]
fn cancel_timeout_failure_and_a_failing_rank_stopping_its_gang() {
    let dir = tempfile::tempdir().unwrap();
    let c = Cluster::start(dir.path(), 2, 8);
    let w = dir.path().to_str().unwrap();

    let sleeper = c.submit(&["-D", w, "--", "sleep", "300"]);
    c.wait_state(&sleeper, "RUNNING", LONG);
    c.server.ok(&["cancel", &sleeper]);
    let j = c.wait_state(&sleeper, "CANCELLED", LONG);
    assert!(j["reason"].as_str().unwrap().contains("cancelled by"));

    let slow = c.submit(&["-D", w, "--time", "0:02", "--", "sleep", "300"]);
    c.wait_state(&slow, "TIMEOUT", LONG);

    let bad = c.submit(&["-D", w, "--", "sh", "-c", "exit 7"]);
    let j = c.wait_state(&bad, "FAILED", LONG);
    assert_eq!(j["exit_code"], 7);

    // Rank 1 fails at once; rank 0 would sleep for minutes but is stopped.
    let marker = dir.path().join("rank0.pid");
    let script = format!(
        "if [ \"$RANK\" = 1 ]; then exit 3; fi; echo $$ > {}; exec sleep 300",
        marker.display()
    );
    let gang = c.submit(&["-N", "2", "-D", w, "--", "sh", "-c", &script]);
    let j = c.wait_state(&gang, "FAILED", LONG);
    let reason = j["reason"].as_str().unwrap().to_string();
    assert!(
        reason.contains("rank 1") && reason.contains("n2") && reason.contains("code 3"),
        "{reason}"
    );
    assert_eq!(j["exit_code"], 3);
    if let Ok(pid) = std::fs::read_to_string(&marker) {
        let pid: i32 = pid.trim().parse().unwrap();
        common::wait_for("rank 0 to be stopped", LONG, || {
            nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None).is_err()
        });
    }
    // Everything is free again.
    let nodes: serde_json::Value =
        serde_json::from_str(&c.server.ok(&["nodes", "--json"])).unwrap();
    for n in nodes.as_array().unwrap() {
        assert_eq!(n["gpus_used"], 0, "{n}");
    }
}

#[test]
fn logs_follow_output_while_the_job_runs() {
    let dir = tempfile::tempdir().unwrap();
    let c = Cluster::start(dir.path(), 1, 8);
    let w = dir.path().to_str().unwrap();
    let id = c.submit(&[
        "-D",
        w,
        "--",
        "sh",
        "-c",
        "for i in 1 2 3 4 5; do echo line $i; sleep 0.3; done",
    ]);
    c.wait_state(&id, "RUNNING", LONG);
    let out = c.server.cli(&["logs", &id, "-f"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(text, "line 1\nline 2\nline 3\nline 4\nline 5\n");
    assert_eq!(
        c.job(&id)["state"],
        "COMPLETED",
        "-f returns once the job ended"
    );
    // A rank that does not exist is refused.
    let out = c.server.cli(&["logs", &id, "--rank", "5"]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
}

#[test]
fn impossible_shapes_are_refused_at_submit_with_the_numbers() {
    let dir = tempfile::tempdir().unwrap();
    let c = Cluster::start(dir.path(), 2, 8);
    let out = c
        .server
        .cli(&["submit", "--gpus-per-node", "9", "--", "true"]);
    assert_eq!(out.status.code(), Some(1));
    let err = stderr(&out);
    assert!(err.contains('9') && err.contains('8'), "{err}");
    let out = c
        .server
        .cli(&["submit", "-N", "3", "--gpus-per-node", "8", "--", "true"]);
    assert_eq!(out.status.code(), Some(1));
    let err = stderr(&out);
    assert!(err.contains('3') && err.contains('2'), "{err}");
    let v: serde_json::Value =
        serde_json::from_str(&c.server.ok(&["queue", "--all", "--json"])).unwrap();
    assert!(v.as_array().unwrap().is_empty());
}

#[test]
fn tasks_run_as_the_submitting_user() {
    if !require_root("tasks_run_as_the_submitting_user") {
        return;
    }
    let dir = shared_tempdir();
    let c = Cluster::start(dir.path(), 1, 8);
    let alice = ensure_user("gpuqt-alice");
    let work = dir.path().join("alice");
    std::fs::create_dir_all(&work).unwrap();
    nix::unistd::chown(&work, Some(alice.uid.into()), Some(alice.gid.into())).unwrap();
    let out = cli_as(
        &alice,
        &c.server.socket,
        &[
            "submit",
            "--parsable",
            "-D",
            work.to_str().unwrap(),
            "--",
            "sh",
            "-c",
            "id -un > who.txt; touch made.txt",
        ],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let id = String::from_utf8_lossy(&out.stdout).trim().to_string();
    c.wait_state(&id, "COMPLETED", LONG);
    assert_eq!(read(&work.join("who.txt")).trim(), "gpuqt-alice");
    use std::os::unix::fs::MetadataExt;
    for f in ["made.txt", &format!("gpuq-{id}.out")] {
        let meta = std::fs::metadata(work.join(f)).unwrap();
        assert_eq!(meta.uid(), alice.uid, "{f} is owned by alice");
    }
    // Root's jobs are refused on a node that does not allow root... this
    // cluster allows it (allow_root = true), so a root job runs:
    let id = c.submit(&["-D", work.to_str().unwrap(), "--", "true"]);
    c.wait_state(&id, "COMPLETED", LONG);
}

/// A data dir as a daemon makes it: closed to group and others.
fn private_dir(path: &std::path::Path) {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(path)
        .unwrap();
}

#[test]
fn an_agent_claiming_another_name_or_a_live_duplicate_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let c = Cluster::start(dir.path(), 1, 8);
    // A copy of n1's identity that registers as n9: the certificate says n1.
    let imp = dir.path().join("imp");
    private_dir(&imp.join("data"));
    let copy = |to: &std::path::Path| {
        let st = std::process::Command::new("cp")
            .arg("-a")
            .arg(dir.path().join("n1/data/tls"))
            .arg(to.join("data/"))
            .status()
            .unwrap();
        assert!(st.success());
    };
    copy(&imp);
    let cfg = format!(
        "[agent]\nnode_name = \"n9\"\ndata_dir = \"{d}/data\"\nsocket = \"{d}/agent.sock\"\ngpus = \"none\"\n",
        d = imp.display()
    );
    std::fs::write(imp.join("agent.toml"), cfg).unwrap();
    let log = std::fs::File::create(imp.join("agent.log")).unwrap();
    let mut child = common::gpuq_command()
        .args(["agent", "--config"])
        .arg(imp.join("agent.toml"))
        .args(["--servers", &c.server.addr()])
        .stderr(log)
        .spawn()
        .unwrap();
    common::wait_for("the impostor to be refused", LONG, || {
        std::fs::read_to_string(imp.join("agent.log"))
            .unwrap_or_default()
            .contains("certificate is for agent n1")
    });
    let _ = child.kill();
    let _ = child.wait();

    // A second live agent for n1 (same identity) is refused while n1 is up.
    let dup = dir.path().join("dup");
    private_dir(&dup.join("data"));
    copy(&dup);
    let cfg = format!(
        "[agent]\nnode_name = \"n1\"\ndata_dir = \"{d}/data\"\nsocket = \"{d}/agent.sock\"\ngpus = \"none\"\n",
        d = dup.display()
    );
    std::fs::write(dup.join("agent.toml"), cfg).unwrap();
    let log = std::fs::File::create(dup.join("agent.log")).unwrap();
    let mut child = common::gpuq_command()
        .args(["agent", "--config"])
        .arg(dup.join("agent.toml"))
        .args(["--servers", &c.server.addr()])
        .stderr(log)
        .spawn()
        .unwrap();
    common::wait_for("the duplicate to be refused", LONG, || {
        std::fs::read_to_string(dup.join("agent.log"))
            .unwrap_or_default()
            .contains("already connected")
    });
    let _ = child.kill();
    let _ = child.wait();
    let nodes: serde_json::Value =
        serde_json::from_str(&c.server.ok(&["nodes", "--json"])).unwrap();
    let nodes = nodes.as_array().unwrap();
    assert_eq!(nodes.len(), 1, "{nodes:?}");
    assert_eq!(
        nodes[0]["inventory"]["gpus"].as_array().unwrap().len(),
        8,
        "n1 kept its inventory"
    );
}

#[test]
fn a_bulk_submit_from_a_file_or_stdin_queues_every_line_in_one_call() {
    let dir = tempfile::tempdir().unwrap();
    let c = Cluster::start(dir.path(), 1, 8);
    let out = dir.path().join("out");
    std::fs::create_dir_all(&out).unwrap();
    let chdir = out.to_str().unwrap();
    let file = dir.path().join("jobs.txt");
    std::fs::write(
        &file,
        "# a sweep\n-J first -- sh -c 'echo \"lr 1\" > lr1'\n\n\
         -J second -- sh -c 'echo \"lr 2\" > lr2'\n--gpus-per-node 2 -- true\n",
    )
    .unwrap();
    // Command-line flags apply to every line; a line's -J wins over this one.
    let ids: Vec<String> = c
        .server
        .ok(&[
            "submit",
            "--parsable",
            "-J",
            "sweep",
            "-D",
            chdir,
            "--from",
            file.to_str().unwrap(),
        ])
        .lines()
        .map(str::to_string)
        .collect();
    assert_eq!(ids.len(), 3, "{ids:?}");
    let n: Vec<u64> = ids.iter().map(|i| i.parse().unwrap()).collect();
    assert_eq!(
        n,
        vec![n[0], n[0] + 1, n[0] + 2],
        "one entry, consecutive ids"
    );
    for id in &ids {
        c.wait_state(id, "COMPLETED", LONG);
    }
    assert_eq!(c.job(&ids[0])["spec"]["name"], "first");
    assert_eq!(c.job(&ids[2])["spec"]["name"], "sweep");
    assert_eq!(read(&out.join("lr1")), "lr 1\n");
    assert_eq!(read(&out.join("lr2")), "lr 2\n");

    // From stdin, with --json.
    use std::io::Write;
    let mut child = common::gpuq_command()
        .args(["submit", "--json", "-D", chdir, "--from", "-"])
        .env("GPUQ_SOCKET", &c.server.socket)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(b"-- true\n-- true\n")
        .unwrap();
    let done = child.wait_with_output().unwrap();
    assert!(done.status.success(), "{}", stderr(&done));
    let v: serde_json::Value = serde_json::from_slice(&done.stdout).unwrap();
    let ids = v["ids"].as_array().unwrap();
    assert_eq!(ids.len(), 2, "{v}");
    for id in ids {
        c.wait_state(&id.to_string(), "COMPLETED", LONG);
    }
}
