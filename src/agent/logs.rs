//! Serving task output to `gpuq logs`: the leader opens a stream on this
//! agent's connection (see `streams`) and asks for a byte range of a rank's output file. No
//! shared filesystem is needed. The agent only serves a regular file that
//! the job's user owns, so an `--output /etc/shadow` job cannot read other
//! files, and checks the very file it reads (see `open_output`), so flipping
//! a symlink under the path between the check and the read gains nothing.

use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::Path;

use crate::net::agent_proto::{LogReply, LogRequest};
use crate::net::frame::write_frame;

use crate::net::agent_proto::MAX_LOG_CHUNK;

/// Answers one log request on its stream; a step task without an output
/// file is read from its spool under `spool`.
pub async fn answer(mut send: quinn::SendStream, mut req: LogRequest, spool: std::path::PathBuf) {
    if req.step.is_some() && req.output.is_none() {
        let key = crate::model::TaskKey {
            job: req.job,
            attempt: req.attempt,
            rank: req.rank,
            step: req.step,
        };
        let path = super::spool::path(&spool, key, req.stderr);
        // A pattern: any `%` of the path is meant literally.
        req.output = Some(path.to_string_lossy().replace('%', "%%"));
    }
    let reply = tokio::task::spawn_blocking(move || read_log(&req))
        .await
        .unwrap_or_else(|e| LogReply::Refused {
            reason: format!("reading the log failed: {e}"),
        });
    let _ = write_frame(&mut send, &reply).await;
    let _ = send.finish();
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
        array: req.array,
        node: &req.node,
        step: req.step,
    };
    let path = super::exec::env::expand_output_pattern(req.output.as_deref(), &vars);
    let shown = path.display().to_string();
    let (file, meta) = match open_output(&path) {
        Ok(opened) => opened,
        Err(Opened::Missing) => return LogReply::Missing { path: shown },
        Err(Opened::Refused(reason)) => return LogReply::Refused { reason },
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
                "{shown} is not owned by {}; only a job's own output is served",
                req.user
            ),
        };
    }
    let size = meta.len();
    let start = req.offset.min(size);
    let want = u64::from(req.max_bytes.min(MAX_LOG_CHUNK)).min(size - start);
    let mut data = vec![0; want as usize];
    match file.read_at(&mut data, start) {
        Ok(n) => {
            data.truncate(n);
            LogReply::Chunk { data, size }
        }
        Err(e) => LogReply::Refused {
            reason: format!("cannot read {shown}: {e}"),
        },
    }
}

/// Why an output file was not opened.
enum Opened {
    Missing,
    Refused(String),
}

/// Opens `path` for reading only if it is a regular file, and returns it
/// with the metadata of what was opened, so the owner check and the read
/// are about the same file.
///
/// The agent runs as root and `path` is the user's to shape: its last part
/// may be flipped to a symlink to a root-only file between a check and an
/// open, or name a FIFO (whose open blocks) or a device (whose open acts).
/// So the path is first resolved to an `O_PATH` descriptor (the last part
/// not followed), which opens no file and runs no driver; the file behind
/// it is checked by `fstat`; only a regular file is then opened, through
/// `/proc/self/fd`, which reaches that very inode with no second lookup.
fn open_output(path: &Path) -> Result<(std::fs::File, std::fs::Metadata), Opened> {
    use std::fs::OpenOptions;
    use std::os::fd::AsRawFd;
    use std::os::unix::fs::OpenOptionsExt;
    let shown = path.display();
    let handle = match OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_PATH | libc::O_NOFOLLOW)
        .open(path)
    {
        Ok(h) => h,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Err(Opened::Missing),
        Err(e) => return Err(Opened::Refused(format!("cannot open {shown}: {e}"))),
    };
    let meta = handle
        .metadata()
        .map_err(|e| Opened::Refused(format!("cannot read {shown}: {e}")))?;
    if !meta.file_type().is_file() {
        let what = kind_of(&meta.file_type());
        return Err(Opened::Refused(format!(
            "{shown} is {what}, not a regular file; only a job's own output file is served"
        )));
    }
    let file = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(format!("/proc/self/fd/{}", handle.as_raw_fd()))
        .map_err(|e| Opened::Refused(format!("cannot open {shown}: {e}")))?;
    Ok((file, meta))
}

