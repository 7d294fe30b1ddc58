//! Images as tar archives: an OCI archive (a layout in a tar, as `skopeo
//! copy ... oci-archive:` and newer `docker save` write it) or a classic
//! `docker save` archive (`manifest.json` naming a config and layer tars).
//!
//! The archive is read in place, never extracted whole: one pass over its
//! headers (seeking past the contents) finds where each member lies, and a
//! member is then read from there. So a start that finds the image in the
//! cache costs a walk over the headers, and an unpack reads each layer
//! once. A `docker save` image is keyed by its config's digest (docker's
//! image id, which names every layer by its `diff_id`), and each layer is
//! checked against its `diff_id` while it is applied. A damaged archive
//! fails the job naming it; the cache's staging keeps half an unpack from
//! ever passing for an image.

use std::collections::HashMap;
use std::fs::File;
use std::io::{self, BufRead, BufReader, Read, Seek, SeekFrom};
use std::path::{Component, Path};

use serde::Deserialize;
use sha2::{Digest, Sha256};

use super::image_cache::Cache;
use super::image_files::{
    hex_of, parse, read_limited, Files, Hashing, ImageConfig, Resolved, MAX_JSON,
};
use super::unpack::Root;

/// How many members an archive may have.
const MAX_MEMBERS: usize = 1 << 20;
/// How many links deep a member's name may lead.
const MAX_HOPS: usize = 8;

/// Where a member of the archive lies.
#[derive(Clone, Debug)]
enum Member {
    File {
        offset: u64,
        size: u64,
    },
    /// A symbolic or hard link, to this normalized name.
    Link(String),
}

/// A tar archive, its members found.
pub struct Archive {
    file: File,
    members: HashMap<String, Member>,
}

/// A member's name without `./`, a leading `/` or `..` (which climbs).
fn normalize(name: &Path) -> String {
    let mut parts: Vec<&std::ffi::OsStr> = Vec::new();
    for c in name.components() {
        match c {
            Component::Normal(n) => parts.push(n),
            Component::ParentDir => {
                parts.pop();
            }
            _ => {}
        }
    }
    parts
        .iter()
        .map(|p| p.to_string_lossy())
        .collect::<Vec<_>>()
        .join("/")
}

impl Archive {
    /// Walks the archive's headers; an error says what is wrong with it.
    pub fn scan(file: File) -> io::Result<Archive> {
        let mut members = HashMap::new();
        {
            let mut tar = tar::Archive::new(&file);
            for entry in tar.entries_with_seek()? {
                let entry = entry?;
                let name = normalize(&entry.path()?);
                let kind = entry.header().entry_type();
                let member = if kind.is_file() || kind == tar::EntryType::Continuous {
                    Member::File {
                        offset: entry.raw_file_position(),
                        size: entry.size(),
                    }
                } else if kind.is_symlink() || kind.is_hard_link() {
                    let Some(target) = entry.link_name()? else {
                        continue;
                    };
                    let target = match kind.is_symlink() {
                        true => Path::new(&name)
                            .parent()
                            .unwrap_or(Path::new(""))
                            .join(target),
                        false => target.into_owned(),
                    };
                    Member::Link(normalize(&target))
                } else {
                    continue;
                };
                members.insert(name, member);
                if members.len() > MAX_MEMBERS {
                    return Err(io::Error::other(format!(
                        "it has more than {MAX_MEMBERS} members"
                    )));
                }
            }
        }
        if members.is_empty() {
            return Err(io::Error::other("it holds no files"));
        }
        Ok(Archive { file, members })
    }

    /// Whether the archive has the file `name`.
    pub fn has(&self, name: &str) -> bool {
        self.members.contains_key(name)
    }

    fn find(&self, name: &str) -> io::Result<(u64, u64)> {
        let mut name = name.to_string();
        for _ in 0..MAX_HOPS {
            match self.members.get(&name) {
                Some(Member::File { offset, size }) => return Ok((*offset, *size)),
                Some(Member::Link(to)) => name = to.clone(),
                None => break,
            }
        }
        Err(io::Error::new(
            io::ErrorKind::NotFound,
            format!("the archive has no file {name}"),
        ))
    }
}

impl Files for Archive {
    fn open(&self, rel: &str) -> io::Result<Box<dyn Read + '_>> {
        let (offset, size) = self.find(rel)?;
        let mut file = &self.file;
        file.seek(SeekFrom::Start(offset))?;
        Ok(Box::new(file.take(size)))
    }
}

