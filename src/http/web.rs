//! The web page, embedded in the binary (no CDN, nothing fetched at run
//! time): one HTML page, its script and its style. The script reads the
//! JSON API (`/api/v1/`) the way any client does, so the page can show and
//! do only what its token (or the anonymous loopback reader) may.

use bytes::Bytes;
use http_body_util::Full;
use hyper::{Response, StatusCode};

use super::{json_error, respond, Site};

const INDEX: &str = include_str!("web/index.html");
const APP_JS: &str = include_str!("web/app.js");
const STYLE: &str = include_str!("web/style.css");

/// The asset at `path`, or 404. Only servers (which answer the API) serve
/// the page.
pub(super) fn asset(site: &dyn Site, path: &str) -> Response<Full<Bytes>> {
    let (body, kind) = match path {
        "/" | "/index.html" => (INDEX, "text/html; charset=utf-8"),
        "/app.js" => (APP_JS, "text/javascript; charset=utf-8"),
        "/style.css" => (STYLE, "text/css; charset=utf-8"),
        _ => {
            return json_error(
                StatusCode::NOT_FOUND,
                "NotFound",
                &format!("nothing at {path}"),
            )
        }
    };
    if site.authenticate("").is_none() {
        return json_error(
            StatusCode::NOT_FOUND,
            "NotFound",
            "an agent serves /metrics and /healthz; the page is on the servers",
        );
    }
    let mut resp = respond(StatusCode::OK, kind, Bytes::from_static(body.as_bytes()));
    resp.headers_mut().insert(
        "content-security-policy",
        hyper::header::HeaderValue::from_static(
            "default-src 'self'; style-src 'self'; script-src 'self'; frame-ancestors 'none'",
        ),
    );
    resp
}
