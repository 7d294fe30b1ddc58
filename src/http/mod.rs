//! The HTTP port every daemon opens (`http_listen`): Prometheus metrics at
//! `/metrics`, `/healthz`, and on servers the JSON API under `/api/v1/` and
//! the web page at `/`.
//!
//! This room is the protocol, not the answers: a daemon hands it a [`Site`]
//! that writes its metrics page and, on servers, checks bearer tokens and
//! answers [`ApiRequest`]s through the same `Api::handle` the CLI's socket
//! reaches, so every rule (ownership, private jobs, admin) is the one the
//! CLI meets. Servers and agents import this room; it imports neither.
//!
//! Who may ask: a request from the host's own loopback may read without a
//! token, as the anonymous, non-admin `anonymous` user; any other request
//! needs `Authorization: Bearer <token>`, and every write needs one, from
//! anywhere. A listener beyond loopback is served over TLS only (the
//! caller passes the daemon's certificate), since tokens must not cross a
//! network in the clear.
//!
//! hyper speaks HTTP/1.1 (keep-alive, chunked bodies, limits on header
//! reading time); a semaphore bounds the connections served at once.

pub mod api;
pub mod exposition;
mod web;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::sync::watch;

use crate::net::proto::{ApiRequest, ApiResponse, Caller};

pub use api::{AuthError, Grant};

/// The most bytes a request body may carry (a bulk submit fits).
const MAX_BODY: usize = 8 << 20;
/// Connections served at once; more wait to be accepted.
const MAX_CONNECTIONS: usize = 256;
/// How long a client may take to send a request's headers.
const HEADER_TIMEOUT: Duration = Duration::from_secs(10);

/// What a daemon serves on its HTTP port.
#[async_trait::async_trait]
pub trait Site: Send + Sync + 'static {
    /// The Prometheus text page, written now.
    fn metrics(&self) -> String;

    /// `Ok(what)` when the daemon is fit to serve, else `Err(why)`.
    fn health(&self) -> Result<String, String> {
        Ok("ok".into())
    }

    /// Who a bearer token speaks for; `None` where this daemon answers no
    /// API (agents).
    fn authenticate(&self, _token: &str) -> Option<Result<Grant, AuthError>> {
        None
    }

    /// Answers one API request for `caller` (servers).
    async fn call(&self, _caller: Caller, _req: ApiRequest) -> ApiResponse {
        ApiResponse::error(
            crate::net::proto::ErrorKind::NotFound,
            "this daemon answers no API: ask a server",
        )
    }
}

/// Why the HTTP port could not be opened. Each names the config key.
#[derive(Debug, thiserror::Error)]
pub enum HttpError {
    #[error(
        "{key} = {addr}: the port is in use by another process; stop it, or give \
         {key} another port (e.g. {alt})"
    )]
    InUse {
        key: String,
        addr: SocketAddr,
        alt: SocketAddr,
    },
    #[error("{key} = {addr}: cannot listen there: {source}")]
    Bind {
        key: String,
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error(
        "{key} = {addr} is beyond loopback and this daemon has no TLS certificate to \
         serve it with; bearer tokens must not cross the network in the clear: \
         listen on 127.0.0.1, or on a server, which serves TLS with its certificate"
    )]
    NeedsTls { key: String, addr: SocketAddr },
}

/// A bound HTTP port, not yet serving.
pub struct Listener {
    listener: tokio::net::TcpListener,
    tls: Option<tokio_rustls::TlsAcceptor>,
    addr: SocketAddr,
}

