//! Container images on a node: what `--container-image PATH` names, and
//! the per-node cache of unpacked OCI images.
//!
//! PATH is either an OCI image layout (`index.json`, `blobs/sha256/...`,
//! as skopeo and umoci write it) or a plain root filesystem directory, used
//! as it is. A layout is unpacked once per node into
//! `<cache>/<manifest hex>/rootfs`, keyed by its manifest's digest: the
//! same image in two layouts is one unpack. An exclusive `flock` on
//! `<cache>/<hex>.lock` makes concurrent tasks with the same image wait for
//! one unpack instead of racing; the unpack goes to a staging directory
//! renamed into place when whole, so a crash leaves nothing that passes for
//! an image. Each unpack appends a line to `<cache>/unpacks.log`.
//!
//! Every file of the layout is opened through the caller's `open` (the
//! shim opens them with the job user's file system identity: a user cannot
//! have root read what they may not), and every blob is checked against
//! its digest while it is read, so the cache, shared by all users, only
//! ever holds what the digests say.

use std::collections::BTreeMap;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use serde::Deserialize;
use sha2::{Digest, Sha256};

use super::unpack::Root;

/// How large `index.json`, a manifest or an image config may be.
const MAX_JSON: u64 = 4 << 20;
/// The record of unpacks in the cache directory.
pub const UNPACK_LOG: &str = "unpacks.log";

/// Opens a file of the image (as the job's user, in the shim).
pub type Open<'a> = &'a dyn Fn(&Path) -> io::Result<File>;

/// What the task's root filesystem is made from.
#[derive(Debug, PartialEq, Eq)]
pub struct Resolved {
    /// The directory that becomes the container's root (read-only, below a
    /// per-task writable layer).
    pub rootfs: PathBuf,
    /// Whether `rootfs` is the user's own directory (open it as the user)
    /// rather than the node's cache.
    pub users: bool,
    /// The image's `Env` (`KEY=VALUE`), empty for a plain directory.
    pub env: Vec<String>,
    /// Whether this call unpacked the image (a cache miss).
    pub unpacked: bool,
}

/// `oci-layout`'s descriptors, manifests and configs: only what is used.
#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Descriptor {
    #[serde(default)]
    media_type: String,
    digest: String,
    #[serde(default)]
    size: Option<u64>,
    #[serde(default)]
    platform: Option<Platform>,
    #[serde(default)]
    annotations: BTreeMap<String, String>,
}

#[derive(Clone, Debug, Deserialize)]
struct Platform {
    architecture: String,
    os: String,
}

#[derive(Debug, Deserialize)]
struct Index {
    #[serde(default)]
    manifests: Vec<Descriptor>,
}

#[derive(Debug, Deserialize)]
struct Manifest {
    config: Descriptor,
    #[serde(default)]
    layers: Vec<Descriptor>,
}

#[derive(Debug, Default, Deserialize)]
struct ImageConfig {
    #[serde(default)]
    config: Option<RunConfig>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "PascalCase")]
struct RunConfig {
    #[serde(default)]
    env: Option<Vec<String>>,
}

const INDEX_TYPES: [&str; 2] = [
    "application/vnd.oci.image.index.v1+json",
    "application/vnd.docker.distribution.manifest.list.v2+json",
];

/// This machine's architecture as OCI names it.
pub fn oci_arch() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        "powerpc64" => "ppc64le",
        other => other,
    }
}

