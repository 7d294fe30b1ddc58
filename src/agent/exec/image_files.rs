//! What an image is made of, whatever holds it: its files (`Files`: a
//! layout directory or an archive), blobs read through a digest check
//! (`Hashing`), its config (`ImageConfig`), and what resolving an image
//! yields for the task (`Resolved`). Shared by the image formats
//! (`image`, `image_archive`, `image_tools`).

use std::io::{self, Read};
use std::path::PathBuf;

use serde::Deserialize;
use sha2::{Digest, Sha256};

use super::image_cache::Lease;

/// How large `index.json`, a manifest or an image config may be.
pub const MAX_JSON: u64 = 4 << 20;

/// Where an image's files come from: a layout directory or an archive.
pub trait Files {
    /// Opens `rel` of the image (`index.json`, `blobs/sha256/HEX`).
    fn open(&self, rel: &str) -> io::Result<Box<dyn Read + '_>>;
}

/// What the task's root filesystem is made from.
#[derive(Debug)]
pub struct Resolved {
    /// The directory that becomes the container's root (read-only, below a
    /// per-task writable layer).
    pub rootfs: PathBuf,
    /// Whether `rootfs` is the user's own directory (open it as the user)
    /// rather than the node's cache.
    pub users: bool,
    /// The image's `Env` (`KEY=VALUE`), empty for a plain directory.
    pub env: Vec<String>,
    /// The image's `Entrypoint` (an OCI or docker image's), for
    /// `--container-entrypoint`.
    pub entrypoint: Vec<String>,
    /// Whether this call unpacked the image (a cache miss).
    pub unpacked: bool,
    /// The hold on the cache entry, for as long as the task runs.
    pub lease: Option<Lease>,
}

#[derive(Debug, Default, Deserialize)]
pub struct ImageConfig {
    #[serde(default)]
    pub config: Option<RunConfig>,
    #[serde(default)]
    pub rootfs: Option<RootfsConfig>,
}

impl ImageConfig {
    /// The image's `Env` and `Entrypoint`, empty where it has none.
    pub fn run(&self) -> (Vec<String>, Vec<String>) {
        let c = self.config.as_ref();
        (
            c.and_then(|c| c.env.clone()).unwrap_or_default(),
            c.and_then(|c| c.entrypoint.clone()).unwrap_or_default(),
        )
    }
}

#[derive(Debug, Default, Deserialize)]
pub struct RootfsConfig {
    #[serde(default)]
    pub diff_ids: Vec<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct RunConfig {
    #[serde(default)]
    pub env: Option<Vec<String>>,
    #[serde(default)]
    pub entrypoint: Option<Vec<String>>,
}

/// The hex of a `sha256:` digest, refused unless it is exactly that (a
/// digest names a file under `blobs/`, so it must not name anything else).
pub fn hex_of(digest: &str) -> Result<&str, String> {
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

pub fn parse<T: for<'de> Deserialize<'de>>(
    bytes: Result<Vec<u8>, String>,
    what: &str,
) -> Result<T, String> {
    let bytes = bytes?;
    serde_json::from_slice(&bytes).map_err(|e| format!("{what} is not valid: {e}"))
}

pub fn read_limited(file: impl Read, limit: u64) -> Result<Vec<u8>, String> {
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
pub struct Hashing<R> {
    pub inner: R,
    pub hash: Sha256,
    pub read: u64,
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
    pub fn new(inner: R) -> Hashing<R> {
        Hashing {
            inner,
            hash: Sha256::new(),
            read: 0,
        }
    }

    /// Reads what is left; the digest (`sha256:...`) of all that was read.
    pub fn finish(mut self) -> io::Result<String> {
        io::copy(&mut self, &mut io::sink())?;
        Ok(format!("sha256:{}", hex::encode(self.hash.finalize())))
    }
}
