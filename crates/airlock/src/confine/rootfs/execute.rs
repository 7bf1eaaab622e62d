//! The effectful half of [`super::enter`]: executes [`MountOp`]s in order.
//!
//! A cold run's layout (`run_cold`): the new root is a tmpfs mounted over the host's
//! `/dev/shm` in the run's private mount namespace, where it hides no source, and built from
//! sources at their host paths. `pivot_root(".", ".")` inside it stacks the host root on top
//! of the new one, where `umount2(".", MNT_DETACH)` removes the whole host tree without
//! needing a put-old directory in the new root: one root switch and one detach (each detach
//! waits for an RCU grace period).
//!
//! The fallback, where that would hide a source (bubblewrap's two-pivot scheme): a small
//! staging tmpfs is mounted over `/tmp` (any directory would do: the namespace is private, so
//! the host never sees it) and becomes the root by a first `pivot_root`, which moves the host
//! root to `/oldroot` and, because the staging mount itself moves to `/`, uncovers the host's
//! `/tmp` again. The sandbox root is built at `/newroot` from sources under `/oldroot`, so no
//! mount we make can hide a source; `/oldroot` is detached before the second pivot, which then
//! stacks the staging root on the new one.
//!
//! Either way sources are resolved to symlink-free paths first, since an absolute host symlink
//! would resolve against the staging root after its pivot.

use std::fs::{self, DirBuilder, File, OpenOptions};
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::{symlink, DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};

use nix::mount::{mount, umount2, MntFlags, MsFlags};
use nix::unistd::{chdir, fchdir, pivot_root};
use rustix::fs::CWD;

use super::by_fd;
use super::source::{HostEntry, Resolver};
use crate::confine::found::Found;
use crate::linux::sys;

use super::plan::{BindAccess, MountOp, ProcProtection};
use super::{Layout, RootfsError, RootfsPlan, RootfsReport};

const STAGING: &str = "/tmp";
pub(super) const NEW_ROOT: &str = "/newroot";
pub(super) const OLD_ROOT: &str = "/oldroot";
/// Holds two directories only.
const STAGING_OPTIONS: &str = "size=16k,nr_inodes=8,mode=0755";
/// The root holds mount points and generated files, and is sealed read-only before exec.
const NEW_ROOT_OPTIONS: &str = "size=4m,nr_inodes=4096,mode=0755";

pub(super) fn run(
    ops: &[MountOp],
    layout: Layout,
    found: &[Found],
) -> Result<RootfsReport, RootfsError> {
    let (sources, dev_null) = resolve_sources(ops, found)?;
    execute(ops, sources, dev_null, layout)
}

/// A cold run's root: built in place (`in_place`, the host root where it is) when the
/// directory it is built over hides no source, else by bubblewrap's staging scheme
/// (`staged`), [`with_staging`]'s two more operations; without one (a shared root), refused.
pub(super) fn run_cold(
    ops: &[MountOp],
    in_place: Layout,
    staged: Option<Layout>,
    plan: &RootfsPlan,
) -> Result<RootfsReport, RootfsError> {
    let (sources, dev_null) = resolve_sources(ops, &plan.git_found)?;
    if let Some(dir) = &plan.unreachable {
        refuse_reaching(&sources, dir)?;
    }
    if hides_no_source(Path::new(in_place.new_root), &sources, &dev_null) {
        return execute(ops, sources, dev_null, in_place);
    }
    let dir = in_place.new_root.into();
    let staged = staged.ok_or(RootfsError::SharedRootHidesSource { dir })?;
    let (ops, sources) = with_staging(ops, sources);
    execute(&ops, sources, dev_null, staged)
}

type Sources = Vec<Option<HostEntry>>;

/// Each operation's source, and `/dev/null` (for masks), resolved before anything is mounted.
fn resolve_sources(ops: &[MountOp], found: &[Found]) -> Result<(Sources, HostEntry), RootfsError> {
    let mut resolver = Resolver::default();
    let sources = ops
        .iter()
        .map(|op| resolver.resolve_source(op, found))
        .collect::<Result<Vec<_>, _>>()?;
    let dev_null = resolver.resolve_real(Path::new("/dev/null"))?;
    Ok((sources, dev_null))
}

