//! Tests of the submit grammar and `build_spec`, end to end from argv and
//! script text to the `JobSpec` a user would see.

mod mig;
mod placement;

use std::fs;
use std::path::Path;

use clap::error::ErrorKind;
use clap::{CommandFactory, Parser};
use tempfile::TempDir;

use super::*;
use crate::model::ExportMode;

/// `gpuq submit` as `main.rs` will mount it.
#[derive(Parser, Debug)]
#[command(name = "gpuq-submit")]
pub(super) struct Submit {
    #[command(flatten)]
    args: SubmitArgs,
}

pub(super) fn parse(argv: &[&str]) -> Result<SubmitArgs, clap::Error> {
    Submit::try_parse_from(std::iter::once("gpuq-submit").chain(argv.iter().copied()))
        .map(|s| s.args)
}

pub(super) fn args(argv: &[&str]) -> SubmitArgs {
    parse(argv).unwrap_or_else(|e| panic!("{argv:?}: {e}"))
}

pub(super) fn parse_err(argv: &[&str]) -> clap::Error {
    parse(argv).expect_err(&format!("{argv:?} should be refused"))
}

pub(super) fn env() -> Vec<(String, String)> {
    vec![
        ("HOME".into(), "/home/ada".into()),
        ("PATH".into(), "/usr/bin".into()),
    ]
}

pub(super) fn write(dir: &TempDir, name: &str, content: &str) -> String {
    fs::write(dir.path().join(name), content).unwrap();
    name.to_string()
}

pub(super) fn spec(argv: &[&str], cwd: &Path) -> Result<JobSpec, SpecError> {
    build_spec(&args(argv), &env(), cwd)
}

pub(super) fn spec_ok(argv: &[&str], cwd: &Path) -> JobSpec {
    spec(argv, cwd).unwrap_or_else(|e| panic!("{argv:?}: {e}"))
}

pub(super) fn spec_err(argv: &[&str], cwd: &Path) -> String {
    spec(argv, cwd)
        .expect_err(&format!("{argv:?} should be refused"))
        .to_string()
}

#[test]
fn the_clap_definition_is_consistent() {
    Submit::command().debug_assert();
    DirectiveLine::command().debug_assert();
}

#[test]
fn every_flag_short_and_long() {
    let a = args(&[
        "-J",
        "train",
        "-N",
        "4",
        "--ntasks-per-node",
        "8",
        "--gpus-per-node",
        "h100:8",
        "-c",
        "12",
        "--mem",
        "512G",
        "-t",
        "2-00:00:00",
        "-A",
        "ml",
        "-p",
        "gpu",
        "-o",
        "o-%j.log",
        "-e",
        "e-%j.log",
        "-D",
        "runs",
        "--export",
        "NONE,HOME",
        "job.sh",
    ]);
    assert_eq!(a.job_name.as_deref(), Some("train"));
    assert_eq!(a.nodes, Some(crate::model::NodeRange::fixed(4)));
    assert_eq!(a.ntasks_per_node, Some(8));
    assert_eq!(
        a.gpus(),
        Some(&GpuRequest {
            gpu_type: Some("h100".into()),
            count: 8
        })
    );
    assert_eq!(a.cpus_per_task, Some(12));
    assert_eq!(a.mem, Some(512 << 10));
    assert_eq!(a.time, Some(TimeLimit(Some(2 * 86_400))));
    assert_eq!(a.account.as_deref(), Some("ml"));
    assert_eq!(a.partition.as_deref(), Some("gpu"));
    assert_eq!(a.output.as_deref(), Some("o-%j.log"));
    assert_eq!(a.error.as_deref(), Some("e-%j.log"));
    assert_eq!(a.chdir.as_deref(), Some(Path::new("runs")));
    assert_eq!(
        a.export.as_ref().map(|e| e.mode.clone()),
        Some(ExportMode::Listed)
    );
    assert_eq!(a.script_or_command, ["job.sh"]);

    let long = args(&[
        "--job-name=x",
        "--nodes=2",
        "--cpus-per-task=3",
        "--time=UNLIMITED",
        "--account=a",
        "--partition=p",
        "--output=o",
        "--error=e",
        "--chdir=/tmp",
        "--gres=gpu:2",
        "x.sh",
    ]);
    assert_eq!(long.nodes, Some(crate::model::NodeRange::fixed(2)));
    assert_eq!(long.time, Some(TimeLimit(None)));
    assert_eq!(long.gpus().map(|g| g.count), Some(2));
}

