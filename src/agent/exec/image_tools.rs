//! Images that need a tool of the node: squashfs files (enroot's `.sqsh`),
//! unpacked by `unsquashfs` (squashfs-tools), and registry references
//! (`docker://REF`), pulled by `skopeo` into an OCI layout that is then
//! unpacked as any other. Where the tool is missing, the job fails saying
//! which one to install; an agent that finds skopeo gives its node the
//! feature `oci-pull`, so registry images are refused at submit where no
//! node can pull them.
//!
//! A squashfs file is keyed by the digest of its content, computed once
//! per file version: `<cache>/digests/` remembers it by the file's device,
//! inode, size and change times, so a start that finds the image in the
//! cache does not read a large file again. The tool runs as root, but it
//! reads the file the shim opened as the job's user (through
//! `/proc/<shim>/fd/N`), never a path the user may not read; what it
//! writes stays in the root-only cache and reaches a task only through the
//! `nosuid`, `nodev` overlay (squashfs-tools 4.5.1 and later refuse names
//! that climb out of the destination themselves). Pulled
//! layouts stay in `<cache>/pulls/<hash of the reference>`, so a later pull
//! of the same reference fetches only the layers that changed.

use std::fs::{self, File};
use std::io::{self, Read};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{DirBuilderExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use sha2::{Digest, Sha256};

use super::image_cache::Cache;
use super::image_files::Resolved;
use super::task::{hostname, Pull};

/// Where tools are looked up when the agent's PATH has none.
const FALLBACK_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// An executable `name` (or the path `name`) in `path`, then the usual
/// directories.
pub fn find_tool(name: &str, path: &str) -> Option<PathBuf> {
    if name.contains('/') {
        return Some(PathBuf::from(name)).filter(|p| is_executable(p));
    }
    path.split(':')
        .chain(FALLBACK_PATH.split(':'))
        .filter(|d| !d.is_empty())
        .map(|d| Path::new(d).join(name))
        .find(|p| is_executable(p))
}

fn is_executable(p: &Path) -> bool {
    fs::metadata(p).is_ok_and(|m| m.is_file() && m.mode() & 0o111 != 0)
}

fn tool(name: &str) -> Option<PathBuf> {
    find_tool(name, &std::env::var("PATH").unwrap_or_default())
}

/// Runs `cmd`; an error is the tool's last words.
fn run(mut cmd: Command, name: &str) -> Result<(), String> {
    let out = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .output()
        .map_err(|e| format!("cannot run {name}: {e}"))?;
    if out.status.success() {
        return Ok(());
    }
    let said = String::from_utf8_lossy(&out.stderr);
    let last = said.lines().rev().find(|l| !l.trim().is_empty()).map_or(
        format!("it failed ({}) and said nothing", out.status),
        |l| l.trim().to_string(),
    );
    Err(format!("{name} failed: {last}"))
}

/// The squashfs file system at `offset` in `file` (the image `shown`; 0,
/// or a SIF image's root partition), unpacked once per node into the cache.
pub fn squashfs(file: File, shown: &str, cache: &Cache, offset: u64) -> Result<Resolved, String> {
    let Some(unsquashfs) = tool("unsquashfs") else {
        return Err(format!(
            "container image {shown} is a squashfs (or SIF) file, and node {} has no unsquashfs to \
             unpack it: install squashfs-tools there, or give an OCI archive (.tar) or an \
             image directory",
            hostname()
        ));
    };
    let digest = content_digest(&file, &cache.dir)
        .map_err(|e| format!("cannot read container image {shown}: {e}"))?;
    let entry = cache.entry(&digest, shown, |rootfs| {
        let source = format!("/proc/{}/fd/{}", std::process::id(), file.as_raw_fd());
        let mut cmd = Command::new(&unsquashfs);
        cmd.args(["-no-progress", "-no-xattrs", "-f"]);
        if offset > 0 {
            cmd.arg("-o").arg(offset.to_string());
        }
        cmd.arg("-d").arg(rootfs).arg(source);
        run(cmd, "unsquashfs")
    })?;
    let rootfs = entry.dir.join("rootfs");
    // enroot keeps an image's Env in its /etc/environment.
    let env = fs::read_to_string(rootfs.join("etc/environment"))
        .map(|t| {
            t.lines()
                .map(|l| l.trim())
                .filter(|l| !l.starts_with('#') && l.contains('='))
                .map(|l| l.trim_start_matches("export ").to_string())
                .collect()
        })
        .unwrap_or_default();
    Ok(Resolved {
        rootfs,
        users: false,
        env,
        entrypoint: Vec::new(),
        unpacked: entry.unpacked,
        lease: Some(entry.lease),
    })
}

/// The hex sha256 of `file`'s content, remembered per file version.
fn content_digest(file: &File, cache: &Path) -> io::Result<String> {
    let meta = file.metadata()?;
    let version = format!(
        "{}:{}:{}:{}.{}:{}.{}",
        meta.dev(),
        meta.ino(),
        meta.size(),
        meta.mtime(),
        meta.mtime_nsec(),
        meta.ctime(),
        meta.ctime_nsec()
    );
    let digests = cache.join("digests");
    let memo = digests.join(hex::encode(Sha256::digest(version.as_bytes())));
    if let Ok(known) = fs::read_to_string(&memo) {
        if known.len() == 64 {
            return Ok(known);
        }
    }
    let mut hash = Sha256::new();
    let mut reader = io::BufReader::with_capacity(1 << 20, file);
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = reader.read(&mut buf)?;
        if n == 0 {
            break;
        }
        hash.update(&buf[..n]);
    }
    let digest = hex::encode(hash.finalize());
    let remembered = fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(&digests)
        .and_then(|_| {
            super::task::write_atomic(&memo, digest.as_bytes(), super::task::Durability::Crash)
        });
    if let Err(e) = remembered {
        tracing::warn!("cannot remember the digest in {}: {e}", memo.display());
    }
    Ok(digest)
}

