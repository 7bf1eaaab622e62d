//! The pure half of [`super::enter`]: the ordered list of operations that builds the root.

use std::collections::BTreeSet;
use std::fmt;
use std::path::{Path, PathBuf};

use super::{RootfsPlan, Workdir};

/// One step of building the sandbox root. Paths are as seen from inside the sandbox; the
/// executor maps them onto the staging tree.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MountOp {
    /// Make every mount in this namespace private so nothing propagates to the host.
    MakeMountsPrivate,
    /// Pivot into a small staging tmpfs, leaving the host root reachable under it (only
    /// where building the root in place would hide a source, see `execute::run_cold`).
    EnterStaging,
    /// The empty tmpfs that becomes the sandbox's `/`.
    MountNewRoot,
    /// A run's own, unlocked copy of a root prepared ahead (see [`plan_prepared_run`]).
    BindPreparedRoot,
    MakeDir {
        path: PathBuf,
        mode: u32,
    },
    WriteFile {
        path: PathBuf,
        contents: String,
        mode: u32,
    },
    /// Optional host path, read-only at the same path: a symlink is recreated, an absent path
    /// is reported as skipped.
    MirrorReadOnly {
        path: PathBuf,
    },
    /// Required host path bound at the same path.
    Bind {
        path: PathBuf,
        access: BindAccess,
    },
    Tmpfs {
        path: PathBuf,
        size_bytes: u64,
        max_files: u64,
        mode: u32,
        exec: bool,
    },
    Symlink {
        target: PathBuf,
        link: PathBuf,
    },
    /// Seal an already-populated mount (a prepared root).
    RemountReadOnly {
        path: PathBuf,
    },
    MountProc {
        hidepid: bool,
    },
    /// A shared root's own `/proc`, showing only the processes of a PID namespace that ends
    /// with the root's build (`subset=pid`: an empty directory for good). The
    /// kernel lets a user namespace mount a `/proc` only where one is fully visible in its
    /// mount namespace already; a run's copy of the shared root holds this one (covered by
    /// the run's own), since the host's is gone from it.
    MountEmptyProc,
    /// A run's tmpfs workdir on a shared root, which holds only `base` (the same for every
    /// run) as its mount point: the tmpfs (the workdir's caps, plus the two directories
    /// below) is mounted at `base`, `path` made in it and bound over itself, then the mount
    /// at `base` sealed read-only, so that the run sees the cold root's read-only
    /// directories down to a writable, capped workdir, with one superblock as a cold run.
    ///
    /// `files`: the generated files that name the workdir (`/etc/passwd`'s home), which the
    /// shared root holds with a placeholder workdir (`<base>/run/work`, no run's): each is
    /// written into the tmpfs, bound read-only over the root's and unlinked, before the seal.
    WorkdirBelow {
        base: PathBuf,
        path: PathBuf,
        size_bytes: u64,
        max_files: u64,
        exec: bool,
        files: Vec<super::GeneratedFile>,
    },
    /// Best effort: a failure is reported, not fatal (runc's masked and read-only paths).
    ProtectProc {
        path: PathBuf,
        how: ProcProtection,
    },
    /// Drop the host root from under the staging root; after this only the new root's mounts
    /// remain reachable.
    DetachHost,
    /// Make the new root `/` and detach what was `/` before (the host, or the staging root).
    PivotIntoNewRoot,
    /// A shared root's last step: its tmpfs superblock made read-only (a remount without
    /// `MS_BIND`), not only its mounts, so that no mount of it, however its flags came to
    /// be, can write to it (see `shared::seal_superblock`).
    SealSuperblock,
    RemountRootReadOnly,
    Chdir {
        path: PathBuf,
    },
}

/// Mount options of a [`MountOp::Bind`]; `nosuid` is always on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BindAccess {
    pub writable: bool,
    pub exec: bool,
    /// Device nodes usable (no `nodev`); only for the `/dev` nodes.
    pub devices: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProcProtection {
    /// Bind the entry over itself read-only.
    ReadOnly,
    /// Bind `/dev/null` over a file.
    MaskFile,
    /// Bind the root's own `/proc` mount point (an empty directory, mode 0555, which the
    /// `/proc` mount covers) over a directory, read-only: no superblock of its own.
    MaskDir,
}

