//! Gang restarts through the state machine: a requeued job waits until every
//! old rank has stopped, then restarts in place on its healthy nodes; and
//! MASTER_PORT comes from the cluster's range.

use super::run::{alloc, cluster, ev, inventory, report, start, submit};
use crate::model::{PortRange, TaskEnd, TaskEventKind};
use crate::state::*;

const ALL8: &[u32] = &[0, 1, 2, 3, 4, 5, 6, 7];

fn register(s: &mut State, d: &mut Dirty, name: &str, addr: &str) {
    s.apply(
        &Command::RegisterNode {
            inventory: inventory(name, 8),
            addr: addr.into(),
            preflight: false,
            now: 1,
            cert_sha256: String::new(),
        },
        d,
    );
}

#[test]
fn a_gang_that_lost_a_node_restarts_in_place_once_its_old_ranks_stopped() {
    let (mut s, mut d) = cluster();
    register(&mut s, &mut d, "n3", "10.1.0.3:7421");
    let a = submit(&mut s, &mut d, 2, 8);
    start(&mut s, &mut d, a, &[("n1", ALL8), ("n2", ALL8)]);
    s.apply(
        &Command::NodeDown {
            node: "n2".into(),
            reason: "no heartbeat for 10 s".into(),
            now: 20,
        },
        &mut d,
    );
    // Rank 0 on n1 still runs: the job is COMPLETING, not pending, so no pass
    // places it and a stale plan putting it on n1's GPUs again is refused.
    assert_eq!(s.jobs[&a].state, JobState::Completing);
    assert!(s.cluster_view().pending.is_empty());
    let early = s.apply(
        &Command::Schedule {
            allocations: vec![alloc(a.0, &[("n1", ALL8), ("n3", ALL8)])],
            now: 21,
        },
        &mut d,
    );
    assert!(
        matches!(&early, CommandResult::Scheduled { started, skipped }
            if started.is_empty() && skipped[0].1.contains("COMPLETING")),
        "{early:?}"
    );
    report(
        &mut s,
        &mut d,
        "n1",
        vec![ev(a, 0, TaskEventKind::Ended(TaskEnd::Cancelled))],
    );
    assert_eq!(s.jobs[&a].state, JobState::Pending);

    // The pass sees where it ran and keeps n1 at rank 0; n3 replaces n2.
    let view = s.cluster_view();
    let nodes: Vec<&str> = view.pending[0]
        .previous
        .iter()
        .map(|n| n.node.as_str())
        .collect();
    assert_eq!(nodes, ["n1", "n2"]);
    let plan = crate::sched::plan(&view, 30);
    let placed: Vec<&str> = plan.allocations[0]
        .nodes
        .iter()
        .map(|n| n.node.as_str())
        .collect();
    assert_eq!(placed, ["n1", "n3"]);
    let r = s.apply(
        &Command::Schedule {
            allocations: plan.allocations,
            now: 31,
        },
        &mut d,
    );
    assert!(
        matches!(&r, CommandResult::Scheduled { started, .. } if started == &vec![a]),
        "{r:?}"
    );
    let job = &s.jobs[&a];
    assert_eq!((job.state, job.restart_count), (JobState::Running, 1));
    let run = job.run.as_ref().unwrap();
    assert_eq!(run.attempt, 1);
    assert!(run.ended.is_empty() && run.started.is_empty());
    assert_eq!(run.master_addr, "10.1.0.1");
    assert_eq!(s.desired_on("n3").len(), 1);
    // Once running again it is no longer a restart for the pass.
    assert!(crate::sched::PendingJob::from(job).previous.is_empty());
}

fn init(s: &mut State, d: &mut Dirty, range: &str) {
    let r = s.apply(
        &Command::InitCluster {
            name: "c".into(),
            ca_cert_pem: "cert".into(),
            ca_key_pem: "key".into(),
            master_ports: range.parse::<PortRange>().unwrap(),
            now: 1,
        },
        d,
    );
    assert_eq!(r, CommandResult::Initialized);
}

