//! Join tokens and the roles a daemon can join as.

use std::fmt;

use serde::{Deserialize, Serialize};

use super::Millis;

/// The role a certificate (and the daemon holding it) has in the cluster.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// A Raft member of the control plane.
    Server,
    /// A compute node agent: runs tasks.
    Agent,
    /// A login-node agent: runs no tasks, vouches for local users.
    Login,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Server => "server",
            Role::Agent => "agent",
            Role::Login => "login",
        }
    }

    pub fn parse(word: &str) -> Option<Role> {
        match word {
            "server" => Some(Role::Server),
            "agent" => Some(Role::Agent),
            "login" => Some(Role::Login),
            _ => None,
        }
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What the replicated state keeps of a join token: never the secret, only its
/// SHA-256 hash.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TokenRecord {
    /// Public token id (the part before the dot in the printed token).
    pub id: String,
    /// Hex SHA-256 of the secret.
    pub secret_sha256: String,
    /// The roles a holder of this token may join as. An agent token also admits
    /// login agents.
    pub role: Role,
    pub created_at: Millis,
    pub expires_at: Millis,
    pub created_by: String,
    #[serde(default)]
    pub revoked: bool,
    /// Number of daemons that joined with it.
    #[serde(default)]
    pub uses: u64,
    /// How many daemons may join with it (`--uses N`); `None`: any number
    /// until it expires.
    #[serde(default)]
    pub max_uses: Option<u64>,
}

/// What the replicated state keeps of an API token (`gpuq token create
/// --role user`): a bearer token for the HTTP API that acts as `user`,
/// never as an admin. Only the secret's SHA-256 is kept.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ApiTokenRecord {
    /// Public token id (the part after `gpuqapi1-`, before the dot).
    pub id: String,
    /// Hex SHA-256 of the secret.
    pub secret_sha256: String,
    /// Whose requests the token makes.
    pub user: String,
    /// Reads only: every write is refused.
    #[serde(default)]
    pub read_only: bool,
    pub created_at: Millis,
    pub expires_at: Millis,
    pub created_by: String,
    #[serde(default)]
    pub revoked: bool,
}

impl TokenRecord {
    /// Whether every use it allows has been taken.
    pub fn used_up(&self) -> bool {
        self.max_uses.is_some_and(|max| self.uses >= max)
    }
}
