//! Tasks in container images (`--container-image`), run by an OCI runtime
//! (crun or runc) under the task's shim, as the bare task would run: the
//! job's user, environment, working directory, output files, cgroup and
//! GPUs, the host's network (gangs rendezvous as bare ones do) and process
//! ids (NCCL and CUDA IPC between ranks on a node work as bare).
//!
//! The agent names the runtime and the node's image cache (`container_host`,
//! into the task's `TaskContainer`); the shim does the rest (`prepare`):
//! it resolves the image (`image`: unpacked once per node into the cache,
//! whose entry it holds for as long as the task runs so that it is never
//! evicted under it, or a plain root filesystem), opens every host path
//! the container will see *as the job's user* (so root never mounts what
//! the user may not reach, and nothing the user can swap afterwards: the
//! mounts are made from these descriptors, see `container_mounts`), and
//! writes an OCI bundle
//! (`<task dir>/bundle/config.json`). The forked child (`launch`) then, in
//! a mount namespace of its own, mounts a tmpfs with an overlay on it
//! (the image read-only below, a per-task writable layer above, `nosuid`
//! and `nodev`: the image is never written, whoever shares it; the
//! runtime makes the root read-only with `--container-readonly`) and the
//! bind sources, opens the task's output files as the user, and execs the
//! runtime as root with `run --detach`. The runtime exits once the
//! container runs; its process, reparented to the shim (a subreaper), is
//! the task from then on: its exit is the task's, and a stop signals it and
//! its tree in the task's cgroup, where it was born (crun runs with
//! `--cgroup-manager=disabled`). Every mount lives and dies with the task's
//! namespaces: nothing is left mounted on the node.
//!
//! crun refuses a hybrid cgroup host whose v2 hierarchy holds controllers
//! (before it looks at its cgroup manager), so where `/sys/fs/cgroup` is
//! not cgroup2 the child mounts the cgroup2 hierarchy there, in its own
//! namespace only.

use std::fs::{self, File};
use std::io;
use std::os::fd::OwnedFd;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use nix::unistd::Pid;

use super::bundle::{container_env, gpu_devices, oci_config, Process};
pub(super) use super::container_host::is_crun;
pub use super::container_host::{find_runtime, rootless_here, user_namespaces, ContainerHost};
use super::image_sif::{SIF_EXEC, SIF_RUN};
pub use super::image_tools::find_tool;
pub use super::task::Pull;
use super::task::{hostname, Identity, TaskContainer, TaskSpec};

/// The user's registry credentials merged over the node's, in the task's
/// directory while its image is pulled.
const AUTH_FILE: &str = "registry-auth.json";

/// How long the runtime may take to start the container.
const START_LIMIT: std::time::Duration = std::time::Duration::from_secs(60);

/// Runs `f` with `who`'s file system identity (fsuid, fsgid, groups), so
/// every path it resolves and file it opens is checked as that user's;
/// root's is back afterwards. Only in the single-threaded shim.
fn as_user<T>(who: &Identity, f: impl FnOnce() -> T) -> Result<T, String> {
    // An unprivileged shim is the user already.
    if nix::unistd::geteuid().as_raw() == who.uid && who.uid != 0 {
        return Ok(f());
    }
    let saved = nix::unistd::getgroups().map_err(|e| format!("cannot read the groups: {e}"))?;
    let groups: Vec<libc::gid_t> = who.groups.clone();
    // SAFETY: plain system calls; the shim has one thread.
    unsafe {
        if libc::setgroups(groups.len(), groups.as_ptr()) < 0 {
            return Err(format!(
                "cannot take the groups of user {}: {}",
                who.name,
                io::Error::last_os_error()
            ));
        }
        libc::setfsgid(who.gid);
        libc::setfsuid(who.uid);
    }
    let out = f();
    let saved: Vec<libc::gid_t> = saved.iter().map(|g| g.as_raw()).collect();
    // SAFETY: as above; back to root's identity.
    unsafe {
        libc::setfsuid(0);
        libc::setfsgid(0);
        libc::setgroups(saved.len(), saved.as_ptr());
    }
    Ok(out)
}

