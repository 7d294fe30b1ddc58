//! The JSON API under `/api/v1/`: each route becomes the [`ApiRequest`] the
//! CLI would send, answered by the daemon's [`Site`] (on servers,
//! `Api::handle`), so ownership, private jobs and every check are the
//! CLI's. A submission's flags are the CLI's flags, read by `spec` as
//! `gpuq submit` reads them; only the program comes apart (`command` or
//! `script`), since nothing is read from the server's files.
//!
//! | method and path | request |
//! |---|---|
//! | `GET /api/v1/whoami` | who the token (or loopback) makes you |
//! | `GET /api/v1/jobs?all=1&user=U&state=S&after=ID` | `Queue` |
//! | `POST /api/v1/jobs` `{"args":[..],"command":[..] or "script":"..","workdir":"/abs","env":{..}}` | `Submit` |
//! | `GET /api/v1/jobs/ID` | `Show` |
//! | `DELETE /api/v1/jobs/ID`, `POST /api/v1/jobs/ID/cancel` | `Cancel` |
//! | `POST /api/v1/jobs/ID/hold`, `.../release` | `Hold` |
//! | `GET /api/v1/jobs/ID/logs?rank=R&offset=N` | `Logs` |
//! | `GET /api/v1/nodes`, `/api/v1/cluster` | `Nodes`, `Cluster` |
//! | `GET /api/v1/acct?user=U&account=A&state=S&after=ID&summary=1` | `Acct` |
//! | `GET /api/v1/utilisation?hours=24&buckets=96` | `Utilisation` |
//! | `GET /api/v1/services`, `/api/v1/services/NAME` | `Services` (replicas, endpoints) |
//! | `POST /api/v1/services/NAME/scale?replicas=N` | `ServiceScale` |
//! | `DELETE /api/v1/services/NAME` | `ServiceDelete` |
//!
//! Answers are the response's fields as JSON (`{"jobs": [...]}`); errors
//! are `{"error": sentence, "kind": ...}` with 400, 403, 404, 503 or 500.
//! Every write needs a token that is not read-only.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::ops::RangeInclusive;

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::{Method, Request, Response, StatusCode};
use serde::Deserialize;

use super::{body_bytes, identify, json_error, respond, Site};
use crate::model::{JobId, JobRef, JobState};
use crate::net::proto::{
    ApiRequest, ApiResponse, Caller, ErrorKind, UTILISATION_BUCKETS, UTILISATION_HOURS,
};

/// The user loopback readers act as, without a token.
pub const ANONYMOUS: &str = "anonymous";

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
    #[error("the token has expired: make a new one with `gpuq token create --role user`")]
    Expired,
    #[error("the token was revoked")]
    Revoked,
}

type Reply = Response<Full<Bytes>>;

/// A submission: the CLI's flags, and what runs.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct SubmitBody {
    /// `gpuq submit` flags, e.g. `["--gpus", "2", "--time", "1h"]`.
    #[serde(default)]
    args: Vec<String>,
    /// The command and its arguments.
    #[serde(default)]
    command: Vec<String>,
    /// Or a script's text, whose `#GPUQ`/`#SBATCH` lines count as flags.
    #[serde(default)]
    script: Option<String>,
    /// The job's working directory (absolute; default `/tmp`).
    #[serde(default)]
    workdir: Option<String>,
    /// The environment `--export` picks from.
    #[serde(default)]
    env: BTreeMap<String, String>,
}

