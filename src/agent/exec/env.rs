//! The task's view of the job: its environment contract and its output file
//! names. Pure functions, so the contract is tested without starting anything.
//!
//! `WORLD_SIZE`, `RANK`, `LOCAL_RANK` and `LOCAL_WORLD_SIZE` describe gpuq's own
//! tasks (as Slurm's `SLURM_NTASKS`/`SLURM_PROCID` do), which is right for one
//! process per GPU started by gpuq. The `PET_*` variables describe a torchrun
//! launch with the task as the launcher: `PET_NPROC_PER_NODE` is the number of
//! GPUs the task sees (1 without GPUs), so a bare `torchrun train.py` in a
//! one-task-per-node job starts one worker per GPU; torchrun then sets
//! `WORLD_SIZE` and `RANK` for its workers itself.

use std::path::{Path, PathBuf};

use crate::model::hostlist::compress_hostlist;
use crate::model::JobId;

pub use super::context::TaskContext;

/// The stdout pattern when the job gives none (Slurm's `slurm-%j.out`).
pub const DEFAULT_OUTPUT_PATTERN: &str = "gpuq-%j.out";

/// What `%` sequences in an output pattern expand to.
#[derive(Clone, Copy, Debug)]
pub struct PatternVars<'a> {
    /// `%j`
    pub job: JobId,
    /// `%x`
    pub job_name: &'a str,
    /// `%t`: the task's global rank.
    pub rank: u32,
    /// `%n`: the node rank.
    pub node_rank: u32,
    /// `%u`
    pub user: &'a str,
    /// Relative patterns are relative to it.
    pub workdir: &'a Path,
    /// `%A` and `%a`: the array job id and task index, for an array task.
    pub array: Option<(JobId, u32)>,
    /// `%N`: the node's name.
    pub node: &'a str,
    /// `%s`: the step, for a step's task.
    pub step: Option<u32>,
}

/// What Slurm writes for `%a` of a job that is no array task (its NO_VAL).
const NOT_AN_ARRAY_TASK: &str = "4294967294";

/// Expands `%j %t %n %x %u %A %a %N %s %J %%` in an output pattern (`None`: the default
/// `gpuq-%j.out`) and makes it absolute against the working directory. Other
/// `%` sequences are kept as written.
pub fn expand_output_pattern(pattern: Option<&str>, vars: &PatternVars<'_>) -> PathBuf {
    let pattern = pattern.unwrap_or(DEFAULT_OUTPUT_PATTERN);
    let mut out = String::with_capacity(pattern.len() + 16);
    let mut chars = pattern.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('j') => out.push_str(&vars.job.to_string()),
            Some('t') => out.push_str(&vars.rank.to_string()),
            Some('n') => out.push_str(&vars.node_rank.to_string()),
            Some('x') => out.push_str(vars.job_name),
            Some('u') => out.push_str(vars.user),
            Some('A') => out.push_str(&vars.array.map_or(vars.job, |a| a.0).to_string()),
            Some('a') => match vars.array {
                Some((_, index)) => out.push_str(&index.to_string()),
                None => out.push_str(NOT_AN_ARRAY_TASK),
            },
            Some('N') => out.push_str(vars.node),
            Some('s') => match vars.step {
                Some(step) => out.push_str(&step.to_string()),
                None => out.push_str("batch"),
            },
            Some('J') => match vars.step {
                Some(step) => out.push_str(&format!("{}.{step}", vars.job)),
                None => out.push_str(&vars.job.to_string()),
            },
            Some('%') => out.push('%'),
            Some(other) => {
                out.push('%');
                out.push(other);
            }
            None => out.push('%'),
        }
    }
    vars.workdir.join(out)
}

/// The task's stdout and stderr paths; without an `--error` pattern stderr
/// goes to the stdout file.
pub fn output_paths(
    output: Option<&str>,
    error: Option<&str>,
    vars: &PatternVars<'_>,
) -> (PathBuf, PathBuf) {
    let stdout = expand_output_pattern(output, vars);
    let stderr = match error {
        Some(pattern) => expand_output_pattern(Some(pattern), vars),
        None => stdout.clone(),
    };
    (stdout, stderr)
}

