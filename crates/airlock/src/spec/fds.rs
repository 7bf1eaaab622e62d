//! Every fixed descriptor number of a run, in one place, so that no two pipes can be placed on
//! the same number. Three processes hold them: the init (placed there by the supervisor), the
//! init's child (the sandbox's setup, then its PID 1, placed there by the init's fork), and a
//! wrapping tool (placed by the child before the tool's exec).
//!
//! The child keeps the init's number for the gate's channel, which it uses through the init's
//! own handle. The command pipe is claimed again by the child (`sys::claim_inherited_fd`), and
//! the registry of claims is process memory that the fork copies: a number the init claimed
//! can never be claimed in the child, so the child's command pipe has a number of its own. The
//! unit tests below check that the numbers of each process are distinct and above the standard
//! descriptors, and that the child claims no number the init claimed.

use std::os::fd::RawFd;

// In the init.

/// The control pipe: the spec (when the init was executed rather than forked with it in
/// memory), then one `StopReason` per line (or a warm run's "started"); EOF means the
/// supervisor died.
pub const CONTROL_FD: RawFd = 3;
/// The event pipe: one `InitEvent` per line.
pub const EVENTS_FD: RawFd = 4;
/// The egress gate's channel, for a run with `InitSpec::egress`: one end of a socketpair
/// whose other end the supervisor holds. The sandbox's setup sends the gate's sockets over it
/// (see `airlock_egress::SandboxSockets::send`), then closes it; the program never holds it.
/// The child holds it at the same number.
pub const GATE_FD: RawFd = 5;
/// A warm init's command pipe (read end), which it hands to the sandbox's PID 1 (at
/// [`CHILD_GO_FD`]); the supervisor writes one `WarmGo` into it and closes it.
pub const GO_FD: RawFd = 6;

/// A warm pool's shared root ([`crate::spec::InitSpec::shared_root`]): the user and the mount
/// namespace that hold it, which the init hands to its child at the same numbers and the
/// child enters before it makes the sandbox's own (see `init::native`).
pub const SHARED_ROOT_FDS: [RawFd; 2] = [10, 11];

// In the init's child (the sandbox's setup and PID 1), besides GATE_FD and SHARED_ROOT_FDS.

/// The setup pipe (close-on-exec: EOF at exec means success).
pub const SETUP_FD: RawFd = 3;
/// The exit-report pipe from the native sandbox's PID 1.
pub const REPORT_FD: RawFd = 4;
/// The write end of a wrapped tool's status pipe, until it is moved to the descriptor the
/// tool expects ([`BWRAP_STATUS_FD`]).
pub const TOOL_STATUS_FD: RawFd = 7;
/// A warm sandbox's command pipe in PID 1, which claims it.
pub const CHILD_GO_FD: RawFd = 8;
/// A warm sandbox's shared root in the child, which claims them and enters both before it
/// makes the sandbox's own namespaces (see `init::native`). A native child only: no tool.
pub const CHILD_SHARED_ROOT_FDS: [RawFd; 2] = [12, 13];
/// The native sandbox's cgroup hand-off (a `SOCK_SEQPACKET` socket), which the child
/// claims: the child makes its namespaces while the init makes the run's cgroup, then waits
/// here for one message, with the cgroup's membership files (opened by the init) or without
/// (no cgroup), before it makes its cgroup namespace and starts PID 1.
pub const CGROUP_HANDOFF_FD: RawFd = 9;

// In an interpreter zygote's template (`airlock-zygote`).

/// The template's control socket (`SOCK_SEQPACKET`) from the host: the spec, then one
/// message per run with its descriptors. A zygote child places its report socket at
/// [`SETUP_FD`] (the setup pipe's number: it carries the same messages).
pub const ZYGOTE_CONTROL_FD: RawFd = 3;

// In a wrapping tool.

/// Where bwrap reads airlock's two seccomp filters (`--add-seccomp-fd`: the syscall table,
/// then the argument checks).
pub const BWRAP_SECCOMP_FDS: [RawFd; 2] = [10, 11];
/// Where bwrap writes its JSON status (`--json-status-fd`).
pub const BWRAP_STATUS_FD: RawFd = 12;
/// The first of the descriptors bwrap binds protect_git's directories from
/// (`--bind-fd`/`--ro-bind-fd`), one per directory, consecutive.
pub const BWRAP_GIT_FDS_FIRST: RawFd = 13;
/// The descriptor held open before a threaded tool starts (runsc), so that its descriptor
/// table is sized once instead of growing (each growth waits for an RCU grace period).
pub const PRESIZED_FD: RawFd = 1023;

/// The numbers the init holds.
#[cfg(test)]
const IN_INIT: [RawFd; 6] = [
    CONTROL_FD,
    EVENTS_FD,
    GATE_FD,
    GO_FD,
    SHARED_ROOT_FDS[0],
    SHARED_ROOT_FDS[1],
];
/// The numbers the init's child holds.
#[cfg(test)]
const IN_CHILD: [RawFd; 6] = [
    SETUP_FD,
    REPORT_FD,
    GATE_FD,
    CHILD_GO_FD,
    TOOL_STATUS_FD,
    CGROUP_HANDOFF_FD,
];
/// The numbers the init's child claims for itself.
#[cfg(test)]
const CLAIMED_IN_CHILD: [RawFd; 4] = [
    CHILD_GO_FD,
    CGROUP_HANDOFF_FD,
    CHILD_SHARED_ROOT_FDS[0],
    CHILD_SHARED_ROOT_FDS[1],
];

#[cfg(test)]
mod tests {
    use super::*;

    fn distinct_and_above_stdio(fds: &[RawFd]) -> bool {
        let mut sorted = fds.to_vec();
        sorted.sort_unstable();
        sorted.dedup();
        sorted.len() == fds.len() && sorted.iter().all(|fd| *fd > 2)
    }

    #[test]
    fn no_two_pipes_share_a_number_in_one_process() {
        assert!(distinct_and_above_stdio(&IN_INIT));
        assert!(distinct_and_above_stdio(&IN_CHILD));
        // A native sandbox's child (no tool) also holds a shared root's namespaces.
        let mut native = IN_CHILD.to_vec();
        native.extend(CHILD_SHARED_ROOT_FDS);
        assert!(distinct_and_above_stdio(&native));
        let mut in_tool = IN_CHILD.to_vec();
        in_tool.extend(BWRAP_SECCOMP_FDS);
        in_tool.extend([BWRAP_STATUS_FD, BWRAP_GIT_FDS_FIRST, PRESIZED_FD]);
        assert!(distinct_and_above_stdio(&in_tool));
    }

    #[test]
    fn the_child_claims_no_number_the_init_claimed() {
        assert!(CLAIMED_IN_CHILD.iter().all(|fd| !IN_INIT.contains(fd)));
    }
}