#[test]
fn numbers_are_checked_by_clap() {
    for (argv, needle) in [
        (&["--nodes", "0"][..], "0 is not in 1.."),
        (&["--nodes", "-2"][..], "-2 is not in 1.."),
        (&["--nodes=-2"][..], "-2 is not in 1.."),
        (&["--nodes", "x"][..], "invalid digit"),
        (&["--nodes", "99999999999"][..], "not in 1.."),
        (&["--ntasks-per-node", "0"][..], "0 is not in 1.."),
        (&["-c", "0"][..], "0 is not in 1.."),
        (&["--gpus-per-node", "-1"][..], "is not a number"),
        (&["--mem", "12XB"][..], "unknown unit \"XB\""),
        (&["--mem", "-5"][..], "is negative"),
        (&["--time", "25:99"][..], "seconds must be 0-59"),
        (&["--time", "-1"][..], "is negative"),
        (&["--output", "x-%Q"][..], "unknown escape %Q"),
        (&["--export", "1X"][..], "not a variable name"),
        (&["--gres", "nvme:1"][..], "only GPUs"),
    ] {
        let err = parse_err(argv);
        assert_eq!(err.kind(), ErrorKind::ValueValidation, "{argv:?}: {err}");
        let msg = err.to_string();
        assert!(msg.contains(needle), "{argv:?}: {msg}");
        assert!(
            msg.contains(argv[0].split('=').next().unwrap()),
            "names the flag: {msg}"
        );
    }
}

#[test]
fn conflicting_flags_are_refused() {
    assert_eq!(
        parse_err(&["--gpus-per-node", "2", "--gres", "gpu:2", "x"]).kind(),
        ErrorKind::ArgumentConflict
    );
    assert_eq!(
        parse_err(&["--wrap", "hostname", "job.sh"]).kind(),
        ErrorKind::ArgumentConflict
    );
}

#[test]
fn the_command_takes_everything_after_it() {
    let a = args(&["-N", "2", "--", "python", "train.py", "--lr", "3"]);
    assert_eq!(a.nodes, Some(crate::model::NodeRange::fixed(2)));
    assert_eq!(a.script_or_command, ["python", "train.py", "--lr", "3"]);
    let a = args(&["python", "train.py", "--nodes", "3", "-N", "4"]);
    assert_eq!(a.nodes, None, "options after the command belong to it");
    assert_eq!(
        a.script_or_command,
        ["python", "train.py", "--nodes", "3", "-N", "4"]
    );
}

#[test]
fn a_mistyped_flag_is_not_taken_for_a_command() {
    let err = parse_err(&["--gpu", "8", "job.sh"]);
    assert_eq!(err.kind(), ErrorKind::UnknownArgument);
    assert!(err.to_string().contains("--gpus"), "{err}");
}

#[test]
fn directives_then_flags_with_defaults() {
    let dir = TempDir::new().unwrap();
    let script = write(
        &dir,
        "job.sh",
        "#!/bin/bash\n\
         #GPUQ -J from-directive --nodes 2\n\
         #SBATCH --time=1:00:00 --gpus-per-node=4\n\
         #SBATCH --mem 16G -p batch\n\
         #GPUQ --nodes 3\n\
         srun hostname\n\
         #GPUQ --nodes 9\n",
    );
    let s = spec_ok(&[&script], dir.path());
    assert_eq!(s.name, "from-directive");
    assert_eq!(
        s.nodes, 3,
        "a later directive wins; none after the first command counts"
    );
    assert_eq!(s.gpus_per_node, 4);
    assert_eq!(s.time_limit_secs, Some(3600));
    assert_eq!(s.mem_per_node_mb, Some(16 << 10));
    assert_eq!(s.partition.as_deref(), Some("batch"));
    assert_eq!(s.ntasks_per_node, 1);
    assert_eq!(s.cpus_per_task, 1);
    assert_eq!(s.output, None);
    assert_eq!(s.workdir, dir.path().to_str().unwrap());
    match &s.program {
        Program::Script { path, content, .. } => {
            assert_eq!(Path::new(path), dir.path().join("job.sh"));
            assert!(content.contains("srun hostname"));
        }
        other => panic!("{other:?}"),
    }

    let s = spec_ok(
        &[
            "-N",
            "5",
            "--gres",
            "gpu:a100:1",
            "-t",
            "UNLIMITED",
            "-J",
            "flag",
            &script,
        ],
        dir.path(),
    );
    assert_eq!(
        (s.nodes, s.gpus_per_node),
        (5, 1),
        "flags win over directives"
    );
    assert_eq!(
        s.time_limit_secs, None,
        "UNLIMITED on the command line beats the directive"
    );
    assert_eq!(s.name, "flag");
    assert_eq!(
        s.mem_per_node_mb,
        Some(16 << 10),
        "unset flags leave directives alone"
    );
}

