//! `gpuq submit`: one job from the command line, or many from a file
//! (`--from FILE`, `-` for stdin) in one call and one log entry, all or none.
//!
//! Each line of the file is what would follow `gpuq submit` for one job:
//! flags, then a script or a command, split as a shell splits words (quotes,
//! backslashes). Blank lines and lines starting with `#` are skipped. Flags
//! given on the command line apply to every line; a line's own flags win.

use std::io::Read;
use std::path::{Path, PathBuf};

use clap::Parser;

use super::{call, call_answer, print_json, unexpected, CliError};
use crate::model::JobSpec;
use crate::net::proto::{ApiRequest, ApiResponse, MAX_SUBMIT_MANY};
use crate::spec::directives::{split_words, SplitError};
use crate::spec::SubmitArgs;

/// How one job was given: the flags and program of the command line, or
/// those plus a line of a `--from` file.
pub(super) async fn run(
    args: &SubmitArgs,
    from: Option<PathBuf>,
    parsable: bool,
    json: bool,
) -> Result<(), CliError> {
    let env: Vec<(String, String)> = std::env::vars().collect();
    let cwd = std::env::current_dir()
        .map_err(|e| CliError::input(format!("cannot read the current directory: {e}")))?;
    let Some(from) = from else {
        let spec = crate::spec::build_spec(args, &env, &cwd)
            .map_err(|e| CliError::input(e.to_string()))?;
        check_output_files(&spec).map_err(CliError::input)?;
        return match call(ApiRequest::Submit {
            spec: Box::new(spec),
        })
        .await?
        {
            ApiResponse::Submitted { id } => print_ids(&[id], parsable, json),
            other => Err(unexpected(other)),
        };
    };
    if let Some(first) = args.script_or_command.first() {
        return Err(CliError::input(format!(
            "--from reads each job's script or command from its file, so {first:?} cannot \
             follow it; put it on a line of the file, or drop --from"
        )));
    }
    if args.wrap.is_some() {
        return Err(CliError::input(
            "--from reads each job's script or command from its file; write --wrap on a line \
             of the file instead",
        ));
    }
    let shown = from.display().to_string();
    let text = read_input(&from)?;
    let jobs = parse_lines(&text, &shown, args, &env, &cwd)?;
    let lines: Vec<usize> = jobs.iter().map(|(line, _)| *line).collect();
    let specs: Vec<JobSpec> = jobs.into_iter().map(|(_, spec)| spec).collect();
    if let Some(why) = crate::net::proto::bulk_too_big(&specs) {
        return Err(CliError::input(format!("{shown}: {why}")));
    }
    match call_answer(ApiRequest::SubmitMany { specs }).await? {
        ApiResponse::SubmittedMany { ids } => print_ids(&ids, parsable, json),
        ApiResponse::Error {
            kind,
            message,
            batch_entry,
        } => {
            // Name the line of the refused job rather than its index.
            let line = batch_entry.and_then(|b| Some((lines.get(b.index)?, b.why)));
            let message = match line {
                Some((line, why)) => format!("{shown} line {line}: {why}; nothing was submitted"),
                None => message,
            };
            Err(CliError {
                code: kind.into(),
                message,
            })
        }
        other => Err(unexpected(other)),
    }
}

/// Refuses an `--output` or `--error` that names, as this host sees it, a
/// named pipe, socket, directory or device other than `/dev/null`: a task
/// could not write it, and a pipe would hang its start. Patterns with `%`
/// name a file per job or rank, so only fixed paths can be looked at here
/// (the agent checks again before serving a file).
pub(crate) fn check_output_files(spec: &JobSpec) -> Result<(), String> {
    use std::os::unix::fs::FileTypeExt;
    for (flag, pattern) in [("--output", &spec.output), ("--error", &spec.error)] {
        let Some(pattern) = pattern.as_deref().filter(|p| !p.contains('%')) else {
            continue;
        };
        let path = Path::new(&spec.workdir).join(pattern);
        if path == Path::new("/dev/null") {
            continue;
        }
        let Ok(meta) = std::fs::metadata(&path) else {
            continue;
        };
        let t = meta.file_type();
        let what = if t.is_dir() {
            "a directory"
        } else if t.is_fifo() {
            "a named pipe"
        } else if t.is_socket() {
            "a socket"
        } else if t.is_char_device() || t.is_block_device() {
            "a device"
        } else {
            continue;
        };
        return Err(format!(
            "{flag} {pattern}: {} is {what}, not a file a job can write its output to; \
             name a regular file (or /dev/null to drop the output)",
            path.display()
        ));
    }
    Ok(())
}

fn print_ids(ids: &[crate::model::JobId], parsable: bool, json: bool) -> Result<(), CliError> {
    if json {
        return match ids {
            [id] => print_json(&serde_json::json!({ "id": id.0 })),
            ids => print_json(&serde_json::json!({
                "ids": ids.iter().map(|id| id.0).collect::<Vec<_>>()
            })),
        };
    }
    for id in ids {
        if parsable {
            println!("{id}");
        } else {
            println!("Submitted job {id}");
        }
    }
    Ok(())
}

fn read_input(from: &Path) -> Result<String, CliError> {
    let mut text = String::new();
    let read = if from == Path::new("-") {
        std::io::stdin().read_to_string(&mut text).map(|_| ())
    } else {
        std::fs::read_to_string(from).map(|t| text = t)
    };
    read.map_err(|e| {
        CliError::input(format!(
            "cannot read the jobs from {}: {e}",
            if from == Path::new("-") {
                "stdin".to_string()
            } else {
                from.display().to_string()
            }
        ))
    })?;
    Ok(text)
}

