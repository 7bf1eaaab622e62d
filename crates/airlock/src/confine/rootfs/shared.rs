//! A warm pool's shared root (see `supervisor::shared_root`): the plan of the root built once
//! in namespaces of its own ([`plan_shared_root`]), and of what each sandbox adds to its
//! locked copy ([`plan_shared_run`]), and the operations only they use.

use std::fs;
use std::path::Path;

use nix::mount::{mount, MsFlags};

use super::execute::{io_error, make_dirs, mount_tmpfs, restrict_bind, seal, under, write_file};
use super::plan::{
    dev_shm, per_run_paths, prepared_root_with, push_proc, split_user_mounts, tmp, BindAccess,
    MountOp,
};
use super::{GeneratedFile, RootfsError, RootfsPlan, Workdir};

/// A shared root's source for the masked `/proc` directories (see `rootfs::Layout`).
pub(super) const SHARED_MASK_DIR: &str = "/tmp/masked";

/// The root a warm pool shares between its sandboxes, built once by a process of its own in a
/// user and mount namespace that the sandboxes' setup enters (`setns`) before it makes its
/// own: [`super::plan_prepared_root`] with an empty `/proc` of its own ([`MountOp::MountEmptyProc`]),
/// then the pivot into it and the host dropped, so that the mount namespace holds the
/// prepared root and nothing else. Each sandbox's namespace is a copy of it, every mount
/// locked (see [`plan_shared_run`]). A sandbox's tmpfs workdir is named after its run
/// (`<runtime>/<run>/work`), so the root holds the runtime directory as the mount point
/// ([`shared_workdir_base`]). `None` for a plan whose runs would bind a host path under a
/// mount they make (the host is not in the shared namespace to bind it from) or whose
/// workdir is not such a tmpfs.
pub fn plan_shared_root(plan: &RootfsPlan) -> Option<Vec<MountOp>> {
    let base = shared_workdir_base(plan)?;
    let (shared, per_run) = split_user_mounts(plan);
    let per_run_bind = per_run.iter().any(|op| matches!(op, MountOp::Bind { .. }));
    let hidden = |op: &MountOp| matches!(op, MountOp::Bind { path, .. } if path.starts_with(base));
    if per_run_bind || shared.iter().any(hidden) {
        return None;
    }
    let mut mount_points = per_run_paths(plan);
    mount_points.retain(|path| path != plan.workdir.path());
    mount_points.push(base.to_path_buf());
    let mut ops = prepared_root_with(plan, mount_points);
    // Before the seal (the last operation so far): the masks' source, covered by each
    // run's `/tmp`.
    let mask = MountOp::MakeDir {
        path: SHARED_MASK_DIR.into(),
        mode: 0o555,
    };
    ops.insert(ops.len() - 1, mask);
    ops.push(MountOp::MountEmptyProc);
    ops.push(MountOp::PivotIntoNewRoot);
    ops.push(MountOp::SealSuperblock);
    Some(ops)
}

/// Where a shared root holds the mount point of its runs' tmpfs workdirs: the workdir's
/// grandparent (`<runtime>` of `<runtime>/<run>/work`), which must not be `/`.
pub fn shared_workdir_base(plan: &RootfsPlan) -> Option<&Path> {
    let Workdir::Tmpfs { path, .. } = &plan.workdir else {
        return None;
    };
    let base = path.parent()?.parent()?;
    (base != Path::new("/")).then_some(base)
}

/// The generated files whose contents name the workdir (differ from run to run).
pub fn naming_the_workdir(plan: &RootfsPlan) -> Vec<GeneratedFile> {
    let workdir = plan.workdir.path().display().to_string();
    let names = |file: &&GeneratedFile| file.contents.contains(&workdir);
    plan.generated_files.iter().filter(names).cloned().collect()
}

