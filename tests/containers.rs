//! Jobs in container images (`--container-image`) on real OCI runtimes
//! (crun, runc): a server and agents as processes, the image a
//! busybox-static root filesystem made here (`images`), as a plain
//! directory and as an OCI image layout. The other image formats and the
//! node's image cache are `tests/container_images.rs`. CI runs as root with
//! crun, runc, busybox-static and squashfs-tools installed (`.ci/run`).

mod common;
mod images;

use std::os::unix::fs::MetadataExt;
use std::path::Path;

use common::{
    cli_as, ensure_user, require_root, shared_tempdir, stderr, stdout, submit_as, user_dir, Agent,
    Cluster, Server,
};
use images::{alive, layout, read, rootfs, vars, IMAGE_NAME, LONG};

/// The CONTAINERS cell of a node with `runtime` and the default settings:
/// `+rootless` (this machine lets users make user namespaces: the runtime
/// runs as the job's user), and `+pull` where it has skopeo (CI installs
/// it for tests/container_registry.rs).
fn shown(runtime: &str) -> String {
    let skopeo = std::env::var("PATH")
        .unwrap_or_default()
        .split(':')
        .any(|d| Path::new(d).join("skopeo").is_file());
    match skopeo {
        true => format!("{runtime}+rootless+pull"),
        false => format!("{runtime}+rootless"),
    }
}

/// A second agent, n2, with `config` (its `[agent]` extra lines), once the
/// leader lists it.
fn second_node(c: &Cluster, dir: &Path, config: &str) -> Agent {
    let token = c.server.ok(&["token", "create"]).trim().to_string();
    let n2 = Agent::start_with(&c.server, &dir.join("n2"), "n2", 8, &token, config);
    common::wait_for("n2 registered", LONG, || {
        c.server
            .ok(&["nodes"])
            .lines()
            .any(|l| l.starts_with("n2 "))
    });
    n2
}

/// The CONTAINERS cell of `node`'s row (given with its trailing space) in
/// `gpuq nodes`' `table`.
fn containers_cell(table: &str, node: &str) -> String {
    let at = table.lines().next().unwrap().find("CONTAINERS").unwrap();
    let row = table.lines().find(|l| l.starts_with(node)).unwrap();
    row[at..].split_whitespace().next().unwrap().to_string()
}

