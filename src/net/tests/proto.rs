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

#[test]
fn a_page_stops_before_its_bytes_pass_the_limit_and_names_where_to_go_on() {
    use crate::model::JobId;
    use crate::net::proto::{encoded_len, take_page, PAGE_BYTES};
    // Items of about a tenth of a page each, ids 1..=25.
    let big = "x".repeat(PAGE_BYTES / 10);
    let items: Vec<(u64, String)> = (1..=25).map(|i| (i, big.clone())).collect();
    let (page, next) = take_page(items.clone(), |(i, _)| JobId(*i));
    assert_eq!(page.len(), 9, "ten would pass the limit");
    assert_eq!(next, Some(JobId(9)));
    assert!(page.iter().map(encoded_len).sum::<usize>() <= PAGE_BYTES);
    // What is left fits, or goes on again; nothing is lost or repeated.
    let (rest, next) = take_page(items.into_iter().skip(9), |(i, _)| JobId(*i));
    assert_eq!((rest.len(), next), (9, Some(JobId(18))));
    // One item bigger than a page is still answered, alone.
    let huge = vec![(1, "y".repeat(PAGE_BYTES + 1)), (2, String::new())];
    let (page, next) = take_page(huge, |(i, _)| JobId(*i));
    assert_eq!((page.len(), next), (1, Some(JobId(1))));
    // A short list is answered whole, with nowhere to go on.
    let (page, next) = take_page(vec![(1u64, String::new())], |(i, _)| JobId(*i));
    assert_eq!((page.len(), next), (1, None));
}