const DEVICE_NODES: &[&str] = &["null", "zero", "full", "random", "urandom"];
const DEV_SYMLINKS: &[(&str, &str)] = &[
    ("/proc/self/fd", "/dev/fd"),
    ("/proc/self/fd/0", "/dev/stdin"),
    ("/proc/self/fd/1", "/dev/stdout"),
    ("/proc/self/fd/2", "/dev/stderr"),
];
const PROC_READ_ONLY: &[&str] = &["sys", "sysrq-trigger", "irq", "bus", "fs"];
const PROC_MASKED_FILES: &[&str] = &[
    "kcore",
    "keys",
    "key-users",
    "kallsyms",
    "timer_list",
    "timer_stats",
    "sched_debug",
    "latency_stats",
    "kpagecount",
    "kpageflags",
    "kpagecgroup",
    "config.gz",
];
const PROC_MASKED_DIRS: &[&str] = &["acpi", "asound", "scsi"];

/// The mode of a mount point the root makes: the `/proc` one is also what a masked `/proc`
/// directory shows ([`ProcProtection::MaskDir`]), read-only to everyone as a mask should be.
pub(super) fn make_dir(path: impl AsRef<Path>) -> MountOp {
    let path = path.as_ref();
    let mode = match path == Path::new("/proc") {
        true => 0o555,
        false => 0o755,
    };
    MountOp::MakeDir {
        path: path.to_path_buf(),
        mode,
    }
}

/// The ordered operations [`super::enter`] executes for `plan`, numbered as in the comments.
pub fn plan_operations(plan: &RootfsPlan) -> Vec<MountOp> {
    let mut ops = Vec::new();
    // 1. Private propagation first, or every later mount would show up on the host.
    ops.push(MountOp::MakeMountsPrivate);
    // 2-3. The new root is an empty tmpfs: only what follows exists in the sandbox. It is
    //    built where it hides no source (see `execute::run_cold`, which adds bubblewrap's
    //    staging pivot only where it would).
    ops.push(MountOp::MountNewRoot);
    // 4. Skeleton. `/dev` is a directory of the root, sealed with it: a tmpfs of its own
    //    would be one more superblock per run to make and tear down.
    ops.extend(["/etc", "/proc", "/dev", "/tmp"].map(make_dir));
    // 5-7. Generated files, then system directories, then /etc entries.
    push_shared_files(&mut ops, plan);
    // 8. /dev: its nodes and links, and its own /dev/shm.
    push_dev_nodes(&mut ops, plan);
    ops.push(dev_shm(plan));
    // 9. /proc.
    push_proc(&mut ops, plan.proc_hidepid);
    // 10. /tmp.
    ops.push(tmp(plan));
    // 11. Workdir and user paths, parents before children so nested binds land on top.
    ops.extend(user_mounts(plan));
    // 12-13. Make the new root `/` and drop the host (one pivot, one detach).
    ops.push(MountOp::PivotIntoNewRoot);
    // 14. Seal `/` itself only now: mount points and generated files had to be created first.
    ops.push(MountOp::RemountRootReadOnly);
    // 15. Start where the program works.
    ops.push(MountOp::Chdir {
        path: plan.workdir.path().to_path_buf(),
    });
    ops
}

/// The part of the root every run of one plan shares, built once ahead of the runs (by an
/// interpreter zygote's template, in its own mount namespace): the skeleton, the generated
/// files, the system and `/etc` binds, `/dev` with its nodes, the caller's binds,
/// and empty mount points for what each run mounts afresh. The root is sealed read-only; a
/// run's namespace holds it with the read-only flag locked.
pub fn plan_prepared_root(plan: &RootfsPlan) -> Vec<MountOp> {
    prepared_root_with(plan, per_run_paths(plan))
}

/// [`plan_prepared_root`] with `per_run` as the mount points each run mounts on.
pub(super) fn prepared_root_with(plan: &RootfsPlan, per_run: Vec<PathBuf>) -> Vec<MountOp> {
    let mut ops = vec![MountOp::MakeMountsPrivate, MountOp::MountNewRoot];
    let (in_dev, in_root): (Vec<_>, Vec<_>) = per_run.iter().partition(|p| p.starts_with("/dev"));
    ops.extend(in_root.into_iter().map(make_dir));
    ops.extend(["/etc", "/dev"].map(make_dir));
    push_shared_files(&mut ops, plan);
    push_dev_nodes(&mut ops, plan);
    ops.extend(in_dev.into_iter().map(make_dir));
    ops.extend(split_user_mounts(plan).0);
    ops.push(MountOp::RemountReadOnly { path: "/".into() });
    ops
}

