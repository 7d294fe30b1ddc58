//! Container images as the nodes meet them (on crun, as
//! `tests/containers.rs`): OCI archives, `docker save` archives and
//! squashfs files besides layouts, apptainer's SIF files; Pyxis's `--container-env` and
//! writability; damaged images failing their job with nothing left behind;
//! and the node's image cache: one unpack for jobs that start together,
//! and least-recently-used eviction past its cap of what no task holds.

mod common;
mod images;

use std::path::Path;

use common::{ensure_user, require_root, shared_tempdir, submit_as, user_dir, Agent, Cluster};
use images::{
    docker_archive, layout, oci_archive, read, rootfs, sif, squashfs, unpacks, vars, IMAGE_NAME,
    LONG,
};

#[test]
fn eight_jobs_started_together_with_one_archive_unpack_it_once() {
    if !require_root("eight_jobs_started_together_with_one_archive_unpack_it_once") {
        return;
    }
    let dir = shared_tempdir();
    let root = rootfs(dir.path());
    let image = layout(dir.path(), &root);
    let archive = oci_archive(dir.path(), &image);
    let c = Cluster::start(dir.path(), 1, 8);
    let work = dir.path().join("work");
    std::fs::create_dir_all(&work).unwrap();
    // One bulk submit: one log entry, so one scheduling pass starts all
    // eight and their shims meet at the cache. Each holds on until all
    // eight run, so they are known to have run at once.
    let lines: String = (0..8)
        .map(|i| {
            format!(
                "-J c{i} -o out-{i}.txt -- sh -c 'touch ran-{i}; cat /etc/os-release; \
                 for t in $(seq 600); do [ $(ls ran-* | wc -l) = 8 ] && break; sleep 0.1; done; \
                 echo SEEN=$(ls ran-* | wc -l)'\n"
            )
        })
        .collect();
    let file = dir.path().join("jobs.txt");
    std::fs::write(&file, lines).unwrap();
    let ids: Vec<String> = c
        .server
        .ok(&[
            "submit",
            "--parsable",
            "--container-image",
            archive.to_str().unwrap(),
            "-D",
            work.to_str().unwrap(),
            "--from",
            file.to_str().unwrap(),
        ])
        .lines()
        .map(str::to_string)
        .collect();
    assert_eq!(ids.len(), 8);
    for id in &ids {
        c.wait_state(id, "COMPLETED", LONG);
    }
    for i in 0..8 {
        let text = read(&work.join(format!("out-{i}.txt")));
        assert!(text.contains(IMAGE_NAME), "{text}");
        assert!(text.contains("SEEN=8"), "job {i} ran alone: {text}");
    }
    assert_eq!(unpacks(&c.agents[0]), 1, "one unpack for eight jobs");
    // Later jobs find it in the cache, from the archive or from the layout
    // it was made of (the same manifest digest).
    for img in [&archive, &image] {
        let id = c.submit(&[
            "--container-image",
            img.to_str().unwrap(),
            "-D",
            work.to_str().unwrap(),
            "--",
            "true",
        ]);
        c.wait_state(&id, "COMPLETED", LONG);
    }
    assert_eq!(unpacks(&c.agents[0]), 1);
}

