//! The node's cache of unpacked images: `<cache>/<key>/rootfs`, keyed by
//! digest (an OCI manifest's, a docker archive's config, a squashfs file's
//! content), shared by every job and user of the node, with a size cap and
//! least-recently-used eviction (`[agent.containers] cache_max_mb`).
//!
//! One lock file per entry, `<cache>/<key>.lock`, says who may do what: a
//! task that runs in an entry holds a shared `flock` on it for as long as
//! its shim lives (the `Lease`), an unpack holds it exclusively, and
//! eviction takes it exclusively *without waiting*, so an entry in use is
//! never removed and concurrent tasks with the same image wait for one
//! unpack instead of racing. An unpack goes to `<key>.unpacking`, renamed
//! into place when whole, so a crash leaves nothing that passes for an
//! image. Each unpack appends a line to `<cache>/unpacks.log`, each
//! eviction one to `<cache>/evictions.log`; `<key>/used` is touched at each
//! start (its time orders the eviction) and `<key>/size` holds the bytes
//! the entry takes on disk.
//!
//! Layouts pulled from registries (`<cache>/pulls/<name>`, see
//! `image_tools::pull`) count toward the same cap and leave in the same
//! least-recently-used order (`<name>.used`), under their own lock
//! (`pulls/<name>.lock`: held exclusively by a pull, shared while a task
//! unpacks from the layout), so a layout being pulled or read is never
//! removed; a later pull of an evicted one fetches it whole again.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

/// The record of unpacks in the cache directory.
pub const UNPACK_LOG: &str = "unpacks.log";
/// The record of evictions in the cache directory.
pub const EVICTION_LOG: &str = "evictions.log";
/// Where pulled layouts are, under the cache directory.
pub const PULLS_DIR: &str = "pulls";

/// The node's image cache and its cap.
#[derive(Clone, Debug)]
pub struct Cache {
    pub dir: PathBuf,
    /// Bytes the unpacked images may take before the least recently used
    /// ones not in use are removed; 0: no cap.
    pub max_bytes: u64,
}

/// A task's hold on a cache entry: it cannot be evicted while this lives.
#[derive(Debug)]
pub struct Lease {
    _lock: File,
}

/// An entry of the cache, ready to run in.
#[derive(Debug)]
pub struct Entry {
    /// `<cache>/<key>`; the root filesystem is its `rootfs`.
    pub dir: PathBuf,
    /// Whether this call unpacked it (a cache miss).
    pub unpacked: bool,
    pub lease: Lease,
}

fn flock(file: &File, how: libc::c_int) -> io::Result<()> {
    // SAFETY: flock on a descriptor the caller owns; released on close.
    match unsafe { libc::flock(file.as_raw_fd(), how) } {
        0 => Ok(()),
        _ => Err(io::Error::last_os_error()),
    }
}

/// `path` created if need be and locked exclusively (waiting for whoever
/// holds it); the lock goes when the file closes. The error is a sentence.
pub(super) fn lock_exclusive(path: &Path) -> Result<File, String> {
    let file = File::create(path).map_err(|e| format!("cannot open {}: {e}", path.display()))?;
    flock(&file, libc::LOCK_EX).map_err(|e| format!("cannot lock {}: {e}", path.display()))?;
    Ok(file)
}

fn fail(what: &str, path: &Path, e: io::Error) -> String {
    format!("cannot {what} {} of the image cache: {e}", path.display())
}

fn append(log: &Path, line: &str) {
    if let Err(e) = OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o600)
        .open(log)
        .and_then(|mut f| f.write_all(line.as_bytes()))
    {
        tracing::warn!("cannot record in {}: {e}", log.display());
    }
}

