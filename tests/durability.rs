//! An acknowledged job is never lost: 1,000 jobs through the socket, SIGKILL,
//! restart, and every job is there with the same id and spec.

mod common;

use std::time::Duration;

use common::Server;
use gpuq::model::{Job, JobId, JobSpec, Program};
use gpuq::net::local::LocalClient;
use gpuq::net::proto::{ApiRequest, ApiResponse};

fn spec(i: usize) -> JobSpec {
    JobSpec {
        qos: None,
        nice: 0,
        name: format!("job-{i}"),
        nodes: 1 + (i % 3) as u32,
        ntasks_per_node: 1,
        gpus_per_node: (i % 9) as u32,
        cpus_per_task: 1 + (i % 4) as u32,
        mem_per_node_mb: if i % 2 == 0 {
            Some(1024 * (i as u64 % 7 + 1))
        } else {
            None
        },
        time_limit_secs: Some(60 + i as u64),
        account: (i % 5 == 0).then(|| "default".to_string()),
        partition: None,
        output: Some("out-%j.txt".into()),
        error: None,
        workdir: "/tmp".into(),
        env: vec![
            ("INDEX".into(), i.to_string()),
            ("PATH".into(), "/usr/bin".into()),
        ],
        export: Default::default(),
        requeue: Default::default(),
        max_restarts: 3,
        total_gpus: None,
        placement: Default::default(),
        queue: Default::default(),
        signal: None,
        program: if i % 2 == 0 {
            Program::Command {
                argv: vec!["echo".into(), format!("hello {i}")],
            }
        } else {
            Program::Script {
                path: format!("/tmp/s{i}.sh"),
                content: format!("#!/bin/sh\n#GPUQ --nodes 1\necho {i}\n"),
                args: Vec::new(),
            }
        },
        launch: Default::default(),
        submit_host: None,
        first_step: None,
        exclusive: false,
        container: None,
    }
}

async fn all_jobs(socket: &std::path::Path) -> Vec<Job> {
    let mut c = LocalClient::connect(socket).await.expect("connect");
    match c
        .call(&ApiRequest::Queue {
            all: true,
            user: None,
            states: vec![],
            after: None,
        })
        .await
        .expect("queue")
    {
        ApiResponse::Jobs { jobs, .. } => jobs,
        other => panic!("unexpected {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acknowledged_jobs_survive_sigkill_and_ids_continue() {
    let dir = tempfile::tempdir().unwrap();
    let mut server = tokio::task::block_in_place(|| Server::bootstrap(dir.path()));

    let mut acked: Vec<(JobId, JobSpec)> = Vec::new();
    let mut client = LocalClient::connect(&server.socket).await.expect("connect");
    for i in 0..1000 {
        let s = spec(i);
        match client
            .call(&ApiRequest::Submit {
                spec: Box::new(s.clone()),
            })
            .await
            .expect("submit")
        {
            ApiResponse::Submitted { id } => acked.push((id, s)),
            other => panic!("submit {i}: {other:?}\n{}", server.log()),
        }
    }
    drop(client);
    let ids: Vec<u64> = acked.iter().map(|(id, _)| id.0).collect();
    assert_eq!(
        ids,
        (1..=1000).collect::<Vec<_>>(),
        "ids are 1..=1000 in order"
    );

    tokio::task::block_in_place(|| {
        server.kill();
        server.start();
    });

    let me = nix::unistd::User::from_uid(nix::unistd::Uid::current())
        .unwrap()
        .unwrap()
        .name;
    let jobs = all_jobs(&server.socket).await;
    assert_eq!(
        jobs.len(),
        1000,
        "every acknowledged job is back after SIGKILL"
    );
    for (job, (id, s)) in jobs.iter().zip(&acked) {
        assert_eq!(job.id, *id);
        // Submit fills in the account, QoS and partition a fresh cluster's
        // built-in policy gives; the rest is as submitted.
        let mut want = s.clone();
        gpuq::model::Policy::default()
            .resolve(&me, &mut want)
            .expect("the built-in policy admits everyone");
        assert_eq!(
            job.spec, want,
            "job {id} has the spec it was submitted with"
        );
        assert_eq!(job.user, me, "the socket vouched for the submitting user");
    }

    let mut client = LocalClient::connect(&server.socket).await.expect("connect");
    match client
        .call(&ApiRequest::Submit {
            spec: Box::new(spec(1000)),
        })
        .await
        .expect("submit after restart")
    {
        ApiResponse::Submitted { id } => assert_eq!(id, JobId(1001)),
        other => panic!("unexpected {other:?}"),
    }
    // And once more across a second crash, to be sure the counter is durable.
    tokio::time::sleep(Duration::from_millis(10)).await;
    drop(client);
    tokio::task::block_in_place(|| {
        server.kill();
        server.start();
    });
    assert_eq!(all_jobs(&server.socket).await.len(), 1001);
}