#[test]
fn docker_archives_and_squashfs_images_run_with_pyxis_env_and_writability() {
    if !require_root("docker_archives_and_squashfs_images_run") {
        return;
    }
    let dir = shared_tempdir();
    let root = rootfs(dir.path());
    let docker = docker_archive(dir.path(), &root, "docker");
    let sqsh = squashfs(dir.path(), &root);
    let c = Cluster::start(dir.path(), 1, 8);
    let work = dir.path().join("work");
    std::fs::create_dir_all(&work).unwrap();
    let w = work.to_str().unwrap();
    let probe = "cat /etc/os-release; echo FROM_IMAGE=$FROM_IMAGE; echo LANG=$LANG; \
                 echo JOB=$GPUQ_JOB_ID; if touch /made-here 2>/dev/null; then echo ROOT=rw; \
                 else echo ROOT=ro; fi";
    let run = |image: &Path, flags: &[&str]| {
        let mut args = vec!["--container-image", image.to_str().unwrap(), "-D", w];
        args.extend_from_slice(flags);
        args.extend_from_slice(&["--export", "ALL,FROM_IMAGE=job,LANG=job"]);
        args.extend_from_slice(&["--", "sh", "-c", probe]);
        let id = c.submit(&args);
        let job = c.wait_state(&id, "COMPLETED", LONG);
        assert_eq!(job["exit_code"], 0, "{job}");
        (
            id.clone(),
            vars(&read(&work.join(format!("gpuq-{id}.out")))),
        )
    };
    // The image's Env wins, as in Pyxis, except what --container-env names
    // and gpuq's own; the root filesystem is writable by default.
    let (id, v) = run(&docker, &["--container-env", "LANG"]);
    assert_eq!(v["NAME"], format!("\"{IMAGE_NAME}\""), "{v:?}");
    assert_eq!(
        (
            v["FROM_IMAGE"].as_str(),
            v["LANG"].as_str(),
            v["ROOT"].as_str()
        ),
        ("yes", "job", "rw"),
        "{v:?}"
    );
    assert_eq!(v["JOB"], id);
    // A squashfs image, read-only on request; the write went to the task's
    // own layer, never to the image.
    let (_, v) = run(&sqsh, &["--container-readonly"]);
    assert_eq!(v["NAME"], format!("\"{IMAGE_NAME}\""), "{v:?}");
    assert_eq!(
        (v["LANG"].as_str(), v["ROOT"].as_str()),
        ("job", "ro"),
        "{v:?}"
    );
    let (_, v) = run(&docker, &["--container-writable"]);
    assert_eq!(
        (v["LANG"].as_str(), v["ROOT"].as_str()),
        ("image", "rw"),
        "{v:?}"
    );
    assert_eq!(unpacks(&c.agents[0]), 2, "one unpack per image");

    // A damaged archive (a layer's bytes changed, its length kept), a cut
    // one and a damaged squashfs file fail the job, saying so.
    // (Another image: a damaged copy of the one above is found in the cache
    // by its config's digest, as it should be, and never read.)
    let bytes = std::fs::read(docker_archive(dir.path(), &root, "other")).unwrap();
    let at = bytes
        .windows(IMAGE_NAME.len())
        .position(|w| w == IMAGE_NAME.as_bytes())
        .unwrap();
    let mut damaged = bytes.clone();
    damaged[at] ^= 0x20;
    let bad_docker = dir.path().join("damaged.tar");
    std::fs::write(&bad_docker, &damaged).unwrap();
    let cut = dir.path().join("cut.tar");
    std::fs::write(&cut, &bytes[..bytes.len() / 2 + 100]).unwrap();
    let mut sq = std::fs::read(&sqsh).unwrap();
    let len = sq.len();
    sq[len / 2..].fill(0x5a);
    let bad_sqsh = dir.path().join("damaged.sqsh");
    std::fs::write(&bad_sqsh, &sq).unwrap();
    for (image, words) in [
        (&bad_docker, &["damaged.tar", "is damaged"][..]),
        (&cut, &["cut.tar"][..]),
        (&bad_sqsh, &["damaged.sqsh", "unsquashfs failed"][..]),
    ] {
        let id = c.submit(&[
            "--container-image",
            image.to_str().unwrap(),
            "-D",
            w,
            "--",
            "true",
        ]);
        let job = c.wait_state(&id, "FAILED", LONG);
        let reason = job["reason"].as_str().unwrap_or_default();
        for word in words {
            assert!(
                reason.contains(word),
                "{}: {word:?} not in {reason}",
                image.display()
            );
        }
    }
    // Nothing half-unpacked is left, and nothing mounted.
    let cache = c.agents[0].dir.join("data/images");
    let left: Vec<String> = std::fs::read_dir(&cache)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n.contains(".unpacking") || n.contains(".evicting"))
        .collect();
    assert!(left.is_empty(), "{left:?}");
    assert_eq!(unpacks(&c.agents[0]), 2);
    let mounts = read(Path::new("/proc/self/mountinfo"));
    assert!(!mounts.contains(dir.path().to_str().unwrap()), "{mounts}");
}