/// One image of a `docker save` archive's `manifest.json`.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "PascalCase")]
struct DockerImage {
    config: String,
    #[serde(default)]
    layers: Vec<String>,
    #[serde(default)]
    repo_tags: Option<Vec<String>>,
}

/// A classic `docker save` archive: its one image, unpacked into the cache.
pub fn from_docker(archive: &Archive, shown: &str, cache: &Cache) -> Result<Resolved, String> {
    let what = |e: String| format!("container image {shown}: {e}");
    let manifest = archive
        .open("manifest.json")
        .map_err(|e| what(e.to_string()))?;
    let images: Vec<DockerImage> =
        parse(read_limited(manifest, MAX_JSON), "its manifest.json").map_err(what)?;
    let image = match images.as_slice() {
        [one] => one,
        many => {
            let tags: Vec<String> = many
                .iter()
                .flat_map(|i| i.repo_tags.clone().unwrap_or_default())
                .collect();
            return Err(what(format!(
                "it holds {} images ({}); save one image per archive",
                many.len(),
                tags.join(", ")
            )));
        }
    };
    let config = archive
        .open(&image.config)
        .map_err(|e| what(format!("cannot read its config {}: {e}", image.config)))?;
    let config_bytes = read_limited(config, MAX_JSON).map_err(what)?;
    let digest = format!("sha256:{}", hex::encode(Sha256::digest(&config_bytes)));
    let config: ImageConfig = parse(Ok(config_bytes), "its config").map_err(what)?;
    let (env, entrypoint) = config.run();
    let diff_ids = config
        .rootfs
        .as_ref()
        .map(|r| r.diff_ids.clone())
        .unwrap_or_default();
    if diff_ids.len() != image.layers.len() {
        return Err(what(format!(
            "its config names {} layers and its manifest.json {}",
            diff_ids.len(),
            image.layers.len()
        )));
    }
    for d in &diff_ids {
        hex_of(d).map_err(|e| what(e.clone()))?;
    }
    let hex = hex_of(&digest).map_err(what)?;
    let entry = cache.entry(hex, shown, |rootfs| {
        let mut root =
            Root::open(rootfs).map_err(|e| format!("cannot open {}: {e}", rootfs.display()))?;
        for (layer, diff_id) in image.layers.iter().zip(&diff_ids) {
            apply_layer(archive, layer, diff_id, &mut root)?;
        }
        Ok(())
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

/// Applies one layer tar (plain or gzip) of a `docker save` archive,
/// checked against its `diff_id` (the digest of the plain tar).
fn apply_layer(
    archive: &Archive,
    layer: &str,
    diff_id: &str,
    root: &mut Root,
) -> Result<(), String> {
    let raw = archive
        .open(layer)
        .map_err(|e| format!("cannot read layer {layer}: {e}"))?;
    let mut raw = BufReader::new(raw);
    let gzip = raw
        .fill_buf()
        .map_err(|e| format!("cannot read layer {layer}: {e}"))?
        .starts_with(&[0x1f, 0x8b]);
    let plain: Box<dyn Read + '_> = match gzip {
        true => Box::new(flate2::read::GzDecoder::new(raw)),
        false => Box::new(raw),
    };
    let mut hashing = Hashing::new(plain);
    let applied = root
        .apply(&mut hashing)
        .map_err(|e| format!("layer {layer}: {e}"));
    let got = hashing
        .finish()
        .map_err(|e| format!("cannot read layer {layer}: {e}"))?;
    if got != diff_id {
        return Err(format!(
            "layer {layer} is damaged: its content hashes to {got}, not {diff_id}"
        ));
    }
    applied.map(|_| ())
}

#[cfg(test)]
mod tests {
    use super::super::image::resolve;
    use super::super::image::tests::{test_cache, write_layout};
    use super::*;
    use std::fs;

    /// A tar of the files under `dir`, as `tar -C dir -cf out .` makes it.
    fn tar_of(dir: &Path, out: &Path) {
        let mut tar = tar::Builder::new(File::create(out).unwrap());
        tar.follow_symlinks(false);
        tar.append_dir_all(".", dir).unwrap();
        tar.finish().unwrap();
    }

    fn plain_open(p: &Path) -> io::Result<File> {
        File::open(p)
    }

    #[test]
    fn an_oci_archive_is_the_layout_it_holds() {
        let dir = tempfile::tempdir().unwrap();
        let layout = dir.path().join("layout");
        let digest = write_layout(
            &layout,
            &[("etc/", ""), ("etc/os-release", "NAME=arc\n")],
            &["A=1"],
        );
        let archive = dir.path().join("image.tar");
        tar_of(&layout, &archive);
        let cache = test_cache(dir.path());
        let r = resolve(&archive, &cache, &Default::default(), &plain_open).unwrap();
        assert!(r.unpacked && !r.users);
        assert_eq!(r.env, ["A=1"]);
        assert_eq!(
            fs::read_to_string(r.rootfs.join("etc/os-release")).unwrap(),
            "NAME=arc\n"
        );
        // The same image as a directory: the same cache entry.
        let again = resolve(&layout, &cache, &Default::default(), &plain_open).unwrap();
        assert!(!again.unpacked);
        assert_eq!(again.rootfs, r.rootfs);
        assert!(r
            .rootfs
            .starts_with(cache.dir.join(digest.strip_prefix("sha256:").unwrap())));
    }

    /// A `docker save` archive of one plain layer of `files`.
    fn docker_save(dir: &Path, files: &[(&str, &str)], env: &[&str]) -> std::path::PathBuf {
        let root = dir.join("save");
        fs::create_dir_all(root.join("abc")).unwrap();
        let mut layer = tar::Builder::new(Vec::new());
        for (path, content) in files {
            let mut h = tar::Header::new_gnu();
            h.set_mode(0o644);
            h.set_size(content.len() as u64);
            layer.append_data(&mut h, path, content.as_bytes()).unwrap();
        }
        let layer = layer.into_inner().unwrap();
        let diff_id = format!("sha256:{}", hex::encode(Sha256::digest(&layer)));
        fs::write(root.join("abc/layer.tar"), &layer).unwrap();
        // A second name for the same layer, as docker save links them.
        fs::create_dir_all(root.join("def")).unwrap();
        std::os::unix::fs::symlink("../abc/layer.tar", root.join("def/layer.tar")).unwrap();
        let config = serde_json::json!({"config": {"Env": env},
            "rootfs": {"type": "layers", "diff_ids": [diff_id]}});
        let config = config.to_string();
        let name = format!("{}.json", hex::encode(Sha256::digest(config.as_bytes())));
        fs::write(root.join(&name), &config).unwrap();
        let manifest = serde_json::json!([{"Config": name, "RepoTags": ["tiny:1"],
            "Layers": ["def/layer.tar"]}]);
        fs::write(root.join("manifest.json"), manifest.to_string()).unwrap();
        let out = dir.join("saved.tar");
        tar_of(&root, &out);
        out
    }

    #[test]
    fn a_docker_save_archive_is_unpacked_by_its_config_digest() {
        let dir = tempfile::tempdir().unwrap();
        let archive = docker_save(dir.path(), &[("hello.txt", "hi\n")], &["B=2"]);
        let cache = test_cache(dir.path());
        let r = resolve(&archive, &cache, &Default::default(), &plain_open).unwrap();
        assert!(r.unpacked);
        assert_eq!(r.env, ["B=2"]);
        assert_eq!(
            fs::read_to_string(r.rootfs.join("hello.txt")).unwrap(),
            "hi\n"
        );
        assert!(
            !resolve(&archive, &cache, &Default::default(), &plain_open)
                .unwrap()
                .unpacked
        );
    }

    #[test]
    fn a_damaged_or_truncated_archive_fails_and_leaves_nothing_behind() {
        let dir = tempfile::tempdir().unwrap();
        let archive = docker_save(dir.path(), &[("hello.txt", "hi\n")], &[]);
        let bytes = fs::read(&archive).unwrap();
        // The layer's content changed, its length kept.
        let at = bytes.windows(3).position(|w| w == b"hi\n").unwrap();
        let mut damaged = bytes.clone();
        damaged[at] = b'H';
        let bad = dir.path().join("damaged.tar");
        fs::write(&bad, &damaged).unwrap();
        let cache = test_cache(dir.path());
        let err = resolve(&bad, &cache, &Default::default(), &plain_open).unwrap_err();
        assert!(
            err.contains("damaged.tar") && err.contains("is damaged"),
            "{err}"
        );
        // Cut in the middle of a header: no readable archive.
        let cut = dir.path().join("cut.tar");
        fs::write(&cut, &bytes[..bytes.len().min(700)]).unwrap();
        let err = resolve(&cut, &cache, &Default::default(), &plain_open).unwrap_err();
        assert!(err.contains("cut.tar"), "{err}");
        let left: Vec<String> = fs::read_dir(&cache.dir)
            .map(|d| {
                d.map(|e| e.unwrap().file_name().into_string().unwrap())
                    .collect()
            })
            .unwrap_or_default();
        assert!(left.iter().all(|n| n.ends_with(".lock")), "{left:?}");
    }
}
