//! The test images of the container tests (`tests/containers.rs`,
//! `tests/container_images.rs`): a busybox-static root filesystem made
//! here, packed by hand (tar, gzip and sha256; no umoci, no docker) into an
//! OCI image layout, an OCI archive and a `docker save` archive, or made
//! into a squashfs file with mksquashfs; and what the tests read back.
#![allow(dead_code)]

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

use sha2::{Digest, Sha256};

use crate::common::Agent;

pub const LONG: Duration = Duration::from_secs(60);

/// The `NAME` of the test image's os-release, which no host has.
pub const IMAGE_NAME: &str = "gpuq-test-busybox";

pub fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()))
}

/// Fails, saying what to install, when crun or a static busybox is missing.
pub fn require_tools() -> PathBuf {
    let on_path = |name: &str| {
        std::env::var("PATH")
            .unwrap_or_default()
            .split(':')
            .map(|d| Path::new(d).join(name))
            .find(|p| p.is_file())
    };
    assert!(
        on_path("crun").is_some(),
        "crun is missing: install it (apt-get install -y crun busybox-static), as .ci/run does"
    );
    let busybox = on_path("busybox").unwrap_or_else(|| {
        panic!("busybox is missing: install busybox-static (apt-get install -y busybox-static)")
    });
    assert!(
        is_static(&busybox),
        "{} is dynamically linked; the test image needs busybox-static \
         (apt-get install -y busybox-static)",
        busybox.display()
    );
    busybox
}

/// Whether an ELF64 file has no program interpreter (is statically linked).
pub fn is_static(path: &Path) -> bool {
    let bytes = std::fs::read(path).unwrap();
    let word = |at: usize, n: usize| {
        bytes[at..at + n]
            .iter()
            .rev()
            .fold(0u64, |acc, b| (acc << 8) | u64::from(*b))
    };
    let (phoff, phentsize, phnum) = (word(0x20, 8), word(0x36, 2), word(0x38, 2));
    const PT_INTERP: u64 = 3;
    (0..phnum).all(|i| word((phoff + i * phentsize) as usize, 4) != PT_INTERP)
}

/// A root filesystem: busybox-static with a link per applet, and an
/// os-release that names the image.
pub fn rootfs(dir: &Path) -> PathBuf {
    let busybox = require_tools();
    let root = dir.join("rootfs");
    std::fs::create_dir_all(root.join("bin")).unwrap();
    std::fs::create_dir_all(root.join("etc")).unwrap();
    std::fs::copy(&busybox, root.join("bin/busybox")).unwrap();
    let list = std::process::Command::new(&busybox)
        .arg("--list")
        .output()
        .unwrap();
    for applet in String::from_utf8_lossy(&list.stdout).lines() {
        if applet != "busybox" {
            std::os::unix::fs::symlink("busybox", root.join("bin").join(applet)).unwrap();
        }
    }
    std::fs::write(
        root.join("etc/os-release"),
        format!("NAME=\"{IMAGE_NAME}\"\nID=gpuq-test\n"),
    )
    .unwrap();
    root
}

