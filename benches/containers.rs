//! What a container costs a job, on a real cluster (a server and an agent
//! as processes on loopback, crun, real shims):
//!
//! - start overhead: the same job (`touch MARK`), submitted by a user,
//!   bare and in a cached busybox image, with crun rootless (node n1: the
//!   runtime runs as the user in a user namespace) and run as root (node
//!   n2, `rootless = false`), one at a time and interleaved: submit -> the task's
//!   first write (the mark's mtime against the job's `submit_time`, both
//!   this host's clock), and submit -> COMPLETED (`end_time`); p50/p99 of
//!   each and the difference of the p50s. The agent notices a task's end
//!   at its next reconcile (every 100 ms, or at the leader's next message),
//!   so COMPLETED carries that granularity; the first write does not;
//! - first start of a large image: an OCI layout of one gzip layer holding
//!   GPUQ_BENCH_IMAGE_MB (1024) MiB of random files, submit -> first write
//!   with the unpack (and the unpack alone, from the cache's log), then the
//!   same job again from the cache.
//!
//! Prints the figures and target/bench/containers.json; asserts nothing.
//! Needs root, crun and busybox-static (as tests/containers.rs). Run:
//! `cargo bench --bench containers`; GPUQ_BENCH_N (jobs per kind, 20),
//! GPUQ_BENCH_IMAGE_MB.

#[path = "../tests/common/mod.rs"]
mod common;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::{env_u64, pct, Agent, Cluster, TestUser};
use sha2::{Digest, Sha256};

const LONG: Duration = Duration::from_secs(600);

/// A busybox-static root filesystem under `dir`.
fn rootfs(dir: &Path) -> PathBuf {
    let busybox = ["/bin/busybox", "/usr/bin/busybox"]
        .iter()
        .map(PathBuf::from)
        .find(|p| p.is_file())
        .expect("busybox-static is missing: apt-get install -y busybox-static");
    let root = dir.join("rootfs");
    std::fs::create_dir_all(root.join("bin")).unwrap();
    std::fs::create_dir_all(root.join("etc")).unwrap();
    std::fs::copy(&busybox, root.join("bin/busybox")).unwrap();
    for applet in ["sh", "true", "cat", "touch"] {
        std::os::unix::fs::symlink("busybox", root.join("bin").join(applet)).unwrap();
    }
    std::fs::write(root.join("etc/os-release"), "NAME=bench\n").unwrap();
    root
}

/// Writes `bytes` as a blob of `layout`; its descriptor.
fn put(layout: &Path, bytes: &[u8], media_type: &str) -> serde_json::Value {
    let hex = hex::encode(Sha256::digest(bytes));
    std::fs::write(layout.join("blobs/sha256").join(&hex), bytes).unwrap();
    serde_json::json!({"mediaType": media_type, "digest": format!("sha256:{hex}"),
        "size": bytes.len()})
}

/// A writer that hashes and counts what it passes on.
struct Hashing<W> {
    inner: W,
    hash: Sha256,
    size: u64,
}

impl<W: Write> Write for Hashing<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.hash.update(&buf[..n]);
        self.size += n as u64;
        Ok(n)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

/// An OCI layout of `root` in one gzip layer, streamed to disk.
fn layout(dir: &Path, root: &Path, name: &str) -> PathBuf {
    let out = dir.join(name);
    let blobs = out.join("blobs/sha256");
    std::fs::create_dir_all(&blobs).unwrap();
    let staging = out.join("layer.tmp");
    let file = std::fs::File::create(&staging).unwrap();
    let hashing = Hashing {
        inner: std::io::BufWriter::new(file),
        hash: Sha256::new(),
        size: 0,
    };
    let gz = flate2::write::GzEncoder::new(hashing, flate2::Compression::fast());
    let mut tar = tar::Builder::new(gz);
    tar.follow_symlinks(false);
    tar.append_dir_all(".", root).unwrap();
    let mut hashing = tar.into_inner().unwrap().finish().unwrap();
    hashing.flush().unwrap();
    let hex = hex::encode(hashing.hash.finalize());
    std::fs::rename(&staging, blobs.join(&hex)).unwrap();
    let layer = serde_json::json!({"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip",
        "digest": format!("sha256:{hex}"), "size": hashing.size});
    let config = serde_json::json!({"architecture": "amd64", "os": "linux",
        "config": {"Env": ["PATH=/bin"]}, "rootfs": {"type": "layers", "diff_ids": []}});
    let config = put(
        &out,
        config.to_string().as_bytes(),
        "application/vnd.oci.image.config.v1+json",
    );
    let manifest = serde_json::json!({"schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": config, "layers": [layer]});
    let manifest = put(
        &out,
        manifest.to_string().as_bytes(),
        "application/vnd.oci.image.manifest.v1+json",
    );
    let index = serde_json::json!({"schemaVersion": 2, "manifests": [manifest]});
    std::fs::write(out.join("index.json"), index.to_string()).unwrap();
    out
}

