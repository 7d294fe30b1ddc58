//! Container images on a node: what `--container-image` names, resolved
//! to a root filesystem the task runs in.
//!
//! The image is an OCI image layout (`index.json`, `blobs/sha256/...`, as
//! skopeo and umoci write it), a plain root filesystem directory (used as it
//! is), a tar archive of a layout (`skopeo copy ... oci-archive:`) or of a
//! `docker save` (`image_archive`), a squashfs file (enroot's `.sqsh`,
//! unpacked with `unsquashfs`), or a registry reference `docker://REF`
//! pulled with skopeo (`image_tools`). All but a plain directory are
//! unpacked once per node into the cache (`image_cache`), keyed by digest:
//! the same image in two places is one unpack.
//!
//! Every file of the image is opened through the caller's `open` (the
//! shim opens them with the job user's file system identity: a user cannot
//! have root read what they may not), and every blob is checked against
//! its digest while it is read, so the cache, shared by all users, only
//! ever holds what the digests say.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{self, Read};
use std::path::Path;

use serde::Deserialize;

use super::image_cache::Cache;
use super::image_files::{
    hex_of, parse, read_limited, Files, Hashing, ImageConfig, Resolved, MAX_JSON,
};
use super::unpack::Root;

/// Opens a file of the image (as the job's user, in the shim).
pub type Open<'a> = &'a dyn Fn(&Path) -> io::Result<File>;

/// A layout directory, its files opened through `open`.
struct Dir<'a> {
    root: &'a Path,
    open: Open<'a>,
}

impl Files for Dir<'_> {
    fn open(&self, rel: &str) -> io::Result<Box<dyn Read + '_>> {
        Ok(Box::new((self.open)(&self.root.join(rel))?))
    }
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

/// Resolves `image` for a task: an image is unpacked into `cache` unless
/// it is there already; a root filesystem directory is used as it is.
/// Errors are sentences naming the image and what to do.
pub fn resolve(
    image: &Path,
    cache: &Cache,
    pull: &super::task::Pull,
    open: Open<'_>,
) -> Result<Resolved, String> {
    let shown = image.display().to_string();
    if let Some(reference) = shown.strip_prefix(crate::model::REGISTRY_SCHEME) {
        // Held until the image is unpacked from the layout.
        let (layout, _hold) = super::image_tools::pull(reference, &cache.dir, pull)?;
        let plain = |p: &Path| File::open(p);
        let files = Dir {
            root: &layout,
            open: &plain,
        };
        return from_layout(&files, &shown, cache);
    }
    match open(&image.join("index.json")) {
        Ok(_) => {
            let files = Dir { root: image, open };
            from_layout(&files, &shown, cache)
        }
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => plain_rootfs(image, open),
        Err(e) if e.raw_os_error() == Some(libc::ENOTDIR) => {
            let file =
                open(image).map_err(|e| format!("cannot read container image {shown}: {e}"))?;
            from_file(file, &shown, cache)
        }
        Err(e) => Err(format!("cannot read container image {shown}: {e}")),
    }
}

/// A file: a squashfs image, a SIF image (apptainer's), or a tar archive
/// of a layout or a `docker save`.
fn from_file(file: File, shown: &str, cache: &Cache) -> Result<Resolved, String> {
    use std::os::unix::fs::FileExt;
    let mut head = [0u8; 64];
    let n = file
        .read_at(&mut head, 0)
        .map_err(|e| format!("cannot read container image {shown}: {e}"))?;
    if n >= 4 && &head[..4] == b"hsqs" {
        return super::image_tools::squashfs(file, shown, cache, 0);
    }
    // Apptainer's: its root file system is a squashfs inside.
    if super::image_sif::is_sif(&head[..n]) {
        let (offset, _) = super::image_sif::root_partition(&file, shown)?;
        return super::image_tools::squashfs(file, shown, cache, offset);
    }
    let archive = super::image_archive::Archive::scan(file).map_err(|e| {
        format!(
            "container image {shown} is a file and neither a squashfs image nor a readable \
             tar archive ({e}); give an OCI archive (skopeo copy ... oci-archive:PATH), a \
             docker save archive, a .sqsh file or an image directory"
        )
    })?;
    if archive.has("index.json") {
        from_layout(&archive, shown, cache)
    } else if archive.has("manifest.json") {
        super::image_archive::from_docker(&archive, shown, cache)
    } else {
        Err(format!(
            "container image {shown} is a tar archive without index.json (an OCI archive) \
             or manifest.json (a docker save archive); it is no image"
        ))
    }
}