/// What each run adds to a prepared root, in its own mount namespace, before it pivots into
/// its own copy: the fresh `/proc` (protected), `/tmp`, `/dev/shm` and a tmpfs workdir, and
/// the caller's binds that lie under one of them (on top, as in a cold run) — so nothing
/// writable is shared between runs.
pub fn plan_prepared_run(plan: &RootfsPlan) -> Vec<MountOp> {
    let mut ops = vec![MountOp::MakeMountsPrivate, MountOp::BindPreparedRoot];
    ops.push(dev_shm(plan));
    push_proc(&mut ops, plan.proc_hidepid);
    ops.push(tmp(plan));
    ops.extend(split_user_mounts(plan).1);
    ops.push(MountOp::PivotIntoNewRoot);
    ops.push(MountOp::Chdir {
        path: plan.workdir.path().to_path_buf(),
    });
    ops
}

/// The caller's mounts, parents first: those a prepared root holds, and those each run makes
/// (a tmpfs workdir, and any bind under a mount each run makes afresh, which would hide it).
pub(super) fn split_user_mounts(plan: &RootfsPlan) -> (Vec<MountOp>, Vec<MountOp>) {
    let per_run = per_run_paths(plan);
    user_mounts(plan).into_iter().partition(|op| match op {
        MountOp::Tmpfs { .. } => false,
        MountOp::Bind { path, .. } => !per_run.iter().any(|fresh| path.starts_with(fresh)),
        _ => true,
    })
}

pub(super) fn per_run_paths(plan: &RootfsPlan) -> Vec<PathBuf> {
    let mut paths: Vec<PathBuf> = ["/proc", "/tmp", "/dev/shm"].map(PathBuf::from).into();
    if let Workdir::Tmpfs { path, .. } = &plan.workdir {
        paths.push(path.clone());
    }
    paths
}

/// `/dev`'s nodes and links, in the root's `/dev` directory (see [`make_dir`]).
fn push_dev_nodes(ops: &mut Vec<MountOp>, plan: &RootfsPlan) {
    // Device nodes cannot be created in a user namespace; binding the host's works.
    let tty: &[&str] = if plan.tty { &["tty"] } else { &[] };
    for name in DEVICE_NODES.iter().chain(tty) {
        ops.push(MountOp::Bind {
            path: Path::new("/dev").join(name),
            access: BindAccess {
                writable: true,
                exec: false,
                devices: true,
            },
        });
    }
    ops.extend(DEV_SYMLINKS.iter().map(|(target, link)| MountOp::Symlink {
        target: target.into(),
        link: link.into(),
    }));
}

pub(super) fn dev_shm(plan: &RootfsPlan) -> MountOp {
    MountOp::Tmpfs {
        path: "/dev/shm".into(),
        size_bytes: plan.dev_shm.size_bytes,
        max_files: plan.dev_shm.max_files,
        mode: 0o1777,
        exec: plan.exec_writable,
    }
}

pub(super) fn tmp(plan: &RootfsPlan) -> MountOp {
    MountOp::Tmpfs {
        path: "/tmp".into(),
        size_bytes: plan.tmp.size_bytes,
        max_files: plan.tmp.max_files,
        mode: 0o1777,
        exec: plan.exec_writable,
    }
}

pub(super) fn push_proc(ops: &mut Vec<MountOp>, hidepid: bool) {
    ops.push(MountOp::MountProc { hidepid });
    let protections = [
        (PROC_READ_ONLY, ProcProtection::ReadOnly),
        (PROC_MASKED_FILES, ProcProtection::MaskFile),
        (PROC_MASKED_DIRS, ProcProtection::MaskDir),
    ];
    for (names, how) in protections {
        ops.extend(names.iter().map(|name| MountOp::ProtectProc {
            path: Path::new("/proc").join(name),
            how,
        }));
    }
}

/// Generated files go first, so they are written to the root tmpfs, never through a bind;
/// then system directories, then /etc entries (a generated file replaces a host entry).
fn push_shared_files(ops: &mut Vec<MountOp>, plan: &RootfsPlan) {
    ops.extend(plan.generated_files.iter().map(|f| MountOp::WriteFile {
        path: f.path.clone(),
        contents: f.contents.clone(),
        mode: f.mode,
    }));
    let generated: BTreeSet<&Path> = plan
        .generated_files
        .iter()
        .map(|f| f.path.as_path())
        .collect();
    let mirrored = plan.system_ro.iter().chain(
        plan.etc_files
            .iter()
            .filter(|p| !generated.contains(p.as_path())),
    );
    ops.extend(mirrored.map(|p| MountOp::MirrorReadOnly { path: p.clone() }));
}

