//! The run directory in memory: planned by the supervisor, mounted by the init.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::confine::rootfs::ScratchMount;
use crate::confine::Credentials;
use crate::policy::Policy;

/// The run's scratch space in memory. The init enters a mount namespace of its own, covers the
/// runtime directory with a small tmpfs and builds the run directory in it, then mounts a capped
/// tmpfs at each of `mounts` (the fresh workdir, tmp, shm; none where the boundary mounts its
/// own, as the native sandbox's PID 1 does). Nothing of the run reaches the host's disk, every
/// writable area has a size and an inode cap whatever tool wraps the program, and the kernel
/// frees it all when the run's last process is gone, even after a SIGKILL. Only for tools that
/// run in the init's mount namespace (not Docker's daemon).
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct MemoryScratch {
    /// The directory the tmpfs covers (the parent of the run directory).
    pub runtime_dir: PathBuf,
    /// Capped tmpfs mounts inside the run directory.
    pub mounts: Vec<ScratchMount>,
    /// The boundary uses the run directory: the init covers the runtime directory in a mount
    /// namespace of its own and makes the run directory there. False where the boundary
    /// mounts its own scratch (no `mounts`) and binds nothing that reaches the runtime
    /// directory, which the cover would hide (the native sandbox for most policies): the init
    /// then makes nothing, and needs no mount namespace of its own, whose creation and
    /// teardown (an RCU grace period at the init's exit) sat on every run's path.
    #[serde(default = "needed_by_default")]
    pub needed: bool,
}

fn needed_by_default() -> bool {
    true
}

impl MemoryScratch {
    /// The capped tmpfs mounted at `path`, if the scratch has one.
    pub fn mount_at(&self, path: &Path) -> Option<&ScratchMount> {
        self.mounts.iter().find(|m| m.path == path)
    }
}

/// The in-memory run directory: the fresh workdir (`owned_workdir`, when the run owns it) and
/// `tmp` each capped by the policy's disk and file limits (as the native sandbox caps its own),
/// `shm` by a smaller share; every mount owned by `owner`, the sandbox user.
pub fn memory_scratch(
    policy: &Policy,
    runtime: &Path,
    run_dir: &Path,
    owned_workdir: Option<&Path>,
    owner: Option<Credentials>,
) -> MemoryScratch {
    let limits = &policy.limits;
    let capped = |path: PathBuf, size_bytes: u64, max_files: u64| ScratchMount {
        path,
        size_bytes,
        max_files,
        mode: 0o700,
        exec: policy.filesystem.exec_writable,
        owner,
    };
    let mut mounts: Vec<ScratchMount> = owned_workdir
        .map(|dir| capped(dir.to_path_buf(), limits.disk.0, limits.files))
        .into_iter()
        .collect();
    mounts.push(capped(super::tmp_dir(run_dir), limits.disk.0, limits.files));
    let (shm_bytes, shm_files) = limits.shm_caps();
    mounts.push(capped(super::shm_dir(run_dir), shm_bytes, shm_files));
    MemoryScratch {
        runtime_dir: runtime.to_path_buf(),
        mounts,
        needed: true,
    }
}
