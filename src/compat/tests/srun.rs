//! `srun`: flags, translation and shapes, without a cluster.

use super::*;

fn parse(words: &[&str]) -> SrunArgs {
    let words: Vec<String> = words.iter().map(|s| s.to_string()).collect();
    parse_args(&words).unwrap().unwrap()
}

fn nodes(n: usize) -> Vec<String> {
    (1..=n).map(|i| format!("n{i}")).collect()
}

#[test]
fn the_command_is_well_formed() {
    command().debug_assert();
}

#[test]
fn default_step_is_the_whole_allocation() {
    let a = parse(&["python", "train.py"]);
    assert_eq!(
        step_shape(&a, &nodes(2), 8).unwrap(),
        (vec![0, 1], vec![8, 8])
    );
    assert_eq!(a.alloc.job.script_or_command, ["python", "train.py"]);
}

#[test]
fn node_and_task_counts_pick_a_subset() {
    let shape = |w: &[&str]| step_shape(&parse(w), &nodes(4), 2);
    assert_eq!(
        shape(&["-N", "1", "-n", "1", "x"]).unwrap(),
        (vec![0], vec![1])
    );
    assert_eq!(shape(&["-N", "2", "x"]).unwrap(), (vec![0, 1], vec![1, 1]));
    assert_eq!(shape(&["-n", "3", "x"]).unwrap(), (vec![0, 1], vec![2, 1]));
    assert_eq!(
        shape(&["-w", "n3", "-N", "1", "-n", "1", "x"]).unwrap(),
        (vec![2], vec![1])
    );
    assert_eq!(
        shape(&["--ntasks-per-node", "3", "-N", "2", "x"]).unwrap(),
        (vec![0, 1], vec![3, 3])
    );
    assert!(shape(&["-w", "n9", "x"]).unwrap_err().contains("n9"));
    assert!(shape(&["-N", "5", "x"]).unwrap_err().contains("-N 5"));
    assert!(shape(&["-N", "3", "-n", "2", "x"]).is_err());
}

#[test]
fn srun_flags_parse_and_options_after_the_command_are_its_own() {
    let a = parse(&[
        "--mpi=pmix_v3",
        "-l",
        "-u",
        "-K",
        "--cpu-bind=cores",
        "python",
        "-u",
        "x.py",
    ]);
    assert!(a.label && a.unbuffered);
    assert_eq!(a.kill_on_bad_exit, Some(1));
    assert_eq!(a.mpi.as_deref(), Some("pmix_v3"));
    assert_eq!(a.alloc.job.script_or_command, ["python", "-u", "x.py"]);
    let e = parse_args(&["--bogus".into(), "x".into()]).unwrap_err();
    assert!(e.message.contains("'--bogus'"), "{}", e.message);
}