/// Resolves `image` for a task: a layout is unpacked into `cache` unless it
/// is there already; a root filesystem directory is used as it is. Errors
/// are sentences naming the path and what to do.
pub fn resolve(image: &Path, cache: &Path, open: Open<'_>) -> Result<Resolved, String> {
    let shown = image.display();
    let index = match open(&image.join("index.json")) {
        Ok(f) => Some(f),
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => None,
        Err(e) if e.raw_os_error() == Some(libc::ENOTDIR) => {
            return Err(format!(
                "container image {shown} is a file; archives and squashfs images are not \
                 supported yet: give an OCI image layout directory or a root filesystem \
                 directory"
            ))
        }
        Err(e) => return Err(format!("cannot read container image {shown}: {e}")),
    };
    let Some(index) = index else {
        return plain_rootfs(image, open);
    };
    let index: Index = parse(
        read_limited(index, MAX_JSON),
        &format!("{shown}/index.json"),
    )?;
    let mut chosen = pick(&index.manifests, oci_arch())
        .map_err(|why| format!("container image {shown}: {why}"))?;
    // One level of nested index (a multi-platform image).
    if INDEX_TYPES.contains(&chosen.media_type.as_str()) {
        let nested: Index = parse(read_blob(image, &chosen, open), "its nested index")?;
        chosen = pick(&nested.manifests, oci_arch())
            .map_err(|why| format!("container image {shown}: {why}"))?;
    }
    let manifest: Manifest = parse(read_blob(image, &chosen, open), "its manifest")
        .map_err(|e| format!("container image {shown}: {e}"))?;
    let config: ImageConfig = parse(read_blob(image, &manifest.config, open), "its config")
        .map_err(|e| format!("container image {shown}: {e}"))?;
    let hex = hex_of(&chosen.digest).map_err(|e| format!("container image {shown}: {e}"))?;
    let (entry, unpacked) = cached(cache, hex, image, |rootfs| {
        unpack_layers(image, &manifest.layers, rootfs, open)
    })?;
    Ok(Resolved {
        rootfs: entry.join("rootfs"),
        users: false,
        env: config.config.and_then(|c| c.env).unwrap_or_default(),
        unpacked,
    })
}

/// A directory without `index.json`: a root filesystem if it looks like one.
fn plain_rootfs(image: &Path, open: Open<'_>) -> Result<Resolved, String> {
    let shown = image.display();
    match open(image) {
        Ok(_) => {}
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {
            return Err(format!(
                "container image {shown} does not exist on node {}; give a path every node \
                 of the job can read",
                super::task::hostname()
            ))
        }
        Err(e) => return Err(format!("cannot read container image {shown}: {e}")),
    }
    let looks_like_root = ["bin", "usr", "etc"]
        .iter()
        .any(|d| open(&image.join(d)).is_ok());
    if !looks_like_root {
        return Err(format!(
            "container image {shown} is not an image: it has no index.json (an OCI image \
             layout) and no bin, usr or etc (a root filesystem)"
        ));
    }
    Ok(Resolved {
        rootfs: image.to_path_buf(),
        users: true,
        env: Vec::new(),
        unpacked: false,
    })
}

/// The manifest to run: the only one, or the one for this platform.
fn pick(manifests: &[Descriptor], arch: &str) -> Result<Descriptor, String> {
    match manifests {
        [] => Err("its index.json lists no image".into()),
        [one] => Ok(one.clone()),
        many => {
            let here: Vec<&Descriptor> = many
                .iter()
                .filter(|d| {
                    d.platform
                        .as_ref()
                        .is_some_and(|p| p.os == "linux" && p.architecture == arch)
                })
                .collect();
            match here.as_slice() {
                [one] => Ok((*one).clone()),
                _ => {
                    let names: Vec<&str> = many
                        .iter()
                        .map(|d| {
                            d.annotations
                                .get("org.opencontainers.image.ref.name")
                                .map_or(d.digest.as_str(), String::as_str)
                        })
                        .collect();
                    Err(format!(
                        "its index.json lists {} images ({}) and not one for linux/{arch}; \
                         keep one image per layout directory",
                        many.len(),
                        names.join(", ")
                    ))
                }
            }
        }
    }
}

/// The hex of a `sha256:` digest, refused unless it is exactly that (a
/// digest names a file under `blobs/`, so it must not name anything else).
fn hex_of(digest: &str) -> Result<&str, String> {
    let hex = digest
        .strip_prefix("sha256:")
        .ok_or_else(|| format!("digest {digest:?} is not sha256, the only algorithm supported"))?;
    if hex.len() != 64
        || !hex
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    {
        return Err(format!("digest {digest:?} is malformed"));
    }
    Ok(hex)
}

fn parse<T: for<'de> Deserialize<'de>>(
    bytes: Result<Vec<u8>, String>,
    what: &str,
) -> Result<T, String> {
    let bytes = bytes?;
    serde_json::from_slice(&bytes).map_err(|e| format!("{what} is not valid: {e}"))
}

fn read_limited(file: File, limit: u64) -> Result<Vec<u8>, String> {
    let mut bytes = Vec::new();
    file.take(limit + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| format!("cannot read it: {e}"))?;
    if bytes.len() as u64 > limit {
        return Err(format!("it is larger than {limit} bytes"));
    }
    Ok(bytes)
}

