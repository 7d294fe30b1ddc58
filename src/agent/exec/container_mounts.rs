//! The mounts a container task's forked child makes before it execs the
//! OCI runtime (see `container` for why they are made here): a mount
//! namespace of its own, the cgroup2 view crun needs on hybrid hosts, a
//! tmpfs holding the overlay's writable layer and the bind staging points,
//! the overlay (the image below, read-only), each bind source, and the
//! mount points the image lacks (in the writable layer, resolved inside the
//! image: a symlink in it never leads out), since a rootless runtime may
//! not make them in directories the image's root owns.
//!
//! The sources were opened by the shim as the user, in the node's mount
//! namespace, and a mount cannot be made from a path of another namespace;
//! so the shim clones each into a detached mount tree (`open_tree`,
//! Linux 5.2) while it still shares that namespace, and the child attaches
//! the trees in its own (`move_mount`). A tree never attached is freed
//! with its descriptor. Everything is prepared in the shim; the child only
//! makes system calls, as `launch` requires.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::ptr;

/// `CGROUP2_SUPER_MAGIC` from linux/magic.h.
const CGROUP2_MAGIC: libc::c_long = 0x6367_7270;
/// From linux/mount.h (not in every libc target).
const OPEN_TREE_CLONE: libc::c_uint = 1;
const MOVE_MOUNT_F_EMPTY_PATH: libc::c_uint = 4;

/// Which mount failed (the high half of the code the child reports; the
/// low half is the bind's number).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u32)]
enum Failed {
    Namespace = 1,
    CgroupView,
    Scratch,
    Overlay,
    Bind,
    MountPoint,
}

/// One directory (or, last, a file) on the way to a mount point, relative
/// to the container's root: made where missing.
struct Step {
    path: CString,
    parent: CString,
    name: CString,
    file: bool,
    /// Which mount point (its number in `ChildMounts::points`).
    point: usize,
}

/// A bind source, as a detached mount tree, and where it is staged.
struct Staged {
    tree: OwnedFd,
    staging: CString,
    dir: bool,
}

/// A detached copy of the mount at `fd` (a file or directory the shim
/// opened), with what is mounted below it when `recursive`.
pub(super) fn clone_tree(fd: &OwnedFd, recursive: bool) -> io::Result<OwnedFd> {
    let mut flags =
        OPEN_TREE_CLONE | libc::O_CLOEXEC as libc::c_uint | libc::AT_EMPTY_PATH as libc::c_uint;
    if recursive {
        flags |= libc::AT_RECURSIVE as libc::c_uint;
    }
    // SAFETY: open_tree on a descriptor this process owns, with an empty path.
    let tree = unsafe { libc::syscall(libc::SYS_open_tree, fd.as_raw_fd(), c"".as_ptr(), flags) };
    if tree < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: open_tree returned a new descriptor.
    Ok(unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(tree as i32) })
}

/// What the child mounts, prepared.
pub(super) struct ChildMounts {
    cgroup2_view: bool,
    scratch: CString,
    upper: CString,
    work: CString,
    binds_dir: CString,
    merged: CString,
    overlay: CString,
    /// The image as a detached tree to attach below the overlay; `None`
    /// where the overlay names the image's directory itself (`Lower::Path`).
    lower: Option<OwnedFd>,
    /// A root bound at `merged` instead of the overlay (`Lower::Bind`).
    bind_root: Option<CString>,
    lower_at: CString,
    binds: Vec<Staged>,
    /// An unprivileged shim's user namespace: `/proc/self/uid_map` and
    /// `gid_map` lines mapping the user to itself.
    userns: Option<(CString, CString)>,
    /// The mount points, as given (for errors), and the steps making them.
    points: Vec<String>,
    steps: Vec<Step>,
}

/// What the overlay has below: the image as a tree the shim opened (as
/// root, for the user), or its directory by path (an unprivileged shim,
/// which cannot clone trees, and opens nothing another user could swap).
pub(super) enum Lower {
    Tree(OwnedFd),
    Path(std::path::PathBuf),
    /// A named container's own root (`named`), bound rather than overlaid:
    /// the tasks sharing it write to it.
    Bind(std::path::PathBuf),
}