/// `path` created (or truncated) for writing as `who`, mode 0644: where
/// the user may write, and theirs.
pub(super) fn open_as(who: &Identity, path: &Path) -> io::Result<File> {
    as_user(who, || {
        fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o644)
            .custom_flags(libc::O_CLOEXEC | libc::O_NOFOLLOW)
            .open(path)
    })
    .unwrap_or_else(|e| Err(io::Error::other(e)))
}

/// A host path bound into the container: a detached mount tree of what
/// the shim opened (`None`: the runtime binds `source` itself, for an
/// unprivileged shim).
struct Bind {
    tree: Option<OwnedFd>,
    source: String,
    dir: bool,
    destination: String,
    read_only: bool,
}

/// A task's container, ready for the forked child: the runtime's command
/// line and the mounts to make first.
pub(super) struct Launch {
    /// The runtime's argv (`crun ... run --detach ... ID`).
    pub argv: Vec<String>,
    /// Where the runtime writes the pid of the container's process (or of
    /// an exec's command on a terminal).
    pub(super) pid_file: PathBuf,
    log_file: PathBuf,
    /// The mounts the child makes; none for an exec into a running
    /// container (`container_exec`), which has its root already.
    pub(super) mounts: Option<super::container_mounts::ChildMounts>,
    /// The runtime runs as the task's user (rootless), not as root.
    pub(super) as_user: bool,
    /// `--container-save`: the root to save, and where, once the task
    /// completes.
    pub(super) save: Option<(PathBuf, PathBuf)>,
    /// The hold on the image's cache entry while the task runs.
    _lease: Option<super::image_cache::Lease>,
}

impl Launch {
    /// A process started in a running container: `argv` is the runtime's
    /// `exec` command line, which stays in the foreground as the process's
    /// parent (its exit is the process's) rather than detaching; it writes
    /// the command's pid to `pid_file` on a terminal.
    pub(super) fn exec(argv: Vec<String>, pid_file: PathBuf, as_user: bool) -> Launch {
        Launch {
            argv,
            log_file: pid_file.with_extension("log"),
            pid_file,
            mounts: None,
            as_user,
            save: None,
            _lease: None,
        }
    }

    /// Whether this runs a process in a running container (the runtime is
    /// the task's process) rather than starting one (it detaches).
    pub(super) fn is_exec(&self) -> bool {
        self.mounts.is_none()
    }
}

/// The runtime's state directory in a task's directory, with the
/// container's pid and the runtime's log: the user's own where the runtime
/// runs as the user.
pub(super) fn state_dir(task_dir: &Path) -> PathBuf {
    task_dir.join("runtime")
}