/// Answers a request under `/api/`.
pub(super) async fn route(site: &dyn Site, peer: SocketAddr, req: Request<Incoming>) -> Reply {
    let grant = match identify(site, peer, &req) {
        Ok(g) => g,
        Err(refusal) => return *refusal,
    };
    let method = req.method().clone();
    let path = req.uri().path().trim_end_matches('/').to_string();
    let query = parse_query(req.uri().query().unwrap_or(""));
    let writes = method != Method::GET && method != Method::HEAD;
    let caller = match (&grant, writes) {
        (None, true) => {
            tracing::warn!(%peer, %path, "http write refused: no token");
            return json_error(
                StatusCode::UNAUTHORIZED,
                "Unauthorized",
                "a write needs a token: send Authorization: Bearer <token> (make one with \
                 `gpuq token create --role user`)",
            );
        }
        (Some(g), true) if g.read_only => {
            tracing::warn!(%peer, %path, user = %g.user, "http write refused: read-only token");
            return json_error(
                StatusCode::FORBIDDEN,
                "Forbidden",
                "this token is read-only: make one without --read-only to change jobs",
            );
        }
        (Some(g), _) => Caller {
            user: g.user.clone(),
            uid: u32::MAX,
            admin: false,
        },
        (None, false) => Caller {
            user: ANONYMOUS.into(),
            uid: u32::MAX,
            admin: false,
        },
    };
    let Some(rest) = path.strip_prefix("/api/v1") else {
        return not_found(&path);
    };
    let parts: Vec<&str> = rest.split('/').filter(|p| !p.is_empty()).collect();
    let request = match (method.clone(), parts.as_slice()) {
        (Method::GET, ["whoami"]) => {
            let body = serde_json::json!({
                "user": caller.user,
                "anonymous": grant.is_none(),
                "read_only": grant.as_ref().is_none_or(|g| g.read_only),
            });
            return respond(StatusCode::OK, "application/json", body.to_string());
        }
        (Method::GET, ["jobs"]) => queue_request(&query),
        (Method::POST, ["jobs"]) => match body_bytes(req).await {
            Ok(body) => submit_request(&body),
            Err(refusal) => return *refusal,
        },
        (Method::GET, ["jobs", id]) => job_ref(id).map(|r| ApiRequest::Show {
            id: r.id,
            task: r.task,
        }),
        (Method::DELETE, ["jobs", id]) | (Method::POST, ["jobs", id, "cancel"]) => {
            job_ref(id).map(cancel)
        }
        (Method::POST, ["jobs", id, verb @ ("hold" | "release")]) => {
            job_ref(id).map(|r| ApiRequest::Hold {
                jobs: vec![r],
                hold: *verb == "hold",
            })
        }
        (Method::GET, ["jobs", id, "logs"]) => job_ref(id).and_then(|r| {
            Ok(ApiRequest::Logs {
                id: r.id,
                rank: number(&query, "rank")?.unwrap_or(0) as u32,
                offset: number(&query, "offset")?.unwrap_or(0),
            })
        }),
        (Method::GET, ["nodes"]) => Ok(ApiRequest::Nodes),
        // Accounts, QoS, partitions, reservations, node groups.
        (Method::GET, ["policy"]) => Ok(ApiRequest::PolicyShow),
        (Method::GET, ["cluster"]) => Ok(ApiRequest::Cluster),
        (Method::GET, ["acct"]) => acct_request(&query),
        (Method::GET, ["utilisation"]) => utilisation_request(&query),
        (Method::GET, ["services"]) => Ok(ApiRequest::Services { name: None }),
        (Method::GET, ["services", name]) => Ok(ApiRequest::Services {
            name: Some(name.to_string()),
        }),
        (Method::POST, ["services", name, "scale"]) => match number(&query, "replicas") {
            Ok(Some(n)) => Ok(ApiRequest::ServiceScale {
                name: name.to_string(),
                replicas: n.min(u64::from(u32::MAX)) as u32,
            }),
            Ok(None) => Err("replicas=N is missing: say how many replicas".into()),
            Err(why) => Err(why),
        },
        (Method::DELETE, ["services", name]) => Ok(ApiRequest::ServiceDelete {
            name: name.to_string(),
        }),
        _ => return not_found(&path),
    };
    let request = match request {
        Ok(r) => r,
        Err(why) => return json_error(StatusCode::BAD_REQUEST, "BadInput", &why),
    };
    let resp = site.call(caller.clone(), request).await;
    if let ApiResponse::Error {
        kind: ErrorKind::Forbidden,
        message,
        ..
    } = &resp
    {
        tracing::warn!(%peer, %path, user = %caller.user, "http request refused: {message}");
    }
    answer(resp)
}

