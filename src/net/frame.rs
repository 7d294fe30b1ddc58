//! The one frame codec of gpuq, for QUIC streams and unix sockets alike.
//!
//! A frame is a big-endian `u32` length followed by that many bytes of
//! MessagePack with named fields (`rmp_serde::to_vec_named`). Named fields make
//! the encoding self-describing, so a field added later with `#[serde(default)]`
//! neither breaks an older reader nor a newer reader of older frames.
//!
//! The reader checks the announced length against a caller-given cap before it
//! allocates anything, and then grows the body's buffer only as bytes arrive
//! (doubling, never past the announced length): a peer cannot make us
//! reserve 16 MiB by sending four bytes. A caller that must bound what many
//! peers hold at once (the local socket) charges each growth to a budget.
//! A clean end of stream before a frame starts is not an error (`Ok(None)`); an
//! end of stream inside a frame is.

use std::io;

use serde::de::DeserializeOwned;
use serde::Serialize;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// The default cap on one frame's body: 16 MiB.
pub const DEFAULT_MAX_FRAME: usize = 16 << 20;

/// Why a frame could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum FrameError {
    /// The underlying stream failed.
    #[error("the connection failed while carrying a frame: {0}")]
    Io(#[from] io::Error),
    /// The stream ended inside a frame.
    #[error(
        "the peer closed the stream in the middle of a frame (got {got} of {expected} bytes); \
         it probably crashed or the connection was cut"
    )]
    Truncated {
        /// Bytes the frame (or its length prefix) should have had.
        expected: usize,
        /// Bytes that arrived before the end of the stream.
        got: usize,
    },
    /// The length prefix announced more than the reader accepts.
    #[error(
        "the peer announced a frame of {len} bytes, over the limit of {max} bytes; \
         it is misbehaving or runs an incompatible gpuq"
    )]
    TooLarge {
        /// The announced body length.
        len: usize,
        /// The reader's limit.
        max: usize,
    },
    /// The body was not a valid encoding of the expected message.
    #[error(
        "a frame from the peer could not be decoded ({0}); it may run an incompatible gpuq version"
    )]
    Decode(#[from] rmp_serde::decode::Error),
    /// The message could not be encoded (a bug in the sender, never the peer's fault).
    #[error("a message could not be encoded: {0}")]
    Encode(#[from] rmp_serde::encode::Error),
    /// The reader's budget refused to hold more of the frame.
    #[error("{0}")]
    OverBudget(String),
    /// The encoded message does not fit in a `u32` length prefix.
    #[error("a message of {len} bytes is too large to send in one frame (at most 4 GiB)")]
    EncodeTooLarge {
        /// The encoded body length.
        len: usize,
    },
}

/// `value` as one frame: its length prefix and body.
pub fn encode_frame<T: Serialize + ?Sized>(value: &T) -> Result<Vec<u8>, FrameError> {
    let mut buf = vec![0u8; 4];
    rmp_serde::encode::write_named(&mut buf, value)?;
    let len = buf.len() - 4;
    let prefix = u32::try_from(len).map_err(|_| FrameError::EncodeTooLarge { len })?;
    buf[..4].copy_from_slice(&prefix.to_be_bytes());
    Ok(buf)
}

/// Encodes `value` as one frame and writes it to `w` (one write, then a flush).
pub async fn write_frame<W, T>(w: &mut W, value: &T) -> Result<(), FrameError>
where
    W: AsyncWrite + Unpin,
    T: Serialize + ?Sized,
{
    let buf = encode_frame(value)?;
    w.write_all(&buf).await?;
    w.flush().await?;
    Ok(())
}

/// [`write_frame`] on a blocking writer (the shim has no runtime).
pub fn write_frame_blocking<W, T>(w: &mut W, value: &T) -> Result<(), FrameError>
where
    W: std::io::Write,
    T: Serialize + ?Sized,
{
    let buf = encode_frame(value)?;
    w.write_all(&buf)?;
    w.flush()?;
    Ok(())
}

/// [`read_frame`] on a blocking reader (the shim has no runtime). The body
/// is read whole, so keep `max_len` small: its peers are local.
pub fn read_frame_blocking<R, T>(r: &mut R, max_len: usize) -> Result<Option<T>, FrameError>
where
    R: std::io::Read,
    T: DeserializeOwned,
{
    let mut prefix = [0u8; 4];
    let mut got = 0;
    while got < prefix.len() {
        match r.read(&mut prefix[got..]) {
            Ok(0) if got == 0 => return Ok(None),
            Ok(0) => return Err(FrameError::Truncated { expected: 4, got }),
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e.into()),
        }
    }
    let len = u32::from_be_bytes(prefix) as usize;
    if len > max_len {
        return Err(FrameError::TooLarge { len, max: max_len });
    }
    let mut body = vec![0u8; len];
    r.read_exact(&mut body).map_err(|e| match e.kind() {
        io::ErrorKind::UnexpectedEof => FrameError::Truncated {
            expected: len,
            got: 0,
        },
        _ => FrameError::Io(e),
    })?;
    Ok(Some(rmp_serde::from_slice(&body)?))
}

