//! The effectful half of [`super::enter`]: executes [`MountOp`]s in order.
//!
//! Layout while building (bubblewrap's two-pivot scheme): a small staging tmpfs is mounted over
//! `/tmp` (any directory would do: the namespace is private, so the host never sees it) and
//! becomes the root by a first `pivot_root`, which moves the host root to `/oldroot` and, because
//! the staging mount itself moves to `/`, uncovers the host's `/tmp` again. The sandbox root is
//! built at `/newroot` from sources under `/oldroot`, so no mount we make can hide a source.
//! Sources are resolved to symlink-free paths before the first pivot, since an absolute host
//! symlink would otherwise resolve against the staging root. Finally `/oldroot` is detached and
//! `pivot_root(".", ".")` inside `/newroot` stacks the staging root on top of the new one, where
//! `umount2(".", MNT_DETACH)` removes it without needing a put-old directory in the new root.

use std::fs::{self, DirBuilder, File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{symlink, DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};

use nix::mount::{mount, umount2, MntFlags, MsFlags};
use nix::sys::statvfs::{statvfs, FsFlags};
use nix::unistd::{chdir, fchdir, pivot_root};

use super::mountinfo::submounts_under;
use super::plan::{BindAccess, MountOp, ProcProtection};
use super::{RootfsError, RootfsReport};

const STAGING: &str = "/tmp";
const NEW_ROOT: &str = "/newroot";
const OLD_ROOT: &str = "/oldroot";
/// Holds two directories only.
const STAGING_OPTIONS: &str = "size=16k,nr_inodes=8,mode=0755";
/// The root holds mount points and generated files, and is sealed read-only before exec.
const NEW_ROOT_OPTIONS: &str = "size=4m,nr_inodes=4096,mode=0755";

/// A host path as found before the first pivot.
enum HostEntry {
    Absent,
    Symlink(PathBuf),
    /// Symlink-free path, and whether it is a directory.
    Real(PathBuf, bool),
}

pub fn run(ops: &[MountOp]) -> Result<RootfsReport, RootfsError> {
    let sources = ops
        .iter()
        .map(resolve_source)
        .collect::<Result<Vec<_>, _>>()?;
    let dev_null = resolve_real(Path::new("/dev/null"))?;
    let mut executor = Executor {
        dev_null,
        report: RootfsReport::default(),
        proc_mounts: Vec::new(),
    };
    for (op, source) in ops.iter().zip(sources) {
        executor.apply(op, source)?;
    }
    Ok(executor.report)
}

fn resolve_source(op: &MountOp) -> Result<Option<HostEntry>, RootfsError> {
    match op {
        MountOp::MirrorReadOnly { path } => resolve_optional(path).map(Some),
        MountOp::Bind { path, .. } => resolve_real(path).map(Some),
        _ => Ok(None),
    }
}

fn resolve_optional(path: &Path) -> Result<HostEntry, RootfsError> {
    match fs::symlink_metadata(path) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(HostEntry::Absent),
        Err(e) => Err(io_error("inspect", path, e)),
        Ok(meta) if meta.file_type().is_symlink() => fs::read_link(path)
            .map(HostEntry::Symlink)
            .map_err(|e| io_error("read the symlink", path, e)),
        Ok(_) => resolve_real(path),
    }
}

fn resolve_real(path: &Path) -> Result<HostEntry, RootfsError> {
    let real = fs::canonicalize(path).map_err(|e| io_error("resolve", path, e))?;
    let is_dir = real.is_dir();
    Ok(HostEntry::Real(real, is_dir))
}

fn io_error(action: &'static str, path: &Path, source: io::Error) -> RootfsError {
    RootfsError::Io {
        action,
        path: path.to_path_buf(),
        source,
    }
}

/// `inner` (an absolute path) re-rooted under `root`.
fn under(root: &str, inner: &Path) -> PathBuf {
    Path::new(root).join(inner.strip_prefix("/").unwrap_or(inner))
}

struct Executor {
    dev_null: HostEntry,
    report: RootfsReport,
    /// The mounts placed under the fresh `/proc` so far: its only submounts, since a new procfs
    /// mount has no children of its own.
    proc_mounts: Vec<PathBuf>,
}

