//! Every bad input gets a one-line error naming the input and the fix, a
//! non-zero exit, and changes nothing.

mod common;

use std::io::Write;

use common::{cli, cli_as, ensure_user, require_root, shared_tempdir, stderr, Server};

/// Asserts the command failed with exit 1 and a message mentioning `needle`.
fn refused(out: &std::process::Output, needle: &str) {
    let err = stderr(out);
    assert_eq!(
        out.status.code(),
        Some(1),
        "expected exit 1 mentioning {needle:?}, got {:?}: {err}",
        out.status.code()
    );
    assert!(
        err.to_lowercase().contains(&needle.to_lowercase()),
        "error should mention {needle:?}: {err}"
    );
}

fn queue_len(server: &Server) -> usize {
    let v: serde_json::Value =
        serde_json::from_str(&server.ok(&["queue", "--all", "--json"])).unwrap();
    v.as_array().unwrap().len()
}

#[test]
fn bad_submissions_are_refused_and_queue_nothing() {
    let dir = shared_tempdir();
    let server = Server::bootstrap(dir.path());
    let script = dir.path().join("typo.sh");
    std::fs::write(
        &script,
        "#!/bin/sh\n#GPUQ --nodes 1\n#GPUQ --gpu 8\necho hi\n",
    )
    .unwrap();
    let empty = dir.path().join("empty.sh");
    std::fs::write(&empty, "").unwrap();
    let missing = dir.path().join("nope.sh");
    let cases: Vec<(Vec<String>, &str)> = vec![
        (
            vec!["--time".into(), "25:99".into(), "--".into(), "true".into()],
            "25:99",
        ),
        (
            vec!["--time".into(), "-1".into(), "--".into(), "true".into()],
            "-1",
        ),
        (
            vec!["--mem".into(), "12XB".into(), "--".into(), "true".into()],
            "12XB",
        ),
        (
            vec!["--nodes".into(), "0".into(), "--".into(), "true".into()],
            "0",
        ),
        (
            vec!["--nodes".into(), "-2".into(), "--".into(), "true".into()],
            "-2",
        ),
        (
            vec!["--nodes".into(), "many".into(), "--".into(), "true".into()],
            "many",
        ),
        (
            vec![
                "--gpus-per-node".into(),
                "x".into(),
                "--".into(),
                "true".into(),
            ],
            "x",
        ),
        (
            vec!["--frobnicate".into(), "--".into(), "true".into()],
            "--frobnicate",
        ),
        (vec![missing.display().to_string()], "nope.sh"),
        (vec![empty.display().to_string()], "empty"),
        (vec![], "command"),
        (vec![script.display().to_string()], "--gpu"),
    ];
    for (args, needle) in cases {
        let mut full = vec!["submit".to_string()];
        full.extend(args.clone());
        let refs: Vec<&str> = full.iter().map(|s| s.as_str()).collect();
        let out = server.cli(&refs);
        refused(&out, needle);
    }
    // The directive typo names the line and suggests the nearest directive.
    let out = server.cli(&["submit", script.to_str().unwrap()]);
    let err = stderr(&out);
    assert!(err.contains("line 3"), "names the line: {err}");
    assert!(
        err.contains("--gpus"),
        "suggests the nearest directive: {err}"
    );
    assert_eq!(queue_len(&server), 0, "nothing was queued");
    // A CPU-only job with no GPU flag is valid.
    server.ok(&["submit", "--", "true"]);
    assert_eq!(queue_len(&server), 1);
}

#[test]
fn unreadable_script_is_refused() {
    if !require_root("unreadable_script_is_refused") {
        return;
    }
    let dir = shared_tempdir();
    let server = Server::bootstrap(dir.path());
    let script = dir.path().join("secret.sh");
    std::fs::write(&script, "#!/bin/sh\necho hi\n").unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o600)).unwrap();
    let alice = ensure_user("gpuqt-alice");
    let out = cli_as(
        &alice,
        &server.socket,
        &["submit", script.to_str().unwrap()],
    );
    refused(&out, "secret.sh");
    assert_eq!(queue_len(&server), 0);
}

