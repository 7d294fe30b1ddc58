//! `salloc`: an allocation, and a command run here while it lasts (the
//! user's shell by default) with the allocation's `SLURM_*` variables, so
//! `srun` inside starts steps on its nodes. Leaving the command releases
//! the allocation; one left behind ends at its time limit (the leader
//! expires allocations), and one whose salloc vanished after the servers'
//! `inactive_limit_secs` without a renewal (`cli::session::KeepAlive`).

use std::path::Path;
use std::process::ExitCode;

use clap::{CommandFactory, FromArgMatches, Parser};

use super::sbatch::SbatchArgs;
use crate::cli::{call, CliError};
use crate::model::hostlist::compress_hostlist;
use crate::model::Job;
use crate::net::proto::ApiRequest;

/// salloc's flags: sbatch's, for the allocation.
#[derive(Parser, Debug, Clone, Default)]
#[command(
    name = "salloc",
    no_binary_name = true,
    disable_version_flag = true,
    max_term_width = 100,
    about = "Get an allocation and run a command in it (default: your shell), as Slurm's salloc; \
             srun inside runs on its nodes",
    after_help = "While the command runs, salloc renews the allocation every third of the \
                  servers' inactive_limit_secs (5 minutes unless set otherwise). If salloc is \
                  killed or loses the cluster (a closed laptop, a lost network), the allocation \
                  is released that long after its last renewal (it ends TIMEOUT), or at its \
                  time limit if that comes first. Leaving the command releases it at once."
)]
pub struct SallocArgs {
    #[command(flatten)]
    pub alloc: SbatchArgs,
}

fn command() -> clap::Command {
    SallocArgs::command()
        .mut_arg("script_or_command", |a| {
            a.help("The command to run while the allocation lasts [default: $SHELL]")
                .long_help(None)
                .value_name("COMMAND")
        })
        .mut_arg("parsable", |a| a.hide(true))
        .mut_arg("wait", |a| a.hide(true))
        .mut_arg("output", |a| a.hide(true))
        .mut_arg("error", |a| a.hide(true))
}

pub fn parse_args(args: &[String]) -> Result<Option<SallocArgs>, CliError> {
    let Some(m) = super::parse_with(command(), args)? else {
        return Ok(None);
    };
    SallocArgs::from_arg_matches(&m)
        .map(Some)
        .map_err(|e| CliError::input(super::clap_line(&e)))
}

/// The variables the command sees: the allocation's, as Slurm's salloc sets.
pub fn allocation_env(job: &Job, submit_dir: &Path) -> Vec<(String, String)> {
    let nodes = job.run.as_ref().map(|r| r.node_names()).unwrap_or_default();
    let list = compress_hostlist(&nodes);
    let per_node = job.spec.ntasks_per_node;
    let mut env = vec![
        ("SLURM_JOB_ID", job.id.to_string()),
        ("SLURM_JOBID", job.id.to_string()),
        ("SLURM_JOB_NAME", job.spec.name.clone()),
        ("SLURM_JOB_NODELIST", list.clone()),
        ("SLURM_NODELIST", list),
        ("SLURM_JOB_NUM_NODES", nodes.len().to_string()),
        ("SLURM_NNODES", nodes.len().to_string()),
        ("SLURM_NTASKS", job.spec.total_tasks().to_string()),
        ("SLURM_NPROCS", job.spec.total_tasks().to_string()),
        ("SLURM_NTASKS_PER_NODE", per_node.to_string()),
        (
            "SLURM_TASKS_PER_NODE",
            match nodes.len() {
                1 => per_node.to_string(),
                n => format!("{per_node}(x{n})"),
            },
        ),
        ("SLURM_CPUS_PER_TASK", job.spec.cpus_per_task.to_string()),
        (
            "SLURM_SUBMIT_DIR",
            submit_dir.to_string_lossy().into_owned(),
        ),
        (
            "SLURM_JOB_PARTITION",
            job.spec.partition.clone().unwrap_or_default(),
        ),
        (
            "SLURM_JOB_ACCOUNT",
            job.spec.account.clone().unwrap_or_default(),
        ),
        ("SLURM_JOB_QOS", job.spec.qos.clone().unwrap_or_default()),
    ];
    if let Some(host) = &job.spec.submit_host {
        env.push(("SLURM_SUBMIT_HOST", host.clone()));
    }
    env.into_iter().map(|(k, v)| (k.to_string(), v)).collect()
}

/// `salloc ARGS`.
pub async fn run(args: Vec<String>) -> Result<ExitCode, CliError> {
    let Some(cli) = parse_args(&args)? else {
        return Ok(ExitCode::SUCCESS);
    };
    let cwd = std::env::current_dir()
        .map_err(|e| CliError::input(format!("cannot read the current directory: {e}")))?;
    let env: Vec<(String, String)> = std::env::vars().collect();
    let argv = match cli.alloc.job.script_or_command.as_slice() {
        [] => vec![std::env::var("SHELL").unwrap_or_else(|_| "/bin/sh".into())],
        given => given.to_vec(),
    };
    let mut args = super::sbatch::translate(&cli.alloc).map_err(CliError::input)?;
    args.output = None;
    let mut spec = crate::spec::build_allocation_spec(&args, argv.clone(), &env, &cwd)
        .map_err(|e| CliError::input(e.to_string()))?;
    spec.submit_host = super::submit_host();
    let Some((id, _)) = super::srun::allocate("salloc", spec).await? else {
        return Ok(ExitCode::from(1));
    };
    eprintln!("salloc: Granted job allocation {id}");
    let held = crate::cli::session::KeepAlive::start(id);
    let job = super::srun_output::show(id).await?;
    // The command owns the terminal: Ctrl-C is its, not ours.
    let _quiet = super::srun_output::Interrupts::new()?;
    let status = tokio::process::Command::new(&argv[0])
        .args(&argv[1..])
        .envs(allocation_env(&job, &cwd))
        .status()
        .await;
    drop(held);
    eprintln!("salloc: Relinquishing job allocation {id}");
    let _ = call(ApiRequest::Release { job: id }).await;
    match status {
        Ok(s) => Ok(ExitCode::from(
            s.code()
                .or_else(|| {
                    use std::os::unix::process::ExitStatusExt;
                    s.signal().map(|n| 128 + n)
                })
                .unwrap_or(1)
                .clamp(0, 255) as u8,
        )),
        Err(e) => Err(CliError::input(format!("cannot run {}: {e}", argv[0]))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_command_is_well_formed_and_takes_sbatch_flags() {
        command().debug_assert();
        let a = parse_args(&["-N".into(), "2".into(), "bash".into(), "-l".into()])
            .unwrap()
            .unwrap();
        assert_eq!(a.alloc.job.nodes, Some(crate::model::NodeRange::fixed(2)));
        assert_eq!(a.alloc.job.script_or_command, ["bash", "-l"]);
    }
}