#[test]
fn unknown_directives_suggest_the_nearest_flag() {
    let dir = TempDir::new().unwrap();
    let script = write(
        &dir,
        "job.sh",
        "#!/bin/sh\n#GPUQ -N 1\n#GPUQ --gpu 8\nhostname\n",
    );
    assert_eq!(
        spec_err(&[&script], dir.path()),
        "script job.sh line 3: unknown directive --gpu; did you mean --gpus?"
    );
    let script = write(&dir, "b.sh", "#!/bin/sh\n#SBATCH --tme=10\n");
    assert_eq!(
        spec_err(&[&script], dir.path()),
        "script b.sh line 2: unknown directive --tme; did you mean --time?"
    );
    let script = write(
        &dir,
        "c.sh",
        "#!/bin/sh\n#SBATCH --mail-user=ada@example.org\n",
    );
    let msg = spec_err(&[&script], dir.path());
    assert!(
        msg.starts_with("script c.sh line 2: unknown directive --mail-user; gpuq does not support"),
        "{msg}"
    );
}

#[test]
fn bad_directives_name_the_line_and_the_problem() {
    let dir = TempDir::new().unwrap();
    for (body, needle) in [
        (
            "#GPUQ --nodes 0\n",
            "line 2: invalid value '0' for '--nodes <N|MIN-MAX>': 0 is not in 1..",
        ),
        ("#GPUQ --time 25:99\n", "line 2: invalid value '25:99'"),
        ("#GPUQ -o out-%Q.log\n", "unknown escape %Q"),
        ("#GPUQ -J 'unclosed\n", "line 2: unterminated ' quote"),
        (
            "#GPUQ -J my job\n",
            "line 2: #GPUQ takes options only, but \"job\" is not one",
        ),
        (
            "#SBATCH --wrap hostname\n",
            "line 2: --wrap cannot be a directive",
        ),
        (
            "#GPUQ --nodes\n",
            "line 2: a value is required for '--nodes <N|MIN-MAX>'",
        ),
        ("#GPUQ --help\n", "line 2: unknown directive --help"),
    ] {
        let script = write(&dir, "job.sh", &format!("#!/bin/sh\n{body}true\n"));
        let msg = spec_err(&[&script], dir.path());
        assert!(msg.starts_with("script job.sh line 2: "), "{body}: {msg}");
        assert!(msg.contains(needle), "{body}: {msg}");
        assert!(!msg.contains("Usage"), "no clap usage block: {msg}");
    }
}

#[test]
fn quoted_directive_values() {
    let dir = TempDir::new().unwrap();
    let script = write(
        &dir,
        "job.sh",
        "#!/bin/sh\n#GPUQ --job-name \"big run\" --export 'ALL,MSG=a b' # why\nexit 0\n",
    );
    let s = spec_ok(&[&script], dir.path());
    assert_eq!(s.name, "big run");
    assert!(s.env.contains(&("MSG".into(), "a b".into())));
}