#[test]
fn cancel_checks_existence_and_ownership() {
    if !require_root("cancel_checks_existence_and_ownership") {
        return;
    }
    let dir = shared_tempdir();
    let server = Server::bootstrap(dir.path());
    let alice = ensure_user("gpuqt-alice");
    let bob = ensure_user("gpuqt-bob");

    let out = cli_as(
        &alice,
        &server.socket,
        &["submit", "--parsable", "--", "sleep", "100"],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let id = String::from_utf8_lossy(&out.stdout).trim().to_string();

    refused(&server.cli(&["cancel", "424242"]), "424242");
    let out = cli_as(&bob, &server.socket, &["cancel", &id]);
    refused(&out, "gpuqt-alice");
    // All or nothing: a good id next to a missing one cancels neither.
    refused(
        &cli_as(&alice, &server.socket, &["cancel", &id, "999"]),
        "999",
    );
    let show: serde_json::Value =
        serde_json::from_str(&server.ok(&["show", &id, "--json"])).unwrap();
    assert_eq!(show["state"], "PENDING");
    assert_eq!(show["user"], "gpuqt-alice");

    // The owner may; then it is ended and a second cancel says so.
    let out = cli_as(&alice, &server.socket, &["cancel", &id]);
    assert!(out.status.success(), "{}", stderr(&out));
    refused(&server.cli(&["cancel", &id]), "already ended");

    // An admin (root) may cancel anyone's job.
    let out = cli_as(
        &bob,
        &server.socket,
        &["submit", "--parsable", "--", "true"],
    );
    let bob_id = String::from_utf8_lossy(&out.stdout).trim().to_string();
    server.ok(&["cancel", &bob_id]);
    // Non-admins cannot create tokens.
    refused(&cli_as(&bob, &server.socket, &["token", "create"]), "admin");
}

#[test]
fn bad_config_files_are_refused_naming_the_key() {
    let dir = tempfile::tempdir().unwrap();
    let run = |body: &str| {
        let p = dir.path().join("gpuq.toml");
        std::fs::File::create(&p)
            .unwrap()
            .write_all(body.as_bytes())
            .unwrap();
        common::gpuq_command()
            .args(["server", "--config"])
            .arg(&p)
            .arg("--data-dir")
            .arg(dir.path().join("d"))
            .output()
            .unwrap()
    };
    refused(&run("[server]\nlisten_port = 1\n"), "listen_port");
    refused(&run("[server]\nlisten = 7\n"), "listen");
    refused(
        &run("[server]\n[server.raft]\nheartbeat_ms = \"fast\"\n"),
        "heartbeat_ms",
    );
    let out = common::gpuq_command()
        .args(["server", "--config", "/nonexistent/gpuq.toml"])
        .output()
        .unwrap();
    refused(&out, "/nonexistent/gpuq.toml");
    assert!(!dir.path().join("d").exists(), "nothing was created");
}

#[test]
fn unreachable_daemon_exits_2() {
    let out = cli(std::path::Path::new("/nonexistent/gpuq.sock"), &["queue"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stderr(&out).contains("GPUQ_SOCKET"));
}

#[test]
fn garbage_on_the_socket_does_not_hurt_others() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::bootstrap(dir.path());
    {
        let mut s = std::os::unix::net::UnixStream::connect(&server.socket).unwrap();
        // A length prefix far over the cap, then junk.
        s.write_all(&[0xff, 0xff, 0xff, 0xff, 1, 2, 3]).unwrap();
    }
    {
        let mut s = std::os::unix::net::UnixStream::connect(&server.socket).unwrap();
        s.write_all(&[0, 0, 0, 3, 0xc1, 0xc1, 0xc1]).unwrap();
    }
    server.ok(&["submit", "--", "true"]);
    server.ok(&["queue"]);
}

#[test]
fn a_bulk_submit_with_one_bad_job_submits_none_and_names_the_line() {
    let dir = shared_tempdir();
    let server = Server::bootstrap(dir.path());
    let file = |name: &str, text: &str| {
        let p = dir.path().join(name);
        std::fs::write(&p, text).unwrap();
        p.to_str().unwrap().to_string()
    };
    // Refused by the server's apply (an unknown dependency): line 4, after a
    // comment and a blank line, so the index is mapped back to the line.
    let dep = file(
        "dep.txt",
        "# two jobs, then a bad one\n-- true\n\n-d afterok:999999 -- true\n-- true\n",
    );
    refused(&server.cli(&["submit", "--from", &dep]), "dep.txt line 4");
    refused(&server.cli(&["submit", "--from", &dep]), "999999");
    // Refused by the CLI while reading the file.
    let zero = file("zero.txt", "-- true\n--nodes 0 -- true\n");
    refused(&server.cli(&["submit", "--from", &zero]), "zero.txt line 2");
    let quote = file("quote.txt", "-J 'open -- true\n");
    refused(&server.cli(&["submit", "--from", &quote]), "unterminated");
    let typo = file("typo.txt", "--frobnicate -- true\n");
    refused(&server.cli(&["submit", "--from", &typo]), "--frobnicate");
    let empty = file("empty.txt", "# nothing here\n\n");
    refused(&server.cli(&["submit", "--from", &empty]), "has no jobs");
    refused(
        &server.cli(&["submit", "--from", "/nonexistent/jobs.txt"]),
        "/nonexistent/jobs.txt",
    );
    refused(
        &server.cli(&["submit", "--from", &zero, "--", "true"]),
        "--from",
    );
    assert_eq!(queue_len(&server), 0, "a refused batch queued something");

    // The API refuses the same way without the CLI: index from 1, nothing queued.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let answer = |specs: Vec<gpuq::model::JobSpec>| {
        rt.block_on(async {
            let mut c = gpuq::net::local::LocalClient::connect(&server.socket)
                .await
                .unwrap();
            c.call(&gpuq::net::proto::ApiRequest::SubmitMany { specs })
                .await
                .unwrap()
        })
    };
    let mut bad = common::trivial_spec("bad");
    bad.nodes = 0;
    let good = common::trivial_spec("good");
    match answer(vec![good.clone(), bad, good.clone()]) {
        gpuq::net::proto::ApiResponse::Error {
            kind,
            message,
            batch_entry,
        } => {
            assert_eq!(kind, gpuq::net::proto::ErrorKind::BadInput);
            assert!(message.starts_with("job 2 of the batch"), "{message}");
            assert!(message.contains("nodes"), "{message}");
            let entry = batch_entry.expect("the refused job's index");
            assert_eq!(entry.index, 1);
            assert!(message.contains(&entry.why), "{message} / {}", entry.why);
        }
        other => panic!("expected a refusal, got {other:?}"),
    }
    match answer(vec![]) {
        gpuq::net::proto::ApiResponse::Error { message, .. } => {
            assert!(message.contains("no jobs"), "{message}")
        }
        other => panic!("expected a refusal, got {other:?}"),
    }
    let too_many = vec![good; gpuq::net::proto::MAX_SUBMIT_MANY + 1];
    match answer(too_many) {
        gpuq::net::proto::ApiResponse::Error { message, .. } => {
            assert!(message.contains("at most"), "{message}")
        }
        other => panic!("expected a refusal, got {other:?}"),
    }
    assert_eq!(queue_len(&server), 0, "a refused batch queued something");
}
