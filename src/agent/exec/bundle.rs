//! A container task's OCI bundle, `config.json`: what the container sees.
//! Only a mount namespace of its own, so the host's network (gangs
//! rendezvous as bare ones do), process ids and IPC (NCCL and CUDA IPC
//! between the ranks of a node work as bare); `/dev` of its own with the
//! task's GPUs' device nodes; the host's `/dev/shm` and `/sys`; the binds
//! `container` staged. Pure functions, tested without a runtime.

use std::fs;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

use serde_json::{json, Value};

use super::task::Identity;

/// The PATH a container gets when neither the job nor the image sets one.
const CONTAINER_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// A device node the container gets.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Device {
    pub path: String,
    pub major: u64,
    pub minor: u64,
    pub mode: u32,
}

/// The device nodes of NVIDIA GPUs `gpus` (by index: PCI bus order, as
/// NVML numbers them) and the driver's control nodes, as far as `dev` has
/// them; `driver` is `/proc/driver/nvidia/gpus`.
pub(super) fn gpu_devices(gpus: &[u32], driver: &Path, dev: &Path) -> Vec<Device> {
    if gpus.is_empty() {
        return Vec::new();
    }
    let mut buses: Vec<PathBuf> = fs::read_dir(driver)
        .map(|d| d.filter_map(|e| Some(e.ok()?.path())).collect())
        .unwrap_or_default();
    buses.sort();
    let minor_of = |bus: &Path| -> Option<u32> {
        let text = fs::read_to_string(bus.join("information")).ok()?;
        text.lines()
            .find_map(|l| l.strip_prefix("Device Minor:"))
            .and_then(|m| m.trim().parse().ok())
    };
    let mut names: Vec<String> = gpus
        .iter()
        .filter_map(|&i| buses.get(i as usize).and_then(|b| minor_of(b)))
        .map(|minor| format!("nvidia{minor}"))
        .collect();
    for control in [
        "nvidiactl",
        "nvidia-uvm",
        "nvidia-uvm-tools",
        "nvidia-modeset",
    ] {
        names.push(control.to_string());
    }
    names
        .into_iter()
        .filter_map(|name| {
            let meta = fs::metadata(dev.join(&name)).ok()?;
            meta.file_type().is_char_device().then(|| Device {
                path: format!("/dev/{name}"),
                major: nix::sys::stat::major(meta.rdev()),
                minor: nix::sys::stat::minor(meta.rdev()),
                mode: meta.mode() & 0o777,
            })
        })
        .collect()
}

/// The variables gpuq and Slurm set for a task (its place in the job, its
/// GPUs, the rendezvous): always the task's, whatever the image says.
fn is_contract(name: &str) -> bool {
    const NAMES: [&str; 11] = [
        "CUDA_VISIBLE_DEVICES",
        "CUDA_DEVICE_ORDER",
        "MASTER_ADDR",
        "MASTER_PORT",
        "WORLD_SIZE",
        "RANK",
        "LOCAL_RANK",
        "LOCAL_WORLD_SIZE",
        "NODE_RANK",
        "TORCHELASTIC_RESTART_COUNT",
        "HOME",
    ];
    ["GPUQ_", "SLURM_", "PET_"]
        .iter()
        .any(|p| name.starts_with(p))
        || NAMES.contains(&name)
}

/// The container's environment, as Pyxis makes it: the image's `Env`, then
/// the task's variables the image does not set; where both set one, the
/// image's value wins unless the job named it in `--container-env`
/// (`overrides`) or it is one of gpuq's and Slurm's own (`is_contract`).
/// A login's USER and LOGNAME and a PATH when nothing set them.
pub(super) fn container_env(
    image: &[String],
    task: &[(String, String)],
    user: &str,
    overrides: &[String],
) -> Vec<String> {
    let mut env: Vec<(String, String)> = image
        .iter()
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    for (k, v) in task {
        match env.iter_mut().find(|(name, _)| name == k) {
            Some(slot) if overrides.contains(k) || is_contract(k) => slot.1 = v.clone(),
            Some(_) => {}
            None => env.push((k.clone(), v.clone())),
        }
    }
    for (k, v) in [("USER", user), ("LOGNAME", user), ("PATH", CONTAINER_PATH)] {
        if !env.iter().any(|(name, _)| name == k) {
            env.push((k.to_string(), v.to_string()));
        }
    }
    env.into_iter().map(|(k, v)| format!("{k}={v}")).collect()
}

