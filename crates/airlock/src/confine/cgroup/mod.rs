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

mod parse;
mod v1;
mod v2;

#[cfg(test)]
mod tests;

use std::collections::BTreeSet;
use std::fs::{self, OpenOptions};
use std::io::{self, Write};
use std::path::{Component, Path, PathBuf};
use std::thread::sleep;
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::sys::statfs::{statfs, CGROUP2_SUPER_MAGIC, CGROUP_SUPER_MAGIC};
use nix::unistd::{getpid, Pid};
use serde::{Deserialize, Serialize};

use parse::{cgroup_mounts, controllers_from_dir_name, parse_mountinfo, parse_pids, CgroupMount};

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
        let layout = Layout::detect(&cfg.root);
        match layout.preferred_version() {
            Some(CgroupVersion::V2) => v2::create(&layout, cfg, run_id, limits),
            Some(CgroupVersion::V1) => v1::create(&layout, cfg, run_id, limits),
            None => Err(CgroupError::Unavailable {
                root: cfg.root.clone(),
                reason: layout.nothing_usable_reason(),
            }),
        }
    }

    pub fn version(&self) -> CgroupVersion {
        self.version
    }

    /// The controllers this run's cgroups use.
    pub fn controllers(&self) -> Vec<String> {
        let present: Vec<&String> = self.dirs.iter().flat_map(|dir| &dir.controllers).collect();
        canonical_order(&present)
    }

    /// The run's directory in each hierarchy (for logs and diagnostics).
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

    /// Moves process `pid` (with all its threads) into the run, from outside.
    pub fn attach(&self, pid: Pid) -> Result<(), CgroupError> {
        self.write_procs(&pid.as_raw().to_string())
    }

    fn write_procs(&self, value: &str) -> Result<(), CgroupError> {
        let hint = "the process may have exited, or the run cgroup was removed";
        self.join_paths()
            .iter()
            .try_for_each(|procs| write_control(procs, value, hint))
    }

    /// All member pids, across hierarchies, sorted.
    pub fn pids(&self) -> Result<Vec<i32>, CgroupError> {
        let mut all = BTreeSet::new();
        for procs in self.join_paths() {
            match fs::read_to_string(&procs) {
                Ok(text) => all.extend(parse_pids(&text)),
                Err(err) if err.kind() == io::ErrorKind::NotFound => {}
                Err(source) => {
                    return Err(CgroupError::Read {
                        path: procs,
                        source,
                    })
                }
            }
        }
        Ok(all.into_iter().collect())
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

    /// Kills every member, removes the run's directories, then the parent if it is now empty.
    pub fn remove(self) -> Result<(), CgroupError> {
        // The common case is a run whose init already emptied the cgroup: a kill round
        // (freeze, signal, thaw) would only cost time.
        if !self.pids().map(|pids| pids.is_empty()).unwrap_or(false) {
            self.kill_all()?;
        }
        let outcome = self.remove_run_dirs();
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

/// The cgroup hierarchies found under a root.
#[derive(Debug, Clone, Default)]
struct Layout {
    root: PathBuf,
    v2: Option<V2Mount>,
    v1: Vec<V1Hierarchy>,
}

#[derive(Debug, Clone)]
struct V2Mount {
    path: PathBuf,
    /// Controllers listed in the mount root's `cgroup.controllers`.
    available: Vec<String>,
}

#[derive(Debug, Clone)]
struct V1Hierarchy {
    path: PathBuf,
    controllers: Vec<String>,
}

impl Layout {
    /// Uses mountinfo when it lists cgroup mounts under `root`; otherwise (a fake tree, or no
    /// /proc) infers the layout from the directories.
    fn detect(root: &Path) -> Layout {
        let mounts: Vec<CgroupMount> = fs::read_to_string("/proc/self/mountinfo")
            .map(|text| cgroup_mounts(&parse_mountinfo(&text)))
            .unwrap_or_default()
            .into_iter()
            .filter(|mount| mount_path(mount).starts_with(root))
            .collect();
        if mounts.is_empty() {
            Layout::scan(root)
        } else {
            Layout::from_mounts(root, mounts)
        }
    }

    fn from_mounts(root: &Path, mounts: Vec<CgroupMount>) -> Layout {
        let mut layout = Layout {
            root: root.to_path_buf(),
            ..Layout::default()
        };
        for mount in mounts {
            match mount {
                CgroupMount::V2 { path } => {
                    let replaces = layout.v2.as_ref().is_none_or(|_| path == root);
                    if replaces {
                        layout.v2 = Some(V2Mount::read(path));
                    }
                }
                CgroupMount::V1 { path, controllers } => layout.add_v1(path, controllers),
            }
        }
        layout
    }

    fn scan(root: &Path) -> Layout {
        let mut layout = Layout {
            root: root.to_path_buf(),
            ..Layout::default()
        };
        if root.join("cgroup.controllers").is_file() {
            layout.v2 = Some(V2Mount::read(root.to_path_buf()));
            return layout;
        }
        let unified = root.join("unified");
        if unified.join("cgroup.controllers").is_file() {
            layout.v2 = Some(V2Mount::read(unified));
        }
        let mut entries: Vec<PathBuf> = fs::read_dir(root)
            .into_iter()
            .flatten()
            .flatten()
            .filter(|entry| entry.file_type().is_ok_and(|kind| kind.is_dir()))
            .map(|entry| entry.path())
            .collect();
        entries.sort();
        for path in entries {
            let name = path.file_name().unwrap_or_default().to_string_lossy();
            let controllers = controllers_from_dir_name(&name);
            layout.add_v1(path, controllers);
        }
        layout
    }

    /// Keeps the first hierarchy per controller, so a bind-mounted duplicate is ignored.
    fn add_v1(&mut self, path: PathBuf, controllers: Vec<String>) {
        let fresh: Vec<String> = controllers
            .into_iter()
            .filter(|name| self.v1_hierarchy(name).is_none())
            .collect();
        if !fresh.is_empty() {
            self.v1.push(V1Hierarchy {
                path,
                controllers: fresh,
            });
        }
    }

    fn v1_hierarchy(&self, controller: &str) -> Option<&V1Hierarchy> {
        self.v1
            .iter()
            .find(|hierarchy| hierarchy.controllers.iter().any(|c| c == controller))
    }

    fn v2_offers(&self, controller: &str) -> bool {
        self.v2
            .as_ref()
            .is_some_and(|v2| v2.available.iter().any(|c| c == controller))
    }

    /// v2 when it offers memory and pids; else v1 when it has any run controller; else a v2
    /// mounted at the root itself (a pure v2 host with controllers disabled still kills and
    /// accounts cpu).
    fn preferred_version(&self) -> Option<CgroupVersion> {
        if self.v2_offers("memory") && self.v2_offers("pids") {
            return Some(CgroupVersion::V2);
        }
        if RUN_CONTROLLERS
            .iter()
            .any(|name| self.v1_hierarchy(name).is_some())
        {
            return Some(CgroupVersion::V1);
        }
        match &self.v2 {
            Some(v2) if v2.path == self.root => Some(CgroupVersion::V2),
            _ => None,
        }
    }

    fn nothing_usable_reason(&self) -> String {
        format!(
            "no cgroup2 filesystem and no cgroup v1 controller hierarchy (memory, pids, cpu) is mounted there; \
             mount cgroup2 with `mount -t cgroup2 none {root}` (or run on a host/container that exposes /sys/fs/cgroup)",
            root = self.root.display()
        )
    }
}

impl V2Mount {
    fn read(path: PathBuf) -> V2Mount {
        let available = fs::read_to_string(path.join("cgroup.controllers"))
            .map(|text| parse::parse_controller_list(&text))
            .unwrap_or_default();
        V2Mount { path, available }
    }
}

fn mount_path(mount: &CgroupMount) -> &Path {
    match mount {
        CgroupMount::V2 { path } | CgroupMount::V1 { path, .. } => path,
    }
}

fn validate_run_id(run_id: &str) -> Result<(), CgroupError> {
    let reason = if run_id.is_empty() {
        Some("it is empty")
    } else if run_id.len() > 128 {
        Some("it is longer than 128 bytes")
    } else if run_id.starts_with('.') {
        Some("it starts with '.'")
    } else if !run_id
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
    {
        Some("use only ASCII letters, digits, '-', '_' and '.'")
    } else {
        None
    };
    match reason {
        Some(reason) => Err(CgroupError::InvalidRunId {
            run_id: run_id.to_string(),
            reason,
        }),
        None => Ok(()),
    }
}

fn validate_parent(parent: &str) -> Result<(), CgroupError> {
    let path = Path::new(parent);
    let valid = !parent.is_empty()
        && path
            .components()
            .all(|component| matches!(component, Component::Normal(_)));
    if valid {
        Ok(())
    } else {
        Err(CgroupError::InvalidParent {
            parent: parent.to_string(),
        })
    }
}

fn validate_limits(limits: &CgroupLimits) -> Result<(), CgroupError> {
    if limits.cpu_millicores == Some(0) {
        return Err(CgroupError::InvalidLimit {
            limit: "cpu",
            value: 0,
            reason: "a run needs at least 1 millicore; leave the limit unset for no limit",
        });
    }
    Ok(())
}

/// CFS `(quota_us, period_us)` for a millicore budget, keeping the quota at or above the
/// kernel's 1ms minimum by stretching the period (up to its 1s maximum) for tiny budgets.
fn cfs_quota(millicores: u64) -> (u64, u64) {
    const DEFAULT_PERIOD_US: u64 = 100_000;
    const LONG_PERIOD_US: u64 = 1_000_000;
    const MIN_QUOTA_US: u64 = 1_000;
    let quota = millicores.saturating_mul(DEFAULT_PERIOD_US) / 1000;
    if quota >= MIN_QUOTA_US {
        (quota, DEFAULT_PERIOD_US)
    } else {
        (
            (millicores * LONG_PERIOD_US / 1000).max(MIN_QUOTA_US),
            LONG_PERIOD_US,
        )
    }
}

/// Why the kernel may refuse a CFS bandwidth setting.
const CPU_LIMIT_HINT: &str = "the kernel accepts quotas from 1ms up to its maximum: use cpu_millicores \
     between 1 and 1000 x the host's cores (a missing file means a kernel without CONFIG_CFS_BANDWIDTH)";

fn is_cgroupfs(path: &Path) -> bool {
    statfs(path).is_ok_and(|fs| {
        let kind = fs.filesystem_type();
        kind == CGROUP_SUPER_MAGIC || kind == CGROUP2_SUPER_MAGIC
    })
}

/// Whether the kernel offers control file `name` in `dir`; on a plain-file tree every optional
/// file counts as offered so fixtures exercise the full write path.
fn control_file_offered(dir: &Path, name: &str) -> bool {
    dir.join(name).exists() || !is_cgroupfs(dir)
}

/// Writes a control file in one `write`. Kernel files are never created (a missing one means a
/// missing controller); on a plain-file tree they are.
fn write_control(path: &Path, value: &str, hint: &str) -> Result<(), CgroupError> {
    let plain = path.parent().is_some_and(|dir| !is_cgroupfs(dir));
    OpenOptions::new()
        .write(true)
        .truncate(true)
        .create(plain)
        .open(path)
        .and_then(|mut file| file.write_all(value.as_bytes()))
        .map_err(|source| CgroupError::Write {
            path: path.to_path_buf(),
            value: value.to_string(),
            source,
            hint: hint.to_string(),
        })
}

fn read_optional(path: &Path) -> Option<String> {
    fs::read_to_string(path).ok()
}

/// `names` restricted to the run controllers, in their canonical order.
fn canonical_order<S: AsRef<str>>(names: &[S]) -> Vec<String> {
    RUN_CONTROLLERS
        .iter()
        .filter(|wanted| names.iter().any(|name| name.as_ref() == **wanted))
        .map(|name| name.to_string())
        .collect()
}

/// Creates every missing directory of `parent` below `base`; returns those it created.
fn ensure_parent(base: &Path, parent: &str) -> Result<Vec<PathBuf>, CgroupError> {
    let mut created = Vec::new();
    let mut dir = base.to_path_buf();
    for component in Path::new(parent).components() {
        dir.push(component);
        if create_dir_if_missing(&dir)? {
            created.push(dir.clone());
        }
    }
    Ok(created)
}

/// Creates `dir` unless it exists; says whether it did.
fn create_dir_if_missing(dir: &Path) -> Result<bool, CgroupError> {
    match fs::create_dir(dir) {
        Ok(()) => Ok(true),
        Err(err) if err.kind() == io::ErrorKind::AlreadyExists => Ok(false),
        Err(source) => Err(CgroupError::CreateDir {
            hint: create_dir_hint(&source),
            path: dir.to_path_buf(),
            source,
        }),
    }
}

/// Creates the run directory under `<base>/<parent>` after `prepare_parent` made the parent,
/// retrying if a concurrent run's removal deleted the (then empty) parent in between.
fn create_run_dir(
    base: &Path,
    parent: &str,
    run_id: &str,
    prepare_parent: impl Fn() -> Result<(), CgroupError>,
) -> Result<PathBuf, CgroupError> {
    let path = base.join(parent).join(run_id);
    let mut attempts = 0;
    loop {
        attempts += 1;
        prepare_parent()?;
        match fs::create_dir(&path) {
            Ok(()) => return Ok(path),
            Err(err) if err.kind() == io::ErrorKind::NotFound && attempts < 5 => continue,
            Err(err) if err.kind() == io::ErrorKind::AlreadyExists => {
                return Err(CgroupError::AlreadyExists { path })
            }
            Err(source) => {
                return Err(CgroupError::CreateDir {
                    hint: create_dir_hint(&source),
                    path,
                    source,
                })
            }
        }
    }
}

fn create_dir_hint(err: &io::Error) -> String {
    match err.raw_os_error() {
        Some(libc::EACCES | libc::EPERM) => {
            "run airlock as root, or delegate this cgroup subtree to its user (systemd Delegate=yes)"
                .to_string()
        }
        Some(libc::EROFS) => {
            "the cgroup filesystem is mounted read-only (common inside containers); mount it read-write or run on the host"
                .to_string()
        }
        Some(libc::EAGAIN) => {
            "the hierarchy's cgroup.max.descendants or cgroup.max.depth is exhausted".to_string()
        }
        _ => "check that the cgroup hierarchy is mounted and writable".to_string(),
    }
}

fn remove_run_dir(path: &Path) -> Result<(), CgroupError> {
    if !is_cgroupfs(path) {
        return match fs::remove_dir_all(path) {
            Err(err) if err.kind() != io::ErrorKind::NotFound => Err(CgroupError::Remove {
                path: path.to_path_buf(),
                source: err,
            }),
            _ => Ok(()),
        };
    }
    let deadline = Instant::now() + REMOVE_DEADLINE;
    loop {
        match fs::remove_dir(path) {
            Ok(()) => return Ok(()),
            Err(err) if err.kind() == io::ErrorKind::NotFound => return Ok(()),
            // Just-killed tasks may still be leaving the cgroup.
            Err(err) if err.raw_os_error() == Some(libc::EBUSY) && Instant::now() < deadline => {
                sleep(Duration::from_millis(10));
            }
            Err(source) => {
                return Err(CgroupError::Remove {
                    path: path.to_path_buf(),
                    source,
                })
            }
        }
    }
}

/// Best effort: a non-empty parent (other runs) or a vanished one is fine.
fn remove_parent_if_empty(parent: &Path) {
    let _ = fs::remove_dir(parent);
}

/// Creates and removes a scratch cgroup under the parent to prove creation works, undoing any
/// parent directories it had to create. `inspect` sees the scratch directory before removal.
fn trial_create<T>(
    base: &Path,
    parent: &str,
    inspect: impl FnOnce(&Path) -> T,
) -> Result<T, CgroupError> {
    let created_parents = ensure_parent(base, parent)?;
    let scratch = base
        .join(parent)
        .join(format!("probe-{}", std::process::id()));
    let outcome = match fs::create_dir(&scratch) {
        Ok(()) => {
            let seen = inspect(&scratch);
            remove_run_dir(&scratch).map(|()| seen)
        }
        Err(source) => Err(CgroupError::CreateDir {
            hint: create_dir_hint(&source),
            path: scratch,
            source,
        }),
    };
    for dir in created_parents.iter().rev() {
        remove_parent_if_empty(dir);
    }
    outcome
}
