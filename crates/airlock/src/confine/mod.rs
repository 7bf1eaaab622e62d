//! Confinement primitives, one facility per module: the root filesystem (and the in-memory run
//! directory's mounts), Landlock, seccomp, capabilities and cgroups. The init applies them in
//! its single-threaded process before `execve`; backends plan with their types. Nothing here
//! imports the rest of airlock.

use serde::{Deserialize, Serialize};

pub mod caps;
pub mod cgroup;
pub mod found;
pub mod idmap;
pub mod landlock;
pub mod rootfs;
pub mod seccomp;

/// A uid/gid pair: the unprivileged identity the program runs as.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq)]
pub struct Credentials {
    pub uid: u32,
    pub gid: u32,
}