/// Sets `NVIDIA_VISIBLE_DEVICES` as `CUDA_VISIBLE_DEVICES` is (a MIG
/// instance's UUID, a whole GPU's index), whatever the image says (CUDA
/// images set `all`): `void` for a task without GPUs.
pub(super) fn nvidia_visible(env: &mut Vec<String>) {
    const NAME: &str = "NVIDIA_VISIBLE_DEVICES";
    let value = |name: &str| {
        env.iter()
            .find_map(|kv| kv.strip_prefix(name)?.strip_prefix('='))
            .map(str::to_string)
    };
    let set = match value("CUDA_VISIBLE_DEVICES").filter(|v| !v.is_empty()) {
        Some(cvd) => cvd,
        None if value(NAME).is_some() => "void".to_string(),
        None => return,
    };
    env.retain(|kv| kv.split_once('=').map_or(kv.as_str(), |(k, _)| k) != NAME);
    env.push(format!("{NAME}={set}"));
}

/// One mount of `config.json`.
fn mount(destination: &str, kind: &str, source: &str, options: &[&str]) -> Value {
    json!({"destination": destination, "type": kind, "source": source, "options": options})
}

/// The process and identity half of `config.json`.
pub(super) struct Process<'a> {
    pub argv: &'a [String],
    /// `--container-readonly`: the root filesystem is mounted read-only.
    pub read_only: bool,
    pub env: Vec<String>,
    pub cwd: &'a str,
    pub identity: &'a Identity,
    /// The runtime runs as the user (`rootless`): the container gets a user
    /// namespace mapping only the user's uid and gid, and keeps the groups
    /// the runtime was started with (such a namespace cannot set others).
    pub rootless: bool,
    /// `--container-remap-root`: the user is uid and gid 0 inside, in a user
    /// namespace mapping only the user's ids to 0 (the runtime's usual
    /// capabilities hold there, and nowhere else).
    pub remap_root: bool,
}

