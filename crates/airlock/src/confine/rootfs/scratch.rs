//! The init's in-memory run directory (see `rundir::MemoryScratch`): a private mount
//! namespace in which the runtime directory is a small tmpfs, and capped tmpfs mounts inside it.

use std::path::Path;

use nix::mount::{mount, MsFlags};
use nix::sched::{unshare, CloneFlags};

use super::execute::{make_mounts_private, mount_tmpfs};
use super::RootfsError;
use serde::{Deserialize, Serialize};

use crate::confine::Credentials;

/// The runtime tmpfs holds the run directory's tool files (an OCI bundle, a tool's state),
/// never the program's data: that goes to the capped [`ScratchMount`]s.
const RUNTIME_OPTIONS: &str = "size=64m,nr_inodes=16384,mode=0711";

/// Moves this process into a mount namespace of its own, private so nothing mounted here
/// reaches the host, and covers `runtime_dir` with an empty tmpfs. Must be called while the
/// process is single-threaded (a new mount namespace needs an unshared filesystem context).
pub fn enter_private_runtime(runtime_dir: &Path) -> Result<(), RootfsError> {
    enter_private_mount_namespace()?;
    mount_tmpfs(runtime_dir, RUNTIME_OPTIONS, false)
}

/// Moves this process into a mount namespace of its own, private so nothing mounted here
/// reaches the host. Single-threaded callers only (see [`enter_private_runtime`]).
pub fn enter_private_mount_namespace() -> Result<(), RootfsError> {
    unshare(CloneFlags::CLONE_NEWNS).map_err(|source| RootfsError::Unshare { source })?;
    make_mounts_private()
}

/// Covers `target` with `empty`, read-only, in the calling process's mount namespace: call it
/// only after [`enter_private_runtime`], so the host never sees the cover.
pub fn cover_with_empty_file(empty: &Path, target: &Path) -> Result<(), RootfsError> {
    mount(
        Some(empty),
        target,
        None::<&str>,
        MsFlags::MS_BIND,
        None::<&str>,
    )
    .map_err(|source| RootfsError::Bind {
        src: empty.to_path_buf(),
        dst: target.to_path_buf(),
        source,
    })?;
    let read_only = MsFlags::MS_BIND
        | MsFlags::MS_REMOUNT
        | MsFlags::MS_RDONLY
        | MsFlags::MS_NOSUID
        | MsFlags::MS_NODEV
        | MsFlags::MS_NOEXEC;
    mount(None::<&str>, target, None::<&str>, read_only, None::<&str>).map_err(|source| {
        RootfsError::Remount {
            path: target.to_path_buf(),
            source,
        }
    })
}

/// One capped tmpfs of the in-memory run directory.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct ScratchMount {
    pub path: std::path::PathBuf,
    pub size_bytes: u64,
    pub max_files: u64,
    pub mode: u32,
    /// Allow executing files written there (the policy's `exec_writable`).
    pub exec: bool,
    /// The owner of the tmpfs root (the sandbox user), `None` for the init's own ids.
    pub owner: Option<Credentials>,
}

/// Mounts one capped tmpfs, owned by the sandbox user.
pub fn mount_scratch(mount: &ScratchMount) -> Result<(), RootfsError> {
    mount_tmpfs(&mount.path, &scratch_options(mount), mount.exec)
}

fn scratch_options(mount: &ScratchMount) -> String {
    let mut options = format!(
        "size={},nr_inodes={},mode={:o}",
        mount.size_bytes, mount.max_files, mount.mode
    );
    if let Some(owner) = mount.owner {
        options.push_str(&format!(",uid={},gid={}", owner.uid, owner.gid));
    }
    options
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scratch_options_cap_size_and_inodes_and_name_the_owner() {
        let mut mount = ScratchMount {
            path: "/run/airlock/run-1/work".into(),
            size_bytes: 1 << 20,
            max_files: 100,
            mode: 0o700,
            exec: false,
            owner: Some(Credentials {
                uid: 65534,
                gid: 65534,
            }),
        };
        assert_eq!(
            scratch_options(&mount),
            "size=1048576,nr_inodes=100,mode=700,uid=65534,gid=65534"
        );
        mount.owner = None;
        assert_eq!(
            scratch_options(&mount),
            "size=1048576,nr_inodes=100,mode=700"
        );
    }
}