impl Executor {
    fn apply(&mut self, op: &MountOp, source: Option<HostEntry>) -> Result<(), RootfsError> {
        match op {
            MountOp::MakeMountsPrivate => make_mounts_private(),
            MountOp::EnterStaging => enter_staging(),
            MountOp::MountNewRoot => mount_tmpfs(Path::new(NEW_ROOT), NEW_ROOT_OPTIONS, false),
            MountOp::MakeDir { path } => make_dirs(&under(NEW_ROOT, path)),
            MountOp::WriteFile {
                path,
                contents,
                mode,
            } => write_file(&under(NEW_ROOT, path), contents, *mode),
            MountOp::MirrorReadOnly { path } => self.mirror(path, source),
            MountOp::Bind { path, access } => match source {
                Some(HostEntry::Real(real, is_dir)) => bind(
                    &under(OLD_ROOT, &real),
                    &under(NEW_ROOT, path),
                    is_dir,
                    *access,
                ),
                _ => Err(RootfsError::MissingPath {
                    role: "bind",
                    path: path.clone(),
                }),
            },
            MountOp::Tmpfs {
                path,
                size_bytes,
                max_files,
                mode,
                exec,
            } => {
                let options = format!("size={size_bytes},nr_inodes={max_files},mode={mode:o}");
                mount_tmpfs(&under(NEW_ROOT, path), &options, *exec)
            }
            MountOp::Symlink { target, link } => make_symlink(target, &under(NEW_ROOT, link)),
            MountOp::RemountReadOnly { path } => seal(&under(NEW_ROOT, path)),
            MountOp::MountProc { hidepid } => mount_proc(*hidepid),
            MountOp::ProtectProc { path, how } => {
                self.protect_proc(path, *how);
                Ok(())
            }
            MountOp::DetachHost => detach(Path::new(OLD_ROOT)),
            MountOp::PivotIntoNewRoot => pivot_into_new_root(),
            MountOp::RemountRootReadOnly => seal(Path::new("/")),
            MountOp::Chdir { path } => chdir(path.as_path()).map_err(|source| RootfsError::Chdir {
                path: path.clone(),
                source,
            }),
        }
    }

    fn mirror(&mut self, path: &Path, source: Option<HostEntry>) -> Result<(), RootfsError> {
        let dest = under(NEW_ROOT, path);
        match source {
            Some(HostEntry::Real(real, is_dir)) => {
                let read_only = BindAccess {
                    writable: false,
                    exec: true,
                    devices: false,
                };
                bind(&under(OLD_ROOT, &real), &dest, is_dir, read_only)
            }
            Some(HostEntry::Symlink(target)) => make_symlink(&target, &dest),
            Some(HostEntry::Absent) | None => {
                self.report.skipped.push(path.to_path_buf());
                Ok(())
            }
        }
    }

    fn protect_proc(&mut self, path: &Path, how: ProcProtection) {
        let dest = under(NEW_ROOT, path);
        let Ok(meta) = fs::symlink_metadata(&dest) else {
            self.report.skipped.push(path.to_path_buf());
            return;
        };
        let outcome = match (how, &self.dev_null) {
            (ProcProtection::ReadOnly, _) => {
                let placed = Submounts::Placed(&self.proc_mounts);
                restrict_bind(&dest, &dest, PROC_READ_ONLY, placed)
            }
            (ProcProtection::MaskFile, HostEntry::Real(null, _)) if !meta.is_dir() => {
                restrict_bind(
                    &under(OLD_ROOT, null),
                    &dest,
                    NULL_MASK,
                    Submounts::FromHost,
                )
            }
            (ProcProtection::MaskDir, _) if meta.is_dir() => mask_dir(&dest),
            _ => Err(RootfsError::Remount {
                path: dest.clone(),
                source: nix::Error::ENOTSUP,
            }),
        };
        match outcome {
            Ok(()) => self.proc_mounts.push(dest),
            Err(_) => self.report.unprotected.push(path.to_path_buf()),
        }
    }
}

const PROC_READ_ONLY: BindAccess = BindAccess {
    writable: false,
    exec: false,
    devices: false,
};
/// Devices stay usable so a masked file reads as empty rather than failing.
const NULL_MASK: BindAccess = BindAccess {
    writable: false,
    exec: false,
    devices: true,
};

pub(super) fn make_mounts_private() -> Result<(), RootfsError> {
    let flags = MsFlags::MS_REC | MsFlags::MS_PRIVATE;
    mount(None::<&str>, "/", None::<&str>, flags, None::<&str>)
        .map_err(|source| RootfsError::MakePrivate { source })
}

fn enter_staging() -> Result<(), RootfsError> {
    let staging = Path::new(STAGING);
    mount_tmpfs(staging, STAGING_OPTIONS, false)?;
    for dir in [NEW_ROOT, OLD_ROOT] {
        make_dirs(&under(STAGING, Path::new(dir)))?;
    }
    let put_old = under(STAGING, Path::new(OLD_ROOT));
    pivot_root(staging, &put_old).map_err(|source| RootfsError::Pivot {
        path: staging.to_path_buf(),
        source,
    })?;
    chdir("/").map_err(|source| RootfsError::Chdir {
        path: "/".into(),
        source,
    })
}

