//! `sbatch`: flags, translation and shapes, without a cluster.

use super::*;

fn parse(words: &[&str]) -> SbatchArgs {
    let words: Vec<String> = words.iter().map(|s| s.to_string()).collect();
    parse_args(&words).unwrap().unwrap()
}

fn spec_of(script: &str, flags: &[&str]) -> Result<JobSpec, String> {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("job.sh"), script).unwrap();
    let mut words = flags.to_vec();
    words.push("job.sh");
    let env = vec![("PATH".to_string(), "/usr/bin:/bin".to_string())];
    build(&parse(&words), &env, dir.path())
        .map(|(spec, _)| spec)
        .map_err(|e| e.message)
}

#[test]
fn common_flags_land_on_the_spec() {
    let spec = spec_of(
        "#!/bin/sh\nhostname\n",
        &[
            "-J",
            "train",
            "-p",
            "gpu",
            "-t",
            "1:00:00",
            "-N",
            "2",
            "--ntasks-per-node",
            "4",
            "-c",
            "8",
            "--gres=gpu:h100:8",
            "--mem",
            "64G",
            "-o",
            "out-%j.txt",
            "-e",
            "err-%j.txt",
            "-q",
            "high",
            "-A",
            "proj",
            "-x",
            "n[5-6]",
            "-w",
            "n[1-4]",
            "-H",
            "--no-requeue",
        ],
    )
    .unwrap();
    assert_eq!(spec.name, "train");
    assert_eq!(spec.partition.as_deref(), Some("gpu"));
    assert_eq!(spec.time_limit_secs, Some(3600));
    assert_eq!(
        (spec.nodes, spec.ntasks_per_node, spec.cpus_per_task),
        (2, 4, 8)
    );
    assert_eq!(spec.gpus_per_node, 8);
    assert_eq!(spec.placement.gpu_type.as_deref(), Some("h100"));
    assert_eq!(spec.mem_per_node_mb, Some(64 * 1024));
    assert_eq!(spec.output.as_deref(), Some("out-%j.txt"));
    assert_eq!(spec.error.as_deref(), Some("err-%j.txt"));
    assert_eq!(spec.qos.as_deref(), Some("high"));
    assert_eq!(spec.account.as_deref(), Some("proj"));
    assert_eq!(spec.placement.exclude, ["n5", "n6"]);
    assert_eq!(spec.placement.nodelist, ["n1", "n2", "n3", "n4"]);
    assert!(spec.queue.hold);
    assert_eq!(spec.requeue, crate::model::RequeuePolicy::Never);
}

#[test]
fn directives_are_read_with_sbatch_grammar_and_flags_win() {
    let script = "#!/bin/bash\n#SBATCH -n 8 -N 2\n#SBATCH --job-name='my job'\n\
                  #SBATCH --mail-type=ALL --time=10\n#SBATCH --gpus-per-node=2\necho hi\n\
                  #SBATCH --nodes 9\n";
    let spec = spec_of(script, &["-t", "5"]).unwrap();
    assert_eq!(spec.name, "my job");
    assert_eq!((spec.nodes, spec.ntasks_per_node), (2, 4));
    assert_eq!(spec.gpus_per_node, 2);
    assert_eq!(spec.time_limit_secs, Some(300), "the flag wins");
    assert_eq!(spec.output.as_deref(), Some(DEFAULT_OUTPUT));
}

#[test]
fn sbatch_requeue_is_gpuqs_default_policy() {
    let spec = spec_of("#!/bin/sh\n#SBATCH --no-requeue\ntrue\n", &["--requeue"]).unwrap();
    assert_eq!(spec.requeue, crate::model::RequeuePolicy::OnNodeFailure);
    let spec = spec_of("#!/bin/sh\ntrue\n", &[]).unwrap();
    assert_eq!(spec.requeue, crate::model::RequeuePolicy::OnNodeFailure);
}

