//! `mount_setattr(2)`: idmapped mounts and mount flags added in place.

use std::io;
use std::os::fd::AsRawFd;

use super::check;

/// `struct mount_attr` of `mount_setattr(2)` (linux/mount.h); no crate offers the call yet
/// (rustix lists it as not implemented).
#[repr(C)]
struct MountAttr {
    attr_set: u64,
    attr_clr: u64,
    propagation: u64,
    userns_fd: u64,
}

const MOUNT_ATTR_IDMAP: u64 = 0x0010_0000;
/// `MOUNT_ATTR_RDONLY`, `_NOSUID`, `_NODEV` and `_NOEXEC` (linux/mount.h).
pub const MOUNT_ATTR_RDONLY: u64 = 0x1;
pub const MOUNT_ATTR_NOSUID: u64 = 0x2;
pub const MOUNT_ATTR_NODEV: u64 = 0x4;
pub const MOUNT_ATTR_NOEXEC: u64 = 0x8;

/// Makes the detached mount tree `tree` (from `open_tree(OPEN_TREE_CLONE)`) an idmapped
/// mount: its files' owners are shown through `userns`'s id maps, and ids written through it
/// are mapped back. `recursive` applies it to every mount of the tree.
pub fn set_mount_idmap(
    tree: std::os::fd::BorrowedFd,
    userns: std::os::fd::BorrowedFd,
    recursive: bool,
) -> io::Result<()> {
    let attr = MountAttr {
        attr_set: MOUNT_ATTR_IDMAP,
        attr_clr: 0,
        propagation: 0,
        userns_fd: userns.as_raw_fd() as u64,
    };
    mount_setattr(tree, c"", &attr, recursive)
}

/// Adds the `MOUNT_ATTR_*` `flags` to the mount at `path` under `dir` (`dir`'s own if empty;
/// `recursive`: and every mount below). Only added, never cleared: what a user namespace
/// locked stays, which a bind remount would have to look up (`statfs`) and repeat.
pub fn add_mount_flags(
    dir: std::os::fd::BorrowedFd,
    path: &std::path::Path,
    flags: u64,
    recursive: bool,
) -> io::Result<()> {
    let attr = MountAttr {
        attr_set: flags,
        attr_clr: 0,
        propagation: 0,
        userns_fd: 0,
    };
    let path = std::ffi::CString::new(path.as_os_str().as_encoded_bytes())?;
    mount_setattr(dir, &path, &attr, recursive)
}

fn mount_setattr(
    dir: std::os::fd::BorrowedFd,
    path: &std::ffi::CStr,
    attr: &MountAttr,
    recursive: bool,
) -> io::Result<()> {
    let flags = libc::AT_EMPTY_PATH | if recursive { libc::AT_RECURSIVE } else { 0 };
    // SAFETY: `dir` is borrowed for the call, `path` is a live C string (empty: AT_EMPTY_PATH
    // acts on `dir`), `attr` a live `struct mount_attr` of the size passed; nothing is written.
    let result = unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            dir.as_raw_fd(),
            path.as_ptr(),
            flags,
            attr as *const MountAttr,
            std::mem::size_of::<MountAttr>(),
        )
    };
    check(result as i32).map(|_| ())
}
