//! A server's data directory:
//!
//! ```text
//! D/node_id        this server's Raft node id (random, chosen once)
//! D/tls/           node.key (0600), node.crt, ca.crt; ca.key on the bootstrap server
//! D/gpuq.redb      the Raft log, vote and state machine, in one file
//! D/joining        while a joined server is not yet a member: the server
//!                  (HOST:PORT) to ask again after a restart
//! ```

use std::path::{Path, PathBuf};

use anyhow::{bail, Context};

use crate::config::ServerConfig;
use crate::model::Role;
use crate::net::pki::{ClusterCa, NodeIdentity};

/// What `prepare` found or created.
pub struct Boot {
    pub node_id: u64,
    /// The CA to put into the replicated state, on the bootstrap server.
    pub pending_ca: Option<ClusterCa>,
}

/// A server's data directory.
pub struct DataDir {
    root: PathBuf,
}

impl DataDir {
    /// Opens (creating if needed) the directory.
    pub fn open(root: &Path) -> anyhow::Result<DataDir> {
        std::fs::create_dir_all(root)
            .with_context(|| format!("cannot create data dir {}", root.display()))?;
        Ok(DataDir {
            root: root.to_path_buf(),
        })
    }

    pub fn db_path(&self) -> PathBuf {
        self.root.join("gpuq.redb")
    }

    fn tls_dir(&self) -> PathBuf {
        self.root.join("tls")
    }

    /// The node identity (key, certificate, CA certificate).
    pub fn identity(&self) -> anyhow::Result<NodeIdentity> {
        NodeIdentity::load(&self.tls_dir()).with_context(|| {
            format!(
                "cannot read the node identity in {}",
                self.tls_dir().display()
            )
        })
    }

    /// Whether this directory already belongs to a cluster (bootstrapped or joined).
    pub fn has_cluster(&self) -> bool {
        self.root.join("node_id").exists()
    }

    /// Keeps the identity a join got, a new node id, and the server to ask
    /// for membership (until [`DataDir::joined`] is called).
    pub fn save_join(
        &self,
        identity: &NodeIdentity,
        via: std::net::SocketAddr,
    ) -> anyhow::Result<u64> {
        identity.save(&self.tls_dir())?;
        std::fs::write(self.root.join("joining"), via.to_string())
            .with_context(|| format!("cannot write {}", self.root.join("joining").display()))?;
        let node_id: u64 = rand::random::<u64>() >> 1;
        let id_path = self.root.join("node_id");
        std::fs::write(&id_path, node_id.to_string())
            .with_context(|| format!("cannot write {}", id_path.display()))?;
        Ok(node_id)
    }

    /// Keeps the identity of a server restored from a backup, and a new node id.
    pub fn save_restored(&self, identity: &NodeIdentity) -> anyhow::Result<u64> {
        identity.save(&self.tls_dir())?;
        let node_id: u64 = rand::random::<u64>() >> 1;
        let id_path = self.root.join("node_id");
        std::fs::write(&id_path, node_id.to_string())
            .with_context(|| format!("cannot write {}", id_path.display()))?;
        Ok(node_id)
    }

    /// The server to ask for membership, while this one is not yet a member.
    pub fn joining(&self) -> Option<std::net::SocketAddr> {
        std::fs::read_to_string(self.root.join("joining"))
            .ok()?
            .trim()
            .parse()
            .ok()
    }

    /// This server is a member now: restarts need ask no one.
    pub fn joined(&self) {
        let _ = std::fs::remove_file(self.root.join("joining"));
    }

    /// Makes sure the directory holds an identity and a node id. With
    /// `bootstrap` an empty directory gets a new cluster CA; without it, an
    /// empty directory is an error saying how to start.
    pub fn prepare(&self, cfg: &ServerConfig, bootstrap: bool) -> anyhow::Result<Boot> {
        let id_path = self.root.join("node_id");
        let ca_key_path = self.tls_dir().join("ca.key");
        if !id_path.exists() {
            if !bootstrap {
                bail!(
                    "data dir {} holds no cluster: start the first server with --bootstrap, \
                     or join an existing cluster with --join HOST:PORT --token TOKEN",
                    self.root.display()
                );
            }
            let ca = ClusterCa::generate(&cfg.cluster_name)?;
            let identity = ca.issue(Role::Server, &cfg.node_name)?;
            identity.save(&self.tls_dir())?;
            write_private(&ca_key_path, ca.key_pem.as_bytes())?;
            let node_id: u64 = rand::random::<u64>() >> 1;
            std::fs::write(&id_path, node_id.to_string())
                .with_context(|| format!("cannot write {}", id_path.display()))?;
        }
        let text = std::fs::read_to_string(&id_path)
            .with_context(|| format!("cannot read {}", id_path.display()))?;
        let node_id: u64 = text
            .trim()
            .parse()
            .with_context(|| format!("{} does not hold a node id", id_path.display()))?;
        let pending_ca = if ca_key_path.exists() {
            let identity = self.identity()?;
            Some(ClusterCa {
                cert_pem: identity.ca_cert_pem.clone(),
                key_pem: std::fs::read_to_string(&ca_key_path)
                    .with_context(|| format!("cannot read {}", ca_key_path.display()))?,
            })
        } else {
            None
        };
        Ok(Boot {
            node_id,
            pending_ca,
        })
    }
}

/// Writes a file readable by its owner only.
pub fn write_private(path: &Path, bytes: &[u8]) -> anyhow::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
        .with_context(|| format!("cannot write {}", path.display()))?;
    f.write_all(bytes)
        .with_context(|| format!("cannot write {}", path.display()))?;
    Ok(())
}
