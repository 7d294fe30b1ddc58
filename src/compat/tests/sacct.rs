//! `sacct`: flags, rows and Slurm's shapes, without a cluster.

use super::*;
use crate::model::acct::{AcctDetail, AcctStep};
use crate::model::ArrayTask;

fn args(words: &[&str]) -> SacctArgs {
    SacctArgs::try_parse_from(words).unwrap()
}

const HOUR: u64 = 3_600_000;

/// A batch job of two nodes, ended, with its batch step and one srun step.
fn finished() -> AcctRecord {
    AcctRecord {
        id: JobId(42),
        name: "train".into(),
        user: "alice".into(),
        account: "vision".into(),
        state: JobState::Failed,
        exit_code: Some(3),
        nodes: vec!["n1".into(), "n2".into()],
        gpus: 16,
        submit_time: 10 * HOUR,
        start_time: Some(10 * HOUR + 5_000),
        end_time: Some(11 * HOUR + 5_000),
        elapsed_secs: 3600,
        gpu_hours: 16.0,
        restart_count: 0,
        gpu_use: None,
        detail: AcctDetail {
            partition: Some("gpu".into()),
            req_nodes: 2,
            ntasks: 16,
            cpus: 32,
            req_gpus: 16,
            mem_per_node_mb: Some(1000),
            time_limit_secs: Some(2 * 86_400),
            workdir: "/home/alice".into(),
            steps: vec![
                AcctStep {
                    id: StepName::Batch,
                    name: "batch".into(),
                    state: JobState::Failed,
                    exit_code: 3,
                    signal: None,
                    start_time: 10 * HOUR + 5_000,
                    end_time: Some(11 * HOUR + 5_000),
                    nodes: vec!["n1".into()],
                    ntasks: 1,
                    cpus: 16,
                },
                AcctStep {
                    id: StepName::Step(0),
                    name: "python".into(),
                    state: JobState::Cancelled,
                    exit_code: 0,
                    signal: Some(15),
                    start_time: 10 * HOUR + 6_000,
                    end_time: Some(11 * HOUR),
                    nodes: vec!["n1".into(), "n2".into()],
                    ntasks: 16,
                    cpus: 32,
                },
            ],
            ..AcctDetail::default()
        },
    }
}

fn pending_task(id: u64, index: u32) -> AcctRecord {
    let mut r = finished();
    r.id = JobId(id);
    r.state = JobState::Pending;
    r.exit_code = None;
    r.nodes.clear();
    r.gpus = 0;
    r.start_time = None;
    r.end_time = None;
    r.detail.steps.clear();
    r.detail.reason = Some("Priority".into());
    r.detail.array = Some(ArrayTask {
        array_job: JobId(50),
        index,
        throttle: None,
        span: None,
    });
    r
}

fn q(a: &SacctArgs) -> Query {
    query(a, Some("alice"), false, None, 12 * HOUR).unwrap()
}

fn out(words: &[&str], records: &[AcctRecord]) -> String {
    let a = args(words);
    let q = q(&a);
    let folded = fold_pending(records);
    let rows = rows(&q, a.allocations, records, &folded);
    render(&a, &q.fields, &rows, 12 * HOUR)
}

#[test]
fn the_command_is_well_formed() {
    <SacctArgs as clap::CommandFactory>::command().debug_assert();
}

#[test]
fn default_fields_are_slurms_with_a_dashed_rule() {
    let text = out(&[], &[finished()]);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(
        lines[0],
        "JobID           JobName  Partition    Account  AllocCPUS      State ExitCode "
    );
    assert_eq!(
        lines[1],
        "------------ ---------- ---------- ---------- ---------- ---------- -------- "
    );
    assert_eq!(
        lines[2].split_whitespace().collect::<Vec<_>>(),
        ["42", "train", "gpu", "vision", "32", "FAILED", "3:0"]
    );
    assert_eq!(
        lines[3].split_whitespace().collect::<Vec<_>>(),
        ["42.batch", "batch", "vision", "16", "FAILED", "3:0"]
    );
    assert_eq!(
        lines[4].split_whitespace().collect::<Vec<_>>(),
        ["42.0", "python", "vision", "32", "CANCELLED", "0:15"]
    );
    assert_eq!(lines.len(), 5);
}

#[test]
fn parsable_output_and_chosen_fields() {
    let recs = [finished()];
    let text = out(
        &["-P", "-o", "jobid,state,NodeList,elapsed,Timelimit"],
        &recs,
    );
    assert_eq!(
        text,
        "JobID|State|NodeList|Elapsed|Timelimit\n\
         42|FAILED|n[1-2]|01:00:00|2-00:00:00\n\
         42.batch|FAILED|n1|01:00:00|\n\
         42.0|CANCELLED|n[1-2]|00:59:54|\n"
    );
    let text = out(
        &["-p", "-n", "-X", "-o", "JobIDRaw,AllocTRES,ReqMem"],
        &recs,
    );
    assert_eq!(
        text,
        "42|billing=32,cpu=32,gres/gpu=16,mem=2000M,node=2|1000M|\n"
    );
    let text = out(&["-n", "-X", "-o", "JobName%4,JobID%-6,State%12"], &recs);
    assert_eq!(
        text, "tra+ 42           FAILED \n",
        "cut with +, widths, - for left"
    );
}

