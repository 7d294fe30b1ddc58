//! Jobs in container images (`--container-image`) on a real OCI runtime
//! (crun): a server and agents as processes, the image a busybox-static
//! root filesystem made here, as a plain directory and packed by hand into
//! an OCI image layout (tar, gzip and sha256; no umoci). CI runs as root
//! with crun and busybox-static installed (`.ci/run`).

mod common;

use std::io::Write;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use common::{cli_as, ensure_user, require_root, shared_tempdir, stderr, Agent, Cluster};
use sha2::{Digest, Sha256};

const LONG: Duration = Duration::from_secs(60);

/// The `NAME` of the test image's os-release, which no host has.
const IMAGE_NAME: &str = "gpuq-test-busybox";

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()))
}

/// Fails, saying what to install, when crun or a static busybox is missing.
fn require_tools() -> PathBuf {
    let on_path = |name: &str| {
        std::env::var("PATH")
            .unwrap_or_default()
            .split(':')
            .map(|d| Path::new(d).join(name))
            .find(|p| p.is_file())
    };
    assert!(
        on_path("crun").is_some(),
        "crun is missing: install it (apt-get install -y crun busybox-static), as .ci/run does"
    );
    let busybox = on_path("busybox").unwrap_or_else(|| {
        panic!("busybox is missing: install busybox-static (apt-get install -y busybox-static)")
    });
    assert!(
        is_static(&busybox),
        "{} is dynamically linked; the test image needs busybox-static \
         (apt-get install -y busybox-static)",
        busybox.display()
    );
    busybox
}

/// Whether an ELF64 file has no program interpreter (is statically linked).
fn is_static(path: &Path) -> bool {
    let bytes = std::fs::read(path).unwrap();
    let word = |at: usize, n: usize| {
        bytes[at..at + n]
            .iter()
            .rev()
            .fold(0u64, |acc, b| (acc << 8) | u64::from(*b))
    };
    let (phoff, phentsize, phnum) = (word(0x20, 8), word(0x36, 2), word(0x38, 2));
    const PT_INTERP: u64 = 3;
    (0..phnum).all(|i| word((phoff + i * phentsize) as usize, 4) != PT_INTERP)
}

/// A root filesystem: busybox-static with a link per applet, and an
/// os-release that names the image.
fn rootfs(dir: &Path) -> PathBuf {
    let busybox = require_tools();
    let root = dir.join("rootfs");
    std::fs::create_dir_all(root.join("bin")).unwrap();
    std::fs::create_dir_all(root.join("etc")).unwrap();
    std::fs::copy(&busybox, root.join("bin/busybox")).unwrap();
    let list = std::process::Command::new(&busybox)
        .arg("--list")
        .output()
        .unwrap();
    for applet in String::from_utf8_lossy(&list.stdout).lines() {
        if applet != "busybox" {
            std::os::unix::fs::symlink("busybox", root.join("bin").join(applet)).unwrap();
        }
    }
    std::fs::write(
        root.join("etc/os-release"),
        format!("NAME=\"{IMAGE_NAME}\"\nID=gpuq-test\n"),
    )
    .unwrap();
    root
}

/// Packs `rootfs` into an OCI image layout at `dir/layout`: one gzip layer,
/// a config with the image's `Env`, a manifest and `index.json`.
fn layout(dir: &Path, rootfs: &Path) -> PathBuf {
    let out = dir.join("layout");
    let blobs = out.join("blobs/sha256");
    std::fs::create_dir_all(&blobs).unwrap();
    let put = |bytes: &[u8]| {
        let hex = hex::encode(Sha256::digest(bytes));
        std::fs::write(blobs.join(&hex), bytes).unwrap();
        serde_json::json!({"digest": format!("sha256:{hex}"), "size": bytes.len()})
    };
    let mut tar = tar::Builder::new(Vec::new());
    tar.follow_symlinks(false);
    tar.append_dir_all(".", rootfs).unwrap();
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    gz.write_all(&tar.into_inner().unwrap()).unwrap();
    let mut layer = put(&gz.finish().unwrap());
    layer["mediaType"] = "application/vnd.oci.image.layer.v1.tar+gzip".into();
    let arch = match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        other => other,
    };
    let config = serde_json::json!({"architecture": arch, "os": "linux",
        "config": {"Env": ["PATH=/bin", "FROM_IMAGE=yes"]},
        "rootfs": {"type": "layers", "diff_ids": []}});
    let mut config = put(config.to_string().as_bytes());
    config["mediaType"] = "application/vnd.oci.image.config.v1+json".into();
    let manifest = serde_json::json!({"schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": config, "layers": [layer]});
    let mut manifest = put(manifest.to_string().as_bytes());
    manifest["mediaType"] = "application/vnd.oci.image.manifest.v1+json".into();
    let index = serde_json::json!({"schemaVersion": 2, "manifests": [manifest]});
    std::fs::write(out.join("index.json"), index.to_string()).unwrap();
    std::fs::write(out.join("oci-layout"), r#"{"imageLayoutVersion":"1.0.0"}"#).unwrap();
    out
}