/// The bundle's `config.json`: `binds` are (staging source, destination,
/// read-only) in mount order.
pub(super) fn oci_config(
    p: &Process<'_>,
    rootfs: &Path,
    binds: &[(String, String, bool)],
    devices: &[Device],
    cgroups_path: Option<&str>,
) -> Value {
    // Root's tasks (where the cluster allows them) keep the usual runtime
    // set; a user's have none, and no new privileges either way.
    let caps: Vec<&str> = if p.identity.uid == 0 || p.remap_root {
        vec![
            "CAP_CHOWN",
            "CAP_DAC_OVERRIDE",
            "CAP_FOWNER",
            "CAP_FSETID",
            "CAP_KILL",
            "CAP_SETGID",
            "CAP_SETUID",
            "CAP_SETPCAP",
            "CAP_NET_BIND_SERVICE",
            "CAP_SYS_CHROOT",
            "CAP_AUDIT_WRITE",
        ]
    } else {
        Vec::new()
    };
    // A user namespace without a process id namespace of its own cannot
    // mount a proc: it sees the host's, as with the host's pids anyway.
    let userns = p.rootless || p.remap_root;
    let proc = match userns {
        false => mount("/proc", "proc", "proc", &["nosuid", "noexec", "nodev"]),
        true => mount(
            "/proc",
            "bind",
            "/proc",
            &["rbind", "nosuid", "noexec", "nodev"],
        ),
    };
    let mut mounts = vec![
        proc,
        mount(
            "/dev",
            "tmpfs",
            "tmpfs",
            &["nosuid", "strictatime", "mode=755", "size=65536k"],
        ),
        mount(
            "/dev/pts",
            "devpts",
            "devpts",
            &[
                "nosuid",
                "noexec",
                "newinstance",
                "ptmxmode=0666",
                "mode=0620",
            ],
        ),
        // The host's, so the ranks of a job on a node share it (NCCL).
        mount(
            "/dev/shm",
            "bind",
            "/dev/shm",
            &["rbind", "nosuid", "nodev"],
        ),
        mount(
            "/sys",
            "bind",
            "/sys",
            &["rbind", "nosuid", "noexec", "nodev", "ro"],
        ),
    ];
    for (source, destination, ro) in binds {
        let opts: &[&str] = if *ro {
            &["rbind", "nosuid", "nodev", "ro"]
        } else {
            &["rbind", "nosuid", "nodev"]
        };
        mounts.push(mount(destination, "bind", source, opts));
    }
    let groups: Vec<u32> = p.identity.groups.clone();
    let mut linux = json!({
        "namespaces": [{"type": "mount"}],
        "devices": devices.iter().map(|d| json!({"path": d.path, "type": "c",
            "major": d.major, "minor": d.minor, "fileMode": d.mode, "uid": 0, "gid": 0}))
            .collect::<Vec<_>>(),
        "maskedPaths": ["/proc/acpi", "/proc/kcore", "/proc/keys", "/proc/latency_stats",
            "/proc/timer_list", "/proc/sched_debug", "/proc/scsi", "/sys/firmware"],
        "readonlyPaths": ["/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys",
            "/proc/sysrq-trigger"],
    });
    if let Some(path) = cgroups_path {
        linux["cgroupsPath"] = json!(path);
    }
    let mut user = json!({"uid": p.identity.uid, "gid": p.identity.gid, "additionalGids": groups});
    if userns {
        let (uid, gid) = match p.remap_root {
            true => (0, 0),
            false => (p.identity.uid, p.identity.gid),
        };
        let one = |inside: u32, id: u32| json!([{"containerID": inside, "hostID": id, "size": 1}]);
        linux["namespaces"] = json!([{"type": "mount"}, {"type": "user"}]);
        linux["uidMappings"] = one(uid, p.identity.uid);
        linux["gidMappings"] = one(gid, p.identity.gid);
        user = json!({"uid": uid, "gid": gid});
    }
    json!({
        "ociVersion": "1.0.2",
        "process": {
            "terminal": false,
            "user": user,
            "args": p.argv,
            "env": p.env,
            "cwd": p.cwd,
            "noNewPrivileges": true,
            "capabilities": {"bounding": caps, "effective": caps, "permitted": caps,
                "inheritable": [], "ambient": []},
        },
        "root": {"path": rootfs, "readonly": p.read_only},
        "mounts": mounts,
        "linux": linux,
    })
}

/// Where `config` mounts something in the container, and whether each is
/// a directory, for making the mount points the image lacks: every mount's
/// destination (not those under `/dev`, the runtime's own tmpfs) and the
/// working directory. A bind's kind is its source's: `staged` says it for
/// the sources the child stages (not there yet), the host's for others.
pub(super) fn mount_points(config: &Value, staged: &[(String, bool)]) -> Vec<(String, bool)> {
    let mut points: Vec<(String, bool)> = Vec::new();
    let mounts = config["mounts"].as_array().cloned().unwrap_or_default();
    for m in &mounts {
        let Some(dest) = m["destination"].as_str() else {
            continue;
        };
        if dest.starts_with("/dev/") {
            continue;
        }
        let source = m["source"].as_str().unwrap_or_default();
        let dir = match m["type"].as_str() {
            Some("bind") => staged
                .iter()
                .find(|(s, _)| s == source)
                .map(|(_, dir)| *dir)
                .unwrap_or_else(|| fs::metadata(source).map_or(true, |m| m.is_dir())),
            _ => true,
        };
        points.push((dest.to_string(), dir));
    }
    if let Some(cwd) = config["process"]["cwd"].as_str() {
        points.push((cwd.to_string(), true));
    }
    let mut seen = std::collections::HashSet::new();
    points.retain(|(p, _)| seen.insert(p.clone()));
    points
}