#[test]
fn script_or_command_rule() {
    let dir = TempDir::new().unwrap();
    let cwd = dir.path();
    write(&dir, "train.py", "#!/usr/bin/env python3\nprint(1)\n");
    write(&dir, "noshebang.sh", "hostname\n");
    write(&dir, "data.txt", "not a script\n");
    fs::create_dir(cwd.join("jobs")).unwrap();
    fs::create_dir(cwd.join("dir.sh")).unwrap();

    let kind = |w: &str| classify(w, cwd);
    assert_eq!(
        kind("train.py").unwrap(),
        ProgramKind::Script(cwd.join("train.py"))
    );
    assert_eq!(
        kind("noshebang.sh").unwrap(),
        ProgramKind::Script(cwd.join("noshebang.sh"))
    );
    let abs = cwd.join("train.py");
    assert_eq!(
        kind(abs.to_str().unwrap()).unwrap(),
        ProgramKind::Script(abs.clone())
    );
    assert_eq!(kind("data.txt").unwrap(), ProgramKind::Command);
    assert_eq!(kind("python").unwrap(), ProgramKind::Command);
    assert_eq!(kind("/opt/only/on/compute").unwrap(), ProgramKind::Command);
    assert_eq!(
        kind("jobs").unwrap(),
        ProgramKind::Command,
        "a bare word is a command"
    );
    assert!(matches!(
        kind("missing.sh"),
        Err(SpecError::ScriptNotFound { .. })
    ));
    assert!(matches!(
        kind("./jobs"),
        Err(SpecError::ScriptIsDirectory { .. })
    ));
    assert!(matches!(
        kind("dir.sh"),
        Err(SpecError::ScriptIsDirectory { .. })
    ));

    let s = spec_ok(&["python", "train.py", "--lr", "3"], cwd);
    assert_eq!(s.name, "python");
    assert_eq!(
        s.program,
        Program::Command {
            argv: vec![
                "python".into(),
                "train.py".into(),
                "--lr".into(),
                "3".into()
            ]
        }
    );
    let s = spec_ok(&["/usr/bin/env", "true"], cwd);
    assert_eq!(s.name, "env");
    let s = spec_ok(&["train.py"], cwd);
    assert_eq!(s.name, "train.py");
    assert!(matches!(s.program, Program::Script { .. }));

    let msg = spec_err(&["missing.sh"], cwd);
    assert!(msg.contains("script missing.sh does not exist"), "{msg}");
    assert!(
        msg.contains(cwd.to_str().unwrap()),
        "says where it looked: {msg}"
    );
    let msg = spec_err(&["./jobs"], cwd);
    assert!(msg.contains("./jobs is a directory"), "{msg}");
}

#[test]
fn script_files_that_cannot_be_used() {
    let dir = TempDir::new().unwrap();
    let cwd = dir.path();
    write(&dir, "empty.sh", "");
    let msg = spec_err(&["empty.sh"], cwd);
    assert!(msg.contains("empty.sh is empty"), "{msg}");

    fs::write(cwd.join("latin1.sh"), b"#!/bin/sh\necho \xe9\n").unwrap();
    assert!(spec_err(&["latin1.sh"], cwd).contains("latin1.sh is not UTF-8"));

    let big = format!("#!/bin/sh\n{}", "#".repeat(MAX_SCRIPT_BYTES as usize));
    write(&dir, "big.sh", &big);
    assert!(spec_err(&["big.sh"], cwd).contains("big.sh is larger than"));

    // Root reads any file, so use one whose read fails for everyone.
    std::os::unix::fs::symlink("/proc/self/mem", cwd.join("unreadable.sh")).unwrap();
    let msg = spec_err(&["unreadable.sh"], cwd);
    assert!(msg.starts_with("cannot read script "), "{msg}");
    assert!(msg.contains("unreadable.sh"), "{msg}");

    write(&dir, "ok.sh", "#!/bin/sh\ntrue\n");
    let msg = spec_err(&["ok.sh", "arg1"], cwd);
    assert!(
        msg.contains("script arguments are not supported yet"),
        "{msg}"
    );
    assert!(msg.contains("--wrap \"ok.sh ...\""), "{msg}");
}

#[test]
fn wrap_runs_a_shell_command() {
    let dir = TempDir::new().unwrap();
    let s = spec_ok(&["--wrap", "echo $HOME && hostname"], dir.path());
    assert_eq!(s.name, "wrap");
    assert_eq!(
        s.program,
        Program::Command {
            argv: vec![
                "/bin/sh".into(),
                "-c".into(),
                "echo $HOME && hostname".into()
            ]
        }
    );
    assert!(spec_err(&["--wrap", " "], dir.path()).contains("--wrap is empty"));
    let mut both = args(&["--wrap", "x"]);
    both.script_or_command = vec!["job.sh".into()];
    assert!(matches!(
        build_spec(&both, &env(), dir.path()),
        Err(SpecError::WrapWithProgram(_))
    ));
}

