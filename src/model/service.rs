//! Services: long-running, replicated workloads beside batch jobs. A service
//! is a replica template (a job spec) and a count; each replica runs as an
//! ordinary job (scheduled, placed, run and accounted as any), whose spec
//! says which service and index it serves. When a replica's job ends for any
//! reason, apply queues the next job for its index, after a delay that
//! doubles while the replica keeps failing soon after its start (a crash
//! loop), so a broken version does not spin.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::{JobId, JobSpec, Millis};

/// Which service and replica index a job runs for.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReplicaOf {
    pub service: String,
    pub index: u32,
}

/// A service in the replicated state.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Service {
    pub name: String,
    /// Its owner: replicas run as this user.
    pub user: String,
    /// What each replica runs, as admitted at create (account, QoS and
    /// partition resolved).
    pub spec: JobSpec,
    pub replicas: u32,
    /// The delay before a replica that ended is started again, doubled for
    /// each quick failure in a row (at most [`MAX_RESTART_DELAY_SECS`]).
    pub restart_delay_secs: u64,
    pub created: Millis,
    /// Each replica index's current job and restart history.
    #[serde(default)]
    pub slots: BTreeMap<u32, Slot>,
    /// How its replicas' agents check that they serve.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub health: Option<HealthCheck>,
    /// The version `spec` is: 1 at create, one more per update or rollback.
    #[serde(default = "first_version")]
    pub version: u64,
    /// The version before, and its spec: what replicas not yet rolled keep
    /// running (and restart as), and what `rollback` goes back to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub previous: Option<(u64, JobSpec)>,
    /// Why the last rolling update stopped before it was done (a new
    /// replica ended before it was ready).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub roll_halted: Option<String>,
    /// Its named ports (`--port NAME`): each replica gets `PORT_<NAME>`
    /// besides `PORT`, each unique on its node.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ports: Vec<String>,
}

fn first_version() -> u64 {
    1
}

/// A replica's health check, made by the agent of its first node every
/// `interval_secs`: an HTTP GET of `path` on its `PORT` at 127.0.0.1
/// (healthy: 2xx or 3xx), or, with `cmd`, a shell command run as the
/// replica's user in its working directory with its environment (healthy:
/// exit 0). One that fails `failures` times in a row after its
/// `grace_secs` from start is stopped and replaced, as one that exited.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct HealthCheck {
    /// Empty with `cmd`.
    pub path: String,
    pub interval_secs: u64,
    pub grace_secs: u64,
    pub failures: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cmd: Option<String>,
}

impl HealthCheck {
    /// Checks a path as a GET's request line needs it, or a command.
    pub fn check(&self) -> Result<(), String> {
        if self.interval_secs == 0 || self.failures == 0 {
            return Err("--health-interval and --health-failures must be at least 1".into());
        }
        if let Some(cmd) = &self.cmd {
            if cmd.trim().is_empty() || !self.path.is_empty() {
                return Err(
                    "give one health check: --health-http PATH or a non-empty --health-cmd CMD"
                        .into(),
                );
            }
            return Ok(());
        }
        let p = &self.path;
        if !p.starts_with('/') || p.chars().any(|c| c.is_whitespace() || c.is_control()) {
            return Err(format!(
                "--health-http {p:?}: give an absolute URL path without spaces, e.g. /healthz"
            ));
        }
        Ok(())
    }
}

/// What `gpuq service create` and `apply` set besides the replica
/// template: how many, how soon one that ended starts again, and how its
/// health is checked.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServiceSettings {
    pub replicas: u32,
    pub restart_delay_secs: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub health: Option<HealthCheck>,
    /// Named ports (`--port NAME`), as given.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ports: Vec<String>,
}

/// One replica index of a service.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Slot {
    /// The job now serving this index (pending or running), if any.
    pub job: Option<JobId>,
    /// Jobs this index has had after its first.
    pub restarts: u32,
    /// Its last jobs that ended within [`QUICK_FAILURE_SECS`] of their
    /// start (or before it), in a row: the crash loop's length.
    pub quick_failures: u32,
    /// The service version its `job` runs.
    #[serde(default = "first_version")]
    pub version: u64,
    /// During a rolling update: the new version's job, started beside
    /// `job`, which takes its place once ready (running, and healthy where
    /// the service checks).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next: Option<JobId>,
}

/// A replica that ends within this long of its start counts as a quick
/// failure, and its restart waits twice as long as the one before.
pub const QUICK_FAILURE_SECS: u64 = 60;
/// The longest wait before a replica is started again.
pub const MAX_RESTART_DELAY_SECS: u64 = 300;
/// At most this many replicas per service.
pub const MAX_REPLICAS: u32 = 1000;

impl Service {
    /// The wait before index `slot`'s next job may start.
    pub fn restart_delay(&self, slot: &Slot) -> u64 {
        restart_delay(self.restart_delay_secs, slot.quick_failures)
    }

