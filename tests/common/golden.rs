//! The golden data of earlier releases (tests/golden/<commit>/, made by
//! scripts/golden.sh): where it is, and copies of its data dir to start
//! today's server on.

use std::path::{Path, PathBuf};

/// Every release directory under tests/golden, oldest name first.
pub fn releases() -> Vec<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden");
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(&root)
        .expect("tests/golden")
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.join("COMMIT").exists())
        .collect();
    dirs.sort();
    assert!(
        !dirs.is_empty(),
        "no golden release under {}",
        root.display()
    );
    dirs
}

/// Copies release `rel`'s data dir to `to` (tests never write the golden
/// one), unpacks its redb file (kept gzipped: 3 MB, mostly free pages, are
/// 16 KB) and closes it to group and others, as packaging/install.sh does on
/// an upgrade (2ce4b22 left it open; today's server refuses an open one).
pub fn copy_release_data(rel: &Path, to: &Path) {
    if let Some(parent) = to.parent() {
        std::fs::create_dir_all(parent).unwrap();
    }
    let cmd = format!(
        "cp -a '{}' '{d}' && gzip -d '{d}/gpuq.redb.gz' && chmod -R go= '{d}'",
        rel.join("data").display(),
        d = to.display()
    );
    let ok = std::process::Command::new("sh")
        .args(["-c", &cmd])
        .status()
        .expect("sh")
        .success();
    assert!(ok, "{cmd} failed");
}

/// Server config for a golden data dir: a history retention longer than the
/// data can ever age, so its finished jobs stay unarchived whenever a test
/// runs (a one-day retention was a time bomb a day after the data was made).
pub const KEEP_HISTORY: &str = "history_retention_secs = 3153600000";

/// Copies the newest release's data dir to `to`.
pub fn copy_data_dir(to: &Path) {
    copy_release_data(releases().last().unwrap(), to);
}
