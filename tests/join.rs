//! Join tokens: a login agent joins with a valid token and vouches for its
//! users; expired, revoked, malformed, wrong-role and wrong-cluster tokens are
//! refused with a clear reason.

mod common;

use std::time::Duration;

use common::{cli, cli_as, ensure_user, is_root, stderr, LoginAgent, Server};

fn token(server: &Server, args: &[&str]) -> String {
    let mut full = vec!["token", "create"];
    full.extend_from_slice(args);
    server.ok(&full).trim().to_string()
}

fn refused_join(dir: &std::path::Path, server: &Server, tok: &str, needle: &str) {
    match LoginAgent::join(dir, server, tok) {
        Ok(_) => panic!("join with {tok:?} should be refused"),
        Err(out) => {
            let err = stderr(&out);
            assert_eq!(out.status.code(), Some(1), "{err}");
            assert!(
                err.to_lowercase().contains(needle),
                "error should mention {needle:?}: {err}"
            );
            assert!(
                !dir.join("agent/tls/node.crt").exists(),
                "no identity is left behind"
            );
        }
    }
}

#[test]
fn login_agent_joins_and_vouches_for_its_users() {
    let dir = common::shared_tempdir();
    let server = Server::bootstrap(dir.path());
    let tok = token(&server, &["--role", "agent", "--ttl", "1h"]);
    assert!(tok.starts_with("gpuq1-"), "{tok}");

    let agent = LoginAgent::join(dir.path(), &server, &tok)
        .unwrap_or_else(|o| panic!("join failed: {}\n{}", stderr(&o), server.log()));
    let out = cli(&agent.socket, &["submit", "--parsable", "--", "true"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let id = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let job: serde_json::Value =
        serde_json::from_str(&server.ok(&["show", &id, "--json"])).unwrap();
    let me = nix::unistd::User::from_uid(nix::unistd::Uid::current())
        .unwrap()
        .unwrap()
        .name;
    assert_eq!(job["user"], me.as_str());

    if is_root() {
        let alice = ensure_user("gpuqt-alice");
        let out = cli_as(
            &alice,
            &agent.socket,
            &["submit", "--parsable", "--", "true"],
        );
        assert!(out.status.success(), "{}", stderr(&out));
        let id = String::from_utf8_lossy(&out.stdout).trim().to_string();
        let job: serde_json::Value =
            serde_json::from_str(&server.ok(&["show", &id, "--json"])).unwrap();
        assert_eq!(
            job["user"], "gpuqt-alice",
            "the login agent vouched for alice"
        );
    }

    let tokens: serde_json::Value =
        serde_json::from_str(&server.ok(&["token", "list", "--json"])).unwrap();
    let t = &tokens.as_array().unwrap()[0];
    assert_eq!(t["uses"], 1);
    assert!(
        !server
            .ok(&["token", "list", "--json"])
            .contains(tok.split('.').nth(1).unwrap()),
        "the secret is never listed"
    );

    // The agent restarts from its saved identity: no token needed again.
    drop(agent);
}

#[test]
fn bad_tokens_are_refused_with_a_reason() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::bootstrap(&dir.path().join("a"));

    let short = token(&server, &["--ttl", "1s"]);
    std::thread::sleep(Duration::from_millis(1500));
    refused_join(&dir.path().join("j1"), &server, &short, "expired");

    let revoked = token(&server, &[]);
    let id = revoked
        .strip_prefix("gpuq1-")
        .and_then(|r| r.split('.').next())
        .unwrap()
        .to_string();
    server.ok(&["token", "revoke", &id]);
    refused_join(&dir.path().join("j2"), &server, &revoked, "revoked");

    refused_join(&dir.path().join("j3"), &server, "not-a-token", "token");

    let server_token = token(&server, &["--role", "server"]);
    refused_join(&dir.path().join("j4"), &server, &server_token, "server");

    // A token of another cluster pins another CA: refused before any secret is sent.
    std::fs::create_dir_all(dir.path().join("b")).unwrap();
    let other = Server::bootstrap(&dir.path().join("b"));
    let foreign = token(&other, &[]);
    refused_join(&dir.path().join("j5"), &server, &foreign, "cluster");

    // A forged secret on a real token id.
    let good = token(&server, &[]);
    let mut parts: Vec<&str> = good.split('.').collect();
    let fake = "x".repeat(parts[1].len());
    parts[1] = &fake;
    refused_join(&dir.path().join("j6"), &server, &parts.join("."), "secret");
}
