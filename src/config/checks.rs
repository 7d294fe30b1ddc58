//! The value checks the types cannot make: names, paths, groups, HOST:PORT.

use std::path::Path;

use super::ConfigError;

/// Cluster and node names go into certificates and tables: one DNS-like word.
pub(super) fn check_name(key: &str, value: &str) -> Result<(), ConfigError> {
    let ok = !value.is_empty()
        && value.len() <= 63
        && value
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
    if ok {
        return Ok(());
    }
    Err(ConfigError::Invalid {
        key: key.into(),
        problem: format!(
            "{value:?} must be 1-63 letters, digits, '-', '_' or '.', e.g. \"gpu-node-01\""
        ),
    })
}

pub(super) fn check_path(key: &str, value: &Path) -> Result<(), ConfigError> {
    if value.as_os_str().is_empty() {
        return Err(ConfigError::Invalid {
            key: key.into(),
            problem: "is empty; give a path".into(),
        });
    }
    Ok(())
}

pub(super) fn check_group(key: &str, value: &Option<String>) -> Result<(), ConfigError> {
    match value {
        Some(group) if group.trim().is_empty() || group.contains(char::is_whitespace) => {
            Err(ConfigError::Invalid {
                key: key.into(),
                problem: format!(
                    "{group:?} is not a group name; give one Unix group, or leave it out"
                ),
            })
        }
        _ => Ok(()),
    }
}

/// `HOST:PORT` with a non-empty host and a numeric port (IPv6 in brackets).
pub(super) fn is_host_port(text: &str) -> bool {
    let Some((host, port)) = text.rsplit_once(':') else {
        return false;
    };
    let host_ok = match host.strip_prefix('[') {
        Some(v6) => v6
            .strip_suffix(']')
            .is_some_and(|ip| ip.parse::<std::net::Ipv6Addr>().is_ok()),
        None => {
            !host.is_empty()
                && host
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | '_'))
        }
    };
    host_ok && port.parse::<u16>().is_ok_and(|p| p != 0)
}
