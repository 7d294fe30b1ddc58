//! Slurm's task environment (`SLURM_*`), so `#SBATCH` scripts, submitit,
//! PyTorch Lightning and `srun` inside the allocation find what they look
//! for. Pure, like the rest of the contract in `env`: the leader sends the
//! job-level facts (`TaskFacts`), the agent knows where the task sits.

use super::context::TaskContext;
use crate::model::hostlist::compress_hostlist;
use crate::net::agent_proto::TaskFacts;

/// Slurm's variables of the job that a task must not inherit from its
/// submitter's environment when it gets its own (an `sbatch` from inside
/// a job, or `srun`'s exported environment).
pub fn inherited_job_var(name: &str) -> bool {
    [
        "SLURM_JOB",
        "SLURM_STEP",
        "SLURM_ARRAY",
        "SLURM_TASK",
        "SLURM_NTASKS",
    ]
    .iter()
    .any(|p| name.starts_with(p))
        || matches!(
            name,
            "SLURM_JOBID" | "SLURM_NODEID" | "SLURM_PROCID" | "SLURM_LOCALID" | "SLURM_STEPID"
        )
}

/// Slurm's `SLURM_TASKS_PER_NODE`: `2(x3),1` for 2,2,2,1.
pub fn tasks_per_node(counts: &[u32]) -> String {
    let mut parts: Vec<String> = Vec::new();
    let mut i = 0;
    while i < counts.len() {
        let run = counts[i..].iter().take_while(|&&c| c == counts[i]).count();
        parts.push(if run > 1 {
            format!("{}(x{run})", counts[i])
        } else {
            counts[i].to_string()
        });
        i += run;
    }
    parts.join(",")
}

