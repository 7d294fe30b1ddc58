//! GPUs in containers through CDI (the Container Device Interface): where
//! the node has CDI spec files (`*.json`, `*.yaml`, `*.yml` in
//! `[agent.containers] cdi_spec_dirs`, by default `/etc/cdi` and
//! `/var/run/cdi`, as `nvidia-ctk cdi generate` writes them), the task's
//! container gets its GPUs' `containerEdits` — each matched device's, and
//! the spec-level ones of every spec one of its GPUs is in: device nodes,
//! mounts (the driver's libraries and tools), environment variables and
//! OCI hooks (`nvidia-ctk hook ...`). Nothing of a GPU the task does not
//! hold goes in. Specs of a kind ending in `/gpu` count (`nvidia.com/gpu`,
//! `amd.com/gpu`); a GPU is found by any of its names: its index, its
//! UUID (`GPU-...`) or its MIG instance's UUID (`MIG-...`).
//!
//! A device node whose host file is a device takes its major and minor
//! from it where the spec has none; one whose host file is a plain file
//! (what the fake GPU backend's tests name) is bound in instead. A spec
//! that cannot be read, or a GPU of the task no spec names, fails the
//! task with the file and the name: a node with CDI specs gives its GPUs
//! through them or not at all.

use std::fs;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

use serde::Deserialize;
use serde_json::{json, Value};

/// One spec file, as far as gpuq uses it.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Spec {
    kind: String,
    #[serde(default)]
    devices: Vec<SpecDevice>,
    #[serde(default)]
    container_edits: Edits,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct SpecDevice {
    /// A string, or a number where YAML left an index unquoted.
    name: Value,
    #[serde(default)]
    container_edits: Edits,
}

/// A set of `containerEdits`.
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub(super) struct Edits {
    #[serde(default)]
    env: Vec<String>,
    #[serde(default)]
    device_nodes: Vec<DeviceNode>,
    #[serde(default)]
    mounts: Vec<Mount>,
    #[serde(default)]
    hooks: Vec<Hook>,
}

#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
struct DeviceNode {
    path: String,
    #[serde(default)]
    host_path: Option<String>,
    #[serde(default, rename = "type")]
    kind: Option<String>,
    #[serde(default)]
    major: Option<u64>,
    #[serde(default)]
    minor: Option<u64>,
    #[serde(default)]
    file_mode: Option<u32>,
    #[serde(default)]
    uid: Option<u32>,
    #[serde(default)]
    gid: Option<u32>,
}

#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
struct Mount {
    host_path: String,
    container_path: String,
    #[serde(default, rename = "type")]
    kind: Option<String>,
    #[serde(default)]
    options: Vec<String>,
}

#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
struct Hook {
    hook_name: String,
    path: String,
    #[serde(default)]
    args: Vec<String>,
    #[serde(default)]
    env: Vec<String>,
    #[serde(default)]
    timeout: Option<u64>,
}

/// The spec files in `dirs`, sorted by name within each directory (a
/// missing directory has none).
pub fn spec_files(dirs: &[PathBuf]) -> Vec<PathBuf> {
    let mut all = Vec::new();
    for dir in dirs {
        let Ok(entries) = fs::read_dir(dir) else {
            continue;
        };
        let mut files: Vec<PathBuf> = entries
            .filter_map(|e| Some(e.ok()?.path()))
            .filter(|p| {
                p.is_file()
                    && p.extension()
                        .is_some_and(|x| x == "json" || x == "yaml" || x == "yml")
            })
            .collect();
        files.sort();
        all.extend(files);
    }
    all
}

fn read_spec(file: &Path) -> Result<Spec, String> {
    let text = fs::read_to_string(file)
        .map_err(|e| format!("cannot read the CDI spec {}: {e}", file.display()))?;
    let value = match file.extension().is_some_and(|x| x == "json") {
        true => serde_json::from_str(&text).map_err(|e| e.to_string()),
        false => super::cdi_yaml::parse(&text),
    };
    value
        .and_then(|v| serde_json::from_value(v).map_err(|e| e.to_string()))
        .map_err(|e| {
            format!(
                "the CDI spec {} is not valid: {e}; fix it or move it out of [agent.containers] \
                 cdi_spec_dirs",
                file.display()
            )
        })
}

