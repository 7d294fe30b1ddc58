//! The wall clock, read in one place. Every role stamps times as milliseconds
//! since the Unix epoch ([`Millis`]): the leader into the commands it proposes,
//! the agent's shim into a task's start and end, the CLI for `--begin now+N`
//! and "how long ago". Keeping the reading here, low in the house, means no
//! role imports another just to learn the time, and `sched` and `state`
//! keep taking `now` as an argument instead of reading it.

use crate::model::Millis;

/// Milliseconds since the Unix epoch, now (0 if the clock is before 1970).
pub fn now_ms() -> Millis {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as Millis)
        .unwrap_or(0)
}

pub use crate::model::policy::fmt_time;
