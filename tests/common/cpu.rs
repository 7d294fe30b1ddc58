//! CPU time of a cluster under benchmark: the server and agent processes and
//! everything they start (shims, tasks), and the CLI processes a benchmark
//! runs. Benchmarks print it as CPU-ms per job; nothing asserts on it.
//!
//! Where the cgroup v1 `cpuacct` controller is mounted (hybrid hosts), the
//! meter makes a cgroup of its own there and moves each process it is given
//! into it: children inherit it, so the shims the agents double-fork (which
//! no process reaps as a child of ours) are counted too. Elsewhere it sums
//! `/proc/PID/stat` of the processes themselves, which misses the shims and
//! tasks; `scope()` says which.

use std::path::PathBuf;

/// Counts the CPU time of some processes and their descendants.
pub struct CpuMeter {
    cgroup: Option<PathBuf>,
    pids: Vec<u32>,
}

impl CpuMeter {
    /// A meter with no process yet. `name` makes its cgroup's name unique.
    pub fn new(name: &str) -> CpuMeter {
        let cgroup = cpuacct_mount().and_then(|m| {
            let dir = m.join(format!("gpuq-bench-{name}-{}", std::process::id()));
            std::fs::create_dir_all(&dir).ok()?;
            Some(dir)
        });
        CpuMeter {
            cgroup,
            pids: Vec::new(),
        }
    }

    /// Counts `pid` from now on, with the processes it starts after this.
    pub fn add(&mut self, pid: u32) {
        if let Some(cg) = &self.cgroup {
            if std::fs::write(cg.join("cgroup.procs"), pid.to_string()).is_err() {
                eprintln!("cpu meter: cannot move {pid} into {}", cg.display());
            }
        }
        self.pids.push(pid);
    }

    /// What the figure covers.
    pub fn scope(&self) -> &'static str {
        if self.cgroup.is_some() {
            "server+agents+shims+tasks (cgroup v1 cpuacct)"
        } else {
            "server+agents only (no cgroup v1 cpuacct: shims and tasks not counted)"
        }
    }

    /// CPU milliseconds used so far (take differences).
    pub fn ms(&self) -> f64 {
        if let Some(cg) = &self.cgroup {
            if let Ok(ns) = std::fs::read_to_string(cg.join("cpuacct.usage")) {
                return ns.trim().parse::<f64>().unwrap_or(0.0) / 1e6;
            }
        }
        self.pids.iter().map(|&p| proc_cpu_ms(p)).sum()
    }
}

impl Drop for CpuMeter {
    fn drop(&mut self) {
        let Some(cg) = &self.cgroup else { return };
        // Hand any process still inside back to the parent, then remove it.
        if let (Some(parent), Ok(procs)) = (
            cg.parent(),
            std::fs::read_to_string(cg.join("cgroup.procs")),
        ) {
            for pid in procs.lines() {
                let _ = std::fs::write(parent.join("cgroup.procs"), pid);
            }
        }
        let _ = std::fs::remove_dir(cg);
    }
}

/// The CPU milliseconds of this process's reaped children (the CLI processes
/// a benchmark ran and waited for).
pub fn children_ms() -> f64 {
    use nix::sys::resource::{getrusage, UsageWho};
    match getrusage(UsageWho::RUSAGE_CHILDREN) {
        Ok(u) => {
            let t =
                |tv: nix::sys::time::TimeVal| tv.tv_sec() as f64 * 1e3 + tv.tv_usec() as f64 / 1e3;
            t(u.user_time()) + t(u.system_time())
        }
        Err(_) => 0.0,
    }
}

/// utime + stime (+ reaped children) of a live process, in ms.
pub fn proc_cpu_ms(pid: u32) -> f64 {
    stat_ms(pid, 11..15)
}

/// utime + stime of a live process itself (no children), in seconds.
pub fn own_cpu_s(pid: u32) -> f64 {
    stat_ms(pid, 11..13) / 1e3
}

/// The sum of some `/proc/PID/stat` clock-tick fields, in ms; `fields`
/// count from 0 after the command name (0 is field 3, the state; 11..15
/// are utime, stime, cutime, cstime). 0 once the process is gone.
fn stat_ms(pid: u32, fields: std::ops::Range<usize>) -> f64 {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return 0.0;
    };
    // Fields after the command name, which is in parentheses.
    let Some(rest) = stat.rsplit_once(')').map(|(_, r)| r) else {
        return 0.0;
    };
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks: f64 = fields
        .filter_map(|i| f.get(i).and_then(|v| v.parse::<f64>().ok()))
        .sum();
    let hz = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)
        .ok()
        .flatten()
        .unwrap_or(100) as f64;
    ticks * 1e3 / hz
}

/// A `/proc/PID/status` value in kB (`key` like "VmRSS:"); 0 if absent.
pub fn status_kb(pid: u32, key: &str) -> f64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix(key))
        .and_then(|r| r.split_whitespace().next()?.parse().ok())
        .unwrap_or(0.0)
}

/// Resident memory of a live process, MiB.
pub fn rss_mib(pid: u32) -> f64 {
    status_kb(pid, "VmRSS:") / 1024.0
}

fn cpuacct_mount() -> Option<PathBuf> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    info.lines().find_map(|l| {
        let (pre, post) = l.split_once(" - ")?;
        let mut post = post.split_whitespace();
        if post.next()? != "cgroup" {
            return None;
        }
        let opts = post.nth(1)?;
        if !opts.split(',').any(|o| o == "cpuacct") {
            return None;
        }
        let mount = PathBuf::from(pre.split_whitespace().nth(4)?);
        mount.join("cgroup.procs").exists().then_some(mount)
    })
}