/// `text`'s words, one space apart (`/proc/self/uid_map` pads with spaces).
fn words(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// Fails the test, saying why, where users cannot make user namespaces (so
/// that no node here is rootless).
fn require_user_namespaces() {
    let max = std::fs::read_to_string("/proc/sys/user/max_user_namespaces").unwrap_or_default();
    assert!(
        max.trim().parse::<u64>().is_ok_and(|n| n > 0),
        "this machine does not let users make user namespaces (user.max_user_namespaces is \
         {max:?}): rootless containers cannot run here; set it above 0"
    );
}

#[test]
fn a_job_in_an_image_sees_its_files_as_the_user_and_writes_where_a_bare_job_would() {
    if !require_root("a_job_in_an_image_sees_its_files_as_the_user") {
        return;
    }
    let dir = shared_tempdir();
    let root = rootfs(dir.path());
    let image = layout(dir.path(), &root);
    let c = Cluster::start(dir.path(), 1, 8);
    // The agent found crun: its node offers the feature container jobs ask for.
    let nodes: serde_json::Value =
        serde_json::from_str(&c.server.ok(&["nodes", "--json"])).unwrap();
    assert!(
        nodes.to_string().contains("\"oci\"") && nodes.to_string().contains("\"oci-crun\""),
        "no node has the oci feature: {nodes}"
    );
    // `gpuq nodes` names the runtime, and the pull tool where it is found.
    let table = c.server.ok(&["nodes"]);
    let header = table.lines().next().unwrap();
    let at = header.find("CONTAINERS").expect(&table);
    let row = table.lines().nth(1).unwrap();
    let cell = row[at..].split_whitespace().next();
    assert_eq!(cell, Some(shown("crun").as_str()), "{table}");
    let alice = ensure_user("gpuqt-alice");
    let work = user_dir(&alice, &dir.path().join("alice"));
    let w = work.to_str().unwrap();
    let probe = "cat /etc/os-release; echo UID=$(id -u); echo GID=$(id -g); \
                 echo CVD=$CUDA_VISIBLE_DEVICES; echo JOB=$GPUQ_JOB_ID; \
                 echo SLURM=$SLURM_JOB_ID; echo PWD=$(pwd); echo FROM_IMAGE=$FROM_IMAGE; \
                 echo PATH=$PATH; test -e /usr/bin/crun && echo HOST=visible; \
                 echo NVIDIA=$(ls /dev | grep -c nvidia); touch made.txt";
    let submit = |image: &Path| {
        submit_as(
            &alice,
            &c.server.socket,
            &[
                "--gpus-per-node",
                "2",
                "--container-image",
                image.to_str().unwrap(),
                "-D",
                w,
                "--",
                "sh",
                "-c",
                probe,
            ],
        )
    };
    // The OCI layout, then the same files as a plain directory.
    for (image, from_image) in [(&image, "yes"), (&root, "")] {
        let id = submit(image);
        let job = c.wait_state(&id, "COMPLETED", LONG);
        assert_eq!(job["exit_code"], 0, "{job}");
        let output = work.join(format!("gpuq-{id}.out"));
        let text = read(&output);
        let v = vars(&text);
        assert_eq!(v["NAME"], format!("\"{IMAGE_NAME}\""), "{text}");
        assert_eq!(v["UID"], alice.uid.to_string(), "{text}");
        assert_eq!(v["GID"], alice.gid.to_string(), "{text}");
        assert_eq!(v["CVD"], "0,1", "{text}");
        assert_eq!(v["JOB"], id, "{text}");
        assert_eq!(v["SLURM"], id, "{text}");
        assert_eq!(v["PWD"], w, "{text}");
        assert_eq!(v["FROM_IMAGE"], from_image, "{text}");
        // Fake GPUs have no device nodes, and the host's files stay out.
        assert_eq!(v["NVIDIA"], "0", "{text}");
        assert!(!v.contains_key("HOST"), "{text}");
        if from_image == "yes" {
            assert_eq!(v["PATH"], "/bin", "the image's PATH: {text}");
        }
        for f in [output.clone(), work.join("made.txt")] {
            assert_eq!(
                std::fs::metadata(&f).unwrap().uid(),
                alice.uid,
                "{} is alice's",
                f.display()
            );
        }
        std::fs::remove_file(work.join("made.txt")).unwrap();
    }
    // A script's #GPUQ directive, and sbatch with Pyxis's flag: the script
    // itself runs in the image.
    let script = work.join("job.sh");
    std::fs::write(
        &script,
        format!(
            "#!/bin/sh\n#GPUQ --container-image {}\n#GPUQ --output script.out\ncat /etc/os-release\n",
            image.display()
        ),
    )
    .unwrap();
    nix::unistd::chown(&script, Some(alice.uid.into()), Some(alice.gid.into())).unwrap();
    let id = submit_as(
        &alice,
        &c.server.socket,
        &["-D", w, script.to_str().unwrap()],
    );
    c.wait_state(&id, "COMPLETED", LONG);
    assert!(read(&work.join("script.out")).contains(IMAGE_NAME));
    let out = cli_as(
        &alice,
        &c.server.socket,
        &[
            "slurm",
            "sbatch",
            "--parsable",
            "-D",
            w,
            "--container-image",
            root.to_str().unwrap(),
            "--container-mounts",
            &format!("{}:/data:ro", image.display()),
            "--wrap",
            "cat /etc/os-release; ls /data; touch /data/x || echo READ_ONLY",
        ],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let id = String::from_utf8_lossy(&out.stdout).trim().to_string();
    c.wait_state(&id, "COMPLETED", LONG);
    let text = read(&work.join(format!("slurm-{id}.out")));
    assert!(text.contains(IMAGE_NAME), "{text}");
    assert!(
        text.contains("index.json") && text.contains("READ_ONLY"),
        "{text}"
    );
    // Pyxis's usual shape: a bare batch script whose srun step runs in the
    // image.
    let bin = dir.path().join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    std::os::unix::fs::symlink(common::gpuq_bin(), bin.join("srun")).unwrap();
    let step = format!(
        "test -e /usr/bin/crun && echo BATCH=bare; {} --container-image {} cat /etc/os-release",
        bin.join("srun").display(),
        image.display()
    );
    let id = c
        .server
        .ok(&["slurm", "sbatch", "--parsable", "-D", w, "--wrap", &step])
        .trim()
        .to_string();
    c.wait_state(&id, "COMPLETED", LONG);
    let text = read(&work.join(format!("slurm-{id}.out")));
    assert!(
        text.contains("BATCH=bare") && text.contains(IMAGE_NAME),
        "{text}"
    );
}

#[test]
fn cancel_and_the_time_limit_stop_the_container_and_all_it_started() {
    if !require_root("cancel_and_the_time_limit_stop_the_container") {
        return;
    }
    let dir = shared_tempdir();
    let root = rootfs(dir.path());
    let c = Cluster::start(dir.path(), 1, 8);
    let work = dir.path().join("work");
    std::fs::create_dir_all(&work).unwrap();
    let (w, img) = (work.to_str().unwrap(), root.to_str().unwrap());
    let id = c.submit(&[
        "--container-image",
        img,
        "-D",
        w,
        "--",
        "sh",
        "-c",
        "echo $$ > main.pid; sleep 300 & echo $! > bg.pid; wait",
    ]);
    common::wait_for("the container's processes", LONG, || {
        ["main.pid", "bg.pid"]
            .iter()
            .all(|f| std::fs::read_to_string(work.join(f)).is_ok_and(|t| t.ends_with('\n')))
    });
    let pids: Vec<i32> = ["main.pid", "bg.pid"]
        .iter()
        .map(|f| read(&work.join(f)).trim().parse().unwrap())
        .collect();
    assert!(pids.iter().all(|&p| alive(p)), "{pids:?}");
    // A process beside the container's task runs in its image (more in
    // tests/container_exec.rs).
    let out = c.server.cli(&["exec", &id, "--", "cat", "/etc/os-release"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(String::from_utf8_lossy(&out.stdout).contains(IMAGE_NAME));
    c.server.ok(&["cancel", &id]);
    let job = c.wait_state(&id, "CANCELLED", LONG);
    assert!(
        job["reason"].as_str().unwrap().contains("cancelled by"),
        "{job}"
    );
    common::wait_for("every process of the container to be gone", LONG, || {
        pids.iter().all(|&p| !alive(p))
    });

    let id = c.submit(&[
        "--container-image",
        img,
        "-D",
        w,
        "--time",
        "0:02",
        "--",
        "sleep",
        "300",
    ]);
    c.wait_state(&id, "TIMEOUT", LONG);
    // Nothing of either is left: no runtime, no task directory's mounts.
    let data = dir.path().join("n1/data");
    let mounts = read(Path::new("/proc/self/mountinfo"));
    assert!(!mounts.contains(data.to_str().unwrap()), "{mounts}");
    let ps = std::process::Command::new("ps")
        .args(["-eo", "args"])
        .output()
        .unwrap();
    let ps = String::from_utf8_lossy(&ps.stdout);
    assert!(
        !ps.lines().any(|l| l.contains("crun") && l.contains(w)),
        "{ps}"
    );
}

#[test]
fn what_only_the_node_can_know_fails_the_job_with_the_reason() {
    if !require_root("what_only_the_node_can_know_fails_the_job_with_the_reason") {
        return;
    }
    let dir = shared_tempdir();
    let root = rootfs(dir.path());
    let c = Cluster::start(dir.path(), 1, 8);
    let n2 = second_node(
        &c,
        dir.path(),
        "[agent.containers]\nruntime = \"/nowhere/crun\"\n",
    );
    let work = dir.path().join("work");
    std::fs::create_dir_all(&work).unwrap();
    let w = work.to_str().unwrap();
    let reason_of = |image: &str, node: &str| {
        let id = c.submit(&[
            "-w",
            node,
            "--container-image",
            image,
            "-D",
            w,
            "--",
            "true",
        ]);
        let job = c.wait_state(&id, "FAILED", LONG);
        job["reason"].as_str().unwrap_or_default().to_string()
    };
    let missing = dir.path().join("no-such-image");
    let reason = reason_of(missing.to_str().unwrap(), "n1");
    assert!(
        reason.contains(missing.to_str().unwrap()) && reason.contains("does not exist"),
        "{reason}"
    );
    let empty = dir.path().join("empty");
    std::fs::create_dir_all(&empty).unwrap();
    let reason = reason_of(empty.to_str().unwrap(), "n1");
    assert!(reason.contains("is not an image"), "{reason}");
    // n2 found no runtime, so it lacks the feature container jobs ask for:
    // one sent there is refused at submit, naming it.
    let out = c.server.cli(&[
        "submit",
        "-w",
        "n2",
        "--container-image",
        root.to_str().unwrap(),
        "-D",
        w,
        "--",
        "true",
    ]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(stderr(&out).contains("oci"), "{}", stderr(&out));
    drop(n2);
    // A mount source the user may not reach (it sits in root's own
    // directory) is never mounted for them.
    let private = dir.path().join("private");
    std::fs::create_dir_all(private.join("data")).unwrap();
    std::fs::set_permissions(
        &private,
        std::os::unix::fs::PermissionsExt::from_mode(0o700),
    )
    .unwrap();
    let alice = ensure_user("gpuqt-alice");
    let mine = user_dir(&alice, &dir.path().join("alice"));
    let source = format!("{}/data", private.display());
    let id = submit_as(
        &alice,
        &c.server.socket,
        &[
            "--container-image",
            root.to_str().unwrap(),
            "--container-mounts",
            &format!("{source}:/data"),
            "-D",
            mine.to_str().unwrap(),
            "--",
            "ls",
            "/data",
        ],
    );
    let job = c.wait_state(&id, "FAILED", LONG);
    let reason = job["reason"].as_str().unwrap_or_default();
    assert!(
        reason.contains(&source) && reason.contains("gpuqt-alice") && reason.contains("denied"),
        "{reason}"
    );
    // A command the image does not have is the runtime's to report.
    let id = c.submit(&[
        "--container-image",
        root.to_str().unwrap(),
        "-D",
        w,
        "--",
        "no-such-cmd",
    ]);
    let job = c.wait_state(&id, "FAILED", LONG);
    assert!(
        job["reason"]
            .as_str()
            .unwrap_or_default()
            .contains("no-such-cmd"),
        "{job}"
    );
    let mounts = read(Path::new("/proc/self/mountinfo"));
    assert!(!mounts.contains(dir.path().to_str().unwrap()), "{mounts}");
}

#[test]
fn bad_container_flags_are_refused_at_submit_naming_the_flag() {
    let dir = tempfile::tempdir().unwrap();
    // A node that pulls nothing, whatever this machine has installed.
    let server = Server::bootstrap(&dir.path().join("server"));
    let token = server.ok(&["token", "create"]).trim().to_string();
    let no_pull = "[agent.containers]\npull_tool = \"\"\n";
    let _agent = Agent::start_with(&server, &dir.path().join("n1"), "n1", 8, &token, no_pull);
    let cases: [(&[&str], &[&str]); 9] = [
        (
            &["--container-image", "images/tiny"],
            &["--container-image", "relative", "absolute"],
        ),
        (
            &["--container-image", "docker://ubuntu:22.04"],
            &[
                "--container-image",
                "pull tool",
                "install skopeo",
                "absolute path",
            ],
        ),
        (
            &["--container-image", "nvcr.io#nvidia/pytorch:24.01-py3"],
            &[
                "docker://nvcr.io/nvidia/pytorch:24.01-py3",
                "install skopeo",
            ],
        ),
        (
            &["--container-image", "/img", "--container-env", "LANG=C"],
            &["--container-env", "not a variable name"],
        ),
        (
            &["--container-readonly"],
            &["--container-readonly", "--container-image"],
        ),
        (
            &[
                "--container-image",
                "/img",
                "--container-mounts",
                "/data:data",
            ],
            &["--container-mounts", "malformed", "SRC:DST"],
        ),
        (
            &[
                "--container-image",
                "/img",
                "--container-mounts",
                "/a:/b:rx",
            ],
            &["--container-mounts", "ro or rw"],
        ),
        (
            &["--container-workdir", "/w"],
            &["--container-workdir", "--container-image"],
        ),
        (
            &["--no-container-mount-home"],
            &["--no-container-mount-home", "--container-image"],
        ),
    ];
    for (flags, words) in cases {
        for front in [&["submit"][..], &["slurm", "sbatch", "--wrap", "true"][..]] {
            let mut args: Vec<&str> = front.to_vec();
            args.extend_from_slice(flags);
            if front[0] == "submit" {
                args.extend_from_slice(&["--", "true"]);
            }
            let out = server.cli(&args);
            let err = stderr(&out);
            assert_eq!(out.status.code(), Some(1), "{args:?}: {err}");
            for word in words {
                assert!(err.contains(word), "{args:?}: {word:?} not in {err}");
            }
        }
    }
    let queue: serde_json::Value =
        serde_json::from_str(&server.ok(&["queue", "--all", "--json"])).unwrap();
    assert!(queue.as_array().unwrap().is_empty(), "{queue}");
}

#[test]
fn a_two_node_gang_in_containers_meets_through_master_addr_and_port() {
    if !require_root("a_two_node_gang_in_containers_meets_through_master_addr_and_port") {
        return;
    }
    let dir = shared_tempdir();
    let root = rootfs(dir.path());
    // A port of its own: other clusters on this host start at 29500 too.
    let port = common::free_port();
    let range = format!("master_port_range = \"{port}-{port}\"");
    let c = Cluster::start_with_config(dir.path(), 2, 8, 10, &range);
    let work = dir.path().join("work");
    std::fs::create_dir_all(&work).unwrap();
    // Rank 0 listens on MASTER_PORT (its input held open until the hello is
    // in); rank 1 dials until it answers.
    let script = "if [ \"$RANK\" = 0 ]; then (echo welcome; sleep 2) | nc -l -p $MASTER_PORT; \
                  else for i in $(seq 100); do echo hello | nc -w 2 $MASTER_ADDR $MASTER_PORT 2>/dev/null \
                  && break; sleep 0.1; done; fi";
    let id = c.submit(&[
        "-N",
        "2",
        "--gpus-per-node",
        "8",
        "--container-image",
        root.to_str().unwrap(),
        "-D",
        work.to_str().unwrap(),
        "-o",
        "rank-%t.out",
        "--",
        "sh",
        "-c",
        script,
    ]);
    let job = c.wait_state(&id, "COMPLETED", LONG);
    assert_eq!(job["exit_code"], 0, "{job}");
    assert_eq!(read(&work.join("rank-0.out")).trim(), "hello");
    assert_eq!(read(&work.join("rank-1.out")).trim(), "welcome");
}

#[test]
fn a_service_runs_its_replicas_in_the_image_and_is_checked_over_http() {
    if !require_root("a_service_runs_its_replicas_in_the_image") {
        return;
    }
    let dir = shared_tempdir();
    let root = rootfs(dir.path());
    let image = layout(dir.path(), &root);
    let c = Cluster::start(dir.path(), 1, 8);
    // Ports of its own: a check on 127.0.0.1 must reach this replica.
    c.server.ok(&["admin", "ports", "set", "43700-43799"]);
    // busybox's httpd serves the image's os-release from the container's
    // own writable layer, on the host's network.
    let serve = "mkdir -p /srv/www && cp /etc/os-release /srv/www/index.html && \
                 exec httpd -f -p 127.0.0.1:$PORT -h /srv/www";
    c.server.ok(&[
        "service",
        "create",
        "web",
        "--health-http",
        "/",
        "--health-interval",
        "1s",
        "--health-grace",
        "1s",
        "--container-image",
        image.to_str().unwrap(),
        "-D",
        dir.path().to_str().unwrap(),
        "--",
        "sh",
        "-c",
        serve,
    ]);
    common::wait_for("the replica healthy", LONG, || {
        let v: serde_json::Value =
            serde_json::from_str(&c.server.ok(&["service", "show", "web", "--json"])).unwrap();
        v[0]["slots"][0]["healthy"] == true
    });
    let endpoint = c.server.ok(&["service", "endpoints", "web"]);
    let endpoint = endpoint.lines().next().expect("an endpoint").to_string();
    let out = std::process::Command::new("curl")
        .args(["-s", &format!("http://{endpoint}/")])
        .output()
        .expect("curl");
    let body = String::from_utf8_lossy(&out.stdout);
    assert!(body.contains(IMAGE_NAME), "{endpoint}: {body}");
    c.server.ok(&["service", "delete", "web"]);
    common::wait_for("the replica gone", LONG, || {
        let ps = std::process::Command::new("ps")
            .args(["-eo", "args"])
            .output()
            .unwrap();
        !String::from_utf8_lossy(&ps.stdout)
            .lines()
            .any(|l| l.contains("httpd") && l.contains("/srv/www"))
    });
}

#[test]
fn runc_runs_the_job_where_a_node_names_it_and_cancel_stops_its_tree() {
    if !require_root("runc_runs_the_job_where_a_node_names_it") {
        return;
    }
    let runc = ["/usr/sbin/runc", "/usr/bin/runc"]
        .into_iter()
        .find(|p| Path::new(p).is_file())
        .expect("runc is missing: install it (apt-get install -y runc), as .ci/run does");
    let dir = shared_tempdir();
    let root = rootfs(dir.path());
    let image = layout(dir.path(), &root);
    let c = Cluster::start(dir.path(), 1, 8);
    let n2 = second_node(
        &c,
        dir.path(),
        &format!("[agent.containers]\nruntime = \"{runc}\"\npull_tool = \"\"\n"),
    );
    let table = c.server.ok(&["nodes"]);
    let cell = |node: &str| containers_cell(&table, node);
    assert_eq!(
        (cell("n1 "), cell("n2 ")),
        (shown("crun"), "runc".into()),
        "{table}"
    );
    let alice = ensure_user("gpuqt-alice");
    let work = user_dir(&alice, &dir.path().join("alice"));
    let w = work.to_str().unwrap();
    let id = submit_as(
        &alice,
        &c.server.socket,
        &[
            "-w",
            "n2",
            "--gpus-per-node",
            "1",
            "--container-image",
            image.to_str().unwrap(),
            "-D",
            w,
            "--",
            "sh",
            "-c",
            "cat /etc/os-release; echo UID=$(id -u); echo CVD=$CUDA_VISIBLE_DEVICES; \
             echo MAP=$(cat /proc/self/uid_map)",
        ],
    );
    let job = c.wait_state(&id, "COMPLETED", LONG);
    assert_eq!(job["exit_code"], 0, "{job}");
    let v = vars(&read(&work.join(format!("gpuq-{id}.out"))));
    assert_eq!(v["NAME"], format!("\"{IMAGE_NAME}\""), "{v:?}");
    assert_eq!(v["UID"], alice.uid.to_string(), "{v:?}");
    // runc runs as root (its rootless mode would map the container's root
    // to alice): no user namespace.
    assert_eq!(words(&v["MAP"]), format!("0 0 {}", u32::MAX), "{v:?}");
    assert_eq!(v["CVD"], "0", "{v:?}");
    // Cancel stops the container and what it started, under runc too.
    let id = c.submit(&[
        "-w",
        "n2",
        "--container-image",
        image.to_str().unwrap(),
        "-D",
        w,
        "--",
        "sh",
        "-c",
        "sleep 300 & echo $! > bg.pid; wait",
    ]);
    common::wait_for("the background process", LONG, || {
        std::fs::read_to_string(work.join("bg.pid")).is_ok_and(|t| t.ends_with('\n'))
    });
    let pid: i32 = read(&work.join("bg.pid")).trim().parse().unwrap();
    assert!(alive(pid));
    c.server.ok(&["cancel", &id]);
    c.wait_state(&id, "CANCELLED", LONG);
    common::wait_for("the container's processes gone", LONG, || !alive(pid));
    drop(n2);
}

#[test]
fn rootless_runtimes_map_only_the_user_who_keeps_their_groups() {
    if !require_root("rootless_runtimes_map_only_the_user") {
        return;
    }
    require_user_namespaces();
    let dir = shared_tempdir();
    let root = rootfs(dir.path());
    let image = layout(dir.path(), &root);
    let c = Cluster::start(dir.path(), 1, 8);
    // n2 says rootless = false: its runtime runs as root.
    let n2 = second_node(
        &c,
        dir.path(),
        "[agent.containers]\nrootless = false\npull_tool = \"\"\n",
    );
    let table = c.server.ok(&["nodes"]);
    let cell = |node: &str| containers_cell(&table, node);
    assert_eq!(
        (cell("n1 "), cell("n2 ")),
        (shown("crun"), "crun".into()),
        "{table}"
    );
    // A project directory alice reaches through a supplementary group only.
    let alice = ensure_user("gpuqt-alice");
    let group = "gpuqt-proj";
    let _ = std::process::Command::new("groupadd")
        .args(["-f", group])
        .status();
    let added = std::process::Command::new("usermod")
        .args(["-aG", group, "gpuqt-alice"])
        .status()
        .unwrap();
    assert!(added.success(), "usermod -aG {group} gpuqt-alice failed");
    let gid = nix::unistd::Group::from_name(group)
        .unwrap()
        .expect("the project group")
        .gid;
    let project = dir.path().join("project");
    std::fs::create_dir_all(&project).unwrap();
    std::fs::write(project.join("data.txt"), "project-data\n").unwrap();
    nix::unistd::chown(&project, Some(0.into()), Some(gid)).unwrap();
    std::fs::set_permissions(
        &project,
        std::os::unix::fs::PermissionsExt::from_mode(0o750),
    )
    .unwrap();
    let work = user_dir(&alice, &dir.path().join("alice"));
    let w = work.to_str().unwrap();
    let probe = "echo MAP=$(cat /proc/self/uid_map); echo OWNER=$(stat -c %u /etc/os-release); \
                 echo UID=$(id -u); echo DATA=$(cat /project/data.txt); sleep 300";
    let submit = |node: &str| {
        let mounts = format!("{}:/project:ro", project.display());
        submit_as(
            &alice,
            &c.server.socket,
            &[
                "-w",
                node,
                "--container-image",
                image.to_str().unwrap(),
                "--container-mounts",
                &mounts,
                "-D",
                w,
                "--",
                "sh",
                "-c",
                probe,
            ],
        )
    };
    let output = |id: &str| {
        let file = work.join(format!("gpuq-{id}.out"));
        common::wait_for("the probe's output", LONG, || {
            std::fs::read_to_string(&file).is_ok_and(|t| t.contains("DATA="))
        });
        vars(&read(&file))
    };
    let everyone = format!("0 0 {}", u32::MAX);
    for (node, map, owner) in [
        ("n1", format!("{0} {0} 1", alice.uid), "65534"),
        ("n2", everyone.clone(), "0"),
    ] {
        let id = submit(node);
        let v = output(&id);
        // Rootless: a namespace mapping alice alone, where the image's root
        // files show as nobody's; as root: the host's ids.
        assert_eq!(words(&v["MAP"]), map, "{node}: {v:?}");
        assert_eq!(v["OWNER"], owner, "{node}: {v:?}");
        assert_eq!(v["UID"], alice.uid.to_string(), "{node}: {v:?}");
        // Her supplementary group still opens the project's files.
        assert_eq!(v["DATA"], "project-data", "{node}: {v:?}");
        // An exec joins the container as its runtime started it.
        let out = cli_as(
            &alice,
            &c.server.socket,
            &["exec", &id, "--", "sh", "-c", "cat /proc/self/uid_map"],
        );
        assert!(out.status.success(), "{node}: {}", stderr(&out));
        assert_eq!(words(&stdout(&out)), map, "{node}: exec");
        // The runtime's state is alice's where it ran as alice.
        let tasks = dir.path().join(node).join("data/tasks");
        let states: Vec<_> = std::fs::read_dir(&tasks)
            .unwrap()
            .flatten()
            .map(|t| t.path().join("runtime"))
            .filter(|d| d.is_dir())
            .collect();
        let owners: Vec<u32> = states
            .iter()
            .map(|d| std::fs::metadata(d).unwrap().uid())
            .collect();
        let expected = if node == "n1" { alice.uid } else { 0 };
        assert!(
            !owners.is_empty() && owners.iter().all(|&u| u == expected),
            "{node}: the runtime state directories {states:?} belong to {owners:?}"
        );
        c.server.ok(&["cancel", &id]);
        c.wait_state(&id, "CANCELLED", LONG);
    }
    // --container-remap-root: uid 0 inside, alice's uid outside (her files
    // stay hers), rootless or not; --container-entrypoint runs the image's.
    for (node, flags) in [
        (
            "n1",
            &["--container-remap-root", "--container-entrypoint"][..],
        ),
        ("n2", &["--container-remap-root"][..]),
    ] {
        let mut args = vec![
            "submit",
            "--parsable",
            "-w",
            node,
            "--container-image",
            image.to_str().unwrap(),
            "-D",
            w,
        ];
        args.extend_from_slice(flags);
        let mark = format!("remapped-{node}");
        let script = format!("echo UID=$(id -u); echo MAP=$(cat /proc/self/uid_map); touch {mark}");
        args.extend(["--", "sh", "-c", &script]);
        let out = cli_as(&alice, &c.server.socket, &args);
        assert!(out.status.success(), "{}", stderr(&out));
        let id = stdout(&out).trim().to_string();
        c.wait_state(&id, "COMPLETED", LONG);
        let v = vars(&read(&work.join(format!("gpuq-{id}.out"))));
        assert_eq!(v["UID"], "0", "{node}: {v:?}");
        assert_eq!(
            words(&v["MAP"]),
            format!("0 {} 1", alice.uid),
            "{node}: {v:?}"
        );
        assert_eq!(v.contains_key("ENTRY"), node == "n1", "{node}: {v:?}");
        let made = std::fs::metadata(work.join(&mark)).unwrap();
        assert_eq!(made.uid(), alice.uid, "{node}");
    }
    drop(n2);
}

#[test]
fn gpuq_dev_run_by_a_user_runs_their_container_jobs_rootless() {
    if !require_root("gpuq_dev_run_by_a_user_runs_their_container_jobs") {
        return;
    }
    require_user_namespaces();
    use std::os::unix::process::CommandExt;
    let dir = shared_tempdir();
    let root = rootfs(dir.path());
    let image = layout(dir.path(), &root);
    let alice = ensure_user("gpuqt-alice");
    let own = |p: &Path| {
        std::fs::create_dir_all(p).unwrap();
        nix::unistd::chown(p, Some(alice.uid.into()), Some(alice.gid.into())).unwrap();
    };
    let (state, home, work) = (
        dir.path().join("dev"),
        dir.path().join("home"),
        dir.path().join("work"),
    );
    for d in [&state, &home, &work] {
        own(d);
    }
    // The dev cluster's directory holds its keys: closed, or dev refuses it.
    std::fs::set_permissions(&state, std::os::unix::fs::PermissionsExt::from_mode(0o700)).unwrap();
    // `gpuq dev` as alice: no root anywhere, her agent's crun rootless.
    let log = std::fs::File::create(dir.path().join("dev.log")).unwrap();
    let _dev = common::KillOnDrop(
        common::clean_command(common::shared_bin())
            .args(["dev", "--nodes", "1", "--gpus-per-node", "2", "--dir"])
            .arg(&state)
            .env("HOME", &home)
            .env("GPUQ_HTTP_LISTEN", "127.0.0.1:0")
            .current_dir(&home)
            .uid(alice.uid)
            .gid(alice.gid)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(log)
            .spawn()
            .expect("spawn gpuq dev as alice"),
    );
    let socket = state.join("gpuq.sock");
    let ask = |args: &[&str]| cli_as(&alice, &socket, args);
    common::wait_for("alice's gpuq dev to list its node", LONG, || {
        stdout(&ask(&["nodes"])).contains("crun+rootless")
    });
    let w = work.to_str().unwrap();
    let probe = "cat /etc/os-release; echo UID=$(id -u); echo MAP=$(cat /proc/self/uid_map); \
                 echo PWD=$(pwd); touch made.txt";
    let out = ask(&[
        "submit",
        "--parsable",
        "--container-image",
        image.to_str().unwrap(),
        "-D",
        w,
        "--",
        "sh",
        "-c",
        probe,
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let id = stdout(&out).trim().to_string();
    let mut job = serde_json::Value::Null;
    common::wait_for(&format!("job {id} to end"), LONG, || {
        job = serde_json::from_str(&stdout(&ask(&["show", &id, "--json"]))).unwrap_or_default();
        ["COMPLETED", "FAILED"].contains(&job["state"].as_str().unwrap_or_default())
    });
    assert_eq!(job["state"], "COMPLETED", "{job}");
    let v = vars(&read(&work.join(format!("gpuq-{id}.out"))));
    assert_eq!(v["NAME"], format!("\"{IMAGE_NAME}\""), "{v:?}");
    assert_eq!(v["UID"], alice.uid.to_string(), "{v:?}");
    assert_eq!(words(&v["MAP"]), format!("{0} {0} 1", alice.uid), "{v:?}");
    assert_eq!(v["PWD"], w, "{v:?}");
    let made = std::fs::metadata(work.join("made.txt")).unwrap();
    assert_eq!(made.uid(), alice.uid);
    // An exec joins her running container, rootless as well.
    let out = ask(&[
        "submit",
        "--parsable",
        "--container-image",
        image.to_str().unwrap(),
        "-D",
        w,
        "--",
        "sleep",
        "300",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let id = stdout(&out).trim().to_string();
    common::wait_for(&format!("job {id} running"), LONG, || {
        stdout(&ask(&["show", &id, "--json"])).contains("\"RUNNING\"")
    });
    let mut seen = String::new();
    common::wait_for("the exec's answer", LONG, || {
        let out = ask(&[
            "exec",
            &id,
            "--",
            "sh",
            "-c",
            "grep -c ^ID=gpuq-test /etc/os-release",
        ]);
        seen = stdout(&out);
        out.status.success()
    });
    assert_eq!(seen.trim(), "1");
    assert!(ask(&["cancel", &id]).status.success());
}

#[test]
fn a_named_container_keeps_what_a_step_wrote_for_the_next_and_its_tasks_share_it() {
    if !require_root("a_named_container_keeps_what_a_step_wrote") {
        return;
    }
    let dir = shared_tempdir();
    let root = rootfs(dir.path());
    let image = layout(dir.path(), &root);
    let c = Cluster::start(dir.path(), 1, 8);
    let work = dir.path().join("work");
    std::fs::create_dir_all(&work).unwrap();
    let w = work.to_str().unwrap();
    let bin = dir.path().join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    std::os::unix::fs::symlink(common::gpuq_bin(), bin.join("srun")).unwrap();
    let srun = bin.join("srun");
    let srun = srun.display();
    let img = image.display();
    // Step 0: two tasks in the named container, each leaving a file in its
    // root; step 1 names it alone and finds both; step 2, the image without
    // the name, is a fresh container.
    let script = format!(
        "{srun} -n 2 --container-image {img} --container-name env sh -c 'echo $SLURM_PROCID > /left-$SLURM_PROCID'\n\
         echo STEP1=$({srun} -n 1 --container-name env sh -c 'cat /left-0 /left-1' | tr '\\n' ' ')\n\
         echo STEP2=$({srun} -n 1 --container-image {img} sh -c 'ls /left-0 2>/dev/null || echo fresh')\n\
         {srun} -n 1 --container-name nothing-here true || echo STEP3=refused\n"
    );
    let id = c
        .server
        .ok(&[
            "slurm",
            "sbatch",
            "--parsable",
            "-n",
            "2",
            "-D",
            w,
            "--wrap",
            &script,
        ])
        .trim()
        .to_string();
    let job = c.wait_state(&id, "COMPLETED", LONG);
    assert_eq!(job["exit_code"], 0, "{job}");
    let text = read(&work.join(format!("slurm-{id}.out")));
    let v = vars(&text);
    assert_eq!(
        words(v.get("STEP1").map_or("", String::as_str)),
        "0 1",
        "{text}"
    );
    assert_eq!(v.get("STEP2").map(String::as_str), Some("fresh"), "{text}");
    assert_eq!(
        v.get("STEP3").map(String::as_str),
        Some("refused"),
        "{text}"
    );
    assert!(
        text.contains("no container named nothing-here"),
        "the reason reaches the step's stderr: {text}"
    );
    // Alice's named container: rootless crun in the bound copy.
    let alice = ensure_user("gpuqt-alice");
    let hers = user_dir(&alice, &dir.path().join("alice"));
    let id = submit_as(
        &alice,
        &c.server.socket,
        &[
            "--container-image",
            image.to_str().unwrap(),
            "--container-name",
            "mine",
            "-D",
            hers.to_str().unwrap(),
            "--",
            "sh",
            "-c",
            "grep ^ID= /etc/os-release; echo MAP=$(cat /proc/self/uid_map)",
        ],
    );
    c.wait_state(&id, "COMPLETED", LONG);
    let v = vars(&read(&hers.join(format!("gpuq-{id}.out"))));
    assert_eq!(v["ID"], "gpuq-test", "{v:?}");
    assert_eq!(words(&v["MAP"]), format!("{0} {0} 1", alice.uid), "{v:?}");
    // Flags Pyxis has that gpuq does not are refused by name.
    let out = c.server.cli(&[
        "slurm",
        "sbatch",
        "--container-name",
        "env:exec",
        "--wrap",
        "true",
    ]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains(":exec flag is not supported"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn container_save_keeps_what_a_task_wrote_as_an_image_the_next_job_runs_in() {
    if !require_root("container_save_keeps_what_a_task_wrote") {
        return;
    }
    let dir = shared_tempdir();
    let root = rootfs(dir.path());
    let image = layout(dir.path(), &root);
    let c = Cluster::start(dir.path(), 1, 8);
    let work = dir.path().join("work");
    std::fs::create_dir_all(&work).unwrap();
    let w = work.to_str().unwrap();
    let saved = work.join("saved.sqsh");
    // Root's job writes into its container's root and saves it...
    let id = c.submit(&[
        "--container-image",
        image.to_str().unwrap(),
        "--container-save",
        saved.to_str().unwrap(),
        "-D",
        w,
        "--",
        "sh",
        "-c",
        "echo from-the-first-job > /made-here",
    ]);
    c.wait_state(&id, "COMPLETED", LONG);
    assert!(saved.is_file(), "no {}", saved.display());
    // ...and the next job runs in what it saved.
    let id = c.submit(&[
        "--container-image",
        saved.to_str().unwrap(),
        "-D",
        w,
        "--",
        "sh",
        "-c",
        "echo MADE=$(cat /made-here); grep ^ID= /etc/os-release",
    ]);
    c.wait_state(&id, "COMPLETED", LONG);
    let v = vars(&read(&work.join(format!("gpuq-{id}.out"))));
    assert_eq!(v["MADE"], "from-the-first-job", "{v:?}");
    assert_eq!(v["ID"], "gpuq-test", "{v:?}");
    // Alice saves only where she may write: elsewhere her job fails saying so.
    let alice = ensure_user("gpuqt-alice");
    let hers = user_dir(&alice, &dir.path().join("alice"));
    let submit = |to: &Path| {
        submit_as(
            &alice,
            &c.server.socket,
            &[
                "--container-image",
                image.to_str().unwrap(),
                "--container-save",
                to.to_str().unwrap(),
                "-D",
                hers.to_str().unwrap(),
                "--",
                "true",
            ],
        )
    };
    let mine = hers.join("mine.sqsh");
    let id = submit(&mine);
    c.wait_state(&id, "COMPLETED", LONG);
    assert_eq!(std::fs::metadata(&mine).unwrap().uid(), alice.uid);
    let id = submit(&work.join("not-hers.sqsh"));
    c.wait_state(&id, "FAILED", LONG);
    let said = read(&hers.join(format!("gpuq-{id}.out")));
    assert!(
        said.contains("gpuq: cannot save the container to") && said.contains("denied"),
        "{said}"
    );
    assert!(!work.join("not-hers.sqsh").exists());
    // A directory of hers as the image is copied as her: a file in it only
    // root may read is not copied (so no save hands it to her), and the job
    // fails saying so.
    let tree = dir.path().join("her-tree");
    let copied = std::process::Command::new("cp")
        .arg("-a")
        .arg(&root)
        .arg(&tree)
        .status()
        .unwrap();
    assert!(copied.success());
    std::fs::write(tree.join("etc/root-only"), "secret\n").unwrap();
    std::fs::set_permissions(
        tree.join("etc/root-only"),
        std::os::unix::fs::PermissionsExt::from_mode(0o600),
    )
    .unwrap();
    let leak = hers.join("leak.sqsh");
    let id = submit_as(
        &alice,
        &c.server.socket,
        &[
            "--container-image",
            tree.to_str().unwrap(),
            "--container-save",
            leak.to_str().unwrap(),
            "-D",
            hers.to_str().unwrap(),
            "--",
            "true",
        ],
    );
    let job = c.wait_state(&id, "FAILED", LONG);
    let reason = job["reason"].as_str().unwrap_or_default();
    assert!(
        reason.contains("root-only") && reason.contains("Permission denied"),
        "{reason}"
    );
    assert!(!leak.exists());
    // Readable by her, it is copied and saved, hers.
    std::fs::set_permissions(
        tree.join("etc/root-only"),
        std::os::unix::fs::PermissionsExt::from_mode(0o644),
    )
    .unwrap();
    let id = submit_as(
        &alice,
        &c.server.socket,
        &[
            "--container-image",
            tree.to_str().unwrap(),
            "--container-save",
            leak.to_str().unwrap(),
            "-D",
            hers.to_str().unwrap(),
            "--",
            "cat",
            "/etc/root-only",
        ],
    );
    c.wait_state(&id, "COMPLETED", LONG);
    assert_eq!(std::fs::metadata(&leak).unwrap().uid(), alice.uid);
}
