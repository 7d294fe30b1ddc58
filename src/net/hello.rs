//! The opening exchange of every connection: protocol versions.
//!
//! When a connection opens, the client sends a [`Hello`] on the first
//! bidirectional stream and the server answers with a [`HelloReply`]. A mismatch
//! fails on both sides with both versions named (the client gets an error, the
//! server logs a warning and closes), rather than as a puzzling decode error on
//! some later request. The frames use named fields, so a later version may add
//! fields to `Hello` without breaking this check.

use std::net::SocketAddr;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::error::{close, code, connection_failed, EndpointError};
use super::frame::{read_frame, write_frame, FrameError};

/// The wire protocol version this build speaks, exchanged in [`Hello`].
pub const PROTOCOL_VERSION: u32 = 1;
/// This build's version, sent in [`Hello`] so mismatch errors can name it.
pub const BUILD: &str = env!("CARGO_PKG_VERSION");

/// Cap on a Hello frame.
const HELLO_MAX_FRAME: usize = 64 << 10;
/// How long the server waits for a new connection's Hello.
pub(super) const HELLO_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a refusing server lets the client read the refusal before closing.
const LINGER: Duration = Duration::from_secs(2);

/// The first message on a connection, client to server.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Hello {
    /// The client's [`PROTOCOL_VERSION`].
    pub protocol: u32,
    /// The client's build version.
    pub build: String,
}

/// The server's answer to a [`Hello`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum HelloReply {
    /// Same protocol: go ahead.
    HelloAck {
        /// The server's protocol version (equal to the client's).
        protocol: u32,
        /// The server's build version.
        build: String,
    },
    /// Different protocol: the server closes the connection.
    Mismatch {
        /// The server's protocol version.
        protocol: u32,
        /// The server's build version.
        build: String,
    },
}

/// The client's half: send our Hello, expect an ack for the same version.
pub(super) async fn client_hello(
    conn: &quinn::Connection,
    addr: SocketAddr,
    protocol: u32,
) -> Result<(), EndpointError> {
    let lost = |reason: String| match conn.close_reason() {
        Some(err) => connection_failed(addr, err),
        None => EndpointError::BadHello { addr, reason },
    };
    let (mut send, mut recv) = conn
        .open_bi()
        .await
        .map_err(|e| connection_failed(addr, e))?;
    let hello = Hello {
        protocol,
        build: BUILD.to_string(),
    };
    write_frame(&mut send, &hello)
        .await
        .map_err(|e| lost(e.to_string()))?;
    let _ = send.finish();
    let reply: Option<HelloReply> = read_frame(&mut recv, HELLO_MAX_FRAME)
        .await
        .map_err(|e| lost(e.to_string()))?;
    match reply {
        Some(HelloReply::HelloAck {
            protocol: theirs, ..
        }) if theirs == protocol => Ok(()),
        Some(HelloReply::HelloAck {
            protocol: theirs,
            build,
        })
        | Some(HelloReply::Mismatch {
            protocol: theirs,
            build,
        }) => {
            let err = EndpointError::ProtocolMismatch {
                addr,
                ours: protocol,
                ours_build: BUILD.to_string(),
                theirs,
                theirs_build: build,
            };
            conn.close(code(close::PROTOCOL_MISMATCH), err.to_string().as_bytes());
            Err(err)
        }
        None => Err(lost(
            "the server ended the opening handshake without answering".to_string(),
        )),
    }
}

/// The server's half: read the client's Hello and ack it, or refuse and close.
pub(super) async fn server_hello(
    conn: &quinn::Connection,
    remote: SocketAddr,
) -> Result<(), EndpointError> {
    let bad = |reason: String| {
        conn.close(code(close::BAD_HELLO), reason.as_bytes());
        EndpointError::BadHello {
            addr: remote,
            reason,
        }
    };
    let (mut send, mut recv) = conn
        .accept_bi()
        .await
        .map_err(|e| connection_failed(remote, e))?;
    let hello: Hello = match read_frame(&mut recv, HELLO_MAX_FRAME).await {
        Ok(Some(hello)) => hello,
        Ok(None) => {
            return Err(bad(
                "the connection opened without a protocol greeting".into()
            ))
        }
        Err(FrameError::Io(e)) => return Err(bad(format!("the greeting broke off: {e}"))),
        Err(e) => return Err(bad(format!("the greeting is not a gpuq Hello: {e}"))),
    };
    if hello.protocol == PROTOCOL_VERSION {
        let ack = HelloReply::HelloAck {
            protocol: PROTOCOL_VERSION,
            build: BUILD.to_string(),
        };
        write_frame(&mut send, &ack)
            .await
            .map_err(|e| bad(e.to_string()))?;
        let _ = send.finish();
        return Ok(());
    }
    let err = EndpointError::ProtocolMismatch {
        addr: remote,
        ours: PROTOCOL_VERSION,
        ours_build: BUILD.to_string(),
        theirs: hello.protocol,
        theirs_build: hello.build,
    };
    let reply = HelloReply::Mismatch {
        protocol: PROTOCOL_VERSION,
        build: BUILD.to_string(),
    };
    if write_frame(&mut send, &reply).await.is_ok() && send.finish().is_ok() {
        // Let the client read the reply and close first; then close regardless.
        let _ = tokio::time::timeout(LINGER, conn.closed()).await;
    }
    conn.close(code(close::PROTOCOL_MISMATCH), err.to_string().as_bytes());
    Err(err)
}