/// Prepares the task's container in the shim (as root): resolves the image
/// (unpacking it once per node), opens what it binds as `identity`, writes
/// the bundle. `argv` is the task's own command line; `cgroup` its cgroup
/// relative to the hierarchy's root (for runc). Errors are sentences for
/// the user.
pub(super) fn prepare(
    dir: &Path,
    spec: &TaskSpec,
    c: &TaskContainer,
    identity: &Identity,
    argv: &[String],
    script: Option<&Path>,
    cgroup: Option<String>,
) -> Result<Launch, String> {
    // An agent that is not root runs its user's containers rootless only,
    // with no trees to clone: the image and the binds go by path.
    let opener = Opener {
        identity,
        unprivileged: !nix::unistd::geteuid().is_root(),
    };
    // The GPUs' CDI edits where the node has specs, else their device nodes.
    let driver = Path::new("/proc/driver/nvidia/gpus");
    let cdi = match c.devices.is_empty() {
        true => None,
        false => super::cdi::edits_for(&c.cdi_dirs, &super::cdi::names(c, driver))?,
    };
    // CDI hooks (nvidia-ctk's ldcache and symlinks) write into the image's
    // files, which are root's: they need the runtime as root.
    let hooks = cdi.as_ref().is_some_and(|e| e.has_hooks());
    let rootless = c.rootless && identity.uid != 0 && !hooks;
    if opener.unprivileged && !rootless {
        let why = match hooks {
            true => "its GPUs' CDI hooks need the runtime as root",
            false => "its OCI runtime cannot run rootless there",
        };
        return Err(format!(
            "the agent on node {} is not root, and {why}",
            hostname()
        ));
    }
    if hooks && c.rootless {
        tracing::info!("the GPUs' CDI spec has hooks: the runtime runs as root for this task");
    }
    use super::container_mounts::Lower;
    // --container-save: the step's tasks on this node share a root of its
    // own (a named container of the step's), which its first task saves.
    let name = c.spec.name.clone().or_else(|| {
        let step = spec.key.step.unwrap_or(0);
        c.spec
            .save
            .as_ref()
            .map(|_| format!(".save-{}-{step}", spec.key.attempt))
    });
    let (image, lower) = match &name {
        // A named container: the job's own root on this node, shared.
        Some(name) => {
            let root = super::named::root_beside(&c.cache);
            let owner = (identity.uid, identity.gid);
            let image =
                super::named::open(&root, spec.key.job, name, &c.spec.image, owner, || {
                    resolve_image(dir, spec, c, &opener)
                })?;
            let lower = Lower::Bind(image.rootfs.clone());
            (image, lower)
        }
        None => {
            let image = resolve_image(dir, spec, c, &opener)?;
            let lower = image_lower(&image, &opener)?;
            (image, lower)
        }
    };
    let workdir = spec.workdir.to_string_lossy().into_owned();
    let binds = binds(c, &opener, &workdir, script)?;
    // A rootless runtime reads the bundle and mounts the staged binds as
    // the user: the directories on the way are searchable (not readable),
    // the config is the user's; its state is the user's own.
    let bundle = dir.join("bundle");
    let scratch = bundle.join("scratch");
    let rootfs = bundle.join("rootfs");
    let state = state_dir(dir);
    for (d, mode) in [
        (&bundle, 0o711),
        (&scratch, 0o711),
        (&rootfs, 0o755),
        (&state, 0o700),
    ] {
        fs::DirBuilder::new()
            .recursive(true)
            .mode(mode)
            .create(d)
            .and_then(|()| fs::set_permissions(d, fs::Permissions::from_mode(mode)))
            .map_err(|e| format!("cannot create {}: {e}", d.display()))?;
    }
    let give = |p: &Path| match rootless {
        true => std::os::unix::fs::chown(p, Some(identity.uid), Some(identity.gid))
            .map_err(|e| format!("cannot give {} to user {}: {e}", p.display(), identity.name)),
        false => Ok(()),
    };
    give(&state)?;
    // Where each bind's source is for the runtime: staged in the scratch
    // tmpfs, or (an unprivileged shim's) the path itself.
    let staged: Vec<(String, String, bool)> = binds
        .iter()
        .enumerate()
        .map(|(i, b)| {
            let source = match b.tree {
                Some(_) => scratch.join("binds").join(i.to_string()),
                None => PathBuf::from(&b.source),
            };
            (
                source.to_string_lossy().into_owned(),
                b.destination.clone(),
                b.read_only,
            )
        })
        .collect();
    let devices = match cdi {
        Some(_) => Vec::new(),
        None => gpu_devices(&c.gpus, driver, Path::new("/dev")),
    };
    let argv = entry_argv(&image, identity, argv, c.spec.entrypoint);
    let process = Process {
        argv: &argv,
        read_only: c.spec.read_only,
        env: {
            let mut env = container_env(&image.env, &spec.env, &identity.name, &c.spec.env);
            super::bundle::nvidia_visible(&mut env);
            env
        },
        cwd: c.spec.workdir.as_deref().unwrap_or(&workdir),
        identity,
        rootless,
        remap_root: c.spec.remap_root,
    };
    let crun = is_crun(&c.runtime);
    let mut config = oci_config(
        &process,
        &rootfs,
        &staged,
        &devices,
        cgroup.as_deref().filter(|_| !crun),
    );
    if let Some(edits) = &cdi {
        edits.apply(&mut config)?;
    }
    let config_file = bundle.join("config.json");
    let text = serde_json::to_vec_pretty(&config).map_err(|e| e.to_string())?;
    super::task::write_atomic(&config_file, &text, super::task::Durability::Crash)
        .map_err(|e| format!("cannot write {}: {e}", config_file.display()))?;
    give(&config_file)?;
    let staged_kinds: Vec<(String, bool)> = staged
        .iter()
        .zip(&binds)
        .map(|((source, _, _), b)| (source.clone(), b.dir))
        .collect();
    let points = super::bundle::mount_points(&config, &staged_kinds);
    let mounts = super::container_mounts::ChildMounts::new(
        &scratch,
        &rootfs,
        lower,
        binds
            .into_iter()
            .filter_map(|b| Some((b.tree?, b.dir)))
            .collect(),
        &points,
        opener.unprivileged.then_some((identity.uid, identity.gid)),
    )?;
    let pid_file = state.join("container.pid");
    let log_file = state.join("runtime.log");
    let show = |p: &Path| p.to_string_lossy().into_owned();
    let mut runtime_argv = vec![
        show(&c.runtime),
        "--root".into(),
        show(&state),
        "--log".into(),
        show(&log_file),
    ];
    if crun {
        runtime_argv.push("--cgroup-manager=disabled".into());
    }
    runtime_argv.extend([
        "run".into(),
        "--detach".into(),
        "--pid-file".into(),
        show(&pid_file),
        "--bundle".into(),
        show(&bundle),
        format!("gpuq-{}", spec.key),
    ]);
    Ok(Launch {
        argv: runtime_argv,
        pid_file,
        log_file,
        mounts: Some(mounts),
        as_user: rootless,
        save: c
            .spec
            .save
            .as_ref()
            .filter(|_| spec.local_rank == 0)
            .map(|to| (image.rootfs.clone(), PathBuf::from(to))),
        _lease: image.lease,
    })
}

