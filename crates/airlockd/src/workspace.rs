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

use std::io::{Read, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};

use rustix::fs::{Mode, OFlags, ResolveFlags};
use rustix::io::Errno;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// Longest accepted path, in bytes.
pub const MAX_PATH_BYTES: usize = 4096;
/// Most components in a path.
pub const MAX_DEPTH: usize = 32;

/// A problem with a workspace file operation, mapped to an API error by the caller.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum FileError {
    #[error("invalid path {path:?}: {problem}")]
    BadPath { path: String, problem: &'static str },
    #[error("{path:?} does not exist")]
    NotFound { path: String },
    #[error("{path:?} leaves the workspace or goes through a symbolic link")]
    Escapes { path: String },
    #[error("{path:?} is not a regular file ({kind})")]
    NotRegular { path: String, kind: &'static str },
    #[error("{path:?} has {links} hard links; only files with one link are served")]
    Hardlinked { path: String, links: u64 },
    #[error("{path:?} is {size} bytes, over the {max}-byte limit")]
    TooLarge { path: String, size: u64, max: u64 },
    #[error("{path:?} changed while it was being read")]
    Changed { path: String },
    #[error("the workspace is full (its disk or file cap is reached)")]
    Full,
    #[error("{path:?} is a directory that is not empty")]
    NotEmpty { path: String },
    #[error("{path:?}: {cause}")]
    Io { path: String, cause: String },
}

/// A relative path inside a workspace, checked component by component.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SafePath {
    components: Vec<String>,
}

impl SafePath {
    /// Parses `text` (`a/b/c.txt`; a leading or trailing `/` is ignored). The empty path is
    /// the workspace root.
    pub fn parse(text: &str) -> Result<SafePath, FileError> {
        let bad = |problem| FileError::BadPath {
            path: text.chars().take(200).collect(),
            problem,
        };
        if text.len() > MAX_PATH_BYTES {
            return Err(bad("longer than 4096 bytes"));
        }
        let trimmed = text.trim_matches('/');
        if trimmed.is_empty() {
            return Ok(SafePath {
                components: Vec::new(),
            });
        }
        let components: Vec<String> = trimmed.split('/').map(str::to_string).collect();
        if components.len() > MAX_DEPTH {
            return Err(bad("deeper than 32 components"));
        }
        for component in &components {
            if let Some(problem) = component_problem(component) {
                return Err(bad(problem));
            }
        }
        Ok(SafePath { components })
    }

    pub fn is_root(&self) -> bool {
        self.components.is_empty()
    }

    pub fn display(&self) -> String {
        self.components.join("/")
    }

    fn split_last(&self) -> Option<(&[String], &String)> {
        self.components
            .split_last()
            .map(|(last, parents)| (parents, last))
    }
}

fn component_problem(name: &str) -> Option<&'static str> {
    if name.is_empty() {
        Some("an empty component (\"//\")")
    } else if name == "." || name == ".." {
        Some("\".\" and \"..\" are not allowed")
    } else if name.contains('\0') {
        Some("a NUL byte")
    } else if name.chars().any(char::is_control) {
        Some("a control character")
    } else if name.len() > 255 {
        Some("a component longer than 255 bytes")
    } else {
        None
    }
}

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

/// Resolution that never leaves `root`, follows no link and crosses no mount.
const BENEATH: ResolveFlags = ResolveFlags::BENEATH
    .union(ResolveFlags::NO_SYMLINKS)
    .union(ResolveFlags::NO_MAGICLINKS)
    .union(ResolveFlags::NO_XDEV);

fn open_beneath(root: &OwnedFd, path: &SafePath, flags: OFlags) -> Result<OwnedFd, FileError> {
    let text = path.display();
    // openat2 refuses O_PATH combined with anything but O_DIRECTORY, O_NOFOLLOW, O_CLOEXEC.
    let extra = if flags.contains(OFlags::PATH) {
        OFlags::empty()
    } else {
        OFlags::NOCTTY
    };
    let flags = flags | extra | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    rustix::fs::openat2(root, text.as_str(), flags, Mode::empty(), BENEATH)
        .map_err(|e| resolve_error(&text, e))
}

fn resolve_error(path: &str, e: Errno) -> FileError {
    match e {
        Errno::NOENT => FileError::NotFound { path: path.into() },
        Errno::XDEV | Errno::LOOP | Errno::NOTDIR => FileError::Escapes { path: path.into() },
        other => io_error(path, other),
    }
}