/// `KEY=VALUE` lines of a task's output.
fn vars(text: &str) -> std::collections::BTreeMap<String, String> {
    text.lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// How many images the node unpacked (its cache's record).
fn unpacks(agent: &Agent) -> usize {
    std::fs::read_to_string(agent.dir.join("data/images/unpacks.log"))
        .map(|t| t.lines().count())
        .unwrap_or(0)
}

fn alive(pid: i32) -> bool {
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None).is_ok()
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
        nodes.to_string().contains("\"oci\""),
        "no node has the oci feature: {nodes}"
    );
    let alice = ensure_user("gpuqt-alice");
    let work = dir.path().join("alice");
    std::fs::create_dir_all(&work).unwrap();
    nix::unistd::chown(&work, Some(alice.uid.into()), Some(alice.gid.into())).unwrap();
    let w = work.to_str().unwrap();
    let probe = "cat /etc/os-release; echo UID=$(id -u); echo GID=$(id -g); \
                 echo CVD=$CUDA_VISIBLE_DEVICES; echo JOB=$GPUQ_JOB_ID; \
                 echo SLURM=$SLURM_JOB_ID; echo PWD=$(pwd); echo FROM_IMAGE=$FROM_IMAGE; \
                 echo PATH=$PATH; test -e /usr/bin/crun && echo HOST=visible; \
                 echo NVIDIA=$(ls /dev | grep -c nvidia); touch made.txt";
    let submit = |image: &Path| {
        let out = cli_as(
            &alice,
            &c.server.socket,
            &[
                "submit",
                "--parsable",
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
        );
        assert!(out.status.success(), "{}", stderr(&out));
        String::from_utf8_lossy(&out.stdout).trim().to_string()
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
    let out = cli_as(
        &alice,
        &c.server.socket,
        &["submit", "--parsable", "-D", w, script.to_str().unwrap()],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let id = String::from_utf8_lossy(&out.stdout).trim().to_string();
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
    // Not yet: a process beside a container's task.
    let out = c.server.cli(&["exec", &id, "--", "true"]);
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("runs in a container"),
        "{}",
        stderr(&out)
    );
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
fn four_jobs_started_together_with_one_layout_unpack_it_once() {
    if !require_root("four_jobs_started_together_with_one_layout_unpack_it_once") {
        return;
    }
    let dir = shared_tempdir();
    let root = rootfs(dir.path());
    let image = layout(dir.path(), &root);
    let c = Cluster::start(dir.path(), 1, 8);
    let work = dir.path().join("work");
    std::fs::create_dir_all(&work).unwrap();
    // One bulk submit: one log entry, so one scheduling pass starts all four
    // and their shims meet at the cache.
    let lines: String = (0..4)
        .map(|i| format!("-J c{i} -o out-{i}.txt -- cat /etc/os-release\n"))
        .collect();
    let file = dir.path().join("jobs.txt");
    std::fs::write(&file, lines).unwrap();
    let ids: Vec<String> = c
        .server
        .ok(&[
            "submit",
            "--parsable",
            "--container-image",
            image.to_str().unwrap(),
            "-D",
            work.to_str().unwrap(),
            "--from",
            file.to_str().unwrap(),
        ])
        .lines()
        .map(str::to_string)
        .collect();
    assert_eq!(ids.len(), 4);
    for id in &ids {
        c.wait_state(id, "COMPLETED", LONG);
    }
    for i in 0..4 {
        assert!(read(&work.join(format!("out-{i}.txt"))).contains(IMAGE_NAME));
    }
    assert_eq!(unpacks(&c.agents[0]), 1, "one unpack for four jobs");
    // Later jobs find it in the cache.
    let id = c.submit(&[
        "--container-image",
        image.to_str().unwrap(),
        "-D",
        work.to_str().unwrap(),
        "--",
        "true",
    ]);
    c.wait_state(&id, "COMPLETED", LONG);
    assert_eq!(unpacks(&c.agents[0]), 1);
}

#[test]
fn what_only_the_node_can_know_fails_the_job_with_the_reason() {
    if !require_root("what_only_the_node_can_know_fails_the_job_with_the_reason") {
        return;
    }
    let dir = shared_tempdir();
    let root = rootfs(dir.path());
    let c = Cluster::start(dir.path(), 1, 8);
    let token = c.server.ok(&["token", "create"]).trim().to_string();
    let n2 = Agent::start_with(
        &c.server,
        &dir.path().join("n2"),
        "n2",
        8,
        &token,
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
    let mine = dir.path().join("alice");
    std::fs::create_dir_all(&mine).unwrap();
    nix::unistd::chown(&mine, Some(alice.uid.into()), Some(alice.gid.into())).unwrap();
    let source = format!("{}/data", private.display());
    let out = cli_as(
        &alice,
        &c.server.socket,
        &[
            "submit",
            "--parsable",
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
    assert!(out.status.success(), "{}", stderr(&out));
    let id = String::from_utf8_lossy(&out.stdout).trim().to_string();
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
    let c = Cluster::start(dir.path(), 1, 8);
    let cases: [(&[&str], &[&str]); 6] = [
        (
            &["--container-image", "images/tiny"],
            &["--container-image", "relative", "absolute"],
        ),
        (
            &["--container-image", "docker://ubuntu:22.04"],
            &["--container-image", "no pull tool", "absolute path"],
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
            let out = c.server.cli(&args);
            let err = stderr(&out);
            assert_eq!(out.status.code(), Some(1), "{args:?}: {err}");
            for word in words {
                assert!(err.contains(word), "{args:?}: {word:?} not in {err}");
            }
        }
    }
    let queue: serde_json::Value =
        serde_json::from_str(&c.server.ok(&["queue", "--all", "--json"])).unwrap();
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
