//! A server's data directory:
//!
//! ```text
//! D/               mode 0700, checked at every start (see `owner_only`)
//! D/node_id        this server's Raft node id (random, chosen once)
//! D/tls/           node.key, node.crt, ca.crt (all 0600); ca.key on the bootstrap server
//! D/gpuq.redb      the Raft log, vote and state machine, in one file (0600;
//!                  the state holds the cluster CA's key)
//! D/joining        while a joined server is not yet a member: the server
//!                  (HOST:PORT) to ask again after a restart
//! ```

use std::path::{Path, PathBuf};

use anyhow::{bail, Context};

use crate::config::ServerConfig;
use crate::model::Role;
use crate::net::pki::{ClusterCa, NodeIdentity};
use crate::owner_only::{ensure_dir, ensure_file, write_private, DirMode};

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
    /// Opens (creating if needed) the directory, readable by this user only;
    /// one that others can read, or another user owns, is refused.
    pub fn open(root: &Path) -> anyhow::Result<DataDir> {
        ensure_dir(root, DirMode::Private).context("the server's data dir is not usable")?;
        let dir = DataDir {
            root: root.to_path_buf(),
        };
        ensure_dir(&dir.tls_dir(), DirMode::Private)?;
        Ok(dir)
    }

    pub fn db_path(&self) -> PathBuf {
        self.root.join("gpuq.redb")
    }

    /// The redb file, for opening: created empty with mode 0600 when
    /// missing (redb fills an empty file in), refused when others can read
    /// it.
    pub fn private_store(&self) -> anyhow::Result<PathBuf> {
        let path = self.db_path();
        ensure_file(&path)?;
        Ok(path)
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
        write_private(&self.root.join("joining"), via.to_string().as_bytes())?;
        let node_id: u64 = rand::random::<u64>() >> 1;
        let id_path = self.root.join("node_id");
        write_private(&id_path, node_id.to_string().as_bytes())?;
        Ok(node_id)
    }

    /// Keeps the identity of a server restored from a backup, and a new node id.
    pub fn save_restored(&self, identity: &NodeIdentity) -> anyhow::Result<u64> {
        identity.save(&self.tls_dir())?;
        let node_id: u64 = rand::random::<u64>() >> 1;
        let id_path = self.root.join("node_id");
        write_private(&id_path, node_id.to_string().as_bytes())?;
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
            write_private(&id_path, node_id.to_string().as_bytes())?;
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
