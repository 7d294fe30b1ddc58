//! The daemon's local API: a unix socket that the CLI talks to. The daemon
//! learns who is calling from the kernel (SO_PEERCRED), never from the client,
//! and vouches for that user to the leader. One connection carries any number
//! of request/response frame pairs, after a version hello.
//!
//! The socket is open to every local user (authorisation is by uid), so what
//! one user can make the daemon hold is bounded ([`Limits`]): connections per
//! uid, the bytes of requests still arriving per uid and in all, the size of
//! one request, and how long a request may take to arrive once begun or a
//! connection may sit idle. A caller over a bound is told which, and why.

use std::future::Future;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use tokio::net::{UnixListener, UnixStream};
use tokio::sync::watch;

use super::frame::{read_frame, read_frame_charged, write_frame, FrameError, DEFAULT_MAX_FRAME};
use super::hello::PROTOCOL_VERSION;
use super::proto::{ApiRequest, ApiResponse, ErrorKind};
use super::rpc::Reply;

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
    #[error("the request was refused: {0}")]
    Refused(String),
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

impl LocalClient {
    /// Sends a request that opens an interactive stream (`Exec`,
    /// `Attach`): the answer, and on `Attached` the connection, which
    /// carries `StdioMsg` frames from then on.
    pub async fn open_stream(
        mut self,
        req: &ApiRequest,
    ) -> Result<(ApiResponse, UnixStream), LocalError> {
        let resp = self.call(req).await?;
        Ok((resp, self.stream))
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

/// What one local user can make the daemon hold.
#[derive(Clone, Debug)]
pub struct Limits {
    /// The largest request: fits the largest script or `--from` batch a
    /// user should submit (Slurm's default cap on a batch script is 4 MB).
    pub max_request: usize,
    /// Open connections per uid.
    pub conns_per_uid: usize,
    /// Bytes of requests still arriving, per uid.
    pub inflight_per_uid: usize,
    /// Bytes of requests still arriving, all users together.
    pub inflight_total: usize,
    /// How long a request may take to arrive once its first byte has.
    pub stall: std::time::Duration,
    /// How long a connection may wait between requests.
    pub idle: std::time::Duration,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            max_request: DEFAULT_MAX_FRAME,
            conns_per_uid: 128,
            inflight_per_uid: DEFAULT_MAX_FRAME + (8 << 20),
            inflight_total: 256 << 20,
            stall: std::time::Duration::from_secs(30),
            idle: std::time::Duration::from_secs(600),
        }
    }
}

#[derive(Default)]
struct Usage {
    conns: usize,
    bytes: usize,
}

/// What each uid holds now, against the [`Limits`].
struct Budget {
    limits: Limits,
    held: std::sync::Mutex<(std::collections::HashMap<u32, Usage>, usize)>,
}

impl Budget {
    fn lock(&self) -> std::sync::MutexGuard<'_, (std::collections::HashMap<u32, Usage>, usize)> {
        self.held.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Counts a new connection of `uid`, or says why it is refused.
    fn connect(&self, uid: u32) -> Result<(), String> {
        let mut held = self.lock();
        let usage = held.0.entry(uid).or_default();
        if usage.conns >= self.limits.conns_per_uid {
            return Err(format!(
                "uid {uid} already has {} connections open to this daemon (the limit): \
                 close some and retry",
                usage.conns
            ));
        }
        usage.conns += 1;
        Ok(())
    }

    fn disconnect(&self, uid: u32) {
        let mut held = self.lock();
        if let Some(usage) = held.0.get_mut(&uid) {
            usage.conns = usage.conns.saturating_sub(1);
            if usage.conns == 0 && usage.bytes == 0 {
                held.0.remove(&uid);
            }
        }
    }

    /// Lets `uid` hold `n` more bytes of arriving requests.
    fn charge(&self, uid: u32, n: usize) -> Result<(), FrameError> {
        let mut held = self.lock();
        let (by_uid, total) = &mut *held;
        let usage = by_uid.entry(uid).or_default();
        if usage.bytes + n > self.limits.inflight_per_uid {
            return Err(FrameError::OverBudget(format!(
                "uid {uid} has {} MiB of requests arriving at once (the limit is {} MiB): \
                 send fewer large requests at a time",
                usage.bytes >> 20,
                self.limits.inflight_per_uid >> 20
            )));
        }
        if *total + n > self.limits.inflight_total {
            return Err(FrameError::OverBudget(
                "the daemon holds as many arriving requests as it takes: retry in a moment".into(),
            ));
        }
        usage.bytes += n;
        *total += n;
        Ok(())
    }

    fn release(&self, uid: u32, n: usize) {
        let mut held = self.lock();
        let (by_uid, total) = &mut *held;
        *total = total.saturating_sub(n);
        if let Some(usage) = by_uid.get_mut(&uid) {
            usage.bytes = usage.bytes.saturating_sub(n);
        }
    }
}

