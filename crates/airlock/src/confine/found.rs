//! What protect_git's walk found below a writable root, as the objects it found: the
//! backends bind those objects, never whatever their paths name by the time they mount.

use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};

use rustix::fs::{FileType, OFlags};
use rustix::io::Errno;

use crate::linux::beneath::{open_beneath, Mounts};

/// A directory (or file) found below a root by a walk, and which object it was: binding it
/// later by its path would bind whatever the path names by then (another program sharing the
/// root may have swapped a directory on the way for a symlink to the host's files), so the
/// binder opens it again below the root and checks it is the same object ([`Found::reopen`]),
/// then binds the descriptor.
#[derive(serde::Serialize, serde::Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct Found {
    /// The full path, as the sandbox sees it.
    pub path: PathBuf,
    /// The root it lies below (the caller's own path, trusted by name).
    pub root: PathBuf,
    pub dev: u64,
    pub ino: u64,
}

impl Found {
    /// Opens `path` below `root` (an `O_PATH` descriptor of the root) and records which object
    /// it is. Fails when a symlink lies on the way or the path is not below the root.
    pub fn open(root_fd: impl AsFd, root: &Path, path: &Path) -> Result<(Found, OwnedFd), Errno> {
        let relative = path.strip_prefix(root).map_err(|_| Errno::XDEV)?;
        let fd = open_beneath(root_fd, relative, OFlags::PATH, Mounts::Cross)?;
        let stat = rustix::fs::fstat(&fd)?;
        // O_PATH with O_NOFOLLOW opens a trailing symlink itself: never bound.
        match FileType::from_raw_mode(stat.st_mode) {
            FileType::Directory | FileType::RegularFile => {}
            FileType::Symlink => return Err(Errno::LOOP),
            _ => return Err(Errno::INVAL),
        }
        let found = Found {
            path: path.to_path_buf(),
            root: root.to_path_buf(),
            dev: stat.st_dev,
            ino: stat.st_ino,
        };
        Ok((found, fd))
    }

    /// The same object again, as an `O_PATH` descriptor, or `ESTALE` when the path below the
    /// root now names another one (`ELOOP`/`EXDEV` when a symlink appeared on the way).
    pub fn reopen(&self) -> Result<OwnedFd, Errno> {
        let root = rustix::fs::open(
            &self.root,
            OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
            rustix::fs::Mode::empty(),
        )?;
        let (again, fd) = Found::open(&root, &self.root, &self.path)?;
        match again == *self {
            true => Ok(fd),
            false => Err(Errno::STALE),
        }
    }

    /// The path below the root.
    pub fn relative(&self) -> &Path {
        self.path.strip_prefix(&self.root).unwrap_or(Path::new(""))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rustix::fs::Mode;

    #[test]
    fn a_found_directory_swapped_for_a_symlink_or_another_is_not_reopened() {
        let dir = tempfile::tempdir().unwrap();
        let fd =
            rustix::fs::open(dir.path(), OFlags::PATH | OFlags::DIRECTORY, Mode::empty()).unwrap();
        let git = dir.path().join("repo/.git");
        std::fs::create_dir_all(&git).unwrap();
        let (found, _) = Found::open(&fd, dir.path(), &git).unwrap();
        assert!(found.reopen().is_ok());
        std::fs::rename(&git, dir.path().join("repo/.git-real")).unwrap();
        std::os::unix::fs::symlink("/root", &git).unwrap();
        assert_eq!(found.reopen().unwrap_err(), Errno::LOOP);
        std::fs::remove_file(&git).unwrap();
        std::fs::create_dir(&git).unwrap();
        assert_eq!(found.reopen().unwrap_err(), Errno::STALE);
    }
}
