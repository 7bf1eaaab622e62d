//! Pure parsers for the kernel's cgroup text formats. Kept free of I/O so every format quirk
//! is pinned by a unit test rather than discovered on a production host.

use std::path::PathBuf;

/// cgroup v1 controllers the kernel may name in a `cgroup` mount's super options. Anything
/// else there (`rw`, `name=systemd`, `clone_children`, ...) is an option, not a controller.
const KNOWN_V1_CONTROLLERS: &[&str] = &[
    "blkio",
    "cpu",
    "cpuacct",
    "cpuset",
    "devices",
    "freezer",
    "hugetlb",
    "memory",
    "misc",
    "net_cls",
    "net_prio",
    "perf_event",
    "pids",
    "rdma",
];

/// One cgroup line of `/proc/self/mountinfo`, reduced to what cgroup discovery needs.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct MountEntry {
    pub mount_point: PathBuf,
    pub fs_type: String,
    pub super_options: Vec<String>,
}

/// A mounted cgroup hierarchy.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum CgroupMount {
    V2 {
        path: PathBuf,
    },
    V1 {
        path: PathBuf,
        controllers: Vec<String>,
    },
}

/// Parses the cgroup and cgroup2 mounts of mountinfo (`ID PARENT MAJ:MIN ROOT MOUNT_POINT
/// OPTS [TAGS...] - FSTYPE SOURCE SUPER_OPTS`), skipping malformed lines instead of failing:
/// one odd mount must not hide the others.
///
/// Every other line is passed over on its file system type, before anything is allocated
/// for it: they are most of a host's, and parsing each in full (its mount point unescaped,
/// its options split into strings) was a third of creating a run's cgroup (~67,000 of
/// ~200,000 instructions, callgrind, in a bwrap run's init before its child starts).
pub(super) fn parse_mountinfo(text: &str) -> Vec<MountEntry> {
    text.lines()
        .filter(|line| is_cgroup_mount(line))
        .filter_map(parse_mountinfo_line)
        .collect()
}

/// Whether a mountinfo line's file system type is `cgroup` or `cgroup2`.
fn is_cgroup_mount(line: &str) -> bool {
    line.split_once(" - ")
        .and_then(|(_, after)| after.split(' ').next())
        .is_some_and(|fs_type| fs_type == "cgroup" || fs_type == "cgroup2")
}

fn parse_mountinfo_line(line: &str) -> Option<MountEntry> {
    let (before, after) = line.split_once(" - ")?;
    let mount_point = before.split(' ').nth(4)?;
    let mut tail = after.split(' ');
    let fs_type = tail.next()?;
    let _source = tail.next()?;
    let super_options = tail.next().unwrap_or("");
    Some(MountEntry {
        mount_point: PathBuf::from(unescape_octal(mount_point)),
        fs_type: fs_type.to_string(),
        super_options: super_options.split(',').map(str::to_string).collect(),
    })
}