#[test]
fn ntasks_becomes_tasks_per_node() {
    let t = |words: &[&str]| translate(&parse(words));
    let a = t(&["-n", "4"]).unwrap();
    assert_eq!((a.nodes, a.ntasks_per_node), (None, Some(4)));
    let a = t(&["-n", "8", "--ntasks-per-node", "4"]).unwrap();
    assert_eq!(
        (a.nodes, a.ntasks_per_node),
        (Some(crate::model::NodeRange::fixed(2)), Some(4))
    );
    let e = t(&["-n", "5", "-N", "2"]).unwrap_err();
    assert!(e.contains("-n 5") && e.contains("-N 2"), "{e}");
    let e = t(&["-n", "6", "-N", "2", "--ntasks-per-node", "4"]).unwrap_err();
    assert!(e.contains("--ntasks-per-node 4"), "{e}");
    assert!(t(&["-n", "2", "-G", "16"]).is_err());
}

#[test]
fn per_cpu_and_per_gpu_amounts_become_per_node_and_per_task() {
    let t = |words: &[&str]| translate(&parse(words));
    let a = t(&[
        "--gpus-per-node",
        "8",
        "--ntasks-per-node",
        "8",
        "--cpus-per-gpu",
        "4",
    ])
    .unwrap();
    assert_eq!(a.cpus_per_task, Some(4));
    let a = t(&["--gres=gpu:4", "--mem-per-gpu", "10G"]).unwrap();
    assert_eq!(a.mem, Some(40 * 1024));
    let a = t(&["-n", "4", "-c", "2", "--mem-per-cpu", "1G"]).unwrap();
    assert_eq!(a.mem, Some(8 * 1024));
    let a = t(&["-N", "2", "-G", "16", "--mem-per-gpu", "1G"]).unwrap();
    assert_eq!(a.mem, Some(8 * 1024));
    assert!(t(&["--mem-per-gpu", "1G"])
        .unwrap_err()
        .contains("needs GPUs"));
    assert!(t(&["-G", "4", "--mem-per-gpu", "1G"])
        .unwrap_err()
        .contains("-N"));
    let e = t(&[
        "--gpus-per-node",
        "1",
        "--ntasks-per-node",
        "2",
        "--cpus-per-gpu",
        "1",
    ])
    .unwrap_err();
    assert!(e.contains("--cpus-per-gpu 1"), "{e}");
    assert!(parse_args(&["--mem=1G".into(), "--mem-per-cpu=1G".into()]).is_err());
    // A directive's --mem gives way to a flag's --mem-per-cpu, and the
    // other way round; so do -c and --cpus-per-gpu.
    let merged = parse(&["--mem", "1G"]).overlay(&parse(&["--mem-per-cpu", "2G"]));
    assert_eq!(translate(&merged).unwrap().mem, Some(2048));
    let merged = parse(&["--mem-per-cpu", "2G"]).overlay(&parse(&["--mem", "1G"]));
    assert_eq!(translate(&merged).unwrap().mem, Some(1024));
    let merged =
        parse(&["--gpus-per-node", "2", "--cpus-per-gpu", "4"]).overlay(&parse(&["-c", "3"]));
    assert_eq!(translate(&merged).unwrap().cpus_per_task, Some(3));
}

#[test]
fn gpus_per_task_times_the_tasks_per_node() {
    let t = |words: &[&str]| translate(&parse(words));
    let a = t(&["--ntasks-per-node", "4", "--gpus-per-task", "2"]).unwrap();
    assert_eq!(a.gpus().map(|g| g.count), Some(8));
    assert!(parse_args(&["--gpus-per-task=1".into(), "--gres=gpu:2".into()]).is_err());
    let merged = parse(&["--gpus-per-task", "1"]).overlay(&parse(&["--gres=gpu:4"]));
    assert_eq!(translate(&merged).unwrap().gpus().map(|g| g.count), Some(4));
}

