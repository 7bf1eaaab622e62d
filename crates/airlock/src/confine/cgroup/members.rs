//! Who is in a run's cgroup: every hierarchy's members, one hierarchy's, and the wait for
//! members that are already ending.

use std::collections::BTreeSet;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::parse::parse_pids;
use super::{CgroupError, CgroupVersion, RunCgroup};

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
    /// joined every hierarchy before it started any other and every later one inherits that,
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

impl RunCgroup {
    /// The files a process writes "0" into to join the run, opened here (by a process allowed
    /// to) for one that may not open them itself (the sandbox user): the kernel checks a
    /// move against the credentials the file was opened with. On v1 they are the `tasks`
    /// files, where "0" moves the calling thread without the global lock that a write of a
    /// pid, or of anything to `cgroup.procs`, takes (an RCU grace period: 9 ms median on a
    /// 2-core VM, 0.3 ms for the five `tasks` writes); on v2 (and a fixture tree without
    /// `tasks`) `cgroup.procs`.
    pub fn open_membership_files(&self) -> Result<Vec<std::os::fd::OwnedFd>, CgroupError> {
        let open = |path: &Path| fs::OpenOptions::new().write(true).open(path);
        // A fixture tree (plain files) gets the file, as `write_control` would write it.
        let open_procs = |procs: &Path| match open(procs) {
            Err(e) if e.kind() == io::ErrorKind::NotFound && is_plain_tree(procs) => {
                fs::OpenOptions::new()
                    .write(true)
                    .create(true)
                    .truncate(true)
                    .open(procs)
            }
            other => other,
        };
        self.join_paths()
            .into_iter()
            .map(|procs| {
                let tasks = procs.with_file_name("tasks");
                let opened = match self.version {
                    CgroupVersion::V1 => match open(&tasks) {
                        Err(e) if e.kind() == io::ErrorKind::NotFound => open_procs(&procs),
                        other => other,
                    },
                    CgroupVersion::V2 => open_procs(&procs),
                };
                opened
                    .map(std::os::fd::OwnedFd::from)
                    .map_err(|source| CgroupError::Write {
                        path: procs,
                        value: "0".into(),
                        source,
                        hint: "cannot open it for the process that joins the run".into(),
                    })
            })
            .collect()
    }
}

fn is_plain_tree(file: &Path) -> bool {
    file.parent()
        .is_some_and(|dir| !super::control::is_cgroupfs(dir))
}

/// The pids one membership file lists; a missing file (a hierarchy's directory already gone)
/// lists none.
fn read_procs(procs: PathBuf) -> Result<Vec<i32>, CgroupError> {
    match super::control::read_small(&procs) {
        Ok(text) => Ok(parse_pids(&text)),
        Err(err) if err.kind() == io::ErrorKind::NotFound => Ok(Vec::new()),
        Err(source) => Err(CgroupError::Read {
            path: procs,
            source,
        }),
    }
}
