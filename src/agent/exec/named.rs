//! Pyxis's named containers (`--container-name NAME`): a container of the
//! job's on each node whose root filesystem the job's tasks share, and keep
//! from one step to the next, as enroot's named containers are. The first
//! task that names it makes it: a copy of its image's unpacked root (from
//! the node's cache; `cp --reflink=auto`, so a copy-on-write file system
//! copies nothing) in `<data>/named/<job>/<NAME>/rootfs`, with the image's
//! `Env` and `Entrypoint` beside it. Later tasks of the job, of any step
//! and with or without `--container-image`, run in that root, which is
//! bound, not overlaid: tasks running at once share it, as enroot's do (an
//! overlay's writable layer cannot be shared). The job's named containers
//! go as its spool does: once no task of the job is on the node and none
//! has used them for `spool::KEEP`.

use std::fs::{self, File};
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::image_files::Resolved;
use super::task::hostname;
use crate::model::JobId;

/// What a named container was made from, beside its root.
#[derive(Debug, Serialize, Deserialize)]
struct Made {
    image: String,
    env: Vec<String>,
    entrypoint: Vec<String>,
}

/// The named containers' root beside the image cache (`<data>/images`).
pub fn root_beside(cache: &Path) -> PathBuf {
    cache
        .parent()
        .map_or_else(|| PathBuf::from("named"), |p| p.join("named"))
}

/// Job `job`'s container `name` on this node: made from `image` (by
/// `resolve`, which unpacks it into the cache) the first time, else as it
/// was left. A user's own directory (`Resolved::users`) is copied as that
/// user (`owner`: uid, gid): the copy holds only what they may read, and
/// is theirs, so nothing of the node reaches them through it (or through
/// `--container-save`, which squashes the copy). Tasks starting together
/// wait for one making it. Errors are sentences for the user.
pub(super) fn open(
    root: &Path,
    job: JobId,
    name: &str,
    image: &str,
    owner: (u32, u32),
    resolve: impl FnOnce() -> Result<Resolved, String>,
) -> Result<Resolved, String> {
    let dir = root.join(job.to_string());
    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(&dir)
        .map_err(|e| format!("cannot make {}: {e}", dir.display()))?;
    // In use now: the sweep keeps a job's containers `spool::KEEP` past
    // the last use (or task) on this node.
    if let Ok(d) = File::open(&dir) {
        let _ = d.set_modified(std::time::SystemTime::now());
    }
    let lock_path = dir.join(format!("{name}.lock"));
    // Held until this returns: tasks starting together make it once.
    let _lock = super::image_cache::lock_exclusive(&lock_path)?;
    let here = dir.join(name);
    let made_file = here.join("made.json");
    let rootfs = here.join("rootfs");
    if let Ok(text) = fs::read(&made_file) {
        let made: Made = serde_json::from_slice(&text)
            .map_err(|e| format!("{} is damaged: {e}", made_file.display()))?;
        if !image.is_empty() && image != made.image {
            tracing::info!(
                name,
                made_from = %made.image,
                asked = image,
                "the named container exists: its own image stands"
            );
        }
        return Ok(Resolved {
            rootfs,
            users: false,
            env: made.env,
            entrypoint: made.entrypoint,
            unpacked: false,
            lease: None,
        });
    }
    if image.is_empty() {
        return Err(format!(
            "there is no container named {name} of job {job} on node {}: the first task that \
             names it must give --container-image",
            hostname()
        ));
    }
    let source = resolve()?;
    let _ = fs::remove_dir_all(&here);
    fs::DirBuilder::new()
        .mode(0o700)
        .create(&here)
        .map_err(|e| format!("cannot make {}: {e}", here.display()))?;
    let making = here.join("rootfs.making");
    let mut cp = std::process::Command::new("cp");
    cp.args(["-a", "--reflink=auto"]);
    // The user's copy goes in through a descriptor cp inherits: the
    // directories on the way are root's alone.
    let mut inherited = None;
    if source.users && nix::unistd::geteuid().is_root() {
        use std::os::unix::process::CommandExt;
        fs::DirBuilder::new()
            .mode(0o755)
            .create(&making)
            .and_then(|()| std::os::unix::fs::chown(&making, Some(owner.0), Some(owner.1)))
            .map_err(|e| format!("cannot make {}: {e}", making.display()))?;
        let path = std::ffi::CString::new(making.as_os_str().as_encoded_bytes())
            .map_err(|_| format!("{} has a NUL byte", making.display()))?;
        // Without O_CLOEXEC: cp inherits it. SAFETY: a NUL-terminated path;
        // the descriptor is closed below.
        let fd = unsafe { libc::open(path.as_ptr(), libc::O_RDONLY | libc::O_DIRECTORY) };
        if fd < 0 {
            return Err(format!(
                "cannot open {}: {}",
                making.display(),
                std::io::Error::last_os_error()
            ));
        }
        inherited = Some(fd);
        cp.uid(owner.0)
            .gid(owner.1)
            .arg(source.rootfs.join("."))
            .arg(format!("/proc/self/fd/{fd}"));
    } else {
        cp.arg(&source.rootfs).arg(&making);
    }
    let copied = cp.output();
    if let Some(fd) = inherited {
        // SAFETY: the descriptor opened above, closed once.
        unsafe { libc::close(fd) };
    }
    let copied = copied.map_err(|e| format!("cannot run cp: {e}"))?;
    if !copied.status.success() {
        let _ = fs::remove_dir_all(&here);
        return Err(format!(
            "cannot make the container named {name} from {image}: cp said {}",
            String::from_utf8_lossy(&copied.stderr).trim()
        ));
    }
    fs::rename(&making, &rootfs).map_err(|e| format!("cannot rename {}: {e}", making.display()))?;
    let made = Made {
        image: image.to_string(),
        env: source.env,
        entrypoint: source.entrypoint,
    };
    let text = serde_json::to_vec(&made).map_err(|e| e.to_string())?;
    super::task::write_atomic(&made_file, &text, super::task::Durability::Crash)
        .map_err(|e| format!("cannot write {}: {e}", made_file.display()))?;
    tracing::info!(name, image, "named container made");
    Ok(Resolved {
        rootfs,
        users: false,
        env: made.env,
        entrypoint: made.entrypoint,
        unpacked: source.unpacked,
        lease: None,
    })
}