#[test]
fn the_commands_are_well_formed() {
    command().debug_assert();
    <super::super::squeue::SqueueArgs as CommandFactory>::command().debug_assert();
    <super::super::scancel::ScancelArgs as CommandFactory>::command().debug_assert();
    <super::super::sinfo::SinfoArgs as CommandFactory>::command().debug_assert();
}

#[test]
fn ignored_flags_are_listed_unknown_ones_refused() {
    let a = parse(&[
        "--mail-type=END",
        "--mail-user",
        "me@x",
        "--comment",
        "c",
        "--wckey=k",
    ]);
    assert_eq!(
        a.ignored(),
        ["--mail-type", "--mail-user", "--comment", "--wckey"]
    );
    let e = parse_args(&["--bogus-flag".into(), "x.sh".into()]).unwrap_err();
    assert_eq!(e.code, 1);
    assert!(e.message.contains("'--bogus-flag'"), "{}", e.message);
    let e = parse_args(&["--parsabel".into()]).unwrap_err();
    assert!(
        e.message.contains("did you mean --parsable"),
        "{}",
        e.message
    );
}

#[test]
fn bad_scripts_and_directives_name_the_line_and_fix() {
    let e = spec_of("echo no shebang\n", &[]).unwrap_err();
    assert!(e.contains("#!"), "{e}");
    let e = spec_of("#!/bin/sh\n#SBATCH --frobnicate\ntrue\n", &[]).unwrap_err();
    assert!(e.contains("line 2") && e.contains("--frobnicate"), "{e}");
    let e = spec_of("#!/bin/sh\n#SBATCH -N 0\ntrue\n", &[]).unwrap_err();
    assert!(e.contains("line 2"), "{e}");
}

#[test]
fn parsable_and_wait_come_from_flags_or_directives() {
    let a = parse(&["--parsable", "-W"]);
    assert!(a.parsable && a.wait);
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("j.sh"),
        "#!/bin/sh\n#SBATCH --parsable\ntrue\n",
    )
    .unwrap();
    let (_, merged) = build(&parse(&["j.sh"]), &[], dir.path()).unwrap();
    assert!(merged.parsable && !merged.wait);
}

#[test]
fn exit_status_of_ended_jobs() {
    let spec = spec_of("#!/bin/sh\ntrue\n", &[]).unwrap();
    let mut job = Job::pending(JobId(1), "u", spec, 0);
    job.state = JobState::Completed;
    assert_eq!(exit_status(&job), 0);
    job.state = JobState::Failed;
    job.exit_code = Some(3);
    assert_eq!(exit_status(&job), 3);
    job.state = JobState::Cancelled;
    job.exit_code = None;
    assert_eq!(exit_status(&job), 1);
}

#[test]
fn gres_with_a_mig_profile_asks_for_slices() {
    let spec = spec_of(
        "#!/bin/sh\n#SBATCH --gres=gpu:1g.10gb:2\nnvidia-smi -L\n",
        &[],
    )
    .unwrap();
    assert_eq!(spec.placement.gpu_slice.as_deref(), Some("1g.10gb"));
    assert_eq!(spec.gpus_per_node, 2);
    let err = spec_of("#!/bin/sh\ntrue\n", &["--gpus-per-node=9g.90gb:1"]).unwrap_err();
    assert!(err.contains("unknown MIG profile"), "{err}");
}

#[test]
fn a_node_range_makes_an_elastic_job() {
    let s = spec_of(
        "#!/bin/sh\n#SBATCH -N 2-4\n#SBATCH --gpus-per-node=8\ntrain\n",
        &[],
    )
    .unwrap();
    let range = crate::model::NodeRange { min: 2, max: 4 };
    assert_eq!((s.nodes, s.placement.elastic), (2, Some(range)));
    // torchrun's spelling, and a flag over the directive.
    let s = spec_of("#!/bin/sh\n#SBATCH --nodes=2:4\ntrain\n", &["-N", "3"]).unwrap();
    assert_eq!((s.nodes, s.placement.elastic), (3, None));
}
