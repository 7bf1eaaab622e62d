//! Finding and signalling every descendant of a process through /proc, for runs without a
//! cgroup. The init is a child subreaper, so orphans of the program stay its descendants.

use std::collections::{HashMap, HashSet};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

/// The fields of a `/proc/<pid>/stat` text after the command name, from the state (field 3)
/// on. The command name may contain spaces and parentheses, so the fields after the last `)`
/// are the reliable ones.
pub fn fields_after_name(stat: &str) -> Option<std::str::SplitWhitespace<'_>> {
    Some(stat[stat.rfind(')')? + 1..].split_whitespace())
}

/// The parent pid from the text of `/proc/<pid>/stat`.
pub fn parent_from_stat(stat: &str) -> Option<i32> {
    fields_after_name(stat)?.nth(1)?.parse().ok()
}

/// Whether `/proc/<pid>/stat` shows a process that is already exiting (`PF_EXITING`): it can
/// no longer run code, so it needs no signal, only time to finish.
pub fn stat_shows_exiting(stat: &str) -> bool {
    const PF_EXITING: u64 = 0x4;
    fields_after_name(stat)
        .and_then(|mut fields| fields.nth(6))
        .and_then(|flags| flags.parse::<u64>().ok())
        .is_some_and(|flags| flags & PF_EXITING != 0)
}

/// Whether `pid` is already exiting (false when it is gone or unreadable).
pub fn is_exiting(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| stat_shows_exiting(&stat))
}

/// The pids of every process on the host now (none when /proc cannot be read).
fn host_pids() -> impl Iterator<Item = i32> {
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .filter_map(|entry| entry.ok()?.file_name().to_str()?.parse().ok())
}

/// Every process on the host and its parent.
fn process_parents() -> HashMap<i32, i32> {
    host_pids()
        .filter_map(|pid| {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
            Some((pid, parent_from_stat(&stat)?))
        })
        .collect()
}

/// How many tasks (threads included: RLIMIT_NPROC counts each) run with real uid `uid` on the
/// host now, from `/proc/<pid>/status`. Unreadable entries (gone meanwhile) count as none.
pub fn tasks_of_real_uid(uid: u32) -> u64 {
    host_pids()
        .filter_map(|pid| {
            let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
            tasks_if_real_uid(&status, uid)
        })
        .sum()
}

/// The `Threads:` count of a `/proc/<pid>/status` text whose real uid is `uid`.
pub fn tasks_if_real_uid(status: &str, uid: u32) -> Option<u64> {
    let field = |key: &str| {
        status
            .lines()
            .find_map(|line| line.strip_prefix(key))
            .and_then(|rest| rest.split_whitespace().next())
    };
    let real_uid: u32 = field("Uid:")?.parse().ok()?;
    (real_uid == uid).then(|| field("Threads:").and_then(|n| n.parse().ok()).unwrap_or(1))
}

/// All descendants of `root` (not `root` itself), from a parent map.
pub fn descendants_in(parents: &HashMap<i32, i32>, root: i32) -> Vec<i32> {
    let mut children: HashMap<i32, Vec<i32>> = HashMap::new();
    for (&pid, &parent) in parents {
        children.entry(parent).or_default().push(pid);
    }
    let mut found = Vec::new();
    let mut seen = HashSet::new();
    let mut stack = vec![root];
    while let Some(pid) = stack.pop() {
        for &child in children.get(&pid).map(Vec::as_slice).unwrap_or(&[]) {
            if seen.insert(child) {
                found.push(child);
                stack.push(child);
            }
        }
    }
    found
}

/// Sends `signal` to every live descendant of `root`; returns how many were signalled.
pub fn signal_descendants(root: Pid, signal: Signal) -> usize {
    let targets = descendants_in(&process_parents(), root.as_raw());
    targets
        .iter()
        .filter(|&&pid| kill(Pid::from_raw(pid), signal).is_ok())
        .count()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tasks_are_counted_for_the_real_uid_only() {
        let status = "Name:\tpython3\nUid:\t65534\t0\t0\t0\nThreads:\t4\n";
        assert_eq!(tasks_if_real_uid(status, 65534), Some(4));
        assert_eq!(tasks_if_real_uid(status, 0), None);
        assert!(tasks_of_real_uid(nix::unistd::getuid().as_raw()) >= 1);
    }

    #[test]
    fn parent_is_read_after_the_command_name() {
        assert_eq!(parent_from_stat("42 (a) b) c) S 7 42 42 0"), Some(7));
        assert_eq!(parent_from_stat("1 (init) S 0 1 1"), Some(0));
        assert_eq!(parent_from_stat("garbage"), None);
    }

    #[test]
    fn exiting_is_read_from_the_flags_field() {
        let exiting = "628 (bw) r) R 623 628 628 0 -1 4194636 80 62 0 0";
        let running = "628 (bwrap) R 623 628 628 0 -1 4194624 80 62 0 0";
        assert!(stat_shows_exiting(exiting));
        assert!(!stat_shows_exiting(running));
        assert!(!stat_shows_exiting("garbage"));
    }

    #[test]
    fn a_live_process_is_not_exiting() {
        assert!(!is_exiting(std::process::id() as i32));
    }

    #[test]
    fn descendants_cover_grandchildren_but_not_siblings() {
        let parents = HashMap::from([(2, 1), (3, 2), (4, 3), (5, 1), (6, 99)]);
        let mut found = descendants_in(&parents, 2);
        found.sort();
        assert_eq!(found, vec![3, 4]);
    }
}
