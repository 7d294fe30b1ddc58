//! The daemon's local API: a unix socket that the CLI talks to. The daemon
//! learns who is calling from the kernel (SO_PEERCRED), never from the client,
//! and vouches for that user to the leader. One connection carries any number
//! of request/response frame pairs, after a version hello.

use std::future::Future;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use tokio::net::{UnixListener, UnixStream};
use tokio::sync::watch;

use super::frame::{read_frame, write_frame, FrameError, DEFAULT_MAX_FRAME};
use super::hello::PROTOCOL_VERSION;
use super::proto::{ApiRequest, ApiResponse, ErrorKind};

/// The first frame on a local connection, each way.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct LocalHello {
    pub protocol: u32,
    pub build: String,
}

impl LocalHello {
    fn ours() -> LocalHello {
        LocalHello {
            protocol: PROTOCOL_VERSION,
            build: env!("CARGO_PKG_VERSION").to_string(),
        }
    }
}

/// Why the CLI could not talk to its daemon.
#[derive(Debug, thiserror::Error)]
pub enum LocalError {
    #[error("cannot connect to the gpuq daemon at {path}: {source}. Is `gpuq dev`, `gpuq server` or `gpuq agent` running here? Set GPUQ_SOCKET to its socket path")]
    Connect {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("the daemon at {path} speaks protocol {theirs}, this gpuq speaks {ours}: use the gpuq binary that matches the daemon ({build})")]
    Version {
        path: PathBuf,
        ours: u32,
        theirs: u32,
        build: String,
    },
    #[error("the daemon closed the connection without answering")]
    Closed,
    #[error("talking to the daemon failed: {0}")]
    Frame(#[from] FrameError),
}

/// A CLI's connection to its local daemon.
pub struct LocalClient {
    stream: UnixStream,
}

impl LocalClient {
    /// Connects to the daemon's socket and checks the protocol version.
    pub async fn connect(path: &Path) -> Result<LocalClient, LocalError> {
        let mut stream = UnixStream::connect(path)
            .await
            .map_err(|source| LocalError::Connect {
                path: path.to_path_buf(),
                source,
            })?;
        write_frame(&mut stream, &LocalHello::ours()).await?;
        let theirs: LocalHello = read_frame(&mut stream, DEFAULT_MAX_FRAME)
            .await?
            .ok_or(LocalError::Closed)?;
        if theirs.protocol != PROTOCOL_VERSION {
            return Err(LocalError::Version {
                path: path.to_path_buf(),
                ours: PROTOCOL_VERSION,
                theirs: theirs.protocol,
                build: theirs.build,
            });
        }
        Ok(LocalClient { stream })
    }

    /// Sends one request and waits for its answer.
    pub async fn call(&mut self, req: &ApiRequest) -> Result<ApiResponse, LocalError> {
        write_frame(&mut self.stream, req).await?;
        read_frame(&mut self.stream, DEFAULT_MAX_FRAME)
            .await?
            .ok_or(LocalError::Closed)
    }
}

/// The kernel-attested identity of a local caller.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PeerCred {
    pub uid: u32,
    pub gid: u32,
}

/// Binds the socket: creates its directory, replaces a stale socket file, and
/// lets every local user connect (authorisation is by the caller's uid).
pub fn bind(path: &Path) -> std::io::Result<UnixListener> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    if path.exists() {
        if std::os::unix::net::UnixStream::connect(path).is_ok() {
            return Err(std::io::Error::new(
                std::io::ErrorKind::AddrInUse,
                format!(
                    "{} is in use by a running daemon; stop it or choose another --socket",
                    path.display()
                ),
            ));
        }
        std::fs::remove_file(path)?;
    }
    let listener = UnixListener::bind(path)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o666))?;
    Ok(listener)
}

/// Serves the local API until `shutdown` turns true. `handler` answers each
/// request for the kernel-attested caller.
pub async fn serve<H, F>(
    listener: UnixListener,
    handler: Arc<H>,
    mut shutdown: watch::Receiver<bool>,
) where
    H: Fn(PeerCred, ApiRequest) -> F + Send + Sync + 'static,
    F: Future<Output = ApiResponse> + Send + 'static,
{
    loop {
        let accepted = tokio::select! {
            a = listener.accept() => a,
            _ = shutdown.changed() => return,
        };
        let (stream, _) = match accepted {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(error = %e, "local socket accept failed");
                continue;
            }
        };
        let handler = handler.clone();
        tokio::spawn(async move {
            if let Err(e) = serve_one(stream, handler).await {
                tracing::debug!(error = %e, "local client connection ended");
            }
        });
    }
}

async fn serve_one<H, F>(mut stream: UnixStream, handler: Arc<H>) -> Result<(), LocalError>
where
    H: Fn(PeerCred, ApiRequest) -> F + Send + Sync + 'static,
    F: Future<Output = ApiResponse> + Send + 'static,
{
    let cred = stream.peer_cred().map_err(FrameError::Io)?;
    let cred = PeerCred {
        uid: cred.uid(),
        gid: cred.gid(),
    };
    let Some(hello) = read_frame::<_, LocalHello>(&mut stream, DEFAULT_MAX_FRAME).await? else {
        return Ok(());
    };
    write_frame(&mut stream, &LocalHello::ours()).await?;
    if hello.protocol != PROTOCOL_VERSION {
        return Ok(());
    }
    loop {
        let req = match read_frame::<_, ApiRequest>(&mut stream, DEFAULT_MAX_FRAME).await {
            Ok(Some(r)) => r,
            Ok(None) => return Ok(()),
            Err(e) => {
                // Tell the client why, then drop the connection.
                let _ = write_frame(
                    &mut stream,
                    &ApiResponse::error(ErrorKind::BadInput, format!("bad request: {e}")),
                )
                .await;
                return Err(e.into());
            }
        };
        let resp = handler(cred, req).await;
        write_frame(&mut stream, &resp).await?;
    }
}

/// Turns a kernel-attested uid into the caller a daemon vouches for: the user
/// name from this host's user database, and admin when root or a member of
/// `admin_group`.
pub fn resolve_caller(
    cred: PeerCred,
    admin_group: Option<&str>,
) -> Result<super::proto::Caller, String> {
    use nix::unistd::{Gid, Group, Uid, User};
    let user = User::from_uid(Uid::from_raw(cred.uid))
        .map_err(|e| format!("cannot look up uid {}: {e}", cred.uid))?
        .ok_or_else(|| format!("uid {} has no user name on this host", cred.uid))?;
    let mut admin = cred.uid == 0;
    if let (false, Some(group)) = (admin, admin_group) {
        if let Ok(Some(g)) = Group::from_name(group) {
            admin =
                g.mem.contains(&user.name) || g.gid == user.gid || g.gid == Gid::from_raw(cred.gid);
        }
    }
    Ok(super::proto::Caller {
        user: user.name,
        uid: cred.uid,
        admin,
    })
}