fn pivot_into_new_root() -> Result<(), RootfsError> {
    let new_root = Path::new(NEW_ROOT);
    let staging_root = File::open("/").map_err(|e| io_error("open", Path::new("/"), e))?;
    let chdir_error = |path: &Path| {
        let path = path.to_path_buf();
        move |source| RootfsError::Chdir { path, source }
    };
    chdir(new_root).map_err(chdir_error(new_root))?;
    pivot_root(".", ".").map_err(|source| RootfsError::Pivot {
        path: new_root.to_path_buf(),
        source,
    })?;
    // The staging root now sits on top of the new root; step into it to unmount it.
    fchdir(staging_root.as_raw_fd()).map_err(chdir_error(Path::new("staging root")))?;
    detach(Path::new("."))?;
    chdir("/").map_err(chdir_error(Path::new("/")))
}

fn detach(path: &Path) -> Result<(), RootfsError> {
    umount2(path, MntFlags::MNT_DETACH).map_err(|source| RootfsError::Unmount {
        path: path.to_path_buf(),
        source,
    })
}

pub(super) fn mount_tmpfs(path: &Path, options: &str, exec: bool) -> Result<(), RootfsError> {
    make_dirs(path)?;
    let mut flags = MsFlags::MS_NOSUID | MsFlags::MS_NODEV;
    if !exec {
        flags |= MsFlags::MS_NOEXEC;
    }
    mount(Some("tmpfs"), path, Some("tmpfs"), flags, Some(options)).map_err(|source| {
        RootfsError::MountFs {
            fstype: "tmpfs",
            path: path.to_path_buf(),
            source,
        }
    })
}

fn mount_proc(hidepid: bool) -> Result<(), RootfsError> {
    let path = under(NEW_ROOT, Path::new("/proc"));
    make_dirs(&path)?;
    let flags = MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC;
    let attempt = |options: Option<&str>| mount(Some("proc"), &path, Some("proc"), flags, options);
    // The fresh pid namespace already hides the host; hidepid only hides siblings' details.
    let mounted = match hidepid {
        true => attempt(Some("hidepid=invisible")).or_else(|_| attempt(None)),
        false => attempt(None),
    };
    mounted.map_err(|source| RootfsError::MountFs {
        fstype: "proc",
        path,
        source,
    })
}

fn mask_dir(dest: &Path) -> Result<(), RootfsError> {
    let flags = MsFlags::MS_RDONLY | MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC;
    let options = "size=4k,nr_inodes=1,mode=0555";
    mount(Some("tmpfs"), dest, Some("tmpfs"), flags, Some(options)).map_err(|source| {
        RootfsError::MountFs {
            fstype: "tmpfs",
            path: dest.to_path_buf(),
            source,
        }
    })
}

/// Bind `src` onto `dst`, creating the mount point (a directory or an empty file).
fn bind(src: &Path, dst: &Path, is_dir: bool, access: BindAccess) -> Result<(), RootfsError> {
    if is_dir {
        make_dirs(dst)?;
    } else {
        make_mount_file(dst)?;
    }
    restrict_bind(src, dst, access, Submounts::FromHost)
}

/// Where the submounts a recursive bind brought along are found.
enum Submounts<'a> {
    /// In the mount table (for a host source, only if the table had mounts beneath it).
    FromHost,
    /// Among these mounts, all the source can have: reading the table costs more than the
    /// bind itself (four reads were ~0.4 ms of a native run's start).
    Placed(&'a [PathBuf]),
}

/// Recursive bind (a non-recursive bind of a tree with locked submounts is refused in a user
/// namespace), then remount it and each submount with `access` (bubblewrap's `bind_mount`).
fn restrict_bind(
    src: &Path,
    dst: &Path,
    access: BindAccess,
    submounts: Submounts,
) -> Result<(), RootfsError> {
    let flags = MsFlags::MS_BIND | MsFlags::MS_REC;
    mount(Some(src), dst, None::<&str>, flags, None::<&str>).map_err(|source| {
        RootfsError::Bind {
            src: src.to_path_buf(),
            dst: dst.to_path_buf(),
            source,
        }
    })?;
    remount(dst, wanted_flags(access))?;
    if !dst.is_dir() {
        return Ok(());
    }
    let beneath = match submounts {
        Submounts::Placed(placed) => placed
            .iter()
            .filter(|mount| *mount != dst && mount.starts_with(dst))
            .cloned()
            .collect(),
        // Only a host source with a mount beneath it in the table as it was before the first
        // bind can have brought submounts along; other sources are checked in the live table.
        Submounts::FromHost if src.starts_with(OLD_ROOT) && !has_submounts(src)? => Vec::new(),
        Submounts::FromHost => submounts_under(&read_mountinfo()?, dst),
    };
    for submount in beneath {
        match remount(&submount, wanted_flags(access)) {
            // Unreachable for us means unreachable for the sandbox too.
            Err(RootfsError::Remount {
                source: nix::Error::EACCES,
                ..
            }) => {}
            other => other?,
        }
    }
    Ok(())
}