/// What the overlay has below: the image's tree, opened as the user where
/// it is theirs (a root shim), or its path (an unprivileged one).
fn image_lower(
    image: &super::image_files::Resolved,
    opener: &Opener<'_>,
) -> Result<super::container_mounts::Lower, String> {
    use super::container_mounts::{clone_tree, Lower};
    Ok(match opener.unprivileged {
        true => Lower::Path(image.rootfs.clone()),
        false => Lower::Tree(
            opener
                .reach(&image.rootfs, image.users)
                .and_then(|f| clone_tree(&f.into(), false))
                .map_err(|e| format!("cannot open the image {}: {e}", image.rootfs.display()))?,
        ),
    })
}

/// How the shim opens what a task's container is made from: as the user
/// (a root shim switches its file system identity), and, for a bind, a
/// detached tree of it (a root shim) or nothing (an unprivileged one: the
/// runtime binds the path, as the user it is).
struct Opener<'a> {
    identity: &'a Identity,
    unprivileged: bool,
}

impl Opener<'_> {
    /// `p` opened for reading as the user.
    fn open(&self, p: &Path) -> io::Result<File> {
        as_user(self.identity, || File::open(p)).unwrap_or_else(|e| Err(io::Error::other(e)))
    }

    /// What a mount is made from: the user must reach it (every directory
    /// on the way searched as the user), not read it: inside, its own
    /// permissions still hold.
    fn reach(&self, p: &Path, as_the_user: bool) -> io::Result<File> {
        let open = || {
            fs::OpenOptions::new()
                .read(true)
                .custom_flags(libc::O_PATH | libc::O_CLOEXEC)
                .open(p)
        };
        match as_the_user {
            true => as_user(self.identity, open).unwrap_or_else(|e| Err(io::Error::other(e))),
            false => open(),
        }
    }

    /// A bind of `source` to `destination`.
    fn bind(
        &self,
        source: &str,
        destination: &str,
        read_only: bool,
        as_the_user: bool,
    ) -> io::Result<Bind> {
        let file = self.reach(Path::new(source), as_the_user)?;
        let dir = file.metadata()?.is_dir();
        let tree = match self.unprivileged {
            true => None,
            false => Some(super::container_mounts::clone_tree(&file.into(), dir)?),
        };
        Ok(Bind {
            tree,
            source: source.to_string(),
            dir,
            destination: destination.to_string(),
            read_only,
        })
    }
}