#[test]
fn nothing_to_run_is_an_error() {
    let dir = TempDir::new().unwrap();
    let msg = spec_err(&["-N", "2"], dir.path());
    assert!(msg.starts_with("nothing to run"), "{msg}");
    let empty = build_spec(
        &SubmitArgs {
            script_or_command: vec![String::new()],
            ..SubmitArgs::default()
        },
        &env(),
        dir.path(),
    );
    assert!(matches!(empty, Err(SpecError::Invalid(m)) if m.contains("command is empty")));
}

#[test]
fn cpu_only_jobs_and_defaults() {
    let dir = TempDir::new().unwrap();
    let s = spec_ok(&["hostname"], dir.path());
    assert_eq!(
        (s.nodes, s.ntasks_per_node, s.gpus_per_node, s.cpus_per_task),
        (1, 1, 0, 1)
    );
    assert_eq!((s.mem_per_node_mb, s.time_limit_secs), (None, None));
    assert_eq!(
        (s.account, s.partition, s.output, s.error),
        (None, None, None, None)
    );
    assert_eq!(s.export, ExportMode::All);
    assert_eq!(s.env, env());
    let s = spec_ok(&["--gpus-per-node", "0", "hostname"], dir.path());
    assert_eq!(s.gpus_per_node, 0);
}

#[test]
fn chdir_is_made_absolute() {
    let dir = TempDir::new().unwrap();
    let s = spec_ok(&["-D", "runs/a", "hostname"], dir.path());
    assert_eq!(Path::new(&s.workdir), dir.path().join("runs/a"));
    let s = spec_ok(&["-D", "/scratch/ada", "hostname"], dir.path());
    assert_eq!(s.workdir, "/scratch/ada");
    let err = build_spec(&args(&["hostname"]), &env(), Path::new("relative"));
    assert!(matches!(err, Err(SpecError::RelativeCwd(_))));
}

#[test]
fn export_modes_reach_the_spec() {
    let dir = TempDir::new().unwrap();
    let s = spec_ok(&["--export", "NONE", "hostname"], dir.path());
    assert_eq!((s.export, s.env), (ExportMode::Listed, vec![]));
    let s = spec_ok(&["--export", "PATH,X=1", "hostname"], dir.path());
    assert_eq!(s.export, ExportMode::Listed);
    assert_eq!(
        s.env,
        vec![("PATH".into(), "/usr/bin".into()), ("X".into(), "1".into())]
    );
    let s = spec_ok(&["--export", "ALL,HOME=/tmp", "hostname"], dir.path());
    assert_eq!(s.export, ExportMode::All);
    assert_eq!(
        s.env,
        vec![
            ("HOME".into(), "/tmp".into()),
            ("PATH".into(), "/usr/bin".into())
        ]
    );
}

#[test]
fn names_accounts_and_patterns_are_checked() {
    let dir = TempDir::new().unwrap();
    assert!(spec_err(&["-J", "", "hostname"], dir.path()).contains("job name \"\" is empty"));
    assert!(spec_err(&["-J", "a\nb", "hostname"], dir.path()).contains("control characters"));
    assert!(spec_err(&["-A", "my lab", "hostname"], dir.path())
        .contains("account \"my lab\" contains spaces"));
    assert!(spec_err(&["-p", " ", "hostname"], dir.path()).contains("partition \" \" is empty"));
    let mut a = args(&["hostname"]);
    a.error = Some("err-%q".into());
    let msg = build_spec(&a, &env(), dir.path()).unwrap_err().to_string();
    assert!(msg.starts_with("--error: ") && msg.contains("%q"), "{msg}");
    let s = spec_ok(&["-J", "two words", "hostname"], dir.path());
    assert_eq!(s.name, "two words");
}

#[test]
fn gres_and_gpus_per_node_are_one_setting_when_merging() {
    let base = args(&["--gres", "gpu:h100:8"]);
    let over = args(&["--gpus-per-node", "2"]);
    let merged = base.overlay(&over);
    assert_eq!(
        merged.gpus().map(|g| (g.gpu_type.clone(), g.count)),
        Some((None, 2))
    );
    let kept = base.overlay(&args(&["-N", "2"]));
    assert_eq!(kept.gpus().map(|g| g.count), Some(8));
    assert_eq!(
        kept.gpus().and_then(|g| g.gpu_type.as_deref()),
        Some("h100")
    );
}
