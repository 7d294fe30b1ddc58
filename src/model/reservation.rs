//! Advance reservations (`gpuq admin reservation`, Slurm's reservations):
//! whole nodes set aside over a window of time. No job is placed whose time
//! limit would overlap the window on those nodes unless it names the
//! reservation (`--reservation NAME`) and may use it; shorter jobs still
//! fill the time before it. A maintenance reservation (`--maint`) drains
//! its nodes while it is active: `gpuq nodes` shows them as `maint`.
//!
//! They are part of the replicated policy, so the scheduler sees them as it
//! sees partitions; the pass turns each into a hold on its nodes over the
//! window (`sched::pass`).

use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};

use super::{Millis, NodeName};

/// Whole nodes set aside for a window of time.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AdvanceReservation {
    pub name: String,
    /// The nodes it holds, sorted.
    pub nodes: Vec<NodeName>,
    pub start: Millis,
    pub end: Millis,
    /// Users who may run jobs in it (with `accounts`; both empty: anyone
    /// who names it).
    #[serde(default, skip_serializing_if = "BTreeSet::is_empty")]
    pub users: BTreeSet<String>,
    /// Accounts whose jobs may run in it.
    #[serde(default, skip_serializing_if = "BTreeSet::is_empty")]
    pub accounts: BTreeSet<String>,
    /// A maintenance window: its nodes are drained while it is active.
    #[serde(default)]
    pub maint: bool,
    /// The admin who made it.
    pub by: String,
}

impl AdvanceReservation {
    /// Whether it is in force at `now`.
    pub fn active(&self, now: Millis) -> bool {
        self.start <= now && now < self.end
    }

    /// Whether `[from, to)` overlaps its window (`to: None`: forever).
    pub fn overlaps(&self, from: Millis, to: Option<Millis>) -> bool {
        to.is_none_or(|to| self.start < to) && self.end > from
    }

    /// Whether a job of `user` charged to `account` may run in it.
    pub fn admits(&self, user: &str, account: &str) -> bool {
        (self.users.is_empty() && self.accounts.is_empty())
            || self.users.contains(user)
            || self.accounts.contains(account)
    }

    /// Whether it holds `node`.
    pub fn holds(&self, node: &str) -> bool {
        self.nodes
            .binary_search_by(|n| n.as_str().cmp(node))
            .is_ok()
    }

    /// `maint` or `-`, for tables.
    pub fn flags(&self) -> &'static str {
        if self.maint {
            "maint"
        } else {
            "-"
        }
    }
}

/// The maintenance reservation active at `now` that holds `node`, if any.
pub fn maint_on<'r>(
    reservations: impl IntoIterator<Item = &'r AdvanceReservation>,
    node: &str,
    now: Millis,
) -> Option<&'r AdvanceReservation> {
    reservations
        .into_iter()
        .find(|r| r.maint && r.active(now) && r.holds(node))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn resv(start: Millis, end: Millis) -> AdvanceReservation {
        AdvanceReservation {
            name: "m".into(),
            nodes: vec!["n1".into(), "n3".into()],
            start,
            end,
            users: BTreeSet::new(),
            accounts: BTreeSet::new(),
            maint: true,
            by: "root".into(),
        }
    }

    #[test]
    fn windows_are_half_open() {
        let r = resv(100, 200);
        assert!(!r.active(99));
        assert!(r.active(100));
        assert!(!r.active(200));
        assert!(r.overlaps(50, Some(101)));
        assert!(
            !r.overlaps(50, Some(100)),
            "a job ending at the start is clear of it"
        );
        assert!(!r.overlaps(200, None));
        assert!(
            r.overlaps(0, None),
            "a job without a limit overlaps every later window"
        );
    }

    #[test]
    fn anyone_may_use_one_that_names_nobody() {
        let mut r = resv(0, 1);
        assert!(r.admits("alice", "ml"));
        r.users.insert("bob".into());
        assert!(!r.admits("alice", "ml"));
        assert!(r.admits("bob", "ml"));
        r.accounts.insert("ml".into());
        assert!(r.admits("alice", "ml"));
        assert!(!r.admits("alice", "cv"));
    }

    #[test]
    fn maint_on_finds_the_active_window_of_the_node() {
        let r = resv(100, 200);
        assert!(maint_on([&r], "n1", 150).is_some());
        assert!(maint_on([&r], "n2", 150).is_none());
        assert!(maint_on([&r], "n1", 250).is_none());
        assert!(r.holds("n3"));
    }
}
