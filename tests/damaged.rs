//! A server started on damaged state: a truncated, corrupt, missing or empty
//! redb file, a missing node key, a garbage node_id, a full disk. Each must
//! exit non-zero naming the file and a way out, and leave the damaged file
//! as it was: never start with an empty state, never rewrite what is there.
//! The data dir is the golden one of an earlier release (tests/golden).

mod common;

use std::path::{Path, PathBuf};

use common::Server;

/// A server on a copy of the golden data dir under `root`, started as the
/// first server of a cluster runs under systemd (`--bootstrap` stays on).
fn golden_server(root: &Path) -> Server {
    common::golden::copy_data_dir(&root.join("data"));
    let mut s = Server::joining(root, "s1", "", "");
    s.mode = vec!["--bootstrap".into()];
    s.extra_config = common::golden::KEEP_HISTORY.into();
    s
}

/// Starts `s`, expects it to refuse, and returns its log.
fn refused(s: &mut Server, names: &Path) -> String {
    let (status, log) = s.run_to_exit();
    assert!(
        !status.success(),
        "the server started on damaged state:\n{log}"
    );
    let last = log.lines().last().unwrap_or_default().to_string();
    assert!(
        last.contains(&names.display().to_string()),
        "the error does not name {}: {last}",
        names.display()
    );
    last
}

fn db(s: &Server) -> PathBuf {
    s.dir.join("data/gpuq.redb")
}

#[test]
fn a_truncated_redb_file_is_refused_naming_it_and_left_as_it_is() {
    let dir = tempfile::tempdir().unwrap();
    let mut s = golden_server(dir.path());
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(db(&s))
        .unwrap();
    f.set_len(1_000_000).unwrap();
    drop(f);
    let before = std::fs::read(db(&s)).unwrap();
    let err = {
        let f = db(&s);
        refused(&mut s, &f)
    };
    assert!(
        err.contains("damaged") && err.contains("snapshot restore"),
        "{err}"
    );
    assert_eq!(
        std::fs::read(db(&s)).unwrap(),
        before,
        "the file was changed"
    );
}

#[test]
fn a_redb_file_with_a_corrupt_header_is_refused_naming_it_and_left_as_it_is() {
    let dir = tempfile::tempdir().unwrap();
    let mut s = golden_server(dir.path());
    let mut bytes = std::fs::read(db(&s)).unwrap();
    bytes[..64].copy_from_slice(&[0x5a; 64]);
    std::fs::write(db(&s), &bytes).unwrap();
    let err = {
        let f = db(&s);
        refused(&mut s, &f)
    };
    assert!(err.contains("snapshot restore"), "{err}");
    assert_eq!(
        std::fs::read(db(&s)).unwrap(),
        bytes,
        "the file was changed"
    );
}

#[test]
fn a_missing_or_empty_redb_file_is_refused_not_made_anew() {
    let dir = tempfile::tempdir().unwrap();
    let mut s = golden_server(&dir.path().join("missing"));
    std::fs::remove_file(db(&s)).unwrap();
    let err = {
        let f = db(&s);
        refused(&mut s, &f)
    };
    assert!(err.contains("missing or empty"), "{err}");
    assert!(!db(&s).exists(), "an empty store was created");

    let mut s = golden_server(&dir.path().join("empty"));
    std::fs::write(db(&s), b"").unwrap();
    let err = {
        let f = db(&s);
        refused(&mut s, &f)
    };
    assert!(
        err.contains("refusing to start with an empty state"),
        "{err}"
    );
    assert_eq!(std::fs::metadata(db(&s)).unwrap().len(), 0);
}

#[test]
fn a_missing_node_key_or_a_garbage_node_id_is_refused_naming_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let mut s = golden_server(&dir.path().join("key"));
    let key = s.dir.join("data/tls/node.key");
    std::fs::remove_file(&key).unwrap();
    refused(&mut s, &key);
    assert!(!key.exists(), "a new key was made");

    let mut s = golden_server(&dir.path().join("id"));
    let id = s.dir.join("data/node_id");
    std::fs::write(&id, "not a number\n").unwrap();
    refused(&mut s, &id);
    assert_eq!(std::fs::read_to_string(&id).unwrap(), "not a number\n");
}

/// A tmpfs mounted for one test, unmounted when dropped.
struct Tmpfs(PathBuf);

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg("-l")
            .arg(&self.0)
            .status();
    }
}

#[test]
fn a_full_disk_is_refused_naming_the_data_dir_and_leaves_the_state_whole() {
    if !common::require_root("a_full_disk_is_refused") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let mnt = dir.path().join("disk");
    std::fs::create_dir_all(&mnt).unwrap();
    let ok = std::process::Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=32m", "tmpfs"])
        .arg(&mnt)
        .status()
        .unwrap()
        .success();
    assert!(ok, "mount tmpfs");
    let _guard = Tmpfs(mnt.clone());
    // The data dir on the small disk; config, log and socket beside it.
    let mut s = golden_server(&dir.path().join("s1"));
    std::fs::remove_dir_all(s.dir.join("data")).unwrap();
    common::golden::copy_data_dir(&mnt.join("data"));
    std::os::unix::fs::symlink(mnt.join("data"), s.dir.join("data")).unwrap();
    // Fill the disk to the last byte.
    let _ = std::process::Command::new("dd")
        .args(["if=/dev/zero", "bs=4096"])
        .arg(format!("of={}", mnt.join("filler").display()))
        .stderr(std::process::Stdio::null())
        .status();
    let (status, log) = s.run_to_exit();
    assert!(
        !status.success(),
        "the server started on a full disk:\n{log}"
    );
    let last = log.lines().last().unwrap_or_default().to_string();
    assert!(
        last.contains(&s.dir.join("data").display().to_string()) && last.contains("no space left"),
        "the error names neither the data dir nor the lack of space: {last}"
    );
    // Space again: the same data dir starts with its whole state.
    std::fs::remove_file(mnt.join("filler")).unwrap();
    s.start();
    let jobs: serde_json::Value =
        serde_json::from_str(&s.ok(&["queue", "--all", "--json"])).unwrap();
    assert_eq!(jobs.as_array().map(Vec::len), Some(18), "{jobs}");
}
