//! Per-run cgroups: resource limits, accounting, kill-everything and removal, on cgroup v2 (the
//! production norm) and on legacy v1 hierarchies.
//!
//! The supervisor calls [`probe`] to report what the host offers, [`RunCgroup::create`] before
//! starting a run, hands the serialized [`RunCgroup`] to the child (which calls
//! [`RunCgroup::join_self`] before dropping privileges), and finally [`RunCgroup::usage`] and
//! [`RunCgroup::remove`].
//!
//! Run cgroups live under `<hierarchy>/<parent>/<run_id>`. The parent is a directory dedicated to
//! airlock: it is created on demand and removed again when its last run is removed, so other
//! tenants of a hierarchy (e.g. a VM agent's `memory/process_api/...`) are never touched.
//!
//! A tree that is not a kernel cgroup filesystem (a test fixture selected through
//! [`CgroupConfig::root`]) is handled as plain files: writes create files, optional control files
//! count as present, removal deletes the tree, and no signal is ever sent, because the pids in
//! such files describe nothing the kernel vouches for.

mod control;
mod layout;
mod members;
mod parse;
mod v1;
mod v2;

#[cfg(test)]
mod tests;

use std::io;
use std::path::{Path, PathBuf};
use std::thread::sleep;
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::{getpid, Pid};
use serde::{Deserialize, Serialize};

use control::{
    canonical_order, cfs_quota, control_file_offered, create_dir_if_missing, create_run_dir,
    ensure_parent, is_cgroupfs, read_optional, remove_empty_run_dir, remove_parent_if_empty,
    remove_run_dir, trial_create, validate_limits, validate_parent, validate_run_id, write_control,
    CPU_LIMIT_HINT, DEFAULT_CFS_PERIOD_US,
};
use layout::{Layout, V1Hierarchy, V2Mount};

/// How long [`RunCgroup::kill_all`] keeps killing before it gives up.
const KILL_DEADLINE: Duration = Duration::from_secs(2);
/// How long removal retries `rmdir` while the kernel still reports the cgroup busy.
const REMOVE_DEADLINE: Duration = Duration::from_secs(1);
/// How long a freeze may take to settle before we kill anyway.
const FREEZE_SETTLE: Duration = Duration::from_millis(100);

/// The controllers a run uses when present: limits (memory, pids, cpu), accounting (cpuacct on
/// v1) and a stable kill (freezer).
const RUN_CONTROLLERS: [&str; 5] = ["memory", "pids", "cpu", "cpuacct", "freezer"];

/// Resource limits for one run; `None` leaves the resource unlimited.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Default)]
pub struct CgroupLimits {
    pub memory_bytes: Option<u64>,
    pub pids: Option<u64>,
    /// CFS bandwidth quota: 1000 = one full core.
    pub cpu_millicores: Option<u64>,
}

/// Where run cgroups are created.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct CgroupConfig {
    /// The cgroup filesystem root (`/sys/fs/cgroup`), or a fake tree in tests.
    pub root: PathBuf,
    /// Relative path, inside every hierarchy, of the directory dedicated to airlock's runs.
    pub parent: String,
    /// Keep the emptied parent after a run instead of removing it: creating and removing a
    /// cgroup in five v1 hierarchies on every run costs about half a millisecond.
    #[serde(default = "keep_parent_by_default")]
    pub keep_parent: bool,
}

fn keep_parent_by_default() -> bool {
    true
}

impl Default for CgroupConfig {
    fn default() -> Self {
        Self {
            root: PathBuf::from("/sys/fs/cgroup"),
            parent: "airlock".to_string(),
            keep_parent: true,
        }
    }
}

#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum CgroupVersion {
    V1,
    V2,
}

/// What [`probe`] found.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Default)]
pub struct CgroupSupport {
    /// The version runs would use, `None` if no cgroup can be created.
    pub version: Option<CgroupVersion>,
    /// Usable controllers among memory, pids, cpu, cpuacct, freezer.
    pub controllers: Vec<String>,
    /// Why a controller is unusable, each with the fix.
    pub problems: Vec<String>,
    /// Facts worth knowing that do not block anything (e.g. why v2 is not used).
    pub notes: Vec<String>,
}