impl Cache {
    /// The entry `key` (hex digits), made by `unpack` (given the staging
    /// root filesystem to fill) unless it exists, and leased to the caller.
    /// `source` names the image in messages and the log. After an unpack,
    /// entries are evicted down to the cap.
    pub fn entry(
        &self,
        key: &str,
        source: &str,
        unpack: impl FnOnce(&Path) -> Result<(), String>,
    ) -> Result<Entry, String> {
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&self.dir)
            .map_err(|e| fail("create", &self.dir, e))?;
        let entry = self.dir.join(key);
        let lock_path = self.dir.join(format!("{key}.lock"));
        let lock = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .mode(0o600)
            .open(&lock_path)
            .map_err(|e| fail("open", &lock_path, e))?;
        let mut unpack = Some(unpack);
        let mut unpacked = false;
        loop {
            flock(&lock, libc::LOCK_SH).map_err(|e| fail("lock", &lock_path, e))?;
            if entry.join("rootfs").is_dir() {
                let used = entry.join("used");
                let touched =
                    File::create(&used).and_then(|f| f.set_modified(std::time::SystemTime::now()));
                if let Err(e) = touched {
                    tracing::warn!("cannot mark {} used: {e}", used.display());
                }
                if unpacked {
                    self.evict(key);
                }
                return Ok(Entry {
                    dir: entry,
                    unpacked,
                    lease: Lease { _lock: lock },
                });
            }
            // Not there: unpack it, unless another task does while this
            // one waits for the exclusive lock.
            flock(&lock, libc::LOCK_UN).map_err(|e| fail("unlock", &lock_path, e))?;
            flock(&lock, libc::LOCK_EX).map_err(|e| fail("lock", &lock_path, e))?;
            if !entry.join("rootfs").is_dir() {
                let Some(unpack) = unpack.take() else {
                    return Err(format!(
                        "the image cache entry of {source} vanished as it was made"
                    ));
                };
                self.unpack(key, source, unpack)?;
                unpacked = true;
            }
            flock(&lock, libc::LOCK_UN).map_err(|e| fail("unlock", &lock_path, e))?;
        }
    }

    /// Makes entry `key` (the caller holds its lock exclusively).
    fn unpack(
        &self,
        key: &str,
        source: &str,
        unpack: impl FnOnce(&Path) -> Result<(), String>,
    ) -> Result<(), String> {
        let started = std::time::Instant::now();
        let entry = self.dir.join(key);
        let staging = self.dir.join(format!("{key}.unpacking"));
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
            return Err(format!("cannot unpack container image {source}: {e}"));
        }
        use std::os::unix::fs::PermissionsExt;
        let _ = fs::set_permissions(&rootfs, fs::Permissions::from_mode(0o755));
        let size = disk_usage(&rootfs);
        fs::write(staging.join("size"), size.to_string())
            .map_err(|e| fail("write", &staging.join("size"), e))?;
        fs::rename(&staging, &entry).map_err(|e| fail("finish", &entry, e))?;
        append(
            &self.dir.join(UNPACK_LOG),
            &format!(
                "{} sha256:{key} {source} {}ms {size}B\n",
                crate::clock::now_ms(),
                started.elapsed().as_millis()
            ),
        );
        tracing::info!(image = source, key, bytes = size, "image unpacked");
        Ok(())
    }

    /// Removes the least recently used entries nobody runs in until the
    /// cache fits its cap; `keep` (just made) stays whatever its size.
    fn evict(&self, keep: &str) {
        if self.max_bytes == 0 {
            return;
        }
        let mut entries = self.entries();
        let mut total: u64 = entries.iter().map(|e| e.size).sum();
        entries.sort_by_key(|e| e.used);
        for e in entries {
            if total <= self.max_bytes {
                break;
            }
            if e.key == keep {
                continue;
            }
            let lock_path = e.dir.with_extension("lock");
            let Ok(lock) = OpenOptions::new().write(true).open(&lock_path) else {
                continue;
            };
            if flock(&lock, libc::LOCK_EX | libc::LOCK_NB).is_err() {
                continue; // in use
            }
            let entry = e.dir.clone();
            let doomed = e.dir.with_extension("evicting");
            let _ = fs::remove_dir_all(&doomed);
            if let Err(err) = fs::rename(&entry, &doomed) {
                tracing::warn!("cannot evict {}: {err}", entry.display());
                continue;
            }
            drop(lock);
            if let Err(err) = fs::remove_dir_all(&doomed) {
                tracing::warn!("cannot remove {}: {err}", doomed.display());
            }
            total = total.saturating_sub(e.size);
            append(
                &self.dir.join(EVICTION_LOG),
                &format!("{} {} {}B\n", crate::clock::now_ms(), e.key, e.size),
            );
            tracing::info!(key = %e.key, bytes = e.size, "image evicted from the cache");
        }
    }

    /// The finished entries, with their sizes and last use, and the
    /// pulled layouts.
    fn entries(&self) -> Vec<Listed> {
        let mut all = self.pulled();
        let Ok(dir) = fs::read_dir(&self.dir) else {
            return all;
        };
        all.extend(dir.filter_map(Result::ok).filter_map(|d| {
            let key = d.file_name().into_string().ok()?;
            let path = d.path();
            if key.contains('.') || !path.join("rootfs").is_dir() {
                return None;
            }
            let size = fs::read_to_string(path.join("size"))
                .ok()
                .and_then(|t| t.trim().parse().ok())
                .unwrap_or_else(|| disk_usage(&path.join("rootfs")));
            let used = fs::metadata(path.join("used"))
                .or_else(|_| fs::metadata(&path))
                .and_then(|m| m.modified())
                .unwrap_or(std::time::UNIX_EPOCH);
            Some(Listed {
                key,
                dir: path,
                size,
                used,
            })
        }));
        all
    }

    /// The pulled layouts (`pulls/<name>` with an `index.json`), last used
    /// when their `<name>.used` was touched.
    fn pulled(&self) -> Vec<Listed> {
        let pulls = self.dir.join(PULLS_DIR);
        let Ok(dir) = fs::read_dir(&pulls) else {
            return Vec::new();
        };
        dir.filter_map(Result::ok)
            .filter_map(|d| {
                let name = d.file_name().into_string().ok()?;
                let path = d.path();
                if name.contains('.') || !path.join("index.json").is_file() {
                    return None;
                }
                let used = fs::metadata(path.with_extension("used"))
                    .or_else(|_| fs::metadata(&path))
                    .and_then(|m| m.modified())
                    .unwrap_or(std::time::UNIX_EPOCH);
                Some(Listed {
                    key: format!("{PULLS_DIR}/{name}"),
                    size: disk_usage(&path),
                    dir: path,
                    used,
                })
            })
            .collect()
    }
}