/// Refuses a source that resolved to `dir`, a directory holding it, or something in it.
fn refuse_reaching(sources: &[Option<HostEntry>], dir: &Path) -> Result<(), RootfsError> {
    let reaching = sources.iter().flatten().find_map(|entry| match entry {
        HostEntry::Real(path, _) if super::reaches(path, dir) => Some(path),
        _ => None,
    });
    match reaching {
        Some(path) => Err(RootfsError::ReachesUncovered {
            path: path.clone(),
            dir: dir.to_path_buf(),
        }),
        None => Ok(()),
    }
}

/// Whether a tmpfs mounted at `build_dir` (a real directory, not a symlink to elsewhere)
/// leaves every source reachable: none was resolved below it. Sources bound from a
/// descriptor are reachable whatever is mounted.
fn hides_no_source(build_dir: &Path, sources: &[Option<HostEntry>], dev_null: &HostEntry) -> bool {
    let is_real_dir = fs::symlink_metadata(build_dir).is_ok_and(|meta| meta.is_dir());
    let below = |entry: &HostEntry| matches!(entry, HostEntry::Real(path, _) if path.starts_with(build_dir));
    is_real_dir && !below(dev_null) && !sources.iter().flatten().any(below)
}

/// `ops` with bubblewrap's staging pivot: into the staging root right after the mounts are
/// made private, and the host detached from under it before the pivot into the new root.
fn with_staging(ops: &[MountOp], sources: Sources) -> (Vec<MountOp>, Sources) {
    let mut staged = Vec::with_capacity(ops.len() + 2);
    let mut staged_sources = Vec::with_capacity(ops.len() + 2);
    for (op, source) in ops.iter().zip(sources) {
        if *op == MountOp::PivotIntoNewRoot {
            staged.push(MountOp::DetachHost);
            staged_sources.push(None);
        }
        staged.push(op.clone());
        staged_sources.push(source);
        if *op == MountOp::MakeMountsPrivate {
            staged.push(MountOp::EnterStaging);
            staged_sources.push(None);
        }
    }
    (staged, staged_sources)
}

fn execute(
    ops: &[MountOp],
    sources: Sources,
    dev_null: HostEntry,
    layout: Layout,
) -> Result<RootfsReport, RootfsError> {
    let mut executor = Executor {
        dev_null,
        mask_source: None,
        report: RootfsReport::default(),
        new_root: Path::new(layout.new_root),
        host: Path::new(layout.host),
        mask_dir: Path::new(layout.mask_dir),
    };
    for (op, source) in ops.iter().zip(sources) {
        executor.apply(op, source)?;
    }
    Ok(executor.report)
}

pub(super) fn io_error(action: &'static str, path: &Path, source: io::Error) -> RootfsError {
    RootfsError::Io {
        action,
        path: path.to_path_buf(),
        source,
    }
}

/// `inner` (an absolute path) re-rooted under `root`.
pub(super) fn under(root: impl AsRef<Path>, inner: &Path) -> PathBuf {
    root.as_ref().join(inner.strip_prefix("/").unwrap_or(inner))
}

struct Executor {
    dev_null: HostEntry,
    /// The root's own `/proc` directory under the `/proc` mount: what a masked directory
    /// shows (see [`ProcProtection::MaskDir`]).
    mask_source: Option<OwnedFd>,
    report: RootfsReport,
    new_root: &'static Path,
    host: &'static Path,
    mask_dir: &'static Path,
}