/// A reader that hashes what passes through it.
struct Hashing<R> {
    inner: R,
    hash: Sha256,
    read: u64,
}

impl<R: Read> Read for Hashing<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.hash.update(&buf[..n]);
        self.read += n as u64;
        Ok(n)
    }
}

impl<R: Read> Hashing<R> {
    /// Reads what is left and checks the digest and size.
    fn verify(mut self, d: &Descriptor) -> Result<(), String> {
        io::copy(&mut self, &mut io::sink())
            .map_err(|e| format!("cannot read blob {}: {e}", d.digest))?;
        let got = format!("sha256:{}", hex::encode(self.hash.finalize()));
        if got != d.digest {
            return Err(format!(
                "blob {} is damaged: its content hashes to {got}",
                d.digest
            ));
        }
        if d.size.is_some_and(|s| s != self.read) {
            return Err(format!(
                "blob {} has {} bytes, not {:?}",
                d.digest, self.read, d.size
            ));
        }
        Ok(())
    }
}

fn open_blob(layout: &Path, d: &Descriptor, open: Open<'_>) -> Result<Hashing<File>, String> {
    let hex = hex_of(&d.digest)?;
    let path = layout.join("blobs/sha256").join(hex);
    let file = open(&path).map_err(|e| format!("cannot read blob {}: {e}", path.display()))?;
    Ok(Hashing {
        inner: file,
        hash: Sha256::new(),
        read: 0,
    })
}

/// A small blob (JSON), checked against its digest.
fn read_blob(layout: &Path, d: &Descriptor, open: Open<'_>) -> Result<Vec<u8>, String> {
    let mut blob = open_blob(layout, d, open)?;
    let mut bytes = Vec::new();
    (&mut blob)
        .take(MAX_JSON + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| format!("cannot read blob {}: {e}", d.digest))?;
    if bytes.len() as u64 > MAX_JSON {
        return Err(format!("blob {} is larger than {MAX_JSON} bytes", d.digest));
    }
    blob.verify(d)?;
    Ok(bytes)
}

/// Applies the layers in order to `rootfs`, each checked against its digest.
fn unpack_layers(
    layout: &Path,
    layers: &[Descriptor],
    rootfs: &Path,
    open: Open<'_>,
) -> Result<(), String> {
    let mut root =
        Root::open(rootfs).map_err(|e| format!("cannot open {}: {e}", rootfs.display()))?;
    for d in layers {
        let mut blob = open_blob(layout, d, open)?;
        let t = d.media_type.as_str();
        let result = if t.ends_with("+gzip") || t.ends_with(".tar.gzip") {
            root.apply(flate2::read::GzDecoder::new(&mut blob))
        } else if t.ends_with(".tar") || t.is_empty() {
            root.apply(&mut blob)
        } else {
            return Err(format!(
                "layer {} has media type {t}, which gpuq cannot unpack yet (tar and tar+gzip \
                 only)",
                d.digest
            ));
        };
        // A damaged blob says so, rather than what the tar reader made of it.
        let applied = result.map_err(|e| format!("layer {}: {e}", d.digest));
        blob.verify(d)?;
        applied?;
    }
    Ok(())
}