fn read_mountinfo() -> Result<String, RootfsError> {
    let path = under(OLD_ROOT, Path::new("/proc/self/mountinfo"));
    fs::read_to_string(&path).map_err(|e| io_error("read", &path, e))
}

/// Whether a host bind source has mounts beneath it. The table is read once: binds only add
/// mounts under the new root, never under the old one, so the first snapshot answers for every
/// host source.
fn has_submounts(src: &Path) -> Result<bool, RootfsError> {
    static SNAPSHOT: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    let snapshot = match SNAPSHOT.get() {
        Some(snapshot) => snapshot,
        None => SNAPSHOT.get_or_init(|| read_mountinfo().unwrap_or_default()),
    };
    Ok(snapshot.is_empty() || !submounts_under(snapshot, src).is_empty())
}

fn wanted_flags(access: BindAccess) -> MsFlags {
    let mut flags = MsFlags::MS_NOSUID;
    if !access.writable {
        flags |= MsFlags::MS_RDONLY;
    }
    if !access.exec {
        flags |= MsFlags::MS_NOEXEC;
    }
    if !access.devices {
        flags |= MsFlags::MS_NODEV;
    }
    flags
}

/// A bind remount must repeat the flags a user namespace locks on the source mount (read-only,
/// nosuid, nodev, noexec, atime), or the kernel refuses it with EPERM.
fn remount(path: &Path, wanted: MsFlags) -> Result<(), RootfsError> {
    let error = |source| RootfsError::Remount {
        path: path.to_path_buf(),
        source,
    };
    let locked = locked_flags(path).map_err(error)?;
    let flags = MsFlags::MS_BIND | MsFlags::MS_REMOUNT | locked | wanted;
    mount(None::<&str>, path, None::<&str>, flags, None::<&str>).map_err(error)
}

fn locked_flags(path: &Path) -> nix::Result<MsFlags> {
    let current = statvfs(path)?.flags();
    let pairs = [
        (FsFlags::ST_RDONLY, MsFlags::MS_RDONLY),
        (FsFlags::ST_NOSUID, MsFlags::MS_NOSUID),
        (FsFlags::ST_NODEV, MsFlags::MS_NODEV),
        (FsFlags::ST_NOEXEC, MsFlags::MS_NOEXEC),
        (FsFlags::ST_NOATIME, MsFlags::MS_NOATIME),
        (FsFlags::ST_NODIRATIME, MsFlags::MS_NODIRATIME),
        (FsFlags::ST_RELATIME, MsFlags::MS_RELATIME),
    ];
    let mut flags = pairs
        .into_iter()
        .filter(|(st, _)| current.contains(*st))
        .fold(MsFlags::empty(), |acc, (_, ms)| acc | ms);
    // Without either flag the source is strictatime; left out, the kernel would default the
    // remount to relatime and refuse a change of locked atime flags.
    if !flags.intersects(MsFlags::MS_NOATIME | MsFlags::MS_RELATIME) {
        flags |= MsFlags::MS_STRICTATIME;
    }
    Ok(flags)
}

/// Make an already-populated mount read-only; everything we seal is nosuid, nodev, noexec.
fn seal(path: &Path) -> Result<(), RootfsError> {
    let sealed = MsFlags::MS_RDONLY | MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC;
    remount(path, sealed)
}

fn make_dirs(path: &Path) -> Result<(), RootfsError> {
    DirBuilder::new()
        .recursive(true)
        .mode(0o755)
        .create(path)
        .map_err(|e| io_error("create the directory", path, e))
}

fn make_parent_dirs(path: &Path) -> Result<(), RootfsError> {
    match path.parent() {
        Some(parent) => make_dirs(parent),
        None => Ok(()),
    }
}

fn make_mount_file(path: &Path) -> Result<(), RootfsError> {
    make_parent_dirs(path)?;
    OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(false)
        .open(path)
        .map(drop)
        .map_err(|e| io_error("create the mount point", path, e))
}

fn make_symlink(target: &Path, link: &Path) -> Result<(), RootfsError> {
    make_parent_dirs(link)?;
    symlink(target, link).map_err(|e| io_error("create the symlink", link, e))
}

fn write_file(path: &Path, contents: &str, mode: u32) -> Result<(), RootfsError> {
    make_parent_dirs(path)?;
    fs::write(path, contents).map_err(|e| io_error("write", path, e))?;
    fs::set_permissions(path, fs::Permissions::from_mode(mode))
        .map_err(|e| io_error("set the mode of", path, e))
}