fn io_error(path: &str, e: impl std::fmt::Display) -> FileError {
    FileError::Io {
        path: path.into(),
        cause: e.to_string(),
    }
}

/// What a directory entry is.
#[derive(Serialize, Deserialize, ToSchema, Debug, Clone, Copy, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum EntryKind {
    File,
    Directory,
    Symlink,
    Other,
}

fn entry_kind(mode: u32) -> EntryKind {
    match rustix::fs::FileType::from_raw_mode(mode) {
        rustix::fs::FileType::RegularFile => EntryKind::File,
        rustix::fs::FileType::Directory => EntryKind::Directory,
        rustix::fs::FileType::Symlink => EntryKind::Symlink,
        _ => EntryKind::Other,
    }
}

/// One entry of a listing.
#[derive(Serialize, Deserialize, ToSchema, Debug, Clone, PartialEq, Eq)]
pub struct DirEntry {
    pub name: String,
    pub kind: EntryKind,
    /// Size in bytes (files only).
    pub size: Option<u64>,
}

fn read_file_beneath(root: &OwnedFd, path: &SafePath, max: u64) -> Result<Vec<u8>, FileError> {
    let text = path.display();
    let fd = open_beneath(root, path, OFlags::RDONLY | OFlags::NONBLOCK)?;
    let before = rustix::fs::fstat(&fd).map_err(|e| io_error(&text, e))?;
    check_servable(&text, &before)?;
    let size = before.st_size as u64;
    if size > max {
        return Err(FileError::TooLarge {
            path: text,
            size,
            max,
        });
    }
    let mut bytes = Vec::with_capacity(size as usize);
    std::fs::File::from(fd.try_clone().map_err(|e| io_error(&text, e))?)
        .take(size + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| io_error(&text, e))?;
    let after = rustix::fs::fstat(&fd).map_err(|e| io_error(&text, e))?;
    let unchanged = bytes.len() as u64 == size
        && after.st_size == before.st_size
        && after.st_ino == before.st_ino
        && (after.st_mtime, after.st_mtime_nsec) == (before.st_mtime, before.st_mtime_nsec)
        && (after.st_ctime, after.st_ctime_nsec) == (before.st_ctime, before.st_ctime_nsec);
    if !unchanged {
        return Err(FileError::Changed { path: text });
    }
    Ok(bytes)
}

fn check_servable(path: &str, stat: &rustix::fs::Stat) -> Result<(), FileError> {
    match entry_kind(stat.st_mode) {
        EntryKind::File => {}
        EntryKind::Directory => {
            return Err(FileError::NotRegular {
                path: path.into(),
                kind: "a directory",
            })
        }
        _ => {
            return Err(FileError::NotRegular {
                path: path.into(),
                kind: "a special file",
            })
        }
    }
    // st_nlink is u64 on x86_64 and u32 on some other targets.
    #[allow(clippy::unnecessary_cast)]
    let links = stat.st_nlink as u64;
    if links > 1 {
        return Err(FileError::Hardlinked {
            path: path.into(),
            links,
        });
    }
    Ok(())
}

fn list_beneath(root: &OwnedFd, path: &SafePath) -> Result<Vec<DirEntry>, FileError> {
    let text = path.display();
    let dir = if path.is_root() {
        root.try_clone().map_err(|e| io_error(&text, e))?
    } else {
        open_beneath(root, path, OFlags::RDONLY | OFlags::DIRECTORY)?
    };
    let mut listing = rustix::fs::Dir::read_from(&dir).map_err(|e| io_error(&text, e))?;
    let mut entries = Vec::new();
    while let Some(entry) = listing.read() {
        let entry = entry.map_err(|e| io_error(&text, e))?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if name == "." || name == ".." || entries.len() >= 10_000 {
            continue;
        }
        // fstatat without following: the entry is described, never opened.
        let stat = rustix::fs::statat(
            &dir,
            entry.file_name(),
            rustix::fs::AtFlags::SYMLINK_NOFOLLOW,
        );
        let (kind, size) = match stat {
            Ok(s) => {
                let kind = entry_kind(s.st_mode);
                (kind, (kind == EntryKind::File).then_some(s.st_size as u64))
            }
            Err(_) => (EntryKind::Other, None),
        };
        entries.push(DirEntry { name, kind, size });
    }
    entries.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(entries)
}

