//! In-process confinement primitives used by the native backend's init. Each is applied by
//! the single-threaded init process before `execve`.

pub mod caps;
pub mod cgroup;
pub mod landlock;
pub mod rootfs;
pub mod seccomp;