/// Packs `rootfs` into an OCI image layout at `dir/layout`: one gzip layer,
/// a config with the image's `Env` and an `Entrypoint` that says
/// `ENTRY=yes` before it runs its arguments, a manifest and `index.json`.
pub fn layout(dir: &Path, rootfs: &Path) -> PathBuf {
    let out = dir.join("layout");
    let blobs = out.join("blobs/sha256");
    std::fs::create_dir_all(&blobs).unwrap();
    let put = |bytes: &[u8]| {
        let hex = hex::encode(Sha256::digest(bytes));
        std::fs::write(blobs.join(&hex), bytes).unwrap();
        serde_json::json!({"digest": format!("sha256:{hex}"), "size": bytes.len()})
    };
    let mut tar = tar::Builder::new(Vec::new());
    tar.follow_symlinks(false);
    tar.append_dir_all(".", rootfs).unwrap();
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    gz.write_all(&tar.into_inner().unwrap()).unwrap();
    let mut layer = put(&gz.finish().unwrap());
    layer["mediaType"] = "application/vnd.oci.image.layer.v1.tar+gzip".into();
    let arch = match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        other => other,
    };
    let config = serde_json::json!({"architecture": arch, "os": "linux",
        "config": {"Env": ["PATH=/bin", "FROM_IMAGE=yes"],
            "Entrypoint": ["/bin/sh", "-c", "echo ENTRY=yes; exec \"$@\"", "entry"]},
        "rootfs": {"type": "layers", "diff_ids": []}});
    let mut config = put(config.to_string().as_bytes());
    config["mediaType"] = "application/vnd.oci.image.config.v1+json".into();
    let manifest = serde_json::json!({"schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": config, "layers": [layer]});
    let mut manifest = put(manifest.to_string().as_bytes());
    manifest["mediaType"] = "application/vnd.oci.image.manifest.v1+json".into();
    let index = serde_json::json!({"schemaVersion": 2, "manifests": [manifest]});
    std::fs::write(out.join("index.json"), index.to_string()).unwrap();
    std::fs::write(out.join("oci-layout"), r#"{"imageLayoutVersion":"1.0.0"}"#).unwrap();
    out
}

/// A tar of everything under `dir` (`tar -C dir -cf out .`).
pub fn tar_of(dir: &Path, out: &Path) {
    let mut tar = tar::Builder::new(std::fs::File::create(out).unwrap());
    tar.follow_symlinks(false);
    tar.append_dir_all(".", dir).unwrap();
    tar.finish().unwrap();
}

/// `layout` as an OCI archive (what `skopeo copy ... oci-archive:` writes).
pub fn oci_archive(dir: &Path, layout: &Path) -> PathBuf {
    let out = dir.join("image-oci.tar");
    tar_of(layout, &out);
    out
}

/// `rootfs` as a classic `docker save` archive: one plain layer tar, a
/// config naming it by its diff_id, and manifest.json.
pub fn docker_archive(dir: &Path, rootfs: &Path, name: &str) -> PathBuf {
    let save = dir.join(format!("{name}-save"));
    let layer_dir = save.join("0123abcd");
    std::fs::create_dir_all(&layer_dir).unwrap();
    let mut layer = tar::Builder::new(Vec::new());
    layer.follow_symlinks(false);
    layer.append_dir_all(".", rootfs).unwrap();
    let layer = layer.into_inner().unwrap();
    std::fs::write(layer_dir.join("layer.tar"), &layer).unwrap();
    let diff_id = format!("sha256:{}", hex::encode(Sha256::digest(&layer)));
    let config = serde_json::json!({"architecture": "amd64", "os": "linux",
        "config": {"Env": ["PATH=/bin", "FROM_IMAGE=yes", "LANG=image", format!("TAG={name}")]},
        "rootfs": {"type": "layers", "diff_ids": [diff_id]}})
    .to_string();
    let name = format!("{}.json", hex::encode(Sha256::digest(config.as_bytes())));
    std::fs::write(save.join(&name), &config).unwrap();
    let manifest = serde_json::json!([{"Config": name, "RepoTags": ["tiny:latest"],
        "Layers": ["0123abcd/layer.tar"]}]);
    std::fs::write(save.join("manifest.json"), manifest.to_string()).unwrap();
    let out = dir.join(format!("{name}.tar"));
    tar_of(&save, &out);
    out
}

/// `rootfs` as a squashfs file (enroot's `.sqsh`), made with mksquashfs.
pub fn squashfs(dir: &Path, rootfs: &Path) -> PathBuf {
    let out = dir.join("image.sqsh");
    let made = std::process::Command::new("mksquashfs")
        .arg(rootfs)
        .arg(&out)
        .args(["-noappend", "-no-progress", "-quiet"])
        .status()
        .expect("mksquashfs is missing: install squashfs-tools, as .ci/run does");
    assert!(made.success());
    out
}

