//! Service replicas' health checks, made by the agent of a replica's first
//! node: an HTTP GET of the check's path on the replica's `PORT` at
//! 127.0.0.1, every interval, in the background (a slow replica delays no
//! other work). Failures within the grace after the replica was first seen
//! do not count; after it, `failures` in a row make it unhealthy, and one
//! answer of 2xx or 3xx healthy. The session reports each change of verdict
//! to the leader, which stops an unhealthy replica and lists only healthy
//! ones as endpoints.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::model::{HealthCheck, JobId};
use crate::net::agent_proto::DesiredTask;

/// How long one check may take, connect to status line.
const CHECK_TIMEOUT: Duration = Duration::from_secs(2);

/// A verdict to report: job, attempt, healthy, what the last check saw.
pub type Verdict = (JobId, u32, bool, String);

/// The checks of the replicas this node holds.
#[derive(Default)]
pub struct Prober {
    probes: Arc<Mutex<HashMap<(JobId, u32), Probe>>>,
}

struct Probe {
    check: HealthCheck,
    port: u16,
    /// For a command check: who runs it, where, with what environment.
    user: String,
    workdir: String,
    env: Vec<(String, String)>,
    first_seen: Instant,
    last_check: Option<Instant>,
    in_flight: bool,
    failures: u32,
    healthy: Option<bool>,
    reported: Option<bool>,
    detail: String,
}

impl Prober {
    /// Called with the desired tasks on each heartbeat: starts the checks
    /// that are due, forgets replicas no longer here, and returns the
    /// verdicts not yet reported.
    pub fn tick<'a>(&self, tasks: impl IntoIterator<Item = &'a DesiredTask>) -> Vec<Verdict> {
        let now = Instant::now();
        let mut probes = self.probes.lock().unwrap_or_else(|e| e.into_inner());
        let mut here = Vec::new();
        for t in tasks {
            let Some(check) = &t.health else { continue };
            let key = (t.key.job, t.key.attempt);
            here.push(key);
            probes.entry(key).or_insert_with(|| Probe {
                check: check.clone(),
                port: t.master_port,
                user: t.user.clone(),
                workdir: t.workdir.clone(),
                env: t.env.clone(),
                first_seen: now,
                last_check: None,
                in_flight: false,
                failures: 0,
                healthy: None,
                reported: None,
                detail: String::new(),
            });
        }
        probes.retain(|k, _| here.contains(k));
        let mut out = Vec::new();
        for (&key, p) in probes.iter_mut() {
            let due = p
                .last_check
                .is_none_or(|t| now >= t + Duration::from_secs(p.check.interval_secs));
            if due && !p.in_flight {
                p.in_flight = true;
                p.last_check = Some(now);
                let (port, path) = (p.port, p.check.path.clone());
                let run = p
                    .check
                    .cmd
                    .clone()
                    .map(|cmd| (cmd, p.user.clone(), p.workdir.clone(), p.env.clone()));
                let probes = self.probes.clone();
                tokio::spawn(async move {
                    let outcome = match run {
                        Some((cmd, user, workdir, env)) => {
                            run_cmd(&cmd, &user, &workdir, env).await
                        }
                        None => match get(port, &path).await {
                            Ok(code) if (200..400).contains(&code) => {
                                Ok(format!("GET {path}: {code}"))
                            }
                            Ok(code) => Err(format!("GET {path}: {code}")),
                            Err(e) => Err(format!("GET {path}: {e}")),
                        },
                    };
                    let mut probes = probes.lock().unwrap_or_else(|e| e.into_inner());
                    if let Some(p) = probes.get_mut(&key) {
                        p.record(outcome);
                    }
                });
            }
            if p.healthy.is_some() && p.healthy != p.reported {
                p.reported = p.healthy;
                out.push((key.0, key.1, p.healthy == Some(true), p.detail.clone()));
            }
        }
        out
    }
}

impl Probe {
    /// One check's outcome: `Ok` healthy, `Err` not; each with what it saw.
    fn record(&mut self, outcome: Result<String, String>) {
        self.in_flight = false;
        let in_grace = self.first_seen.elapsed() < Duration::from_secs(self.check.grace_secs);
        match outcome {
            Ok(seen) => {
                self.failures = 0;
                self.healthy = Some(true);
                self.detail = seen;
            }
            Err(seen) => {
                self.detail = seen;
                if in_grace {
                    return;
                }
                self.failures += 1;
                if self.failures >= self.check.failures {
                    self.detail =
                        format!("{} ({} failed checks in a row)", self.detail, self.failures);
                    self.healthy = Some(false);
                }
            }
        }
    }
}

