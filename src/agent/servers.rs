//! The servers an agent (compute or login) knows: the configured list and the
//! join address, refreshed with the control plane's members as the leader
//! reports them, and kept in the data dir (`servers.json`) so that an agent
//! restarted while its first configured server is dead still finds the
//! cluster. Failover walks this list; which server answered last is tried
//! first next time.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// The file in an agent's data dir that holds the last known servers.
pub const SERVERS_FILE: &str = "servers.json";

#[derive(Debug, Default, Serialize, Deserialize)]
struct Saved {
    #[serde(default)]
    servers: Vec<String>,
}

#[derive(Debug)]
struct Known {
    /// Configured and learned addresses, without repeats, in trial order.
    addrs: Vec<SocketAddr>,
    /// The index in `addrs` that answered last.
    preferred: usize,
}

/// The agent's list of servers, shared by its leader connection and its
/// request forwarder.
#[derive(Debug)]
pub struct ServerList {
    file: Option<PathBuf>,
    known: Mutex<Known>,
}

impl ServerList {
    /// A list that is not persisted (simulated agents, tests).
    pub fn fixed(addrs: Vec<SocketAddr>) -> ServerList {
        ServerList {
            file: None,
            known: Mutex::new(Known {
                addrs: dedup(addrs),
                preferred: 0,
            }),
        }
    }

    /// `configured` (join address first), then what `data_dir` remembers. A
    /// missing or unreadable file only means nothing was learned yet.
    pub fn load(configured: Vec<SocketAddr>, data_dir: &Path) -> ServerList {
        let file = data_dir.join(SERVERS_FILE);
        let mut addrs = configured;
        match std::fs::read(&file) {
            Ok(bytes) => match serde_json::from_slice::<Saved>(&bytes) {
                Ok(saved) => addrs.extend(
                    saved
                        .servers
                        .iter()
                        .filter_map(|s| s.parse::<SocketAddr>().ok()),
                ),
                Err(e) => tracing::warn!(file = %file.display(), "ignoring the saved servers: {e}"),
            },
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => tracing::warn!(file = %file.display(), "cannot read the saved servers: {e}"),
        }
        ServerList {
            file: Some(file),
            known: Mutex::new(Known {
                addrs: dedup(addrs),
                preferred: 0,
            }),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Known> {
        self.known.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Every known server, the one that answered last first.
    pub fn in_order(&self) -> Vec<SocketAddr> {
        let k = self.lock();
        let n = k.addrs.len();
        (0..n).map(|i| k.addrs[(k.preferred + i) % n]).collect()
    }

    /// Every known server, in list order.
    pub fn all(&self) -> Vec<SocketAddr> {
        self.lock().addrs.clone()
    }

    /// Remembers that `addr` answered (it is tried first next time).
    pub fn answered(&self, addr: SocketAddr) {
        let mut k = self.lock();
        if let Some(i) = k.addrs.iter().position(|a| *a == addr) {
            k.preferred = i;
        }
    }

    /// Adds the control plane's members as the leader reports them and saves
    /// the list when it changed. Addresses are only added: a server that left
    /// costs one failed dial, while one forgotten too early could be the only
    /// one left.
    pub fn learn(&self, members: &[String]) {
        let changed = {
            let mut k = self.lock();
            let before = k.addrs.len();
            for a in members.iter().filter_map(|s| s.parse::<SocketAddr>().ok()) {
                if !k.addrs.contains(&a) {
                    k.addrs.push(a);
                }
            }
            k.addrs.len() != before
        };
        if changed {
            self.save();
        }
    }

    fn save(&self) {
        let Some(file) = &self.file else { return };
        let saved = Saved {
            servers: self.all().iter().map(|a| a.to_string()).collect(),
        };
        let tmp = file.with_extension("json.tmp");
        let result = serde_json::to_vec_pretty(&saved)
            .map_err(std::io::Error::other)
            .and_then(|bytes| {
                use std::io::Write;
                use std::os::unix::fs::OpenOptionsExt;
                std::fs::OpenOptions::new()
                    .write(true)
                    .create(true)
                    .truncate(true)
                    .mode(0o600)
                    .open(&tmp)?
                    .write_all(&bytes)
            })
            .and_then(|()| std::fs::rename(&tmp, file));
        if let Err(e) = result {
            tracing::warn!(file = %file.display(), "cannot save the known servers: {e}");
        }
    }
}

fn dedup(addrs: Vec<SocketAddr>) -> Vec<SocketAddr> {
    let mut out = Vec::with_capacity(addrs.len());
    for a in addrs {
        if !out.contains(&a) {
            out.push(a);
        }
    }
    out
}

/// Exponential backoff with jitter for reconnecting: doubles from `min` to
/// `max`, each wait drawn between half and the whole of the current step, so
/// a fleet that lost its leader at once does not reconnect in lockstep.
#[derive(Debug)]
pub struct Backoff {
    min: Duration,
    max: Duration,
    step: Duration,
}

impl Backoff {
    pub fn new(min: Duration, max: Duration) -> Backoff {
        Backoff {
            min,
            max,
            step: min,
        }
    }

    /// The next wait; the step grows.
    pub fn next_wait(&mut self) -> Duration {
        let step = self.step;
        self.step = (self.step * 2).min(self.max);
        let half = step / 2;
        half + half.mul_f64(rand::random::<f64>())
    }

    /// Back to the shortest step (after a connection that worked).
    pub fn reset(&mut self) {
        self.step = self.min;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn a(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }

    #[test]
    fn learned_servers_survive_a_restart_behind_the_configured_ones() {
        let dir = tempfile::tempdir().unwrap();
        let list = ServerList::load(vec![a("10.0.0.1:7420")], dir.path());
        list.learn(&["10.0.0.2:7420".into(), "10.0.0.1:7420".into()]);
        list.learn(&["10.0.0.3:7420".into(), "not an address".into()]);
        let again = ServerList::load(vec![a("10.0.0.1:7420")], dir.path());
        assert_eq!(
            again.all(),
            vec![a("10.0.0.1:7420"), a("10.0.0.2:7420"), a("10.0.0.3:7420")]
        );
        // A corrupt file leaves the configured list.
        std::fs::write(dir.path().join(SERVERS_FILE), b"{").unwrap();
        let corrupt = ServerList::load(vec![a("10.0.0.1:7420")], dir.path());
        assert_eq!(corrupt.all(), vec![a("10.0.0.1:7420")]);
    }

    #[test]
    fn the_server_that_answered_last_is_tried_first() {
        let list = ServerList::fixed(vec![a("10.0.0.1:1"), a("10.0.0.2:1"), a("10.0.0.3:1")]);
        list.answered(a("10.0.0.2:1"));
        assert_eq!(
            list.in_order(),
            vec![a("10.0.0.2:1"), a("10.0.0.3:1"), a("10.0.0.1:1")]
        );
    }

    #[test]
    fn backoff_grows_to_its_cap_with_jitter_and_resets() {
        let mut b = Backoff::new(Duration::from_millis(100), Duration::from_secs(2));
        let waits: Vec<Duration> = (0..8).map(|_| b.next_wait()).collect();
        assert!(waits[0] >= Duration::from_millis(50) && waits[0] <= Duration::from_millis(100));
        assert!(waits.iter().all(|w| *w <= Duration::from_secs(2)));
        assert!(waits[7] >= Duration::from_secs(1), "capped step: {waits:?}");
        b.reset();
        assert!(b.next_wait() <= Duration::from_millis(100));
    }
}
