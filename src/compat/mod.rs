//! The Slurm front end: `sbatch`, `srun`, `salloc`, `sattach`, `squeue`, `sacct`,
//! `scancel`, `scontrol` and `sinfo`, spoken by the one `gpuq` binary when it is started under one of
//! those names (a symlink; argv\[0\]) or as `gpuq slurm COMMAND ...`.
//!
//! Each command is one file and a thin translation: its flags onto `spec`'s
//! `SubmitArgs` (so a value is checked by the same parsers as `gpuq submit`),
//! its requests onto the same API the native CLI uses, its output in Slurm's
//! shapes (`format.rs` holds the `%`-format engine and Slurm's ways of
//! writing times). Slurm semantics the core lacks (job steps, requeue by
//! command) belong in the core, not faked here.
//!
//! Errors are printed as Slurm prints them (`sbatch: error: ...`) and exit
//! with the CLI's codes: 1 wrong input, 2 the cluster could not be reached.

pub mod format;
pub mod sacct;
mod sacct_fields;
pub mod salloc;
pub mod sattach;
pub mod sbatch;
pub mod scancel;
pub mod scontrol;
pub mod scontrol_update;
pub mod sinfo;
pub mod squeue;
pub mod srun;
pub(crate) mod srun_output;

use std::ffi::{OsStr, OsString};
use std::process::ExitCode;

use crate::cli::CliError;

/// The Slurm commands this binary answers to, as link names.
pub const COMMANDS: [&str; 9] = [
    "sbatch", "srun", "salloc", "sattach", "squeue", "sacct", "scancel", "scontrol", "sinfo",
];

/// The Slurm command named by argv\[0\]'s file name, if it is one.
pub fn command_of(argv0: &OsStr) -> Option<&'static str> {
    let name = std::path::Path::new(argv0).file_name()?.to_str()?;
    COMMANDS.into_iter().find(|c| *c == name)
}

/// What `gpuq slurm --help` prints.
pub const HELP: &str = "\
Slurm's commands, spoken by gpuq.

Usage: gpuq slurm COMMAND [ARGS]...
   or: COMMAND [ARGS]...   (through a link named COMMAND to the gpuq binary)

Commands:
  sbatch    submit a batch script (file or stdin) with #SBATCH directives
  srun      run a job step: in the allocation (SLURM_JOB_ID) or in a new one
  salloc    get an allocation and run a command (your shell) in it
  sattach   follow a running step (JOB.STEP); a step on a terminal takes your keys
  squeue    list pending and running jobs (-o/--format %-codes, -h, -u, -j, -t, -n)
  sacct     jobs and their steps, finished or not (-j, -o fields, -P, -X, -S/-E, -s)
  scancel   cancel jobs by id (12, 12_3), by user (-u) or by name (-n)
  scontrol  show hostnames|job|node|partition, update, hold, release, requeue
  sinfo     partitions and their nodes by state (-N node-oriented, -h)

`gpuq dev` makes the links in its state dir and prints the PATH line;
packaging/install.sh makes them next to the binary (--no-slurm-links skips).
srun --pty runs a task on a terminal of its node; `gpuq exec` and `gpuq attach` reach running ones.
Each command's --help lists the flags it takes.
";

/// Runs Slurm command `command` with `args` (without the command's own
/// name) and returns the process's exit status.
pub fn main(command: &str, args: Vec<OsString>) -> ExitCode {
    let args: Vec<String> = match args
        .into_iter()
        .map(|a| a.into_string())
        .collect::<Result<_, _>>()
    {
        Ok(a) => a,
        Err(bad) => {
            return fail(
                command,
                CliError::input(format!(
                    "argument {bad:?} is not valid UTF-8; give arguments as UTF-8 text"
                )),
            )
        }
    };
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => return fail(command, CliError::internal(format!("cannot start: {e}"))),
    };
    let result = runtime.block_on(async {
        match command {
            "sbatch" => sbatch::run(args).await,
            "srun" => srun::run(args).await,
            "salloc" => salloc::run(args).await,
            "sattach" => sattach::run(args).await,
            "squeue" => squeue::run(args).await,
            "sacct" => sacct::run(args).await,
            "scancel" => scancel::run(args).await,
            "scontrol" => scontrol::run(args).await,
            "sinfo" => sinfo::run(args).await,
            other => Err(CliError::input(format!(
                "{other:?} is not a Slurm command gpuq speaks; use one of {}",
                COMMANDS.join(", ")
            ))),
        }
    });
    match result {
        Ok(code) => code,
        Err(e) => fail(command, e),
    }
}

/// This host's name, as `SLURM_SUBMIT_HOST` gives it.
pub(crate) fn submit_host() -> Option<String> {
    crate::hostname::full()
}

/// Prints `e` as Slurm does (`squeue: error: ...`) and returns its exit code.
fn fail(command: &str, e: CliError) -> ExitCode {
    eprintln!("{command}: error: {}", e.message);
    ExitCode::from(e.code)
}

/// Parses `args` with `cmd`, turning clap's refusals into one Slurm-worded
/// line (an unknown option is named, with "did you mean" where one is near).
/// `Ok(None)`: help was printed, nothing more to do.
pub(crate) fn parse_with(
    cmd: clap::Command,
    args: &[String],
) -> Result<Option<clap::ArgMatches>, CliError> {
    use clap::error::{ContextKind, ContextValue, ErrorKind};
    let name = cmd.get_name().to_string();
    let longs: Vec<String> = cmd
        .get_arguments()
        .filter_map(|a| a.get_long().map(str::to_string))
        .collect();
    match cmd.try_get_matches_from(args) {
        Ok(m) => Ok(Some(m)),
        Err(e) if matches!(e.kind(), ErrorKind::DisplayHelp | ErrorKind::DisplayVersion) => {
            let _ = e.print();
            Ok(None)
        }
        Err(e) if e.kind() == ErrorKind::UnknownArgument => {
            let arg = match e.get(ContextKind::InvalidArg) {
                Some(ContextValue::String(a)) => a.clone(),
                _ => "?".into(),
            };
            let flag = arg.split('=').next().unwrap_or(&arg).to_string();
            let hint = flag
                .strip_prefix("--")
                .and_then(|f| crate::suggest::nearest(f, longs.iter().map(String::as_str)))
                .map(|l| format!("did you mean --{l}? "))
                .unwrap_or_default();
            Err(CliError::input(format!(
                "unrecognized option '{flag}': gpuq's {name} does not support it; {hint}see {name} --help"
            )))
        }
        Err(e) => Err(CliError::input(clap_line(&e))),
    }
}

/// The first line of a clap error, without its `error: ` prefix.
pub(crate) fn clap_line(e: &clap::Error) -> String {
    let rendered = e.render().to_string();
    let first = rendered.lines().next().unwrap_or_default();
    first.strip_prefix("error: ").unwrap_or(first).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn link_names_pick_the_command() {
        assert_eq!(command_of(OsStr::new("/usr/bin/sbatch")), Some("sbatch"));
        assert_eq!(command_of(OsStr::new("squeue")), Some("squeue"));
        assert_eq!(command_of(OsStr::new("/usr/bin/gpuq")), None);
        assert_eq!(command_of(OsStr::new("sbatch2")), None);
    }
}
