//! Failover and faults: leader SIGKILLs under load, partitions in network
//! namespaces, whole-cluster restarts, agent failover; every client
//! operation goes into a history that `common::history` checks.

mod common;

/// The history checker's own tests: histories that must pass and must fail.
mod history_checker {
    use super::common::history::*;
    use gpuq::model::JobState::{self, *};

    fn op(key: &str, outcome: Option<Outcome>) -> Op {
        Op {
            key: key.into(),
            outcome,
        }
    }

    fn job(id: u64, name: &str, state: JobState) -> FinalJob {
        FinalJob {
            id,
            name: name.into(),
            state,
        }
    }

    fn seen(observer: &str, job: u64, state: JobState) -> Observation {
        Observation {
            observer: observer.into(),
            job,
            state,
        }
    }

    fn fails_with(r: Result<(), Vec<String>>, needle: &str) {
        let errs = r.expect_err("the checker must refuse this history");
        assert!(
            errs.iter().any(|e| e.contains(needle)),
            "expected a violation mentioning {needle:?}, got {errs:?}"
        );
    }

    #[test]
    fn a_clean_history_passes() {
        let ops = [
            op("a", Some(Outcome::Ok(1))),
            op("b", Some(Outcome::Unknown("timeout".into()))),
            op("c", Some(Outcome::Unknown("timeout".into()))),
            op("d", Some(Outcome::Fail("not leader".into()))),
            op("e", None),
        ];
        let obs = [
            seen("s1#0", 1, Pending),
            seen("s1#0", 1, Running),
            // Another observer lags: it may see an older state later.
            seen("s2#0", 1, Pending),
            seen("s2#0", 1, Completed),
        ];
        let jobs = [job(1, "a", Completed), job(2, "b", Pending)];
        check(&ops, &obs, &jobs).unwrap();
    }

    #[test]
    fn a_lost_acknowledged_job_fails() {
        let ops = [op("a", Some(Outcome::Ok(1)))];
        fails_with(check(&ops, &[], &[]), "was lost");
    }

    #[test]
    fn an_acknowledged_job_present_twice_fails() {
        let ops = [op("a", Some(Outcome::Ok(1)))];
        let jobs = [job(1, "a", Pending), job(2, "a", Pending)];
        fails_with(check(&ops, &[], &jobs), "exists 2 times");
    }

    #[test]
    fn an_id_given_twice_fails() {
        let ops = [op("a", Some(Outcome::Ok(7))), op("b", Some(Outcome::Ok(7)))];
        let jobs = [job(7, "a", Pending)];
        fails_with(check(&ops, &[], &jobs), "given to two submissions");
    }

    #[test]
    fn an_unknown_submission_present_twice_fails() {
        let ops = [op("u", Some(Outcome::Unknown("lost answer".into())))];
        let jobs = [job(1, "u", Pending), job(2, "u", Running)];
        fails_with(check(&ops, &[], &jobs), "exists 2 times");
    }

    #[test]
    fn a_failed_submission_that_exists_fails() {
        let ops = [op("f", Some(Outcome::Fail("not leader".into())))];
        fails_with(
            check(&ops, &[], &[job(3, "f", Pending)]),
            "failed (not leader) yet exists",
        );
    }

    #[test]
    fn a_forbidden_transition_fails() {
        let obs = [seen("s1#0", 1, Completed), seen("s1#0", 1, Running)];
        fails_with(
            check(&[], &obs, &[job(1, "a", Completed)]),
            "COMPLETED -> RUNNING",
        );
        // Requeue (RUNNING -> PENDING) is allowed; leaving a final state is not.
        let obs = [
            seen("s1#0", 2, Running),
            seen("s1#0", 2, Pending),
            seen("s1#0", 2, Cancelled),
        ];
        check(&[], &obs, &[job(2, "b", Cancelled)]).unwrap();
        let obs = [seen("s3#1", 4, Cancelled)];
        fails_with(check(&[], &obs, &[job(4, "c", Pending)]), "ended PENDING");
    }
}
