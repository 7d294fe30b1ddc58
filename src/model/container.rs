//! A job's container: the image its tasks run in and what of the host is
//! mounted into it (`--container-image`, `--container-mounts`, ... as
//! Pyxis names them). `spec::container` reads and checks the flags; the
//! agent's `exec::container` runs the tasks in it. Paths are the nodes'
//! paths, absolute: a node resolves them, not the submitting host.

use serde::{Deserialize, Serialize};

/// The node feature an agent adds when it finds an OCI runtime; a job with
/// a container image asks for it, so it goes only where it can run.
pub const OCI_FEATURE: &str = "oci";

/// The node feature an agent adds when it finds a pull tool (skopeo); a job
/// whose image is a registry reference (`docker://...`) asks for it.
pub const OCI_PULL_FEATURE: &str = "oci-pull";

/// The node feature an agent adds when it finds CDI spec files: its
/// containers get their GPUs' driver files, not device nodes only.
pub const OCI_CDI_FEATURE: &str = "oci-cdi";

/// The node feature an agent adds when its runtime runs as the job's user
/// in a user namespace (`[agent.containers] rootless`, where the kernel
/// allows it), not as root.
pub const OCI_ROOTLESS_FEATURE: &str = "oci-rootless";

/// The words a runtime feature cannot be: the other `oci-` features.
const NOT_RUNTIMES: [&str; 3] = ["pull", "cdi", "rootless"];

/// The prefix of the feature naming a node's OCI runtime (`oci-crun`).
pub const RUNTIME_FEATURE_PREFIX: &str = "oci-";

/// The feature that names `runtime` (a path), e.g. `oci-crun`; `None` for a
/// name that is no plain word.
pub fn runtime_feature(runtime: &std::path::Path) -> Option<String> {
    let name = runtime.file_name()?.to_str()?;
    let plain = !name.is_empty()
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_');
    (plain && !NOT_RUNTIMES.contains(&name)).then(|| format!("{RUNTIME_FEATURE_PREFIX}{name}"))
}

/// What a node offers for containers, from its features, as `gpuq nodes`
/// shows it: `crun`, `runc+pull`, `crun+rootless+cdi+pull`, or `-` for
/// none.
pub fn containers_summary(features: &[String]) -> String {
    if !features.iter().any(|f| f == OCI_FEATURE) {
        return "-".into();
    }
    let has = |name: &str| features.iter().any(|f| f == name);
    let mut summary = features
        .iter()
        .filter_map(|f| f.strip_prefix(RUNTIME_FEATURE_PREFIX))
        .find(|name| !NOT_RUNTIMES.contains(name))
        .unwrap_or("oci")
        .to_string();
    let words = [
        (OCI_ROOTLESS_FEATURE, "+rootless"),
        (OCI_CDI_FEATURE, "+cdi"),
        (OCI_PULL_FEATURE, "+pull"),
    ];
    for (feature, word) in words {
        if has(feature) {
            summary.push_str(word);
        }
    }
    summary
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_nodes_runtime_and_pull_tool_are_features_and_summed_up() {
        let f = |p: &str| runtime_feature(std::path::Path::new(p));
        assert_eq!(f("/usr/bin/crun").as_deref(), Some("oci-crun"));
        assert_eq!(f("runc").as_deref(), Some("oci-runc"));
        assert_eq!(f("/opt/My Runtime"), None);
        let s =
            |fs: &[&str]| containers_summary(&fs.iter().map(|f| f.to_string()).collect::<Vec<_>>());
        assert_eq!(s(&["ib", "oci", "oci-crun"]), "crun");
        assert_eq!(s(&["oci-runc", "oci-pull", "oci"]), "runc+pull");
        assert_eq!(s(&["oci"]), "oci");
        assert_eq!(
            s(&["oci-pull", "oci-cdi", "oci", "oci-crun"]),
            "crun+cdi+pull"
        );
        assert_eq!(s(&["oci-cdi", "oci", "oci-crun"]), "crun+cdi");
        assert_eq!(f("/x/cdi"), None);
        assert_eq!(f("/x/rootless"), None);
        assert_eq!(
            s(&["oci-pull", "oci-rootless", "oci", "oci-crun", "oci-cdi"]),
            "crun+rootless+cdi+pull"
        );
        assert_eq!(s(&["ib"]), "-");
    }
}

/// The scheme of a registry reference `--container-image` takes.
pub const REGISTRY_SCHEME: &str = "docker://";

/// `--container-image` and its companions.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ContainerSpec {
    /// Absolute path on the nodes of an OCI image layout directory
    /// (`index.json` and `blobs/`), a root filesystem directory, an OCI or
    /// docker archive (`.tar`) or a squashfs file; or a registry reference
    /// `docker://...` the nodes pull.
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
    /// `--container-env`: variables of the job's environment that override
    /// the image's `Env` (by default the image's value wins, as in Pyxis).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub env: Vec<String>,
    /// `--container-readonly`: the root filesystem is read-only. By default
    /// it is writable (a per-task layer over the shared image, thrown away
    /// with the task), as Pyxis's documented enroot setup has it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub read_only: bool,
    /// `--container-remap-root`: the user is uid 0 inside (a user namespace
    /// maps the user's uid and gid to 0 there; no privilege on the node).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub remap_root: bool,
    /// `--container-entrypoint`: the command runs through the image's
    /// `Entrypoint` (skipped by default, as Pyxis does).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub entrypoint: bool,
    /// `--container-name`: a container of the job's, per node, whose root
    /// filesystem the job's tasks share and keep from step to step (made
    /// from `image` by the first task that names it; `image` may then be
    /// empty).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// `--container-save PATH`: the container's root filesystem, as the
    /// step left it on each node, saved there as a squashfs file (an
    /// absolute path on the nodes, written as the user) once the node's
    /// first task of the step completes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub save: Option<String>,
}

impl ContainerSpec {
    /// Whether the image is a registry reference the node must pull.
    pub fn is_registry(&self) -> bool {
        self.image.starts_with(REGISTRY_SCHEME)
    }
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