fn cancel(r: JobRef) -> ApiRequest {
    match r.task {
        None => ApiRequest::Cancel {
            ids: vec![r.id],
            tasks: Vec::new(),
        },
        Some(_) => ApiRequest::Cancel {
            ids: Vec::new(),
            tasks: vec![r],
        },
    }
}

fn not_found(path: &str) -> Reply {
    json_error(
        StatusCode::NOT_FOUND,
        "NotFound",
        &format!("no API route {path}: see /api/v1/ routes in the README"),
    )
}

fn job_ref(word: &str) -> Result<JobRef, String> {
    JobRef::parse(word)
}

/// `a=1&b=x` (percent-decoded); a key given twice keeps both values.
fn parse_query(q: &str) -> Vec<(String, String)> {
    q.split('&')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (k, v) = p.split_once('=').unwrap_or((p, ""));
            (decode(k), decode(v))
        })
        .collect()
}

fn decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < bytes.len() => {
                let hex = |b: u8| (b as char).to_digit(16);
                match (hex(bytes[i + 1]), hex(bytes[i + 2])) {
                    (Some(h), Some(l)) => {
                        out.push((h * 16 + l) as u8);
                        i += 2;
                    }
                    _ => out.push(b'%'),
                }
            }
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn values<'a>(q: &'a [(String, String)], key: &str) -> impl Iterator<Item = &'a str> {
    let key = key.to_string();
    q.iter()
        .filter(move |(k, _)| *k == key)
        .map(|(_, v)| v.as_str())
}

fn value<'a>(q: &'a [(String, String)], key: &str) -> Option<&'a str> {
    values(q, key).last()
}

fn flag(q: &[(String, String)], key: &str) -> bool {
    value(q, key).is_some_and(|v| matches!(v, "" | "1" | "true" | "yes"))
}

fn number(q: &[(String, String)], key: &str) -> Result<Option<u64>, String> {
    value(q, key)
        .map(|v| {
            v.parse::<u64>()
                .map_err(|_| format!("{key}={v:?} is not a whole number"))
        })
        .transpose()
}

fn states(q: &[(String, String)]) -> Result<Vec<JobState>, String> {
    values(q, "state")
        .flat_map(|v| v.split(','))
        .filter(|v| !v.is_empty())
        .map(|v| {
            JobState::parse(&v.to_ascii_uppercase())
                .ok_or_else(|| format!("state={v:?} is not a job state (e.g. RUNNING)"))
        })
        .collect()
}

fn queue_request(q: &[(String, String)]) -> Result<ApiRequest, String> {
    Ok(ApiRequest::Queue {
        all: flag(q, "all"),
        user: value(q, "user").map(str::to_string),
        states: states(q)?,
        after: number(q, "after")?.map(JobId),
    })
}

fn acct_request(q: &[(String, String)]) -> Result<ApiRequest, String> {
    let filter = crate::model::acct::AcctFilter {
        user: value(q, "user").map(str::to_string),
        account: value(q, "account").map(str::to_string),
        states: states(q)?,
        after: number(q, "after")?.map(JobId),
        limit: Some(number(q, "limit")?.unwrap_or(crate::model::acct::ACCT_PAGE as u64) as u32),
        ..Default::default()
    };
    Ok(ApiRequest::Acct {
        filter,
        summary: flag(q, "summary"),
    })
}