/// `rootfs` as apptainer builds an image: its environment scripts and
/// exec action in `/.singularity.d` (the environment sets FROM_SIF=yes
/// and puts /opt/sif/bin first in PATH), squashed, in a SIF file at
/// `dir/NAME.sif` whose primary system partition is the squashfs
/// (`fs_type` 1; 5 says it is encrypted). The SIF layout: a 128-byte
/// header, 48 descriptors of 585 bytes from offset 4096, then the data.
pub fn sif(dir: &Path, rootfs: &Path, name: &str, fs_type: i32) -> PathBuf {
    let tree = dir.join(format!("{name}-tree"));
    let copied = std::process::Command::new("cp")
        .arg("-a")
        .arg(rootfs)
        .arg(&tree)
        .status()
        .unwrap();
    assert!(copied.success());
    let sd = tree.join(".singularity.d");
    std::fs::create_dir_all(sd.join("env")).unwrap();
    std::fs::create_dir_all(sd.join("actions")).unwrap();
    std::fs::write(
        sd.join("env/90-environment.sh"),
        "export FROM_SIF=yes\nexport PATH=/opt/sif/bin:$PATH\n",
    )
    .unwrap();
    let exec = sd.join("actions/exec");
    std::fs::write(
        &exec,
        "#!/bin/sh\nfor s in /.singularity.d/env/*.sh; do . \"$s\"; done\nexec \"$@\"\n",
    )
    .unwrap();
    std::fs::set_permissions(&exec, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let sqsh = dir.join(format!("{name}.sqsh"));
    let made = std::process::Command::new("mksquashfs")
        .arg(&tree)
        .arg(&sqsh)
        .args(["-noappend", "-no-progress", "-quiet"])
        .status()
        .unwrap();
    assert!(made.success());
    let data = std::fs::read(&sqsh).unwrap();
    const DESCRIPTOR: usize = 585;
    let data_at = 4096 + 48 * DESCRIPTOR;
    let mut out = vec![0u8; data_at];
    out[..31].copy_from_slice(b"#!/usr/bin/env run-singularity\n");
    out[32..41].copy_from_slice(b"SIF_MAGIC");
    out[42..44].copy_from_slice(b"01");
    out[45..47].copy_from_slice(b"02");
    let put =
        |out: &mut Vec<u8>, at: usize, v: i64| out[at..at + 8].copy_from_slice(&v.to_le_bytes());
    put(&mut out, 80, 47);
    put(&mut out, 88, 48);
    put(&mut out, 96, 4096);
    put(&mut out, 104, DESCRIPTOR as i64);
    put(&mut out, 112, data_at as i64);
    put(&mut out, 120, data.len() as i64);
    let d = 4096;
    out[d..d + 4].copy_from_slice(&0x4004i32.to_le_bytes());
    out[d + 4] = 1;
    out[d + 5..d + 9].copy_from_slice(&1u32.to_le_bytes());
    put(&mut out, d + 17, data_at as i64);
    put(&mut out, d + 25, data.len() as i64);
    out[d + 201..d + 205].copy_from_slice(&fs_type.to_le_bytes());
    out[d + 205..d + 209].copy_from_slice(&2i32.to_le_bytes());
    out.extend_from_slice(&data);
    let file = dir.join(format!("{name}.sif"));
    std::fs::write(&file, out).unwrap();
    file
}

/// `KEY=VALUE` lines of a task's output.
pub fn vars(text: &str) -> std::collections::BTreeMap<String, String> {
    text.lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// How many images the node unpacked (its cache's record).
pub fn unpacks(agent: &Agent) -> usize {
    std::fs::read_to_string(agent.dir.join("data/images/unpacks.log"))
        .map(|t| t.lines().count())
        .unwrap_or(0)
}

pub fn alive(pid: i32) -> bool {
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None).is_ok()
}