#[test]
fn past_the_cache_cap_images_no_task_holds_are_evicted_least_recently_used_first() {
    if !require_root("past_the_cache_cap_images_are_evicted") {
        return;
    }
    let dir = shared_tempdir();
    let root = rootfs(dir.path());
    let a = layout(dir.path(), &root);
    let b = docker_archive(dir.path(), &root, "b");
    let c_image = docker_archive(dir.path(), &root, "c");
    let c = Cluster::start(dir.path(), 0, 8);
    let token = c.server.ok(&["token", "create"]).trim().to_string();
    // A cap of 1 MiB: smaller than any one of these images (busybox).
    let n1 = Agent::start_with(
        &c.server,
        &dir.path().join("n1"),
        "n1",
        8,
        &token,
        "[agent.containers]\ncache_max_mb = 1\n",
    );
    common::wait_for("n1 registered", LONG, || {
        c.server
            .ok(&["nodes"])
            .lines()
            .any(|l| l.starts_with("n1 "))
    });
    let work = dir.path().join("work");
    std::fs::create_dir_all(&work).unwrap();
    let w = work.to_str().unwrap();
    let cache = n1.dir.join("data/images");
    let evicted = || {
        std::fs::read_to_string(cache.join("evictions.log"))
            .map(|t| t.lines().count())
            .unwrap_or(0)
    };
    let entries = || {
        std::fs::read_dir(&cache)
            .unwrap()
            .filter_map(|e| e.ok())
            .filter(|e| e.path().join("rootfs").is_dir())
            .count()
    };
    let run = |image: &Path, cmd: &str| {
        c.submit(&[
            "--container-image",
            image.to_str().unwrap(),
            "-D",
            w,
            "--",
            "sh",
            "-c",
            cmd,
        ])
    };
    // A runs while B is unpacked: A is held, so it stays past the cap.
    let held = run(&a, "touch a.running; sleep 300");
    common::wait_for("the job in A running", LONG, || {
        work.join("a.running").exists()
    });
    let id = run(&b, "true");
    c.wait_state(&id, "COMPLETED", LONG);
    assert_eq!((entries(), evicted()), (2, 0), "A is in use, B just made");
    c.server.ok(&["cancel", &held]);
    c.wait_state(&held, "CANCELLED", LONG);
    // Unpacking C evicts both, now free, to come under the cap.
    let id = run(&c_image, "cat /etc/os-release");
    c.wait_state(&id, "COMPLETED", LONG);
    assert_eq!((entries(), evicted()), (1, 2));
    // A again: unpacked anew (the fourth unpack), and it still runs.
    let id = run(&a, "cat /etc/os-release > a.out");
    c.wait_state(&id, "COMPLETED", LONG);
    assert!(read(&work.join("a.out")).contains(IMAGE_NAME));
    assert_eq!(unpacks(&n1), 4);
}

#[test]
fn an_apptainer_sif_image_runs_its_commands_with_its_environment() {
    if !require_root("an_apptainer_sif_image_runs") {
        return;
    }
    let dir = shared_tempdir();
    let root = rootfs(dir.path());
    let image = sif(dir.path(), &root, "app", 1);
    let encrypted = sif(dir.path(), &root, "secret", 5);
    let c = Cluster::start(dir.path(), 1, 8);
    let alice = ensure_user("gpuqt-alice");
    let work = user_dir(&alice, &dir.path().join("work"));
    let w = work.to_str().unwrap();
    let submit =
        |image: &Path| {
            submit_as(&alice, &c.server.socket, &[
                "--container-image",
                image.to_str().unwrap(),
                "-D",
                w,
                "--",
                "sh",
                "-c",
                "cat /etc/os-release; echo FROM_SIF=$FROM_SIF; echo PATH=$PATH; echo UID=$(id -u)",
            ])
        };
    // The image's files, and its environment scripts sourced first, as
    // `apptainer exec` does; run as alice.
    let id = submit(&image);
    let job = c.wait_state(&id, "COMPLETED", LONG);
    assert_eq!(job["exit_code"], 0, "{job}");
    let v = vars(&read(&work.join(format!("gpuq-{id}.out"))));
    assert_eq!(v["NAME"], format!("\"{IMAGE_NAME}\""), "{v:?}");
    assert_eq!(v["FROM_SIF"], "yes", "{v:?}");
    assert!(v["PATH"].starts_with("/opt/sif/bin:"), "{v:?}");
    assert_eq!(v["UID"], alice.uid.to_string(), "{v:?}");
    assert_eq!(unpacks(&c.agents[0]), 1);
    // An encrypted one fails the job saying so.
    let id = submit(&encrypted);
    let job = c.wait_state(&id, "FAILED", LONG);
    let reason = job["reason"].as_str().unwrap_or_default();
    assert!(
        reason.contains("secret.sif is an encrypted SIF file"),
        "{reason}"
    );
}
