//! Why the state's redb tables could not be read or written: the one error
//! of the active records (`store`) and of the history archive (`history`),
//! which `store` composes. It sits below both so that neither imports the
//! other for it.

use super::codec::{DecodeError, EncodeError};

/// Why the state could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("state database error: {0}")]
    Db(Box<redb::Error>),
    #[error("state record {what} could not be decoded ({source}); the data dir may come from a newer gpuq")]
    Decode { what: String, source: DecodeError },
    #[error("snapshot is malformed: {0}")]
    Snapshot(String),
    #[error("state record could not be encoded: {0}")]
    Encode(#[from] EncodeError),
}

impl StoreError {
    /// For `map_err` on decoding the record `what`.
    pub(super) fn decoding(what: impl Into<String>) -> impl FnOnce(DecodeError) -> StoreError {
        move |source| StoreError::Decode {
            what: what.into(),
            source,
        }
    }
}