impl Executor {
    fn apply(&mut self, op: &MountOp, source: Option<HostEntry>) -> Result<(), RootfsError> {
        match op {
            MountOp::MakeMountsPrivate => make_mounts_private(),
            MountOp::EnterStaging => enter_staging(),
            MountOp::MountNewRoot => mount_tmpfs(self.new_root, NEW_ROOT_OPTIONS, false),
            MountOp::BindPreparedRoot => bind_over_itself(self.new_root),
            MountOp::MakeDir { path, mode } => make_dirs_with(&under(self.new_root, path), *mode),
            MountOp::WriteFile {
                path,
                contents,
                mode,
            } => write_file(&under(self.new_root, path), contents, *mode),
            MountOp::MirrorReadOnly { path } => self.mirror(path, source),
            MountOp::Bind { path, access } => match source {
                Some(HostEntry::Found(fd, found)) => {
                    by_fd::bind_found(self.new_root, fd, &found, *access)
                }
                Some(HostEntry::Real(real, is_dir)) => bind(
                    &under(self.host, &real),
                    &under(self.new_root, path),
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
                mount_tmpfs(&under(self.new_root, path), &options, *exec)
            }
            MountOp::Symlink { target, link } => make_symlink(target, &under(self.new_root, link)),
            MountOp::RemountReadOnly { path } => seal(&under(self.new_root, path)),
            MountOp::MountProc { hidepid } => {
                self.mask_source = by_fd::open_mount_point(self.new_root, self.mask_dir);
                mount_proc(self.new_root, *hidepid)
            }
            MountOp::MountEmptyProc => super::shared::mount_empty_proc(self.new_root),
            MountOp::WorkdirBelow { .. } => super::shared::workdir_below(op),
            MountOp::ProtectProc { path, how } => {
                self.protect_proc(path, *how);
                Ok(())
            }
            MountOp::DetachHost => detach(self.host),
            MountOp::PivotIntoNewRoot => pivot_into_new_root(self.new_root),
            MountOp::SealSuperblock => super::shared::seal_superblock(),
            MountOp::RemountRootReadOnly => seal(Path::new("/")),
            MountOp::Chdir { path } => chdir(path.as_path()).map_err(|source| RootfsError::Chdir {
                path: path.clone(),
                source,
            }),
        }
    }

    fn mirror(&mut self, path: &Path, source: Option<HostEntry>) -> Result<(), RootfsError> {
        let dest = under(self.new_root, path);
        match source {
            Some(HostEntry::Real(real, is_dir)) => {
                let read_only = BindAccess {
                    writable: false,
                    exec: true,
                    devices: false,
                };
                bind(&under(self.host, &real), &dest, is_dir, read_only)
            }
            Some(HostEntry::Symlink(target)) => make_symlink(&target, &dest),
            Some(HostEntry::Absent | HostEntry::Found(..)) | None => {
                self.report.skipped.push(path.to_path_buf());
                Ok(())
            }
        }
    }

    fn protect_proc(&mut self, path: &Path, how: ProcProtection) {
        let dest = under(self.new_root, path);
        let Ok(meta) = fs::symlink_metadata(&dest) else {
            self.report.skipped.push(path.to_path_buf());
            return;
        };
        let outcome = match (how, &self.dev_null) {
            (ProcProtection::ReadOnly, _) => {
                let is_dir = meta.is_dir() || (meta.file_type().is_symlink() && dest.is_dir());
                restrict_bind(&dest, &dest, is_dir, PROC_READ_ONLY)
            }
            (ProcProtection::MaskFile, HostEntry::Real(null, _)) if !meta.is_dir() => {
                restrict_bind(&under(self.host, null), &dest, false, NULL_MASK)
            }
            (ProcProtection::MaskDir, _) if meta.is_dir() => match &self.mask_source {
                Some(empty) => by_fd::mask_dir(empty, &dest),
                None => Err(io_error(
                    "open",
                    Path::new("/proc"),
                    io::ErrorKind::NotFound.into(),
                )),
            },
            _ => Err(RootfsError::Remount {
                path: dest.clone(),
                source: nix::Error::ENOTSUP,
            }),
        };
        if outcome.is_err() {
            self.report.unprotected.push(path.to_path_buf());
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

/// A recursive bind of the prepared root over itself: the copy a run's mount namespace holds
/// is locked to its parent, and `pivot_root` refuses a locked mount; a bind made here is not
/// locked, while the read-only flag and the mounts beneath stay locked.
fn bind_over_itself(root: &Path) -> Result<(), RootfsError> {
    let flags = MsFlags::MS_BIND | MsFlags::MS_REC;
    mount(Some(root), root, None::<&str>, flags, None::<&str>).map_err(|source| RootfsError::Bind {
        src: root.to_path_buf(),
        dst: root.to_path_buf(),
        source,
    })
}

fn pivot_into_new_root(new_root: &Path) -> Result<(), RootfsError> {
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

fn mount_proc(new_root: &Path, hidepid: bool) -> Result<(), RootfsError> {
    let path = under(new_root, Path::new("/proc"));
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

/// Bind `src` onto `dst`, creating the mount point (a directory or an empty file).
fn bind(src: &Path, dst: &Path, is_dir: bool, access: BindAccess) -> Result<(), RootfsError> {
    if is_dir {
        make_dirs(dst)?;
    } else {
        make_mount_file(dst)?;
    }
    restrict_bind(src, dst, is_dir, access)
}

/// Recursive bind (a non-recursive bind of a tree with locked submounts is refused in a user
/// namespace), then `access`'s flags added to it and every mount it brought along in one
/// `mount_setattr(AT_RECURSIVE)`: no `statfs` for the flags a user namespace locked (a bind
/// remount must repeat them) and no mount table read for the submounts, which were each
/// remounted by path (bubblewrap's `bind_mount` does both). `dst_is_dir` is what the mount
/// point was made as (a file holds no submounts).
pub(super) fn restrict_bind(
    src: &Path,
    dst: &Path,
    dst_is_dir: bool,
    access: BindAccess,
) -> Result<(), RootfsError> {
    let flags = MsFlags::MS_BIND | MsFlags::MS_REC;
    mount(Some(src), dst, None::<&str>, flags, None::<&str>).map_err(|source| {
        RootfsError::Bind {
            src: src.to_path_buf(),
            dst: dst.to_path_buf(),
            source,
        }
    })?;
    add_flags(dst, wanted_attrs(access), dst_is_dir)
}

/// The `MOUNT_ATTR_*` flags a bind with `access` gets: never setuid.
pub(super) fn wanted_attrs(access: BindAccess) -> u64 {
    let mut attrs = sys::MOUNT_ATTR_NOSUID;
    if !access.writable {
        attrs |= sys::MOUNT_ATTR_RDONLY;
    }
    if !access.exec {
        attrs |= sys::MOUNT_ATTR_NOEXEC;
    }
    if !access.devices {
        attrs |= sys::MOUNT_ATTR_NODEV;
    }
    attrs
}

/// Adds `attrs` to the mount at `path` (`recursive`: and to every mount below it).
fn add_flags(path: &Path, attrs: u64, recursive: bool) -> Result<(), RootfsError> {
    sys::add_mount_flags(CWD, path, attrs, recursive).map_err(|e| RootfsError::Remount {
        path: path.to_path_buf(),
        source: nix::Error::from_raw(e.raw_os_error().unwrap_or(libc::EIO)),
    })
}

/// Make an already-populated mount read-only; everything we seal is nosuid, nodev, noexec.
pub(super) fn seal(path: &Path) -> Result<(), RootfsError> {
    let sealed = sys::MOUNT_ATTR_RDONLY
        | sys::MOUNT_ATTR_NOSUID
        | sys::MOUNT_ATTR_NODEV
        | sys::MOUNT_ATTR_NOEXEC;
    add_flags(path, sealed, false)
}

pub(super) fn make_dirs(path: &Path) -> Result<(), RootfsError> {
    make_dirs_with(path, 0o755)
}

/// `path` and any missing parent, each with `mode`.
fn make_dirs_with(path: &Path, mode: u32) -> Result<(), RootfsError> {
    DirBuilder::new()
        .recursive(true)
        .mode(mode)
        .create(path)
        .map_err(|e| io_error("create the directory", path, e))
}

fn make_parent_dirs(path: &Path) -> Result<(), RootfsError> {
    match path.parent() {
        Some(parent) => make_dirs(parent),
        None => Ok(()),
    }
}

/// Runs `create` and, only if a directory on the way is missing, creates the parents and
/// runs it again: the parent almost always exists (twenty `/etc` files share one), and
/// making sure of it first cost a `mkdir` and a `stat` per file.
fn with_parents<T>(
    path: &Path,
    action: &'static str,
    create: impl Fn() -> io::Result<T>,
) -> Result<T, RootfsError> {
    let created = match create() {
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            make_parent_dirs(path)?;
            create()
        }
        other => other,
    };
    created.map_err(|e| io_error(action, path, e))
}

fn make_mount_file(path: &Path) -> Result<(), RootfsError> {
    let create = || {
        OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)
    };
    with_parents(path, "create the mount point", create).map(drop)
}

fn make_symlink(target: &Path, link: &Path) -> Result<(), RootfsError> {
    with_parents(link, "create the symlink", || symlink(target, link))
}

pub(super) fn write_file(path: &Path, contents: &str, mode: u32) -> Result<(), RootfsError> {
    with_parents(path, "write", || fs::write(path, contents))?;
    fs::set_permissions(path, fs::Permissions::from_mode(mode))
        .map_err(|e| io_error("set the mode of", path, e))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn real(path: &Path) -> Option<HostEntry> {
        Some(HostEntry::Real(path.to_path_buf(), true))
    }

    #[test]
    fn the_root_is_built_in_place_only_where_it_hides_no_source() {
        let dir = tempfile::tempdir().unwrap();
        let build = dir.path().join("shm");
        fs::create_dir(&build).unwrap();
        let null = HostEntry::Real("/dev/null".into(), false);
        let beside = vec![None, real(&dir.path().join("usr"))];
        assert!(hides_no_source(&build, &beside, &null));
        let below = vec![None, real(&build.join("data"))];
        assert!(!hides_no_source(&build, &below, &null));
        let null_below = HostEntry::Real(build.join("null"), false);
        assert!(!hides_no_source(&build, &beside, &null_below));
        // A symlink would be mounted over wherever it points.
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&build, &link).unwrap();
        assert!(!hides_no_source(&link, &beside, &null));
        assert!(!hides_no_source(&dir.path().join("absent"), &beside, &null));
    }

    #[test]
    fn a_source_resolved_into_an_uncovered_runtime_directory_is_refused() {
        let runtime = Path::new("/run/airlock");
        let beside = vec![None, real(Path::new("/run/user/1000"))];
        assert!(refuse_reaching(&beside, runtime).is_ok());
        for reaching in ["/run", "/", "/run/airlock/run-1-a-0/work"] {
            let sources = vec![real(Path::new(reaching)), None];
            let refused = refuse_reaching(&sources, runtime).unwrap_err();
            assert!(
                matches!(&refused, RootfsError::ReachesUncovered { path, .. } if path == Path::new(reaching)),
                "{refused}"
            );
        }
    }

    #[test]
    fn the_staged_fallback_pivots_into_staging_and_detaches_the_host_first() {
        let ops = vec![
            MountOp::MakeMountsPrivate,
            MountOp::MountNewRoot,
            MountOp::Bind {
                path: "/srv".into(),
                access: PROC_READ_ONLY,
            },
            MountOp::PivotIntoNewRoot,
            MountOp::RemountRootReadOnly,
        ];
        let sources = vec![None, None, real(Path::new("/srv")), None, None];
        let (staged, sources) = with_staging(&ops, sources);
        let names: Vec<String> = staged.iter().map(|op| op.to_string()).collect();
        assert_eq!(
            names,
            [
                "make-private /",
                "enter-staging",
                "mount-new-root",
                "bind /srv ro,nosuid,nodev,noexec",
                "detach-host",
                "pivot-new-root",
                "remount-ro /"
            ]
        );
        let with_source: Vec<bool> = sources.iter().map(Option::is_some).collect();
        assert_eq!(
            with_source,
            [false, false, false, true, false, false, false]
        );
    }
}