impl Listener {
    /// Binds `addr` (`key` names its config key in errors). Beyond loopback,
    /// `tls` must be given and every connection is TLS.
    pub fn bind(
        addr: SocketAddr,
        key: &str,
        tls: Option<Arc<rustls::ServerConfig>>,
    ) -> Result<Listener, HttpError> {
        if !addr.ip().is_loopback() && tls.is_none() {
            return Err(HttpError::NeedsTls {
                key: key.into(),
                addr,
            });
        }
        let std_listener = std::net::TcpListener::bind(addr).map_err(|source| {
            if source.kind() == std::io::ErrorKind::AddrInUse {
                HttpError::InUse {
                    key: key.into(),
                    addr,
                    alt: SocketAddr::new(addr.ip(), addr.port().wrapping_add(10).max(1)),
                }
            } else {
                HttpError::Bind {
                    key: key.into(),
                    addr,
                    source,
                }
            }
        })?;
        let bind_err = |source| HttpError::Bind {
            key: key.into(),
            addr,
            source,
        };
        std_listener.set_nonblocking(true).map_err(bind_err)?;
        let listener = tokio::net::TcpListener::from_std(std_listener).map_err(bind_err)?;
        let addr = listener.local_addr().map_err(bind_err)?;
        let tls = (!addr.ip().is_loopback())
            .then_some(tls)
            .flatten()
            .map(tokio_rustls::TlsAcceptor::from);
        Ok(Listener {
            listener,
            tls,
            addr,
        })
    }

    /// The address bound (the port chosen, for port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// The base URL clients use.
    pub fn url(&self) -> String {
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        format!("{scheme}://{}", self.addr)
    }

    /// Serves `site` until `shutdown` turns true.
    pub fn serve(self, site: Arc<dyn Site>, mut shutdown: watch::Receiver<bool>) {
        let permits = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
        tokio::spawn(async move {
            loop {
                let Ok(permit) = permits.clone().acquire_owned().await else {
                    return;
                };
                let (stream, peer) = tokio::select! {
                    r = self.listener.accept() => match r {
                        Ok(c) => c,
                        Err(e) => {
                            tracing::debug!(error = %e, "http accept failed");
                            tokio::time::sleep(Duration::from_millis(50)).await;
                            continue;
                        }
                    },
                    _ = shutdown.changed() => return,
                };
                let site = site.clone();
                let tls = self.tls.clone();
                let shutdown = shutdown.clone();
                tokio::spawn(async move {
                    let _permit = permit;
                    match tls {
                        None => serve_connection(stream, peer, site, shutdown).await,
                        Some(acceptor) => {
                            let accept = acceptor.accept(stream);
                            match tokio::time::timeout(HEADER_TIMEOUT, accept).await {
                                Ok(Ok(s)) => serve_connection(s, peer, site, shutdown).await,
                                Ok(Err(e)) => {
                                    tracing::debug!(%peer, error = %e, "http TLS handshake failed")
                                }
                                Err(_) => tracing::debug!(%peer, "http TLS handshake timed out"),
                            }
                        }
                    }
                });
            }
        });
    }
}

async fn serve_connection<S>(
    stream: S,
    peer: SocketAddr,
    site: Arc<dyn Site>,
    mut shutdown: watch::Receiver<bool>,
) where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let service = hyper::service::service_fn(move |req| {
        let site = site.clone();
        async move { Ok::<_, Infallible>(route(site.as_ref(), peer, req).await) }
    });
    let conn = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(HEADER_TIMEOUT)
        .serve_connection(TokioIo::new(stream), service);
    tokio::pin!(conn);
    tokio::select! {
        r = conn.as_mut() => if let Err(e) = r {
            tracing::debug!(%peer, error = %e, "http connection ended");
        },
        _ = shutdown.changed() => {
            conn.as_mut().graceful_shutdown();
            let _ = tokio::time::timeout(Duration::from_secs(2), conn).await;
        }
    }
}

/// A response with a body.
pub(crate) fn respond(
    status: StatusCode,
    content_type: &str,
    body: impl Into<Bytes>,
) -> Response<Full<Bytes>> {
    let mut resp = Response::new(Full::new(body.into()));
    *resp.status_mut() = status;
    if let Ok(v) = content_type.parse() {
        resp.headers_mut().insert(hyper::header::CONTENT_TYPE, v);
    }
    resp.headers_mut().insert(
        hyper::header::CACHE_CONTROL,
        hyper::header::HeaderValue::from_static("no-store"),
    );
    resp.headers_mut().insert(
        "x-content-type-options",
        hyper::header::HeaderValue::from_static("nosniff"),
    );
    resp
}

