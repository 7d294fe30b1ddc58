//! The agent's `[agent.containers]` table: how this node runs the tasks of
//! jobs with `--container-image`. Running them is `agent::exec::container`'s
//! job.

use serde::{Deserialize, Serialize};

/// `[agent.containers]`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Containers {
    /// The OCI runtime: a name looked up in PATH or an absolute path.
    /// `None`: crun, else runc, from PATH.
    pub runtime: Option<String>,
}
