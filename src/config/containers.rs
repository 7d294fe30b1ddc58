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
        }
    }
}
