//! The native backend's filesystem view, built from scratch like bubblewrap's: an empty tmpfs
//! becomes `/`, and only what the [`RootfsPlan`] names is bound into it. Nothing of the host is
//! visible unless listed, so a forgotten path is absent rather than exposed.
//!
//! [`enter`] runs inside the sandbox's init: single-threaded, PID 1 of a fresh PID namespace, in
//! fresh user and mount namespaces where it holds every capability. It is implemented as
//! [`plan_operations`] (a pure, ordered list of [`MountOp`]s, unit-tested) followed by executing
//! each operation in turn, like bubblewrap's `SetupOp` list.

mod by_fd;
mod execute;
mod plan;
mod scratch;
mod shared;
mod source;

use std::collections::BTreeSet;
use std::path::{Component, Path, PathBuf};

use serde::{Deserialize, Serialize};

pub use by_fd::bind_found_at;
pub use plan::{plan_operations, plan_prepared_root, plan_prepared_run, MountOp, ProcProtection};
pub use scratch::{
    cover_with_empty_file, enter_private_mount_namespace, enter_private_runtime, mount_scratch,
    ScratchMount,
};
pub use shared::{plan_shared_root, plan_shared_run, shared_workdir_base};

/// Everything needed to build the sandbox's root filesystem. Crosses the process boundary
/// (supervisor to init) as JSON.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct RootfsPlan {
    /// Host directories bound read-only at the same path; a host symlink (merged-usr `/bin ->
    /// usr/bin`) is recreated as the same symlink instead. Absent ones are skipped.
    pub system_ro: Vec<PathBuf>,
    /// Host `/etc` entries bound read-only (symlinks recreated) when present on the host.
    pub etc_files: Vec<PathBuf>,
    /// Files written into the new root before it becomes read-only (`/etc/passwd`, ...). A
    /// generated file wins over an `etc_files` entry at the same path.
    pub generated_files: Vec<GeneratedFile>,
    /// Extra host paths (files or directories), read-only at the same path. Must exist.
    pub read_only: Vec<PathBuf>,
    /// Extra host paths, read-write at the same path. Must exist. The caller gave them to the
    /// program to work in: programs there may be executed whatever `exec_writable` says.
    pub read_write: Vec<PathBuf>,
    /// Git metadata in the caller's writable paths, bound read-only over them (files or
    /// directories; see `filesystem.protect_git`).
    #[serde(default)]
    pub git_read_only: Vec<PathBuf>,
    /// Directories holding a nested git directory, bound onto themselves as writable as the
    /// caller's path they lie in, so that they cannot be renamed or removed.
    #[serde(default)]
    pub git_pinned: Vec<PathBuf>,
    /// Which object each of `git_read_only` and `git_pinned` was when the supervisor found
    /// it: each is bound from a descriptor opened again below its writable root and checked
    /// to be the same, onto a mount point reached the same way, never by its path.
    #[serde(default)]
    pub git_found: Vec<crate::confine::found::Found>,
    /// `filesystem.protect_git` is in force: every `.git` in the writable paths is listed in
    /// `git_read_only`.
    #[serde(default)]
    pub protect_git: bool,
    /// The program's working directory; the process ends up `chdir`ed into it.
    pub workdir: Workdir,
    /// The sandbox's `/tmp`.
    pub tmp: TmpfsSpec,
    /// The sandbox's `/dev/shm`.
    pub dev_shm: TmpfsSpec,
    /// When false, every writable mount is `noexec` (write-xor-execute), but the caller's
    /// `workspace` ones.
    pub exec_writable: bool,
    /// The caller's workdir and `read_write` paths are a workspace whose programs may run.
    #[serde(default = "true_by_default")]
    pub workspace: bool,
    /// Bind the host's `/dev/tty` so a program attached to a terminal can reach it.
    pub tty: bool,
    /// Only used by callers to fill `/etc/hosts` and `/etc/hostname`; `sethostname` is theirs.
    pub hostname: String,
    /// Mount `/proc` with `hidepid=invisible` when the kernel allows it (best effort).
    pub proc_hidepid: bool,
    /// A host directory that no source may reach (resolve to it, to a directory holding it, or
    /// to anything in it): airlock's runtime directory, when the init did not cover it (see
    /// `rundir::MemoryScratch::needed`). Checked on the resolved sources, before any mount.
    #[serde(default)]
    pub unreachable: Option<PathBuf>,
}

