//! Opening a path below a directory without ever leaving it: `openat2` with
//! `RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS` (and, when asked,
//! `RESOLVE_NO_XDEV`). A workspace may be shared with programs that swap a directory for a
//! symlink at any moment; resolving a name there by path (`open`, `mount`, `rename`) could
//! then reach the host's files. One helper for every caller (protect_git's walk and binds,
//! the daemon's workspace files), so the flags are chosen once.

use std::os::fd::{AsFd, OwnedFd};
use std::path::Path;

use rustix::fs::{Mode, OFlags, ResolveFlags};
use rustix::io::Errno;

/// Never above the starting directory, through no symlink, through no `/proc` magic link.
const NO_ESCAPE: ResolveFlags = ResolveFlags::BENEATH
    .union(ResolveFlags::NO_SYMLINKS)
    .union(ResolveFlags::NO_MAGICLINKS);

/// Whether the resolution may cross into another mount below the directory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mounts {
    /// Mounts below the directory are part of it (a workspace the caller assembled).
    Cross,
    /// A mount below the directory ends the resolution with `EXDEV`.
    Stay,
}

/// Opens `path` (relative; empty for the directory itself) below `dir`. `O_NOFOLLOW` and
/// `O_CLOEXEC` are always added, and `O_NOCTTY` unless `flags` has `O_PATH` (openat2 refuses
/// `O_PATH` with anything but `O_DIRECTORY`, `O_NOFOLLOW` and `O_CLOEXEC`). A symlink or a
/// `..` on the way fails with `ELOOP` or `EXDEV`, whatever it points to.
pub fn open_beneath(
    dir: impl AsFd,
    path: &Path,
    flags: OFlags,
    mounts: Mounts,
) -> Result<OwnedFd, Errno> {
    let extra = match flags.contains(OFlags::PATH) {
        true => OFlags::empty(),
        false => OFlags::NOCTTY,
    };
    let resolve = match mounts {
        Mounts::Cross => NO_ESCAPE,
        Mounts::Stay => NO_ESCAPE | ResolveFlags::NO_XDEV,
    };
    let path = match path.as_os_str().is_empty() {
        true => Path::new("."),
        false => path,
    };
    let flags = flags | extra | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    rustix::fs::openat2(dir, path, flags, Mode::empty(), resolve)
}

/// A directory below `dir`, as an `O_PATH` descriptor: enough to bind it, stat it or start
/// another resolution from it, and never a read of its contents.
pub fn open_dir_path(dir: impl AsFd, path: &Path, mounts: Mounts) -> Result<OwnedFd, Errno> {
    open_beneath(dir, path, OFlags::PATH | OFlags::DIRECTORY, mounts)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn root() -> (tempfile::TempDir, OwnedFd) {
        let dir = tempfile::tempdir().unwrap();
        let fd =
            rustix::fs::open(dir.path(), OFlags::PATH | OFlags::DIRECTORY, Mode::empty()).unwrap();
        (dir, fd)
    }

    #[test]
    fn opens_a_directory_below() {
        let (dir, fd) = root();
        std::fs::create_dir_all(dir.path().join("a/b")).unwrap();
        assert!(open_dir_path(&fd, Path::new("a/b"), Mounts::Cross).is_ok());
        assert!(open_dir_path(&fd, Path::new(""), Mounts::Cross).is_ok());
    }

    #[test]
    fn refuses_a_symlink_anywhere_on_the_way() {
        let (dir, fd) = root();
        std::fs::create_dir_all(dir.path().join("real/.git")).unwrap();
        std::os::unix::fs::symlink("real", dir.path().join("link")).unwrap();
        std::os::unix::fs::symlink("/", dir.path().join("real/up")).unwrap();
        for path in ["link/.git", "real/up", "link", "../x"] {
            assert!(
                open_dir_path(&fd, Path::new(path), Mounts::Cross).is_err(),
                "{path}"
            );
        }
    }
}
