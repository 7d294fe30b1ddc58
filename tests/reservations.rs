//! Advance reservations end to end (`gpuq admin reservation`): a server and
//! two agents as real processes. A maintenance window ahead lets a short
//! job start and keeps a long one pending with the reason; a reservation in
//! force keeps its nodes for the jobs that name it; an open maintenance
//! window shows its nodes as `maint`; bad input is refused with exit 1 and
//! changes nothing.

mod common;

use std::time::Duration;

use common::{stderr, Cluster};

const LONG: Duration = Duration::from_secs(60);

fn node_of(c: &Cluster, id: &str) -> String {
    c.wait_started(id, LONG)["run"]["allocation"]["nodes"][0]["node"]
        .as_str()
        .unwrap()
        .to_string()
}

#[test]
fn reservations_keep_their_nodes_for_their_window_and_their_jobs() {
    let dir = tempfile::tempdir().unwrap();
    let c = Cluster::start(dir.path(), 2, 8);
    let s = &c.server;
    let made = s.ok(&[
        "admin",
        "reservation",
        "create",
        "maint",
        "--nodes",
        "n1",
        "--start",
        "now+10min",
        "--duration",
        "2h",
        "--maint",
    ]);
    assert!(
        made.contains("Reservation maint created: 1 node (n1)"),
        "{made}"
    );
    s.ok(&[
        "admin",
        "reservation",
        "create",
        "team",
        "--nodes",
        "n2",
        "--start",
        "now",
        "--duration",
        "1h",
        "--users",
        "root",
    ]);
    let list = s.ok(&["admin", "reservation", "list"]);
    let row = |name: &str| {
        list.lines()
            .find(|l| l.starts_with(name))
            .unwrap_or_else(|| panic!("no {name} in {list}"))
            .to_string()
    };
    assert!(
        row("maint").contains("planned") && row("maint").contains("maint"),
        "{list}"
    );
    assert!(
        row("team").contains("active") && row("team").contains("users=root"),
        "{list}"
    );

    // Bad input: exit 1, the reason named, nothing changed.
    for (args, text) in [
        (
            vec![
                "create",
                "x",
                "--nodes",
                "n1",
                "--start",
                "now+1h",
                "--duration",
                "1h",
            ],
            "would overlap reservation maint on node n1",
        ),
        (
            vec![
                "create",
                "x",
                "--nodes",
                "n9",
                "--start",
                "now",
                "--duration",
                "1h",
            ],
            "node n9 (in --nodes) is not a node",
        ),
        (
            vec!["create", "x", "--nodes", "n1", "--duration", "1h"],
            "needs a start",
        ),
        (
            vec!["create", "x", "--nodes", "n1", "--start", "soon"],
            "soon",
        ),
        (vec!["delete", "ghost"], "reservation ghost does not exist"),
    ] {
        let mut full = vec!["admin", "reservation"];
        full.extend(args.iter().copied());
        let out = s.cli(&full);
        assert_eq!(out.status.code(), Some(1), "{full:?}: {}", stderr(&out));
        assert!(stderr(&out).contains(text), "{full:?}: {}", stderr(&out));
    }
    assert_eq!(s.ok(&["admin", "reservation", "list"]), list);
    let out = s.cli(&["submit", "--reservation", "ghost", "--", "true"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stderr(&out).contains("reservation \"ghost\" does not exist"),
        "{}",
        stderr(&out)
    );

    // An hour-long job would overlap the window on n1, and n2 is the team's.
    let long = c.submit(&["--gpus-per-node", "8", "-t", "60", "--", "sleep", "600"]);
    common::wait_for("the reservation reason", LONG, || {
        c.job(&long)["reason"]
            .as_str()
            .is_some_and(|r| r.contains("reserved for maintenance (reservation maint)"))
    });
    let queue = s.ok(&["queue", "--start"]);
    assert!(queue.contains("reserved for maintenance"), "{queue}");
    assert_eq!(c.job(&long)["reason_code"], "ReservedForMaintenance");
    // A five-minute job ends before the window: it starts on n1 now.
    let short = c.submit(&["--gpus-per-node", "8", "-t", "5", "--", "sleep", "600"]);
    assert_eq!(node_of(&c, &short), "n1");
    // The team's job runs in its reservation, on n2.
    let team = c.submit(&[
        "--reservation",
        "team",
        "--gpus-per-node",
        "8",
        "-t",
        "5",
        "--",
        "sleep",
        "600",
    ]);
    assert_eq!(node_of(&c, &team), "n2");
    assert_eq!(c.job(&long)["state"], "PENDING");

    // The window opens: n1 shows as maint, with the reservation named.
    s.ok(&["admin", "reservation", "modify", "maint", "--start", "now"]);
    let nodes = s.ok(&["nodes"]);
    let n1 = nodes.lines().find(|l| l.starts_with("n1")).unwrap();
    assert!(n1.contains("maint"), "{nodes}");
    let json: serde_json::Value = serde_json::from_str(&s.ok(&["nodes", "--json"])).unwrap();
    let n1 = json
        .as_array()
        .unwrap()
        .iter()
        .find(|n| n["name"] == "n1")
        .unwrap()
        .clone();
    assert_eq!(n1["state"], "maint", "{n1}");
    assert!(
        n1["reason"]
            .as_str()
            .unwrap()
            .contains("maintenance reservation maint"),
        "{n1}"
    );

    // Deleting the reservations frees the nodes for everyone.
    s.ok(&["cancel", &short, &team]);
    s.ok(&["admin", "reservation", "delete", "maint"]);
    s.ok(&["admin", "reservation", "delete", "team"]);
    c.wait_started(&long, LONG);
}
