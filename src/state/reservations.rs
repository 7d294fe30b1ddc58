//! Advance reservations in apply (`gpuq admin reservation`): each change
//! validated whole against the nodes and the other reservations before
//! anything changes. Nodes for `--gpus N` are picked here, from the state,
//! so every server picks the same ones. Reservations that have ended are
//! dropped by the next change of any reservation (apply reads no clock, and
//! the scheduler ignores ended ones meanwhile).

use std::collections::BTreeSet;
use std::sync::Arc;

use super::{Rejection, State};
use crate::model::policy_change::{Op, ReservationPatch};
use crate::model::{expand_hostlist, AdvanceReservation, Millis};

fn refuse(msg: impl Into<String>) -> Rejection {
    Rejection::Policy(msg.into())
}

/// The longest window one reservation may cover.
const MAX_WINDOW_MS: Millis = 366 * 24 * 3600 * 1000;

impl State {
    pub(super) fn change_reservation(
        &mut self,
        op: Op,
        name: &str,
        p: &ReservationPatch,
        by: &str,
        now: Millis,
    ) -> Result<String, Rejection> {
        super::policy::check_name("reservation", name)?;
        let current = self.policy.reservations.get(name).cloned();
        match (op, &current) {
            (Op::Add, Some(_)) => {
                return Err(refuse(format!(
                    "reservation {name} already exists; change it with \
                     `gpuq admin reservation modify {name}` or delete it first"
                )))
            }
            (Op::Modify | Op::Remove, None) => {
                return Err(refuse(format!(
                    "reservation {name} does not exist (see `gpuq admin reservation list`)"
                )))
            }
            (Op::Remove, Some(_)) => {
                let policy = Arc::make_mut(&mut self.policy);
                policy.reservations.remove(name);
                policy.reservations.retain(|_, r| r.end > now);
                return Ok(format!("reservation {name} deleted"));
            }
            _ => {}
        }
        let r = self.build_reservation(name, current, p, by, now)?;
        let what = format!(
            "reservation {name} {}: {} node{} ({}) from {} to {}{}",
            if op == Op::Add { "created" } else { "changed" },
            r.nodes.len(),
            if r.nodes.len() == 1 { "" } else { "s" },
            crate::model::hostlist::compress_hostlist(&r.nodes),
            crate::model::policy::fmt_time(r.start),
            crate::model::policy::fmt_time(r.end),
            if r.maint {
                ", maintenance: its nodes are drained while it is active"
            } else {
                ""
            },
        );
        let policy = Arc::make_mut(&mut self.policy);
        policy.reservations.retain(|_, r| r.end > now);
        policy.reservations.insert(name.to_string(), r);
        Ok(what)
    }

    /// `current` (or a new one) with `p` applied, checked whole.
    fn build_reservation(
        &self,
        name: &str,
        current: Option<AdvanceReservation>,
        p: &ReservationPatch,
        by: &str,
        now: Millis,
    ) -> Result<AdvanceReservation, Rejection> {
        let adding = current.is_none();
        if p.nodes.is_some() && p.gpus.is_some() {
            return Err(refuse("give --nodes or --gpus, not both"));
        }
        if p.end.is_some() && p.duration_secs.is_some() {
            return Err(refuse("give --end or --duration, not both"));
        }
        if adding && p.nodes.is_none() && p.gpus.is_none() {
            return Err(refuse(
                "a reservation needs nodes: give --nodes HOSTLIST or --gpus N",
            ));
        }
        if adding && p.start.is_none() {
            return Err(refuse(
                "a reservation needs a start: give --start TIME (now, now+10min, 2026-12-24T08:00)",
            ));
        }
        if adding && p.end.is_none() && p.duration_secs.is_none() {
            return Err(refuse(
                "a reservation needs a length: give --duration D (e.g. 4h) or --end TIME",
            ));
        }
        let mut r = current.unwrap_or_else(|| AdvanceReservation {
            name: name.to_string(),
            nodes: Vec::new(),
            start: 0,
            end: 0,
            users: BTreeSet::new(),
            accounts: BTreeSet::new(),
            maint: false,
            by: by.to_string(),
        });
        let length = r.end.saturating_sub(r.start);
        if let Some(s) = p.start {
            r.start = s;
            // A new start keeps the length unless a new end is given.
            r.end = s.saturating_add(length);
        }
        if let Some(e) = p.end {
            r.end = e;
        }
        if let Some(d) = p.duration_secs {
            if d == 0 {
                return Err(refuse("--duration must be positive, e.g. 4h"));
            }
            r.end = r.start.saturating_add(d.saturating_mul(1000));
        }
        if r.end <= r.start {
            return Err(refuse(format!(
                "reservation {name} would end ({}) before it starts ({}); give a later --end \
                 or a --duration",
                crate::model::policy::fmt_time(r.end),
                crate::model::policy::fmt_time(r.start)
            )));
        }
        if r.end <= now {
            return Err(refuse(format!(
                "reservation {name} would be over already (it ends {}); give a later --start \
                 or a longer --duration",
                crate::model::policy::fmt_time(r.end)
            )));
        }
        if r.end - r.start > MAX_WINDOW_MS {
            return Err(refuse(
                "a reservation may last at most 366 days; give a shorter --duration",
            ));
        }
        if let Some(users) = &p.users {
            for u in users {
                super::policy::check_name("user", u)?;
            }
            r.users = users.iter().cloned().collect();
        }
        if let Some(accounts) = &p.accounts {
            if let Some(missing) = accounts.iter().find(|a| self.policy.account(a).is_none()) {
                return Err(refuse(format!(
                    "account {missing} (in --accounts) does not exist; add it first \
                     (gpuq admin account add {missing})"
                )));
            }
            r.accounts = accounts.iter().cloned().collect();
        }
        if let Some(m) = p.maint {
            r.maint = m;
        }
        if let Some(list) = &p.nodes {
            r.nodes = self.known_nodes(list)?;
        }
        if let Some(gpus) = p.gpus {
            r.nodes = self.pick_nodes(name, gpus, &r)?;
        }
        if let Some((other, node)) = self.overlapping(&r, now) {
            return Err(refuse(format!(
                "reservation {name} would overlap reservation {other} on node {node} \
                 between {} and {}; pick other nodes or another time, or change {other}",
                crate::model::policy::fmt_time(r.start.max(self.policy.reservations[other].start)),
                crate::model::policy::fmt_time(r.end.min(self.policy.reservations[other].end)),
            )));
        }
        Ok(r)
    }