impl RootfsPlan {
    /// Whether a bind of this plan reaches `dir` (binds it, a directory holding it, or
    /// something in it), judged on the real paths of the caller's paths (a symlink's target)
    /// and on the system lists as given (the same on every host). [`enter`] checks
    /// [`RootfsPlan::unreachable`] again on what every source resolves to.
    pub fn reaches(&self, dir: &Path) -> bool {
        let callers = [
            &self.read_only,
            &self.read_write,
            &self.git_read_only,
            &self.git_pinned,
        ];
        let workdir = match &self.workdir {
            Workdir::Bind { host, .. } => Some(host),
            Workdir::Tmpfs { .. } => None,
        };
        let real = |path: &PathBuf| std::fs::canonicalize(path).unwrap_or_else(|_| path.clone());
        let system = self.system_ro.iter().chain(&self.etc_files).cloned();
        let mut sources = callers
            .into_iter()
            .flatten()
            .chain(workdir)
            .map(real)
            .chain(system);
        sources.any(|source| reaches(&source, dir))
    }
}

/// Whether a bind of `source` shows `dir` or anything in it, or lies in it.
pub(crate) fn reaches(source: &Path, dir: &Path) -> bool {
    dir.starts_with(source) || source.starts_with(dir)
}

/// Where the operations build the root and find the host.
#[derive(Debug, Clone, Copy)]
struct Layout {
    /// The directory the new root is built at.
    pub new_root: &'static str,
    /// The host's root as seen while building.
    pub host: &'static str,
    /// An empty directory of the root, mode 0555, that a `/proc` mount or a run's own mount
    /// covers: what a masked `/proc` directory shows ([`ProcProtection::MaskDir`]).
    pub mask_dir: &'static str,
}

/// The root built in place, with the host root left where it is, over the host's `/dev/shm`,
/// which no plan can take a host path from (`/dev` is reserved; the device nodes bound from
/// it lie beside it), so it hides no source: a cold run's (one `pivot_root` makes it `/` and
/// one detach drops the host) and a root prepared once in a zygote template's own mount
/// namespace and entered by many runs.
const IN_PLACE: Layout = Layout {
    new_root: "/dev/shm",
    host: "/",
    mask_dir: "/proc",
};

/// A cold run's fallback where [`IN_PLACE`] would hide a source (a host without a `/dev/shm`
/// directory, or a source that resolves below it): the staging root holds both (bubblewrap's
/// two-pivot scheme).
const STAGED: Layout = Layout {
    new_root: execute::NEW_ROOT,
    host: execute::OLD_ROOT,
    mask_dir: "/proc",
};

/// A file created inside the sandbox with fixed contents.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct GeneratedFile {
    pub path: PathBuf,
    pub contents: String,
    /// Permission bits, e.g. `0o644`.
    pub mode: u32,
}

/// Where the program works.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub enum Workdir {
    /// A host directory bound at the same path: the caller's, so programs in it may be
    /// executed; read-only unless `writable`.
    Bind {
        host: PathBuf,
        #[serde(default = "true_by_default")]
        writable: bool,
    },
    /// A fresh, size- and inode-capped tmpfs at `path`.
    Tmpfs {
        path: PathBuf,
        size_bytes: u64,
        max_files: u64,
    },
}

impl Workdir {
    /// The path the program sees as its working directory.
    pub fn path(&self) -> &Path {
        match self {
            Workdir::Bind { host, .. } => host,
            Workdir::Tmpfs { path, .. } => path,
        }
    }
}

fn true_by_default() -> bool {
    true
}

/// Caps for a tmpfs: `size=` and `nr_inodes=`. Both must be non-zero (zero means unlimited).
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq)]
pub struct TmpfsSpec {
    pub size_bytes: u64,
    pub max_files: u64,
}