/// Runs a command check as `user` (its uid and primary group, set in the
/// child before `sh` is exec'd, so nothing of the job's environment ever
/// reaches a process running as root) in `workdir` with `env`: `Ok` when it
/// exits 0 within [`CHECK_TIMEOUT`] (it is killed if not).
async fn run_cmd(
    cmd: &str,
    user: &str,
    workdir: &str,
    mut env: Vec<(String, String)>,
) -> Result<String, String> {
    let account = nix::unistd::User::from_name(user)
        .ok()
        .flatten()
        .ok_or_else(|| format!("{cmd:?}: no user {user:?} on this node"))?;
    if !env.iter().any(|(k, _)| k == "PATH") {
        env.push(("PATH".into(), "/usr/local/bin:/usr/bin:/bin".into()));
    }
    let mut c = tokio::process::Command::new("/bin/sh");
    c.args(["-c", cmd])
        .uid(account.uid.as_raw())
        .gid(account.gid.as_raw())
        .current_dir(workdir)
        .env_clear()
        .envs(env)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true);
    let status = tokio::time::timeout(CHECK_TIMEOUT, c.status())
        .await
        .map_err(|_| format!("{cmd:?}: no exit within {} s", CHECK_TIMEOUT.as_secs()))?
        .map_err(|e| format!("{cmd:?}: cannot run it: {e}"))?;
    match status.code() {
        Some(0) => Ok(format!("{cmd:?}: exit 0")),
        Some(c) => Err(format!("{cmd:?}: exit {c}")),
        None => Err(format!("{cmd:?}: killed by a signal")),
    }
}

/// GET `path` at 127.0.0.1:`port`: the answer's status code.
async fn get(port: u16, path: &str) -> Result<u16, String> {
    let exchange = async {
        let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .map_err(|e| e.to_string())?;
        let req =
            format!("GET {path} HTTP/1.0\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n\r\n");
        s.write_all(req.as_bytes())
            .await
            .map_err(|e| e.to_string())?;
        let mut head = [0u8; 64];
        let mut n = 0;
        while n < head.len() {
            let r = s.read(&mut head[n..]).await.map_err(|e| e.to_string())?;
            if r == 0 || head[..n + r].contains(&b'\n') {
                n += r;
                break;
            }
            n += r;
        }
        status_code(&head[..n])
    };
    tokio::time::timeout(CHECK_TIMEOUT, exchange)
        .await
        .map_err(|_| format!("no answer within {} s", CHECK_TIMEOUT.as_secs()))?
}

/// The status code of an HTTP status line (`HTTP/1.1 200 OK`).
fn status_code(head: &[u8]) -> Result<u16, String> {
    let line = String::from_utf8_lossy(head);
    let mut words = line.split_whitespace();
    match (words.next(), words.next().and_then(|c| c.parse().ok())) {
        (Some(v), Some(code)) if v.starts_with("HTTP/") => Ok(code),
        _ => Err("not an HTTP answer".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn probe(grace_secs: u64) -> Probe {
        Probe {
            check: HealthCheck {
                path: "/h".into(),
                interval_secs: 1,
                grace_secs,
                failures: 2,
                cmd: None,
            },
            port: 1,
            user: "nobody".into(),
            workdir: "/".into(),
            env: vec![],
            first_seen: Instant::now(),
            last_check: None,
            in_flight: true,
            failures: 0,
            healthy: None,
            reported: None,
            detail: String::new(),
        }
    }

    #[test]
    fn failures_count_after_the_grace_and_one_success_heals() {
        let mut p = probe(3600);
        p.record(Err("GET /h: refused".into()));
        p.record(Err("GET /h: 500".into()));
        assert_eq!((p.failures, p.healthy), (0, None), "within the grace");
        let mut p = probe(0);
        p.record(Err("GET /h: 503".into()));
        assert_eq!(p.healthy, None, "one failure of two");
        p.record(Err("GET /h: connection refused".into()));
        assert_eq!(p.healthy, Some(false));
        assert!(p.detail.contains("connection refused") && p.detail.contains("2 failed"));
        p.record(Ok("GET /h: 204".into()));
        assert_eq!((p.failures, p.healthy), (0, Some(true)));
    }

    #[test]
    fn status_lines_are_read() {
        assert_eq!(status_code(b"HTTP/1.1 200 OK\r\n"), Ok(200));
        assert_eq!(
            status_code(b"HTTP/1.0 503 Service Unavailable\r\n"),
            Ok(503)
        );
        assert!(status_code(b"SSH-2.0-OpenSSH").is_err());
    }

    #[tokio::test]
    async fn a_real_server_is_checked() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        tokio::spawn(async move {
            let (mut s, _) = listener.accept().await.unwrap();
            let mut buf = [0u8; 256];
            let _ = s.read(&mut buf).await;
            s.write_all(b"HTTP/1.1 204 No Content\r\n\r\n")
                .await
                .unwrap();
        });
        assert_eq!(get(port, "/healthz").await, Ok(204));
        let closed = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let gone = closed.local_addr().unwrap().port();
        drop(closed);
        assert!(get(gone, "/healthz").await.is_err());
    }

    #[tokio::test]
    async fn a_command_check_runs_as_the_user_with_the_environment() {
        let env = vec![("WANT".to_string(), "yes".to_string())];
        let ok = run_cmd("test \"$WANT\" = yes", "root", "/", env.clone()).await;
        assert!(ok.is_ok(), "{ok:?}");
        let bad = run_cmd("exit 3", "root", "/", env.clone())
            .await
            .unwrap_err();
        assert!(bad.contains("exit 3"), "{bad}");
        // As the user, not as the agent: nobody cannot write root's home.
        let denied = run_cmd("touch /root/.gpuq-probe-test", "nobody", "/", env).await;
        assert!(denied.is_err(), "{denied:?}");
        assert!(!std::path::Path::new("/root/.gpuq-probe-test").exists());
        let nouser = run_cmd("true", "no-such-user-x", "/", vec![])
            .await
            .unwrap_err();
        assert!(nouser.contains("no user"), "{nouser}");
    }
}