/// Serves the local API until `shutdown` turns true. `handler` answers each
/// request for the kernel-attested caller.
pub async fn serve<H, F, R>(
    listener: UnixListener,
    handler: Arc<H>,
    shutdown: watch::Receiver<bool>,
) where
    H: Fn(PeerCred, ApiRequest) -> F + Send + Sync + 'static,
    F: Future<Output = R> + Send + 'static,
    R: Into<Reply<ApiResponse>>,
{
    serve_with(listener, handler, shutdown, Limits::default()).await
}

/// [`serve`] within `limits`.
pub async fn serve_with<H, F, R>(
    listener: UnixListener,
    handler: Arc<H>,
    mut shutdown: watch::Receiver<bool>,
    limits: Limits,
) where
    H: Fn(PeerCred, ApiRequest) -> F + Send + Sync + 'static,
    F: Future<Output = R> + Send + 'static,
    R: Into<Reply<ApiResponse>>,
{
    let budget = Arc::new(Budget {
        limits,
        held: Default::default(),
    });
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
        let budget = budget.clone();
        tokio::spawn(async move {
            let mut stream = stream;
            let cred = match stream.peer_cred() {
                Ok(c) => PeerCred {
                    uid: c.uid(),
                    gid: c.gid(),
                },
                Err(e) => return tracing::debug!(error = %e, "no peer credentials"),
            };
            if let Err(why) = budget.connect(cred.uid) {
                tracing::warn!(uid = cred.uid, "local connection refused: {why}");
                let _ = write_frame(&mut stream, &LocalHello::ours()).await;
                let _ = write_frame(
                    &mut stream,
                    &ApiResponse::error(ErrorKind::Unavailable, why),
                )
                .await;
                return;
            }
            if let Err(e) = serve_one(&mut stream, cred, handler, &budget).await {
                tracing::debug!(error = %e, "local client connection ended");
            }
            budget.disconnect(cred.uid);
        });
    }
}

/// Why reading a request from a local client stopped.
enum Read<T> {
    Frame(T),
    Closed,
    Failed(String),
}

/// Reads one frame within the limits: at most `idle` until it begins, then
/// `stall` for the rest of it; its buffer charged to the caller's budget.
async fn read_limited<T: serde::de::DeserializeOwned>(
    stream: &mut UnixStream,
    uid: u32,
    budget: &Budget,
) -> Read<T> {
    let limits = &budget.limits;
    match tokio::time::timeout(limits.idle, stream.readable()).await {
        Err(_) => return Read::Closed,
        Ok(Err(e)) => return Read::Failed(e.to_string()),
        Ok(Ok(())) => {}
    }
    let mut charged = 0;
    let read = tokio::time::timeout(
        limits.stall,
        read_frame_charged::<_, T>(stream, limits.max_request, &mut |n| {
            budget.charge(uid, n)?;
            charged += n;
            Ok(())
        }),
    )
    .await;
    budget.release(uid, charged);
    match read {
        Err(_) => Read::Failed(format!(
            "the request did not arrive within {} s of its start",
            limits.stall.as_secs()
        )),
        Ok(Ok(Some(frame))) => Read::Frame(frame),
        Ok(Ok(None)) => Read::Closed,
        Ok(Err(FrameError::TooLarge { len, max })) => Read::Failed(format!(
            "a request of {} KiB is over this daemon's limit of {} KiB; a script or \
             --from file that large cannot be submitted: keep large data in files the job reads",
            len >> 10,
            max >> 10
        )),
        Ok(Err(FrameError::OverBudget(why))) => {
            tracing::warn!(uid, "local request refused: {why}");
            Read::Failed(why)
        }
        Ok(Err(e)) => Read::Failed(e.to_string()),
    }
}

