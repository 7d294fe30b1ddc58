//! Several `gpuq server` processes forming one control plane on loopback.

use std::path::Path;
use std::time::{Duration, Instant};

use super::Server;

/// A control plane of real server processes: `s1` bootstraps, the others
/// join it with a server token.
pub struct ServerSet {
    pub servers: Vec<Server>,
}

impl ServerSet {
    /// Starts `n` servers (s1..sN) under `root` and waits until all are voters.
    pub fn start(root: &Path, n: usize) -> ServerSet {
        ServerSet::start_with(root, n, "")
    }

    /// Like [`ServerSet::start`], with `extra` config lines on every server.
    pub fn start_with(root: &Path, n: usize, extra: &str) -> ServerSet {
        let first = Server::bootstrap_with(&root.join("s1"), extra);
        let token = first.server_token();
        let mut servers = vec![first];
        for i in 2..=n {
            let name = format!("s{i}");
            let s = Server::join(&root.join(&name), &name, &servers[0], &token);
            servers.push(s);
        }
        let set = ServerSet { servers };
        set.wait_members(n);
        set
    }

    /// Starts `n` servers at once with `--bootstrap-expect n --peers ...`
    /// and one shared secret, and waits until all are voters.
    pub fn form(root: &Path, n: usize) -> ServerSet {
        let secret = root.join("bootstrap.secret");
        std::fs::write(&secret, "a-shared-secret-for-tests\n").unwrap();
        let mut servers: Vec<Server> = (1..=n)
            .map(|i| {
                let name = format!("s{i}");
                Server::joining(&root.join(&name), &name, "", "")
            })
            .collect();
        let peers: Vec<String> = servers.iter().map(|s| s.addr()).collect();
        for s in &mut servers {
            s.mode = ServerSet::form_args(n, &peers.join(","), &secret);
        }
        // The last first: whoever starts first, the seed creates the cluster.
        for s in servers.iter_mut().rev() {
            s.spawn();
        }
        for s in &mut servers {
            s.wait_ready();
            s.mode.clear();
        }
        let set = ServerSet { servers };
        set.wait_members(n);
        set
    }

    /// The flags that form a cluster of `n` with `peers` and a secret file.
    pub fn form_args(n: usize, peers: &str, secret: &Path) -> Vec<String> {
        vec![
            "--bootstrap-expect".into(),
            n.to_string(),
            "--peers".into(),
            peers.into(),
            "--bootstrap-secret-file".into(),
            secret.display().to_string(),
        ]
    }

    /// The server named `name`.
    pub fn by_name(&self, name: &str) -> &Server {
        self.servers
            .iter()
            .find(|s| s.name == name)
            .unwrap_or_else(|| panic!("no server {name} in the set"))
    }

    /// The index of the server that leads now (by the running servers' views).
    pub fn leader(&self) -> usize {
        let start = Instant::now();
        loop {
            for (i, s) in self.servers.iter().enumerate() {
                if s.pid().is_some() && s.status()["leader"] == s.name.as_str() {
                    return i;
                }
            }
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "no leader among the servers in 30 s"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Waits until every running server sees `voters` voters and a leader.
    pub fn wait_members(&self, voters: usize) {
        let start = Instant::now();
        loop {
            let agree = self.servers.iter().filter(|s| s.pid().is_some()).all(|s| {
                let v = s.status();
                !v["leader"].is_null()
                    && v["members"].as_array().is_some_and(|ms| {
                        ms.iter().filter(|m| m["voter"] == true).count() == voters
                    })
            });
            if agree {
                return;
            }
            assert!(
                start.elapsed() < Duration::from_secs(60),
                "the servers do not agree on {voters} voters in 60 s: {:?}",
                self.servers.iter().map(|s| s.status()).collect::<Vec<_>>()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl ServerSet {
    /// Waits until server `i` holds the leader's whole log (same term, same
    /// last index) and the leader sees every voter without a problem: a
    /// restarted server that only knows who leads ([`ServerSet::wait_members`])
    /// may still lag, and a leader killed then leaves one up-to-date survivor.
    pub fn wait_caught_up(&self, i: usize) {
        let start = Instant::now();
        loop {
            let li = self.leader();
            let lead = self.servers[li].status();
            let me = self.servers[i].status();
            let healthy = lead["members"].as_array().is_some_and(|ms| {
                ms.iter()
                    .filter(|m| m["voter"] == true)
                    .all(|m| m["problem"].is_null() && m["lag"] == 0)
            });
            if healthy
                && me["term"] == lead["term"]
                && !me["last_log_index"].is_null()
                && me["last_log_index"] == lead["last_log_index"]
            {
                return;
            }
            assert!(
                start.elapsed() < Duration::from_secs(60),
                "{} did not catch up with the leader in 60 s: {me}\nleader: {lead}",
                self.servers[i].name
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Server {
    /// A new server join token (1 h).
    pub fn server_token(&self) -> String {
        self.ok(&["token", "create", "--role", "server", "--ttl", "1h"])
            .trim()
            .to_string()
    }
}
