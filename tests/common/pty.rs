//! A terminal for tests: a pseudo-terminal opened here, whose slave is a
//! child's controlling terminal (its stdin, stdout and stderr), as a
//! terminal emulator or sshd gives one. The test types into the master,
//! reads what the child shows, and resizes it.

use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// A child on a terminal of its own.
pub struct Terminal {
    master: File,
    child: Child,
    /// Everything the child has shown.
    seen: Arc<Mutex<Vec<u8>>>,
    /// How much of `seen` `expect` has consumed.
    mark: usize,
    /// Set once the reader has read the last of it (every holder of the
    /// slave closed it).
    closed: Arc<std::sync::atomic::AtomicBool>,
}

impl Terminal {
    /// Starts `cmd` on a new terminal of `rows` x `cols`.
    pub fn spawn(mut cmd: Command, rows: u16, cols: u16) -> Terminal {
        let size = nix::pty::Winsize {
            ws_row: rows,
            ws_col: cols,
            ws_xpixel: 0,
            ws_ypixel: 0,
        };
        let pty = nix::pty::openpty(Some(&size), None).expect("openpty");
        let slave: OwnedFd = pty.slave;
        let io = || Stdio::from(slave.try_clone().expect("dup the slave"));
        cmd.stdin(io()).stdout(io()).stderr(io());
        // SAFETY: only async-signal-safe system calls before exec.
        unsafe {
            cmd.pre_exec(|| {
                if libc::setsid() < 0 || libc::ioctl(0, libc::TIOCSCTTY, 0) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let child = cmd.spawn().expect("start the child on the terminal");
        drop(slave);
        let master = File::from(pty.master);
        let seen = Arc::new(Mutex::new(Vec::new()));
        let mut reader = master.try_clone().expect("dup the master");
        let sink = seen.clone();
        let closed = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let done = closed.clone();
        std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            // EIO once the child and everything it started closed the slave.
            while let Ok(n) = reader.read(&mut buf) {
                if n == 0 {
                    break;
                }
                sink.lock().unwrap().extend_from_slice(&buf[..n]);
            }
            done.store(true, std::sync::atomic::Ordering::SeqCst);
        });
        Terminal {
            master,
            child,
            seen,
            mark: 0,
            closed,
        }
    }

    /// Types `keys`.
    pub fn send(&mut self, keys: &str) {
        self.master.write_all(keys.as_bytes()).expect("type");
    }

    /// How many bytes have been shown so far.
    pub fn shown_len(&self) -> usize {
        self.seen.lock().unwrap().len()
    }

    /// Everything shown so far.
    pub fn screen(&self) -> String {
        String::from_utf8_lossy(&self.seen.lock().unwrap()).into_owned()
    }

    /// Waits until `needle` is shown after what earlier calls consumed,
    /// and consumes up to its end; what was shown from the mark on.
    pub fn expect(&mut self, needle: &str, timeout: Duration) -> String {
        let start = Instant::now();
        loop {
            {
                let seen = self.seen.lock().unwrap();
                let tail = &seen[self.mark.min(seen.len())..];
                let found = tail
                    .windows(needle.len().max(1))
                    .position(|w| w == needle.as_bytes());
                if let Some(at) = found {
                    let end = at + needle.len();
                    let shown = String::from_utf8_lossy(&tail[..end]).into_owned();
                    self.mark += end;
                    return shown;
                }
            }
            if start.elapsed() > timeout {
                panic!(
                    "{needle:?} not shown within {timeout:?}; the terminal shows:\n{}",
                    self.screen()
                );
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Changes the terminal's size; its foreground process gets SIGWINCH.
    pub fn resize(&self, rows: u16, cols: u16) {
        let size = libc::winsize {
            ws_row: rows,
            ws_col: cols,
            ws_xpixel: 0,
            ws_ypixel: 0,
        };
        // SAFETY: TIOCSWINSZ reads the valid struct given.
        let rc = unsafe { libc::ioctl(self.master.as_raw_fd(), libc::TIOCSWINSZ, &size) };
        assert_eq!(rc, 0, "resize the terminal");
    }

    /// Waits for the child to exit (killed after `timeout`).
    pub fn wait(&mut self, timeout: Duration) -> ExitStatus {
        let start = Instant::now();
        loop {
            if let Some(st) = self.child.try_wait().expect("wait") {
                // What it wrote last may still be on its way to the reader.
                let drained = Instant::now();
                while !self.closed.load(std::sync::atomic::Ordering::SeqCst)
                    && drained.elapsed() < Duration::from_secs(5)
                {
                    std::thread::sleep(Duration::from_millis(5));
                }
                return st;
            }
            if start.elapsed() > timeout {
                let _ = self.child.kill();
                panic!(
                    "the child did not exit within {timeout:?}; the terminal shows:\n{}",
                    self.screen()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Whether the terminal is in its usual (cooked) mode: echo and line
    /// editing on, as a program that took raw mode must leave it.
    pub fn is_cooked(&self) -> bool {
        use nix::sys::termios::{tcgetattr, LocalFlags};
        let t = tcgetattr(&self.master).expect("read the terminal's mode");
        t.local_flags
            .contains(LocalFlags::ECHO | LocalFlags::ICANON | LocalFlags::ISIG)
    }

    /// The child's pid.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for Terminal {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
