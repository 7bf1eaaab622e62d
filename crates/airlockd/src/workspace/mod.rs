//! Workspaces: directories the daemon owns and sandboxes write into (a session's files, the
//! files sent with a run, a worker's job), and safe access to what the sandbox left there.
//!
//! As root each workspace is its own tmpfs mounted by the daemon, with `size=` and
//! `nr_inodes=` set from the request: the disk and file caps hold for the program and for
//! uploads alike, and a full workspace cannot fill the host's disk. Without root there is no
//! mount; the workspace is a plain directory and only uploads are capped (the record says so).
//!
//! Every file operation treats the tree as hostile: a sandbox (or a program it left running)
//! may swap any name for a symlink, a hardlink or a directory at any moment. Paths are parsed
//! into plain components (no `..`, `.`, empty names, NUL or control characters); files are
//! opened with `openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS |
//! RESOLVE_NO_XDEV)` relative to the workspace root, so the kernel refuses any resolution that
//! would leave the tree or follow a link, atomically; a file with more than one link is
//! refused (it may be a host file linked in); reads are bounded and re-checked with `fstat`
//! (a file that changed while being read is refused); writes go to a fresh temporary name and
//! are renamed into place relative to a directory descriptor, which replaces a symlink at the
//! destination instead of following it.

mod beneath;
mod path;

use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};

use rustix::fs::{Mode, OFlags};

pub use beneath::{DirEntry, EntryKind};
pub use path::{FileError, SafePath, MAX_DEPTH, MAX_PATH_BYTES};

use beneath::{
    entry_kind, io_error, list_beneath, open_beneath, read_file_beneath, remove_beneath,
    write_file_beneath,
};

/// A workspace directory, a tmpfs of its own when the daemon may mount.
#[derive(Debug)]
pub struct Workspace {
    pub dir: PathBuf,
    /// `Some((bytes, files))` when a tmpfs enforces the caps.
    pub quota: Option<(u64, u64)>,
    /// The uid and gid sandboxed programs run as (files the daemon writes are theirs).
    pub owner: Option<(u32, u32)>,
}

/// Caps and identity of a new workspace.
#[derive(Debug, Clone, Copy)]
pub struct WorkspaceSpec {
    pub bytes: u64,
    pub files: u64,
    pub owner: Option<(u32, u32)>,
    /// Allow executing files written there.
    pub exec: bool,
}

/// Whether this process may mount (root with CAP_SYS_ADMIN in the host's namespaces).
pub fn can_mount() -> bool {
    rustix::process::geteuid().is_root()
}

impl Workspace {
    /// Creates `dir` (which must not exist) and, as root, mounts a capped tmpfs on it.
    pub fn create(dir: &Path, spec: WorkspaceSpec) -> std::io::Result<Workspace> {
        std::fs::create_dir(dir)?;
        let quota = if can_mount() {
            if let Err(e) = mount_tmpfs(dir, &spec) {
                let _ = std::fs::remove_dir(dir);
                return Err(e);
            }
            Some((spec.bytes, spec.files))
        } else {
            set_owner_mode(dir, spec.owner)?;
            None
        };
        Ok(Workspace {
            dir: dir.to_path_buf(),
            quota,
            owner: spec.owner,
        })
    }

    /// Takes over a workspace left by an earlier daemon process (its mount, if any, is kept).
    pub fn adopt(dir: &Path, quota: Option<(u64, u64)>, owner: Option<(u32, u32)>) -> Workspace {
        Workspace {
            dir: dir.to_path_buf(),
            quota,
            owner,
        }
    }

    /// Unmounts (lazily: a sandbox still holding it keeps it until it exits) and removes it.
    pub fn remove(&self) -> std::io::Result<()> {
        remove_workspace_dir(&self.dir)
    }

    fn root(&self) -> Result<OwnedFd, FileError> {
        rustix::fs::open(
            &self.dir,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| io_error("", e))
    }

    /// Reads a regular file, at most `max` bytes.
    pub fn read_file(&self, path: &SafePath, max: u64) -> Result<Vec<u8>, FileError> {
        read_file_beneath(&self.root()?, path, max)
    }

    /// Lists a directory.
    pub fn list(&self, path: &SafePath) -> Result<Vec<DirEntry>, FileError> {
        list_beneath(&self.root()?, path)
    }

    /// What `path` is: a regular file, a directory, or something else.
    pub fn kind(&self, path: &SafePath) -> Result<EntryKind, FileError> {
        let root = self.root()?;
        if path.is_root() {
            return Ok(EntryKind::Directory);
        }
        let fd = open_beneath(&root, path, OFlags::PATH)?;
        let stat = rustix::fs::fstat(&fd).map_err(|e| io_error(&path.display(), e))?;
        Ok(entry_kind(stat.st_mode))
    }

    /// Writes `bytes` to `path`, creating parent directories, replacing an existing file.
    pub fn write_file(&self, path: &SafePath, bytes: &[u8]) -> Result<(), FileError> {
        write_file_beneath(&self.root()?, path, bytes, self.owner)
    }