    /// A host list's nodes, each registered, sorted.
    fn known_nodes(&self, list: &str) -> Result<Vec<String>, Rejection> {
        let mut nodes =
            expand_hostlist(list).map_err(|e| refuse(format!("--nodes {list:?}: {e}")))?;
        if nodes.is_empty() {
            return Err(refuse("--nodes is empty; name at least one node (n[1-4])"));
        }
        if let Some(unknown) = nodes.iter().find(|n| !self.nodes.contains_key(*n)) {
            return Err(refuse(format!(
                "node {unknown} (in --nodes) is not a node of the cluster (see `gpuq nodes`)"
            )));
        }
        nodes.sort();
        nodes.dedup();
        Ok(nodes)
    }

    /// Whole nodes with `gpus` GPUs in all for `r`'s window: nodes clear of
    /// other reservations then, up ones first, those running the fewest
    /// jobs first, then by name (so every server picks the same).
    fn pick_nodes(
        &self,
        name: &str,
        gpus: u32,
        r: &AdvanceReservation,
    ) -> Result<Vec<String>, Rejection> {
        if gpus == 0 {
            return Err(refuse("--gpus must be at least 1"));
        }
        let busy: std::collections::BTreeMap<&str, usize> = self
            .index
            .holding()
            .filter_map(|id| self.jobs.get(&id)?.run.as_ref())
            .flat_map(|run| run.allocation.nodes.iter())
            .fold(Default::default(), |mut m, na| {
                *m.entry(na.node.as_str()).or_default() += 1;
                m
            });
        let clear = |node: &str| {
            !self
                .policy
                .reservations
                .values()
                .any(|o| o.name != name && o.holds(node) && o.overlaps(r.start, Some(r.end)))
        };
        let mut cands: Vec<(&String, &super::NodeRecord)> = self
            .nodes
            .iter()
            .filter(|(n, rec)| !rec.inventory.gpus.is_empty() && clear(n))
            .collect();
        cands.sort_by_key(|(n, rec)| {
            (
                !matches!(rec.status, super::NodeStatus::Up),
                busy.get(n.as_str()).copied().unwrap_or(0),
                n.as_str(),
            )
        });
        let mut picked = Vec::new();
        let mut have = 0u64;
        for (n, rec) in cands {
            if have >= u64::from(gpus) {
                break;
            }
            have += rec.inventory.gpus.len() as u64;
            picked.push(n.clone());
        }
        if have < u64::from(gpus) {
            return Err(refuse(format!(
                "--gpus {gpus}: the nodes free of other reservations over that window have \
                 {have} GPUs in all; ask for fewer, or another time"
            )));
        }
        picked.sort();
        Ok(picked)
    }

    /// Another live reservation sharing a node with `r` over its window.
    fn overlapping(&self, r: &AdvanceReservation, now: Millis) -> Option<(&str, String)> {
        self.policy
            .reservations
            .values()
            .filter(|o| o.name != r.name && o.end > now && o.overlaps(r.start, Some(r.end)))
            .find_map(|o| {
                let node = r.nodes.iter().find(|n| o.holds(n))?;
                Some((o.name.as_str(), node.clone()))
            })
    }
}