impl Pull {
    /// The node's settings, the tool looked up in `path`.
    pub fn new(cfg: &crate::config::Containers, path: &str) -> Pull {
        Pull {
            tool: (!cfg.pull_tool.is_empty())
                .then(|| find_tool(&cfg.pull_tool, path))
                .flatten(),
            insecure: cfg.insecure_registries.clone(),
            auth_file: cfg.registry_auth_file.clone(),
        }
    }

    /// The arguments of `skopeo copy` for pulling `reference` into
    /// `layout`.
    fn copy_args(&self, reference: &str, layout: &Path) -> Vec<String> {
        let mut args = vec!["copy".to_string(), "--quiet".to_string()];
        if self.insecure.iter().any(|r| r == registry_of(reference)) {
            args.push("--src-tls-verify=false".into());
        }
        if let Some(f) = &self.auth_file {
            args.push(format!("--src-authfile={}", f.display()));
        }
        args.push(format!("{}{reference}", crate::model::REGISTRY_SCHEME));
        args.push(format!("oci:{}:latest", layout.display()));
        args
    }
}

/// The registry an image reference names, as docker reads it: its first
/// part when that has a `.` or a `:` or is `localhost`, else Docker Hub.
pub fn registry_of(reference: &str) -> &str {
    match reference.split_once('/') {
        Some((first, _)) if first.contains(['.', ':']) || first == "localhost" => first,
        _ => "docker.io",
    }
}

/// Pulls `docker://reference` into its layout under the cache; returns it
/// with a shared hold on it (its lock), which keeps the cache's eviction
/// off it while the caller unpacks it.
pub fn pull(reference: &str, cache: &Path, how: &Pull) -> Result<(PathBuf, File), String> {
    let shown = format!("{}{reference}", crate::model::REGISTRY_SCHEME);
    let Some(skopeo) = &how.tool else {
        return Err(format!(
            "container image {shown} is a registry reference, and node {} has no pull tool \
             (skopeo, [agent.containers] pull_tool) to pull it: install skopeo there, or copy \
             the image where the nodes can read it and give that path",
            hostname()
        ));
    };
    let pulls = cache.join(super::image_cache::PULLS_DIR);
    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(&pulls)
        .map_err(|e| format!("cannot create {}: {e}", pulls.display()))?;
    let name = hex::encode(Sha256::digest(reference.as_bytes()));
    let layout = pulls.join(&name);
    let lock_path = pulls.join(format!("{name}.lock"));
    let lock = super::image_cache::lock_exclusive(&lock_path)?;
    let started = std::time::Instant::now();
    let mut cmd = Command::new(skopeo);
    cmd.args(how.copy_args(reference, &layout));
    run(cmd, "skopeo").map_err(|e| format!("cannot pull container image {shown}: {e}"))?;
    tracing::info!(image = %shown, ms = started.elapsed().as_millis() as u64, "image pulled");
    // Its last use, for the cache's least-recently-used order.
    let used = pulls.join(format!("{name}.used"));
    let touched = File::create(&used).and_then(|f| f.set_modified(std::time::SystemTime::now()));
    if let Err(e) = touched {
        tracing::warn!("cannot mark {} used: {e}", used.display());
    }
    // SAFETY: as above; from exclusive to shared on the same descriptor.
    if unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_SH) } < 0 {
        return Err(format!(
            "cannot lock {}: {}",
            lock_path.display(),
            io::Error::last_os_error()
        ));
    }
    Ok((layout, lock))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn registries_are_read_as_docker_reads_them_and_the_settings_reach_skopeo() {
        assert_eq!(registry_of("ubuntu:22.04"), "docker.io");
        assert_eq!(registry_of("library/ubuntu"), "docker.io");
        assert_eq!(registry_of("nvcr.io/nvidia/pytorch:24.01-py3"), "nvcr.io");
        assert_eq!(registry_of("127.0.0.1:5000/t/busybox:1"), "127.0.0.1:5000");
        assert_eq!(registry_of("localhost/t"), "localhost");
        let how = Pull {
            tool: Some("/usr/bin/skopeo".into()),
            insecure: vec!["registry.lan:5000".into()],
            auth_file: Some("/etc/gpuq/auth.json".into()),
        };
        let layout = Path::new("/c/pulls/x");
        assert_eq!(
            how.copy_args("registry.lan:5000/a/b:1", layout),
            [
                "copy",
                "--quiet",
                "--src-tls-verify=false",
                "--src-authfile=/etc/gpuq/auth.json",
                "docker://registry.lan:5000/a/b:1",
                "oci:/c/pulls/x:latest"
            ]
        );
        // Another port of the same host is another registry: verified.
        let args = how.copy_args("registry.lan/a/b:1", layout);
        assert!(!args.iter().any(|a| a.contains("tls-verify")), "{args:?}");
    }

    #[test]
    fn a_files_digest_is_remembered_per_version() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("img.sqsh");
        fs::write(&path, b"hsqs and more").unwrap();
        let cache = dir.path().join("cache");
        let first = content_digest(&File::open(&path).unwrap(), &cache).unwrap();
        assert_eq!(first, hex::encode(Sha256::digest(b"hsqs and more")));
        assert_eq!(fs::read_dir(cache.join("digests")).unwrap().count(), 1);
        // A new version of the file is hashed again.
        fs::write(&path, b"hsqs and less").unwrap();
        let second = content_digest(&File::open(&path).unwrap(), &cache).unwrap();
        assert_eq!(second, hex::encode(Sha256::digest(b"hsqs and less")));
    }
}