/// A JSON error body `{"error": ..., "kind": ...}`.
pub(crate) fn json_error(status: StatusCode, kind: &str, message: &str) -> Response<Full<Bytes>> {
    let body = serde_json::json!({ "error": message, "kind": kind });
    respond(status, "application/json", body.to_string())
}

/// Who is asking: from the bearer token, or the anonymous reader on
/// loopback; `Err` is the refusal to send.
pub(crate) fn identify(
    site: &dyn Site,
    peer: SocketAddr,
    req: &Request<Incoming>,
) -> Result<Option<Grant>, Box<Response<Full<Bytes>>>> {
    let header = req.headers().get(hyper::header::AUTHORIZATION);
    let Some(header) = header else {
        if peer.ip().is_loopback() {
            return Ok(None);
        }
        tracing::warn!(%peer, path = %req.uri().path(), "http request refused: no token");
        return Err(Box::new(unauthorized(
            "a token is required from beyond this host: send Authorization: Bearer <token> \
             (make one with `gpuq token create --role user`)",
        )));
    };
    let token = header
        .to_str()
        .ok()
        .and_then(|h| h.strip_prefix("Bearer ").map(str::trim))
        .unwrap_or("");
    match site.authenticate(token) {
        // A daemon without tokens (an agent) serves loopback only.
        None if peer.ip().is_loopback() => Ok(None),
        None => Err(Box::new(unauthorized(
            "this daemon takes no tokens: ask from its host",
        ))),
        Some(Ok(grant)) => Ok(Some(grant)),
        Some(Err(why)) => {
            tracing::warn!(%peer, path = %req.uri().path(), "http request refused: {why}");
            Err(Box::new(unauthorized(&why.to_string())))
        }
    }
}

fn unauthorized(message: &str) -> Response<Full<Bytes>> {
    let mut resp = json_error(StatusCode::UNAUTHORIZED, "Unauthorized", message);
    resp.headers_mut().insert(
        hyper::header::WWW_AUTHENTICATE,
        hyper::header::HeaderValue::from_static("Bearer realm=\"gpuq\""),
    );
    resp
}

/// Reads a request's body, at most [`MAX_BODY`] bytes.
pub(crate) async fn body_bytes(
    req: Request<Incoming>,
) -> Result<Bytes, Box<Response<Full<Bytes>>>> {
    match Limited::new(req.into_body(), MAX_BODY).collect().await {
        Ok(b) => Ok(b.to_bytes()),
        Err(e) => Err(Box::new(json_error(
            StatusCode::PAYLOAD_TOO_LARGE,
            "BadInput",
            &format!("the request body could not be read (at most {MAX_BODY} bytes): {e}"),
        ))),
    }
}

async fn route(site: &dyn Site, peer: SocketAddr, req: Request<Incoming>) -> Response<Full<Bytes>> {
    let path = req.uri().path().to_string();
    if path.starts_with("/api/") {
        return api::route(site, peer, req).await;
    }
    if req.method() != Method::GET && req.method() != Method::HEAD {
        return json_error(
            StatusCode::METHOD_NOT_ALLOWED,
            "BadInput",
            &format!("{} takes GET only", path),
        );
    }
    match path.as_str() {
        "/metrics" | "/healthz" => {
            if let Err(refusal) = identify(site, peer, &req) {
                return *refusal;
            }
            if path == "/metrics" {
                respond(StatusCode::OK, exposition::CONTENT_TYPE, site.metrics())
            } else {
                match site.health() {
                    Ok(what) => respond(StatusCode::OK, "text/plain", format!("{what}\n")),
                    Err(why) => respond(
                        StatusCode::SERVICE_UNAVAILABLE,
                        "text/plain",
                        format!("{why}\n"),
                    ),
                }
            }
        }
        _ => web::asset(site, &path),
    }
}
