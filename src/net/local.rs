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
    path: PathBuf,
    /// Whether the daemon's hello has been read and its protocol checked.
    checked: bool,
}

impl LocalClient {
    /// Connects to the daemon's socket and sends this side's hello. The
    /// daemon's hello is read, and its protocol version checked, before the
    /// answer to the first request: the hello costs no round trip of its own.
    pub async fn connect(path: &Path) -> Result<LocalClient, LocalError> {
        let mut stream = UnixStream::connect(path)
            .await
            .map_err(|source| LocalError::Connect {
                path: path.to_path_buf(),
                source,
            })?;
        write_frame(&mut stream, &LocalHello::ours()).await?;
        Ok(LocalClient {
            stream,
            path: path.to_path_buf(),
            checked: false,
        })
    }

    /// Sends one request and waits for its answer.
    pub async fn call(&mut self, req: &ApiRequest) -> Result<ApiResponse, LocalError> {
        let sent = write_frame(&mut self.stream, req).await;
        if !self.checked {
            // A daemon of another protocol answers its hello and hangs up
            // without reading the request, which may then fail to send: its
            // hello says why.
            let theirs: LocalHello = read_frame(&mut self.stream, DEFAULT_MAX_FRAME)
                .await?
                .ok_or(LocalError::Closed)?;
            if theirs.protocol != PROTOCOL_VERSION {
                return Err(LocalError::Version {
                    path: self.path.clone(),
                    ours: PROTOCOL_VERSION,
                    theirs: theirs.protocol,
                    build: theirs.build,
                });
            }
            self.checked = true;
        }
        sent?;
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::net::proto::ErrorKind;

    /// A daemon at `path` answering every request with an error naming the
    /// caller's uid.
    fn daemon(path: &Path) -> watch::Sender<bool> {
        let listener = bind(path).expect("bind");
        let (tx, rx) = watch::channel(false);
        let handler = Arc::new(|cred: PeerCred, _req: ApiRequest| async move {
            ApiResponse::error(ErrorKind::NotFound, format!("uid {}", cred.uid))
        });
        tokio::spawn(serve(listener, handler, rx));
        tx
    }

    #[tokio::test]
    async fn the_hello_rides_with_the_first_request_and_later_ones_follow() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("d.sock");
        let _stop = daemon(&path);
        let mut c = LocalClient::connect(&path).await.expect("connect");
        let uid = nix::unistd::getuid().as_raw();
        for _ in 0..3 {
            match c.call(&ApiRequest::Cluster).await.expect("call") {
                ApiResponse::Error { message, .. } => assert_eq!(message, format!("uid {uid}")),
                other => panic!("unexpected {other:?}"),
            }
        }
    }

    #[tokio::test]
    async fn a_daemon_of_another_protocol_is_named_on_the_first_call() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("old.sock");
        let listener = UnixListener::bind(&path).expect("bind");
        let (gone, hung_up) = tokio::sync::oneshot::channel();
        tokio::spawn(async move {
            let (mut s, _) = listener.accept().await.expect("accept");
            let _: Option<LocalHello> = read_frame(&mut s, DEFAULT_MAX_FRAME).await.expect("hello");
            let old = LocalHello {
                protocol: PROTOCOL_VERSION + 1,
                build: "9.9.9".into(),
            };
            write_frame(&mut s, &old).await.expect("write");
            // Hangs up without reading the request, as `serve_one` does.
            drop(s);
            let _ = gone.send(());
        });
        let mut c = LocalClient::connect(&path).await.expect("connect");
        // The daemon has hung up before the request is sent.
        hung_up.await.expect("daemon");
        match c.call(&ApiRequest::Cluster).await {
            Err(LocalError::Version { theirs, build, .. }) => {
                assert_eq!((theirs, build.as_str()), (PROTOCOL_VERSION + 1, "9.9.9"));
            }
            other => panic!("expected a version error, got {:?}", other.map(|_| ())),
        }
    }
}