/// The edits for a task's GPUs, each given by its names (index, UUID,
/// MIG UUID): the spec-level edits of each spec that has one of them,
/// then each GPU's own. `Ok(None)`: no spec files at all (the caller
/// falls back to device nodes). A GPU no spec names is an error.
pub(super) fn edits_for(dirs: &[PathBuf], gpus: &[Vec<String>]) -> Result<Option<Edits>, String> {
    let files = spec_files(dirs);
    if files.is_empty() {
        return Ok(None);
    }
    let mut specs = Vec::new();
    for file in &files {
        let spec = read_spec(file)?;
        if spec.kind.ends_with("/gpu") {
            specs.push((file, spec));
        }
    }
    let name_of = |d: &SpecDevice| match &d.name {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    };
    let mut used = vec![false; specs.len()];
    let mut devices = Edits::default();
    for names in gpus {
        let found = specs.iter().enumerate().find_map(|(i, (_, s))| {
            let d = s.devices.iter().find(|d| names.contains(&name_of(d)))?;
            Some((i, d))
        });
        let Some((i, device)) = found else {
            return Err(format!(
                "no CDI spec on node {} names GPU {} (looked in {}); regenerate the specs \
                 (nvidia-ctk cdi generate) or fix [agent.containers] cdi_spec_dirs",
                super::task::hostname(),
                names.join(" / "),
                files
                    .iter()
                    .map(|f| f.display().to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
        };
        used[i] = true;
        devices.append(&device.container_edits);
    }
    let mut edits = Edits::default();
    for (i, (_, spec)) in specs.iter().enumerate() {
        if used[i] {
            edits.append(&spec.container_edits);
        }
    }
    edits.append(&devices);
    Ok(Some(edits))
}

impl Edits {
    fn append(&mut self, other: &Edits) {
        self.env.extend(other.env.iter().cloned());
        for d in &other.device_nodes {
            if !self.device_nodes.iter().any(|x| x.path == d.path) {
                self.device_nodes.push(d.clone());
            }
        }
        for m in &other.mounts {
            if !self
                .mounts
                .iter()
                .any(|x| x.container_path == m.container_path)
            {
                self.mounts.push(m.clone());
            }
        }
        for h in &other.hooks {
            if !self.hooks.contains(h) {
                self.hooks.push(h.clone());
            }
        }
    }

    /// Writes the edits into an OCI `config.json`: device nodes to
    /// `linux.devices` (or binds, for plain files), mounts, environment
    /// variables (replacing one of the same name), hooks.
    /// Whether the edits run hooks in the container's root.
    pub(super) fn has_hooks(&self) -> bool {
        !self.hooks.is_empty()
    }

    pub(super) fn apply(&self, config: &mut Value) -> Result<(), String> {
        for d in &self.device_nodes {
            let host = d.host_path.as_deref().unwrap_or(&d.path);
            let meta = fs::metadata(host).map_err(|e| {
                format!(
                    "the CDI device node {host} (for {}) is not usable: {e}",
                    d.path
                )
            })?;
            let ft = meta.file_type();
            if ft.is_char_device() || ft.is_block_device() {
                let rdev = meta.rdev();
                let kind = d
                    .kind
                    .clone()
                    .unwrap_or_else(|| if ft.is_block_device() { "b" } else { "c" }.to_string());
                push(
                    &mut config["linux"]["devices"],
                    json!({
                        "path": d.path,
                        "type": kind,
                        "major": d.major.unwrap_or(nix::sys::stat::major(rdev)),
                        "minor": d.minor.unwrap_or(nix::sys::stat::minor(rdev)),
                        "fileMode": d.file_mode.unwrap_or(meta.mode() & 0o777),
                        "uid": d.uid.unwrap_or(0),
                        "gid": d.gid.unwrap_or(0),
                    }),
                );
            } else {
                push(
                    &mut config["mounts"],
                    json!({"destination": d.path, "type": "bind", "source": host,
                        "options": ["bind", "nosuid"]}),
                );
            }
        }
        for m in &self.mounts {
            let options = match m.options.is_empty() {
                true => vec!["rbind".to_string(), "nosuid".into(), "nodev".into()],
                false => m.options.clone(),
            };
            push(
                &mut config["mounts"],
                json!({"destination": m.container_path, "type": m.kind.as_deref().unwrap_or("bind"),
                    "source": m.host_path, "options": options}),
            );
        }
        let env = &mut config["process"]["env"];
        for kv in &self.env {
            let name = kv.split_once('=').map_or(kv.as_str(), |(k, _)| k);
            if let Value::Array(list) = env {
                list.retain(|v| {
                    v.as_str()
                        .is_none_or(|s| s.split_once('=').map_or(s, |(k, _)| k) != name)
                });
            }
            push(env, json!(kv));
        }
        for h in &self.hooks {
            let mut hook = json!({"path": h.path});
            if !h.args.is_empty() {
                hook["args"] = json!(h.args);
            }
            if !h.env.is_empty() {
                hook["env"] = json!(h.env);
            }
            if let Some(t) = h.timeout {
                hook["timeout"] = json!(t);
            }
            push(&mut config["hooks"][h.hook_name.as_str()], hook);
        }
        Ok(())
    }
}

/// Appends to a JSON array, making it where there was none.
fn push(list: &mut Value, item: Value) {
    if !list.is_array() {
        *list = json!([]);
    }
    if let Value::Array(items) = list {
        items.push(item);
    }
}

/// The names each of the task's GPUs may have in a CDI spec: how CUDA
/// names it (`devices`: a MIG instance's UUID, a whole GPU's index) and,
/// for a real whole GPU, its UUID (from the driver's `information` file,
/// `driver` being `/proc/driver/nvidia/gpus`, in PCI bus order as NVML
/// numbers them).
pub(super) fn names(c: &super::task::TaskContainer, driver: &Path) -> Vec<Vec<String>> {
    let mut buses: Vec<PathBuf> = fs::read_dir(driver)
        .map(|d| d.filter_map(|e| Some(e.ok()?.path())).collect())
        .unwrap_or_default();
    buses.sort();
    let uuid_of = |index: u32| -> Option<String> {
        let text = fs::read_to_string(buses.get(index as usize)?.join("information")).ok()?;
        text.lines()
            .find_map(|l| l.strip_prefix("GPU UUID:"))
            .map(|u| u.trim().to_string())
    };
    c.devices
        .iter()
        .enumerate()
        .map(|(i, name)| {
            let mut all = vec![name.clone()];
            let whole = !name.starts_with("MIG-");
            if let Some(uuid) = c.gpus.get(i).filter(|_| whole).and_then(|&g| uuid_of(g)) {
                all.push(uuid);
            }
            all
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(dir: &Path, name: &str, text: &str) {
        fs::write(dir.join(name), text).unwrap();
    }

    fn names(list: &[&str]) -> Vec<Vec<String>> {
        list.iter().map(|n| vec![n.to_string()]).collect()
    }

    #[test]
    fn a_tasks_gpus_get_their_edits_and_the_specs_and_nothing_of_other_gpus() {
        let tmp = tempfile::tempdir().unwrap();
        let (specs, other) = (tmp.path().join("etc"), tmp.path().join("run"));
        fs::create_dir_all(&specs).unwrap();
        let dev = |n: &str| {
            let p = tmp.path().join(n);
            fs::write(&p, n).unwrap();
            p.to_string_lossy().into_owned()
        };
        let (g0, g1, mig) = (dev("gpu0"), dev("gpu1"), dev("cap12"));
        write(
            &specs,
            "nvidia.yaml",
            &format!(
                "cdiVersion: 0.5.0\nkind: nvidia.com/gpu\ndevices:\n\
                 - name: \"0\"\n  containerEdits:\n    deviceNodes:\n    - path: /dev/nvidia0\n      hostPath: {g0}\n\
                 - name: 1\n  containerEdits:\n    deviceNodes:\n    - path: /dev/nvidia1\n      hostPath: {g1}\n\
                 - name: MIG-77\n  containerEdits:\n    deviceNodes:\n    - path: /dev/nvidia-caps/nvidia-cap12\n      hostPath: {mig}\n    env: [MIG_ONE=yes]\n\
                 containerEdits:\n  env:\n  - NVIDIA_DRIVER=535\n  - PATH=/driver/bin\n  mounts:\n  - hostPath: /usr/lib\n    containerPath: /driver/lib\n    options: [ro, nosuid, nodev, bind]\n  hooks:\n  - hookName: createContainer\n    path: /usr/bin/nvidia-ctk\n    args: [nvidia-ctk, hook, update-ldcache]\n"
            ),
        );
        // Another vendor's class and a JSON spec of no GPU are left out.
        write(
            &specs,
            "net.json",
            r#"{"cdiVersion":"0.5.0","kind":"example.com/nic","devices":[{"name":"0","containerEdits":{"env":["NIC=1"]}}],"containerEdits":{"env":["NIC_SPEC=1"]}}"#,
        );
        write(&specs, "README", "not a spec");
        let dirs = vec![specs.clone(), other.clone()];
        let edits = edits_for(&dirs, &names(&["1", "MIG-77"])).unwrap().unwrap();
        let mut config = json!({"process": {"env": ["PATH=/bin", "A=1"]}, "mounts": [],
            "linux": {"devices": []}});
        edits.apply(&mut config).unwrap();
        let env = &config["process"]["env"];
        assert_eq!(
            env,
            &json!([
                "A=1",
                "NVIDIA_DRIVER=535",
                "PATH=/driver/bin",
                "MIG_ONE=yes"
            ])
        );
        let mounts: Vec<(&str, &str)> = config["mounts"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| {
                (
                    m["destination"].as_str().unwrap(),
                    m["source"].as_str().unwrap(),
                )
            })
            .collect();
        // Plain files (fake devices) are bound in; GPU 0's is not there.
        assert_eq!(
            mounts,
            [
                ("/dev/nvidia1", g1.as_str()),
                ("/dev/nvidia-caps/nvidia-cap12", mig.as_str()),
                ("/driver/lib", "/usr/lib"),
            ]
        );
        assert_eq!(
            config["mounts"][2]["options"],
            json!(["ro", "nosuid", "nodev", "bind"])
        );
        assert_eq!(
            config["hooks"]["createContainer"],
            json!([{"path": "/usr/bin/nvidia-ctk", "args": ["nvidia-ctk", "hook", "update-ldcache"]}])
        );
        // A device file is a device in the container, major and minor its.
        let dev_null = r#"{"kind": "nvidia.com/gpu", "devices": [{"name": "GPU-abc",
            "containerEdits": {"deviceNodes": [{"path": "/dev/nvidia5", "hostPath": "/dev/null"}]}}]}"#;
        fs::create_dir_all(&other).unwrap();
        write(&other, "uuid.json", dev_null);
        let edits = edits_for(&dirs, &[vec!["5".into(), "GPU-abc".into()]])
            .unwrap()
            .unwrap();
        let mut config = json!({"process": {"env": []}});
        edits.apply(&mut config).unwrap();
        assert_eq!(config["linux"]["devices"][0]["path"], "/dev/nvidia5");
        assert_eq!(config["linux"]["devices"][0]["type"], "c");
        assert_eq!(config["linux"]["devices"][0]["major"], 1);
        assert_eq!(config["linux"]["devices"][0]["minor"], 3);
        assert!(config.get("mounts").is_none(), "{config}");
    }

    #[test]
    fn no_specs_fall_back_and_a_gpu_no_spec_names_or_a_bad_spec_fails_the_task() {
        let tmp = tempfile::tempdir().unwrap();
        let dirs = vec![tmp.path().join("nothing-here"), tmp.path().to_path_buf()];
        assert_eq!(edits_for(&dirs, &names(&["0"])).unwrap(), None);
        write(
            tmp.path(),
            "gpu.json",
            r#"{"kind":"nvidia.com/gpu","devices":[{"name":"0"}]}"#,
        );
        let err = edits_for(&dirs, &names(&["3"])).unwrap_err();
        assert!(
            err.contains("names GPU 3") && err.contains("gpu.json"),
            "{err}"
        );
        write(
            tmp.path(),
            "broken.yaml",
            "kind: nvidia.com/gpu\ndevices: |\n  x\n",
        );
        let err = edits_for(&dirs, &names(&["0"])).unwrap_err();
        assert!(
            err.contains("broken.yaml") && err.contains("line 2"),
            "{err}"
        );
        let edits = Edits {
            device_nodes: vec![DeviceNode {
                path: "/dev/nvidia9".into(),
                host_path: Some(tmp.path().join("gone").to_string_lossy().into()),
                kind: None,
                major: None,
                minor: None,
                file_mode: None,
                uid: None,
                gid: None,
            }],
            ..Default::default()
        };
        let err = edits.apply(&mut json!({})).unwrap_err();
        assert!(
            err.contains("gone") && err.contains("/dev/nvidia9"),
            "{err}"
        );
    }
}