/// Reads one frame's body undecoded, for a reader that tells message types
/// apart by trying them in turn; `Ok(None)` at a clean end of stream.
pub async fn read_frame_body<R>(r: &mut R, max_len: usize) -> Result<Option<Vec<u8>>, FrameError>
where
    R: AsyncRead + Unpin,
{
    match read_len(r, max_len).await? {
        Some(len) => read_body(r, len, &mut |_| Ok(())).await.map(Some),
        None => Ok(None),
    }
}

/// Reads one frame from `r` and decodes it.
///
/// Returns `Ok(None)` when the stream ends cleanly before a length prefix. A body
/// longer than `max_len` is refused before any allocation.
pub async fn read_frame<R, T>(r: &mut R, max_len: usize) -> Result<Option<T>, FrameError>
where
    R: AsyncRead + Unpin,
    T: DeserializeOwned,
{
    read_frame_charged(r, max_len, &mut |_| Ok(())).await
}

/// [`read_frame`], calling `charge` with each growth of the body's buffer
/// (in bytes) before it happens; an error from `charge` ends the read.
pub async fn read_frame_charged<R, T>(
    r: &mut R,
    max_len: usize,
    charge: &mut (dyn FnMut(usize) -> Result<(), FrameError> + Send),
) -> Result<Option<T>, FrameError>
where
    R: AsyncRead + Unpin,
    T: DeserializeOwned,
{
    let Some(len) = read_len(r, max_len).await? else {
        return Ok(None);
    };
    let body = read_body(r, len, charge).await?;
    Ok(Some(rmp_serde::from_slice(&body)?))
}

/// Reads a length prefix and checks it against `max_len`; `Ok(None)` at a
/// clean end of stream.
async fn read_len<R: AsyncRead + Unpin>(
    r: &mut R,
    max_len: usize,
) -> Result<Option<usize>, FrameError> {
    let mut prefix = [0u8; 4];
    let got = read_full(r, &mut prefix).await?;
    if got == 0 {
        return Ok(None);
    }
    if got < prefix.len() {
        return Err(FrameError::Truncated { expected: 4, got });
    }
    // u32 always fits in usize on the platforms gpuq runs on (64-bit Linux).
    let len = u32::from_be_bytes(prefix) as usize;
    if len > max_len {
        return Err(FrameError::TooLarge { len, max: max_len });
    }
    Ok(Some(len))
}

/// The first buffer a body gets; it doubles from there as bytes arrive.
const FIRST_CHUNK: usize = 16 << 10;

