//! Applying an image layer (a tar stream) to a root filesystem directory,
//! as root, when the layer came from a user.
//!
//! The danger of unpacking as root is a path that leaves the directory: an
//! entry `../x`, or an entry written through a symlink that an earlier entry
//! or layer made (`etc -> /etc`, then `etc/passwd`). So no path of the
//! layer is ever resolved by the host's rules: every parent directory is
//! opened with `openat2(RESOLVE_IN_ROOT)` (Linux 5.6), which resolves `..`
//! and symlinks, absolute ones included, as if the image's root were `/`,
//! and every entry is then made with `*at` calls on that directory and its
//! last name, never following a symlink there. `..` in an entry's name is
//! refused outright.
//!
//! Layers stack with the OCI whiteouts: `.wh.NAME` removes NAME of the
//! layers below, `.wh..wh..opq` empties a directory of what the layers
//! below put there. Device nodes are skipped (the image is mounted `nodev`
//! anyway); ownership and modes are kept, setuid bits too (the mount is
//! `nosuid` and the process has no new privileges); extended attributes
//! are not copied.

use std::collections::HashSet;
use std::ffi::{CString, OsStr};
use std::fs::File;
use std::io::{self, Read};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};

use nix::fcntl::{openat2, OFlag, OpenHow, ResolveFlag};

/// What applying one layer did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LayerStats {
    pub entries: u64,
    /// Device nodes left out.
    pub devices_skipped: u64,
}

/// A layer could not be applied; the message names the entry.
#[derive(Debug, thiserror::Error)]
pub enum UnpackError {
    #[error("the layer is not a readable tar archive: {0}")]
    Archive(io::Error),
    #[error("layer entry {path:?} climbs out of the image with '..'")]
    Escapes { path: PathBuf },
    #[error("layer entry {path:?}: cannot {action}: {source}")]
    Entry {
        path: PathBuf,
        action: &'static str,
        source: io::Error,
    },
}

/// The components of an entry's path inside the image: `./` and leading
/// `/` dropped; `..` refused.
fn image_path(raw: &Path) -> Result<Vec<&OsStr>, UnpackError> {
    let mut parts = Vec::new();
    for c in raw.components() {
        match c {
            Component::Normal(n) => parts.push(n),
            Component::RootDir | Component::CurDir => {}
            Component::ParentDir | Component::Prefix(_) => {
                return Err(UnpackError::Escapes {
                    path: raw.to_path_buf(),
                })
            }
        }
    }
    Ok(parts)
}

fn cstr(name: &OsStr) -> io::Result<CString> {
    CString::new(name.as_bytes()).map_err(|_| io::Error::other("the name contains a NUL byte"))
}