/// The `SLURM_*` variables of the task at `ctx` with global (or step)
/// rank `rank`.
pub fn slurm_env(
    ctx: &TaskContext<'_>,
    facts: &TaskFacts,
    rank: u64,
) -> Vec<(&'static str, String)> {
    let job = ctx.job.to_string();
    let job_nodes = compress_hostlist(&facts.job_nodelist);
    let nodes = compress_hostlist(ctx.nodes);
    let ntasks = facts.ntasks.to_string();
    let node_gpus = ctx
        .node_gpus
        .iter()
        .map(u32::to_string)
        .collect::<Vec<_>>()
        .join(",");
    let mut env: Vec<(&'static str, String)> = vec![
        ("SLURM_JOB_ID", job.clone()),
        ("SLURM_JOBID", job),
        ("SLURM_JOB_NAME", ctx.job_name.to_string()),
        ("SLURM_JOB_NODELIST", job_nodes),
        ("SLURM_NODELIST", nodes),
        ("SLURM_JOB_NUM_NODES", facts.job_nodelist.len().to_string()),
        ("SLURM_NNODES", ctx.nodes.len().to_string()),
        ("SLURM_NTASKS", ntasks.clone()),
        ("SLURM_NPROCS", ntasks),
        (
            "SLURM_TASKS_PER_NODE",
            tasks_per_node(&facts.tasks_per_node),
        ),
        ("SLURM_PROCID", rank.to_string()),
        ("SLURM_LOCALID", ctx.local_rank.to_string()),
        ("SLURM_NODEID", ctx.node_rank.to_string()),
        ("SLURM_CPUS_PER_TASK", facts.cpus_per_task.to_string()),
        ("SLURM_GPUS_ON_NODE", ctx.node_gpus.len().to_string()),
        ("SLURM_JOB_GPUS", node_gpus),
        ("SLURM_SUBMIT_DIR", ctx.submit_dir.to_string()),
        ("SLURM_SUBMIT_HOST", facts.submit_host.clone()),
        ("SLURM_CLUSTER_NAME", facts.cluster.clone()),
        ("SLURM_JOB_PARTITION", facts.partition.clone()),
        ("SLURM_JOB_ACCOUNT", facts.account.clone()),
        ("SLURM_JOB_QOS", facts.qos.clone()),
        ("SLURM_RESTART_COUNT", ctx.restart_count.to_string()),
        (
            "SLURMD_NODENAME",
            ctx.nodes
                .get(ctx.node_rank as usize)
                .cloned()
                .unwrap_or_default(),
        ),
    ];
    if let Some(&first) = facts.tasks_per_node.first() {
        if facts.tasks_per_node.iter().all(|&c| c == first) {
            env.push(("SLURM_NTASKS_PER_NODE", first.to_string()));
        }
    }
    if let Some(step) = ctx.step {
        env.push(("SLURM_STEP_ID", step.to_string()));
        env.push(("SLURM_STEPID", step.to_string()));
        env.push(("SLURM_STEP_NODELIST", compress_hostlist(ctx.nodes)));
        env.push(("SLURM_STEP_NUM_NODES", ctx.nodes.len().to_string()));
        env.push(("SLURM_STEP_NUM_TASKS", facts.ntasks.to_string()));
        env.push((
            "SLURM_STEP_TASKS_PER_NODE",
            tasks_per_node(&facts.tasks_per_node),
        ));
    }
    if let Some((array, index)) = ctx.array {
        env.push(("SLURM_ARRAY_JOB_ID", array.to_string()));
        env.push(("SLURM_ARRAY_TASK_ID", index.to_string()));
        if let Some((count, min, max)) = facts.array_span {
            env.push(("SLURM_ARRAY_TASK_COUNT", count.to_string()));
            env.push(("SLURM_ARRAY_TASK_MIN", min.to_string()));
            env.push(("SLURM_ARRAY_TASK_MAX", max.to_string()));
        }
    }
    env
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::JobId;

    #[test]
    fn the_job_variables_of_a_submitter_are_not_inherited() {
        assert!(inherited_job_var("SLURM_JOB_ID"));
        assert!(inherited_job_var("SLURM_ARRAY_TASK_ID"));
        assert!(inherited_job_var("SLURM_PROCID"));
        assert!(!inherited_job_var("SLURM_CONF"));
        assert!(!inherited_job_var("PATH"));
    }

    #[test]
    fn tasks_per_node_folds_repeats() {
        assert_eq!(tasks_per_node(&[8, 8]), "8(x2)");
        assert_eq!(tasks_per_node(&[2, 2, 2, 1]), "2(x3),1");
        assert_eq!(tasks_per_node(&[1, 2]), "1,2");
        assert_eq!(tasks_per_node(&[]), "");
    }

    #[test]
    fn a_step_task_sees_its_step_and_the_job() {
        let job_nodes: Vec<String> = (1..=4).map(|i| format!("n{i}")).collect();
        let step_nodes = vec!["n2".to_string(), "n3".to_string()];
        let facts = TaskFacts {
            ntasks: 3,
            first_rank: 2,
            tasks_per_node: vec![2, 1],
            job_nodelist: job_nodes,
            cpus_per_task: 4,
            all_gpus: true,
            gpus_per_task: None,
            partition: "gpu".into(),
            account: "proj".into(),
            qos: "normal".into(),
            cluster: "c1".into(),
            submit_host: "login1".into(),
            array_span: Some((10, 0, 9)),
            io: Default::default(),
            elastic: None,
        };
        let ctx = TaskContext {
            job: JobId(40),
            job_name: "train",
            restart_count: 1,
            submit_dir: "/home/a",
            nodes: &step_nodes,
            node_rank: 1,
            ntasks_per_node: 1,
            local_rank: 0,
            gpus: &[0, 1],
            master_addr: "n2",
            master_port: 1,
            array: Some((JobId(35), 5)),
            facts: Some(&facts),
            node_gpus: &[0, 1],
            step: Some(3),
        };
        let env: Vec<(String, String)> = slurm_env(&ctx, &facts, 2)
            .into_iter()
            .map(|(k, v)| (k.to_string(), v))
            .collect();
        let get = |k: &str| {
            let all: Vec<&String> = env.iter().filter(|(n, _)| n == k).map(|(_, v)| v).collect();
            assert!(all.len() <= 1, "{k} set twice");
            all.first().map(|v| v.as_str())
        };
        assert_eq!(get("SLURM_JOB_ID"), Some("40"));
        assert_eq!(get("SLURM_JOB_NODELIST"), Some("n[1-4]"));
        assert_eq!(get("SLURM_NODELIST"), Some("n[2-3]"));
        assert_eq!(get("SLURM_JOB_NUM_NODES"), Some("4"));
        assert_eq!(get("SLURM_NNODES"), Some("2"));
        assert_eq!(get("SLURM_PROCID"), Some("2"));
        assert_eq!(get("SLURM_NODEID"), Some("1"));
        assert_eq!(get("SLURMD_NODENAME"), Some("n3"));
        assert_eq!(get("SLURM_TASKS_PER_NODE"), Some("2,1"));
        assert_eq!(get("SLURM_NTASKS_PER_NODE"), None);
        assert_eq!(get("SLURM_STEP_ID"), Some("3"));
        assert_eq!(get("SLURM_JOB_GPUS"), Some("0,1"));
        assert_eq!(get("SLURM_RESTART_COUNT"), Some("1"));
        assert_eq!(get("SLURM_ARRAY_TASK_COUNT"), Some("10"));
        assert_eq!(get("SLURM_ARRAY_JOB_ID"), Some("35"));
    }
}