/// Reads a body of `len` bytes into a buffer that grows with what arrives.
async fn read_body<R: AsyncRead + Unpin>(
    r: &mut R,
    len: usize,
    charge: &mut (dyn FnMut(usize) -> Result<(), FrameError> + Send),
) -> Result<Vec<u8>, FrameError> {
    let mut body: Vec<u8> = Vec::new();
    while body.len() < len {
        if body.len() == body.capacity() {
            let grown = (body.capacity() * 2).max(FIRST_CHUNK).min(len);
            charge(grown - body.capacity())?;
            body.reserve_exact(grown - body.len());
        }
        let filled = body.len();
        let room = body.capacity().min(len) - filled;
        body.resize(filled + room, 0);
        let n = r.read(&mut body[filled..]).await?;
        body.truncate(filled + n);
        if n == 0 {
            return Err(FrameError::Truncated {
                expected: len,
                got: filled,
            });
        }
    }
    Ok(body)
}

/// Fills `buf` unless the stream ends first; returns how many bytes arrived.
async fn read_full<R: AsyncRead + Unpin>(r: &mut R, buf: &mut [u8]) -> io::Result<usize> {
    let mut filled = 0;
    while filled < buf.len() {
        let n = r.read(&mut buf[filled..]).await?;
        if n == 0 {
            break;
        }
        filled += n;
    }
    Ok(filled)
}

#[cfg(test)]
mod tests {
    use serde::Deserialize;

    use super::*;

    #[derive(Debug, PartialEq, Serialize, Deserialize)]
    struct Old {
        id: u64,
        name: String,
    }

    #[derive(Debug, PartialEq, Serialize, Deserialize)]
    struct New {
        id: u64,
        name: String,
        #[serde(default)]
        gpus: u32,
    }

    async fn encode<T: Serialize>(value: &T) -> Vec<u8> {
        let mut buf = Vec::new();
        write_frame(&mut buf, value).await.expect("encode");
        buf
    }

    #[tokio::test]
    async fn round_trip_of_several_frames_then_clean_eof() {
        let mut buf = encode(&Old {
            id: 1,
            name: "a".into(),
        })
        .await;
        buf.extend(
            encode(&Old {
                id: 2,
                name: "b".into(),
            })
            .await,
        );
        let mut r = buf.as_slice();
        let a: Option<Old> = read_frame(&mut r, DEFAULT_MAX_FRAME).await.expect("first");
        let b: Option<Old> = read_frame(&mut r, DEFAULT_MAX_FRAME).await.expect("second");
        let end: Option<Old> = read_frame(&mut r, DEFAULT_MAX_FRAME).await.expect("eof");
        assert_eq!(
            a,
            Some(Old {
                id: 1,
                name: "a".into()
            })
        );
        assert_eq!(
            b,
            Some(Old {
                id: 2,
                name: "b".into()
            })
        );
        assert_eq!(end, None);
    }

    #[tokio::test]
    async fn added_default_fields_stay_compatible_both_ways() {
        let old = encode(&Old {
            id: 7,
            name: "n".into(),
        })
        .await;
        let new: Option<New> = read_frame(&mut old.as_slice(), 1024)
            .await
            .expect("old->new");
        assert_eq!(
            new,
            Some(New {
                id: 7,
                name: "n".into(),
                gpus: 0
            })
        );

        let newer = encode(&New {
            id: 8,
            name: "m".into(),
            gpus: 4,
        })
        .await;
        let back: Option<Old> = read_frame(&mut newer.as_slice(), 1024)
            .await
            .expect("new->old");
        assert_eq!(
            back,
            Some(Old {
                id: 8,
                name: "m".into()
            })
        );
    }

    #[tokio::test]
    async fn eof_inside_the_length_prefix_is_truncated() {
        let err = read_frame::<_, Old>(&mut &[0u8, 0][..], 1024)
            .await
            .unwrap_err();
        assert!(
            matches!(
                err,
                FrameError::Truncated {
                    expected: 4,
                    got: 2
                }
            ),
            "{err}"
        );
    }

