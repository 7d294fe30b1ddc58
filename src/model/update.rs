//! A change to a queued or running job's settings (`scontrol update
//! JobId=12 TimeLimit=1:00:00`). Unset fields stay as they are.

use serde::{Deserialize, Serialize};

/// What `scontrol update` may change; `None`: unchanged.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobUpdate {
    /// A new time limit; `Some(None)` is UNLIMITED (admins). Its owner may
    /// only lower it; a running job is ended when it is past the new one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time_limit_secs: Option<Option<u64>>,
    /// Seconds added to (negative: taken from) each job's current limit
    /// (`TimeLimit=+30`, `-10`); the same rules as for a new limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time_limit_change_secs: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Negative values (a higher priority) are for admins.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nice: Option<i32>,
    /// Pending jobs only, checked against the policy as at submission.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub partition: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub qos: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub account: Option<String>,
}

impl JobUpdate {
    pub fn is_empty(&self) -> bool {
        *self == JobUpdate::default()
    }

    /// Whether it changes what only a pending job may change.
    pub fn needs_pending(&self) -> bool {
        self.partition.is_some() || self.qos.is_some() || self.account.is_some()
    }
}
