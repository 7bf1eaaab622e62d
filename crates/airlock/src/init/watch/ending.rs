//! The run's end on the init's side: every process the program left killed and reaped before
//! the outcome is decided (the cgroup's members and the init's descendants), with patience
//! for members that are already on their way out.

use std::os::fd::AsFd;
use std::time::{Duration, Instant};

use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::sys::signal::Signal;

use super::Watch;
use crate::linux::tree;

/// How long members that are already exiting may take before they are killed like the rest.
const EXIT_PATIENCE: Duration = Duration::from_millis(50);
/// How long members that are not exiting yet get before the first kill round, once the
/// program's process has ended: a wrapper tool's PID 1 reports the program's status to the
/// tool and exits right after, and the tool can end first. Found in the cgroup at that
/// moment, it was killed like a survivor: a freeze that cannot complete while it tears down
/// its namespaces, then 2 ms sleeps until the cgroup emptied, ~3 ms in about one bwrap run in
/// ten at load 5 (`raw_syscalls` traces, issue 19). A real survivor is killed at most this
/// much (plus one 2 ms wait for a child event) later, still before the result.
const SETTLE_PATIENCE: Duration = Duration::from_millis(1);
/// How long the init keeps killing after the program's end before it gives up on members
/// that will not die (stuck in an uninterruptible wait). It returns as soon as the tree is
/// empty; the bound only matters on a host so loaded that a fork bomb's kill rounds crawl
/// (5 s once left 57 of a bomb's processes alive at load 80), and a late result is better
/// than a survivor.
const KILL_PATIENCE: Duration = Duration::from_secs(30);

impl Watch<'_> {
    pub(super) fn signal_tree(&self, signal: Signal) {
        if let Some(cgroup) = &self.run.cgroup {
            let _ = if signal == Signal::SIGKILL {
                cgroup.kill_all()
            } else {
                cgroup.signal_all(signal)
            };
        }
        tree::signal_descendants(nix::unistd::getpid(), signal);
    }

    /// After the program exits, nothing it started may survive: kill and reap until the init
    /// has no children left (it is a subreaper, so orphans come back to it).
    ///
    /// It looks before it kills: with no child left the init has no descendant at all, and an
    /// empty cgroup has no member, so the kill round (a walk of every process in /proc, about
    /// 2-3 ms) would signal nobody. Members that are already exiting (a wrapper tool's PID 1
    /// tearing down its namespaces after the tool returned) get a short wait for their
    /// SIGCHLD first: a freeze would stall on them and a signal would change nothing; so do, for
    /// [`SETTLE_PATIENCE`], members that have not started exiting yet.
    pub(super) fn kill_everything(&mut self) {
        let start = Instant::now();
        let deadline = start + KILL_PATIENCE;
        let mut patient = true;
        loop {
            let no_children = self.reap_all();
            let members = self.cgroup_members();
            if (no_children && members.is_empty()) || Instant::now() >= deadline {
                return;
            }
            let settling = start.elapsed() < SETTLE_PATIENCE;
            patient = patient
                && start.elapsed() < EXIT_PATIENCE
                && !members.is_empty()
                && (settling || members.iter().all(|&pid| tree::is_exiting(pid)));
            if !patient {
                self.signal_tree(Signal::SIGKILL);
            }
            // Settling members may not be the init's children yet (no SIGCHLD to wake it):
            // the wait's timeout bounds it then.
            if !self.reap_all() || settling {
                self.wait_for_child_event(Duration::from_millis(2));
            }
        }
    }

    fn cgroup_members(&self) -> Vec<i32> {
        let Some(cgroup) = &self.run.cgroup else {
            return Vec::new();
        };
        let members = match self.spec.confinement.members_stay_in_run_cgroup() {
            true => cgroup.members(),
            false => cgroup.pids(),
        };
        members.unwrap_or_default()
    }

    /// Sleeps until a child changes state (SIGCHLD on the signalfd) or `timeout` passes.
    fn wait_for_child_event(&mut self, timeout: Duration) {
        let mut fds = [PollFd::new(self.run.signals.as_fd(), PollFlags::POLLIN)];
        let timeout = PollTimeout::try_from(timeout.as_millis() as u64).unwrap_or(PollTimeout::MAX);
        if poll(&mut fds, timeout).unwrap_or(0) > 0 {
            self.drain_signals();
        }
    }
}
