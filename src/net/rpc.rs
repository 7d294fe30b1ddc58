//! Typed request/response over QUIC: one bidirectional stream per request.
//!
//! The client opens a stream, writes one request frame, finishes its side and
//! reads one response frame. The server accepts streams for as long as the
//! connection lives and handles each one in its own task, so a slow request
//! does not hold up the others. A stream that carries a truncated, oversized or
//! undecodable frame is reset (and logged once); the connection and every
//! other stream carry on, since one bad request must not cost a peer its link.
//!
//! Long-lived streams (agent sync, log following, snapshots) need nothing
//! special: open one with `conn.open_bi()` and use [`read_frame`] /
//! [`write_frame`] on quinn's `RecvStream` / `SendStream` directly, as many
//! frames as needed.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;

use quinn::{ReadError, VarInt};
use serde::de::DeserializeOwned;
use serde::Serialize;

use super::endpoint::Peer;
use super::frame::{read_frame, write_frame, FrameError};

/// Stream error code: the request frame was malformed.
pub const STREAM_BAD_REQUEST: u32 = 1;

/// Why a request got no response.
#[derive(Debug, thiserror::Error)]
pub enum RpcError {
    /// The connection could not carry a new stream.
    #[error("could not send a request to {remote}: {source}")]
    Connection {
        /// The peer's address.
        remote: SocketAddr,
        /// The connection's failure.
        #[source]
        source: quinn::ConnectionError,
    },
    /// A frame could not be written or read.
    #[error("request to {remote} failed: {source}")]
    Frame {
        /// The peer's address.
        remote: SocketAddr,
        /// The frame error.
        #[source]
        source: FrameError,
    },
    /// The peer reset the stream: it could not make sense of the request.
    #[error(
        "{remote} rejected the request (stream reset, code {code}); \
         the peer may run an incompatible gpuq version"
    )]
    Rejected {
        /// The peer's address.
        remote: SocketAddr,
        /// The stream error code.
        code: u64,
    },
    /// The peer ended the stream without a response.
    #[error("{remote} closed the request without answering; it may be shutting down")]
    NoResponse {
        /// The peer's address.
        remote: SocketAddr,
    },
}

impl RpcError {
    fn frame(remote: SocketAddr, source: FrameError) -> RpcError {
        if let FrameError::Io(io) = &source {
            if let Some(ReadError::Reset(code)) = io.get_ref().and_then(|e| e.downcast_ref()) {
                return RpcError::Rejected {
                    remote,
                    code: code.into_inner(),
                };
            }
        }
        RpcError::Frame { remote, source }
    }
}

/// Sends `req` on a new stream of `conn` and waits for the response
/// (at most `max_len` bytes).
pub async fn call<Req, Resp>(
    conn: &quinn::Connection,
    req: &Req,
    max_len: usize,
) -> Result<Resp, RpcError>
where
    Req: Serialize + ?Sized,
    Resp: DeserializeOwned,
{
    let remote = conn.remote_address();
    let (mut send, mut recv) = conn
        .open_bi()
        .await
        .map_err(|source| RpcError::Connection { remote, source })?;
    write_frame(&mut send, req)
        .await
        .map_err(|e| RpcError::frame(remote, e))?;
    // Finishing only fails if the stream is already gone; the read reports why.
    let _ = send.finish();
    match read_frame(&mut recv, max_len).await {
        Ok(Some(resp)) => Ok(resp),
        Ok(None) => Err(RpcError::NoResponse { remote }),
        Err(e) => Err(RpcError::frame(remote, e)),
    }
}

/// [`call`], keeping the stream: the response, and the stream's halves for
/// what follows it (an interactive stream, see `stdio`).
pub async fn call_keeping<Req, Resp>(
    conn: &quinn::Connection,
    req: &Req,
    max_len: usize,
) -> Result<(Resp, quinn::SendStream, quinn::RecvStream), RpcError>
where
    Req: Serialize + ?Sized,
    Resp: DeserializeOwned,
{
    let remote = conn.remote_address();
    let (mut send, mut recv) = conn
        .open_bi()
        .await
        .map_err(|source| RpcError::Connection { remote, source })?;
    write_frame(&mut send, req)
        .await
        .map_err(|e| RpcError::frame(remote, e))?;
    match read_frame(&mut recv, max_len).await {
        Ok(Some(resp)) => Ok((resp, send, recv)),
        Ok(None) => Err(RpcError::NoResponse { remote }),
        Err(e) => Err(RpcError::frame(remote, e)),
    }
}

/// What a handler answers: a response, and for a request that opens an
/// interactive stream, the next hop, which the stream is spliced to once
/// the response is written.
pub enum Reply<R> {
    Answer(R),
    Relay(R, super::stdio::Upstream),
}

impl<R> From<R> for Reply<R> {
    fn from(r: R) -> Reply<R> {
        Reply::Answer(r)
    }
}

/// Serves requests on `peer`'s connection until it closes, and returns why it closed.
///
/// Each stream carries one request of at most `max_len` bytes; `handler`
/// computes the response. Malformed requests reset their stream only.
pub async fn serve<Req, Resp, H, Fut, Out>(
    peer: Peer,
    handler: H,
    max_len: usize,
) -> quinn::ConnectionError
where
    Req: DeserializeOwned + Send + 'static,
    Resp: Serialize + Send + Sync + 'static,
    H: Fn(Arc<Peer>, Req) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Out> + Send + 'static,
    Out: Into<Reply<Resp>>,
{
    let peer = Arc::new(peer);
    let handler = Arc::new(handler);
    loop {
        let (send, recv) = match peer.conn.accept_bi().await {
            Ok(streams) => streams,
            Err(err) => return err,
        };
        let peer = peer.clone();
        let handler = handler.clone();
        tokio::spawn(async move {
            handle_stream(peer, handler.as_ref(), send, recv, max_len).await;
        });
    }
}

async fn handle_stream<Req, Resp, H, Fut, Out>(
    peer: Arc<Peer>,
    handler: &H,
    mut send: quinn::SendStream,
    mut recv: quinn::RecvStream,
    max_len: usize,
) where
    Req: DeserializeOwned,
    Resp: Serialize,
    H: Fn(Arc<Peer>, Req) -> Fut,
    Fut: Future<Output = Out>,
    Out: Into<Reply<Resp>>,
{
    let req: Req = match read_frame(&mut recv, max_len).await {
        Ok(Some(req)) => req,
        Ok(None) => {
            let _ = send.finish();
            return;
        }
        Err(err) => {
            tracing::warn!(peer = %peer.describe(), "dropped a malformed request: {err}");
            let _ = recv.stop(VarInt::from_u32(STREAM_BAD_REQUEST));
            let _ = send.reset(VarInt::from_u32(STREAM_BAD_REQUEST));
            return;
        }
    };
    let (resp, upstream) = match handler(peer.clone(), req).await.into() {
        Reply::Answer(resp) => (resp, None),
        Reply::Relay(resp, upstream) => (resp, Some(upstream)),
    };
    if let Err(err) = write_frame(&mut send, &resp).await {
        tracing::debug!(peer = %peer.describe(), "could not send a response: {err}");
        return;
    }
    match upstream {
        None => {
            let _ = send.finish();
        }
        Some(mut upstream) => {
            let mut here = tokio::io::join(recv, send);
            if let Err(err) = super::stdio::splice(&mut here, &mut upstream).await {
                tracing::debug!(peer = %peer.describe(), "interactive stream ended: {err}");
            }
        }
    }
}
