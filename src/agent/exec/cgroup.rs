//! The task's cgroup (v2): limits (memory.max, cpu.max or cpuset.cpus,
//! pids.max), OOM accounting (memory.events) and stopping the whole process
//! tree at once (cgroup.kill); and `Target`, a cgroup opened for a child to
//! be born in (the shim in `gpuq/shims`, the task in its own; `fork` does the
//! birth).
//!
//! Layout: `<mount>/gpuq/<job>.<attempt>.<rank>` per task, and
//! `<mount>/gpuq/shims` where every shim starts (see `fork`), so a shim is neither
//! counted against its task's limits nor killed with it, and a service manager
//! stopping the agent's own cgroup does not take the shims (and their tasks)
//! down with it.
//!
//! Three modes, chosen by `CgroupMode::detect` from `/proc/self/mountinfo`:
//! - `Limits`: a cgroup2 mount (preferring `/sys/fs/cgroup`) whose
//!   `cgroup.controllers` lists memory, cpu and pids.
//! - `TrackingOnly`: a cgroup2 mount without them, as the empty
//!   `/sys/fs/cgroup/unified` of a hybrid (v1 + v2) host. Its cgroups still
//!   track every process of a task, including ones that left the process
//!   group, and `cgroup.kill` stops them all; there are no limits and no OOM
//!   accounting. A `Limits` mount whose controllers cannot be enabled falls
//!   back to this.
//! - `Unavailable`: no usable cgroup2 mount; the shim falls back to the process group
//!   plus its own descendants (it is a child subreaper, see `shim`).

use std::fs;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

use super::task::TaskSpec;

/// The controllers gpuq needs to enforce limits.
const REQUIRED: [&str; 3] = ["memory", "cpu", "pids"];
/// The usual place of the unified hierarchy.
const PREFERRED_MOUNT: &str = "/sys/fs/cgroup";
/// The directory under the mount that gpuq owns.
const GPUQ_DIR: &str = "gpuq";
/// The leaf the shims move themselves to.
const SHIMS_DIR: &str = "shims";
/// cpu.max period in microseconds.
const CPU_PERIOD_US: u64 = 100_000;

/// What cgroup v2 support this node has.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CgroupMode {
    /// cgroup v2 with memory, cpu and pids: limits, OOM accounting, tracking.
    Limits {
        mount: PathBuf,
        /// Whether the cpuset controller is available too.
        cpuset: bool,
    },
    /// A cgroup2 mount without those controllers (or where they cannot be
    /// enabled): tracking and kill only. `why` says which.
    TrackingOnly { mount: PathBuf, why: String },
    /// No usable cgroup2 mount.
    Unavailable { why: String },
}

/// A cgroup could not be set up; the message names the file.
#[derive(Debug, thiserror::Error)]
#[error("cannot {action} {}: {source}", path.display())]
pub struct CgroupError {
    action: &'static str,
    path: PathBuf,
    source: io::Error,
}

pub(super) fn cg_err(action: &'static str, path: &Path) -> impl FnOnce(io::Error) -> CgroupError {
    let path = path.to_path_buf();
    move |source| CgroupError {
        action,
        path,
        source,
    }
}

/// A cgroup a child is to start in: its directory, open for `clone3`, and
/// its `cgroup.procs`, open for the fallback, both opened before the fork.
pub struct Target {
    dir: OwnedFd,
    procs: OwnedFd,
    path: PathBuf,
}

impl Target {
    /// Opens the cgroup directory `path`.
    pub fn open(path: &Path) -> Result<Target, CgroupError> {
        let dir = fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_DIRECTORY)
            .open(path)
            .map_err(cg_err("open cgroup", path))?;
        let procs_path = path.join("cgroup.procs");
        let procs = fs::OpenOptions::new()
            .write(true)
            .open(&procs_path)
            .map_err(cg_err("open", &procs_path))?;
        Ok(Target {
            dir: dir.into(),
            procs: procs.into(),
            path: path.to_path_buf(),
        })
    }

    /// The cgroup directory, open for `clone3`'s `CLONE_INTO_CGROUP`.
    pub(super) fn dir_fd(&self) -> RawFd {
        self.dir.as_raw_fd()
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Moves the calling process into the cgroup: for a child that `fork_into`
    /// could not start there. Only a write(2), so it may run in a fork child.
    pub fn join_self(&self) -> io::Result<()> {
        // SAFETY: a write of one byte from a static buffer to an owned fd.
        match unsafe { libc::write(self.procs.as_raw_fd(), b"0".as_ptr().cast(), 1) } {
            1 => Ok(()),
            _ => Err(io::Error::last_os_error()),
        }
    }
}