/// What a non-regular file is, for the refusal.
fn kind_of(t: &std::fs::FileType) -> &'static str {
    use std::os::unix::fs::FileTypeExt;
    if t.is_symlink() {
        "a symbolic link"
    } else if t.is_dir() {
        "a directory"
    } else if t.is_fifo() {
        "a named pipe (FIFO)"
    } else if t.is_socket() {
        "a socket"
    } else if t.is_char_device() || t.is_block_device() {
        "a device"
    } else {
        "not a regular file"
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::JobId;
    use std::os::unix::fs::PermissionsExt;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    use std::time::Duration;

    const NOBODY: u32 = 65534;

    fn request(workdir: &Path, output: &str) -> LogRequest {
        LogRequest {
            job: JobId(7),
            job_name: "j".into(),
            rank: 0,
            node_rank: 0,
            user: "nobody".into(),
            workdir: workdir.display().to_string(),
            output: Some(output.into()),
            offset: 0,
            max_bytes: 1 << 20,
            attempt: 0,
            step: None,
            stderr: false,
            array: None,
            node: String::new(),
        }
    }

    fn need_root() {
        // The agent runs as root, and only root can hand files to `nobody`.
        assert!(
            nix::unistd::Uid::effective().is_root(),
            "these tests need root (CI runs as root)"
        );
    }

    /// Answers `req` on another thread, failing (not hanging) when the
    /// read blocks.
    fn answer_soon(req: LogRequest) -> LogReply {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let _ = tx.send(read_log(&req));
        });
        rx.recv_timeout(Duration::from_secs(10))
            .expect("the log read blocked for 10 s")
    }

    #[test]
    fn flipping_the_output_to_a_symlink_never_leaks_a_root_file() {
        need_root();
        let dir = tempfile::tempdir().unwrap();
        let secret = dir.path().join("root-only");
        std::fs::write(&secret, "SECRET-ROOT-BYTES").unwrap();
        std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o600)).unwrap();
        let work = dir.path().join("work");
        std::fs::create_dir(&work).unwrap();
        let out = work.join("out.txt");
        let mine = work.join("mine.txt");
        let link = work.join("link");
        std::fs::write(&mine, "users own output, long enough to cover the secret").unwrap();
        nix::unistd::chown(&mine, Some(NOBODY.into()), None).unwrap();
        std::os::unix::fs::symlink(&secret, &link).unwrap();
        // The user's flipper: out.txt is their file, then a symlink to the
        // root file, over and over (rename is atomic, as a user would do).
        let stop = Arc::new(AtomicBool::new(false));
        let flipper = {
            let (stop, out, mine, link) = (stop.clone(), out.clone(), mine.clone(), link.clone());
            let spare_file = work.join("spare-file");
            let spare_link = work.join("spare-link");
            std::thread::spawn(move || {
                let mut flips = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    let _ = std::fs::hard_link(&mine, &spare_file);
                    let _ = std::fs::rename(&spare_file, &out);
                    let _ =
                        std::os::unix::fs::symlink(std::fs::read_link(&link).unwrap(), &spare_link);
                    let _ = std::fs::rename(&spare_link, &out);
                    flips += 1;
                }
                flips
            })
        };
        let (mut chunks, mut refused, mut reads) = (0, 0, 0);
        let started = std::time::Instant::now();
        // Hundreds of reads, and both sides of the race seen (on a loaded
        // machine the flipper may start late), for at most a minute.
        while reads < 500 || chunks == 0 || refused == 0 {
            assert!(
                started.elapsed() < Duration::from_secs(60),
                "{reads} reads: {chunks} served, {refused} refused"
            );
            reads += 1;
            match read_log(&request(&work, "out.txt")) {
                LogReply::Chunk { data, .. } => {
                    assert!(
                        !String::from_utf8_lossy(&data).contains("SECRET"),
                        "the root-only file leaked"
                    );
                    chunks += 1;
                }
                LogReply::Refused { .. } => refused += 1,
                LogReply::Missing { .. } => {}
            }
        }
        stop.store(true, Ordering::Relaxed);
        let flips = flipper.join().unwrap();
        assert!(flips > 0, "the flipper ran");
    }

    #[test]
    fn a_fifo_a_device_and_a_directory_are_refused_at_once() {
        need_root();
        let dir = tempfile::tempdir().unwrap();
        let work = dir.path();
        let fifo = work.join("pipe");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o644)).unwrap();
        nix::unistd::chown(&fifo, Some(NOBODY.into()), None).unwrap();
        let sub = work.join("subdir");
        std::fs::create_dir(&sub).unwrap();
        nix::unistd::chown(&sub, Some(NOBODY.into()), None).unwrap();
        for (output, what) in [
            ("pipe", "named pipe"),
            ("/dev/null", "a device"),
            ("subdir", "a directory"),
        ] {
            match answer_soon(request(work, output)) {
                LogReply::Refused { reason } => assert!(reason.contains(what), "{reason}"),
                other => panic!("{output}: {other:?}"),
            }
        }
    }

    #[test]
    fn the_owners_regular_file_is_served_from_the_offset() {
        need_root();
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("out");
        std::fs::write(&out, "hello world").unwrap();
        nix::unistd::chown(&out, Some(NOBODY.into()), None).unwrap();
        let mut req = request(dir.path(), "out");
        req.offset = 6;
        assert_eq!(
            read_log(&req),
            LogReply::Chunk {
                data: b"world".to_vec(),
                size: 11
            }
        );
        // Someone else's file is not.
        nix::unistd::chown(&out, Some(0.into()), None).unwrap();
        assert!(matches!(read_log(&req), LogReply::Refused { .. }));
        assert!(matches!(
            read_log(&request(dir.path(), "absent")),
            LogReply::Missing { .. }
        ));
    }
}
