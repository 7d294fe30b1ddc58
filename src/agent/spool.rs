//! Where a job step's output waits for `srun` to stream it: a step started
//! without `--output` writes to `<data>/spool/<job>/<attempt>.s<step>.<rank>.out`
//! (and `.err`), a file its user owns in a directory only its user may
//! enter, and `srun` reads it through the leader as `gpuq logs` reads
//! output files. The files outlive their task (its directory goes once
//! its end is committed, and `srun` may still be draining), so a job's
//! spool stays until the job has no task on this node for `KEEP`.

use std::collections::HashSet;
use std::fs;
use std::io;
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::model::{JobId, TaskKey};

/// How long a job's spool stays after its last task on this node.
pub const KEEP: Duration = Duration::from_secs(600);

/// The spool root beside the task directories (`<data>/tasks`).
pub fn root_beside(tasks_root: &Path) -> PathBuf {
    tasks_root
        .parent()
        .map_or_else(|| PathBuf::from("spool"), |p| p.join("spool"))
}

/// The spooled stdout (or stderr) of a step task.
pub fn path(root: &Path, key: TaskKey, stderr: bool) -> PathBuf {
    let ext = if stderr { "err" } else { "out" };
    root.join(key.job.to_string()).join(format!(
        "{}.s{}.{}.{ext}",
        key.attempt,
        key.step.unwrap_or(0),
        key.rank
    ))
}

/// Makes the job's spool directory, owned by `uid`/`gid` and closed to
/// everyone else (the root only traversable). The tasks of a step start in
/// parallel, so the directory is made ready under a name of its own and
/// renamed into place: nobody sees it half set up.
pub fn prepare(root: &Path, job: JobId, owner: Option<(u32, u32)>) -> io::Result<()> {
    if !root.exists() {
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o711)
            .create(root)?;
        fs::set_permissions(root, fs::Permissions::from_mode(0o711))?;
    }
    let dir = root.join(job.to_string());
    if dir.is_dir() {
        return Ok(());
    }
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let making = root.join(format!(".{job}.{}.{n}", std::process::id()));
    fs::DirBuilder::new().mode(0o700).create(&making)?;
    if let Some((uid, gid)) = owner {
        std::os::unix::fs::chown(&making, Some(uid), Some(gid))?;
    }
    // Another task may have put one there first: theirs stands.
    if fs::rename(&making, &dir).is_err() {
        let _ = fs::remove_dir(&making);
        if !dir.is_dir() {
            return Err(io::Error::other(format!(
                "{} could not be made",
                dir.display()
            )));
        }
    }
    Ok(())
}

/// Removes the spools of jobs not in `live` whose directory has not
/// changed for `KEEP`.
pub fn sweep(root: &Path, live: &HashSet<JobId>) {
    let Ok(entries) = fs::read_dir(root) else {
        return;
    };
    for e in entries.flatten() {
        let Some(job) = e.file_name().to_str().and_then(|n| n.parse().ok()) else {
            continue;
        };
        if live.contains(&JobId(job)) {
            continue;
        }
        let old = e
            .metadata()
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| t.elapsed().ok())
            .is_some_and(|age| age >= KEEP);
        if old {
            if let Err(err) = fs::remove_dir_all(e.path()) {
                tracing::debug!(job, "spool sweep: {err}");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_name_the_task_and_stream() {
        let key = TaskKey {
            job: JobId(12),
            attempt: 1,
            rank: 3,
            step: Some(2),
        };
        assert_eq!(
            path(Path::new("/d/spool"), key, false),
            PathBuf::from("/d/spool/12/1.s2.3.out")
        );
        assert_eq!(
            path(Path::new("/d/spool"), key, true),
            PathBuf::from("/d/spool/12/1.s2.3.err")
        );
        assert_eq!(
            root_beside(Path::new("/var/lib/gpuq/tasks")),
            PathBuf::from("/var/lib/gpuq/spool")
        );
    }

    #[test]
    fn a_fresh_spool_survives_the_sweep_and_live_jobs_stay() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("spool");
        prepare(&root, JobId(5), None).unwrap();
        prepare(&root, JobId(6), None).unwrap();
        sweep(&root, &HashSet::from([JobId(5)]));
        assert!(root.join("5").is_dir() && root.join("6").is_dir());
        let mode = fs::metadata(&root).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o711);
        let mode = fs::metadata(root.join("5")).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o700);
    }
}
