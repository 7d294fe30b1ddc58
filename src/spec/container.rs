//! The container flags, named as Pyxis names them so existing scripts work:
//! `--container-image PATH|docker://REF`, `--container-mounts
//! SRC:DST[:ro],...`, `--container-workdir DIR`, `--no-container-mount-home`,
//! `--container-env VAR,...`, `--container-writable` and
//! `--container-readonly`, `--container-remap-root`, `--container-entrypoint`
//! (and the `--no-` and `--container-mount-home` spellings of the defaults). What can be refused here is: a relative path (the
//! nodes resolve it, not the submitting directory), a malformed mount or
//! variable name, a companion flag without an image. Whether the image
//! exists and is one, only a node can tell; it fails the job with the reason
//! (see `agent::exec::container`). A registry reference asks for a node with
//! a pull tool (the feature `oci-pull`); the server refuses it where no node
//! has one.
//!
//! The root filesystem is writable by default: Pyxis leaves it to enroot's
//! `ENROOT_ROOTFS_WRITABLE`, which Pyxis's setup guide sets to yes, and
//! scripts that `pip install` in their container rely on it. Each task writes
//! to a layer of its own, discarded when it ends; the shared image below is
//! never written. `--container-readonly` makes it read-only.

use crate::model::{ContainerMount, ContainerSpec, REGISTRY_SCHEME};

use super::{SpecError, SubmitArgs};

/// The mounts of `--container-mounts`, in the order given.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct Mounts(pub Vec<ContainerMount>);

/// The variable names of `--container-env`.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct EnvNames(pub Vec<String>);

/// Parses `--container-image`: an absolute path on the nodes, or a registry
/// reference. Pyxis's enroot forms (`REGISTRY#IMAGE[:TAG]`, `IMAGE:TAG`)
/// become `docker://` references.
pub fn parse_image(input: &str) -> Result<String, String> {
    if let Some(reference) = input.strip_prefix(REGISTRY_SCHEME) {
        return check_reference(input, reference);
    }
    if input.contains("://") {
        return Err(format!(
            "{input:?} names a transport gpuq cannot pull from; give docker://REGISTRY/IMAGE:TAG \
             or an absolute path on the nodes"
        ));
    }
    if !input.starts_with('/') && (input.contains('#') || input.contains(':')) {
        // enroot's URI: [USER@][REGISTRY#]IMAGE[:TAG].
        let plain = input.rsplit_once('@').map_or(input, |(_, rest)| rest);
        let reference = plain.replacen('#', "/", 1);
        return check_reference(input, &reference);
    }
    check_path(input, "image")
}

/// A registry reference as `docker://REF`, refused when it is no name.
fn check_reference(input: &str, reference: &str) -> Result<String, String> {
    let ok = !reference.is_empty()
        && !reference.starts_with('/')
        && reference
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"./:_-@".contains(&b));
    if !ok {
        return Err(format!(
            "{input:?} is not a registry reference; give docker://REGISTRY/IMAGE:TAG, e.g. \
             docker://docker.io/library/ubuntu:22.04"
        ));
    }
    Ok(format!("{REGISTRY_SCHEME}{reference}"))
}

/// Parses `--container-env`: variable names, comma-separated.
pub fn parse_env_names(input: &str) -> Result<EnvNames, String> {
    let mut names = Vec::new();
    for name in input.split(',') {
        let valid = !name.is_empty()
            && !name.starts_with(|c: char| c.is_ascii_digit())
            && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
        if !valid {
            return Err(format!(
                "{name:?} is not a variable name; give names of the job's environment, \
                 several separated by commas, e.g. --container-env PATH,LD_LIBRARY_PATH"
            ));
        }
        names.push(name.to_string());
    }
    Ok(EnvNames(names))
}

