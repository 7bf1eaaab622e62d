//! protect_git's binds, from descriptors: the source opened again below its writable root and
//! checked to be what the walk found, the mount point reached the same way inside the new
//! root, then `open_tree` + `mount_setattr` + `move_mount`. A path swapped meanwhile for a
//! symlink (by another program sharing the workspace) can redirect neither end.
//!
//! And the masks of `/proc` directories: each a read-only clone of one empty directory of the
//! root, reached by a descriptor opened before the `/proc` mount covered it.

use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::Path;

use rustix::fs::{Mode, OFlags};
use rustix::mount::{move_mount, open_tree, MoveMountFlags, OpenTreeFlags};

use super::execute::{io_error, under, wanted_attrs};
use super::plan::BindAccess;
use super::source::HostEntry;
use super::RootfsError;
use crate::confine::found::Found;
use crate::linux::beneath::{open_beneath, Mounts};
use crate::linux::sys;

/// The object protect_git found, or a refusal when its path now names another.
pub(super) fn reopen(found: &Found) -> Result<HostEntry, RootfsError> {
    match found.reopen() {
        Ok(fd) => Ok(HostEntry::Found(fd, found.clone())),
        Err(e) => Err(changed(&found.path, e)),
    }
}

fn changed(path: &Path, e: rustix::io::Errno) -> RootfsError {
    RootfsError::Changed {
        path: path.to_path_buf(),
        source: e.into(),
    }
}

/// Binds `source` (what protect_git found) onto the same object as the sandbox sees it,
/// both reached through descriptors: a path swapped since for a symlink can redirect
/// neither end. A mount point that is no longer the same object is refused.
pub(super) fn bind_found(
    new_root: &Path,
    source: OwnedFd,
    found: &Found,
    access: BindAccess,
) -> Result<(), RootfsError> {
    let dest = mount_point(new_root, found)?;
    clone_onto(&source, &dest, found, access)
}

/// For a tool that binds by path (the OCI runtimes, podman, runsc), in the tool's own
/// private mount namespace: binds what protect_git found onto `mount_point` (made here, a
/// directory or an empty file like the object), from the descriptor checked to be that
/// object, read-only (git metadata) or writable (a pinned directory), never setuid or device
/// nodes. `mount_point` must lie where no other program can write.
pub fn bind_found_at(
    found: &Found,
    read_only: bool,
    mount_point: &Path,
) -> Result<(), RootfsError> {
    let fd = found.reopen().map_err(|e| changed(&found.path, e))?;
    let stat = rustix::fs::fstat(&fd).map_err(|e| changed(&found.path, e))?;
    let made = match rustix::fs::FileType::from_raw_mode(stat.st_mode) {
        rustix::fs::FileType::Directory => rustix::fs::mkdir(mount_point, Mode::from(0o700)),
        _ => rustix::fs::open(
            mount_point,
            OFlags::CREATE | OFlags::EXCL | OFlags::WRONLY | OFlags::CLOEXEC,
            Mode::from(0o600),
        )
        .map(drop),
    };
    made.map_err(|e| io_error("create", mount_point, e.into()))?;
    let flags = OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    let dest = rustix::fs::open(mount_point, flags, Mode::empty())
        .map_err(|e| io_error("open", mount_point, e.into()))?;
    let access = BindAccess {
        writable: !read_only,
        exec: true,
        devices: false,
    };
    clone_onto(&fd, &dest, found, access)
}

/// A recursive bind of `source` onto `dest` (both descriptors) with `access`'s flags.
fn clone_onto(
    source: &OwnedFd,
    dest: &OwnedFd,
    found: &Found,
    access: BindAccess,
) -> Result<(), RootfsError> {
    let bind_error = |e: io::Error| RootfsError::Bind {
        src: found.path.clone(),
        dst: found.path.clone(),
        source: nix::Error::from_raw(e.raw_os_error().unwrap_or(libc::EIO)),
    };
    let to = (dest.as_fd(), Path::new(""));
    clone_tree(source, true, access, to, bind_error)
}

/// Clones the mount tree at `source` (with every mount below it when `recursive`), adds
/// `access`'s flags to the clone and attaches it at `to` (a directory descriptor and a path
/// under it; an empty path: the descriptor's own object).
fn clone_tree(
    source: &OwnedFd,
    recursive: bool,
    access: BindAccess,
    to: (BorrowedFd, &Path),
    error: impl Fn(io::Error) -> RootfsError,
) -> Result<(), RootfsError> {
    let mut flags = OpenTreeFlags::OPEN_TREE_CLONE
        | OpenTreeFlags::OPEN_TREE_CLOEXEC
        | OpenTreeFlags::AT_EMPTY_PATH;
    if recursive {
        flags |= OpenTreeFlags::AT_RECURSIVE;
    }
    let tree = open_tree(source, "", flags).map_err(|e| error(e.into()))?;
    sys::add_mount_flags(tree.as_fd(), Path::new(""), wanted_attrs(access), recursive)
        .map_err(&error)?;
    let (dir, path) = to;
    let mut flags = MoveMountFlags::MOVE_MOUNT_F_EMPTY_PATH;
    if path.as_os_str().is_empty() {
        flags |= MoveMountFlags::MOVE_MOUNT_T_EMPTY_PATH;
    }
    move_mount(tree.as_fd(), "", dir, path, flags).map_err(|e| error(e.into()))
}

/// The found object as the sandbox sees it: below the writable root's mount in the new root
/// (placed by airlock, so trusted by name), through no symlink, and the same object.
fn mount_point(new_root: &Path, found: &Found) -> Result<OwnedFd, RootfsError> {
    let root = under(new_root, &found.root);
    let root = rustix::fs::open(&root, OFlags::PATH | OFlags::DIRECTORY, Mode::empty())
        .map_err(|e| io_error("open", &root, e.into()))?;
    let dest = open_beneath(&root, found.relative(), OFlags::PATH, Mounts::Cross)
        .map_err(|e| changed(&found.path, e))?;
    let stat = rustix::fs::fstat(&dest).map_err(|e| changed(&found.path, e))?;
    match (stat.st_dev, stat.st_ino) == (found.dev, found.ino) {
        true => Ok(dest),
        false => Err(changed(&found.path, rustix::io::Errno::STALE)),
    }
}

/// The directory `path` of the root built at `new_root` (an empty mount point), opened before
/// something is mounted over it; `None` when it cannot be, which leaves the masks undone (and
/// reported as such).
pub(super) fn open_mount_point(new_root: &Path, path: &Path) -> Option<OwnedFd> {
    let flags = OFlags::PATH | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    rustix::fs::open(under(new_root, path), flags, Mode::empty()).ok()
}

/// Masks the directory `dest` with a clone of `empty` (only that directory, none of the
/// mounts on or below it), read-only, never setuid, executable or device nodes: what the
/// program sees there is an empty directory it cannot write, as an empty read-only tmpfs
/// would show, without a superblock of its own to make and tear down.
pub(super) fn mask_dir(empty: &OwnedFd, dest: &Path) -> Result<(), RootfsError> {
    let mask_error = |e: io::Error| RootfsError::Bind {
        src: "(the root's empty /proc)".into(),
        dst: dest.to_path_buf(),
        source: nix::Error::from_raw(e.raw_os_error().unwrap_or(libc::EIO)),
    };
    let sealed = BindAccess {
        writable: false,
        exec: false,
        devices: false,
    };
    clone_tree(empty, false, sealed, (rustix::fs::CWD, dest), mask_error)
}