/// Best-effort accounting of a run.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Default)]
pub struct CgroupUsage {
    pub peak_memory_bytes: Option<u64>,
    pub oom_kills: u64,
    pub cpu_usage_ns: Option<u64>,
    pub pids_limit_hits: u64,
}

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CgroupError {
    #[error("invalid run id {run_id:?}: {reason}")]
    InvalidRunId {
        run_id: String,
        reason: &'static str,
    },
    #[error("invalid cgroup parent {parent:?}: it must be a non-empty relative path without '.' or '..'")]
    InvalidParent { parent: String },
    #[error("invalid {limit} limit {value}: {reason}")]
    InvalidLimit {
        limit: &'static str,
        value: u64,
        reason: &'static str,
    },
    #[error("no usable cgroup hierarchy under {}: {reason}", root.display())]
    Unavailable { root: PathBuf, reason: String },
    #[error("cannot apply the requested {limit} limit: {reason}")]
    ControllerUnavailable { limit: &'static str, reason: String },
    #[error("cgroup {} already exists: a previous run with this id was not cleaned up; kill its processes and rmdir it", path.display())]
    AlreadyExists { path: PathBuf },
    #[error("failed to create cgroup directory {}: {source}; {hint}", path.display())]
    CreateDir {
        path: PathBuf,
        source: io::Error,
        hint: String,
    },
    #[error("failed to write {value:?} to {}: {source}; {hint}", path.display())]
    Write {
        path: PathBuf,
        value: String,
        source: io::Error,
        hint: String,
    },
    #[error("failed to read {}: {source}", path.display())]
    Read { path: PathBuf, source: io::Error },
    #[error("failed to send {signal} to pid {pid} of cgroup {}: {source}", cgroup.display())]
    Signal {
        signal: Signal,
        pid: i32,
        cgroup: PathBuf,
        source: nix::errno::Errno,
    },
    #[error("refusing to signal cgroup {}: the calling process (pid {pid}) is a member and would kill itself", cgroup.display())]
    CallerInside { cgroup: PathBuf, pid: i32 },
    #[error("processes {pids:?} of cgroup {} survived {rounds} kill rounds", cgroup.display())]
    KillTimeout {
        cgroup: PathBuf,
        rounds: u32,
        pids: Vec<i32>,
    },
    #[error("failed to remove cgroup directory {}: {source}", path.display())]
    Remove { path: PathBuf, source: io::Error },
}

/// One directory of a run: a v2 run has exactly one, a v1 run one per hierarchy it uses.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
struct RunDir {
    path: PathBuf,
    controllers: Vec<String>,
}

/// The cgroup(s) of one run. Serializable because the plan crosses into the re-exec'd init,
/// which joins it; it deliberately has no `Drop` so that a copy in the child never removes it.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct RunCgroup {
    version: CgroupVersion,
    dirs: Vec<RunDir>,
    keep_parent: bool,
}

/// Reports which cgroup version airlock would use and what works. Its only side effect is
/// creating and removing a test directory under the parent (and the parent, if it was absent).
pub fn probe(cfg: &CgroupConfig) -> CgroupSupport {
    let mut support = CgroupSupport::default();
    if let Err(err) = validate_parent(&cfg.parent) {
        support.problems.push(err.to_string());
        return support;
    }
    let layout = Layout::detect(&cfg.root);
    support.version = layout.preferred_version();
    match support.version {
        None => support.problems.push(layout.nothing_usable_reason()),
        Some(CgroupVersion::V2) => v2::probe(&layout, cfg, &mut support),
        Some(CgroupVersion::V1) => v1::probe(&layout, cfg, &mut support),
    }
    support
}

/// The warning of a run that has no cgroup: what failed, and that its limits fall back to
/// rlimits (a required `cgroup` layer refuses the run instead).
pub fn no_cgroup_warning(error: &dyn std::fmt::Display) -> String {
    format!("no cgroup for this run ({error}); limits fall back to rlimits")
}

/// Reads and remembers the host's cgroup layout under `root` for a process whose forked
/// children each create a run cgroup (the init spawner): they inherit it instead of each
/// reading and parsing mountinfo.
pub fn remember_layout(root: &Path) {
    Layout::detect_and_remember(root);
}

impl RunCgroup {
    /// Creates the run's cgroup(s) under `cfg.parent` and applies `limits`. Fails, leaving
    /// nothing behind, if a requested limit cannot be applied.
    pub fn create(
        cfg: &CgroupConfig,
        run_id: &str,
        limits: &CgroupLimits,
    ) -> Result<RunCgroup, CgroupError> {
        validate_run_id(run_id)?;
        validate_parent(&cfg.parent)?;
        validate_limits(limits)?;
        let afresh =
            || RunCgroup::create_in(&Layout::detect_and_remember(&cfg.root), cfg, run_id, limits);
        match Layout::remembered(&cfg.root) {
            // A failure may mean the host's cgroup mounts changed since: read them again, once
            // (a failed create leaves nothing behind).
            Some(layout) => {
                RunCgroup::create_in(&layout, cfg, run_id, limits).or_else(|_| afresh())
            }
            None => afresh(),
        }
    }