#[test]
fn master_ports_come_from_the_cluster_range_and_running_out_waits() {
    let (mut s, mut d) = cluster();
    init(&mut s, &mut d, "40000-40001");
    let jobs: Vec<JobId> = (0..3).map(|_| submit(&mut s, &mut d, 1, 1)).collect();
    for (i, &j) in jobs.iter().take(2).enumerate() {
        let g = [i as u32];
        start(&mut s, &mut d, j, &[("n1", &g)]);
    }
    let ports: Vec<u16> = jobs[..2]
        .iter()
        .map(|j| s.jobs[j].run.as_ref().unwrap().master_port)
        .collect();
    assert_eq!(ports, [40000, 40001], "two jobs on n1, two ports");

    // Both ports of n1 are taken: apply refuses a third job there, naming
    // the range; the pass sends it to n2 instead, or waits with a reason.
    let r = s.apply(
        &Command::Schedule {
            allocations: vec![alloc(jobs[2].0, &[("n1", &[5])])],
            now: 6,
        },
        &mut d,
    );
    let CommandResult::Scheduled { skipped, .. } = &r else {
        panic!("{r:?}")
    };
    assert!(skipped[0].1.contains("range 40000-40001"), "{r:?}");
    assert_eq!(s.jobs[&jobs[2]].state, JobState::Pending);
    let mut view = s.cluster_view();
    assert_eq!(view.master_ports, Some(2));
    let plan = crate::sched::plan(&view, 7);
    assert_eq!(plan.allocations[0].nodes[0].node, "n2");
    view.nodes.retain(|n| n.name == "n1");
    let plan = crate::sched::plan(&view, 7);
    assert_eq!(
        plan.pending,
        vec![(jobs[2], crate::sched::PendingReason::NoMasterPort)]
    );
}

fn set_ports(s: &mut State, d: &mut Dirty, range: &str) -> CommandResult {
    s.apply(
        &Command::Policy {
            change: PolicyChange::MasterPorts {
                range: range.into(),
            },
            by: "root".into(),
            now: 8,
        },
        d,
    )
}

#[test]
fn an_admin_changes_the_range_and_running_jobs_keep_their_ports() {
    let (mut s, mut d) = cluster();
    let r = set_ports(&mut s, &mut d, "40000-40009");
    assert!(
        matches!(&r, CommandResult::Rejected(Rejection::Policy(m)) if m.contains("not initialised")),
        "{r:?}"
    );
    init(&mut s, &mut d, "40000-40001");
    let jobs: Vec<JobId> = (0..3).map(|_| submit(&mut s, &mut d, 1, 1)).collect();
    for (i, &j) in jobs.iter().take(2).enumerate() {
        start(&mut s, &mut d, j, &[("n1", &[i as u32])]);
    }
    let port = |s: &State, j: &JobId| s.jobs[j].run.as_ref().unwrap().master_port;

    // A bad range is refused naming it and the fix; nothing changes.
    for (bad, says) in [
        (
            "30000-29500",
            "backwards; write the lower port first (29500-30000)",
        ),
        ("80-90", "privileged"),
        ("29500", "write FIRST-LAST"),
    ] {
        let mut dirty = Dirty::default();
        let r = set_ports(&mut s, &mut dirty, bad);
        let CommandResult::Rejected(Rejection::Policy(m)) = &r else {
            panic!("{bad}: {r:?}")
        };
        assert!(m.contains(&format!("{bad:?}")) && m.contains(says), "{m}");
        assert!(dirty.is_empty(), "{bad}: {dirty:?}");
        assert_eq!(s.master_ports().to_string(), "40000-40001");
    }

    // A range without one of the ports in use: the running jobs keep theirs,
    // and the next job on the node gets a port of the new range not in use.
    let r = set_ports(&mut s, &mut d, "40001-40002");
    let CommandResult::PolicyUpdated { what } = &r else {
        panic!("{r:?}")
    };
    assert!(
        what.contains("40001-40002") && what.contains("was 40000-40001"),
        "{what}"
    );
    assert!(d.meta);
    assert_eq!(s.master_ports().len(), 2);
    assert_eq!(s.cluster_view().master_ports, Some(2));
    start(&mut s, &mut d, jobs[2], &[("n1", &[2])]);
    assert_eq!(
        jobs.iter().map(|j| port(&s, j)).collect::<Vec<_>>(),
        [40000, 40001, 40002]
    );
}