/// `mb` MiB of random files (64 MiB each) under `root/data`.
fn random_files(root: &Path, mb: u64) {
    use rand::RngCore;
    let data = root.join("data");
    std::fs::create_dir_all(&data).unwrap();
    let mut rng = rand::thread_rng();
    let mut buf = vec![0u8; 1 << 20];
    let mut left = mb;
    let mut i = 0;
    while left > 0 {
        let n = left.min(64);
        let mut f = std::io::BufWriter::new(
            std::fs::File::create(data.join(format!("blob-{i}.bin"))).unwrap(),
        );
        for _ in 0..n {
            rng.fill_bytes(&mut buf);
            f.write_all(&buf).unwrap();
        }
        left -= n;
        i += 1;
    }
}

/// One run of a job: submit -> its first write and -> COMPLETED, in ms.
struct Run {
    start: f64,
    done: f64,
}

/// Submits `touch MARK` as `user` on `node` (in `image`, if any) and
/// waits for it.
fn run_touch(
    c: &Cluster,
    user: &TestUser,
    node: &str,
    work: &Path,
    image: Option<&Path>,
    n: &mut u32,
) -> Run {
    *n += 1;
    let mark = format!("mark-{n}");
    let w = work.to_str().unwrap();
    let mut args = vec!["submit", "--parsable", "-w", node, "-D", w];
    if let Some(image) = image {
        args.extend(["--container-image", image.to_str().unwrap()]);
    }
    args.extend(["--", "touch", &mark]);
    let out = common::cli_as(user, &c.server.socket, &args);
    assert!(out.status.success(), "{}", common::stderr(&out));
    let id = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let job = c.wait_state(&id, "COMPLETED", LONG);
    let at = |k: &str| job[k].as_u64().unwrap_or_else(|| panic!("{k}: {job}")) as f64;
    let written = std::fs::metadata(work.join(&mark))
        .and_then(|m| m.modified())
        .unwrap()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
        * 1000.0;
    Run {
        start: written - at("submit_time"),
        done: at("end_time") - at("submit_time"),
    }
}

fn summary(mut ms: Vec<f64>) -> (f64, f64) {
    ms.sort_by(|a, b| a.total_cmp(b));
    (pct(&ms, 0.5), pct(&ms, 0.99))
}

fn last_unpack_ms(c: &Cluster) -> String {
    let log = std::fs::read_to_string(c.agents[0].dir.join("data/images/unpacks.log"))
        .unwrap_or_default();
    log.lines()
        .last()
        .and_then(|l| l.split_whitespace().find(|w| w.ends_with("ms")))
        .unwrap_or("?")
        .to_string()
}