/// What [`enter`] could not do without failing.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Default)]
pub struct RootfsReport {
    /// Optional system, `/etc` or `/proc` paths that do not exist on this host.
    pub skipped: Vec<PathBuf>,
    /// `/proc` paths that exist but could not be made read-only or masked (a weaker sandbox).
    pub unprotected: Vec<PathBuf>,
}

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RootfsError {
    #[error("invalid {role} path {path}: {reason}")]
    InvalidPath {
        role: &'static str,
        path: PathBuf,
        reason: &'static str,
    },
    #[error(
        "{role} path {path} does not exist on the host; create it or remove it from the policy"
    )]
    MissingPath { role: &'static str, path: PathBuf },
    #[error("tmpfs for {path} needs a non-zero size and file count (zero would mean unlimited)")]
    UnboundedTmpfs { path: PathBuf },
    #[error(
        "generated file {path} lies under the mount at {mount} and would be hidden; \
         move it or drop that mount"
    )]
    HiddenGeneratedFile { path: PathBuf, mount: PathBuf },
    #[error("refusing to build the root filesystem outside a fresh pid namespace (pid is {pid}, expected 1)")]
    NotSandboxInit { pid: i32 },
    #[error("cannot create a mount namespace for the run directory: {source}")]
    Unshare { source: nix::Error },
    #[error("failed to make the mount tree private: {source}")]
    MakePrivate { source: nix::Error },
    #[error("failed to mount {fstype} at {path}: {source}")]
    MountFs {
        fstype: &'static str,
        path: PathBuf,
        source: nix::Error,
    },
    #[error("failed to bind {src} onto {dst}: {source}")]
    Bind {
        src: PathBuf,
        dst: PathBuf,
        source: nix::Error,
    },
    #[error("failed to remount {path} with restricted flags: {source}")]
    Remount { path: PathBuf, source: nix::Error },
    #[error("failed to pivot the root into {path}: {source}")]
    Pivot { path: PathBuf, source: nix::Error },
    #[error("failed to unmount {path}: {source}")]
    Unmount { path: PathBuf, source: nix::Error },
    #[error("failed to change directory to {path}: {source}")]
    Chdir { path: PathBuf, source: nix::Error },
    #[error(
        "{path} changed while the sandbox was set up ({source}): another program sharing the \
         workspace replaced it, or a directory on its way (with a symlink, perhaps to the \
         host's files); nothing was bound; run again once nothing else changes the workspace"
    )]
    Changed {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(
        "the bind source {path} reaches {dir}, which holds airlock's runs and is not covered \
         for this run: it resolved differently when the run was planned (a symlink changed \
         meanwhile); run again once nothing else changes it"
    )]
    ReachesUncovered { path: PathBuf, dir: PathBuf },
    #[error("a shared root built over {dir} would hide a source; each sandbox builds its own")]
    SharedRootHidesSource { dir: PathBuf },
    #[error("this plan binds a host path under a mount each run makes; no root is shared")]
    NotShareable,
    #[error("failed to {action} {path}: {source}")]
    Io {
        action: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
}

/// Host directories that make up a usable userland. Merged-usr symlinks are recreated.
pub fn default_system_ro() -> Vec<PathBuf> {
    ["/usr", "/lib", "/lib64", "/lib32", "/bin", "/sbin"]
        .iter()
        .map(PathBuf::from)
        .collect()
}

/// `/etc` entries programs need to link, resolve names, verify TLS and find their config.
/// Deliberately absent: passwd/group/shadow/hosts/hostname/resolv.conf (generated by the caller)
/// and anything host-identifying. `python3*` is expanded against this host's `/etc`.
pub fn default_etc_files() -> Vec<PathBuf> {
    const FIXED: &[&str] = &[
        "ld.so.cache",
        "ld.so.conf",
        "ld.so.conf.d",
        "alternatives",
        "ssl",
        "ca-certificates",
        "ca-certificates.conf",
        "pki",
        "localtime",
        "timezone",
        "nsswitch.conf",
        "host.conf",
        "gai.conf",
        "protocols",
        "services",
        "mime.types",
        "terminfo",
        "perl",
    ];
    let etc = Path::new("/etc");
    let mut entries: Vec<PathBuf> = FIXED.iter().map(|name| etc.join(name)).collect();
    entries.extend(source::python_etc_entries(etc));
    entries
}