/// The task's environment: the job's own variables, then the contract, whose
/// variables replace any of the user's with the same name.
pub fn task_env(job_env: &[(String, String)], ctx: &TaskContext<'_>) -> Vec<(String, String)> {
    let num_nodes = ctx.nodes.len() as u64;
    let per_node = u64::from(ctx.ntasks_per_node);
    let (rank, world) = match ctx.facts {
        Some(f) => (
            u64::from(f.first_rank) + u64::from(ctx.local_rank),
            u64::from(f.ntasks),
        ),
        None => (
            u64::from(ctx.node_rank) * per_node + u64::from(ctx.local_rank),
            num_nodes * per_node,
        ),
    };
    let visible = ctx
        .gpus
        .iter()
        .map(u32::to_string)
        .collect::<Vec<_>>()
        .join(",");
    let nproc = ctx.gpus.len().max(1);
    let mut contract: Vec<(&str, String)> = vec![
        ("GPUQ_JOB_ID", ctx.job.to_string()),
        ("GPUQ_JOB_NAME", ctx.job_name.to_string()),
        ("GPUQ_NODE_RANK", ctx.node_rank.to_string()),
        ("GPUQ_NUM_NODES", num_nodes.to_string()),
        ("GPUQ_NODELIST", compress_hostlist(ctx.nodes)),
        ("GPUQ_RESTART_COUNT", ctx.restart_count.to_string()),
        ("TORCHELASTIC_RESTART_COUNT", ctx.restart_count.to_string()),
        ("GPUQ_SUBMIT_DIR", ctx.submit_dir.to_string()),
        ("CUDA_VISIBLE_DEVICES", visible),
        ("CUDA_DEVICE_ORDER", "PCI_BUS_ID".to_string()),
        ("MASTER_ADDR", ctx.master_addr.to_string()),
        ("MASTER_PORT", ctx.master_port.to_string()),
        ("WORLD_SIZE", world.to_string()),
        ("RANK", rank.to_string()),
        ("LOCAL_RANK", ctx.local_rank.to_string()),
        ("LOCAL_WORLD_SIZE", per_node.to_string()),
        ("NODE_RANK", ctx.node_rank.to_string()),
        ("PET_NNODES", num_nodes.to_string()),
        ("PET_NODE_RANK", ctx.node_rank.to_string()),
        ("PET_NPROC_PER_NODE", nproc.to_string()),
        ("PET_MASTER_ADDR", ctx.master_addr.to_string()),
        ("PET_MASTER_PORT", ctx.master_port.to_string()),
    ];
    if let Some(facts) = ctx.facts {
        contract.extend(super::slurm_env::slurm_env(ctx, facts, rank));
        if let Some(r) = facts.elastic {
            // torchrun elastic: the range, and a c10d rendezvous on rank 0
            // (every size change restarts the ranks at the new size).
            let rdzv = format!("{}:{}", ctx.master_addr, ctx.master_port);
            for (k, v) in [
                ("PET_NNODES", format!("{}:{}", r.min, r.max)),
                ("PET_RDZV_BACKEND", "c10d".to_string()),
                ("PET_RDZV_ENDPOINT", rdzv),
                ("PET_RDZV_ID", ctx.job.to_string()),
                ("GPUQ_NODES_MIN", r.min.to_string()),
                ("GPUQ_NODES_MAX", r.max.to_string()),
            ] {
                contract.retain(|(name, _)| *name != k);
                contract.push((k, v));
            }
        }
    }
    // An array task's ids; a job submitted from inside an array task must
    // not inherit them, so they are dropped from the job's env either way
    // (and so are Slurm's job variables, when this task gets its own).
    const ARRAY_VARS: [&str; 2] = ["GPUQ_ARRAY_JOB_ID", "GPUQ_ARRAY_TASK_ID"];
    let mut env: Vec<(String, String)> = job_env
        .iter()
        .filter(|(name, _)| !contract.iter().any(|(c, _)| c == name))
        .filter(|(name, _)| !ARRAY_VARS.contains(&name.as_str()))
        .filter(|(name, _)| ctx.facts.is_none() || !super::slurm_env::inherited_job_var(name))
        .cloned()
        .collect();
    env.extend(contract.into_iter().map(|(k, v)| (k.to_string(), v)));
    if let Some((array, index)) = ctx.array {
        env.push((ARRAY_VARS[0].into(), array.to_string()));
        env.push((ARRAY_VARS[1].into(), index.to_string()));
    }
    env
}