    /// The spec of `version`: the current one, or the one before.
    pub fn spec_of(&self, version: u64) -> &JobSpec {
        match &self.previous {
            Some((v, spec)) if *v == version => spec,
            _ => &self.spec,
        }
    }

    /// Whether a rolling update is under way: some index runs an older
    /// version, and the roll has not halted.
    pub fn rolling(&self) -> bool {
        self.roll_halted.is_none()
            && self
                .slots
                .iter()
                .any(|(i, s)| *i < self.replicas && s.version < self.version)
    }
}

/// `base` for the first quick failure in a row (or none), doubled for each
/// after it, at most [`MAX_RESTART_DELAY_SECS`] (or `base`, if longer).
fn restart_delay(base: u64, quick_failures: u32) -> u64 {
    let doublings = quick_failures.saturating_sub(1).min(16);
    base.saturating_mul(1 << doublings)
        .min(MAX_RESTART_DELAY_SECS.max(base))
}

/// At most this many named ports per service.
pub const MAX_NAMED_PORTS: usize = 8;

/// The variable a replica finds its named port `name` in: `PORT_<NAME>`.
pub fn port_env(name: &str) -> String {
    format!("PORT_{}", name.to_ascii_uppercase())
}

/// Whether `names` may name a service's ports: each a letter, then
/// letters, digits and '_' (at most 32), none twice (upper-cased, as their
/// variables are), at most [`MAX_NAMED_PORTS`].
pub fn check_port_names(names: &[String]) -> Result<(), String> {
    if names.len() > MAX_NAMED_PORTS {
        return Err(format!(
            "{} named ports: a service may have at most {MAX_NAMED_PORTS} (--port NAME)",
            names.len()
        ));
    }
    let mut seen = std::collections::BTreeSet::new();
    for name in names {
        let ok = !name.is_empty()
            && name.len() <= 32
            && name.starts_with(|c: char| c.is_ascii_alphabetic())
            && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
        if !ok {
            return Err(format!(
                "--port {name:?}: name a port with a letter, then letters, digits and '_' \
                 (at most 32), e.g. --port metrics; the replica gets PORT_METRICS, a port of \
                 the cluster's range chosen for it"
            ));
        }
        if !seen.insert(port_env(name)) {
            return Err(format!(
                "--port {name:?} is given twice (names are upper-cased into {}): give each \
                 port once",
                port_env(name)
            ));
        }
    }
    Ok(())
}

/// Whether `name` may name a service: what a DNS label allows (lowercase
/// letters, digits, `-`, starting with a letter, at most 63 characters), so
/// it can name endpoints and files everywhere.
pub fn check_service_name(name: &str) -> Result<(), String> {
    let ok = !name.is_empty()
        && name.len() <= 63
        && name.starts_with(|c: char| c.is_ascii_lowercase())
        && !name.ends_with('-')
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-');
    if ok {
        Ok(())
    } else {
        Err(format!(
            "{name:?} cannot name a service: use lowercase letters, digits and '-', starting \
             with a letter, at most 63 characters (e.g. llama-serve)"
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_dns_labels() {
        for good in ["a", "llama-serve", "v2-api"] {
            assert_eq!(check_service_name(good), Ok(()), "{good}");
        }
        for bad in ["", "Llama", "2fast", "a_b", "trailing-", &"x".repeat(64)] {
            let e = check_service_name(bad).unwrap_err();
            assert!(e.contains("lowercase"), "{bad}: {e}");
        }
    }

    #[test]
    fn port_names_become_variables_and_bad_ones_say_how_to_fix_them() {
        assert_eq!(port_env("metrics"), "PORT_METRICS");
        let names = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(
            check_port_names(&names(&["http", "grpc_2", "Metrics"])),
            Ok(())
        );
        for (bad, says) in [
            (names(&["8080"]), "name a port with a letter"),
            (names(&["a-b"]), "name a port with a letter"),
            (names(&[""]), "name a port with a letter"),
            (names(&["http", "HTTP"]), "given twice"),
            (
                names(&["a", "b", "c", "d", "e", "f", "g", "h", "i"]),
                "at most 8",
            ),
        ] {
            let e = check_port_names(&bad).unwrap_err();
            assert!(e.contains(says), "{bad:?}: {e}");
        }
    }

    #[test]
    fn the_restart_delay_doubles_in_a_crash_loop_up_to_a_cap() {
        assert_eq!(
            [0, 1, 2, 3, 4].map(|n| restart_delay(5, n)),
            [5, 5, 10, 20, 40],
            "the first quick failure waits the plain delay"
        );
        assert_eq!(restart_delay(5, 30), MAX_RESTART_DELAY_SECS);
        assert_eq!(restart_delay(600, 3), 600, "a longer base is kept");
    }
}