/// One line of a `--from` file, parsed by the submit flags' own grammar.
#[derive(Parser, Debug)]
#[command(
    name = "gpuq submit",
    no_binary_name = true,
    disable_help_flag = true,
    disable_version_flag = true
)]
pub(super) struct JobLine {
    #[command(flatten)]
    pub(super) args: SubmitArgs,
}

/// The jobs of a `--from` file with their line numbers, each spec built with
/// `defaults` (the command line's flags) under the line's own flags.
pub(super) fn parse_lines(
    text: &str,
    shown: &str,
    defaults: &SubmitArgs,
    env: &[(String, String)],
    cwd: &Path,
) -> Result<Vec<(usize, JobSpec)>, CliError> {
    let mut jobs = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let n = i + 1;
        let trimmed = line.trim();
        if trimmed.is_empty() || trimmed.starts_with('#') {
            continue;
        }
        let fail = |why: String| CliError::input(format!("{shown} line {n}: {why}"));
        let words = split_words(trimmed).map_err(|e| {
            fail(match e {
                SplitError::TrailingBackslash => {
                    "the line ends in a backslash; a job is one line".to_string()
                }
                e => e.to_string(),
            })
        })?;
        let parsed = JobLine::try_parse_from(&words).map_err(|e| {
            let rendered = e.render().to_string();
            let first = rendered.lines().next().unwrap_or_default();
            fail(first.strip_prefix("error: ").unwrap_or(first).to_string())
        })?;
        let args = defaults.overlay(&parsed.args);
        let spec = crate::spec::build_spec(&args, env, cwd).map_err(|e| fail(e.to_string()))?;
        check_output_files(&spec).map_err(fail)?;
        jobs.push((n, spec));
        if jobs.len() > MAX_SUBMIT_MANY {
            return Err(CliError::input(format!(
                "{shown} has more than {MAX_SUBMIT_MANY} jobs, the most one bulk submit takes: \
                 split it, or use --array for many runs of one script"
            )));
        }
    }
    if jobs.is_empty() {
        return Err(CliError::input(format!(
            "{shown} has no jobs: write one job per line, as you would after `gpuq submit` \
             (e.g. `-G 1 -- python train.py --lr 3`)"
        )));
    }
    Ok(jobs)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str, defaults: &[&str]) -> Result<Vec<(usize, JobSpec)>, String> {
        let mut words: Vec<String> = defaults.iter().map(|s| s.to_string()).collect();
        words.push("--".into());
        words.push("placeholder".into());
        let mut d = JobLine::try_parse_from(&words).unwrap().args;
        d.script_or_command.clear();
        let env = vec![("PATH".to_string(), "/usr/bin:/bin".to_string())];
        parse_lines(text, "jobs.txt", &d, &env, Path::new("/tmp")).map_err(|e| e.message)
    }

    #[test]
    fn a_batch_over_the_bulk_limit_is_refused_before_it_is_sent() {
        let env = vec![("BIG".to_string(), "x".repeat(3000))];
        let text = "-- true\n".repeat(2000);
        let jobs = parse_lines(
            &text,
            "jobs.txt",
            &SubmitArgs::default(),
            &env,
            Path::new("/tmp"),
        )
        .unwrap();
        let specs: Vec<JobSpec> = jobs.into_iter().map(|(_, s)| s).collect();
        let why = crate::net::proto::bulk_too_big(&specs).expect("6 MB of specs");
        assert!(
            why.contains("2000 jobs") && why.contains("--export=NONE"),
            "{why}"
        );
        assert!(crate::net::proto::bulk_too_big(&specs[..100]).is_none());
    }

    #[test]
    fn one_job_a_line_with_comments_blank_lines_and_quotes() {
        let jobs = parse(
            "# sweep\n\n-J a -- echo 'hello world'\n  --gpus 2 -- python train.py --lr 3\n",
            &[],
        )
        .unwrap();
        assert_eq!(jobs.len(), 2);
        assert_eq!(jobs[0].0, 3);
        assert_eq!(jobs[0].1.name, "a");
        assert_eq!(
            jobs[0].1.program,
            crate::model::Program::Command {
                argv: vec!["echo".into(), "hello world".into()]
            }
        );
        assert_eq!(jobs[1].0, 4);
    }

    #[test]
    fn command_line_flags_are_defaults_a_line_overrides() {
        let jobs = parse("-- true\n-J mine -- true\n", &["-J", "all", "-N", "2"]).unwrap();
        assert_eq!(jobs[0].1.name, "all");
        assert_eq!(jobs[1].1.name, "mine");
        assert!(jobs.iter().all(|(_, s)| s.nodes == 2));
    }

    #[test]
    fn a_bad_line_names_its_number() {
        let e = parse("-- true\n--nodes 0 -- true\n", &[]).unwrap_err();
        assert!(e.starts_with("jobs.txt line 2: "), "{e}");
        let e = parse("-- true\n\n--bogus -- true\n", &[]).unwrap_err();
        assert!(
            e.starts_with("jobs.txt line 3: ") && e.contains("--bogus"),
            "{e}"
        );
        let e = parse("-J 'open -- true\n", &[]).unwrap_err();
        assert!(e.starts_with("jobs.txt line 1: unterminated"), "{e}");
        let e = parse("-J x\n", &[]).unwrap_err();
        assert!(e.starts_with("jobs.txt line 1: nothing to run"), "{e}");
    }

    #[test]
    fn an_empty_file_is_refused() {
        let e = parse("# nothing\n\n", &[]).unwrap_err();
        assert!(e.contains("has no jobs"), "{e}");
    }
}