#[test]
fn steps_and_array_tasks_are_picked_by_id() {
    let recs = [finished(), pending_task(50, 0), pending_task(51, 1)];
    let ids = |words: &[&str]| -> Vec<String> {
        let mut w = vec!["-n", "-P", "-o", "JobID"];
        w.extend_from_slice(words);
        out(&w, &recs).lines().map(str::to_string).collect()
    };
    assert_eq!(ids(&["-j", "42.0"]), ["42.0"]);
    assert_eq!(ids(&["-j", "42.batch,50_1"]), ["42.batch", "50_1"]);
    assert_eq!(ids(&["-j", "50"]), ["50_[0-1]"], "pending tasks fold");
    assert_eq!(ids(&["-X"]), ["42", "50_[0-1]"]);
    let mut started = recs.to_vec();
    started[2].state = JobState::Running;
    let folded = fold_pending(&started);
    assert_eq!(folded[1..], [Some("50_0".to_string()), Some("50_1".into())]);
    let a = args(&["-j", "50_1", "-j", "42"]);
    assert_eq!(q(&a).filter.ids, vec![JobId(50), JobId(42)]);
}

#[test]
fn pending_and_cancelled_jobs_read_as_slurm_writes_them() {
    let p = pending_task(50, 3);
    let text = out(
        &[
            "-n",
            "-P",
            "-o",
            "JobID,State,Start,End,NodeList,Reason,Elapsed,AllocCPUS,ReqCPUS",
        ],
        &[p],
    );
    assert_eq!(
        text,
        "50_3|PENDING|Unknown|Unknown|None assigned|Priority|00:00:00|0|32\n"
    );
    let mut c = finished();
    c.state = JobState::Cancelled;
    c.detail.cancelled_by = Some("root".into());
    assert_eq!(state_word(&c), "CANCELLED by 0");
    c.detail.requeueing = true;
    assert_eq!(state_word(&c), "REQUEUED");
}

#[test]
fn the_window_users_and_states_reach_the_request() {
    let a = args(&[]);
    let f = q(&a).filter;
    assert_eq!(f.since, Some(0), "midnight of the day `now` is in");
    assert_eq!(f.user.as_deref(), Some("alice"), "your own jobs");
    assert!(f.active, "jobs not ended too");
    let a = args(&["-j", "7"]);
    assert_eq!(q(&a).filter.since, None, "-j: any time");
    let a = args(&["-a", "-s", "F,TO", "-S", "now-2hours", "-E", "now"]);
    let f = q(&a).filter;
    assert_eq!(f.user, None);
    assert_eq!(f.states, vec![JobState::Failed, JobState::Timeout]);
    let now = crate::clock::now_ms();
    let (since, until) = (f.since.unwrap(), f.until.unwrap());
    assert!(until <= now && until + 60_000 > now, "-E now");
    assert!((until - since).abs_diff(2 * HOUR) < 1000, "-S now-2hours");
    assert!(query(&args(&[]), Some("root"), true, None, 0)
        .unwrap()
        .filter
        .user
        .is_none());
    let a = args(&["-u", "bob,carol"]);
    let q2 = q(&a);
    assert_eq!(
        (q2.filter.user.clone(), q2.users.clone()),
        (None, vec!["bob".to_string(), "carol".into()])
    );
}

#[test]
fn bad_inputs_name_the_input_and_the_fix() {
    let bad = |words: &[&str]| {
        query(&args(words), Some("alice"), false, None, 0)
            .err()
            .unwrap()
    };
    let e = bad(&["-o", "JobID,Sate"]);
    assert!(
        e.contains("\"Sate\"") && e.contains("State") && e.contains("sacct -e"),
        "{e}"
    );
    let e = bad(&["-o", "JobName%x"]);
    assert!(e.contains("JobName%x") && e.contains("JobName%30"), "{e}");
    let e = bad(&["-j", "12.x"]);
    assert!(e.contains("12.x") && e.contains("12.batch"), "{e}");
    let e = bad(&["-s", "DONE"]);
    assert!(e.contains("DONE") && e.contains("PD"), "{e}");
    let e = bad(&["-S", "yesterday"]);
    assert!(e.contains("--starttime") && e.contains("yesterday"), "{e}");
    let e = bad(&["-S", "2026-12-02", "-E", "2026-12-01"]);
    assert!(e.contains("after"), "{e}");
    let e = query(&args(&[]), None, false, None, 0).err().unwrap();
    assert!(e.contains("-u") && e.contains("-a"), "{e}");
    assert_eq!(parse_fields("JobID").unwrap()[0].width, 12);
    let env = query(&args(&[]), Some("a"), false, Some("jobid,state"), 0).unwrap();
    assert_eq!(env.fields.len(), 2, "$SACCT_FORMAT is the default");
}