fn main() {
    if !common::is_root() {
        println!("NOT RUN: the containers bench needs root (and crun, busybox-static)");
        return;
    }
    let n = env_u64("GPUQ_BENCH_N", 20) as usize;
    let image_mb = env_u64("GPUQ_BENCH_IMAGE_MB", 1024);
    let dir = tempfile::tempdir().unwrap();
    let root = rootfs(dir.path());
    let small = layout(dir.path(), &root, "small");
    let c = Cluster::start(&dir.path().join("cluster"), 1, 8);
    let token = c.server.ok(&["token", "create"]).trim().to_string();
    let _n2 = Agent::start_with(
        &c.server,
        &dir.path().join("cluster/n2"),
        "n2",
        8,
        &token,
        "[agent.containers]\nrootless = false\n",
    );
    common::wait_for("n2 registered", LONG, || {
        c.server
            .ok(&["nodes"])
            .lines()
            .any(|l| l.starts_with("n2 "))
    });
    let user = common::ensure_user("gpuqt-bench");
    let work = dir.path().join("work");
    std::fs::create_dir_all(&work).unwrap();
    nix::unistd::chown(&work, Some(user.uid.into()), Some(user.gid.into())).unwrap();

    // Warm: the image in both nodes' caches, the binaries in the page cache.
    let mut marks = 0;
    for node in ["n1", "n2"] {
        run_touch(&c, &user, node, &work, Some(&small), &mut marks);
        run_touch(&c, &user, node, &work, None, &mut marks);
    }
    let (mut bare, mut boxed, mut as_root) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..n {
        bare.push(run_touch(&c, &user, "n1", &work, None, &mut marks));
        boxed.push(run_touch(&c, &user, "n1", &work, Some(&small), &mut marks));
        as_root.push(run_touch(&c, &user, "n2", &work, Some(&small), &mut marks));
    }
    let stats = |runs: &[Run], f: fn(&Run) -> f64| summary(runs.iter().map(f).collect());
    let (bs50, bs99) = stats(&bare, |r| r.start);
    let (cs50, cs99) = stats(&boxed, |r| r.start);
    let (rs50, rs99) = stats(&as_root, |r| r.start);
    let (bd50, bd99) = stats(&bare, |r| r.done);
    let (cd50, cd99) = stats(&boxed, |r| r.done);
    let (rd50, rd99) = stats(&as_root, |r| r.done);
    println!(
        "{:<52} {:>8} {:>8}",
        "`touch MARK`, one job at a time", "p50 ms", "p99 ms"
    );
    println!(
        "{:<52} {bs50:>8.1} {bs99:>8.1}",
        format!("submit -> first write, bare ({n} jobs)")
    );
    println!(
        "{:<52} {cs50:>8.1} {cs99:>8.1}",
        format!("submit -> first write, cached image, rootless ({n})")
    );
    println!(
        "{:<52} {rs50:>8.1} {rs99:>8.1}",
        format!("submit -> first write, cached image, as root ({n})")
    );
    println!(
        "{:<52} {:>8.1}",
        "container start overhead, rootless (p50 difference)",
        cs50 - bs50
    );
    println!(
        "{:<52} {:>8.1}",
        "container start overhead, as root (p50 difference)",
        rs50 - bs50
    );
    println!(
        "{:<52} {bd50:>8.1} {bd99:>8.1}",
        "submit -> COMPLETED, bare"
    );
    println!(
        "{:<52} {cd50:>8.1} {cd99:>8.1}",
        "submit -> COMPLETED, cached image, rootless"
    );
    println!(
        "{:<52} {rd50:>8.1} {rd99:>8.1}",
        "submit -> COMPLETED, cached image, as root"
    );

    let big_root = dir.path().join("big");
    std::fs::create_dir_all(&big_root).unwrap();
    let t = Instant::now();
    std::fs::rename(&root, big_root.join("rootfs")).unwrap();
    let big_rootfs = big_root.join("rootfs");
    random_files(&big_rootfs, image_mb);
    let big = layout(&big_root, &big_rootfs, "layout");
    std::fs::remove_dir_all(&big_rootfs).unwrap();
    println!(
        "(made a {image_mb} MiB image, one gzip layer, in {:.1} s)",
        t.elapsed().as_secs_f64()
    );
    let first = run_touch(&c, &user, "n1", &work, Some(&big), &mut marks);
    let unpack = last_unpack_ms(&c);
    let again = run_touch(&c, &user, "n1", &work, Some(&big), &mut marks);
    println!(
        "{:<52} {:>8.0}",
        format!("first start of a {image_mb} MiB image (unpack {unpack})"),
        first.start
    );
    println!(
        "{:<52} {:>8.1}",
        "the same image again, from the cache", again.start
    );
    let json = serde_json::json!({
        "start_ms": {"bare": {"p50": bs50, "p99": bs99}, "container": {"p50": cs50, "p99": cs99},
            "container_as_root": {"p50": rs50, "p99": rs99}},
        "completed_ms": {"bare": {"p50": bd50, "p99": bd99}, "container": {"p50": cd50, "p99": cd99},
            "container_as_root": {"p50": rd50, "p99": rd99}},
        "start_overhead_p50_ms": cs50 - bs50,
        "start_overhead_as_root_p50_ms": rs50 - bs50,
        "large_image_mb": image_mb,
        "large_image_first_start_ms": first.start,
        "large_image_unpack": unpack,
        "large_image_cached_start_ms": again.start,
    });
    let out = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/bench");
    let _ = std::fs::create_dir_all(&out);
    let _ = std::fs::write(out.join("containers.json"), json.to_string());
}