/// Undoes the octal escapes (`\040` for a space) of mountinfo paths.
fn unescape_mount_path(raw: &str) -> String {
    let bytes = raw.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let octal = bytes
            .get(i + 1..i + 4)
            .filter(|d| d.iter().all(|b| (b'0'..=b'7').contains(b)))
            .and_then(|d| u8::from_str_radix(std::str::from_utf8(d).ok()?, 8).ok());
        match (bytes[i], octal) {
            (b'\\', Some(value)) => {
                out.push(value);
                i += 4;
            }
            (b, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The writable cgroup2 mount points in a mountinfo text, `/sys/fs/cgroup`
/// first.
pub fn cgroup2_mounts(mountinfo: &str) -> Vec<PathBuf> {
    let mut mounts: Vec<PathBuf> = mountinfo
        .lines()
        .filter_map(|line| {
            let (left, right) = line.split_once(" - ")?;
            let fstype = right.split_whitespace().next()?;
            let mut fields = left.split_whitespace().skip(4);
            let mount_point = fields.next()?;
            let read_only = fields.next()?.split(',').any(|o| o == "ro");
            (fstype == "cgroup2" && !read_only)
                .then(|| PathBuf::from(unescape_mount_path(mount_point)))
        })
        .collect();
    mounts.sort_by_key(|m| m != Path::new(PREFERRED_MOUNT));
    mounts.dedup();
    mounts
}

impl CgroupMode {
    /// Looks at this node's mounts and controllers, and sets up `<mount>/gpuq`
    /// (enabling the controllers for it). A mode that cannot be set up falls
    /// back to the next weaker one, with the reason in its warning.
    pub fn detect() -> CgroupMode {
        let mountinfo = fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
        CgroupMode::choose(&cgroup2_mounts(&mountinfo), |mount| {
            fs::read_to_string(mount.join("cgroup.controllers")).ok()
        })
        .set_up()
    }

    /// Picks the first mount with the required controllers, else the first
    /// mount for tracking only. `controllers` reads a mount's
    /// `cgroup.controllers` (`None`: unreadable, the mount is skipped).
    pub fn choose(mounts: &[PathBuf], controllers: impl Fn(&Path) -> Option<String>) -> CgroupMode {
        let mut tracking = None;
        for mount in mounts {
            let Some(list) = controllers(mount) else {
                continue;
            };
            let has = |c: &str| list.split_whitespace().any(|x| x == c);
            if REQUIRED.iter().all(|c| has(c)) {
                return CgroupMode::Limits {
                    mount: mount.clone(),
                    cpuset: has("cpuset"),
                };
            }
            tracking.get_or_insert_with(|| CgroupMode::TrackingOnly {
                mount: mount.clone(),
                why: match list.trim() {
                    "" => "it offers no controllers".to_string(),
                    list => format!("it offers only: {list}"),
                },
            });
        }
        tracking.unwrap_or(CgroupMode::Unavailable {
            why: "no writable cgroup2 mount in /proc/self/mountinfo".to_string(),
        })
    }

    /// Creates `<mount>/gpuq` and, for limits, enables the controllers in the
    /// mount's and its `cgroup.subtree_control` (this fails, for instance,
    /// where the mount is a container's own non-root cgroup with processes in
    /// it).
    fn set_up(self) -> CgroupMode {
        match self {
            CgroupMode::Limits { mount, cpuset } => {
                let mut wanted: Vec<&str> = REQUIRED.to_vec();
                if cpuset {
                    wanted.push("cpuset");
                }
                let dir = mount.join(GPUQ_DIR);
                let ready = enable_controllers(&mount, &wanted)
                    .and_then(|()| create_dir(&dir))
                    .and_then(|()| enable_controllers(&dir, &wanted));
                match ready {
                    Ok(()) => CgroupMode::Limits { mount, cpuset },
                    Err(e) => CgroupMode::TrackingOnly {
                        mount,
                        why: e.to_string(),
                    }
                    .set_up(),
                }
            }
            CgroupMode::TrackingOnly { mount, why } => match create_dir(&mount.join(GPUQ_DIR)) {
                Ok(()) => CgroupMode::TrackingOnly { mount, why },
                Err(e) => CgroupMode::Unavailable {
                    why: format!("{why}; {e}"),
                },
            },
            unavailable => unavailable,
        }
    }

    /// The sentence to log when tasks will run without limits.
    pub fn degraded_warning(&self) -> Option<String> {
        match self {
            CgroupMode::Limits { .. } => None,
            CgroupMode::TrackingOnly { mount, why } => Some(format!(
                "cgroup v2 with memory/cpu/pids controllers not found at {} ({why}); \
                 tasks run without resource limits; a cgroup there still tracks each task \
                 and cgroup.kill stops it",
                mount.display(),
            )),
            CgroupMode::Unavailable { why } => Some(format!(
                "cgroup v2 with memory/cpu/pids controllers not found at {PREFERRED_MOUNT} \
                 ({why}); tasks run without resource limits; the process group (and the \
                 shim's descendants) is used to stop them"
            )),
        }
    }

    /// Logs `degraded_warning` once, at warn level.
    pub fn warn_if_degraded(&self) {
        if let Some(warning) = self.degraded_warning() {
            tracing::warn!("{warning}");
        }
    }

    pub(super) fn gpuq_dir(&self) -> Option<PathBuf> {
        match self {
            CgroupMode::Limits { mount, .. } | CgroupMode::TrackingOnly { mount, .. } => {
                Some(mount.join(GPUQ_DIR))
            }
            CgroupMode::Unavailable { .. } => None,
        }
    }

    /// Whether limits are enforced.
    pub fn enforces_limits(&self) -> bool {
        matches!(self, CgroupMode::Limits { .. })
    }

    /// `<mount>/gpuq/shims`, created if need be, for a shim to start in
    /// (see `fork`); `None` without a cgroup2 mount.
    pub fn shims_target(&self) -> Result<Option<Target>, CgroupError> {
        let Some(dir) = self.gpuq_dir() else {
            return Ok(None);
        };
        let shims = dir.join(SHIMS_DIR);
        create_dir(&shims)?;
        Target::open(&shims).map(Some)
    }

    /// Creates the task's cgroup with the spec's limits. `None` when the node
    /// has no usable cgroup2 mount. The name carries a hash of the task's
    /// directory: one host may run several agents (`gpuq dev`, tests) whose
    /// tasks have the same key.
    pub fn create_task_cgroup(
        &self,
        spec: &TaskSpec,
        task_dir: &Path,
    ) -> Result<Option<TaskCgroup>, CgroupError> {
        let Some(dir) = self.gpuq_dir() else {
            return Ok(None);
        };
        use sha2::Digest;
        let digest = sha2::Sha256::digest(task_dir.as_os_str().as_encoded_bytes());
        let path = dir.join(format!("{}-{}", spec.key, hex::encode(&digest[..4])));
        create_dir(&path)?;
        let cgroup = TaskCgroup {
            path,
            cpuset_applied: false,
        };
        let result = match self {
            CgroupMode::Limits { cpuset, .. } => cgroup.clone().apply_limits(spec, *cpuset),
            _ => Ok(cgroup.clone()),
        };
        if result.is_err() {
            let _ = cgroup.remove();
        }
        result.map(Some)
    }
}

fn create_dir(path: &Path) -> Result<(), CgroupError> {
    match fs::create_dir(path) {
        Err(e) if e.kind() != io::ErrorKind::AlreadyExists => Err(cg_err("create cgroup", path)(e)),
        _ => Ok(()),
    }
}

/// Enables `controllers` in `dir`'s `cgroup.subtree_control` (those not on yet).
fn enable_controllers(dir: &Path, controllers: &[&str]) -> Result<(), CgroupError> {
    let file = dir.join("cgroup.subtree_control");
    let enabled = fs::read_to_string(&file).map_err(cg_err("read", &file))?;
    for controller in controllers {
        if !enabled.split_whitespace().any(|c| c == *controller) {
            fs::write(&file, format!("+{controller}"))
                .map_err(cg_err("enable a controller in", &file))?;
        }
    }
    Ok(())
}

/// One task's cgroup directory.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TaskCgroup {
    path: PathBuf,
    cpuset_applied: bool,
}

impl TaskCgroup {
    /// An existing task cgroup (as recorded in the `pid` file).
    pub fn at(path: PathBuf) -> TaskCgroup {
        TaskCgroup {
            path,
            cpuset_applied: false,
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Whether the task's CPUs were pinned through cpuset.cpus (otherwise the
    /// shim pins them with sched_setaffinity).
    pub fn cpuset_applied(&self) -> bool {
        self.cpuset_applied
    }

    /// The file a process writes `0` to in order to join.
    pub fn procs_file(&self) -> PathBuf {
        self.path.join("cgroup.procs")
    }

    fn write(&self, name: &str, value: &str) -> Result<(), CgroupError> {
        let file = self.path.join(name);
        fs::write(&file, value).map_err(cg_err("write", &file))
    }

    fn apply_limits(mut self, spec: &TaskSpec, cpuset: bool) -> Result<TaskCgroup, CgroupError> {
        if let Some(mb) = spec.memory_mb {
            self.write("memory.max", &(mb * 1024 * 1024).to_string())?;
            // Without this, a task over its limit swaps instead of being
            // stopped, and the OOM is never seen (Slurm's AllowedSwapSpace=0).
            if self.path.join("memory.swap.max").exists() {
                self.write("memory.swap.max", "0")?;
            }
        }
        if cpuset && !spec.cpus.is_empty() {
            let list: Vec<String> = spec.cpus.iter().map(u32::to_string).collect();
            self.write("cpuset.cpus", &list.join(","))?;
            self.cpuset_applied = true;
        } else if spec.cpu_count > 0 {
            let quota = u64::from(spec.cpu_count) * CPU_PERIOD_US;
            self.write("cpu.max", &format!("{quota} {CPU_PERIOD_US}"))?;
        }
        if let Some(max) = spec.pids_max {
            self.write("pids.max", &max.to_string())?;
        }
        Ok(self)
    }

    /// The processes in the cgroup now.
    pub fn pids(&self) -> Vec<u32> {
        fs::read_to_string(self.procs_file())
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.trim().parse().ok())
            .collect()
    }

    /// Whether the cgroup is gone or has no process left.
    pub fn is_empty(&self) -> bool {
        self.pids().is_empty()
    }

    /// Sends `signal` to every process in the cgroup.
    pub fn signal(&self, signal: Signal) {
        for pid in self.pids() {
            let _ = kill(Pid::from_raw(pid as i32), signal);
        }
    }

    /// Kills every process in the cgroup: `cgroup.kill` where the kernel has it
    /// (5.14+), else SIGKILL to each listed process. Callers repeat until
    /// `is_empty`, since a process may fork while it is being killed.
    pub fn kill_all(&self) {
        let kill_file = self.path.join("cgroup.kill");
        if !(kill_file.exists() && fs::write(&kill_file, "1").is_ok()) {
            self.signal(Signal::SIGKILL);
        }
    }

    /// How many processes the OOM killer killed in the cgroup (0 without the
    /// memory controller).
    pub fn oom_kills(&self) -> u64 {
        fs::read_to_string(self.path.join("memory.events"))
            .unwrap_or_default()
            .lines()
            .find_map(|l| l.strip_prefix("oom_kill ")?.trim().parse().ok())
            .unwrap_or(0)
    }

    /// Removes the (empty) cgroup; gone already counts as removed.
    pub fn remove(&self) -> io::Result<()> {
        match fs::remove_dir(&self.path) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
            _ => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HYBRID: &str = "\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
";
    const PURE_V2: &str = "\
22 1 0:21 / /proc rw,nosuid - proc proc rw
30 23 0:26 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:4 - cgroup2 cgroup2 rw,nsdelegate
90 80 0:44 / /mnt/other\\040cg rw - cgroup2 none rw
91 80 0:45 / /mnt/readonly ro,nosuid - cgroup2 none ro
";

    #[test]
    fn finds_cgroup2_mounts_preferring_sys_fs_cgroup() {
        assert_eq!(
            cgroup2_mounts(HYBRID),
            vec![PathBuf::from("/sys/fs/cgroup/unified")]
        );
        let mut reversed: Vec<&str> = PURE_V2.lines().collect();
        reversed.reverse();
        assert_eq!(
            cgroup2_mounts(&reversed.join("\n")),
            vec![
                PathBuf::from("/sys/fs/cgroup"),
                PathBuf::from("/mnt/other cg")
            ]
        );
        assert!(cgroup2_mounts("").is_empty());
    }

    #[test]
    fn chooses_limits_only_with_memory_cpu_and_pids() {
        let mounts = cgroup2_mounts(PURE_V2);
        let full = CgroupMode::choose(&mounts, |_| Some("cpuset cpu io memory pids\n".into()));
        assert_eq!(
            full,
            CgroupMode::Limits {
                mount: "/sys/fs/cgroup".into(),
                cpuset: true
            }
        );
        assert!(full.degraded_warning().is_none());

        let hybrid = CgroupMode::choose(&cgroup2_mounts(HYBRID), |_| Some("hugetlb\n".into()));
        assert_eq!(
            hybrid,
            CgroupMode::TrackingOnly {
                mount: "/sys/fs/cgroup/unified".into(),
                why: "it offers only: hugetlb".into()
            }
        );
        let warning = hybrid.degraded_warning().unwrap();
        assert!(warning.contains("/sys/fs/cgroup/unified"), "{warning}");
        assert!(warning.contains("without resource limits"), "{warning}");

        // The second mount has the controllers: it wins over the preferred one.
        let second = CgroupMode::choose(&mounts, |m| {
            Some(
                if m == Path::new("/sys/fs/cgroup") {
                    ""
                } else {
                    "memory cpu pids"
                }
                .into(),
            )
        });
        assert_eq!(
            second,
            CgroupMode::Limits {
                mount: "/mnt/other cg".into(),
                cpuset: false
            }
        );

        let none = CgroupMode::choose(&[], |_| None);
        assert!(matches!(none, CgroupMode::Unavailable { .. }));
        assert!(none
            .degraded_warning()
            .unwrap()
            .contains("tasks run without resource limits; the process group"));
    }
}