#[cfg(test)]
mod tests {
    use super::*;

    fn alice() -> Identity {
        Identity {
            name: "alice".into(),
            uid: 1000,
            gid: 100,
            groups: vec![100, 27],
        }
    }

    #[test]
    fn the_bundle_runs_the_users_command_as_the_user_on_the_hosts_network() {
        let argv = vec!["python".to_string(), "train.py".to_string()];
        let p = Process {
            argv: &argv,
            read_only: false,
            env: vec!["A=1".into()],
            cwd: "/work",
            identity: &alice(),
            rootless: false,
            remap_root: false,
        };
        let binds = [
            (
                "/t/scratch/binds/0".to_string(),
                "/home/alice".to_string(),
                false,
            ),
            ("/t/scratch/binds/1".to_string(), "/data".to_string(), true),
        ];
        let gpu = Device {
            path: "/dev/nvidia3".into(),
            major: 195,
            minor: 3,
            mode: 0o666,
        };
        let c = oci_config(&p, Path::new("/t/rootfs"), &binds, &[gpu], None);
        assert_eq!(
            c["process"]["user"],
            json!({"uid": 1000, "gid": 100, "additionalGids": [100, 27]})
        );
        assert_eq!(c["process"]["args"], json!(["python", "train.py"]));
        assert_eq!(c["process"]["cwd"], "/work");
        assert_eq!(c["process"]["noNewPrivileges"], true);
        assert_eq!(c["process"]["capabilities"]["effective"], json!([]));
        assert_eq!(c["root"], json!({"path": "/t/rootfs", "readonly": false}));
        // Only a mount namespace: the host's network, pids and IPC.
        assert_eq!(c["linux"]["namespaces"], json!([{"type": "mount"}]));
        assert!(c["linux"].get("cgroupsPath").is_none());
        assert_eq!(c["linux"]["devices"][0]["path"], "/dev/nvidia3");
        assert_eq!(c["linux"]["devices"][0]["minor"], 3);
        let mounts = c["mounts"].as_array().unwrap();
        let dests: Vec<&str> = mounts
            .iter()
            .map(|m| m["destination"].as_str().unwrap())
            .collect();
        assert_eq!(
            dests,
            [
                "/proc",
                "/dev",
                "/dev/pts",
                "/dev/shm",
                "/sys",
                "/home/alice",
                "/data"
            ]
        );
        assert_eq!(mounts[6]["source"], "/t/scratch/binds/1");
        assert_eq!(
            mounts[6]["options"],
            json!(["rbind", "nosuid", "nodev", "ro"])
        );
        assert_eq!(mounts[5]["options"], json!(["rbind", "nosuid", "nodev"]));
        let root = Identity {
            uid: 0,
            gid: 0,
            name: "root".into(),
            groups: vec![],
        };
        let c = oci_config(
            &Process {
                identity: &root,
                env: p.env.clone(),
                ..p
            },
            Path::new("/r"),
            &[],
            &[],
            Some("/gpuq/1.0.0"),
        );
        assert!(
            c["process"]["capabilities"]["effective"]
                .as_array()
                .unwrap()
                .len()
                > 3
        );
        assert_eq!(c["linux"]["cgroupsPath"], "/gpuq/1.0.0");
        let c = oci_config(
            &Process {
                read_only: true,
                ..p
            },
            Path::new("/r"),
            &[],
            &[],
            None,
        );
        assert_eq!(c["root"], json!({"path": "/r", "readonly": true}));
    }