/// Host-side pre-check of a plan, so mistakes surface as clear errors before any namespace
/// exists: every path is absolute without `..`, user bind paths exist, tmpfs caps are bounded,
/// and no generated file would be hidden under a mount.
pub fn validate(plan: &RootfsPlan) -> Result<(), RootfsError> {
    for path in &plan.system_ro {
        check_mount_path("system", path)?;
    }
    for path in &plan.etc_files {
        check_mount_path("etc", path)?;
    }
    for (role, paths) in [
        ("read-only", &plan.read_only),
        ("read-write", &plan.read_write),
        ("git read-only", &plan.git_read_only),
        ("git pinned", &plan.git_pinned),
    ] {
        for path in paths {
            check_user_bind(role, path)?;
        }
    }
    match &plan.workdir {
        Workdir::Bind { host, .. } => check_user_bind("workdir", host)?,
        Workdir::Tmpfs {
            path,
            size_bytes,
            max_files,
        } => {
            check_mount_path("workdir", path)?;
            check_tmpfs_caps(path, *size_bytes, *max_files)?;
        }
    }
    check_tmpfs_caps(Path::new("/tmp"), plan.tmp.size_bytes, plan.tmp.max_files)?;
    check_tmpfs_caps(
        Path::new("/dev/shm"),
        plan.dev_shm.size_bytes,
        plan.dev_shm.max_files,
    )?;
    check_generated_files(plan)
}

/// Destinations the rootfs itself owns: binding a host path there would either be hidden or
/// expose host kernel state (`/proc`, `/sys` of the host).
const RESERVED: &[&str] = &["/proc", "/sys", "/dev"];

fn check_mount_path(role: &'static str, path: &Path) -> Result<(), RootfsError> {
    let invalid = |reason| RootfsError::InvalidPath {
        role,
        path: path.to_path_buf(),
        reason,
    };
    if !path.is_absolute() {
        return Err(invalid("it must be absolute"));
    }
    if path.components().any(|c| c == Component::ParentDir) {
        return Err(invalid("it must not contain `..`"));
    }
    if path.parent().is_none() {
        return Err(invalid(
            "`/` itself cannot be mounted; list its subdirectories",
        ));
    }
    if RESERVED.iter().any(|reserved| path.starts_with(reserved)) {
        return Err(invalid(
            "/proc, /sys and /dev are built by the sandbox and cannot take host paths",
        ));
    }
    Ok(())
}

fn check_user_bind(role: &'static str, path: &Path) -> Result<(), RootfsError> {
    check_mount_path(role, path)?;
    if !path.exists() {
        return Err(RootfsError::MissingPath {
            role,
            path: path.to_path_buf(),
        });
    }
    Ok(())
}

fn check_tmpfs_caps(path: &Path, size_bytes: u64, max_files: u64) -> Result<(), RootfsError> {
    if size_bytes == 0 || max_files == 0 {
        return Err(RootfsError::UnboundedTmpfs {
            path: path.to_path_buf(),
        });
    }
    Ok(())
}

fn check_generated_files(plan: &RootfsPlan) -> Result<(), RootfsError> {
    let mounts = covering_mounts(plan);
    for file in &plan.generated_files {
        check_mount_path("generated file", &file.path)?;
        if let Some(mount) = mounts.iter().find(|mount| file.path.starts_with(mount)) {
            return Err(RootfsError::HiddenGeneratedFile {
                path: file.path.clone(),
                mount: mount.clone(),
            });
        }
    }
    Ok(())
}