/// The steps that make each of `points` (absolute paths in the container,
/// and whether each is a directory) inside the container's root.
fn steps(points: &[(String, bool)]) -> Result<Vec<Step>, String> {
    let mut out = Vec::new();
    for (n, (point, dir)) in points.iter().enumerate() {
        let parts: Vec<&str> = point
            .split('/')
            .filter(|p| !p.is_empty() && *p != ".")
            .collect();
        if parts.contains(&"..") {
            return Err(format!("mount point {point} goes up with '..'"));
        }
        for i in 0..parts.len() {
            let cs = |s: String| {
                CString::new(s).map_err(|_| format!("mount point {point} contains a NUL byte"))
            };
            let parent = match i {
                0 => ".".to_string(),
                _ => parts[..i].join("/"),
            };
            out.push(Step {
                path: cs(parts[..=i].join("/"))?,
                parent: cs(parent)?,
                name: cs(parts[i].to_string())?,
                file: !dir && i + 1 == parts.len(),
                point: n,
            });
        }
    }
    Ok(out)
}

/// `openat2(at, path, O_PATH | O_DIRECTORY, RESOLVE_IN_ROOT)`: `path`
/// resolved as if `at` were `/`.
///
/// # Safety
/// System calls only, as in the forked child.
unsafe fn open_in_root(at: libc::c_int, path: &CString) -> libc::c_int {
    let mut how: libc::open_how = std::mem::zeroed();
    how.flags = (libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC) as u64;
    how.resolve = libc::RESOLVE_IN_ROOT | libc::RESOLVE_NO_MAGICLINKS;
    libc::syscall(
        libc::SYS_openat2,
        at,
        path.as_ptr(),
        &how as *const libc::open_how,
        std::mem::size_of::<libc::open_how>(),
    ) as libc::c_int
}

fn c(p: &Path) -> Result<CString, String> {
    CString::new(p.as_os_str().as_bytes())
        .map_err(|_| format!("path {} contains a NUL byte", p.display()))
}

/// Whether `/sys/fs/cgroup` is something other than the cgroup2 hierarchy.
fn cgroup2_elsewhere() -> bool {
    // SAFETY: statfs is plain data, filled by the call.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: a NUL-terminated path and a valid buffer.
    let ok = unsafe { libc::statfs(c"/sys/fs/cgroup".as_ptr(), &mut st) } == 0;
    ok && st.f_type as libc::c_long != CGROUP2_MAGIC
}

impl ChildMounts {
    /// The overlay of `lower` (a tree) at `merged` with its writable layer
    /// in a tmpfs at `scratch`, where `binds` (tree, is a directory) are
    /// staged as `scratch/binds/<n>`, the sources `config.json` names.
    pub(super) fn new(
        scratch: &Path,
        merged: &Path,
        lower: Lower,
        binds: Vec<(OwnedFd, bool)>,
        points: &[(String, bool)],
        userns: Option<(u32, u32)>,
    ) -> Result<ChildMounts, String> {
        let text = scratch.to_string_lossy();
        let mut bind_root = None;
        let (lower, lower_dir) = match lower {
            Lower::Tree(fd) => (Some(fd), format!("{text}/lower")),
            Lower::Path(p) => (None, p.to_string_lossy().into_owned()),
            Lower::Bind(p) => {
                bind_root = Some(c(&p)?);
                (None, format!("{text}/lower"))
            }
        };
        for path in [text.as_ref(), lower_dir.as_str()] {
            if path.contains([',', ':']) {
                return Err(format!(
                    "{path} contains ',' or ':', which an overlay mount cannot take; move \
                     the agent's data_dir"
                ));
            }
        }
        let overlay = format!("lowerdir={lower_dir},upperdir={text}/upper,workdir={text}/work");
        let binds = binds
            .into_iter()
            .enumerate()
            .map(|(i, (tree, dir))| {
                Ok(Staged {
                    staging: c(&scratch.join("binds").join(i.to_string()))?,
                    tree,
                    dir,
                })
            })
            .collect::<Result<_, String>>()?;
        Ok(ChildMounts {
            cgroup2_view: cgroup2_elsewhere(),
            scratch: c(scratch)?,
            upper: c(&scratch.join("upper"))?,
            work: c(&scratch.join("work"))?,
            binds_dir: c(&scratch.join("binds"))?,
            merged: c(merged)?,
            overlay: CString::new(overlay).map_err(|_| "a NUL byte in the overlay".to_string())?,
            lower,
            bind_root,
            lower_at: c(&scratch.join("lower"))?,
            binds,
            userns: userns.map(|(uid, gid)| {
                let line = |id: u32| CString::new(format!("{id} {id} 1")).expect("no NUL");
                (line(uid), line(gid))
            }),
            steps: steps(points)?,
            points: points.iter().map(|(p, _)| p.clone()).collect(),
        })
    }

