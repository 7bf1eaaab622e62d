//! Who is in a run's cgroup: every hierarchy's members, one hierarchy's, and the wait for
//! members that are already ending.

use std::collections::BTreeSet;
use std::fs;
use std::io;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use super::parse::parse_pids;
use super::{CgroupError, RunCgroup};

impl RunCgroup {
    /// All member pids, across hierarchies, sorted.
    pub fn pids(&self) -> Result<Vec<i32>, CgroupError> {
        let mut all = BTreeSet::new();
        for procs in self.join_paths() {
            all.extend(read_procs(procs)?);
        }
        Ok(all.into_iter().collect())
    }

    /// The members as the first hierarchy lists them: all of them, for a run whose processes
    /// cannot move themselves (the native sandbox sees no cgroup file). Its first process
    /// joined every hierarchy before it ran anything else and every later one inherits that,
    /// so one list holds them all, for one read of `cgroup.procs` instead of one per
    /// hierarchy. A tool that moves its processes into cgroups of its own (a container
    /// runtime) needs [`RunCgroup::pids`]. Were a member kept in another hierarchy only,
    /// [`RunCgroup::remove`] still finds it: that hierarchy's `rmdir` fails, and it kills
    /// across every hierarchy before removing again.
    pub fn members(&self) -> Result<Vec<i32>, CgroupError> {
        let Some(procs) = self.join_paths().into_iter().next() else {
            return Ok(Vec::new());
        };
        let mut members = read_procs(procs)?;
        members.sort_unstable();
        members.dedup();
        Ok(members)
    }

    /// Waits up to `patience` for the run to have no member, reading one hierarchy (a run's
    /// processes are in its cgroup of every hierarchy and cannot leave it) at growing
    /// intervals: each read of `cgroup.procs` makes the kernel build the member list. For
    /// processes that are already ending (their PID 1 has exited); a missing directory reads
    /// as empty.
    pub fn wait_for_exits(&self, patience: Duration) {
        let deadline = Instant::now() + patience;
        let Some(procs) = self.join_paths().into_iter().next() else {
            return;
        };
        let has_members = || fs::read(&procs).is_ok_and(|list| !list.is_empty());
        let mut pause = Duration::from_micros(200);
        while Instant::now() < deadline && has_members() {
            std::thread::sleep(pause);
            pause = (pause * 2).min(Duration::from_millis(10));
        }
    }
}

/// The pids one membership file lists; a missing file (a hierarchy's directory already gone)
/// lists none.
fn read_procs(procs: PathBuf) -> Result<Vec<i32>, CgroupError> {
    match fs::read_to_string(&procs) {
        Ok(text) => Ok(parse_pids(&text)),
        Err(err) if err.kind() == io::ErrorKind::NotFound => Ok(Vec::new()),
        Err(source) => Err(CgroupError::Read {
            path: procs,
            source,
        }),
    }
}
