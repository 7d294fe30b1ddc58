//! `squeue`: codes, formats, filters and reasons, without a cluster.

use super::*;
use crate::model::{JobId, JobSpec};

fn job(id: u64, name: &str, state: JobState) -> Job {
    let spec = JobSpec {
        name: name.into(),
        nodes: 2,
        ntasks_per_node: 4,
        gpus_per_node: 8,
        cpus_per_task: 2,
        mem_per_node_mb: None,
        time_limit_secs: Some(3600),
        account: None,
        partition: Some("gpu".into()),
        output: None,
        error: None,
        workdir: "/home/u".into(),
        env: Vec::new(),
        export: Default::default(),
        program: crate::model::Program::Command {
            argv: vec!["true".into()],
        },
        requeue: Default::default(),
        max_restarts: 3,
        total_gpus: None,
        placement: Default::default(),
        queue: Default::default(),
        signal: None,
        qos: None,
        nice: 0,
        launch: Default::default(),
        submit_host: None,
        first_step: None,
        exclusive: false,
        container: None,
    };
    let mut j = Job::pending(JobId(id), "alice", spec, 0);
    j.state = state;
    j
}

fn args(words: &[&str]) -> SqueueArgs {
    SqueueArgs::try_parse_from(words).unwrap()
}

#[test]
fn every_state_has_slurms_code_and_parses_back() {
    let codes: Vec<&str> = JobState::ALL.iter().map(|s| state_code(*s)).collect();
    assert_eq!(
        codes,
        ["PD", "R", "CG", "CD", "F", "CA", "TO", "NF", "PR", "OOM"]
    );
    let words: Vec<String> = codes.iter().map(|c| c.to_lowercase()).collect();
    assert_eq!(parse_states(&words).unwrap(), JobState::ALL.to_vec());
    assert_eq!(
        parse_states(&["running".into()]).unwrap(),
        [JobState::Running]
    );
    assert_eq!(parse_states(&["all".into()]).unwrap().len(), 10);
    let e = parse_states(&["XX".into()]).unwrap_err();
    assert!(e.contains("XX") && e.contains("PD"), "{e}");
}

#[test]
fn default_columns_and_pending_reason() {
    let mut p = job(7, "train", JobState::Pending);
    p.reason = Some("Priority".into());
    let a = args(&[]);
    let text = render(&a, &[JobState::Pending], &[p], 0).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(
        lines[0].split_whitespace().collect::<Vec<_>>(),
        [
            "JOBID",
            "PARTITION",
            "NAME",
            "USER",
            "ST",
            "TIME",
            "NODES",
            "NODELIST(REASON)"
        ]
    );
    assert_eq!(
        lines[1].split_whitespace().collect::<Vec<_>>(),
        [
            "7",
            "gpu",
            "train",
            "alice",
            "PD",
            "0:00",
            "2",
            "(Priority)"
        ]
    );
}

#[test]
fn every_scheduler_reason_has_its_word() {
    use crate::sched::PendingReason as R;
    let all = [
        R::Resources,
        R::Priority,
        R::Unsatisfiable("x".into()),
        R::Dependency,
        R::QuotaExceeded,
        R::Held,
        R::BeginTime,
        R::Topology(crate::model::TopologyRequirement::Leaf),
        R::ReservedForOthers,
        R::DependencyNeverSatisfied("x".into()),
        R::JobArrayTaskLimit,
        R::NoMasterPort,
        R::PartitionDown,
        R::Preempting,
        R::ReservationNotStarted("r".into()),
        R::ReservedNodes {
            reservation: "m".into(),
            maint: true,
        },
        R::ReservedNodes {
            reservation: "r".into(),
            maint: false,
        },
        R::NodesStarting("burst".into()),
    ];
    for r in all {
        let mut j = job(1, "a", JobState::Pending);
        j.reason = Some(r.to_string());
        let want = match r {
            R::Held => "JobHeldUser",
            _ => r.as_str(),
        };
        assert_eq!(reason(&j), want, "{r}");
    }
}

#[test]
fn format_codes_and_filters() {
    let mut r = job(3, "a", JobState::Running);
    r.start_time = Some(1_000);
    let jobs = vec![r, job(4, "b", JobState::Pending)];
    let a = args(&["-h", "-o", "%i,%t,%T,%j,%D,%l,%C,%b,%M,%k,%A", "-n", "a"]);
    let all = JobState::ALL.to_vec();
    let text = render(&a, &all, &jobs, 66_000).unwrap();
    assert_eq!(
        text,
        "3,R,RUNNING,a,2,1:00:00,16,gres/gpu:8,1:05,(null),3\n"
    );
    let a = args(&["-h", "-o", "%i", "-t", "PD"]);
    let states = parse_states(&a.states).unwrap();
    assert_eq!(render(&a, &states, &jobs, 0).unwrap(), "4\n");
    let a = args(&["-h", "-o", "%i", "-u", "bob"]);
    assert_eq!(render(&a, &all, &jobs, 0).unwrap(), "");
    let a = args(&["-h", "-o", "%i", "-j", "4"]);
    assert_eq!(render(&a, &all, &jobs, 0).unwrap(), "4\n");
}

#[test]
fn field_formats_are_codes_with_widths() {
    let mut r = job(3, "train", JobState::Running);
    r.start_time = Some(1_000);
    let a = args(&["-h", "-O", "JobID:6,name:.8,State,TimeLeft:10,NumNodes:3"]);
    let all = JobState::ALL.to_vec();
    let text = render(&a, &all, &[r], 61_000).unwrap();
    assert_eq!(
        text,
        format!("3        train{:<20}59:00     2\n", "RUNNING"),
        "Slurm pads each field to its width, no separator"
    );
    let a = args(&["-O", "JobID"]);
    assert_eq!(render(&a, &all, &[], 0).unwrap(), "JOBID\n");
    let e = parse_field_format("JobID,Nmae").unwrap_err();
    assert!(
        e.contains("Nmae") && e.contains("did you mean name?"),
        "{e}"
    );
    let e = parse_field_format("Name:x").unwrap_err();
    assert!(e.contains("Name:x") && e.contains("Name:30"), "{e}");
    assert!(SqueueArgs::try_parse_from(["-o", "%i", "-O", "JobID"]).is_err());
}

#[test]
fn arrays_unfold_with_r_nodes_filter_with_w_and_start_shows_pending() {
    use crate::model::ArrayTask;
    let task = |id: u64, index: u32| {
        let mut j = job(id, "sweep", JobState::Pending);
        j.array = Some(ArrayTask {
            array_job: JobId(10),
            index,
            throttle: None,
            span: None,
        });
        j
    };
    let jobs = vec![task(10, 0), task(11, 1), task(12, 2)];
    let all = JobState::ALL.to_vec();
    let ids = |words: &[&str]| render(&args(words), &all, &jobs, 0).unwrap();
    assert_eq!(ids(&["-h", "-o", "%i"]), "10_[0-2]\n");
    assert_eq!(ids(&["-h", "-r", "-o", "%i"]), "10_0\n10_1\n10_2\n");
    assert_eq!(
        ids(&["-h", "-w", "n1", "-o", "%i"]),
        "",
        "pending jobs are on no node"
    );
    let a = args(&["--start"]);
    let head = render(&a, &all, &[], 0).unwrap();
    assert!(head.contains("START_TIME"), "{head}");
}