/// The chart's window: `hours` (default 24) cut into `buckets` (default 96).
fn utilisation_request(q: &[(String, String)]) -> Result<ApiRequest, String> {
    let within = |key: &str, range: RangeInclusive<u32>, default: u32| {
        let Some(v) = value(q, key) else {
            return Ok(default);
        };
        v.parse().ok().filter(|n| range.contains(n)).ok_or_else(|| {
            let (lo, hi) = (range.start(), range.end());
            format!("{key}={v:?} is out of range: give a whole number from {lo} to {hi}")
        })
    };
    Ok(ApiRequest::Utilisation {
        hours: within("hours", UTILISATION_HOURS, 24)?,
        buckets: within("buckets", UTILISATION_BUCKETS, 96)?,
    })
}

/// Flags as `gpuq submit` takes them (the program comes apart).
#[derive(clap::Parser, Debug)]
#[command(name = "submit", no_binary_name = true, disable_help_flag = true)]
struct Flags {
    #[command(flatten)]
    args: crate::spec::SubmitArgs,
}

fn submit_request(body: &[u8]) -> Result<ApiRequest, String> {
    use clap::Parser;
    let body: SubmitBody = serde_json::from_slice(body).map_err(|e| {
        format!(
            "the body is not a submission ({e}): send {{\"args\": [flags], \"command\": \
             [program, args...]}} or {{\"args\": [...], \"script\": \"#!/bin/sh ...\"}}"
        )
    })?;
    let flags =
        Flags::try_parse_from(&body.args).map_err(|e| format!("args: {}", e.to_string().trim()))?;
    if !flags.args.script_or_command.is_empty() {
        return Err("args holds flags only: put the program in \"command\"".into());
    }
    let env: Vec<(String, String)> = body.env.into_iter().collect();
    let workdir = std::path::PathBuf::from(body.workdir.as_deref().unwrap_or("/tmp"));
    let spec = match (body.command.is_empty(), body.script) {
        (false, None) => crate::spec::build_command_spec(&flags.args, body.command, &env, &workdir),
        (true, Some(script)) => crate::spec::parse_directives(&script, "script").and_then(|d| {
            let merged = d.overlay(&flags.args);
            crate::spec::build_batch_spec(&merged, "script", script, &env, &workdir)
        }),
        (true, None) => return Err("give \"command\" or \"script\": what the job runs".into()),
        (false, Some(_)) => return Err("give \"command\" or \"script\", not both".into()),
    }
    .map_err(|e| e.to_string())?;
    Ok(ApiRequest::Submit {
        spec: Box::new(spec),
    })
}

/// The HTTP status of an error's kind.
fn status_of(kind: ErrorKind) -> StatusCode {
    match kind {
        ErrorKind::BadInput => StatusCode::BAD_REQUEST,
        ErrorKind::NotFound => StatusCode::NOT_FOUND,
        ErrorKind::Forbidden => StatusCode::FORBIDDEN,
        ErrorKind::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
        ErrorKind::Internal => StatusCode::INTERNAL_SERVER_ERROR,
    }
}

/// The response's fields as JSON; an error as its status.
fn answer(resp: ApiResponse) -> Reply {
    match resp {
        ApiResponse::Error { kind, message, .. } => {
            json_error(status_of(kind), &format!("{kind:?}"), &message)
        }
        ApiResponse::Logs {
            data,
            next_offset,
            state,
            missing,
        } => {
            let body = serde_json::json!({
                "text": String::from_utf8_lossy(&data),
                "next_offset": next_offset,
                "state": state,
                "missing": missing,
            });
            respond(StatusCode::OK, "application/json", body.to_string())
        }
        other => {
            let status = match other {
                ApiResponse::Submitted { .. } => StatusCode::CREATED,
                _ => StatusCode::OK,
            };
            respond(status, "application/json", variant_fields(&other))
        }
    }
}