/// The cache entry `<cache>/<hex>` of an image, made by `unpack` (given the
/// staging `rootfs` to fill) unless it exists; also whether this call made
/// it. One unpack per entry at a time, however many tasks ask.
fn cached(
    cache: &Path,
    hex: &str,
    source: &Path,
    unpack: impl FnOnce(&Path) -> Result<(), String>,
) -> Result<(PathBuf, bool), String> {
    let fail = |what: &str, path: &Path, e: io::Error| {
        format!("cannot {what} {} of the image cache: {e}", path.display())
    };
    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(cache)
        .map_err(|e| fail("create", cache, e))?;
    let entry = cache.join(hex);
    if entry.join("rootfs").is_dir() {
        return Ok((entry, false));
    }
    let lock_path = cache.join(format!("{hex}.lock"));
    let lock = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .mode(0o600)
        .open(&lock_path)
        .map_err(|e| fail("open", &lock_path, e))?;
    // SAFETY: flock on a descriptor this function owns; released on close.
    if unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX) } < 0 {
        return Err(fail("lock", &lock_path, io::Error::last_os_error()));
    }
    // Another task may have unpacked it while this one waited.
    if entry.join("rootfs").is_dir() {
        return Ok((entry, false));
    }
    let started = std::time::Instant::now();
    let staging = cache.join(format!("{hex}.unpacking"));
    if staging.exists() {
        // Left by a shim that died mid-unpack; nobody else holds the lock.
        fs::remove_dir_all(&staging).map_err(|e| fail("clear", &staging, e))?;
    }
    let rootfs = staging.join("rootfs");
    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(&rootfs)
        .map_err(|e| fail("create", &rootfs, e))?;
    if let Err(e) = unpack(&rootfs) {
        let _ = fs::remove_dir_all(&staging);
        return Err(format!(
            "cannot unpack container image {}: {e}",
            source.display()
        ));
    }
    use std::os::unix::fs::PermissionsExt;
    let _ = fs::set_permissions(&rootfs, fs::Permissions::from_mode(0o755));
    fs::rename(&staging, &entry).map_err(|e| fail("finish", &entry, e))?;
    let line = format!(
        "{} sha256:{hex} {} {}ms\n",
        crate::clock::now_ms(),
        source.display(),
        started.elapsed().as_millis()
    );
    let log = cache.join(UNPACK_LOG);
    if let Err(e) = OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o600)
        .open(&log)
        .and_then(|mut f| f.write_all(line.as_bytes()))
    {
        tracing::warn!("cannot record the unpack in {}: {e}", log.display());
    }
    tracing::info!(image = %source.display(), digest = %format!("sha256:{hex}"), "image unpacked");
    Ok((entry, true))
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    /// Writes an OCI image layout of `files` (path, content; a path ending
    /// in `/` a directory) in one gzip layer, as `skopeo copy` would, and
    /// returns the manifest's digest.
    pub fn write_layout(dir: &Path, files: &[(&str, &str)], env: &[&str]) -> String {
        let mut tar = tar::Builder::new(Vec::new());
        for (path, content) in files {
            let mut h = tar::Header::new_gnu();
            h.set_mode(0o755);
            h.set_uid(0);
            h.set_gid(0);
            h.set_mtime(0);
            h.set_size(content.len() as u64);
            h.set_entry_type(if path.ends_with('/') {
                tar::EntryType::Directory
            } else {
                tar::EntryType::Regular
            });
            tar.append_data(&mut h, path, content.as_bytes()).unwrap();
        }
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        gz.write_all(&tar.into_inner().unwrap()).unwrap();
        let layer = gz.finish().unwrap();
        let blobs = dir.join("blobs/sha256");
        fs::create_dir_all(&blobs).unwrap();
        let put = |bytes: &[u8]| {
            let hex = hex::encode(Sha256::digest(bytes));
            fs::write(blobs.join(&hex), bytes).unwrap();
            (format!("sha256:{hex}"), bytes.len())
        };
        let (layer_digest, layer_size) = put(&layer);
        let config = serde_json::json!({"architecture": oci_arch(), "os": "linux",
            "config": {"Env": env}, "rootfs": {"type": "layers", "diff_ids": []}});
        let (config_digest, config_size) = put(config.to_string().as_bytes());
        let manifest = serde_json::json!({"schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                       "digest": config_digest, "size": config_size},
            "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip",
                        "digest": layer_digest, "size": layer_size}]});
        let (manifest_digest, manifest_size) = put(manifest.to_string().as_bytes());
        let index = serde_json::json!({"schemaVersion": 2, "manifests": [
            {"mediaType": "application/vnd.oci.image.manifest.v1+json",
             "digest": manifest_digest, "size": manifest_size,
             "annotations": {"org.opencontainers.image.ref.name": "latest"}}]});
        fs::write(dir.join("index.json"), index.to_string()).unwrap();
        fs::write(dir.join("oci-layout"), r#"{"imageLayoutVersion":"1.0.0"}"#).unwrap();
        manifest_digest
    }

    fn plain_open(p: &Path) -> io::Result<File> {
        File::open(p)
    }

    #[test]
    fn a_layout_is_unpacked_once_and_then_found_in_the_cache() {
        let dir = tempfile::tempdir().unwrap();
        let layout = dir.path().join("layout");
        let digest = write_layout(
            &layout,
            &[("etc/", ""), ("etc/os-release", "NAME=tiny\n")],
            &["PATH=/bin", "A=1"],
        );
        let cache = dir.path().join("cache");
        let first = resolve(&layout, &cache, &plain_open).unwrap();
        assert!(first.unpacked && !first.users);
        assert_eq!(first.env, ["PATH=/bin", "A=1"]);
        let hex = digest.strip_prefix("sha256:").unwrap();
        assert_eq!(first.rootfs, cache.join(hex).join("rootfs"));
        assert_eq!(
            fs::read_to_string(first.rootfs.join("etc/os-release")).unwrap(),
            "NAME=tiny\n"
        );
        let again = resolve(&layout, &cache, &plain_open).unwrap();
        assert!(!again.unpacked);
        assert_eq!(again.rootfs, first.rootfs);
        let log = fs::read_to_string(cache.join(UNPACK_LOG)).unwrap();
        assert_eq!(log.lines().count(), 1, "{log}");
        assert!(log.contains(&digest));
    }

    #[test]
    fn a_damaged_blob_is_caught_by_its_digest_and_leaves_no_cache_entry() {
        let dir = tempfile::tempdir().unwrap();
        let layout = dir.path().join("layout");
        write_layout(&layout, &[("bin/", "")], &[]);
        // Replace the layer (the largest blob that is not JSON) with junk.
        let blobs = layout.join("blobs/sha256");
        for e in fs::read_dir(&blobs).unwrap() {
            let p = e.unwrap().path();
            if !fs::read(&p).unwrap().starts_with(b"{") {
                fs::write(&p, b"junk that is no gzip").unwrap();
            }
        }
        let cache = dir.path().join("cache");
        let err = resolve(&layout, &cache, &plain_open).unwrap_err();
        assert!(err.contains("damaged"), "{err}");
        let left: Vec<_> = fs::read_dir(&cache)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .filter(|n| !n.ends_with(".lock"))
            .collect();
        assert!(left.is_empty(), "{left:?}");
    }

    #[test]
    fn a_plain_directory_is_used_as_it_is_and_anything_else_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let cache = dir.path().join("cache");
        let rootfs = dir.path().join("rootfs");
        fs::create_dir_all(rootfs.join("bin")).unwrap();
        let r = resolve(&rootfs, &cache, &plain_open).unwrap();
        assert_eq!(
            (r.rootfs.as_path(), r.users, r.unpacked),
            (rootfs.as_path(), true, false)
        );

        let missing = dir.path().join("nope");
        let err = resolve(&missing, &cache, &plain_open).unwrap_err();
        assert!(
            err.contains("does not exist") && err.contains("nope"),
            "{err}"
        );
        let empty = dir.path().join("empty");
        fs::create_dir(&empty).unwrap();
        let err = resolve(&empty, &cache, &plain_open).unwrap_err();
        assert!(err.contains("is not an image"), "{err}");
        let file = dir.path().join("image.tar");
        fs::write(&file, "x").unwrap();
        let err = resolve(&file, &cache, &plain_open).unwrap_err();
        assert!(err.contains("is a file"), "{err}");
    }

    #[test]
    fn the_manifest_is_the_only_one_or_this_platforms() {
        let d = |digest: &str, arch: Option<&str>| Descriptor {
            media_type: String::new(),
            digest: digest.into(),
            size: None,
            platform: arch.map(|a| Platform {
                architecture: a.into(),
                os: "linux".into(),
            }),
            annotations: BTreeMap::new(),
        };
        assert_eq!(pick(&[d("a", None)], "amd64").unwrap().digest, "a");
        let both = [d("a", Some("arm64")), d("b", Some("amd64"))];
        assert_eq!(pick(&both, "amd64").unwrap().digest, "b");
        let err = pick(&[d("a", None), d("b", None)], "amd64").unwrap_err();
        assert!(
            err.contains("2 images") && err.contains("one image per layout"),
            "{err}"
        );
        assert!(pick(&[], "amd64").unwrap_err().contains("no image"));
        for bad in [
            "sha512:ab",
            "sha256:../../etc/passwd",
            &format!("sha256:{}", "A".repeat(64)),
        ] {
            assert!(hex_of(bad).is_err(), "{bad}");
        }
    }
}