    #[tokio::test]
    async fn eof_inside_the_body_is_truncated() {
        let mut buf = encode(&Old {
            id: 1,
            name: "abcdef".into(),
        })
        .await;
        let full = buf.len() - 4;
        buf.truncate(buf.len() - 3);
        let err = read_frame::<_, Old>(&mut buf.as_slice(), 1024)
            .await
            .unwrap_err();
        match err {
            FrameError::Truncated { expected, got } => {
                assert_eq!(expected, full);
                assert_eq!(got, full - 3);
            }
            other => panic!("expected Truncated, got {other}"),
        }
    }

    #[tokio::test]
    async fn oversized_length_is_refused_before_reading_the_body() {
        // Only the prefix is there: had the reader tried to allocate and read
        // the body, it would report Truncated instead.
        let prefix = u32::MAX.to_be_bytes();
        let err = read_frame::<_, Old>(&mut &prefix[..], DEFAULT_MAX_FRAME)
            .await
            .unwrap_err();
        assert!(
            matches!(err, FrameError::TooLarge { len, max } if len == u32::MAX as usize && max == DEFAULT_MAX_FRAME),
            "{err}"
        );
    }

    #[tokio::test]
    async fn a_bodys_buffer_grows_with_what_arrives_not_with_what_is_announced() {
        // 16 MiB announced, 10 bytes sent: the reader held one small chunk.
        let mut buf = (16u32 << 20).to_be_bytes().to_vec();
        buf.extend([0u8; 10]);
        let mut charged = 0;
        let err = read_frame_charged::<_, Old>(&mut buf.as_slice(), DEFAULT_MAX_FRAME, &mut |n| {
            charged += n;
            Ok(())
        })
        .await
        .unwrap_err();
        assert!(
            matches!(err, FrameError::Truncated { expected, got: 10 } if expected == 16 << 20),
            "{err}"
        );
        assert_eq!(charged, FIRST_CHUNK);
        // A whole frame is charged about its size, and a refusal ends the read.
        let big = encode(&"x".repeat(100_000)).await;
        let mut charged = 0;
        let got: Option<String> = read_frame_charged(&mut big.as_slice(), 1 << 20, &mut |n| {
            charged += n;
            Ok(())
        })
        .await
        .unwrap();
        assert_eq!(got.map(|s| s.len()), Some(100_000));
        assert!((100_000..=200_000).contains(&charged), "{charged}");
        let err = read_frame_charged::<_, String>(&mut big.as_slice(), 1 << 20, &mut |_| {
            Err(FrameError::OverBudget("no more".into()))
        })
        .await
        .unwrap_err();
        assert!(matches!(err, FrameError::OverBudget(_)), "{err}");
    }

    #[tokio::test]
    async fn garbage_body_is_a_decode_error() {
        let mut buf = 3u32.to_be_bytes().to_vec();
        buf.extend([0xc1, 0xff, 0x00]); // 0xc1 is never valid MessagePack
        let err = read_frame::<_, Old>(&mut buf.as_slice(), 1024)
            .await
            .unwrap_err();
        assert!(matches!(err, FrameError::Decode(_)), "{err}");
    }

    #[tokio::test]
    async fn wrong_message_type_is_a_decode_error() {
        let buf = encode(&"just a string").await;
        let err = read_frame::<_, Old>(&mut buf.as_slice(), 1024)
            .await
            .unwrap_err();
        assert!(matches!(err, FrameError::Decode(_)), "{err}");
    }

    #[tokio::test]
    async fn works_over_a_unix_socket_pair() {
        let (mut a, mut b) = tokio::net::UnixStream::pair().expect("socketpair");
        write_frame(
            &mut a,
            &Old {
                id: 3,
                name: "u".into(),
            },
        )
        .await
        .expect("write");
        drop(a);
        let got: Option<Old> = read_frame(&mut b, 1024).await.expect("read");
        assert_eq!(
            got,
            Some(Old {
                id: 3,
                name: "u".into()
            })
        );
        let end: Option<Old> = read_frame(&mut b, 1024).await.expect("eof");
        assert_eq!(end, None);
    }
}
