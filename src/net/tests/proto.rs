//! The client API's wire shape across releases: what an earlier client or
//! server sends must still read, and what this build sends must still read
//! to an earlier one.

use serde::{Deserialize, Serialize};

use crate::model::BatchEntryError;
use crate::net::proto::{ApiResponse, ErrorKind};

/// `ApiResponse::Error` as releases before `batch_entry` wrote and read it.
#[derive(Debug, PartialEq, Serialize, Deserialize)]
enum EarlierResponse {
    Error { kind: ErrorKind, message: String },
}

fn encode<T: Serialize>(v: &T) -> Vec<u8> {
    rmp_serde::to_vec_named(v).expect("encode")
}

#[test]
fn an_error_without_a_batch_entry_is_the_bytes_an_earlier_release_sent() {
    let now = ApiResponse::error(ErrorKind::NotFound, "job 99 does not exist");
    let then = EarlierResponse::Error {
        kind: ErrorKind::NotFound,
        message: "job 99 does not exist".into(),
    };
    assert_eq!(encode(&now), encode(&then));
    let read: ApiResponse = rmp_serde::from_slice(&encode(&then)).expect("decode");
    assert_eq!(read, now);
}

#[test]
fn a_batch_refusal_names_its_job_and_still_reads_to_an_earlier_client() {
    let entry = BatchEntryError {
        index: 4,
        why: "no partition \"gpu\"".into(),
    };
    let now = ApiResponse::batch_entry_error(ErrorKind::BadInput, entry.clone());
    let read: ApiResponse = rmp_serde::from_slice(&encode(&now)).expect("decode");
    assert_eq!(read, now);
    match read {
        ApiResponse::Error { batch_entry, .. } => assert_eq!(batch_entry, Some(entry)),
        other => panic!("{other:?}"),
    }
    // An earlier client ignores the new field and finds the index in the text.
    let earlier: EarlierResponse = rmp_serde::from_slice(&encode(&now)).expect("decode");
    assert_eq!(
        earlier,
        EarlierResponse::Error {
            kind: ErrorKind::BadInput,
            message: "job 5 of the batch (from 1): no partition \"gpu\"; nothing was submitted"
                .into(),
        }
    );
}