/// The kernel escapes space, tab, newline and backslash in mount points as `\ooo`.
fn unescape_octal(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let escaped = bytes
            .get(i + 1..i + 4)
            .filter(|digits| bytes[i] == b'\\' && digits.iter().all(|d| (b'0'..=b'7').contains(d)));
        match escaped {
            Some(digits) => {
                let value = digits
                    .iter()
                    .fold(0u32, |acc, d| acc * 8 + u32::from(d - b'0'));
                out.push(u8::try_from(value).unwrap_or(b'?'));
                i += 4;
            }
            None => {
                out.push(bytes[i]);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Keeps the cgroup mounts, naming each v1 hierarchy's controllers.
pub(super) fn cgroup_mounts(entries: &[MountEntry]) -> Vec<CgroupMount> {
    entries
        .iter()
        .filter_map(|entry| match entry.fs_type.as_str() {
            "cgroup2" => Some(CgroupMount::V2 {
                path: entry.mount_point.clone(),
            }),
            "cgroup" => Some(CgroupMount::V1 {
                path: entry.mount_point.clone(),
                controllers: entry
                    .super_options
                    .iter()
                    .filter(|opt| KNOWN_V1_CONTROLLERS.contains(&opt.as_str()))
                    .cloned()
                    .collect(),
            }),
            _ => None,
        })
        .collect()
}

/// Controller names from a directory name like `cpu,cpuacct`, used when there is no mountinfo
/// entry to ask (a fake tree in tests, or a stripped-down /proc).
pub(super) fn controllers_from_dir_name(name: &str) -> Vec<String> {
    name.split(',')
        .filter(|part| KNOWN_V1_CONTROLLERS.contains(part))
        .map(str::to_string)
        .collect()
}

/// The value of `key` in a flat-keyed file (`memory.events`, `pids.events`, `cpu.stat`,
/// v1 `memory.oom_control`): lines of `key value`.
pub(super) fn keyed_value(text: &str, key: &str) -> Option<u64> {
    text.lines().find_map(|line| {
        let (name, value) = line.trim().split_once(char::is_whitespace)?;
        (name == key).then(|| value.trim().parse().ok()).flatten()
    })
}

/// A single-number file; `max` (v2's "unlimited") and garbage are `None`.
pub(super) fn single_value(text: &str) -> Option<u64> {
    text.trim().parse().ok()
}

/// Member pids from `cgroup.procs`. Non-positive entries are dropped: the kernel shows pids of
/// processes outside our pid namespace as 0, and signalling 0 or -1 would hit our own process
/// group or every process we may signal.
pub(super) fn parse_pids(text: &str) -> Vec<i32> {
    text.split_whitespace()
        .filter_map(|word| word.parse::<i32>().ok())
        .filter(|pid| *pid > 0)
        .collect()
}

/// Controller names from `cgroup.controllers` / `cgroup.subtree_control`. A leading `+` is
/// tolerated because a plain-file test tree stores what was written verbatim.
pub(super) fn parse_controller_list(text: &str) -> Vec<String> {
    text.split_whitespace()
        .map(|word| word.trim_start_matches('+').to_string())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const HYBRID_MOUNTINFO: &str = "\
23 1 0:21 / /sys rw,nosuid,nodev,noexec,relatime shared:7 - sysfs sysfs rw
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
39 31 0:36 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids
40 31 0:37 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,name=systemd
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
42 31 0:39 / /sys/fs/cgroup/cpu,cpuacct rw,relatime shared:9 - cgroup cgroup rw,nosuid,cpu,cpuacct
";

    #[test]
    fn mountinfo_yields_v1_hierarchies_with_their_controllers() {
        let mounts = cgroup_mounts(&parse_mountinfo(HYBRID_MOUNTINFO));
        assert_eq!(
            mounts,
            vec![
                CgroupMount::V1 {
                    path: "/sys/fs/cgroup/cpu".into(),
                    controllers: vec!["cpu".into()]
                },
                CgroupMount::V1 {
                    path: "/sys/fs/cgroup/memory".into(),
                    controllers: vec!["memory".into()]
                },
                CgroupMount::V1 {
                    path: "/sys/fs/cgroup/pids".into(),
                    controllers: vec!["pids".into()]
                },
                CgroupMount::V1 {
                    path: "/sys/fs/cgroup/systemd".into(),
                    controllers: vec![]
                },
                CgroupMount::V2 {
                    path: "/sys/fs/cgroup/unified".into()
                },
                CgroupMount::V1 {
                    path: "/sys/fs/cgroup/cpu,cpuacct".into(),
                    controllers: vec!["cpu".into(), "cpuacct".into()]
                },
            ]
        );
    }

    #[test]
    fn only_cgroup_mounts_are_parsed() {
        let entries = parse_mountinfo(HYBRID_MOUNTINFO);
        assert_eq!(entries.len(), 6, "{entries:?}");
        assert!(entries
            .iter()
            .all(|entry| entry.fs_type.starts_with("cgroup")));
        // A mount point naming a cgroup file system is not one.
        let tmpfs = "60 1 0:50 / /mnt/\\040-\\040cgroup rw - tmpfs cgroup rw\n";
        assert!(parse_mountinfo(tmpfs).is_empty());
    }

    #[test]
    fn mountinfo_pure_v2_host() {
        let text = "29 23 0:26 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:4 - cgroup2 cgroup2 rw,nsdelegate,memory_recursiveprot\n";
        assert_eq!(
            cgroup_mounts(&parse_mountinfo(text)),
            vec![CgroupMount::V2 {
                path: "/sys/fs/cgroup".into()
            }]
        );
    }

    #[test]
    fn mountinfo_unescapes_mount_points_and_skips_garbage() {
        let text = "garbage line\n50 1 0:40 / /mnt/my\\040cgroups rw - cgroup2 none rw\n";
        let entries = parse_mountinfo(text);
        assert_eq!(entries.len(), 1);
        assert_eq!(entries[0].mount_point, PathBuf::from("/mnt/my cgroups"));
        assert_eq!(unescape_octal("a\\134b\\09"), "a\\b\\09");
    }

    #[test]
    fn dir_names_map_to_controllers() {
        assert_eq!(
            controllers_from_dir_name("cpu,cpuacct"),
            vec!["cpu".to_string(), "cpuacct".to_string()]
        );
        assert!(controllers_from_dir_name("unified").is_empty());
    }

    #[test]
    fn v1_oom_control_oom_kill_count() {
        let text = "oom_kill_disable 0\nunder_oom 0\noom_kill 3\n";
        assert_eq!(keyed_value(text, "oom_kill"), Some(3));
        assert_eq!(keyed_value(text, "under_oom"), Some(0));
        assert_eq!(
            keyed_value("oom_kill_disable 0\nunder_oom 0\n", "oom_kill"),
            None
        );
    }

    #[test]
    fn v2_memory_events_distinguishes_oom_from_oom_kill() {
        let text = "low 0\nhigh 0\nmax 17\noom 2\noom_kill 1\noom_group_kill 0\n";
        assert_eq!(keyed_value(text, "oom_kill"), Some(1));
        assert_eq!(keyed_value(text, "oom"), Some(2));
        assert_eq!(keyed_value(text, "max"), Some(17));
    }

    #[test]
    fn pids_events_and_cpu_stat() {
        assert_eq!(keyed_value("max 42\n", "max"), Some(42));
        let cpu_stat = "usage_usec 123456\nuser_usec 100000\nsystem_usec 23456\nnr_periods 0\n";
        assert_eq!(keyed_value(cpu_stat, "usage_usec"), Some(123_456));
        assert_eq!(keyed_value(cpu_stat, "missing"), None);
    }

    #[test]
    fn single_values_treat_max_as_unlimited() {
        assert_eq!(single_value("67108864\n"), Some(67_108_864));
        assert_eq!(single_value("max\n"), None);
    }

    #[test]
    fn pids_drop_zero_and_negative_entries() {
        assert_eq!(parse_pids("12\n0\n-1\nx\n34\n"), vec![12, 34]);
        assert!(parse_pids("").is_empty());
    }

    #[test]
    fn controller_lists_tolerate_plus_prefixes() {
        assert_eq!(
            parse_controller_list("cpuset cpu +memory\n"),
            vec!["cpuset".to_string(), "cpu".into(), "memory".into()]
        );
    }
}
