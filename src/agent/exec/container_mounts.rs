//! The mounts a container task's forked child makes before it execs the
//! OCI runtime (see `container` for why they are made here): a mount
//! namespace of its own, the cgroup2 view crun needs on hybrid hosts, a
//! tmpfs holding the overlay's writable layer and the bind staging points,
//! the overlay (the image below, read-only), and each bind source.
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
    lower: OwnedFd,
    lower_at: CString,
    binds: Vec<Staged>,
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
        lower: OwnedFd,
        binds: Vec<(OwnedFd, bool)>,
    ) -> Result<ChildMounts, String> {
        let text = scratch.to_string_lossy();
        if text.contains([',', ':']) {
            return Err(format!(
                "the task directory {text} contains ',' or ':', which an overlay mount \
                 cannot take; move the agent's data_dir"
            ));
        }
        let overlay = format!("lowerdir={text}/lower,upperdir={text}/upper,workdir={text}/work");
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
            lower_at: c(&scratch.join("lower"))?,
            binds,
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
        ok(libc::unshare(libc::CLONE_NEWNS), Failed::Namespace, 0)?;
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
                c"mode=0700".as_ptr().cast(),
            ),
            Failed::Scratch,
            0,
        )?;
        let dirs = [
            (&self.upper, 0o755),
            (&self.work, 0o700),
            (&self.binds_dir, 0o700),
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
        ok(attach(&self.lower, &self.lower_at), Failed::Overlay, 0)?;
        let overlay = c"overlay".as_ptr();
        ok(
            libc::mount(
                overlay,
                self.merged.as_ptr(),
                overlay,
                safe,
                self.overlay.as_ptr().cast(),
            ),
            Failed::Overlay,
            0,
        )?;
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

    /// The sentence for a failed mount.
    pub(super) fn describe(&self, code: u32, errno: i32) -> String {
        let err = io::Error::from_raw_os_error(errno);
        let n = (code & 0xffff) as usize;
        match code >> 16 {
            x if x == Failed::Namespace as u32 => {
                format!("cannot make a mount namespace for the container: {err}")
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
            _ => format!("cannot mount bind source number {n} into the container: {err}"),
        }
    }
}
