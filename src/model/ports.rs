//! The range MASTER_PORT is chosen from (`master_port_range = "29500-30499"`),
//! a cluster setting: apply picks each job's port from it, so every server
//! must see the same range, and it lives in the replicated state.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// An inclusive range of TCP ports a task's rendezvous may listen on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct PortRange {
    pub first: u16,
    pub last: u16,
}

impl PortRange {
    /// torchrun's default port and the thousand after it.
    pub const DEFAULT: PortRange = PortRange {
        first: 29500,
        last: 30499,
    };

    /// How many ports the range holds.
    pub fn len(&self) -> u32 {
        u32::from(self.last) - u32::from(self.first) + 1
    }

    /// Never true: a range holds at least one port.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// The ports, lowest first.
    pub fn ports(&self) -> std::ops::RangeInclusive<u16> {
        self.first..=self.last
    }
}

impl Default for PortRange {
    fn default() -> Self {
        PortRange::DEFAULT
    }
}

impl fmt::Display for PortRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}-{}", self.first, self.last)
    }
}

/// Why a port range was refused; each says what a good one looks like.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PortRangeError {
    #[error("{0:?} is not a port range; write FIRST-LAST, e.g. \"29500-30499\"")]
    Syntax(String),
    #[error("{0:?} is not a port number; ports are 1024 to 65535")]
    NotAPort(String),
    #[error("port {0} is privileged (below 1024): tasks run as users and could not listen on it; start the range at 1024 or above, e.g. 29500")]
    Privileged(u16),
    #[error("the range {first}-{last} is backwards; write the lower port first ({last}-{first})")]
    Backwards { first: u16, last: u16 },
}

impl FromStr for PortRange {
    type Err = PortRangeError;

    fn from_str(text: &str) -> Result<PortRange, PortRangeError> {
        let (a, b) = text
            .trim()
            .split_once('-')
            .ok_or_else(|| PortRangeError::Syntax(text.to_string()))?;
        let port = |p: &str| {
            p.trim()
                .parse::<u16>()
                .map_err(|_| PortRangeError::NotAPort(p.trim().to_string()))
        };
        let (first, last) = (port(a)?, port(b)?);
        if first < 1024 {
            return Err(PortRangeError::Privileged(first));
        }
        if first > last {
            return Err(PortRangeError::Backwards { first, last });
        }
        Ok(PortRange { first, last })
    }
}

impl TryFrom<String> for PortRange {
    type Error = PortRangeError;

    fn try_from(text: String) -> Result<PortRange, PortRangeError> {
        text.parse()
    }
}

impl From<PortRange> for String {
    fn from(range: PortRange) -> String {
        range.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_parse_and_bad_ones_say_how_to_fix_them() {
        let r: PortRange = "29500-29999".parse().unwrap();
        assert_eq!((r.first, r.last, r.len()), (29500, 29999, 500));
        assert_eq!(r.to_string(), "29500-29999");
        assert_eq!(" 40000 - 40000 ".parse::<PortRange>().unwrap().len(), 1);
        for (bad, says) in [
            ("29500", "write FIRST-LAST"),
            ("29500-", "not a port number"),
            ("29500-70000", "not a port number"),
            ("80-90", "privileged"),
            (
                "30000-29500",
                "backwards; write the lower port first (29500-30000)",
            ),
        ] {
            let err = bad.parse::<PortRange>().unwrap_err().to_string();
            assert!(err.contains(says), "{bad}: {err}");
        }
    }
}