    fn create_in(
        layout: &Layout,
        cfg: &CgroupConfig,
        run_id: &str,
        limits: &CgroupLimits,
    ) -> Result<RunCgroup, CgroupError> {
        match layout.preferred_version() {
            Some(CgroupVersion::V2) => v2::create(layout, cfg, run_id, limits),
            Some(CgroupVersion::V1) => v1::create(layout, cfg, run_id, limits),
            None => Err(CgroupError::Unavailable {
                root: cfg.root.clone(),
                reason: layout.nothing_usable_reason(),
            }),
        }
    }

    pub fn version(&self) -> CgroupVersion {
        self.version
    }

    /// The controllers this run's cgroups use (for the tests).
    #[cfg(test)]
    pub fn controllers(&self) -> Vec<String> {
        let present: Vec<&String> = self.dirs.iter().flat_map(|dir| &dir.controllers).collect();
        canonical_order(&present)
    }

    /// The run's directory in each hierarchy (for the tests).
    #[cfg(test)]
    pub fn paths(&self) -> Vec<PathBuf> {
        self.dirs.iter().map(|dir| dir.path.clone()).collect()
    }

    /// The `cgroup.procs` files a process writes `0` into to join every hierarchy of the run.
    pub fn join_paths(&self) -> Vec<PathBuf> {
        self.dirs
            .iter()
            .map(|dir| dir.path.join("cgroup.procs"))
            .collect()
    }

    /// Moves the calling process into the run (call before dropping privileges).
    pub fn join_self(&self) -> Result<(), CgroupError> {
        self.write_procs("0")
    }

    /// Moves process `pid` (with all its threads) into the run, from outside (for the tests).
    #[cfg(test)]
    pub fn attach(&self, pid: Pid) -> Result<(), CgroupError> {
        self.write_procs(&pid.as_raw().to_string())
    }

    fn write_procs(&self, value: &str) -> Result<(), CgroupError> {
        let hint = "the process may have exited, or the run cgroup was removed";
        self.join_paths()
            .iter()
            .try_for_each(|procs| write_control(procs, value, hint))
    }

    /// Sends `signal` to every member (e.g. SIGTERM for a graceful stop). A no-op on a tree
    /// that is not a kernel cgroup filesystem.
    pub fn signal_all(&self, signal: Signal) -> Result<(), CgroupError> {
        if !self.is_kernel_backed() {
            return Ok(());
        }
        let pids = self.pids()?;
        self.refuse_if_caller_inside(&pids)?;
        self.send(&pids, signal)
    }

    /// Kills every member and waits until none is left. Freezes first where a freezer exists so
    /// a fork bomb cannot outrun the kill; otherwise repeats kill rounds until the deadline.
    /// A no-op on a tree that is not a kernel cgroup filesystem.
    pub fn kill_all(&self) -> Result<(), CgroupError> {
        if !self.is_kernel_backed() {
            return Ok(());
        }
        self.refuse_if_caller_inside(&self.pids()?)?;
        let deadline = Instant::now() + KILL_DEADLINE;
        if self.version == CgroupVersion::V2
            && v2::request_kill(&self.dirs[0].path)?
            && self.wait_until_empty(Instant::now() + Duration::from_millis(500))?
        {
            return Ok(());
        }
        let mut rounds = 0;
        loop {
            rounds += 1;
            let killed = self.kill_round()?;
            if killed == 0 {
                return Ok(());
            }
            let settle = Duration::from_millis(5 * u64::from(rounds.min(20)));
            if self.wait_until_empty((Instant::now() + settle).min(deadline))? {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(CgroupError::KillTimeout {
                    cgroup: self.dirs[0].path.clone(),
                    rounds,
                    pids: self.pids()?,
                });
            }
        }
    }

    /// One freeze, SIGKILL everyone, thaw. Returns how many pids were signalled.
    fn kill_round(&self) -> Result<usize, CgroupError> {
        let frozen = self.freeze();
        let outcome = self
            .pids()
            .and_then(|pids| self.send(&pids, Signal::SIGKILL).map(|()| pids.len()));
        if frozen {
            self.thaw()?;
        }
        outcome
    }

