//! What `/proc` tells us about processes: start times (so a reused pid is not
//! mistaken for our task), zombies, and the tree below a process.
//!
//! The tree below the shim is found by walking down the kernel's children
//! lists (`/proc/<pid>/task/<tid>/children`), which costs a few reads per
//! process of the task. A `Snapshot` of every process on the node (hundreds of
//! `stat` files) is the fallback for a kernel built without those lists or a
//! shim that could not become a subreaper (then orphans leave its tree, and
//! the process group has to be searched node-wide).

use std::collections::HashSet;
use std::fs;
use std::io;

use super::task::ProcessId;

/// The fields of `/proc/<pid>/stat` we use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Stat {
    state: char,
    ppid: u32,
    pgrp: u32,
    threads: u32,
    start_ticks: u64,
}

/// Parses `/proc/<pid>/stat`. The command name (field 2) may hold spaces and
/// parentheses, so fields are counted from the last `)`.
fn parse_stat(content: &str) -> Option<Stat> {
    let rest = &content[content.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // fields[0] is field 3 (state); 4 is ppid, 5 pgrp, 20 num_threads,
    // 22 starttime.
    Some(Stat {
        state: fields.first()?.chars().next()?,
        ppid: fields.get(1)?.parse().ok()?,
        pgrp: fields.get(2)?.parse().ok()?,
        threads: fields.get(17)?.parse().ok()?,
        start_ticks: fields.get(19)?.parse().ok()?,
    })
}

impl Stat {
    /// Whether the process still runs: not a zombie, or a zombie leader
    /// whose other threads still run (a zombie counts itself in num_threads;
    /// threads that ended are not counted).
    fn is_live(&self) -> bool {
        self.state != 'Z' || self.threads > 1
    }
}

fn stat(pid: u32) -> Option<Stat> {
    parse_stat(&fs::read_to_string(format!("/proc/{pid}/stat")).ok()?)
}

/// The process with this pid now, if there is one.
pub fn identify(pid: u32) -> Option<ProcessId> {
    stat(pid).map(|s| ProcessId {
        pid,
        start_ticks: s.start_ticks,
    })
}

/// Whether the process still runs: same pid, same start time, not a zombie.
pub fn is_running(id: &ProcessId) -> bool {
    matches!(stat(id.pid), Some(s) if s.start_ticks == id.start_ticks && s.state != 'Z')
}

/// Appends the pids listed in one thread's `children` file.
fn read_children(path: &str, out: &mut Vec<u32>) -> io::Result<()> {
    let list = fs::read_to_string(path)?;
    out.extend(
        list.split_whitespace()
            .filter_map(|p| p.parse::<u32>().ok()),
    );
    Ok(())
}

/// Whether this kernel lists each thread's children in `/proc`
/// (CONFIG_PROC_CHILDREN).
pub fn has_children_lists() -> bool {
    let me = std::process::id();
    fs::metadata(format!("/proc/{me}/task/{me}/children")).is_ok()
}

/// The children of this process, zombies included.
pub fn own_children() -> io::Result<Vec<u32>> {
    let me = std::process::id();
    fs::metadata(format!("/proc/{me}/task/{me}/children"))?;
    Ok(children(me))
}

/// The children of every thread of `pid` (none when it is gone).
fn children(pid: u32) -> Vec<u32> {
    let mut out = Vec::new();
    let Ok(threads) = fs::read_dir(format!("/proc/{pid}/task")) else {
        return out;
    };
    for tid in threads.filter_map(|t| t.ok()?.file_name().into_string().ok()) {
        // A thread that just exited has no list left; its children moved to
        // another thread or up to the subreaper, where the caller's next
        // pass finds them.
        let _ = read_children(&format!("/proc/{pid}/task/{tid}/children"), &mut out);
    }
    out
}

/// Live (non-zombie) processes below this process, found by walking the
/// children lists down. Like a `Snapshot`, it sees one moment
/// (a racing fork may be missed); callers repeat until nothing is left.
pub fn own_descendants() -> io::Result<Vec<u32>> {
    let mut pending = own_children()?;
    let mut seen: HashSet<u32> = HashSet::new();
    let mut found = Vec::new();
    while let Some(pid) = pending.pop() {
        if !seen.insert(pid) {
            continue;
        }
        // A dead process has no children: they were reparented when it
        // exited.
        match stat(pid) {
            Some(s) if s.is_live() => {
                found.push(pid);
                // One thread: the leader itself (were it gone, it would still
                // be counted beside the live one).
                if s.threads == 1 {
                    let _ =
                        read_children(&format!("/proc/{pid}/task/{pid}/children"), &mut pending);
                } else {
                    pending.extend(children(pid));
                }
            }
            _ => {}
        }
    }
    Ok(found)
}

/// Every process on the node, read from `/proc` at one moment (a racing fork
/// may be missed; callers repeat until nothing is left).
pub struct Snapshot {
    procs: Vec<(u32, Stat)>,
}

impl Snapshot {
    pub fn take() -> Snapshot {
        let procs = fs::read_dir("/proc")
            .into_iter()
            .flatten()
            .filter_map(|entry| entry.ok()?.file_name().to_str()?.parse::<u32>().ok())
            .filter_map(|pid| Some((pid, stat(pid)?)))
            .collect();
        Snapshot { procs }
    }

    /// Live (non-zombie) processes below `root`, found by parent links.
    pub fn descendants(&self, root: u32) -> Vec<u32> {
        let mut found = vec![root];
        let mut i = 0;
        while i < found.len() {
            let parent = found[i];
            let children: Vec<u32> = self
                .procs
                .iter()
                .filter(|(pid, s)| s.ppid == parent && !found.contains(pid))
                .map(|(pid, _)| *pid)
                .collect();
            found.extend(children);
            i += 1;
        }
        found.remove(0);
        found.retain(|pid| self.procs.iter().any(|(p, s)| p == pid && s.is_live()));
        found
    }

    /// Live (non-zombie) members of process group `pgid`.
    pub fn group_members(&self, pgid: u32) -> Vec<u32> {
        self.procs
            .iter()
            .filter(|(_, s)| s.pgrp == pgid && s.is_live())
            .map(|(pid, _)| *pid)
            .collect()
    }

    /// Zombie children of `parent`, waiting to be reaped.
    pub fn zombie_children(&self, parent: u32) -> Vec<u32> {
        self.procs
            .iter()
            .filter(|(_, s)| s.ppid == parent && s.state == 'Z')
            .map(|(pid, _)| *pid)
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_parsing_survives_odd_command_names() {
        let line = "4242 (we ird) (x)) S 17 4242 4242 0 -1 4194560 128 0 0 0 3 1 0 0 20 0 1 0 987654 1000 200 18446744073709551615";
        assert_eq!(
            parse_stat(line),
            Some(Stat {
                state: 'S',
                ppid: 17,
                pgrp: 4242,
                threads: 1,
                start_ticks: 987654,
            })
        );
        assert_eq!(parse_stat("12 (short) S 1"), None);
    }

    /// Waits (boundedly) until `ready` holds, for processes that are starting
    /// or ending.
    fn eventually(mut ready: impl FnMut() -> bool) -> bool {
        (0..500).any(|_| {
            let done = ready();
            if !done {
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
            done
        })
    }

    #[test]
    fn the_walk_finds_grandchildren_and_skips_zombies() {
        assert!(has_children_lists(), "the kernel lists children in /proc");
        let mut tree = std::process::Command::new("sh")
            .args(["-c", "sleep 30 & sleep 30 & wait"])
            .spawn()
            .unwrap();
        let sh = tree.id();
        let sleeps = || {
            Snapshot::take()
                .procs
                .iter()
                .filter(|(_, s)| s.ppid == sh)
                .map(|(p, _)| *p)
                .collect::<Vec<u32>>()
        };
        assert!(eventually(|| sleeps().len() == 2));
        // The walk and the node-wide scan see the same tree.
        let ours = |found: Vec<u32>| {
            let mut ours: Vec<u32> = found
                .into_iter()
                .filter(|p| *p == sh || sleeps().contains(p))
                .collect();
            ours.sort();
            ours
        };
        let mut expected = sleeps();
        expected.push(sh);
        expected.sort();
        assert_eq!(ours(own_descendants().unwrap()), expected);
        assert_eq!(
            ours(Snapshot::take().descendants(std::process::id())),
            expected
        );

        let mut done = std::process::Command::new("true").spawn().unwrap();
        let gone = done.id();
        assert!(eventually(|| stat(gone).is_some_and(|s| s.state == 'Z')));
        assert!(own_children().unwrap().contains(&gone));
        assert!(!own_descendants().unwrap().contains(&gone));
        done.wait().unwrap();

        for sleep in sleeps() {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(sleep as i32),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
        tree.wait().unwrap();
        assert!(!own_descendants().unwrap().contains(&sh));
    }

    #[test]
    fn this_process_is_running_and_a_changed_start_time_is_not() {
        let me = identify(std::process::id()).unwrap();
        assert!(is_running(&me));
        let reused = ProcessId {
            start_ticks: me.start_ticks + 1,
            ..me
        };
        assert!(!is_running(&reused));
    }
}