    #[test]
    fn a_rootless_bundle_maps_only_the_user_and_binds_the_hosts_proc() {
        let argv = vec!["id".to_string()];
        let p = Process {
            argv: &argv,
            read_only: false,
            env: Vec::new(),
            cwd: "/",
            identity: &alice(),
            rootless: true,
            remap_root: false,
        };
        let c = oci_config(&p, Path::new("/t/rootfs"), &[], &[], None);
        assert_eq!(
            c["linux"]["namespaces"],
            json!([{"type": "mount"}, {"type": "user"}])
        );
        let one = |id: u32| json!([{"containerID": id, "hostID": id, "size": 1}]);
        assert_eq!(c["linux"]["uidMappings"], one(1000));
        assert_eq!(c["linux"]["gidMappings"], one(100));
        // Its groups are the runtime's own: a user namespace cannot set any.
        assert_eq!(c["process"]["user"], json!({"uid": 1000, "gid": 100}));
        assert_eq!(c["mounts"][0]["destination"], "/proc");
        assert_eq!(c["mounts"][0]["type"], "bind");
        assert_eq!(c["mounts"][0]["source"], "/proc");
        assert_eq!(c["process"]["capabilities"]["effective"], json!([]));
        // --container-remap-root: uid and gid 0 inside, mapped to hers, with
        // the runtime's capabilities there.
        let c = oci_config(
            &Process {
                remap_root: true,
                rootless: false,
                ..p
            },
            Path::new("/t/rootfs"),
            &[],
            &[],
            None,
        );
        let to = |id: u32| json!([{"containerID": 0, "hostID": id, "size": 1}]);
        assert_eq!(c["linux"]["uidMappings"], to(1000));
        assert_eq!(c["linux"]["gidMappings"], to(100));
        assert_eq!(c["process"]["user"], json!({"uid": 0, "gid": 0}));
        assert!(c["process"]["capabilities"]["effective"]
            .as_array()
            .is_some_and(|caps| caps.contains(&json!("CAP_CHOWN"))));
        assert_eq!(c["mounts"][0]["type"], "bind");
    }

    #[test]
    fn mount_points_are_every_destination_but_devs_and_the_working_directory() {
        let host = tempfile::tempdir().unwrap();
        let lib = host.path().join("libcuda.so.1");
        fs::write(&lib, "").unwrap();
        let config = json!({
            "process": {"cwd": "/work"},
            "mounts": [
                {"destination": "/proc", "type": "proc", "source": "proc"},
                {"destination": "/dev", "type": "tmpfs", "source": "tmpfs"},
                {"destination": "/dev/shm", "type": "bind", "source": "/dev/shm"},
                {"destination": "/home/alice", "type": "bind", "source": "/s/binds/0"},
                {"destination": "/work", "type": "bind", "source": "/s/binds/1"},
                {"destination": "/run/job.sh", "type": "bind", "source": "/s/binds/2"},
                {"destination": "/usr/lib/libcuda.so.1", "type": "bind",
                    "source": lib.to_str().unwrap()},
                {"destination": "/usr/share/nvidia", "type": "bind",
                    "source": host.path().to_str().unwrap()},
            ],
        });
        let staged = [
            ("/s/binds/0".to_string(), true),
            ("/s/binds/1".to_string(), true),
            ("/s/binds/2".to_string(), false),
        ];
        let points = mount_points(&config, &staged);
        let want = [
            ("/proc", true),
            ("/dev", true),
            ("/home/alice", true),
            ("/work", true),
            ("/run/job.sh", false),
            ("/usr/lib/libcuda.so.1", false),
            ("/usr/share/nvidia", true),
        ];
        let want: Vec<(String, bool)> = want.iter().map(|(p, d)| (p.to_string(), *d)).collect();
        assert_eq!(points, want);
    }

