//! What a node offers for containers, found once at the agent's start and
//! handed to each container task (`ContainerHost::complete`): its OCI runtime
//! (the configured one, else crun, else runc), whether that runtime runs as
//! the job's user (rootless: crun, where the kernel lets users make user
//! namespaces), its image cache, CDI spec directories and pull settings.

use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use super::image_tools::find_tool;
use super::task::{hostname, Pull, TaskContainer};

/// What a node has for containers, from the agent's config.
#[derive(Clone, Debug, Default)]
pub struct ContainerHost {
    /// `[agent.containers] runtime`: a name or a path; `None`: crun, runc.
    pub runtime: Option<String>,
    /// The image cache.
    pub cache: PathBuf,
    /// Its cap in MiB; 0: none.
    pub cache_max_mb: u64,
    /// Whether the GPUs are real (their device nodes exist).
    pub real_gpus: bool,
    /// `[agent.containers] cdi_spec_dirs`.
    pub cdi_dirs: Vec<PathBuf>,
    /// How registry images are pulled here.
    pub pull: Pull,
    /// Whether the runtime runs as the job's user (`rootless`, where the
    /// kernel allows it, and the runtime is crun: `rootless_here`).
    pub rootless: bool,
    /// `[agent.containers] rootless` as set.
    pub rootless_setting: bool,
}

impl ContainerHost {
    /// The node's settings: config, data dir and GPU source.
    pub fn new(
        cfg: &crate::config::Containers,
        data_dir: &Path,
        gpus: &crate::config::GpuConfig,
    ) -> ContainerHost {
        use crate::config::GpuConfig;
        ContainerHost {
            runtime: cfg.runtime.clone(),
            cache: data_dir.join("images"),
            cache_max_mb: cfg.cache_max_mb,
            real_gpus: matches!(gpus, GpuConfig::Auto | GpuConfig::Nvml),
            cdi_dirs: cfg.cdi_spec_dirs.clone(),
            pull: Pull::new(cfg, &std::env::var("PATH").unwrap_or_default()),
            rootless: cfg.rootless && user_namespaces(Path::new("/proc/sys")).is_ok(),
            rootless_setting: cfg.rootless,
        }
    }

    /// Where the jobs' named containers are (`named`).
    pub fn named_root(&self) -> PathBuf {
        super::named::root_beside(&self.cache)
    }

    /// Fills in what this node has; an error fails the task's launch.
    pub fn complete(&self, c: &mut TaskContainer, as_root: bool) -> Result<(), String> {
        let path = std::env::var("PATH").unwrap_or_default();
        c.runtime = find_runtime(self.runtime.as_deref(), &path)?;
        c.rootless = self.rootless && is_crun(&c.runtime);
        // An agent that is not root (gpuq dev run by a user) runs its
        // user's containers rootless, or not at all.
        if !as_root && !c.rootless {
            let why = match self.rootless_setting {
                false => "[agent.containers] rootless is false".to_string(),
                true => rootless_here(&c.runtime).err().unwrap_or_default(),
            };
            return Err(format!(
                "the job asks for container image {}, and the agent on node {} is not root and \
                 cannot run its runtime rootless: {why}",
                c.spec.image,
                hostname()
            ));
        }
        c.cache = self.cache.clone();
        c.cache_max_mb = self.cache_max_mb;
        c.cdi_dirs = self.cdi_dirs.clone();
        c.pull = self.pull.clone();
        if !self.real_gpus {
            c.gpus.clear();
        }
        Ok(())
    }
}

/// Whether `runtime` runs as the job's user here (`rootless` asked for it):
/// it must be crun (runc's rootless mode maps the container's root to the
/// user, so the job would see itself as root), and users must be allowed
/// user namespaces. The error says why not.
pub fn rootless_here(runtime: &Path) -> Result<(), String> {
    if !is_crun(runtime) {
        return Err(format!(
            "the OCI runtime {} runs as root: only crun runs a container as its user with \
             that user's own uid inside (runc maps the container's root to the user)",
            runtime.display()
        ));
    }
    user_namespaces(Path::new("/proc/sys"))
}