/// `--container-save`: squashes `rootfs` (as root, who reads all of it)
/// into a file in `scratch` (the task's directory), then copies it to `to`
/// as `create` opens it (as the user: so it lands only where they may
/// write, and is theirs). Errors are sentences for the user.
pub(super) fn save(
    rootfs: &Path,
    to: &Path,
    scratch: &Path,
    create: &dyn Fn(&Path) -> std::io::Result<File>,
) -> Result<(), String> {
    let Some(mksquashfs) = super::image_tools::find_tool("mksquashfs", "") else {
        return Err(format!(
            "cannot save the container to {}: node {} has no mksquashfs (install \
             squashfs-tools there)",
            to.display(),
            hostname()
        ));
    };
    let squashed = scratch.join("saved.sqsh");
    let made = std::process::Command::new(&mksquashfs)
        .arg(rootfs)
        .arg(&squashed)
        .args(["-noappend", "-no-progress", "-quiet"])
        .output()
        .map_err(|e| format!("cannot run {}: {e}", mksquashfs.display()))?;
    let copied = match made.status.success() {
        false => Err(format!(
            "mksquashfs said {}",
            String::from_utf8_lossy(&made.stderr).trim()
        )),
        true => File::open(&squashed)
            .and_then(|mut from| {
                let mut out = create(to)?;
                std::io::copy(&mut from, &mut out)?;
                out.sync_all()
            })
            .map_err(|e| e.to_string()),
    };
    let _ = fs::remove_file(&squashed);
    copied.map_err(|e| format!("cannot save the container to {}: {e}", to.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plain(dir: &Path) -> Resolved {
        let rootfs = dir.join("image");
        fs::create_dir_all(rootfs.join("etc")).unwrap();
        fs::write(rootfs.join("etc/os-release"), "NAME=img\n").unwrap();
        Resolved {
            rootfs,
            users: false,
            env: vec!["A=1".into()],
            entrypoint: vec!["/e".into()],
            unpacked: true,
            lease: None,
        }
    }

    #[test]
    fn made_once_from_its_image_then_kept_with_what_was_written() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("named");
        let job = JobId(7);
        // Named with no image before it exists: refused, saying how.
        let me = (
            nix::unistd::getuid().as_raw(),
            nix::unistd::getgid().as_raw(),
        );
        let err = open(&root, job, "env", "", me, || unreachable!()).unwrap_err();
        assert!(err.contains("must give --container-image"), "{err}");
        let first = open(&root, job, "env", "/img", me, || Ok(plain(dir.path()))).unwrap();
        assert_eq!(first.rootfs, root.join("7/env/rootfs"));
        assert_eq!(first.env, ["A=1"]);
        assert_eq!(
            fs::read_to_string(first.rootfs.join("etc/os-release")).unwrap(),
            "NAME=img\n"
        );
        fs::write(first.rootfs.join("marker"), "kept").unwrap();
        // Later: the same root, its image's settings, no resolve at all.
        let again = open(&root, job, "env", "", me, || unreachable!()).unwrap();
        assert_eq!(again.rootfs, first.rootfs);
        assert_eq!(again.entrypoint, ["/e"]);
        assert_eq!(
            fs::read_to_string(again.rootfs.join("marker")).unwrap(),
            "kept"
        );
        // Another job's container of the same name is its own.
        let other = open(&root, JobId(8), "env", "", me, || unreachable!());
        assert!(other.is_err());
    }
}
