//! Directories and files that hold a daemon's secrets: created with their
//! final mode (never chmodded after, so there is no moment when they are
//! open), and checked at every start.
//!
//! A server's data dir holds the replicated state, and with it the cluster
//! CA's key: whoever reads it can sign a certificate for any role. So a data
//! dir that group or others can read or write, or that another user owns, is
//! refused at start with the command that fixes it, as sshd refuses a key
//! file others can read. An agent's data dir is the one place others may
//! *traverse* (mode 0711, never list): the tasks' users must reach their own
//! script in a task directory below it.

use std::fs;
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

/// Who besides the owner may use a directory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DirMode {
    /// 0700: nobody else.
    Private,
    /// 0711: others may pass through to a path they know, never list or read.
    Traverse,
}

impl DirMode {
    fn bits(self) -> u32 {
        match self {
            DirMode::Private => 0o700,
            DirMode::Traverse => 0o711,
        }
    }
}

/// Why a private directory or file cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum OwnerOnlyError {
    #[error("cannot {action} {}: {source}", .path.display())]
    Io {
        action: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{} is not a directory; give the daemon a directory of its own", .path.display())]
    NotADirectory { path: PathBuf },
    #[error(
        "{} is open to group or others (mode {mode:04o}) and holds secrets (keys, the \
         cluster state): run `chmod {want:o} {}` and start again",
        .path.display(), .path.display()
    )]
    TooOpen { path: PathBuf, mode: u32, want: u32 },
    #[error(
        "{} belongs to uid {owner}, not to this daemon's uid {me}: another user could read \
         its secrets; run `chown -R {me} {}` (or use another directory) and start again",
        .path.display(), .path.display()
    )]
    WrongOwner { path: PathBuf, owner: u32, me: u32 },
}

fn io<'a>(
    action: &'static str,
    path: &'a Path,
) -> impl FnOnce(std::io::Error) -> OwnerOnlyError + 'a {
    move |source| OwnerOnlyError::Io {
        action,
        path: path.to_path_buf(),
        source,
    }
}

/// Creates `path` with `mode` if it is missing (its parents with the usual
/// mode), then checks that it is a directory this process's user owns and
/// that group and others can neither read nor write it.
pub fn ensure_dir(path: &Path, mode: DirMode) -> Result<(), OwnerOnlyError> {
    if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
        fs::create_dir_all(parent).map_err(io("create", parent))?;
    }
    match fs::DirBuilder::new().mode(mode.bits()).create(path) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(io("create", path)(e)),
    }
    let meta = fs::metadata(path).map_err(io("read", path))?;
    if !meta.is_dir() {
        return Err(OwnerOnlyError::NotADirectory {
            path: path.to_path_buf(),
        });
    }
    check_owner_only(path, &meta, mode.bits())
}

/// Creates an empty file readable by its owner only if `path` is missing;
/// otherwise checks that group and others can neither read nor write it.
pub fn ensure_file(path: &Path) -> Result<(), OwnerOnlyError> {
    match fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
    {
        Ok(_) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            let meta = fs::metadata(path).map_err(io("read", path))?;
            check_owner_only(path, &meta, 0o600)
        }
        Err(e) => Err(io("create", path)(e)),
    }
}

fn check_owner_only(path: &Path, meta: &fs::Metadata, want: u32) -> Result<(), OwnerOnlyError> {
    let me = nix::unistd::Uid::effective().as_raw();
    if meta.uid() != me {
        return Err(OwnerOnlyError::WrongOwner {
            path: path.to_path_buf(),
            owner: meta.uid(),
            me,
        });
    }
    let mode = meta.mode() & 0o7777;
    if mode & 0o066 != 0 {
        return Err(OwnerOnlyError::TooOpen {
            path: path.to_path_buf(),
            mode,
            want,
        });
    }
    Ok(())
}

/// Writes a file readable by its owner only, created with that mode (an
/// existing file is truncated and keeps the mode it has).
pub fn write_private(path: &Path, bytes: &[u8]) -> Result<(), OwnerOnlyError> {
    let mut f = fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
        .map_err(io("write", path))?;
    f.write_all(bytes).map_err(io("write", path))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn mode(path: &Path) -> u32 {
        fs::metadata(path).unwrap().mode() & 0o7777
    }

    #[test]
    fn new_directories_and_files_are_created_closed() {
        let dir = tempfile::tempdir().unwrap();
        let private = dir.path().join("a/b/server");
        ensure_dir(&private, DirMode::Private).unwrap();
        assert_eq!(mode(&private), 0o700);
        let agent = dir.path().join("agent");
        ensure_dir(&agent, DirMode::Traverse).unwrap();
        assert_eq!(mode(&agent), 0o711);
        let file = private.join("gpuq.redb");
        ensure_file(&file).unwrap();
        assert_eq!(mode(&file), 0o600);
        write_private(&private.join("key"), b"k").unwrap();
        assert_eq!(mode(&private.join("key")), 0o600);
        // Checking again is fine.
        ensure_dir(&private, DirMode::Private).unwrap();
        ensure_file(&file).unwrap();
    }

    #[test]
    fn an_open_directory_or_file_is_refused_with_the_fix() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path().join("data");
        fs::create_dir(&d).unwrap();
        fs::set_permissions(&d, fs::Permissions::from_mode(0o755)).unwrap();
        let err = ensure_dir(&d, DirMode::Private).unwrap_err().to_string();
        assert!(err.contains("mode 0755"), "{err}");
        assert!(err.contains(&format!("chmod 700 {}", d.display())), "{err}");
        // Traversable is not readable.
        fs::set_permissions(&d, fs::Permissions::from_mode(0o711)).unwrap();
        ensure_dir(&d, DirMode::Traverse).unwrap();
        let f = d.join("gpuq.redb");
        fs::write(&f, b"").unwrap();
        fs::set_permissions(&f, fs::Permissions::from_mode(0o644)).unwrap();
        let err = ensure_file(&f).unwrap_err().to_string();
        assert!(err.contains("chmod 600"), "{err}");
        // A file where the directory should be.
        let err = ensure_dir(&f, DirMode::Private).unwrap_err();
        assert!(matches!(err, OwnerOnlyError::NotADirectory { .. }), "{err}");
    }

    #[test]
    fn a_directory_another_user_owns_is_refused() {
        if !nix::unistd::Uid::effective().is_root() {
            // Only root can hand a directory to another user; CI runs as root.
            panic!("this test needs root (CI runs as root)");
        }
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path().join("theirs");
        ensure_dir(&d, DirMode::Private).unwrap();
        nix::unistd::chown(&d, Some(nix::unistd::Uid::from_raw(65534)), None).unwrap();
        let err = ensure_dir(&d, DirMode::Private).unwrap_err().to_string();
        assert!(err.contains("belongs to uid 65534"), "{err}");
    }
}
