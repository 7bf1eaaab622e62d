//! Control files and directories: validated names and limits, writes that explain a refusal,
//! and creating and removing run and parent directories.

use std::fs::{self, OpenOptions};
use std::io::{self, Write};
use std::path::{Component, Path, PathBuf};
use std::thread::sleep;
use std::time::{Duration, Instant};

use nix::sys::statfs::{statfs, CGROUP2_SUPER_MAGIC, CGROUP_SUPER_MAGIC};

use super::{CgroupError, CgroupLimits, REMOVE_DEADLINE, RUN_CONTROLLERS};

pub(super) fn validate_run_id(run_id: &str) -> Result<(), CgroupError> {
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

pub(super) fn validate_parent(parent: &str) -> Result<(), CgroupError> {
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

pub(super) fn validate_limits(limits: &CgroupLimits) -> Result<(), CgroupError> {
    if limits.cpu_millicores == Some(0) {
        return Err(CgroupError::InvalidLimit {
            limit: "cpu",
            value: 0,
            reason: "a run needs at least 1 millicore; leave the limit unset for no limit",
        });
    }
    Ok(())
}

/// The CFS period a new cgroup starts with (`default_bw_period_us` in the kernel), in µs.
pub(super) const DEFAULT_CFS_PERIOD_US: u64 = 100_000;

/// CFS `(quota_us, period_us)` for a millicore budget, keeping the quota at or above the
/// kernel's 1ms minimum by stretching the period (up to its 1s maximum) for tiny budgets.
pub(super) fn cfs_quota(millicores: u64) -> (u64, u64) {
    const LONG_PERIOD_US: u64 = 1_000_000;
    const MIN_QUOTA_US: u64 = 1_000;
    let quota = millicores.saturating_mul(DEFAULT_CFS_PERIOD_US) / 1000;
    if quota >= MIN_QUOTA_US {
        (quota, DEFAULT_CFS_PERIOD_US)
    } else {
        (
            (millicores * LONG_PERIOD_US / 1000).max(MIN_QUOTA_US),
            LONG_PERIOD_US,
        )
    }
}

/// Why the kernel may refuse a CFS bandwidth setting.
pub(super) const CPU_LIMIT_HINT: &str = "the kernel accepts quotas from 1ms up to its maximum: use cpu_millicores \
     between 1 and 1000 x the host's cores (a missing file means a kernel without CONFIG_CFS_BANDWIDTH)";

pub(super) fn is_cgroupfs(path: &Path) -> bool {
    statfs(path).is_ok_and(|fs| {
        let kind = fs.filesystem_type();
        kind == CGROUP_SUPER_MAGIC || kind == CGROUP2_SUPER_MAGIC
    })
}

/// Whether the kernel offers control file `name` in `dir`; on a plain-file tree every optional
/// file counts as offered so fixtures exercise the full write path.
pub(super) fn control_file_offered(dir: &Path, name: &str) -> bool {
    dir.join(name).exists() || !is_cgroupfs(dir)
}

/// Writes a control file in one `write`. Kernel files are never created (a missing one means a
/// missing controller); on a plain-file tree they are (asked only once one is missing).
pub(super) fn write_control(path: &Path, value: &str, hint: &str) -> Result<(), CgroupError> {
    let open = |create| {
        OpenOptions::new()
            .write(true)
            .truncate(true)
            .create(create)
            .open(path)
    };
    let opened = match open(false) {
        Err(err) if err.kind() == io::ErrorKind::NotFound => {
            let plain = path.parent().is_some_and(|dir| !is_cgroupfs(dir));
            if plain {
                open(true)
            } else {
                Err(err)
            }
        }
        other => other,
    };
    opened
        .and_then(|mut file| file.write_all(value.as_bytes()))
        .map_err(|source| CgroupError::Write {
            path: path.to_path_buf(),
            value: value.to_string(),
            source,
            hint: hint.to_string(),
        })
}

pub(super) fn read_optional(path: &Path) -> Option<String> {
    read_small(path).ok()
}

/// Reads a kernel file (a control file, mountinfo) without asking it for a size first (see
/// `linux::read_to_end_unsized`); each run reads a dozen.
pub(super) fn read_small(path: &Path) -> io::Result<String> {
    let mut text = Vec::new();
    crate::linux::read_to_end_unsized(fs::File::open(path)?, &mut text)?;
    String::from_utf8(text).map_err(|err| io::Error::new(io::ErrorKind::InvalidData, err))
}

/// `names` restricted to the run controllers, in their canonical order.
pub(super) fn canonical_order<S: AsRef<str>>(names: &[S]) -> Vec<String> {
    RUN_CONTROLLERS
        .iter()
        .filter(|wanted| names.iter().any(|name| name.as_ref() == **wanted))
        .map(|name| name.to_string())
        .collect()
}

/// Creates every missing directory of `parent` below `base`; returns those it created.
pub(super) fn ensure_parent(base: &Path, parent: &str) -> Result<Vec<PathBuf>, CgroupError> {
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
pub(super) fn create_dir_if_missing(dir: &Path) -> Result<bool, CgroupError> {
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

/// Creates the run directory under `<base>/<parent>`, retrying if a concurrent run's removal
/// deleted the (then empty) parent in between. `prepare_parent` makes the parent: before each
/// attempt when `parent_first` (v2 enables controllers on the way down), otherwise only once
/// the parent is found missing (v1: a `mkdir` per existing directory and hierarchy saved).
pub(super) fn create_run_dir(
    base: &Path,
    parent: &str,
    run_id: &str,
    parent_first: bool,
    prepare_parent: impl Fn() -> Result<(), CgroupError>,
) -> Result<PathBuf, CgroupError> {
    let path = base.join(parent).join(run_id);
    let mut attempts = 0;
    loop {
        attempts += 1;
        if parent_first || attempts > 1 {
            prepare_parent()?;
        }
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

pub(super) fn create_dir_hint(err: &io::Error) -> String {
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

/// One attempt to remove a run directory the caller expects empty: whether it is gone (a
/// plain-file tree's removed with its files). A kernel cgroup with members is left as it is.
pub(super) fn remove_empty_run_dir(path: &Path) -> bool {
    try_remove_run_dir(path).is_ok()
}

pub(super) fn remove_run_dir(path: &Path) -> Result<(), CgroupError> {
    let deadline = Instant::now() + REMOVE_DEADLINE;
    loop {
        match try_remove_run_dir(path) {
            Ok(()) => return Ok(()),
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

/// One attempt to remove a run directory; a vanished one counts as removed. A kernel cgroup
/// with members or children answers EBUSY.
fn try_remove_run_dir(path: &Path) -> io::Result<()> {
    match fs::remove_dir(path) {
        Err(err) if err.kind() == io::ErrorKind::NotFound => Ok(()),
        // A kernel cgroup's control files do not keep its rmdir from succeeding: only a
        // plain-file tree's directory is not empty.
        Err(err) if err.raw_os_error() == Some(libc::ENOTEMPTY) && !is_cgroupfs(path) => {
            match fs::remove_dir_all(path) {
                Err(err) if err.kind() == io::ErrorKind::NotFound => Ok(()),
                other => other,
            }
        }
        other => other,
    }
}

/// Best effort: a non-empty parent (other runs) or a vanished one is fine.
pub(super) fn remove_parent_if_empty(parent: &Path) {
    let _ = fs::remove_dir(parent);
}

/// Creates and removes a scratch cgroup under the parent to prove creation works, undoing any
/// parent directories it had to create. `inspect` sees the scratch directory before removal.
pub(super) fn trial_create<T>(
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