/// The task's image, resolved (unpacked once per node into the cache): a
/// registry image is pulled with the user's credentials, where they have
/// some, over the node's, and the merged file is gone once pulled.
fn resolve_image(
    dir: &Path,
    spec: &TaskSpec,
    c: &TaskContainer,
    opener: &Opener<'_>,
) -> Result<super::image_files::Resolved, String> {
    let identity = opener.identity;
    let cache = super::image_cache::Cache {
        dir: c.cache.clone(),
        max_bytes: c.cache_max_mb.saturating_mul(1 << 20),
    };
    let open = |p: &Path| opener.open(p);
    let pull = match c.spec.image.strip_prefix(crate::model::REGISTRY_SCHEME) {
        Some(reference) => {
            let home = nix::unistd::User::from_uid(identity.uid.into())
                .ok()
                .flatten()
                .map(|u| u.dir);
            let files = super::image_auth::user_auth_files(&spec.env, home.as_deref());
            let registry = super::image_tools::registry_of(reference);
            // A helper the user's file names runs as the user, in their home.
            let home_dir = home.unwrap_or_else(|| PathBuf::from("/"));
            let helper = |name: &str| {
                let who = (identity.uid, identity.gid);
                super::image_auth::run_helper(name, registry, &spec.env, &home_dir, who)
            };
            let to = dir.join(AUTH_FILE);
            c.pull
                .with_user_auth(&files, &open, registry, &helper, &to)?
        }
        None => c.pull.clone(),
    };
    let resolved = super::image::resolve(Path::new(&c.spec.image), &cache, &pull, &open);
    if pull.auth_file.as_deref() == Some(dir.join(AUTH_FILE).as_path()) {
        let _ = fs::remove_file(dir.join(AUTH_FILE));
    }
    let image = resolved?;
    if image.unpacked {
        tracing::info!(image = %c.spec.image, "image unpacked for this task");
    }
    Ok(image)
}

/// What the container binds, in mount order: the user's home directory
/// (unless `--no-container-mount-home`; skipped where out of reach), the
/// working directory, the job's script (root's, read-only), and each of
/// `--container-mounts`; opened as the user.
fn binds(
    c: &TaskContainer,
    opener: &Opener<'_>,
    workdir: &str,
    script: Option<&Path>,
) -> Result<Vec<Bind>, String> {
    let identity = opener.identity;
    let mut binds: Vec<Bind> = Vec::new();
    if !c.spec.no_mount_home {
        let home = nix::unistd::User::from_uid(identity.uid.into())
            .ok()
            .flatten()
            .map(|u| u.dir);
        if let Some(home) = home.filter(|h| h != Path::new("/")) {
            let home = home.to_string_lossy();
            match opener.bind(&home, &home, false, true) {
                Ok(b) => binds.push(b),
                Err(e) => tracing::info!(%home, "home not mounted: {e}"),
            }
        }
    }
    if workdir != "/" {
        let b = opener.bind(workdir, workdir, false, true).map_err(|e| {
            format!(
                "cannot use working directory {workdir} as user {}: {e}",
                identity.name
            )
        })?;
        binds.push(b);
    }
    if let Some(script) = script {
        let script = script.to_string_lossy();
        let b = opener
            .bind(&script, &script, true, false)
            .map_err(|e| format!("cannot open the job script {script}: {e}"))?;
        binds.push(b);
    }
    for m in &c.spec.mounts {
        let b = opener
            .bind(&m.source, &m.destination, m.read_only, true)
            .map_err(|e| {
                format!(
                    "--container-mounts source {} is out of reach of user {} on node {}: {e}",
                    m.source,
                    identity.name,
                    hostname()
                )
            })?;
        binds.push(b);
    }
    Ok(binds)
}