/// Opens (creating when missing) every parent directory of `path`, one component at a time.
fn parent_dir(
    root: &OwnedFd,
    parents: &[String],
    owner: Option<(u32, u32)>,
) -> Result<OwnedFd, FileError> {
    let mut dir = root.try_clone().map_err(|e| io_error("", e))?;
    for (depth, name) in parents.iter().enumerate() {
        let so_far = parents[..=depth].join("/");
        let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
        let opened = rustix::fs::openat2(&dir, name.as_str(), flags, Mode::empty(), BENEATH);
        dir = match opened {
            Ok(fd) => fd,
            Err(Errno::NOENT) => {
                match rustix::fs::mkdirat(&dir, name.as_str(), Mode::from_raw_mode(0o755)) {
                    Ok(()) | Err(Errno::EXIST) => {}
                    Err(Errno::NOSPC) | Err(Errno::DQUOT) => return Err(FileError::Full),
                    Err(e) => return Err(io_error(&so_far, e)),
                }
                let fd = rustix::fs::openat2(&dir, name.as_str(), flags, Mode::empty(), BENEATH)
                    .map_err(|e| resolve_error(&so_far, e))?;
                chown(&fd, owner);
                fd
            }
            Err(e) => return Err(resolve_error(&so_far, e)),
        };
    }
    Ok(dir)
}

fn chown(fd: impl AsFd, owner: Option<(u32, u32)>) {
    if let Some((uid, gid)) = owner {
        // Best effort: without root the files are ours already.
        let _ = rustix::fs::fchown(
            fd,
            Some(rustix::fs::Uid::from_raw(uid)),
            Some(rustix::fs::Gid::from_raw(gid)),
        );
    }
}

fn write_file_beneath(
    root: &OwnedFd,
    path: &SafePath,
    bytes: &[u8],
    owner: Option<(u32, u32)>,
) -> Result<(), FileError> {
    let text = path.display();
    let Some((parents, name)) = path.split_last() else {
        return Err(FileError::BadPath {
            path: text,
            problem: "the workspace root is a directory",
        });
    };
    let dir = parent_dir(root, parents, owner)?;
    let temp = format!(".airlockd-upload-{:016x}", random_u64());
    let flags = OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    let fd = rustix::fs::openat(&dir, temp.as_str(), flags, Mode::from_raw_mode(0o644))
        .map_err(|e| full_or(e, &text))?;
    chown(&fd, owner);
    let written = std::fs::File::from(fd).write_all(bytes);
    let placed = written
        .map_err(|e| match e.raw_os_error() {
            Some(code) if code == Errno::NOSPC.raw_os_error() => FileError::Full,
            _ => io_error(&text, e),
        })
        .and_then(|()| {
            rustix::fs::renameat(&dir, temp.as_str(), &dir, name.as_str()).map_err(|e| match e {
                Errno::ISDIR | Errno::NOTEMPTY => FileError::NotRegular {
                    path: text.clone(),
                    kind: "a directory",
                },
                other => full_or(other, &text),
            })
        });
    if placed.is_err() {
        let _ = rustix::fs::unlinkat(&dir, temp.as_str(), rustix::fs::AtFlags::empty());
    }
    placed
}

fn full_or(e: Errno, path: &str) -> FileError {
    match e {
        Errno::NOSPC | Errno::DQUOT => FileError::Full,
        other => io_error(path, other),
    }
}

fn remove_beneath(root: &OwnedFd, path: &SafePath) -> Result<(), FileError> {
    let text = path.display();
    let Some((parents, name)) = path.split_last() else {
        return Err(FileError::BadPath {
            path: text,
            problem: "the workspace root cannot be removed",
        });
    };
    let dir = if parents.is_empty() {
        root.try_clone().map_err(|e| io_error(&text, e))?
    } else {
        let parent = SafePath {
            components: parents.to_vec(),
        };
        open_beneath(root, &parent, OFlags::RDONLY | OFlags::DIRECTORY)?
    };
    match rustix::fs::unlinkat(&dir, name.as_str(), rustix::fs::AtFlags::empty()) {
        Ok(()) => Ok(()),
        Err(Errno::ISDIR) => {
            rustix::fs::unlinkat(&dir, name.as_str(), rustix::fs::AtFlags::REMOVEDIR).map_err(|e| {
                match e {
                    Errno::NOTEMPTY | Errno::EXIST => FileError::NotEmpty { path: text.clone() },
                    other => io_error(&text, other),
                }
            })
        }
        Err(Errno::NOENT) => Err(FileError::NotFound { path: text }),
        Err(e) => Err(io_error(&text, e)),
    }
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
