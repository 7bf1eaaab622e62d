//! protect_git's binds, from descriptors: the source opened again below its writable root and
//! checked to be what the walk found, the mount point reached the same way inside the new
//! root, then `open_tree` + `mount_setattr` + `move_mount`. A path swapped meanwhile for a
//! symlink (by another program sharing the workspace) can redirect neither end.

use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::path::Path;

use rustix::fs::{Mode, OFlags};
use rustix::mount::{move_mount, open_tree, MoveMountFlags, OpenTreeFlags};

use nix::mount::MsFlags;

use super::execute::{io_error, under, wanted_flags};
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
    let bind_error = |e: io::Error| RootfsError::Bind {
        src: found.path.clone(),
        dst: found.path.clone(),
        source: nix::Error::from_raw(e.raw_os_error().unwrap_or(libc::EIO)),
    };
    let tree = open_tree(
        &source,
        "",
        OpenTreeFlags::OPEN_TREE_CLONE
            | OpenTreeFlags::OPEN_TREE_CLOEXEC
            | OpenTreeFlags::AT_RECURSIVE
            | OpenTreeFlags::AT_EMPTY_PATH,
    )
    .map_err(|e| bind_error(e.into()))?;
    sys::add_mount_flags(tree.as_fd(), mount_attrs(access), true).map_err(bind_error)?;
    let flags = MoveMountFlags::MOVE_MOUNT_F_EMPTY_PATH | MoveMountFlags::MOVE_MOUNT_T_EMPTY_PATH;
    move_mount(tree.as_fd(), "", dest.as_fd(), "", flags).map_err(|e| bind_error(e.into()))
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

/// The mount flags a by-path bind gets (`execute::wanted_flags`), as `mount_setattr` flags.
fn mount_attrs(access: BindAccess) -> u64 {
    let wanted = wanted_flags(access);
    let pairs = [
        (MsFlags::MS_RDONLY, sys::MOUNT_ATTR_RDONLY),
        (MsFlags::MS_NOSUID, sys::MOUNT_ATTR_NOSUID),
        (MsFlags::MS_NODEV, sys::MOUNT_ATTR_NODEV),
        (MsFlags::MS_NOEXEC, sys::MOUNT_ATTR_NOEXEC),
    ];
    pairs
        .into_iter()
        .filter(|(ms, _)| wanted.contains(*ms))
        .fold(0, |attrs, (_, attr)| attrs | attr)
}
