//! What `/proc` tells us about processes: start times (so a reused pid is not
//! mistaken for our task), zombies, and the tree below a process.

use std::fs;

use super::task::ProcessId;

/// The fields of `/proc/<pid>/stat` we use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Stat {
    state: char,
    ppid: u32,
    pgrp: u32,
    start_ticks: u64,
}

/// Parses `/proc/<pid>/stat`. The command name (field 2) may hold spaces and
/// parentheses, so fields are counted from the last `)`.
fn parse_stat(content: &str) -> Option<Stat> {
    let rest = &content[content.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // fields[0] is field 3 (state); 4 is ppid, 5 pgrp, 22 starttime.
    Some(Stat {
        state: fields.first()?.chars().next()?,
        ppid: fields.get(1)?.parse().ok()?,
        pgrp: fields.get(2)?.parse().ok()?,
        start_ticks: fields.get(19)?.parse().ok()?,
    })
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
        found.retain(|pid| self.procs.iter().any(|(p, s)| p == pid && s.state != 'Z'));
        found
    }

    /// Live (non-zombie) members of process group `pgid`.
    pub fn group_members(&self, pgid: u32) -> Vec<u32> {
        self.procs
            .iter()
            .filter(|(_, s)| s.pgrp == pgid && s.state != 'Z')
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
                start_ticks: 987654,
            })
        );
        assert_eq!(parse_stat("12 (short) S 1"), None);
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
