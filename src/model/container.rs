//! A job's container: the image its tasks run in and what of the host is
//! mounted into it (`--container-image`, `--container-mounts`, ... as
//! Pyxis names them). `spec::container` reads and checks the flags; the
//! agent's `exec::container` runs the tasks in it. Paths are the nodes'
//! paths, absolute: a node resolves them, not the submitting host.

use serde::{Deserialize, Serialize};

/// The node feature an agent adds when it finds an OCI runtime; a job with
/// a container image asks for it, so it goes only where it can run.
pub const OCI_FEATURE: &str = "oci";

/// `--container-image` and its companions.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ContainerSpec {
    /// Absolute path on the nodes of an OCI image layout directory
    /// (`index.json` and `blobs/`) or of a root filesystem directory.
    pub image: String,
    /// Host paths bound into the container (`--container-mounts`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mounts: Vec<ContainerMount>,
    /// The working directory inside the container (`--container-workdir`);
    /// `None`: the job's own working directory, which is mounted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workdir: Option<String>,
    /// `--no-container-mount-home`: the user's home directory stays out.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub no_mount_home: bool,
}

/// One `SRC:DST[:ro]` of `--container-mounts`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ContainerMount {
    /// Absolute path on the node.
    pub source: String,
    /// Absolute path inside the container.
    pub destination: String,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub read_only: bool,
}