fn user_mounts(plan: &RootfsPlan) -> Vec<MountOp> {
    // The caller's own directories: a workspace whose programs (./script.sh, a venv's
    // python, node_modules/.bin) must run. Fresh scratch areas keep `exec_writable`.
    let writable = BindAccess {
        writable: true,
        exec: plan.workspace || plan.exec_writable,
        devices: false,
    };
    // Read-only paths may hold programs (a venv, a toolchain): not writable, so W^X holds.
    let read_only = BindAccess {
        writable: false,
        exec: true,
        devices: false,
    };
    let mut user_ops: Vec<MountOp> = Vec::new();
    user_ops.push(match &plan.workdir {
        Workdir::Bind { host, writable: w } => MountOp::Bind {
            path: host.clone(),
            access: BindAccess {
                writable: *w,
                ..writable
            },
        },
        Workdir::Tmpfs {
            path,
            size_bytes,
            max_files,
        } => MountOp::Tmpfs {
            path: path.clone(),
            size_bytes: *size_bytes,
            max_files: *max_files,
            mode: 0o755,
            exec: plan.exec_writable,
        },
    });
    let binds = |paths: &[PathBuf], access| {
        paths
            .iter()
            .map(move |p| MountOp::Bind {
                path: p.clone(),
                access,
            })
            .collect::<Vec<_>>()
    };
    user_ops.extend(binds(&plan.read_write, writable));
    user_ops.extend(binds(&plan.read_only, read_only));
    // Last among equals, so each lands on top of the workspace that holds it.
    user_ops.extend(binds(&plan.git_pinned, writable));
    user_ops.extend(binds(&plan.git_read_only, read_only));
    user_ops.sort_by_key(mount_depth);
    user_ops
}

fn mount_depth(op: &MountOp) -> usize {
    match op {
        MountOp::Bind { path, .. } | MountOp::Tmpfs { path, .. } => path.components().count(),
        _ => 0,
    }
}

impl fmt::Display for BindAccess {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let rw = if self.writable { "rw" } else { "ro" };
        let exec = if self.exec { "exec" } else { "noexec" };
        let dev = if self.devices { "dev" } else { "nodev" };
        write!(f, "{rw},nosuid,{dev},{exec}")
    }
}

impl fmt::Display for MountOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MountOp::MakeMountsPrivate => write!(f, "make-private /"),
            MountOp::EnterStaging => write!(f, "enter-staging"),
            MountOp::MountNewRoot => write!(f, "mount-new-root"),
            MountOp::BindPreparedRoot => write!(f, "bind-prepared-root"),
            MountOp::MakeDir { path, mode: 0o755 } => write!(f, "mkdir {}", path.display()),
            MountOp::MakeDir { path, mode } => write!(f, "mkdir {} mode={mode:o}", path.display()),
            MountOp::WriteFile { path, mode, .. } => {
                write!(f, "write {} mode={mode:o}", path.display())
            }
            MountOp::MirrorReadOnly { path } => write!(f, "mirror-ro {}", path.display()),
            MountOp::Bind { path, access } => write!(f, "bind {} {access}", path.display()),
            MountOp::Tmpfs {
                path,
                size_bytes,
                max_files,
                mode,
                exec,
            } => {
                let exec = if *exec { "exec" } else { "noexec" };
                write!(
                    f,
                    "tmpfs {} size={size_bytes},nr_inodes={max_files},mode={mode:o},{exec}",
                    path.display()
                )
            }
            MountOp::Symlink { target, link } => {
                write!(f, "symlink {} -> {}", link.display(), target.display())
            }
            MountOp::RemountReadOnly { path } => write!(f, "remount-ro {}", path.display()),
            MountOp::MountProc { hidepid } => write!(f, "proc hidepid={hidepid}"),
            MountOp::MountEmptyProc => write!(f, "proc subset=pid"),
            MountOp::WorkdirBelow { base, path, .. } => {
                write!(f, "workdir {} below {}", path.display(), base.display())
            }
            MountOp::ProtectProc { path, how } => write!(f, "protect {} {how:?}", path.display()),
            MountOp::DetachHost => write!(f, "detach-host"),
            MountOp::PivotIntoNewRoot => write!(f, "pivot-new-root"),
            MountOp::SealSuperblock => write!(f, "remount-superblock-ro /"),
            MountOp::RemountRootReadOnly => write!(f, "remount-ro /"),
            MountOp::Chdir { path } => write!(f, "chdir {}", path.display()),
        }
    }
}
