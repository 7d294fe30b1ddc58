//! The JSON API under `/api/v1/`: each route is translated into the
//! [`ApiRequest`] the CLI would send and answered by the daemon's [`Site`],
//! so there is one implementation of every rule.

use std::net::SocketAddr;

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::{Request, Response, StatusCode};

use super::{json_error, Site};

/// What a valid bearer token grants: acting as `user`, for reads only
/// when `read_only`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Grant {
    pub user: String,
    pub read_only: bool,
}

/// Why a bearer token was refused (said to the client, and logged).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum AuthError {
    #[error("the bearer token is not a gpuq API token (gpuqapi1-<id>.<secret>)")]
    Malformed,
    #[error("no such token")]
    Unknown,
    #[error("the token's secret is wrong")]
    Forged,
    #[error("the token has expired")]
    Expired,
    #[error("the token was revoked")]
    Revoked,
}

/// Answers a request under `/api/`.
pub(super) async fn route(
    _site: &dyn Site,
    _peer: SocketAddr,
    req: Request<Incoming>,
) -> Response<Full<Bytes>> {
    json_error(
        StatusCode::NOT_FOUND,
        "NotFound",
        &format!("no API route {}", req.uri().path()),
    )
}
