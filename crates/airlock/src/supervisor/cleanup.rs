//! Cleaning up after runs whose supervisor died, for a long-lived caller (a daemon) that
//! sweeps on its own schedule and, when it restarts, knows its predecessor is gone.
//!
//! Every run's init removes its own run directory and cgroup, also when its supervisor dies.
//! What is left when an init was killed too (its whole process group got SIGKILL) is swept:
//! by the next run's start at most every 10 s, and by these calls.

use std::time::Duration;

use super::builder::SandboxOptions;
use crate::confine::cgroup::CgroupConfig;
use crate::rundir;

impl SandboxOptions {
    /// Removes what runs made with these options left when both their supervisor and their
    /// init were killed: run directories, cgroups and any process still in them, for runs
    /// older than 30 s whose supervisor is gone. Returns how many run directories and cgroups
    /// were removed; best effort (what fails is left for the next sweep).
    pub fn sweep_abandoned_runs(&self) -> usize {
        let Ok(runtime) = rundir::existing_runtime_dir(self.runtime_dir.as_deref()) else {
            return 0;
        };
        rundir::sweep(&runtime, self.cgroup_config().as_ref())
    }

    /// Removes every run of the supervisor `pid`, which the caller knows died (a daemon
    /// restarting after its predecessor was killed, whose pid it recorded), at once instead of
    /// after 30 s. Their inits get up to `grace` to finish their own clean-up (they stop as
    /// soon as they see their supervisor gone); then whatever is left in the runs' cgroups is
    /// killed and the cgroups (nested ones included) and run directories are removed. Nothing
    /// is touched while a process `pid` exists. Returns how many were removed.
    pub fn sweep_runs_of_dead_supervisor(&self, pid: u32, grace: Duration) -> usize {
        let Ok(runtime) = rundir::existing_runtime_dir(self.runtime_dir.as_deref()) else {
            return 0;
        };
        rundir::sweep_supervisor(&runtime, self.cgroup_config().as_ref(), pid, grace)
    }

    /// Where runs made with these options get their cgroups, if they get any.
    pub(super) fn cgroup_config(&self) -> Option<CgroupConfig> {
        (!self.no_cgroup).then(|| self.cgroup.clone().unwrap_or_default())
    }
}
