//! Idmapped mounts: a caller's directory shown to the program as its own. When airlock runs as
//! root and the program as an unprivileged user, a directory the caller gives it (a workdir, a
//! `--rw` path) belongs to someone else, usually root: the program could neither write nor
//! create there. Changing its ownership on the host is not ours to do. Instead the directory
//! is mounted over itself, in the init's own mount namespace, through an id map that shows its
//! owner as the program's user and writes the program's ids back as the owner's: the program
//! works in it as the owner would, and what it creates belongs on the host to the owner.
//! Landlock, seccomp and the mount's other flags apply as before.
//!
//! Needs root in the initial user namespace (the init is), Linux 5.12 and a filesystem that
//! supports idmapped mounts (ext4, xfs, btrfs, tmpfs from 6.3, ...; not NFS or ramfs).

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};

use nix::sched::CloneFlags;
use rustix::mount::{MoveMountFlags, OpenTreeFlags};
use serde::{Deserialize, Serialize};

use super::Credentials;
use crate::linux::sys::{self, Forked};

/// A host path whose owner the program sees as itself.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct MappedPath {
    /// The path, the same inside and outside.
    pub path: PathBuf,
    /// Its owner on the host.
    pub owner: Credentials,
    /// The program's user, which the owner is shown as.
    pub program: Credentials,
}

/// Why a path could not be mapped.
#[derive(Debug, thiserror::Error)]
#[error("cannot map the owner of {path} ({owner_uid}:{owner_gid}) to the sandbox user: {action} failed: {source}")]
pub struct IdmapError {
    pub path: PathBuf,
    pub owner_uid: u32,
    pub owner_gid: u32,
    pub action: &'static str,
    pub source: std::io::Error,
}

impl IdmapError {
    /// The kernel or the filesystem cannot do it (as opposed to a failure of this run).
    pub fn unsupported(&self) -> bool {
        matches!(
            self.source.raw_os_error(),
            Some(libc::EINVAL) | Some(libc::ENOSYS) | Some(libc::EOPNOTSUPP)
        )
    }
}

/// Mounts each of `paths` over itself with its owner mapped to the program's user. Must run
/// in a mount namespace of the caller's own (the mounts are for this run only).
pub fn map_owners(paths: &[MappedPath]) -> Result<(), IdmapError> {
    let mut namespaces: BTreeMap<(u32, u32, u32, u32), OwnedFd> = BTreeMap::new();
    for mapped in paths {
        let key = (
            mapped.owner.uid,
            mapped.owner.gid,
            mapped.program.uid,
            mapped.program.gid,
        );
        let failed = |action: &'static str| {
            move |source: std::io::Error| IdmapError {
                path: mapped.path.clone(),
                owner_uid: mapped.owner.uid,
                owner_gid: mapped.owner.gid,
                action,
                source,
            }
        };
        let userns = match namespaces.entry(key) {
            std::collections::btree_map::Entry::Occupied(entry) => entry.into_mut(),
            std::collections::btree_map::Entry::Vacant(entry) => entry.insert(
                user_namespace(mapped.owner, mapped.program)
                    .map_err(failed("creating the id map's user namespace"))?,
            ),
        };
        mount_mapped(&mapped.path, userns).map_err(failed("the idmapped mount"))?;
    }
    Ok(())
}

fn mount_mapped(path: &Path, userns: &OwnedFd) -> std::io::Result<()> {
    let flags = OpenTreeFlags::OPEN_TREE_CLONE
        | OpenTreeFlags::OPEN_TREE_CLOEXEC
        | OpenTreeFlags::AT_RECURSIVE;
    let tree = rustix::mount::open_tree(rustix::fs::CWD, path, flags)?;
    sys::set_mount_idmap(tree.as_fd(), userns.as_fd(), true)?;
    rustix::mount::move_mount(
        tree.as_fd(),
        "",
        rustix::fs::CWD,
        path,
        MoveMountFlags::MOVE_MOUNT_F_EMPTY_PATH,
    )?;
    Ok(())
}

/// A user namespace whose id maps show `owner` as `program`: a child process creates it and
/// waits while this (privileged) process writes the maps and takes a descriptor of it.
fn user_namespace(owner: Credentials, program: Credentials) -> std::io::Result<OwnedFd> {
    let (ready_read, ready_write) = nix::unistd::pipe()?;
    let (done_read, done_write) = nix::unistd::pipe()?;
    let child = match sys::fork_single_threaded()? {
        Forked::Child => {
            drop((ready_read, done_write));
            hold_namespace(ready_write, done_read)
        }
        Forked::Parent(child) => child,
    };
    drop((ready_write, done_read));
    let result = map_namespace_of(child, ready_read, owner, program);
    // Closing our end lets the child exit, whatever happened.
    drop(done_write);
    let _ = nix::sys::wait::waitpid(child, None);
    result
}

fn map_namespace_of(
    child: nix::unistd::Pid,
    ready: OwnedFd,
    owner: Credentials,
    program: Credentials,
) -> std::io::Result<OwnedFd> {
    let mut byte = [0u8; 1];
    if std::fs::File::from(ready).read(&mut byte)? != 1 {
        return Err(std::io::Error::other(
            "the namespace holder failed to unshare",
        ));
    }
    let proc = PathBuf::from(format!("/proc/{child}"));
    std::fs::write(
        proc.join("uid_map"),
        format!("{} {} 1", owner.uid, program.uid),
    )?;
    std::fs::write(
        proc.join("gid_map"),
        format!("{} {} 1", owner.gid, program.gid),
    )?;
    Ok(std::fs::File::open(proc.join("ns/user"))?.into())
}

/// The child's part: a new user namespace, then wait until the parent is done with it.
fn hold_namespace(ready: OwnedFd, done: OwnedFd) -> ! {
    if nix::sched::unshare(CloneFlags::CLONE_NEWUSER).is_ok() {
        let _ = std::fs::File::from(ready).write_all(b"1");
        let _ = std::fs::File::from(done).read(&mut [0u8; 1]);
    }
    sys::exit_now(0)
}
