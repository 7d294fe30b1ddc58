//! The agent's `[agent.containers]` table: how this node runs the tasks of
//! jobs with `--container-image`. Running them is `agent::exec::container`'s
//! job.

use serde::{Deserialize, Serialize};

/// `[agent.containers]`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Containers {
    /// The OCI runtime: a name looked up in PATH or an absolute path.
    /// `None`: crun, else runc, from PATH.
    pub runtime: Option<String>,
    /// How many MiB the node's cache of unpacked images (`data_dir/images`)
    /// may take; past it, the least recently used images no task runs in
    /// are removed after each unpack. 0: no cap.
    pub cache_max_mb: u64,
    /// Where CDI spec files are (`*.json`, `*.yaml`): a task's GPUs get
    /// their `containerEdits` (device nodes, driver mounts, environment,
    /// hooks); with none, only their device nodes.
    pub cdi_spec_dirs: Vec<std::path::PathBuf>,
    /// The tool that pulls `docker://` images: a name looked up in PATH or
    /// an absolute path; "" for none (registry images are then refused at
    /// submit where no node can pull). Default: skopeo.
    pub pull_tool: String,
    /// Registries (`HOST` or `HOST:PORT`, as in an image reference) pulled
    /// from over plain HTTP or TLS that is not verified, as podman's
    /// `insecure = true`: a registry on a private network without a
    /// certificate the nodes trust.
    pub insecure_registries: Vec<String>,
    /// The credentials for pulls: a file as `podman login` or `docker
    /// login` writes it (`{"auths": {"HOST": {"auth": base64(user:pass)}}}`),
    /// readable by root only. Default: the pull tool's own (root's).
    pub registry_auth_file: Option<std::path::PathBuf>,
    /// Whether the runtime runs as the job's user, in a user namespace
    /// that maps only that user's uid and gid, where the kernel lets users
    /// make one (else as root, with a warning at the agent's start).
    /// Default: true. Root's own tasks always run it as root.
    pub rootless: bool,
}

/// The pull tool when the config names none.
pub const DEFAULT_PULL_TOOL: &str = "skopeo";

impl Containers {
    /// Checks what the types cannot: each insecure registry is a bare
    /// `HOST` or `HOST:PORT`.
    pub(super) fn validate(&self) -> Result<(), super::ConfigError> {
        // Engines that drive a runtime themselves, named where the runtime
        // goes: gpuq drives crun or runc (or another runc-compatible one).
        if let Some(runtime) = &self.runtime {
            let name = std::path::Path::new(runtime)
                .file_name()
                .map_or(String::new(), |n| n.to_string_lossy().into_owned());
            if ["podman", "docker", "apptainer", "singularity", "enroot"].contains(&name.as_str()) {
                return Err(super::ConfigError::Invalid {
                    key: "agent.containers.runtime".into(),
                    problem: format!(
                        "{runtime:?} is a container engine, not an OCI runtime: name the OCI \
                         runtime it runs (crun or runc; podman's is crun), or leave the key out \
                         to find one; apptainer's .sif images and enroot's .sqsh files run \
                         under crun as they are"
                    ),
                });
            }
        }
        for (i, r) in self.insecure_registries.iter().enumerate() {
            let host = r.rsplit_once(':').map_or(r.as_str(), |(h, port)| {
                if port.parse::<u16>().is_ok() {
                    h
                } else {
                    ""
                }
            });
            let ok = !host.is_empty()
                && host
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | '_'));
            if !ok {
                return Err(super::ConfigError::Invalid {
                    key: format!("agent.containers.insecure_registries[{i}]"),
                    problem: format!(
                        "{r:?} is not a registry as an image reference names it: give HOST or \
                         HOST:PORT, e.g. \"registry.lan:5000\", with no scheme or path"
                    ),
                });
            }
        }
        if let Some(f) = &self.registry_auth_file {
            super::checks::check_path("agent.containers.registry_auth_file", f)?;
        }
        Ok(())
    }
}

/// The CDI spec directories when the config names none (the CDI spec's).
pub fn default_cdi_spec_dirs() -> Vec<std::path::PathBuf> {
    vec!["/etc/cdi".into(), "/var/run/cdi".into()]
}

/// The cache's cap when the config names none: 100 GiB.
pub const DEFAULT_CACHE_MAX_MB: u64 = 100 * 1024;

impl Default for Containers {
    fn default() -> Containers {
        Containers {
            runtime: None,
            cache_max_mb: DEFAULT_CACHE_MAX_MB,
            cdi_spec_dirs: default_cdi_spec_dirs(),
            pull_tool: DEFAULT_PULL_TOOL.to_string(),
            insecure_registries: Vec::new(),
            registry_auth_file: None,
            rootless: true,
        }
    }
}
