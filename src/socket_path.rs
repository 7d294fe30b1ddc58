//! Where the daemon's unix socket is. The daemons listen on it (a system
//! install's `socket` key, a `gpuq dev` cluster's state directory) and the CLI
//! looks for it, so the file name and the default locations are written once
//! here, below both, instead of the CLI importing `dev` to find a dev cluster.

use std::path::{Path, PathBuf};

/// The socket's file name inside whatever directory holds it.
pub const FILE_NAME: &str = "gpuq.sock";

/// The directory of the system daemon's socket.
pub const SYSTEM_DIR: &str = "/run/gpuq";

/// The system daemon's socket, `/run/gpuq/gpuq.sock` (the `socket` key's
/// default).
pub fn system() -> PathBuf {
    socket_in(Path::new(SYSTEM_DIR))
}

/// The socket in `dir` (a dev cluster's state dir, an agent's data dir).
pub fn socket_in(dir: &Path) -> PathBuf {
    dir.join(FILE_NAME)
}

/// Where `gpuq dev` keeps its state by default, and where the CLI looks for
/// its socket: `$XDG_STATE_HOME/gpuq/dev`, else `~/.local/state/gpuq/dev`.
pub fn dev_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("XDG_STATE_HOME") {
        return PathBuf::from(d).join("gpuq/dev");
    }
    let home = std::env::var_os("HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| "/tmp".into());
    home.join(".local/state/gpuq/dev")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_system_socket_is_where_packages_and_docs_say() {
        assert_eq!(system(), Path::new("/run/gpuq/gpuq.sock"));
    }
}