/// Every destination that gets a mount on top of the root tmpfs (an `etc_files` entry equal to a
/// generated file is dropped by the planner, so it does not count).
fn covering_mounts(plan: &RootfsPlan) -> Vec<PathBuf> {
    let generated: BTreeSet<&Path> = plan
        .generated_files
        .iter()
        .map(|f| f.path.as_path())
        .collect();
    let mut mounts: Vec<PathBuf> = ["/proc", "/dev", "/tmp"].map(PathBuf::from).into();
    mounts.extend(plan.system_ro.iter().cloned());
    mounts.extend(
        plan.etc_files
            .iter()
            .filter(|p| !generated.contains(p.as_path()))
            .cloned(),
    );
    mounts.extend(plan.read_only.iter().cloned());
    mounts.extend(plan.read_write.iter().cloned());
    mounts.push(plan.workdir.path().to_path_buf());
    mounts
}

/// Builds the plan's root filesystem and makes it this process's `/`, then `chdir`s into the
/// workdir. Must run as PID 1 of fresh user, mount and pid namespaces (see module docs); refuses
/// otherwise, because on the host it would re-root the caller's mount namespace.
pub fn enter(plan: &RootfsPlan) -> Result<RootfsReport, RootfsError> {
    validate(plan)?;
    let pid = nix::unistd::getpid().as_raw();
    if pid != 1 {
        return Err(RootfsError::NotSandboxInit { pid });
    }
    execute::run_cold(&plan_operations(plan), IN_PLACE, Some(STAGED), plan)
}

/// Builds the part of the plan's root that every run shares, read-only, in this process's
/// own mount namespace (an interpreter zygote's template, holding the capabilities of its
/// user namespace), where [`enter_prepared`] finds it. The host root stays this process's
/// `/`.
pub fn prepare(plan: &RootfsPlan) -> Result<RootfsReport, RootfsError> {
    validate(plan)?;
    execute::run(&plan_prepared_root(plan), IN_PLACE, &plan.git_found)
}

/// A run's root from the one [`prepare`] built: this run's own `/proc`, `/tmp`, `/dev/shm`
/// and workdir mounted on its own copy, then the pivot into it and the host dropped. Must
/// run as PID 1 of fresh user, mount and pid namespaces created under the preparing process.
pub fn enter_prepared(plan: &RootfsPlan) -> Result<RootfsReport, RootfsError> {
    let pid = nix::unistd::getpid().as_raw();
    if pid != 1 {
        return Err(RootfsError::NotSandboxInit { pid });
    }
    execute::run(&plan_prepared_run(plan), IN_PLACE, &plan.git_found)
}

/// Builds the root a warm pool's sandboxes share ([`plan_shared_root`]) and makes it this
/// process's `/`, dropping the host and sealing its tmpfs superblock read-only. Must run as
/// PID 1 of fresh user, mount and PID namespaces made for it alone (the PID namespace ends
/// with this process, which leaves the root's own `/proc` empty for good).
pub fn build_shared(plan: &RootfsPlan) -> Result<RootfsReport, RootfsError> {
    validate(plan)?;
    let pid = nix::unistd::getpid().as_raw();
    if pid != 1 {
        return Err(RootfsError::NotSandboxInit { pid });
    }
    let ops = plan_shared_root(plan).ok_or(RootfsError::NotShareable)?;
    execute::run_cold(&ops, IN_PLACE, None, plan)
}

/// A sandbox's root from its copy of a shared root ([`build_shared`]), which is already its
/// `/`: this run's own `/proc`, `/tmp`, `/dev/shm` and workdir mounted on it. Must run as
/// PID 1 of fresh user, mount and PID namespaces made inside the shared root's.
pub fn enter_shared(plan: &RootfsPlan) -> Result<RootfsReport, RootfsError> {
    let pid = nix::unistd::getpid().as_raw();
    if pid != 1 {
        return Err(RootfsError::NotSandboxInit { pid });
    }
    execute::run(&plan_shared_run(plan), SHARED, &plan.git_found)
}

/// A sandbox's copy of a shared root: the root is `/`, and there is no host. Its `/proc` is
/// covered by the shared root's own (not empty), so masks come from a directory under
/// `/tmp`, which the run's `/tmp` covers.
const SHARED: Layout = Layout {
    new_root: "/",
    host: "/",
    mask_dir: shared::SHARED_MASK_DIR,
};

#[cfg(test)]
mod tests;