async fn serve_one<H, F, R>(
    stream: &mut UnixStream,
    cred: PeerCred,
    handler: Arc<H>,
    budget: &Budget,
) -> Result<(), LocalError>
where
    H: Fn(PeerCred, ApiRequest) -> F + Send + Sync + 'static,
    F: Future<Output = R> + Send + 'static,
    R: Into<Reply<ApiResponse>>,
{
    let hello: LocalHello = match read_limited(stream, cred.uid, budget).await {
        Read::Frame(h) => h,
        Read::Closed => return Ok(()),
        Read::Failed(why) => {
            // The client reads a hello before any answer: give it one, then why.
            let _ = write_frame(stream, &LocalHello::ours()).await;
            let refused = ApiResponse::error(ErrorKind::Unavailable, why.clone());
            let _ = write_frame(stream, &refused).await;
            return Err(LocalError::Refused(why));
        }
    };
    write_frame(stream, &LocalHello::ours()).await?;
    if hello.protocol != PROTOCOL_VERSION {
        return Ok(());
    }
    loop {
        let req = match read_limited::<ApiRequest>(stream, cred.uid, budget).await {
            Read::Frame(r) => r,
            Read::Closed => return Ok(()),
            Read::Failed(why) => {
                // Tell the client why, then drop the connection.
                let _ = write_frame(
                    stream,
                    &ApiResponse::error(ErrorKind::BadInput, format!("bad request: {why}")),
                )
                .await;
                return Err(LocalError::Refused(why));
            }
        };
        match handler(cred, req).await.into() {
            Reply::Answer(resp) => write_frame(stream, &resp).await?,
            // An interactive stream: the connection is its from now on.
            Reply::Relay(resp, mut upstream) => {
                write_frame(stream, &resp).await?;
                if let Err(e) = super::stdio::splice(stream, &mut upstream).await {
                    tracing::debug!(error = %e, "interactive stream ended");
                }
                return Ok(());
            }
        }
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

    /// A daemon within `limits` answering every request with an error.
    fn limited_daemon(path: &Path, limits: Limits) -> watch::Sender<bool> {
        let listener = bind(path).expect("bind");
        let (tx, rx) = watch::channel(false);
        let handler = Arc::new(|_: PeerCred, _req: ApiRequest| async move {
            ApiResponse::error(ErrorKind::NotFound, "answered")
        });
        tokio::spawn(serve_with(listener, handler, rx, limits));
        tx
    }

    /// A raw connection that has said hello and read the daemon's.
    async fn raw(path: &Path) -> UnixStream {
        let mut s = UnixStream::connect(path).await.expect("connect");
        write_frame(&mut s, &LocalHello::ours())
            .await
            .expect("hello");
        let _: LocalHello = read_frame(&mut s, DEFAULT_MAX_FRAME)
            .await
            .expect("their hello")
            .expect("a hello");
        s
    }

    /// Starts a frame announcing `len` bytes and sends `sent` of them.
    async fn start_frame(s: &mut UnixStream, len: u32, sent: usize) {
        use tokio::io::AsyncWriteExt;
        s.write_all(&len.to_be_bytes()).await.expect("prefix");
        s.write_all(&vec![0x90; sent]).await.expect("body");
    }

    async fn refusal(s: &mut UnixStream) -> String {
        match read_frame::<_, ApiResponse>(s, DEFAULT_MAX_FRAME).await {
            Ok(Some(ApiResponse::Error { message, .. })) => message,
            other => panic!("expected a refusal, got {other:?}"),
        }
    }

    #[tokio::test]
    async fn a_request_that_stalls_midway_is_dropped_with_a_reason() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("d.sock");
        let limits = Limits {
            stall: std::time::Duration::from_millis(300),
            ..Limits::default()
        };
        let _stop = limited_daemon(&path, limits);
        let mut s = raw(&path).await;
        start_frame(&mut s, 1000, 10).await;
        let why = refusal(&mut s).await;
        assert!(why.contains("did not arrive within"), "{why}");
        // An idle connection between requests is fine meanwhile.
        let mut c = LocalClient::connect(&path).await.expect("connect");
        assert!(matches!(
            c.call(&ApiRequest::Cluster).await,
            Ok(ApiResponse::Error { .. })
        ));
    }

    #[tokio::test]
    async fn a_user_cannot_hold_more_than_their_budget_or_connections() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("d.sock");
        let limits = Limits {
            max_request: 4 << 20,
            conns_per_uid: 3,
            inflight_per_uid: (1 << 20) + 1024,
            ..Limits::default()
        };
        let _stop = limited_daemon(&path, limits);
        // A request of 3 MiB: its buffer grows to 1 MiB for the first MiB,
        // and is refused when it would grow past the uid's limit (after
        // exactly what was sent, so the answer is not lost to a reset).
        let mut a = raw(&path).await;
        start_frame(&mut a, 3 << 20, 1 << 20).await;
        let why = refusal(&mut a).await;
        assert!(why.contains("the limit is 1 MiB"), "{why}");
        // One over the request cap is refused by its announced size.
        let mut b = raw(&path).await;
        start_frame(&mut b, 5 << 20, 0).await;
        let why = refusal(&mut b).await;
        assert!(
            why.contains("over this daemon's limit of 4096 KiB"),
            "{why}"
        );
        // The refused ones were closed: three idle connections are what a
        // uid may have, and a fourth is refused, saying why.
        drop((a, b));
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        let _held = [raw(&path).await, raw(&path).await, raw(&path).await];
        let mut c = LocalClient::connect(&path).await.expect("connect");
        match c.call(&ApiRequest::Cluster).await {
            Ok(ApiResponse::Error { message, .. }) => {
                assert!(message.contains("connections open"), "{message}")
            }
            other => panic!("expected a refusal, got {:?}", other.map(|_| ())),
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
