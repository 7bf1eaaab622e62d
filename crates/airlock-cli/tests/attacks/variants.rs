//! The suite's variations of the untrusted profile: the gaps a backend may report without
//! mounts, and the profile with one layer switched off.

use crate::suite::User;

/// What a backend cannot enforce under the untrusted profile when airlock cannot mount (the
/// CLI runs unprivileged): the tool's own tmpfs mounts lack the caps that the init's capped
/// mounts (its in-memory run directory) give it as root. Such runs must be refused by default
/// naming exactly these layers; the suite then accepts the degradation (`--allow-degraded`)
/// and judges every attack, so an attack on a gap must be reported as not enforced (the layer
/// absent from the result) and every other attack contained. Keyed by backend and its extra
/// flags.
type GapEntry = (
    &'static str,
    &'static [&'static str],
    &'static [&'static str],
);
const GAPS_WITHOUT_MOUNTS: &[GapEntry] = &[
    ("bwrap", &[], &["inode_quota"]),
    ("gvisor", &[], &["inode_quota"]),
    // podman 4 refuses `nr_inodes` on its tmpfs and binds the workdir.
    (
        "container",
        &["--container-runtime", "podman"],
        &["disk_quota", "inode_quota"],
    ),
];

pub fn known_gaps(backend: Option<&str>, flags: &[&str], user: User) -> &'static [&'static str] {
    if user == User::Root {
        return &[];
    }
    GAPS_WITHOUT_MOUNTS
        .iter()
        .find(|(name, with, _)| Some(*name) == backend && *with == flags)
        .map_or(&[][..], |(_, _, gaps)| *gaps)
}

/// One layer removed from the untrusted profile for one attack.
pub struct Weakening {
    pub attack: &'static str,
    /// Extra flags; `{dir}` is the attack's own host directory.
    pub flags: &'static [&'static str],
    /// Whether the attack must now get through.
    pub escapes: bool,
    pub why: &'static str,
}

pub const WEAKENINGS: &[Weakening] = &[
    Weakening {
        attack: "tcp_to_host_listener",
        flags: &["--network", "host", "--allow-degraded"],
        escapes: true,
        why: "host network: no net namespace, Landlock TCP rules or socket-family filter",
    },
    Weakening {
        attack: "netlink_host_interfaces",
        flags: &["--network", "host", "--allow-degraded"],
        escapes: true,
        why: "host network: the host's interfaces are visible",
    },
    Weakening {
        attack: "host_unix_abstract_socket",
        flags: &["--network", "host", "--allow-degraded"],
        escapes: false,
        why:
            "host network shares the abstract socket namespace, but Landlock's scope still refuses",
    },
    Weakening {
        attack: "read_host_tmp_canary",
        flags: &["--ro", "{dir}"],
        escapes: true,
        why: "a read-only bind of the canary's directory makes it visible",
    },
    Weakening {
        attack: "write_caller_dir",
        flags: &["--ro", "{dir}"],
        escapes: false,
        why: "the directory is bound read-only: visible, still not writable",
    },
    Weakening {
        attack: "inode_bomb",
        flags: &["--backend", "bwrap", "--disk-run-dir", "--allow-degraded"],
        escapes: true,
        why: "bwrap's own tmpfs has no inode cap: only the init's capped mounts stop it",
    },
    Weakening {
        attack: "memory_bomb",
        flags: &["--no-cgroup"],
        escapes: false,
        why: "no cgroup: RLIMIT_AS still caps each process (status exited, MemoryError)",
    },
];