    #[test]
    fn the_images_env_wins_unless_named_in_container_env_or_gpuqs_own() {
        let task = vec![
            ("PATH".to_string(), "/home/alice/bin:/usr/bin".to_string()),
            ("CUDA_VISIBLE_DEVICES".to_string(), "2,3".to_string()),
            ("LANG".to_string(), "C.UTF-8".to_string()),
            ("SLURM_JOB_ID".to_string(), "7".to_string()),
        ];
        let image = [
            "PATH=/opt/conda/bin:/bin".to_string(),
            "LANG=C".to_string(),
            "CUDA_VISIBLE_DEVICES=all".to_string(),
            "SLURM_JOB_ID=0".to_string(),
        ];
        let env = container_env(&image, &task, "alice", &[]);
        assert_eq!(
            env,
            [
                "PATH=/opt/conda/bin:/bin",
                "LANG=C",
                "CUDA_VISIBLE_DEVICES=2,3",
                "SLURM_JOB_ID=7",
                "USER=alice",
                "LOGNAME=alice"
            ]
        );
        let env = container_env(&image, &task, "alice", &["LANG".into(), "PATH".into()]);
        assert!(
            env.contains(&"LANG=C.UTF-8".to_string())
                && env.contains(&"PATH=/home/alice/bin:/usr/bin".to_string()),
            "{env:?}"
        );
        let env = container_env(&[], &task[1..], "bob", &[]);
        assert!(env.contains(&format!("PATH={CONTAINER_PATH}")), "{env:?}");
        let env = container_env(&[], &task, "bob", &[]);
        assert!(
            env.contains(&"PATH=/home/alice/bin:/usr/bin".to_string()),
            "{env:?}"
        );
    }

    #[test]
    fn gpu_devices_are_the_tasks_by_pci_order_and_only_real_ones() {
        let dir = tempfile::tempdir().unwrap();
        let driver = dir.path().join("gpus");
        let dev = dir.path().join("dev");
        fs::create_dir_all(&dev).unwrap();
        // Two GPUs whose minors are not their indices.
        for (bus, minor) in [("0000:18:00.0", 4), ("0000:3b:00.0", 1)] {
            fs::create_dir_all(driver.join(bus)).unwrap();
            fs::write(
                driver.join(bus).join("information"),
                format!("Model: \t\t NVIDIA H100\nDevice Minor: \t {minor}\n"),
            )
            .unwrap();
        }
        // Character devices by way of /dev/null; a plain file is no device.
        std::os::unix::fs::symlink("/dev/null", dev.join("nvidia1")).unwrap();
        std::os::unix::fs::symlink("/dev/null", dev.join("nvidiactl")).unwrap();
        fs::write(dev.join("nvidia4"), "").unwrap();
        let found = gpu_devices(&[1], &driver, &dev);
        let paths: Vec<&str> = found.iter().map(|d| d.path.as_str()).collect();
        assert_eq!(paths, ["/dev/nvidia1", "/dev/nvidiactl"]);
        assert_eq!((found[0].major, found[0].minor), (1, 3));
        assert!(gpu_devices(&[0], &driver, &dev)
            .iter()
            .all(|d| d.path != "/dev/nvidia4"));
        assert!(gpu_devices(&[], &driver, &dev).is_empty());
    }

    #[test]
    fn nvidia_visible_devices_names_the_tasks_gpus_as_cuda_visible_devices_does() {
        let env = |list: &[&str]| list.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        // A CUDA image's `all` gives way to the task's MIG instance.
        let mut e = env(&["NVIDIA_VISIBLE_DEVICES=all", "CUDA_VISIBLE_DEVICES=MIG-a1"]);
        nvidia_visible(&mut e);
        assert_eq!(
            e,
            env(&[
                "CUDA_VISIBLE_DEVICES=MIG-a1",
                "NVIDIA_VISIBLE_DEVICES=MIG-a1"
            ])
        );
        // No GPUs: none, where the image asked for all.
        let mut e = env(&["NVIDIA_VISIBLE_DEVICES=all", "CUDA_VISIBLE_DEVICES="]);
        nvidia_visible(&mut e);
        assert_eq!(
            e,
            env(&["CUDA_VISIBLE_DEVICES=", "NVIDIA_VISIBLE_DEVICES=void"])
        );
        let mut e = env(&["A=1"]);
        nvidia_visible(&mut e);
        assert_eq!(e, env(&["A=1"]));
    }
}
