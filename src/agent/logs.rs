//! Serving task output to `gpuq logs`: the leader opens a stream on this
//! agent's connection and asks for a byte range of a rank's output file. No
//! shared filesystem is needed. The agent only serves a file that the job's
//! user owns, so an `--output /etc/shadow` job cannot read other files.

use std::io::{Read, Seek, SeekFrom};
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use crate::net::agent_proto::{LogReply, LogRequest};
use crate::net::frame::{read_frame, write_frame};

use crate::net::agent_proto::MAX_LOG_CHUNK;

/// Answers log requests on `conn` until it closes.
pub async fn serve(conn: quinn::Connection) {
    while let Ok((mut send, mut recv)) = conn.accept_bi().await {
        tokio::spawn(async move {
            let Ok(Some(req)) = read_frame::<_, LogRequest>(&mut recv, 64 << 10).await else {
                return;
            };
            let reply = tokio::task::spawn_blocking(move || read_log(&req))
                .await
                .unwrap_or_else(|e| LogReply::Refused {
                    reason: format!("reading the log failed: {e}"),
                });
            let _ = write_frame(&mut send, &reply).await;
            let _ = send.finish();
        });
    }
}

/// Reads the requested range of a rank's output file.
pub fn read_log(req: &LogRequest) -> LogReply {
    let workdir = Path::new(&req.workdir);
    let vars = super::exec::env::PatternVars {
        job: req.job,
        job_name: &req.job_name,
        rank: req.rank,
        node_rank: req.node_rank,
        user: &req.user,
        workdir,
    };
    let path = super::exec::env::expand_output_pattern(req.output.as_deref(), &vars);
    let meta = match std::fs::metadata(&path) {
        Ok(m) => m,
        Err(_) => {
            return LogReply::Missing {
                path: path.display().to_string(),
            }
        }
    };
    let me = nix::unistd::Uid::effective();
    let allowed = match nix::unistd::User::from_name(&req.user).ok().flatten() {
        // Root's jobs may write anywhere; anyone else's output is theirs.
        Some(u) if u.uid.is_root() => true,
        Some(u) if u.uid.as_raw() == meta.uid() => true,
        // An unprivileged `gpuq dev` runs every task as its own user.
        _ => !me.is_root() && me.as_raw() == meta.uid(),
    };
    if !allowed {
        return LogReply::Refused {
            reason: format!(
                "{} is not owned by {}; only a job's own output is served",
                path.display(),
                req.user
            ),
        };
    }
    let mut f = match std::fs::File::open(&path) {
        Ok(f) => f,
        Err(e) => {
            return LogReply::Refused {
                reason: format!("cannot open {}: {e}", path.display()),
            }
        }
    };
    let size = meta.len();
    let start = req.offset.min(size);
    let want = u64::from(req.max_bytes.min(MAX_LOG_CHUNK)).min(size - start);
    let mut data = vec![0; want as usize];
    let read = f
        .seek(SeekFrom::Start(start))
        .and_then(|_| f.read(&mut data));
    match read {
        Ok(n) => {
            data.truncate(n);
            LogReply::Chunk { data, size }
        }
        Err(e) => LogReply::Refused {
            reason: format!("cannot read {}: {e}", path.display()),
        },
    }
}