fn check(ret: libc::c_int) -> io::Result<()> {
    if ret < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// The root directory of an image being unpacked, and the layer's record
/// of what it made (an opaque directory keeps those).
pub struct Root {
    fd: OwnedFd,
    /// Whether ownership is applied (as root); a test run by a user skips it.
    chown: bool,
    made: HashSet<Vec<u8>>,
}

impl Root {
    /// Opens `dir`, an existing directory.
    pub fn open(dir: &Path) -> io::Result<Root> {
        let file = File::open(dir)?;
        Ok(Root {
            fd: file.into(),
            chown: nix::unistd::geteuid().is_root(),
            made: HashSet::new(),
        })
    }

    /// Opens `parts` (a directory) inside the image, resolved as if the
    /// image's root were `/`; with `create`, missing directories are made
    /// (0755, root's), also where a symlink points (inside the image).
    fn dir(&self, parts: &[&OsStr], create: bool) -> io::Result<OwnedFd> {
        self.dir_at_depth(parts, create, 0)
    }

    fn dir_at_depth(&self, parts: &[&OsStr], create: bool, depth: u32) -> io::Result<OwnedFd> {
        let how = || {
            OpenHow::new()
                .flags(OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC)
                .resolve(ResolveFlag::RESOLVE_IN_ROOT | ResolveFlag::RESOLVE_NO_MAGICLINKS)
        };
        let open = |path: &Path| -> io::Result<OwnedFd> {
            let path = if path.as_os_str().is_empty() {
                Path::new(".")
            } else {
                path
            };
            let fd = openat2(self.fd.as_raw_fd(), path, how()).map_err(io::Error::from)?;
            // SAFETY: openat2 returned a new descriptor that nothing else owns.
            Ok(unsafe { OwnedFd::from_raw_fd(fd) })
        };
        let whole: PathBuf = parts.iter().collect();
        match open(&whole) {
            Err(e) if create && e.raw_os_error() == Some(libc::ENOENT) => {}
            other => return other,
        }
        let mut at = open(Path::new("."))?;
        let mut so_far = PathBuf::new();
        for part in parts {
            so_far.push(part);
            at = match open(&so_far) {
                Ok(fd) => fd,
                Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {
                    let name = cstr(part)?;
                    if let Some(target) = link_at(at.as_raw_fd(), &name) {
                        // A symlink to a directory not made yet: make it
                        // where the link points, inside the image.
                        if depth > 16 {
                            return Err(io::Error::from_raw_os_error(libc::ELOOP));
                        }
                        let base: Vec<&OsStr> =
                            so_far.parent().map_or(Vec::new(), |p| p.iter().collect());
                        let wanted = lexical(&base, &target);
                        let refs: Vec<&OsStr> = wanted.iter().map(|p| p.as_os_str()).collect();
                        self.dir_at_depth(&refs, true, depth + 1)?;
                        at = open(&so_far)?;
                        continue;
                    }
                    // SAFETY: a directory descriptor and a NUL-terminated name.
                    let made = unsafe { libc::mkdirat(at.as_raw_fd(), name.as_ptr(), 0o755) };
                    if made < 0 && io::Error::last_os_error().raw_os_error() != Some(libc::EEXIST) {
                        return Err(io::Error::last_os_error());
                    }
                    open(&so_far)?
                }
                Err(e) => return Err(e),
            };
        }
        Ok(at)
    }

    /// Applies one layer's tar stream.
    pub fn apply(&mut self, layer: impl Read) -> Result<LayerStats, UnpackError> {
        self.made.clear();
        let mut stats = LayerStats::default();
        let mut archive = tar::Archive::new(layer);
        for entry in archive.entries().map_err(UnpackError::Archive)? {
            let mut entry = entry.map_err(UnpackError::Archive)?;
            let raw = entry.path().map_err(UnpackError::Archive)?.into_owned();
            let parts = image_path(&raw)?;
            let Some((name, parent)) = parts.split_last() else {
                continue; // the root itself
            };
            let fail = |action: &'static str| {
                let path = raw.clone();
                move |source: io::Error| UnpackError::Entry {
                    path,
                    action,
                    source,
                }
            };
            stats.entries += 1;
            let name_bytes = name.as_bytes();
            if let Some(hidden) = name_bytes.strip_prefix(b".wh.") {
                let dir = match self.dir(parent, false) {
                    Ok(dir) => dir,
                    // Nothing below to hide.
                    Err(e) if e.raw_os_error() == Some(libc::ENOENT) => continue,
                    Err(e) => return Err(fail("open its directory")(e)),
                };
                if hidden == b".wh..opq" {
                    let prefix: PathBuf = parent.iter().collect();
                    self.empty_below(&dir, &prefix)
                        .map_err(fail("empty the opaque directory"))?;
                } else {
                    remove_at(dir.as_raw_fd(), OsStr::from_bytes(hidden))
                        .map_err(fail("remove what it whites out"))?;
                }
                continue;
            }
            let dir = self.dir(parent, true).map_err(fail("make its directory"))?;
            let header = entry.header();
            let mode = header.mode().map_err(fail("read its mode"))? & 0o7777;
            // Some writers leave the ids blank: root's, then.
            let owner = (
                header.uid().unwrap_or(0) as libc::uid_t,
                header.gid().unwrap_or(0) as libc::gid_t,
            );
            let mtime = header.mtime().unwrap_or(0) as i64;
            let kind = header.entry_type();
            let at = dir.as_raw_fd();
            let cname = cstr(name).map_err(fail("name it"))?;
            use tar::EntryType;
            match kind {
                EntryType::Directory => {
                    if !is_dir_at(at, &cname) {
                        remove_at(at, name).map_err(fail("replace what was there"))?;
                        // SAFETY: a directory descriptor and a NUL-terminated name.
                        check(unsafe { libc::mkdirat(at, cname.as_ptr(), 0o700) })
                            .map_err(fail("make the directory"))?;
                    }
                    self.own(at, &cname, owner, Some(mode))
                        .map_err(fail("set its owner and mode"))?;
                }
                EntryType::Regular | EntryType::Continuous | EntryType::GNUSparse => {
                    remove_at(at, name).map_err(fail("replace what was there"))?;
                    let flags = libc::O_CREAT
                        | libc::O_EXCL
                        | libc::O_WRONLY
                        | libc::O_NOFOLLOW
                        | libc::O_CLOEXEC;
                    // SAFETY: a directory descriptor and a NUL-terminated name.
                    let fd = unsafe { libc::openat(at, cname.as_ptr(), flags, 0o600) };
                    check(fd).map_err(fail("create the file"))?;
                    // SAFETY: openat returned a new descriptor.
                    let mut file = unsafe { File::from_raw_fd(fd) };
                    io::copy(&mut entry, &mut file).map_err(fail("write the file"))?;
                    drop(file);
                    self.own(at, &cname, owner, Some(mode))
                        .map_err(fail("set its owner and mode"))?;
                    set_mtime(at, &cname, mtime);
                }
                EntryType::Symlink => {
                    let target = entry
                        .link_name()
                        .map_err(UnpackError::Archive)?
                        .unwrap_or_default();
                    let target = cstr(target.as_os_str()).map_err(fail("read its target"))?;
                    remove_at(at, name).map_err(fail("replace what was there"))?;
                    // SAFETY: NUL-terminated strings and a directory descriptor.
                    check(unsafe { libc::symlinkat(target.as_ptr(), at, cname.as_ptr()) })
                        .map_err(fail("make the symlink"))?;
                    self.own(at, &cname, owner, None)
                        .map_err(fail("set its owner"))?;
                    set_mtime(at, &cname, mtime);
                }
                EntryType::Link => {
                    let target = entry
                        .link_name()
                        .map_err(UnpackError::Archive)?
                        .unwrap_or_default()
                        .into_owned();
                    let tparts = image_path(&target)?;
                    let Some((tname, tparent)) = tparts.split_last() else {
                        continue;
                    };
                    let tdir = self.dir(tparent, false).map_err(fail("find its target"))?;
                    let tname = cstr(tname).map_err(fail("read its target"))?;
                    remove_at(at, name).map_err(fail("replace what was there"))?;
                    // SAFETY: directory descriptors and NUL-terminated names;
                    // flags 0: a symlink is linked, never followed.
                    check(unsafe {
                        libc::linkat(tdir.as_raw_fd(), tname.as_ptr(), at, cname.as_ptr(), 0)
                    })
                    .map_err(fail("make the hard link"))?;
                }
                EntryType::Fifo => {
                    remove_at(at, name).map_err(fail("replace what was there"))?;
                    let mode = libc::S_IFIFO | (mode & 0o777);
                    // SAFETY: a directory descriptor and a NUL-terminated name.
                    check(unsafe { libc::mknodat(at, cname.as_ptr(), mode, 0) })
                        .map_err(fail("make the fifo"))?;
                    self.own(at, &cname, owner, None)
                        .map_err(fail("set its owner"))?;
                }
                EntryType::Char | EntryType::Block => {
                    stats.devices_skipped += 1;
                    continue;
                }
                // Global headers and what the reader has already folded in.
                _ => continue,
            }
            self.made.insert(raw_key(&parts));
        }
        Ok(stats)
    }

    /// Owner, then mode (a chown clears setuid bits); `mode` `None` for a
    /// symlink or fifo, whose mode is not changed here.
    fn own(
        &self,
        at: RawFd,
        name: &CString,
        (uid, gid): (libc::uid_t, libc::gid_t),
        mode: Option<u32>,
    ) -> io::Result<()> {
        if self.chown {
            // SAFETY: a directory descriptor and a NUL-terminated name.
            check(unsafe {
                libc::fchownat(at, name.as_ptr(), uid, gid, libc::AT_SYMLINK_NOFOLLOW)
            })?;
        }
        if let Some(mode) = mode {
            // The entry was just made here by this process, so the name is
            // what was made (no symlink to follow).
            // SAFETY: a directory descriptor and a NUL-terminated name.
            check(unsafe { libc::fchmodat(at, name.as_ptr(), mode, 0) })?;
        }
        Ok(())
    }

    /// An opaque directory: everything in it that this layer did not make
    /// goes.
    fn empty_below(&self, dir: &OwnedFd, prefix: &Path) -> io::Result<()> {
        for child in list(dir.as_raw_fd())? {
            let key = raw_key(
                &prefix
                    .iter()
                    .chain(std::iter::once(child.as_os_str()))
                    .collect::<Vec<_>>(),
            );
            if !self.made.contains(&key) {
                remove_at(dir.as_raw_fd(), &child)?;
            }
        }
        Ok(())
    }
}