/// What each sandbox adds to its copy of a shared root ([`plan_shared_root`]), which is its
/// `/` already: the fresh `/proc` (protected), `/tmp`, `/dev/shm` and its tmpfs workdir
/// ([`MountOp::WorkdirBelow`]). No pivot and no host to drop: the copy holds nothing else.
pub fn plan_shared_run(plan: &RootfsPlan) -> Vec<MountOp> {
    let mut ops = vec![MountOp::MakeMountsPrivate, dev_shm(plan)];
    push_proc(&mut ops, plan.proc_hidepid);
    ops.push(tmp(plan));
    if let (
        Some(base),
        Workdir::Tmpfs {
            path,
            size_bytes,
            max_files,
        },
    ) = (shared_workdir_base(plan), &plan.workdir)
    {
        ops.push(MountOp::WorkdirBelow {
            base: base.to_path_buf(),
            path: path.clone(),
            size_bytes: *size_bytes,
            max_files: *max_files,
            exec: plan.exec_writable,
            files: naming_the_workdir(plan),
        });
    }
    ops.push(MountOp::Chdir {
        path: plan.workdir.path().to_path_buf(),
    });
    ops
}

/// See [`MountOp::MountEmptyProc`]: mounted by the shared root's builder, PID 1 of a PID
/// namespace of its own that ends when it exits. Not read-only: the kernel lets a run mount
/// its writable `/proc` only where the one already visible is not locked read-only (it has
/// nothing to write: `subset=pid` of an ended namespace shows no entry at all).
pub(super) fn mount_empty_proc(new_root: &Path) -> Result<(), RootfsError> {
    let path = under(new_root, Path::new("/proc"));
    let flags = MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC;
    mount(Some("proc"), &path, Some("proc"), flags, Some("subset=pid")).map_err(|source| {
        RootfsError::MountFs {
            fstype: "proc",
            path,
            source,
        }
    })
}

/// See [`MountOp::SealSuperblock`]: the root (`/`, after the pivot) remounted read-only as
/// a superblock. Every mount of it is read-only already, and locked in each run's copy; this
/// makes the tmpfs itself refuse writes (`EROFS`), through any mount of it, even one whose
/// read-only flag were cleared in the builder's own namespace, where the flag is not
/// locked. The kernel allows it to the builder, which holds `CAP_SYS_ADMIN` in the user
/// namespace owning the superblock; no file of it is open for writing by then. The mount's
/// own flags are repeated (a remount sets them all); its atime flag is kept.
pub(super) fn seal_superblock() -> Result<(), RootfsError> {
    let flags = MsFlags::MS_REMOUNT
        | MsFlags::MS_RDONLY
        | MsFlags::MS_NOSUID
        | MsFlags::MS_NODEV
        | MsFlags::MS_NOEXEC;
    let root = Path::new("/");
    mount(None::<&str>, root, None::<&str>, flags, None::<&str>).map_err(|source| {
        RootfsError::Remount {
            path: root.to_path_buf(),
            source,
        }
    })
}

/// See [`MountOp::WorkdirBelow`] (in a shared root's copy: paths are the run's own).
pub(super) fn workdir_below(op: &MountOp) -> Result<(), RootfsError> {
    let MountOp::WorkdirBelow {
        base,
        path,
        size_bytes,
        max_files,
        exec,
        files,
    } = op
    else {
        return Ok(());
    };
    let exec = *exec;
    // What the tmpfs holds besides the workdir (its root, the directories down to it, a page
    // and an inode per file while it is bound), added to the caps: the workdir has as much
    // room left as a cold one.
    let extra_files = 2 + files.len() as u64;
    let extra_bytes = 4096 * files.len() as u64;
    let options = format!(
        "size={},nr_inodes={},mode=755",
        size_bytes.saturating_add(extra_bytes),
        max_files.saturating_add(extra_files)
    );
    mount_tmpfs(base, &options, exec)?;
    make_dirs(path)?;
    let access = BindAccess {
        writable: true,
        exec,
        devices: false,
    };
    restrict_bind(path, path, true, access)?;
    for (index, file) in files.iter().enumerate() {
        let source = base.join(format!(".file-{index}"));
        write_file(&source, &file.contents, file.mode)?;
        restrict_bind(&source, &file.path, false, SEALED_FILE)?;
        fs::remove_file(&source).map_err(|e| io_error("remove", &source, e))?;
    }
    seal(base)
}

const SEALED_FILE: BindAccess = BindAccess {
    writable: false,
    exec: false,
    devices: false,
};
