//! Headless Chromium driven over the DevTools protocol on a pipe
//! (`--remote-debugging-pipe`: JSON messages ending in NUL, read from fd 3,
//! written to fd 4), so a test can load a page, wait for its script, read
//! the DOM, click, and take a screenshot without a WebSocket client.

use std::fs::File;
use std::io::{BufRead, BufReader, Write};
use std::os::fd::AsRawFd;
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

/// A headless Chromium and its one page.
pub struct Browser {
    child: Child,
    to: File,
    from: BufReader<File>,
    next_id: u64,
    session: String,
    /// Chromium's profile, removed with the browser.
    _profile: tempfile::TempDir,
}

impl Browser {
    /// Starts Chromium on `url`; `None` where it is not installed.
    pub fn open(url: &str) -> Option<Browser> {
        let exe = ["chromium", "chromium-browser"]
            .into_iter()
            .find(|c| Command::new(c).arg("--version").output().is_ok())?;
        let cloexec = nix::fcntl::OFlag::O_CLOEXEC;
        let (child_in, parent_out) = nix::unistd::pipe2(cloexec).expect("pipe");
        let (parent_in, child_out) = nix::unistd::pipe2(cloexec).expect("pipe");
        let (cin, cout) = (child_in.as_raw_fd(), child_out.as_raw_fd());
        let profile = tempfile::tempdir().expect("profile dir");
        let mut cmd = Command::new(exe);
        cmd.args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--hide-scrollbars",
            "--no-first-run",
            "--window-size=1280,900",
            "--remote-debugging-pipe",
        ])
        .arg(format!("--user-data-dir={}", profile.path().display()))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
        // SAFETY: only async-signal-safe fcntl and dup2 calls between fork
        // and exec. The pipes are first moved above 10, since either may
        // be fd 3 or 4 already (and dup2 onto itself would keep CLOEXEC).
        unsafe {
            cmd.pre_exec(move || {
                let a = libc::fcntl(cin, libc::F_DUPFD, 10);
                let b = libc::fcntl(cout, libc::F_DUPFD, 10);
                if a < 0 || b < 0 || libc::dup2(a, 3) < 0 || libc::dup2(b, 4) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let child = cmd.spawn().expect("chromium starts");
        drop((child_in, child_out));
        let mut b = Browser {
            child,
            to: File::from(parent_out),
            from: BufReader::new(File::from(parent_in)),
            next_id: 0,
            session: String::new(),
            _profile: profile,
        };
        let target = b.send("Target.createTarget", json!({ "url": url }), false);
        let id = target["targetId"].as_str().expect("a target").to_string();
        let attached = b.send(
            "Target.attachToTarget",
            json!({ "targetId": id, "flatten": true }),
            false,
        );
        b.session = attached["sessionId"]
            .as_str()
            .expect("a session")
            .to_string();
        Some(b)
    }

    /// Sends one command (to the page's session when `page`) and returns
    /// its result; events in between are skipped.
    fn send(&mut self, method: &str, params: Value, page: bool) -> Value {
        self.next_id += 1;
        let id = self.next_id;
        let mut msg = json!({ "id": id, "method": method, "params": params });
        if page {
            msg["sessionId"] = json!(self.session);
        }
        let mut bytes = serde_json::to_vec(&msg).unwrap();
        bytes.push(0);
        self.to.write_all(&bytes).expect("write to chromium");
        loop {
            let mut buf = Vec::new();
            let n = self
                .from
                .read_until(0, &mut buf)
                .expect("read from chromium");
            assert!(n > 0, "chromium closed its pipe during {method}");
            buf.pop();
            let v: Value = serde_json::from_slice(&buf).unwrap_or_default();
            if v["id"] == id {
                assert!(v["error"].is_null(), "{method}: {}", v["error"]);
                return v["result"].clone();
            }
        }
    }

    /// Evaluates `expr` in the page (awaiting a promise) and returns its value.
    pub fn eval(&mut self, expr: &str) -> Value {
        let r = self.send(
            "Runtime.evaluate",
            json!({ "expression": expr, "awaitPromise": true, "returnByValue": true }),
            true,
        );
        r["result"]["value"].clone()
    }

    /// Waits until `expr` is true in the page; the time it took.
    pub fn wait(&mut self, what: &str, expr: &str, timeout: Duration) -> Duration {
        let start = Instant::now();
        while self.eval(expr) != Value::Bool(true) {
            assert!(start.elapsed() < timeout, "the page never showed {what}");
            std::thread::sleep(Duration::from_millis(20));
        }
        start.elapsed()
    }

    /// A PNG of the page as it is drawn now.
    pub fn screenshot(&mut self) -> Vec<u8> {
        use base64::Engine;
        let r = self.send("Page.captureScreenshot", json!({ "format": "png" }), true);
        base64::engine::general_purpose::STANDARD
            .decode(r["data"].as_str().unwrap_or(""))
            .expect("a base64 PNG")
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