/// The target of `name` in `at` if it is a symlink.
fn link_at(at: RawFd, name: &CString) -> Option<PathBuf> {
    let mut buf = vec![0u8; libc::PATH_MAX as usize];
    // SAFETY: a directory descriptor, a NUL-terminated name, a buffer of
    // the given length.
    let n = unsafe { libc::readlinkat(at, name.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    (n >= 0).then(|| {
        buf.truncate(n as usize);
        PathBuf::from(OsStr::from_bytes(&buf))
    })
}

/// `target` (a symlink's) resolved by its words from the directory `base`,
/// inside the image: `..` stops at its root, an absolute target starts there.
fn lexical(base: &[&OsStr], target: &Path) -> Vec<std::ffi::OsString> {
    let mut out: Vec<std::ffi::OsString> = if target.is_absolute() {
        Vec::new()
    } else {
        base.iter().map(|p| p.to_os_string()).collect()
    };
    for c in target.components() {
        match c {
            Component::Normal(n) => out.push(n.to_os_string()),
            Component::ParentDir => {
                out.pop();
            }
            _ => {}
        }
    }
    out
}

/// The key of a path in the layer's record.
fn raw_key(parts: &[&OsStr]) -> Vec<u8> {
    parts.join(OsStr::new("/")).as_bytes().to_vec()
}

fn is_dir_at(at: RawFd, name: &CString) -> bool {
    // SAFETY: stat is plain data, filled by the call.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: a directory descriptor, a NUL-terminated name, a valid buffer.
    let ok = unsafe { libc::fstatat(at, name.as_ptr(), &mut st, libc::AT_SYMLINK_NOFOLLOW) } == 0;
    ok && st.st_mode & libc::S_IFMT == libc::S_IFDIR
}

/// The names in a directory opened as `at`.
fn list(at: RawFd) -> io::Result<Vec<std::ffi::OsString>> {
    // Through this process's own descriptor, so no path is resolved again.
    std::fs::read_dir(format!("/proc/self/fd/{at}"))?
        .map(|e| e.map(|e| e.file_name()))
        .collect()
}

/// Removes `name` in `at` if it is there, a directory with all it holds.
fn remove_at(at: RawFd, name: &OsStr) -> io::Result<()> {
    let cname = cstr(name)?;
    if is_dir_at(at, &cname) {
        let flags = libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC;
        // SAFETY: a directory descriptor and a NUL-terminated name.
        let fd = unsafe { libc::openat(at, cname.as_ptr(), flags) };
        check(fd)?;
        // SAFETY: openat returned a new descriptor.
        let dir = unsafe { OwnedFd::from_raw_fd(fd) };
        for child in list(dir.as_raw_fd())? {
            remove_at(dir.as_raw_fd(), &child)?;
        }
        // SAFETY: a directory descriptor and a NUL-terminated name.
        return check(unsafe { libc::unlinkat(at, cname.as_ptr(), libc::AT_REMOVEDIR) });
    }
    // SAFETY: a directory descriptor and a NUL-terminated name.
    match check(unsafe { libc::unlinkat(at, cname.as_ptr(), 0) }) {
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => Ok(()),
        other => other,
    }
}

/// Sets the modification time of `name` (not following a symlink); a
/// failure only costs the time.
fn set_mtime(at: RawFd, name: &CString, secs: i64) {
    let t = libc::timespec {
        tv_sec: secs as libc::time_t,
        tv_nsec: 0,
    };
    // SAFETY: a directory descriptor, a NUL-terminated name, two timespecs.
    unsafe {
        libc::utimensat(
            at,
            name.as_ptr(),
            [t, t].as_ptr(),
            libc::AT_SYMLINK_NOFOLLOW,
        )
    };
}

#[cfg(test)]
mod tests {
    use std::fs;
    use std::os::unix::fs::{MetadataExt, PermissionsExt};

    use super::*;

    /// A tar stream of (path, kind) entries: `"f:text"` a file, `"d"` a
    /// directory, `"l:target"` a symlink, `"h:target"` a hard link.
    fn layer(entries: &[(&str, &str)]) -> Vec<u8> {
        let mut b = tar::Builder::new(Vec::new());
        for (path, what) in entries {
            let mut h = tar::Header::new_gnu();
            h.set_mode(0o755);
            h.set_uid(0);
            h.set_gid(0);
            let (kind, arg) = what.split_once(':').unwrap_or((what, ""));
            match kind {
                "f" if path.contains("..") => {
                    // The builder refuses such names; a hostile layer has them.
                    h.set_entry_type(tar::EntryType::Regular);
                    h.set_size(arg.len() as u64);
                    h.as_old_mut().name[..path.len()].copy_from_slice(path.as_bytes());
                    h.set_cksum();
                    b.append(&h, arg.as_bytes()).unwrap();
                }
                "f" => {
                    h.set_entry_type(tar::EntryType::Regular);
                    h.set_size(arg.len() as u64);
                    b.append_data(&mut h, path, arg.as_bytes()).unwrap();
                }
                "d" => {
                    h.set_entry_type(tar::EntryType::Directory);
                    h.set_size(0);
                    b.append_data(&mut h, path, io::empty()).unwrap();
                }
                "l" | "h" => {
                    h.set_entry_type(if kind == "l" {
                        tar::EntryType::Symlink
                    } else {
                        tar::EntryType::Link
                    });
                    h.set_size(0);
                    b.append_link(&mut h, path, arg).unwrap();
                }
                "c" => {
                    h.set_entry_type(tar::EntryType::Char);
                    h.set_size(0);
                    b.append_data(&mut h, path, io::empty()).unwrap();
                }
                _ => unreachable!(),
            }
        }
        b.into_inner().unwrap()
    }

    fn apply(root: &Path, entries: &[(&str, &str)]) -> Result<LayerStats, UnpackError> {
        Root::open(root).unwrap().apply(&layer(entries)[..])
    }

    #[test]
    fn files_links_and_directories_land_inside_the_root() {
        let dir = tempfile::tempdir().unwrap();
        let stats = apply(
            dir.path(),
            &[
                ("bin/busybox", "f:elf"),
                ("bin/sh", "l:busybox"),
                ("usr/bin/env", "h:bin/busybox"),
                ("./etc/os-release", "f:NAME=x\n"),
                ("dev/null", "c"),
            ],
        )
        .unwrap();
        assert_eq!(stats.devices_skipped, 1);
        let root = dir.path();
        assert_eq!(fs::read_to_string(root.join("bin/sh")).unwrap(), "elf");
        assert_eq!(
            fs::metadata(root.join("usr/bin/env")).unwrap().ino(),
            fs::metadata(root.join("bin/busybox")).unwrap().ino()
        );
        assert_eq!(
            fs::read_to_string(root.join("etc/os-release")).unwrap(),
            "NAME=x\n"
        );
        let mode = fs::metadata(root.join("bin/busybox"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o755);
        assert!(!root.join("dev/null").exists());
    }

    #[test]
    fn nothing_is_written_outside_the_root() {
        let outside = tempfile::tempdir().unwrap();
        let dir = tempfile::tempdir().unwrap();
        // An absolute symlink, then a file written through it: it lands in
        // the image's own directory of that name, never the host's.
        let target = outside.path().to_str().unwrap().to_string();
        apply(
            dir.path(),
            &[("escape", &format!("l:{target}")), ("escape/owned", "f:x")],
        )
        .unwrap();
        assert_eq!(fs::read_dir(outside.path()).unwrap().count(), 0);
        let inside = dir
            .path()
            .join(target.trim_start_matches('/'))
            .join("owned");
        assert_eq!(fs::read_to_string(inside).unwrap(), "x");
        // A relative symlink that climbs above the root stays inside too.
        apply(dir.path(), &[("up", "l:../../../.."), ("up/tmp/x", "f:y")]).unwrap();
        assert!(dir.path().join("tmp/x").exists());
        let err = apply(dir.path(), &[("a/../../x", "f:z")]).unwrap_err();
        assert!(matches!(err, UnpackError::Escapes { .. }), "{err}");
    }

    #[test]
    fn whiteouts_remove_and_opaque_directories_empty_the_layers_below() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        apply(
            root,
            &[
                ("etc/keep", "f:1"),
                ("etc/gone", "f:2"),
                ("opt/old/a", "f:3"),
                ("opt/old2", "f:4"),
            ],
        )
        .unwrap();
        apply(
            root,
            &[
                ("etc/.wh.gone", "f:"),
                ("opt/new", "f:5"),
                ("opt/.wh..wh..opq", "f:"),
                ("var/.wh.nothing", "f:"),
            ],
        )
        .unwrap();
        assert!(root.join("etc/keep").exists());
        assert!(!root.join("etc/gone").exists());
        assert!(!root.join("opt/old").exists() && !root.join("opt/old2").exists());
        assert_eq!(fs::read_to_string(root.join("opt/new")).unwrap(), "5");
        assert!(!root.join("etc/.wh.gone").exists());
        // A file replaces a directory of a lower layer, and back.
        apply(root, &[("opt", "f:file now")]).unwrap();
        assert_eq!(fs::read_to_string(root.join("opt")).unwrap(), "file now");
        apply(root, &[("opt/x", "f:dir again")]).unwrap_err();
        apply(root, &[("opt", "d"), ("opt/x", "f:dir again")]).unwrap();
        assert!(root.join("opt/x").exists());
    }

    #[test]
    fn garbage_is_not_a_layer() {
        let dir = tempfile::tempdir().unwrap();
        let err = Root::open(dir.path())
            .unwrap()
            .apply(&b"this is not a tar archive, not even close to one"[..])
            .unwrap_err();
        assert!(matches!(err, UnpackError::Archive(_)), "{err}");
    }
}