/// An OCI image layout, in a directory or an archive.
fn from_layout(files: &dyn Files, shown: &str, cache: &Cache) -> Result<Resolved, String> {
    let index = files
        .open("index.json")
        .map_err(|e| format!("cannot read container image {shown}: {e}"))?;
    let index: Index = parse(
        read_limited(index, MAX_JSON),
        &format!("{shown}: its index.json"),
    )?;
    let mut chosen = pick(&index.manifests, oci_arch())
        .map_err(|why| format!("container image {shown}: {why}"))?;
    // One level of nested index (a multi-platform image).
    if INDEX_TYPES.contains(&chosen.media_type.as_str()) {
        let nested: Index = parse(read_blob(files, &chosen), "its nested index")?;
        chosen = pick(&nested.manifests, oci_arch())
            .map_err(|why| format!("container image {shown}: {why}"))?;
    }
    let manifest: Manifest = parse(read_blob(files, &chosen), "its manifest")
        .map_err(|e| format!("container image {shown}: {e}"))?;
    let config: ImageConfig = parse(read_blob(files, &manifest.config), "its config")
        .map_err(|e| format!("container image {shown}: {e}"))?;
    let hex = hex_of(&chosen.digest).map_err(|e| format!("container image {shown}: {e}"))?;
    let (env, entrypoint) = config.run();
    let entry = cache.entry(hex, shown, |rootfs| {
        unpack_layers(files, &manifest.layers, rootfs)
    })?;
    Ok(Resolved {
        rootfs: entry.dir.join("rootfs"),
        users: false,
        env,
        entrypoint,
        unpacked: entry.unpacked,
        lease: Some(entry.lease),
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
        entrypoint: Vec::new(),
        unpacked: false,
        lease: None,
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

/// Reads what is left of `blob` and checks its digest and size.
fn verify<R: Read>(blob: Hashing<R>, d: &Descriptor) -> Result<(), String> {
    let read = blob.read;
    let got = blob
        .finish()
        .map_err(|e| format!("cannot read blob {}: {e}", d.digest))?;
    if got != d.digest {
        return Err(format!(
            "blob {} is damaged: its content hashes to {got}",
            d.digest
        ));
    }
    if d.size.is_some_and(|s| s != read) {
        return Err(format!(
            "blob {} has {} bytes, not {:?}",
            d.digest, read, d.size
        ));
    }
    Ok(())
}

fn open_blob<'a>(
    files: &'a dyn Files,
    d: &Descriptor,
) -> Result<Hashing<Box<dyn Read + 'a>>, String> {
    let hex = hex_of(&d.digest)?;
    let rel = format!("blobs/sha256/{hex}");
    let file = files
        .open(&rel)
        .map_err(|e| format!("cannot read blob {rel}: {e}"))?;
    Ok(Hashing::new(file))
}

/// A small blob (JSON), checked against its digest.
fn read_blob(files: &dyn Files, d: &Descriptor) -> Result<Vec<u8>, String> {
    let mut blob = open_blob(files, d)?;
    let mut bytes = Vec::new();
    (&mut blob)
        .take(MAX_JSON + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| format!("cannot read blob {}: {e}", d.digest))?;
    if bytes.len() as u64 > MAX_JSON {
        return Err(format!("blob {} is larger than {MAX_JSON} bytes", d.digest));
    }
    verify(blob, d)?;
    Ok(bytes)
}

/// Applies the layers in order to `rootfs`, each checked against its digest.
fn unpack_layers(files: &dyn Files, layers: &[Descriptor], rootfs: &Path) -> Result<(), String> {
    let mut root =
        Root::open(rootfs).map_err(|e| format!("cannot open {}: {e}", rootfs.display()))?;
    for d in layers {
        let mut blob = open_blob(files, d)?;
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
        verify(blob, d)?;
        applied?;
    }
    Ok(())
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use crate::agent::exec::image_cache::UNPACK_LOG;
    use sha2::{Digest, Sha256};
    use std::fs;
    use std::io::Write;

    /// An uncapped cache in `dir/cache`.
    pub fn test_cache(dir: &Path) -> Cache {
        Cache {
            dir: dir.join("cache"),
            max_bytes: 0,
        }
    }

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
        let cache = test_cache(dir.path());
        let first = resolve(&layout, &cache, &Default::default(), &plain_open).unwrap();
        assert!(first.unpacked && !first.users);
        assert_eq!(first.env, ["PATH=/bin", "A=1"]);
        let hex = digest.strip_prefix("sha256:").unwrap();
        assert_eq!(first.rootfs, cache.dir.join(hex).join("rootfs"));
        assert_eq!(
            fs::read_to_string(first.rootfs.join("etc/os-release")).unwrap(),
            "NAME=tiny\n"
        );
        let again = resolve(&layout, &cache, &Default::default(), &plain_open).unwrap();
        assert!(!again.unpacked);
        assert_eq!(again.rootfs, first.rootfs);
        let log = fs::read_to_string(cache.dir.join(UNPACK_LOG)).unwrap();
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
        let cache = test_cache(dir.path());
        let err = resolve(&layout, &cache, &Default::default(), &plain_open).unwrap_err();
        assert!(err.contains("damaged"), "{err}");
        let left: Vec<_> = fs::read_dir(&cache.dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .filter(|n| !n.ends_with(".lock"))
            .collect();
        assert!(left.is_empty(), "{left:?}");
    }

    #[test]
    fn a_plain_directory_is_used_as_it_is_and_anything_else_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let cache = test_cache(dir.path());
        let rootfs = dir.path().join("rootfs");
        fs::create_dir_all(rootfs.join("bin")).unwrap();
        let r = resolve(&rootfs, &cache, &Default::default(), &plain_open).unwrap();
        assert_eq!(
            (r.rootfs.as_path(), r.users, r.unpacked),
            (rootfs.as_path(), true, false)
        );

        let missing = dir.path().join("nope");
        let err = resolve(&missing, &cache, &Default::default(), &plain_open).unwrap_err();
        assert!(
            err.contains("does not exist") && err.contains("nope"),
            "{err}"
        );
        let empty = dir.path().join("empty");
        fs::create_dir(&empty).unwrap();
        let err = resolve(&empty, &cache, &Default::default(), &plain_open).unwrap_err();
        assert!(err.contains("is not an image"), "{err}");
        let file = dir.path().join("image.tar");
        fs::write(&file, "x").unwrap();
        let err = resolve(&file, &cache, &Default::default(), &plain_open).unwrap_err();
        assert!(
            err.contains("neither a squashfs image nor a readable tar archive"),
            "{err}"
        );
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