/// An entry or a pulled layout, as eviction sees it.
struct Listed {
    /// The entry's key, or `pulls/<name>`.
    key: String,
    /// Its directory (`<dir>.lock` is its lock).
    dir: PathBuf,
    size: u64,
    used: std::time::SystemTime,
}

/// Bytes the files under `dir` take on disk (not following symlinks).
pub fn disk_usage(dir: &Path) -> u64 {
    let mut total = 0;
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(list) = fs::read_dir(&d) else { continue };
        for e in list.filter_map(Result::ok) {
            let Ok(meta) = e.path().symlink_metadata() else {
                continue;
            };
            total += meta.blocks() * 512;
            if meta.is_dir() {
                stack.push(e.path());
            }
        }
    }
    total
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fill(bytes: usize) -> impl FnOnce(&Path) -> Result<(), String> {
        move |rootfs: &Path| {
            fs::write(rootfs.join("data"), vec![7u8; bytes]).map_err(|e| e.to_string())
        }
    }

    fn lines(path: &Path) -> usize {
        fs::read_to_string(path).map_or(0, |t| t.lines().count())
    }

    #[test]
    fn an_entry_is_made_once_and_then_leased() {
        let dir = tempfile::tempdir().unwrap();
        let cache = Cache {
            dir: dir.path().join("c"),
            max_bytes: 0,
        };
        let first = cache.entry("aa", "/img", fill(10)).unwrap();
        assert!(first.unpacked);
        assert!(first.dir.join("rootfs/data").is_file());
        let again = cache
            .entry("aa", "/img", |_| panic!("unpacked twice"))
            .unwrap();
        assert!(!again.unpacked);
        assert_eq!(lines(&cache.dir.join(UNPACK_LOG)), 1);
        let err = cache
            .entry("bb", "/bad", |_| Err("it is junk".into()))
            .unwrap_err();
        assert!(
            err.contains("cannot unpack container image /bad: it is junk"),
            "{err}"
        );
        assert!(!cache.dir.join("bb").exists() && !cache.dir.join("bb.unpacking").exists());
    }

    #[test]
    fn the_least_recently_used_entries_not_in_use_go_past_the_cap() {
        let dir = tempfile::tempdir().unwrap();
        let cache = Cache {
            dir: dir.path().join("c"),
            max_bytes: 3 * 64 * 1024,
        };
        let mb = 64 * 1024;
        let old = cache.entry("01", "/old", fill(mb)).unwrap();
        drop(old.lease);
        let busy = cache.entry("02", "/busy", fill(mb)).unwrap();
        // "03" is used after "02": "01" is the least recently used.
        std::thread::sleep(std::time::Duration::from_millis(20));
        let mid = cache.entry("03", "/mid", fill(mb)).unwrap();
        drop(mid.lease);
        // A fourth pushes past the cap: "01" goes, "02" is in use.
        let _new = cache.entry("04", "/new", fill(mb)).unwrap();
        assert!(!cache.dir.join("01").exists());
        assert!(cache.dir.join("02/rootfs/data").is_file());
        assert!(cache.dir.join("03").exists() && cache.dir.join("04").exists());
        assert_eq!(lines(&cache.dir.join(EVICTION_LOG)), 1);
        // Once "02" is free, the next unpack evicts it, the least recently
        // used, and that is enough.
        drop(busy.lease);
        let _fifth = cache.entry("05", "/fifth", fill(mb)).unwrap();
        let left: Vec<bool> = ["02", "03", "04", "05"]
            .iter()
            .map(|k| cache.dir.join(k).exists())
            .collect();
        assert_eq!(left, [false, true, true, true], "{left:?}");
    }

    #[test]
    fn pulled_layouts_count_toward_the_cap_and_go_in_the_same_order() {
        let dir = tempfile::tempdir().unwrap();
        let cache = Cache {
            dir: dir.path().join("c"),
            max_bytes: 4 * 64 * 1024,
        };
        let mb = 64 * 1024;
        let pulls = cache.dir.join(PULLS_DIR);
        // Two layouts as `image_tools::pull` leaves them: one old and
        // free, one being read (its lock held shared).
        let layout = |name: &str| {
            let l = pulls.join(name);
            fs::create_dir_all(l.join("blobs")).unwrap();
            fs::write(l.join("index.json"), "{}").unwrap();
            fs::write(l.join("blobs/layer"), vec![1u8; mb]).unwrap();
            File::create(pulls.join(format!("{name}.used"))).unwrap();
            File::create(pulls.join(format!("{name}.lock"))).unwrap()
        };
        let _free = layout("p1");
        std::thread::sleep(std::time::Duration::from_millis(20));
        let held = layout("p2");
        flock(&held, libc::LOCK_SH).unwrap();
        std::thread::sleep(std::time::Duration::from_millis(20));
        let a = cache.entry("0a", "/a", fill(mb)).unwrap();
        // Within the cap (about 3.2 of its 4 units): nothing goes.
        assert!(pulls.join("p1").exists() && pulls.join("p2").exists());
        drop(a.lease);
        // Past it: the oldest pulled layout nobody holds goes first.
        let _b = cache.entry("0b", "/b", fill(mb)).unwrap();
        assert!(!pulls.join("p1").exists());
        assert!(pulls.join("p2/blobs/layer").is_file());
        let log = fs::read_to_string(cache.dir.join(EVICTION_LOG)).unwrap();
        assert!(log.contains(" pulls/p1 "), "{log}");
        // The held one stays while held; "0a" (older than "0b") goes.
        let _c = cache.entry("0c", "/c", fill(mb)).unwrap();
        assert!(pulls.join("p2").exists() && !cache.dir.join("0a").exists());
        drop(held);
        let _d = cache.entry("0d", "/d", fill(mb)).unwrap();
        assert!(!pulls.join("p2").exists());
    }
}