/// The GPUs local task `local_rank` of `ntasks_per_node` gets out of the node's
/// allocation: an equal, disjoint, contiguous share. GPUs that do not divide
/// evenly are left unused (the spec is expected to reject such jobs).
pub fn gpus_for_local_rank(node_gpus: &[u32], ntasks_per_node: u32, local_rank: u32) -> Vec<u32> {
    let tasks = ntasks_per_node.max(1) as usize;
    let share = node_gpus.len() / tasks;
    let start = local_rank as usize * share;
    node_gpus
        .get(start..start + share)
        .map(<[u32]>::to_vec)
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vars(workdir: &Path) -> PatternVars<'_> {
        PatternVars {
            job: JobId(812),
            job_name: "train",
            rank: 5,
            node_rank: 1,
            user: "alice",
            workdir,
            array: None,
            node: "gpu07",
            step: None,
        }
    }

    #[test]
    fn output_patterns_expand_against_the_workdir() {
        let wd = Path::new("/home/alice/run");
        let v = vars(wd);
        assert_eq!(
            expand_output_pattern(None, &v),
            PathBuf::from("/home/alice/run/gpuq-812.out")
        );
        assert_eq!(
            expand_output_pattern(Some("logs/%x-%j.%t.%n.%u.out"), &v),
            PathBuf::from("/home/alice/run/logs/train-812.5.1.alice.out")
        );
        assert_eq!(
            expand_output_pattern(Some("%A_%a-%N-%s-%J"), &v),
            PathBuf::from("/home/alice/run/812_4294967294-gpu07-batch-812")
        );
        let task = PatternVars {
            array: Some((JobId(800), 12)),
            step: Some(2),
            ..v
        };
        assert_eq!(
            expand_output_pattern(Some("%A_%a_%t-%J"), &task),
            PathBuf::from("/home/alice/run/800_12_5-812.2")
        );
        assert_eq!(
            expand_output_pattern(Some("/scratch/100%%-%q%"), &v),
            PathBuf::from("/scratch/100%-%q%")
        );
        let (out, err) = output_paths(Some("o-%j"), None, &v);
        assert_eq!(out, err);
        let (out, err) = output_paths(None, Some("e-%j"), &v);
        assert_eq!(out, PathBuf::from("/home/alice/run/gpuq-812.out"));
        assert_eq!(err, PathBuf::from("/home/alice/run/e-812"));
    }

    #[test]
    fn gpus_split_evenly_and_disjointly() {
        let gpus = [0, 1, 2, 3, 4, 5, 6, 7];
        assert_eq!(gpus_for_local_rank(&gpus, 1, 0), gpus.to_vec());
        assert_eq!(gpus_for_local_rank(&gpus, 4, 0), vec![0, 1]);
        assert_eq!(gpus_for_local_rank(&gpus, 4, 3), vec![6, 7]);
        assert_eq!(gpus_for_local_rank(&gpus, 8, 5), vec![5]);
        assert_eq!(gpus_for_local_rank(&[2, 5, 6], 3, 1), vec![5]);
        assert_eq!(gpus_for_local_rank(&[], 2, 1), Vec::<u32>::new());
        assert_eq!(gpus_for_local_rank(&gpus, 3, 2), vec![4, 5]);
    }

    fn lookup<'a>(env: &'a [(String, String)], name: &str) -> Option<&'a str> {
        let found: Vec<&str> = env
            .iter()
            .filter(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
            .collect();
        assert!(found.len() <= 1, "{name} set {} times", found.len());
        found.first().copied()
    }

    #[test]
    fn env_contract_for_a_distributed_job() {
        let nodes: Vec<String> = (1..=4).map(|i| format!("node{i:03}")).collect();
        let node_gpus = [0, 1, 2, 3, 4, 5, 6, 7];
        let gpus = gpus_for_local_rank(&node_gpus, 2, 1);
        let ctx = TaskContext {
            job: JobId(77),
            job_name: "llm",
            restart_count: 2,
            submit_dir: "/home/alice/llm",
            nodes: &nodes,
            node_rank: 2,
            ntasks_per_node: 2,
            local_rank: 1,
            gpus: &gpus,
            master_addr: "node001",
            master_port: 29517,
            array: None,
            facts: None,
            node_gpus: &[],
            step: None,
        };
        let user = vec![
            ("PATH".to_string(), "/usr/bin".to_string()),
            ("RANK".to_string(), "99".to_string()),
            ("CUDA_VISIBLE_DEVICES".to_string(), "0".to_string()),
        ];
        let env = task_env(&user, &ctx);
        let expect = [
            ("PATH", "/usr/bin"),
            ("GPUQ_JOB_ID", "77"),
            ("GPUQ_JOB_NAME", "llm"),
            ("GPUQ_NODE_RANK", "2"),
            ("GPUQ_NUM_NODES", "4"),
            ("GPUQ_NODELIST", "node[001-004]"),
            ("GPUQ_RESTART_COUNT", "2"),
            ("TORCHELASTIC_RESTART_COUNT", "2"),
            ("GPUQ_SUBMIT_DIR", "/home/alice/llm"),
            ("CUDA_VISIBLE_DEVICES", "4,5,6,7"),
            ("CUDA_DEVICE_ORDER", "PCI_BUS_ID"),
            ("MASTER_ADDR", "node001"),
            ("MASTER_PORT", "29517"),
            ("WORLD_SIZE", "8"),
            ("RANK", "5"),
            ("LOCAL_RANK", "1"),
            ("LOCAL_WORLD_SIZE", "2"),
            ("NODE_RANK", "2"),
            ("PET_NNODES", "4"),
            ("PET_NODE_RANK", "2"),
            ("PET_NPROC_PER_NODE", "4"),
            ("PET_MASTER_ADDR", "node001"),
            ("PET_MASTER_PORT", "29517"),
        ];
        for (name, value) in expect {
            assert_eq!(lookup(&env, name), Some(value), "{name}");
        }
        assert_eq!(env.len(), expect.len());
    }

    #[test]
    fn env_contract_without_gpus() {
        let nodes = vec!["cpu1".to_string()];
        let ctx = TaskContext {
            job: JobId(1),
            job_name: "prep",
            restart_count: 0,
            submit_dir: "/tmp",
            nodes: &nodes,
            node_rank: 0,
            ntasks_per_node: 1,
            local_rank: 0,
            gpus: &[],
            master_addr: "cpu1",
            master_port: 20001,
            array: None,
            facts: None,
            node_gpus: &[],
            step: None,
        };
        let env = task_env(&[], &ctx);
        assert_eq!(lookup(&env, "CUDA_VISIBLE_DEVICES"), Some(""));
        assert_eq!(lookup(&env, "WORLD_SIZE"), Some("1"));
        assert_eq!(lookup(&env, "RANK"), Some("0"));
        assert_eq!(lookup(&env, "PET_NPROC_PER_NODE"), Some("1"));
        assert_eq!(lookup(&env, "GPUQ_NODELIST"), Some("cpu1"));
    }
}