    /// Makes the mounts, in the forked child (system calls only); the error
    /// is the code `describe` reads, with `errno` set.
    ///
    /// # Safety
    /// In the forked child of the single-threaded shim, before exec.
    pub(super) unsafe fn enter(&self) -> Result<(), u32> {
        let code = |f: Failed, n: usize| ((f as u32) << 16) | (n as u32 & 0xffff);
        let ok =
            |ret: libc::c_int, f: Failed, n: usize| if ret < 0 { Err(code(f, n)) } else { Ok(()) };
        match &self.userns {
            None => ok(libc::unshare(libc::CLONE_NEWNS), Failed::Namespace, 0)?,
            // Unprivileged: a user namespace of its own (mapping the user
            // to itself) gives the mounts below; a cgroup namespace lets it
            // mount the cgroup2 view.
            Some((uid_map, gid_map)) => {
                let flags = libc::CLONE_NEWUSER | libc::CLONE_NEWNS | libc::CLONE_NEWCGROUP;
                ok(libc::unshare(flags), Failed::Namespace, 0)?;
                let write = |path: &std::ffi::CStr, line: &[u8]| {
                    let fd = libc::open(path.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
                    if fd < 0 {
                        return -1;
                    }
                    let n = libc::write(fd, line.as_ptr().cast(), line.len());
                    libc::close(fd);
                    if n < 0 {
                        -1
                    } else {
                        0
                    }
                };
                ok(
                    write(c"/proc/self/setgroups", b"deny"),
                    Failed::Namespace,
                    0,
                )?;
                ok(
                    write(c"/proc/self/uid_map", uid_map.as_bytes()),
                    Failed::Namespace,
                    0,
                )?;
                ok(
                    write(c"/proc/self/gid_map", gid_map.as_bytes()),
                    Failed::Namespace,
                    0,
                )?;
            }
        }
        // The daemon's umask (077) would narrow what is made below.
        libc::umask(0o022);
        let none = ptr::null();
        let rprivate = libc::MS_REC | libc::MS_PRIVATE;
        ok(
            libc::mount(none, c"/".as_ptr(), none, rprivate, ptr::null()),
            Failed::Namespace,
            0,
        )?;
        if self.cgroup2_view {
            let flags = libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC;
            let fs = c"cgroup2".as_ptr();
            ok(
                libc::mount(fs, c"/sys/fs/cgroup".as_ptr(), fs, flags, ptr::null()),
                Failed::CgroupView,
                0,
            )?;
        }
        let safe = libc::MS_NOSUID | libc::MS_NODEV;
        let tmpfs = c"tmpfs".as_ptr();
        ok(
            libc::mount(
                tmpfs,
                self.scratch.as_ptr(),
                tmpfs,
                safe,
                c"mode=0711".as_ptr().cast(),
            ),
            Failed::Scratch,
            0,
        )?;
        let dirs = [
            (&self.upper, 0o755),
            (&self.work, 0o700),
            (&self.binds_dir, 0o711),
            (&self.lower_at, 0o700),
        ];
        for (dir, mode) in dirs {
            ok(libc::mkdir(dir.as_ptr(), mode), Failed::Scratch, 0)?;
        }
        let attach = |tree: &OwnedFd, at: &CString| {
            libc::syscall(
                libc::SYS_move_mount,
                tree.as_raw_fd(),
                c"".as_ptr(),
                libc::AT_FDCWD,
                at.as_ptr(),
                MOVE_MOUNT_F_EMPTY_PATH,
            ) as libc::c_int
        };
        if let Some(lower) = &self.lower {
            ok(attach(lower, &self.lower_at), Failed::Overlay, 0)?;
        }
        let overlay = c"overlay".as_ptr();
        match &self.bind_root {
            None => ok(
                libc::mount(
                    overlay,
                    self.merged.as_ptr(),
                    overlay,
                    safe,
                    self.overlay.as_ptr().cast(),
                ),
                Failed::Overlay,
                0,
            )?,
            Some(root) => {
                let flags = libc::MS_BIND | libc::MS_REC;
                ok(
                    libc::mount(
                        root.as_ptr(),
                        self.merged.as_ptr(),
                        none,
                        flags,
                        ptr::null(),
                    ),
                    Failed::Overlay,
                    0,
                )?;
                // A bind keeps its source's flags: add nosuid and nodev.
                let again = libc::MS_BIND | libc::MS_REMOUNT | safe;
                ok(
                    libc::mount(none, self.merged.as_ptr(), none, again, ptr::null()),
                    Failed::Overlay,
                    0,
                )?;
            }
        }
        self.make_points()?;
        for (i, b) in self.binds.iter().enumerate() {
            if b.dir {
                ok(libc::mkdir(b.staging.as_ptr(), 0o700), Failed::Bind, i)?;
            } else {
                let flags = libc::O_CREAT | libc::O_WRONLY | libc::O_CLOEXEC;
                let fd = libc::open(b.staging.as_ptr(), flags, 0o600 as libc::c_uint);
                ok(fd, Failed::Bind, i)?;
                libc::close(fd);
            }
            ok(attach(&b.tree, &b.staging), Failed::Bind, i)?;
        }
        Ok(())
    }

    /// Makes the mount points missing from the container's root, in its
    /// writable layer, as root (the image's root owns their directories),
    /// every path resolved inside the root.
    ///
    /// # Safety
    /// In the forked child, after the overlay is mounted.
    unsafe fn make_points(&self) -> Result<(), u32> {
        let code = |n: usize| ((Failed::MountPoint as u32) << 16) | (n as u32 & 0xffff);
        let flags = libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC;
        let root = libc::open(self.merged.as_ptr(), flags);
        if root < 0 {
            return Err((Failed::Overlay as u32) << 16);
        }
        let mut result = Ok(());
        for step in &self.steps {
            if !step.file {
                let fd = open_in_root(root, &step.path);
                if fd >= 0 {
                    libc::close(fd);
                    continue;
                }
                if *libc::__errno_location() != libc::ENOENT {
                    result = Err(code(step.point));
                    break;
                }
            }
            let parent = open_in_root(root, &step.parent);
            if parent < 0 {
                result = Err(code(step.point));
                break;
            }
            let made = match step.file {
                true => {
                    let flags = libc::O_CREAT
                        | libc::O_EXCL
                        | libc::O_WRONLY
                        | libc::O_NOFOLLOW
                        | libc::O_CLOEXEC;
                    let fd = libc::openat(parent, step.name.as_ptr(), flags, 0o644 as libc::c_uint);
                    if fd >= 0 {
                        libc::close(fd);
                    }
                    fd
                }
                false => libc::mkdirat(parent, step.name.as_ptr(), 0o755),
            };
            let errno = *libc::__errno_location();
            libc::close(parent);
            if made < 0 && errno != libc::EEXIST {
                *libc::__errno_location() = errno;
                result = Err(code(step.point));
                break;
            }
        }
        let errno = *libc::__errno_location();
        libc::close(root);
        *libc::__errno_location() = errno;
        result
    }

    /// The sentence for a failed mount.
    pub(super) fn describe(&self, code: u32, errno: i32) -> String {
        let err = io::Error::from_raw_os_error(errno);
        let n = (code & 0xffff) as usize;
        match code >> 16 {
            x if x == Failed::Namespace as u32 => {
                format!("cannot make the container's namespaces: {err}")
            }
            x if x == Failed::CgroupView as u32 => {
                format!("cannot mount the cgroup2 hierarchy for the OCI runtime: {err}")
            }
            x if x == Failed::Scratch as u32 => format!(
                "cannot make the container's writable layer in {}: {err}",
                self.scratch.to_string_lossy()
            ),
            x if x == Failed::Overlay as u32 => format!(
                "cannot mount the container's root (overlay {}): {err}",
                self.overlay.to_string_lossy()
            ),
            x if x == Failed::MountPoint as u32 => format!(
                "cannot make mount point {} in the container's root: {err}",
                self.points.get(n).map_or("?", String::as_str)
            ),
            _ => format!("cannot mount bind source number {n} into the container: {err}"),
        }
    }
}