    fn freeze(&self) -> bool {
        match self.version {
            CgroupVersion::V1 => v1::freeze(&self.dirs),
            CgroupVersion::V2 => v2::freeze(&self.dirs[0].path),
        }
    }

    fn thaw(&self) -> Result<(), CgroupError> {
        match self.version {
            CgroupVersion::V1 => v1::thaw(&self.dirs),
            CgroupVersion::V2 => v2::thaw(&self.dirs[0].path),
        }
    }

    fn wait_until_empty(&self, until: Instant) -> Result<bool, CgroupError> {
        loop {
            if self.pids()?.is_empty() {
                return Ok(true);
            }
            if Instant::now() >= until {
                return Ok(false);
            }
            sleep(Duration::from_millis(2));
        }
    }

    fn send(&self, pids: &[i32], signal: Signal) -> Result<(), CgroupError> {
        for &pid in pids {
            match kill(Pid::from_raw(pid), signal) {
                Ok(()) | Err(nix::errno::Errno::ESRCH) => {}
                Err(source) => {
                    return Err(CgroupError::Signal {
                        signal,
                        pid,
                        cgroup: self.dirs[0].path.clone(),
                        source,
                    })
                }
            }
        }
        Ok(())
    }

    fn refuse_if_caller_inside(&self, pids: &[i32]) -> Result<(), CgroupError> {
        let me = getpid().as_raw();
        if pids.contains(&me) {
            return Err(CgroupError::CallerInside {
                cgroup: self.dirs[0].path.clone(),
                pid: me,
            });
        }
        Ok(())
    }

    /// Only a kernel cgroupfs guarantees that the pids listed are really members; signalling
    /// pids read from plain files could hit unrelated processes.
    fn is_kernel_backed(&self) -> bool {
        self.dirs.iter().all(|dir| is_cgroupfs(&dir.path))
    }

    /// Best-effort accounting; unreadable counters are reported as absent or zero.
    pub fn usage(&self) -> CgroupUsage {
        match self.version {
            CgroupVersion::V1 => v1::usage(&self.dirs),
            CgroupVersion::V2 => v2::usage(&self.dirs[0].path),
        }
    }

    /// The CPU time of every member so far (one file read, where [`RunCgroup::usage`] reads
    /// four).
    pub fn cpu_usage_ns(&self) -> Option<u64> {
        match self.version {
            CgroupVersion::V1 => v1::cpu_usage_ns(&self.dirs),
            CgroupVersion::V2 => v2::usage(&self.dirs[0].path).cpu_usage_ns,
        }
    }

    /// Restarts the peak memory count from the current usage (a warm run's start, so that its
    /// peak is the run's, not the preparation's); false where the kernel cannot (cgroup v2
    /// resets `memory.peak` only for the descriptor that wrote it).
    pub fn reset_peak_memory(&self) -> bool {
        match self.version {
            CgroupVersion::V1 => v1::reset_peak_memory(&self.dirs),
            CgroupVersion::V2 => false,
        }
    }

    /// Kills every member, removes the run's directories, then the parent if it is now empty.
    pub fn remove(self) -> Result<(), CgroupError> {
        // The common case is a run whose init already emptied the cgroup: its directories go
        // at the first rmdir, with no read of each hierarchy's members first, and no kill
        // round (freeze, signal, thaw). Only one the kernel keeps (members: EBUSY) gets both.
        let outcome = match self.dirs.iter().all(|dir| remove_empty_run_dir(&dir.path)) {
            true => Ok(()),
            false => {
                self.kill_all()?;
                self.remove_run_dirs()
            }
        };
        if !self.keep_parent {
            self.remove_parents_if_empty();
        }
        outcome
    }

    fn remove_run_dirs(&self) -> Result<(), CgroupError> {
        let mut first_error = None;
        for dir in &self.dirs {
            if let Err(err) = remove_run_dir(&dir.path) {
                first_error.get_or_insert(err);
            }
        }
        first_error.map_or(Ok(()), Err)
    }

    /// Removes the directories without killing, and the parents if now empty: rollback of a
    /// half-created run leaves the hierarchy as it was.
    fn roll_back(&self) -> Result<(), CgroupError> {
        let outcome = self.remove_run_dirs();
        self.remove_parents_if_empty();
        outcome
    }

    fn remove_parents_if_empty(&self) {
        for parent in self.dirs.iter().filter_map(|dir| dir.path.parent()) {
            remove_parent_if_empty(parent);
        }
    }
}