/// The response's fields as JSON, written straight from the response: the
/// externally tagged `{"Jobs":{...}}` without its tag (a unit variant, such
/// as `"Ok"`, as `{"ok":true}`). No `serde_json::Value` in between: at
/// 100,000 jobs that tree cost more than the writing.
fn variant_fields(resp: &ApiResponse) -> Vec<u8> {
    let Ok(bytes) = serde_json::to_vec(resp) else {
        return br#"{"error":"the answer could not be written as JSON","kind":"Internal"}"#
            .to_vec();
    };
    let tagged = bytes.first() == Some(&b'{') && bytes.last() == Some(&b'}');
    match bytes.windows(2).position(|w| w == b"\":") {
        Some(colon) if tagged => bytes[colon + 2..bytes.len() - 1].to_vec(),
        _ => br#"{"ok":true}"#.to_vec(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_are_the_variant_fields() {
        let ids = ApiResponse::Cancelled {
            ids: vec![JobId(3)],
        };
        assert_eq!(variant_fields(&ids), br#"{"ids":[3]}"#);
        assert_eq!(variant_fields(&ApiResponse::Ok), br#"{"ok":true}"#);
    }

    #[test]
    fn queries_decode() {
        let q = parse_query("all=1&user=al%20ice&state=RUNNING,pending&x");
        assert!(flag(&q, "all") && flag(&q, "x") && !flag(&q, "y"));
        assert_eq!(value(&q, "user"), Some("al ice"));
        assert_eq!(
            states(&q).unwrap(),
            vec![JobState::Running, JobState::Pending]
        );
        assert!(number(&parse_query("rank=x"), "rank").is_err());
        assert_eq!(decode("%zz%4"), "%zz%4");
        assert_eq!(decode("%C3%A9%é"), "é%é");
    }

    #[test]
    fn utilisation_takes_defaults_and_refuses_out_of_range() {
        let req = utilisation_request(&parse_query("")).unwrap();
        assert_eq!(
            req,
            ApiRequest::Utilisation {
                hours: 24,
                buckets: 96
            }
        );
        let req = utilisation_request(&parse_query("hours=720&buckets=1")).unwrap();
        assert_eq!(
            req,
            ApiRequest::Utilisation {
                hours: 720,
                buckets: 1
            }
        );
        for (query, name, range) in [
            ("hours=0", "hours", "from 1 to 720"),
            ("hours=721", "hours", "from 1 to 720"),
            ("hours=-3", "hours", "from 1 to 720"),
            ("buckets=1001", "buckets", "from 1 to 1000"),
            ("hours=2&buckets=x", "buckets", "from 1 to 1000"),
        ] {
            let err = utilisation_request(&parse_query(query)).unwrap_err();
            assert!(
                err.starts_with(name) && err.contains(range),
                "{query}: {err}"
            );
        }
    }

    #[test]
    fn submissions_take_the_cli_flags_and_never_read_files() {
        let body = br#"{"args": ["--gpus", "2", "-J", "t"], "command": ["/etc/shadow"], "workdir": "/srv"}"#;
        let ApiRequest::Submit { spec } = submit_request(body).unwrap() else {
            panic!("not a submit");
        };
        assert_eq!(spec.gpus_per_node, 2);
        assert_eq!(spec.name, "t");
        assert_eq!(spec.workdir, "/srv");
        assert!(matches!(
            spec.program,
            crate::model::Program::Command { .. }
        ));
        let err = submit_request(br#"{"args": ["--gpus", "x"], "command": ["a"]}"#).unwrap_err();
        assert!(err.contains("--gpus"), "{err}");
        let err = submit_request(br#"{"args": ["a"]}"#).unwrap_err();
        assert!(err.contains("command"), "{err}");
        let script = br##"{"script": "#!/bin/sh\n#GPUQ --gpus 3\necho hi\n"}"##;
        let ApiRequest::Submit { spec } = submit_request(script).unwrap() else {
            panic!("not a submit");
        };
        assert_eq!(spec.gpus_per_node, 3);
    }
}