/// Parses `--container-name`: `NAME`, or Pyxis's `NAME:auto` and
/// `NAME:create` (the same here: made when missing, else used).
pub fn parse_name(input: &str) -> Result<String, String> {
    let (name, flag) = input.split_once(':').unwrap_or((input, "auto"));
    match flag {
        "auto" | "create" => {}
        "exec" | "no_exec" => {
            return Err(format!(
                "--container-name {input:?}: the :{flag} flag is not supported; give NAME (to \
                 run a command in a running task's container, use gpuq exec or srun --overlap)"
            ))
        }
        other => {
            return Err(format!(
                "--container-name {input:?}: {other:?} is not a flag; give NAME, NAME:auto or \
                 NAME:create"
            ))
        }
    }
    let valid = !name.is_empty()
        && name.len() <= 64
        && !name.starts_with('.')
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b));
    if !valid {
        return Err(format!(
            "--container-name {name:?} is not a name: give up to 64 letters, digits, '.', '_' \
             or '-', not starting with '.'"
        ));
    }
    Ok(name.to_string())
}

/// Parses `--container-save`: an absolute path on the nodes.
pub fn parse_save(input: &str) -> Result<String, String> {
    check_path(input, "save")
}

/// Parses `--container-workdir`: an absolute path inside the container.
pub fn parse_workdir(input: &str) -> Result<String, String> {
    check_path(input, "working directory")
}

/// Parses `--container-mounts`: `SRC[:DST][:ro|rw]`, comma-separated, both
/// paths absolute (a lone `SRC` is mounted at the same path).
pub fn parse_mounts(input: &str) -> Result<Mounts, String> {
    let mut mounts = Vec::new();
    for item in input.split(',') {
        let fields: Vec<&str> = item.split(':').collect();
        let (source, destination, flag) = match fields.as_slice() {
            [src] => (*src, *src, None),
            [src, "ro" | "rw"] => (*src, *src, Some(fields[1])),
            [src, dst] => (*src, *dst, None),
            [src, dst, flag] => (*src, *dst, Some(*flag)),
            _ => return Err(malformed(item, "it has more than three fields")),
        };
        let read_only = match flag {
            None | Some("rw") => false,
            Some("ro") => true,
            Some(other) => {
                return Err(malformed(
                    item,
                    &format!("{other:?} is not a mount option (use ro or rw)"),
                ))
            }
        };
        for (what, path) in [("source", source), ("destination", destination)] {
            check_path(path, what).map_err(|why| malformed(item, &why))?;
        }
        if destination.trim_end_matches('/').is_empty() {
            return Err(malformed(item, "it would cover the whole image (/)"));
        }
        mounts.push(ContainerMount {
            source: source.to_string(),
            destination: destination.to_string(),
            read_only,
        });
    }
    Ok(Mounts(mounts))
}

fn malformed(item: &str, why: &str) -> String {
    format!(
        "mount {item:?} is malformed: {why}; give SRC:DST[:ro] with absolute paths, \
         several separated by commas, e.g. /data:/data:ro,/scratch:/scratch"
    )
}

/// An absolute path without the bytes the nodes' tools cannot take.
fn check_path(input: &str, what: &str) -> Result<String, String> {
    if input.is_empty() {
        return Err(format!("the {what} path is empty; give an absolute path"));
    }
    if input.chars().any(char::is_control) {
        return Err(format!(
            "the {what} path {input:?} contains control characters"
        ));
    }
    if !input.starts_with('/') {
        return Err(format!(
            "the {what} path {input:?} is relative; give an absolute path (the nodes resolve \
             it, not this directory), e.g. $PWD/{input}"
        ));
    }
    Ok(input.to_string())
}

