//! The web page, embedded in the binary.

use bytes::Bytes;
use http_body_util::Full;
use hyper::{Response, StatusCode};

use super::{json_error, Site};

/// The asset at `path`, or 404.
pub(super) fn asset(_site: &dyn Site, path: &str) -> Response<Full<Bytes>> {
    json_error(
        StatusCode::NOT_FOUND,
        "NotFound",
        &format!("nothing at {path}"),
    )
}
