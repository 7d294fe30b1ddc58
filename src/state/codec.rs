//! The one MessagePack codec for what gpuq keeps at rest: the state's
//! records and its snapshots (`store`), the history archive (`history`), and
//! the Raft log and state machine's own records (`raft`). Named fields
//! (`rmp_serde::to_vec_named`), so a record an older build wrote still
//! decodes after an upgrade, and a field added since takes its default.
//!
//! It lives low in the house, in `state`, because `raft` may use `state` and
//! not the other way round. Each caller adds what it was reading to the
//! error in its own error type. (Frames on the wire have their own streaming
//! codec, `net::frame`, with the same encoding.)

use serde::de::DeserializeOwned;
use serde::Serialize;

/// Why a value could not be encoded.
pub type EncodeError = rmp_serde::encode::Error;

/// Why bytes could not be decoded as the value asked for.
pub type DecodeError = rmp_serde::decode::Error;

/// `v` as MessagePack with named fields.
pub fn encode<T: Serialize + ?Sized>(v: &T) -> Result<Vec<u8>, EncodeError> {
    rmp_serde::to_vec_named(v)
}

/// The value `bytes` (from [`encode`]) hold.
pub fn decode<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, DecodeError> {
    rmp_serde::from_slice(bytes)
}
