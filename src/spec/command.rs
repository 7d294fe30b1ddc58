//! A job spec from flags and a command alone, for callers whose files are
//! not the submitter's (the HTTP API on a server): nothing is read from disk.

use std::path::Path;

use super::{file_name, finish_spec, SpecError, SubmitArgs};
use crate::model::{JobSpec, Program};

/// Builds the spec of a command (`argv`), never taking its first word for a
/// script to read: for submissions over HTTP, where the files are the
/// server's, not the submitter's. Defaults and checks are `build_spec`'s.
pub fn build_command_spec(
    args: &SubmitArgs,
    argv: Vec<String>,
    env: &[(String, String)],
    cwd: &Path,
) -> Result<JobSpec, SpecError> {
    if !cwd.is_absolute() {
        return Err(SpecError::RelativeCwd(cwd.to_path_buf()));
    }
    let Some(first) = argv.first() else {
        return Err(SpecError::NoProgram);
    };
    let name = file_name(first);
    finish_spec(args, Program::Command { argv }, name, env, cwd)
}