    /// Removes a file or an empty directory.
    pub fn remove_entry(&self, path: &SafePath) -> Result<(), FileError> {
        remove_beneath(&self.root()?, path)
    }
}

/// Lazily unmounts whatever is mounted on `dir` and removes what is left.
pub fn remove_workspace_dir(dir: &Path) -> std::io::Result<()> {
    if can_mount() {
        // Nested or stacked mounts are unlikely but possible after a crash mid-create.
        for _ in 0..4 {
            if rustix::mount::unmount(dir, rustix::mount::UnmountFlags::DETACH).is_err() {
                break;
            }
        }
    }
    match std::fs::remove_dir_all(dir) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        other => other,
    }
}

fn mount_tmpfs(dir: &Path, spec: &WorkspaceSpec) -> std::io::Result<()> {
    use rustix::mount::MountFlags;
    let (uid, gid) = spec.owner.unwrap_or((0, 0));
    let data = format!(
        "size={},nr_inodes={},mode=0700,uid={uid},gid={gid}",
        spec.bytes.max(4096),
        spec.files.max(16)
    );
    let data = std::ffi::CString::new(data).map_err(std::io::Error::other)?;
    let mut flags = MountFlags::NOSUID | MountFlags::NODEV;
    if !spec.exec {
        flags |= MountFlags::NOEXEC;
    }
    rustix::mount::mount("airlockd", dir, "tmpfs", flags, Some(data.as_c_str()))?;
    Ok(())
}

fn set_owner_mode(dir: &Path, owner: Option<(u32, u32)>) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    if let Some((uid, gid)) = owner {
        std::os::unix::fs::chown(dir, Some(uid), Some(gid))?;
    }
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
}

/// A random number from the OS.
pub fn random_u64() -> u64 {
    let mut bytes = [0u8; 8];
    getrandom::fill(&mut bytes).expect("the OS random number generator is unavailable");
    u64::from_le_bytes(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn workspace(dir: &Path) -> Workspace {
        Workspace::adopt(dir, None, None)
    }

    #[test]
    fn paths_are_plain_components() {
        assert_eq!(SafePath::parse("a/b.txt").unwrap().display(), "a/b.txt");
        assert!(SafePath::parse("/").unwrap().is_root());
        for bad in [
            "../x",
            "a/../b",
            "a//b",
            "./a",
            "a/\0",
            "a/\n",
            &"x/".repeat(40),
        ] {
            assert!(SafePath::parse(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn symlinks_and_hardlinks_are_never_followed_out() {
        let outside = tempfile::tempdir().unwrap();
        let secret = outside.path().join("secret");
        std::fs::write(&secret, "host secret").unwrap();
        let ws_dir = tempfile::tempdir().unwrap();
        let ws = workspace(ws_dir.path());
        std::os::unix::fs::symlink(&secret, ws_dir.path().join("link")).unwrap();
        std::os::unix::fs::symlink(outside.path(), ws_dir.path().join("dirlink")).unwrap();
        std::fs::hard_link(&secret, ws_dir.path().join("hard")).unwrap();
        let read = |p: &str| ws.read_file(&SafePath::parse(p).unwrap(), 1 << 20);
        assert!(
            matches!(read("link"), Err(FileError::Escapes { .. })),
            "{:?}",
            read("link")
        );
        assert!(matches!(
            read("dirlink/secret"),
            Err(FileError::Escapes { .. })
        ));
        assert!(matches!(read("hard"), Err(FileError::Hardlinked { .. })));
        // Writing through a symlinked directory is refused; writing over a symlink replaces
        // the link, never the file it points at.
        let write = |p: &str| ws.write_file(&SafePath::parse(p).unwrap(), b"overwritten");
        assert!(matches!(
            write("dirlink/secret"),
            Err(FileError::Escapes { .. })
        ));
        write("link").unwrap();
        assert_eq!(std::fs::read_to_string(&secret).unwrap(), "host secret");
        assert_eq!(read("link").unwrap(), b"overwritten");
    }

    #[test]
    fn write_read_list_remove() {
        let ws_dir = tempfile::tempdir().unwrap();
        let ws = workspace(ws_dir.path());
        let path = SafePath::parse("sub/dir/f.txt").unwrap();
        ws.write_file(&path, b"hello").unwrap();
        assert_eq!(ws.read_file(&path, 5).unwrap(), b"hello");
        assert!(matches!(
            ws.read_file(&path, 4),
            Err(FileError::TooLarge { .. })
        ));
        let listing = ws.list(&SafePath::parse("sub/dir").unwrap()).unwrap();
        assert_eq!(
            listing,
            vec![DirEntry {
                name: "f.txt".into(),
                kind: EntryKind::File,
                size: Some(5)
            }]
        );
        assert!(matches!(
            ws.remove_entry(&SafePath::parse("sub").unwrap()),
            Err(FileError::NotEmpty { .. })
        ));
        ws.remove_entry(&path).unwrap();
        assert!(matches!(
            ws.read_file(&path, 5),
            Err(FileError::NotFound { .. })
        ));
    }
}