/// The spec's container from the merged flags: `None` without an image; a
/// companion flag without one is refused.
pub fn resolve(args: &SubmitArgs) -> Result<Option<ContainerSpec>, SpecError> {
    let image = match (&args.container_image, &args.container_name) {
        (Some(image), _) => Some(image.clone()),
        // A named container an earlier step made: its image is the node's.
        (None, Some(_)) => Some(String::new()),
        (None, None) => None,
    };
    let Some(image) = image else {
        let orphan = [
            ("--container-mounts", args.container_mounts.is_some()),
            ("--container-workdir", args.container_workdir.is_some()),
            ("--no-container-mount-home", args.no_container_mount_home),
            ("--container-mount-home", args.container_mount_home),
            ("--container-remap-root", args.container_remap_root),
            ("--no-container-remap-root", args.no_container_remap_root),
            ("--container-entrypoint", args.container_entrypoint),
            ("--no-container-entrypoint", args.no_container_entrypoint),
            ("--container-save", args.container_save.is_some()),
            ("--container-entrypoint-log", args.container_entrypoint_log),
            ("--container-env", args.container_env.is_some()),
            ("--container-writable", args.container_writable),
            ("--container-readonly", args.container_readonly),
        ]
        .into_iter()
        .find(|(_, set)| *set);
        return match orphan {
            Some((flag, _)) => Err(SpecError::Invalid(format!(
                "{flag} applies to a container, and no --container-image was given; add \
                 --container-image PATH or drop {flag}"
            ))),
            None => Ok(None),
        };
    };
    Ok(Some(ContainerSpec {
        image,
        mounts: args
            .container_mounts
            .clone()
            .map(|m| m.0)
            .unwrap_or_default(),
        workdir: args.container_workdir.clone(),
        no_mount_home: args.no_container_mount_home,
        env: args.container_env.clone().map(|e| e.0).unwrap_or_default(),
        read_only: args.container_readonly,
        remap_root: args.container_remap_root,
        entrypoint: args.container_entrypoint,
        name: args.container_name.clone(),
        save: args.container_save.clone(),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_image_is_an_absolute_path_or_a_registry_reference() {
        assert_eq!(parse_image("/shared/img").unwrap(), "/shared/img");
        for (given, reference) in [
            ("docker://ubuntu:22.04", "docker://ubuntu:22.04"),
            ("ubuntu:22.04", "docker://ubuntu:22.04"),
            (
                "nvcr.io#nvidia/pytorch:24.01-py3",
                "docker://nvcr.io/nvidia/pytorch:24.01-py3",
            ),
            (
                "me@nvcr.io#nvidia/cuda:12.4",
                "docker://nvcr.io/nvidia/cuda:12.4",
            ),
        ] {
            assert_eq!(parse_image(given).unwrap(), reference, "{given}");
        }
        for bad in ["oci://x", "docker://", "docker:///etc", "docker://a b"] {
            let err = parse_image(bad).unwrap_err();
            assert!(err.contains("docker://REGISTRY/IMAGE:TAG"), "{bad}: {err}");
        }
        let err = parse_image("img/rootfs").unwrap_err();
        assert!(err.contains("relative") && err.contains("$PWD"), "{err}");
        assert!(parse_image("").unwrap_err().contains("empty"));
    }

    #[test]
    fn container_env_takes_variable_names() {
        assert_eq!(
            parse_env_names("PATH,LD_LIBRARY_PATH,_X1").unwrap().0,
            ["PATH", "LD_LIBRARY_PATH", "_X1"]
        );
        for bad in ["A=1", "PATH,", "1X", "A B"] {
            let err = parse_env_names(bad).unwrap_err();
            assert!(err.contains("not a variable name"), "{bad}: {err}");
        }
    }

    #[test]
    fn mounts_are_src_dst_and_an_optional_ro() {
        let m = parse_mounts("/data:/in:ro,/scratch,/a:/b:rw,/c:ro")
            .unwrap()
            .0;
        let got: Vec<(&str, &str, bool)> = m
            .iter()
            .map(|m| (m.source.as_str(), m.destination.as_str(), m.read_only))
            .collect();
        assert_eq!(
            got,
            [
                ("/data", "/in", true),
                ("/scratch", "/scratch", false),
                ("/a", "/b", false),
                ("/c", "/c", true)
            ]
        );
        for bad in [
            "data:/in",
            "/data:in",
            "/a:/b:rx",
            "/a:/b:ro:x",
            "/data,",
            "/data:/",
        ] {
            let err = parse_mounts(bad).unwrap_err();
            assert!(
                err.contains("malformed") && err.contains("SRC:DST"),
                "{bad}: {err}"
            );
        }
    }

    #[test]
    fn companions_need_an_image() {
        let args = SubmitArgs {
            container_workdir: Some("/w".into()),
            ..Default::default()
        };
        let err = resolve(&args).unwrap_err().to_string();
        assert!(err.contains("--container-workdir") && err.contains("--container-image"));
        let args = SubmitArgs {
            container_image: Some("/img".into()),
            no_container_mount_home: true,
            ..Default::default()
        };
        let spec = resolve(&args).unwrap().unwrap();
        assert_eq!(spec.image, "/img");
        assert!(spec.no_mount_home && spec.mounts.is_empty() && spec.workdir.is_none());
        assert_eq!(resolve(&SubmitArgs::default()).unwrap(), None);
        // Pyxis's remap-root and entrypoint flags, and the spellings of the
        // defaults, take an image too.
        for flag in ["--container-remap-root", "--no-container-entrypoint"] {
            let args = SubmitArgs {
                container_remap_root: flag == "--container-remap-root",
                no_container_entrypoint: flag == "--no-container-entrypoint",
                ..Default::default()
            };
            let err = resolve(&args).unwrap_err().to_string();
            assert!(err.starts_with(flag), "{err}");
        }
        let args = SubmitArgs {
            container_image: Some("/img".into()),
            container_remap_root: true,
            container_entrypoint: true,
            container_mount_home: true,
            ..Default::default()
        };
        let spec = resolve(&args).unwrap().unwrap();
        assert!(spec.remap_root && spec.entrypoint && !spec.no_mount_home);
        // A script's #SBATCH line says one thing, the command line the other:
        // the command line wins.
        let script = SubmitArgs {
            container_remap_root: true,
            ..Default::default()
        };
        let cli = SubmitArgs {
            no_container_remap_root: true,
            ..Default::default()
        };
        let merged = script.overlay(&cli);
        assert!(!merged.container_remap_root && merged.no_container_remap_root);
        assert!(script.overlay(&SubmitArgs::default()).container_remap_root);
    }

    #[test]
    fn a_container_job_asks_for_a_node_with_a_runtime() {
        let args = SubmitArgs {
            container_image: Some("/img".into()),
            script_or_command: vec!["true".into()],
            ..Default::default()
        };
        let env = [("PATH".to_string(), "/bin".to_string())];
        let spec = crate::spec::build_spec(&args, &env, std::path::Path::new("/tmp")).unwrap();
        assert_eq!(spec.placement.features, [crate::model::OCI_FEATURE]);
        let bare = SubmitArgs {
            script_or_command: vec!["true".into()],
            ..Default::default()
        };
        let spec = crate::spec::build_spec(&bare, &env, std::path::Path::new("/tmp")).unwrap();
        assert!(spec.placement.features.is_empty());
        let pulled = SubmitArgs {
            container_image: Some("docker://ubuntu:22.04".into()),
            container_env: Some(EnvNames(vec!["LANG".into()])),
            container_readonly: true,
            script_or_command: vec!["true".into()],
            ..Default::default()
        };
        let spec = crate::spec::build_spec(&pulled, &env, std::path::Path::new("/tmp")).unwrap();
        assert_eq!(
            spec.placement.features,
            [crate::model::OCI_FEATURE, crate::model::OCI_PULL_FEATURE]
        );
        let c = spec.container.unwrap();
        assert!(c.read_only && c.env == ["LANG"], "{c:?}");
    }
}
