//! The MASTER_PORT range end to end: an admin changes the cluster's range
//! with `gpuq admin ports set`, a bad range is refused naming the input and
//! the fix, and the next job's rank 0 gets its port from the new range.

mod common;

use std::time::Duration;

use common::{stderr, Cluster};

#[test]
fn an_admin_sets_the_master_port_range_and_jobs_use_it() {
    let dir = tempfile::tempdir().unwrap();
    let c = Cluster::start(dir.path(), 1, 8);
    let w = dir.path().join("w");
    std::fs::create_dir_all(&w).unwrap();

    let shown = c.server.ok(&["admin", "ports", "show"]);
    assert!(shown.contains("29500-30499"), "{shown}");

    let bad = c.server.cli(&["admin", "ports", "set", "30000-29500"]);
    assert_eq!(bad.status.code(), Some(1));
    let err = stderr(&bad);
    assert!(
        err.contains("\"30000-29500\"") && err.contains("write the lower port first (29500-30000)"),
        "{err}"
    );
    let bad = c.server.cli(&["admin", "ports", "set", "80-90"]);
    assert_eq!(bad.status.code(), Some(1));
    assert!(stderr(&bad).contains("privileged"), "{}", stderr(&bad));
    assert!(c
        .server
        .ok(&["admin", "ports", "show"])
        .contains("29500-30499"));

    let set = c.server.ok(&["admin", "ports", "set", "41000-41009"]);
    assert!(
        set.contains("41000-41009") && set.contains("was 29500-30499"),
        "{set}"
    );
    let json: serde_json::Value =
        serde_json::from_str(&c.server.ok(&["admin", "ports", "show", "--json"])).unwrap();
    assert_eq!(json["master_port_range"], "41000-41009", "{json}");
    assert_eq!(json["ports"], 10, "{json}");

    let id = c.submit(&[
        "-D",
        w.to_str().unwrap(),
        "--wrap",
        "echo $MASTER_PORT > port",
    ]);
    c.wait_state(&id, "COMPLETED", Duration::from_secs(60));
    let port = std::fs::read_to_string(w.join("port")).unwrap();
    assert_eq!(port.trim(), "41000");

    let help = c.server.ok(&["admin", "ports", "set", "--help"]);
    assert!(help.contains("keep their ports until they end"), "{help}");
}