/// Whether users may make user namespaces here, as a rootless runtime
/// does (`sys` is `/proc/sys`): the error says which setting stops them.
pub fn user_namespaces(sys: &Path) -> Result<(), String> {
    let read = |name: &str| -> Option<i64> {
        fs::read_to_string(sys.join(name)).ok()?.trim().parse().ok()
    };
    let why = match (
        read("user/max_user_namespaces"),
        read("kernel/unprivileged_userns_clone"),
        read("kernel/apparmor_restrict_unprivileged_userns"),
    ) {
        (None, _, _) => "the kernel has no user namespaces (no user.max_user_namespaces)",
        (Some(0), _, _) => "user.max_user_namespaces is 0",
        (_, Some(0), _) => "kernel.unprivileged_userns_clone is 0",
        (_, _, Some(n)) if n != 0 => "kernel.apparmor_restrict_unprivileged_userns is 1",
        _ => return Ok(()),
    };
    Err(format!(
        "{why}: the OCI runtime runs as root on node {} (set the sysctl to let users make \
         user namespaces, or rootless = false in [agent.containers] to say so)",
        hostname()
    ))
}

/// The OCI runtime: the configured one, or crun, or runc, in `path` (then
/// the usual directories).
pub fn find_runtime(configured: Option<&str>, path: &str) -> Result<PathBuf, String> {
    let find = |name: &str| find_tool(name, path);
    match configured {
        Some(name) => find(name).ok_or_else(|| {
            format!(
                "the OCI runtime {name} set in [agent.containers] runtime is not an executable \
                 on node {}; install it or fix the setting",
                hostname()
            )
        }),
        None => find("crun").or_else(|| find("runc")).ok_or_else(|| {
            format!(
                "node {} has no OCI runtime for --container-image: install crun (or runc), or \
                 name one in [agent.containers] runtime",
                hostname()
            )
        }),
    }
}

/// Whether `runtime` is crun (its `--cgroup-manager=disabled` keeps the
/// container in the task's cgroup); anything else is driven as runc.
pub(super) fn is_crun(runtime: &Path) -> bool {
    runtime
        .file_name()
        .is_some_and(|n| n.as_bytes().starts_with(b"crun"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rootless_needs_user_namespaces_for_users_and_says_which_setting_stops_it() {
        let sys = tempfile::tempdir().unwrap();
        let set = |name: &str, value: &str| {
            let p = sys.path().join(name);
            fs::create_dir_all(p.parent().unwrap()).unwrap();
            fs::write(p, format!("{value}\n")).unwrap();
        };
        let err = user_namespaces(sys.path()).unwrap_err();
        assert!(err.contains("no user namespaces"), "{err}");
        set("user/max_user_namespaces", "0");
        let err = user_namespaces(sys.path()).unwrap_err();
        assert!(err.contains("user.max_user_namespaces is 0"), "{err}");
        set("user/max_user_namespaces", "63000");
        assert!(user_namespaces(sys.path()).is_ok());
        // Debian's and Ubuntu's own switches.
        set("kernel/unprivileged_userns_clone", "0");
        let err = user_namespaces(sys.path()).unwrap_err();
        assert!(err.contains("unprivileged_userns_clone is 0"), "{err}");
        set("kernel/unprivileged_userns_clone", "1");
        set("kernel/apparmor_restrict_unprivileged_userns", "1");
        let err = user_namespaces(sys.path()).unwrap_err();
        assert!(
            err.contains("apparmor_restrict_unprivileged_userns"),
            "{err}"
        );
        assert!(err.contains("rootless = false"), "{err}");
        set("kernel/apparmor_restrict_unprivileged_userns", "0");
        assert!(user_namespaces(sys.path()).is_ok());
        // runc is never rootless here, whatever the kernel allows.
        let err = rootless_here(Path::new("/usr/sbin/runc")).unwrap_err();
        assert!(err.contains("only crun"), "{err}");
    }

    #[test]
    fn the_runtime_is_the_configured_one_or_crun_then_runc() {
        let dir = tempfile::tempdir().unwrap();
        let bin = dir.path();
        let make = |name: &str| {
            use std::os::unix::fs::PermissionsExt;
            let p = bin.join(name);
            fs::write(&p, "#!/bin/sh\n").unwrap();
            fs::set_permissions(&p, fs::Permissions::from_mode(0o755)).unwrap();
            p
        };
        let path = bin.to_str().unwrap();
        let runc = make("runc");
        let crun = make("crun");
        // The given PATH comes before the usual directories, crun before runc.
        assert_eq!(find_runtime(None, path).unwrap(), crun);
        assert_eq!(find_runtime(Some("runc"), path).unwrap(), runc);
        assert_eq!(
            find_runtime(Some(runc.to_str().unwrap()), "").unwrap(),
            runc
        );
        let err = find_runtime(Some("/nowhere/youki"), path).unwrap_err();
        assert!(err.contains("[agent.containers] runtime"), "{err}");
        assert!(is_crun(&crun) && !is_crun(&runc));
    }
}