/// The task's command line, started through the image's own exec action
/// where it is an apptainer image (`image_sif`: that sources the image's
/// environment scripts first), and with `--container-entrypoint` through
/// the image's `Entrypoint` (an apptainer image's run action, which runs
/// its runscript with the arguments).
fn entry_argv(
    image: &super::image_files::Resolved,
    identity: &Identity,
    argv: &[String],
    entrypoint: bool,
) -> Vec<String> {
    let is_file = |p: &Path| fs::symlink_metadata(p).is_ok_and(|m| m.is_file());
    let has = |action: &str| {
        let path = image.rootfs.join(action.trim_start_matches('/'));
        match image.users {
            true => as_user(identity, || is_file(&path)).unwrap_or(false),
            false => is_file(&path),
        }
    };
    let first: Vec<String> = if entrypoint && has(SIF_RUN) {
        vec![SIF_RUN.to_string()]
    } else if has(SIF_EXEC) {
        vec![SIF_EXEC.to_string()]
    } else if entrypoint {
        image.entrypoint.clone()
    } else {
        Vec::new()
    };
    first.into_iter().chain(argv.iter().cloned()).collect()
}

impl Launch {
    /// After the child exec'd the runtime (`runtime` is its pid): waits for
    /// it to start the container and exit, and returns the container's
    /// process once it is this shim's child (reparented to the subreaper).
    pub(super) fn await_runtime(&self, runtime: Pid) -> Result<Pid, String> {
        use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
        let name = self.argv[0].clone();
        let deadline = std::time::Instant::now() + START_LIMIT;
        let status = loop {
            match waitpid(runtime, Some(WaitPidFlag::WNOHANG)) {
                Ok(WaitStatus::StillAlive) if std::time::Instant::now() < deadline => {
                    std::thread::sleep(std::time::Duration::from_millis(5));
                }
                Ok(WaitStatus::StillAlive) => {
                    let _ = nix::sys::signal::kill(runtime, nix::sys::signal::Signal::SIGKILL);
                    let _ = waitpid(runtime, None);
                    return Err(format!(
                        "the OCI runtime {name} did not start the container within {} s",
                        START_LIMIT.as_secs()
                    ));
                }
                Ok(status) => break status,
                Err(e) => return Err(format!("cannot wait for the OCI runtime {name}: {e}")),
            }
        };
        if status != WaitStatus::Exited(runtime, 0) {
            // The user's own file where the runtime is rootless: its end.
            let said = super::task::read_untrusted(&self.log_file, 1 << 20).unwrap_or_default();
            let last = said.lines().rev().find(|l| !l.trim().is_empty());
            let how = match status {
                WaitStatus::Exited(_, code) => format!("exited with code {code}"),
                WaitStatus::Signaled(_, sig, _) => format!("was killed by {sig}"),
                other => format!("ended ({other:?})"),
            };
            return Err(format!(
                "the OCI runtime {name} could not start the container: {}",
                last.map_or(format!("it {how} and said nothing"), |l| l
                    .trim()
                    .to_string())
            ));
        }
        let pid: i32 = super::task::read_untrusted(&self.pid_file, 64)
            .ok()
            .and_then(|t| t.trim().parse().ok())
            .ok_or_else(|| format!("the OCI runtime {name} wrote no pid file"))?;
        // The runtime's helper may let go of it a moment after it exits.
        let me = std::process::id().to_string();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        loop {
            let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok();
            let parent = stat.as_deref().and_then(|s| {
                let after = &s[s.rfind(')')? + 1..];
                after.split_whitespace().nth(1).map(str::to_string)
            });
            match parent {
                Some(p) if p == me => return Ok(Pid::from_raw(pid)),
                None => return Err("the container's process ended as it started".into()),
                Some(_) if std::time::Instant::now() > deadline => {
                    return Err("the container's process was never handed to the shim".into())
                }
                Some(_) => std::thread::sleep(std::time::Duration::from_millis(2)),
            }
        }
    }
}
