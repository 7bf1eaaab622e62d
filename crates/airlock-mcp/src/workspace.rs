//! Files of a session's workspace, read and written by the host while sandboxed programs may
//! be changing the same tree.
//!
//! A program in the sandbox can plant a symlink (`report.json -> /etc/shadow`) or a hardlink to
//! a file it can see, or swap a directory for a symlink between two host calls. So nothing
//! here goes through a path: each component is opened relative to its parent's descriptor with
//! `O_NOFOLLOW`, a file is read only if it is a regular file with one link, through the
//! descriptor that was checked, and a write goes to a fresh temporary name then replaces the
//! target by `renameat` (which replaces a symlink itself, never what it points to).

use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::OwnedFd;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use rustix::fs::{AtFlags, Mode, OFlags};
use rustix::io::Errno;

use crate::executor::{Failure, FailureKind};

/// Longest path accepted, in bytes.
const MAX_PATH_BYTES: usize = 4096;
/// Deepest path accepted, in components.
const MAX_DEPTH: usize = 32;

/// A session's workspace directory, held open.
#[derive(Debug)]
pub struct Workspace {
    root: OwnedFd,
    /// Owner given to what the host creates, so the sandboxed program can change it.
    owner: Option<(u32, u32)>,
}

/// The components of a relative path inside a workspace, or why it is refused.
pub fn components(path: &str) -> Result<Vec<&str>, Failure> {
    let invalid = |why: &str| {
        Failure::new(FailureKind::Invalid, format!("path {path:?}: {why}"))
            .with_fix("give a relative path inside the workspace, such as data/input.csv")
    };
    if path.is_empty() || path.len() > MAX_PATH_BYTES {
        return Err(invalid("must be 1 to 4096 bytes"));
    }
    if path.contains('\0') {
        return Err(invalid("contains a NUL byte"));
    }
    if path.starts_with('/') {
        return Err(denied(path, "absolute paths are outside the workspace")
            .with_reason("outside_workspace"));
    }
    let parts: Vec<&str> = path.split('/').filter(|c| !c.is_empty()).collect();
    if parts.contains(&"..") {
        return Err(
            denied(path, "`..` leads out of the workspace").with_reason("outside_workspace")
        );
    }
    let parts: Vec<&str> = parts.into_iter().filter(|c| *c != ".").collect();
    if parts.is_empty() {
        return Err(invalid("names the workspace itself, not a file"));
    }
    if parts.len() > MAX_DEPTH || parts.iter().any(|c| c.len() > 255) {
        return Err(invalid("too deep (32 components) or a name over 255 bytes"));
    }
    Ok(parts)
}

fn denied(path: &str, why: &str) -> Failure {
    Failure::new(FailureKind::Denied, format!("path {path:?}: {why}"))
        .with_fix("give a relative path inside the workspace")
}

fn io_failure(path: &str, errno: Errno) -> Failure {
    match errno {
        Errno::NOENT => Failure::new(FailureKind::NotFound, format!("{path}: no such file")),
        Errno::LOOP => denied(path, "a symbolic link is never followed").with_reason("symlink"),
        Errno::NOTDIR => Failure::new(
            FailureKind::Invalid,
            format!("{path}: a component is not a directory"),
        ),
        other => Failure::new(FailureKind::SandboxError, format!("{path}: {other}")),
    }
}

impl Workspace {
    /// Opens a workspace directory; files created later get `owner`.
    pub fn open(dir: &Path, owner: Option<(u32, u32)>) -> std::io::Result<Workspace> {
        let root = rustix::fs::open(
            dir,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        )?;
        Ok(Workspace { root, owner })
    }

    /// Reads a regular file of at most `max` bytes.
    pub fn read(&self, path: &str, max: u64) -> Result<Vec<u8>, Failure> {
        let parts = components(path)?;
        let (name, dirs) = parts.split_last().expect("components are never empty");
        let parent = self.walk(path, dirs, false)?;
        let flags = OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC;
        let fd = rustix::fs::openat(&parent, *name, flags, Mode::empty())
            .map_err(|e| io_failure(path, e))?;
        let mut file = File::from(fd);
        let meta = file
            .metadata()
            .map_err(|e| Failure::new(FailureKind::SandboxError, format!("{path}: {e}")))?;
        if !meta.is_file() {
            return Err(
                denied(path, "only regular files are read").with_reason("not_a_regular_file")
            );
        }
        if meta.nlink() != 1 {
            return Err(
                denied(path, "a file with several hard links may be a host file")
                    .with_reason("hardlink"),
            );
        }
        if meta.len() > max {
            return Err(too_large(path, meta.len(), max));
        }
        let mut data = Vec::new();
        // Bounded even if the file grows after the check.
        (&mut file)
            .take(max + 1)
            .read_to_end(&mut data)
            .map_err(|e| Failure::new(FailureKind::SandboxError, format!("{path}: {e}")))?;
        if data.len() as u64 > max {
            return Err(too_large(path, data.len() as u64, max));
        }
        Ok(data)
    }

    /// Creates or replaces a file, creating missing parent directories.
    pub fn write(&self, path: &str, data: &[u8], max: u64) -> Result<u64, Failure> {
        if data.len() as u64 > max {
            return Err(too_large(path, data.len() as u64, max));
        }
        let parts = components(path)?;
        let (name, dirs) = parts.split_last().expect("components are never empty");
        let parent = self.walk(path, dirs, true)?;
        let temp = format!(".airlock-upload-{}", crate::local::random_hex(8));
        if let Err(errno) = self.store(&parent, &temp, name, data) {
            let _ = rustix::fs::unlinkat(&parent, &temp, AtFlags::empty());
            return Err(io_failure(path, errno));
        }
        Ok(data.len() as u64)
    }

    /// Writes `data` to a fresh temporary file, then renames it over `name`.
    fn store(&self, parent: &OwnedFd, temp: &str, name: &str, data: &[u8]) -> Result<(), Errno> {
        let flags = OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW;
        let fd = rustix::fs::openat(parent, temp, flags | OFlags::CLOEXEC, file_mode())?;
        let mut file = File::from(fd);
        file.write_all(data)
            .and_then(|()| self.give_to_owner(&file))
            .map_err(errno_of)?;
        rustix::fs::renameat(parent, temp, parent, name)
    }

    /// Opens each directory of `dirs` below the root without following symlinks, creating
    /// missing ones when asked.
    fn walk(&self, path: &str, dirs: &[&str], create: bool) -> Result<OwnedFd, Failure> {
        let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
        let mut current = rustix::io::dup(&self.root).map_err(|e| io_failure(path, e))?;
        for dir in dirs {
            let opened = match rustix::fs::openat(&current, *dir, flags, Mode::empty()) {
                Err(Errno::NOENT) if create => self.make_dir(&current, dir, flags),
                // O_NOFOLLOW with O_DIRECTORY says ENOTDIR for a symlink: name it as one.
                Err(Errno::NOTDIR) if is_symlink(&current, dir) => Err(Errno::LOOP),
                other => other,
            };
            current = opened.map_err(|e| io_failure(path, e))?;
        }
        Ok(current)
    }

    fn make_dir(&self, parent: &OwnedFd, name: &str, flags: OFlags) -> rustix::io::Result<OwnedFd> {
        match rustix::fs::mkdirat(parent, name, Mode::from_raw_mode(0o755)) {
            Ok(()) | Err(Errno::EXIST) => {}
            Err(e) => return Err(e),
        }
        let dir = rustix::fs::openat(parent, name, flags, Mode::empty())?;
        let as_file = File::from(dir);
        self.give_to_owner(&as_file).map_err(errno_of)?;
        Ok(OwnedFd::from(as_file))
    }

    fn give_to_owner(&self, file: &File) -> std::io::Result<()> {
        match self.owner {
            Some((uid, gid)) => std::os::unix::fs::fchown(file, Some(uid), Some(gid)),
            None => Ok(()),
        }
    }
}

fn is_symlink(parent: &OwnedFd, name: &str) -> bool {
    rustix::fs::statat(parent, name, AtFlags::SYMLINK_NOFOLLOW).is_ok_and(|st| {
        rustix::fs::FileType::from_raw_mode(st.st_mode) == rustix::fs::FileType::Symlink
    })
}

fn file_mode() -> Mode {
    Mode::from_raw_mode(0o644)
}

fn too_large(path: &str, size: u64, max: u64) -> Failure {
    Failure::new(
        FailureKind::Invalid,
        format!("{path}: {size} bytes is over the {max}-byte file cap"),
    )
    .with_fix("split the data or ask the operator for a larger --max-file-bytes")
}

fn errno_of(error: std::io::Error) -> Errno {
    Errno::from_io_error(&error).unwrap_or(Errno::IO)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn workspace() -> (tempfile::TempDir, Workspace) {
        let dir = tempfile::tempdir().unwrap();
        let workspace = Workspace::open(dir.path(), None).unwrap();
        (dir, workspace)
    }

    fn host_canary() -> (tempfile::TempDir, std::path::PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let canary = dir.path().join("secret");
        std::fs::write(&canary, "host secret").unwrap();
        (dir, canary)
    }

    #[test]
    fn paths_out_of_the_workspace_are_denied() {
        for path in ["../x", "a/../../x", "/etc/passwd"] {
            let failure = components(path).unwrap_err();
            assert_eq!(failure.kind, FailureKind::Denied, "{path}");
        }
        assert_eq!(components("./a//b/").unwrap(), ["a", "b"]);
        assert_eq!(components("").unwrap_err().kind, FailureKind::Invalid);
        assert_eq!(components(".").unwrap_err().kind, FailureKind::Invalid);
    }

    #[test]
    fn files_round_trip_and_parents_are_created() {
        let (_dir, ws) = workspace();
        assert_eq!(ws.write("a/b/c.txt", b"data", 100).unwrap(), 4);
        assert_eq!(ws.read("a/b/c.txt", 100).unwrap(), b"data");
        ws.write("a/b/c.txt", b"new", 100).unwrap();
        assert_eq!(ws.read("a/b/c.txt", 100).unwrap(), b"new");
        assert_eq!(
            ws.read("missing", 100).unwrap_err().kind,
            FailureKind::NotFound
        );
        assert_eq!(
            ws.write("big", &[0; 101], 100).unwrap_err().kind,
            FailureKind::Invalid
        );
    }

    #[test]
    fn a_planted_symlink_is_never_followed() {
        let (dir, ws) = workspace();
        let (_host, canary) = host_canary();
        std::os::unix::fs::symlink(&canary, dir.path().join("report.json")).unwrap();
        std::os::unix::fs::symlink(canary.parent().unwrap(), dir.path().join("out")).unwrap();
        let read = ws.read("report.json", 100).unwrap_err();
        assert_eq!(
            (read.kind, read.reason.as_str()),
            (FailureKind::Denied, "symlink")
        );
        assert_eq!(
            ws.read("out/secret", 100).unwrap_err().kind,
            FailureKind::Denied
        );
        assert_eq!(
            ws.write("out/secret", b"x", 100).unwrap_err().kind,
            FailureKind::Denied
        );
        // Writing over the symlink replaces the link, never the host file.
        ws.write("report.json", b"mine", 100).unwrap();
        assert_eq!(std::fs::read_to_string(&canary).unwrap(), "host secret");
        assert_eq!(ws.read("report.json", 100).unwrap(), b"mine");
    }

    #[test]
    fn a_hardlinked_file_is_not_read() {
        let (dir, ws) = workspace();
        let canary = dir.path().join("original");
        std::fs::write(&canary, "host secret").unwrap();
        std::fs::hard_link(&canary, dir.path().join("link")).unwrap();
        let failure = ws.read("link", 100).unwrap_err();
        assert_eq!(failure.reason, "hardlink");
        ws.write("link", b"mine", 100).unwrap();
        assert_eq!(std::fs::read_to_string(&canary).unwrap(), "host secret");
    }

    #[test]
    fn a_fifo_is_not_opened_for_reading() {
        let (dir, ws) = workspace();
        let fifo = dir.path().join("pipe");
        rustix::fs::mknodat(
            rustix::fs::CWD,
            &fifo,
            rustix::fs::FileType::Fifo,
            Mode::from_raw_mode(0o644),
            0,
        )
        .unwrap();
        assert_eq!(
            ws.read("pipe", 100).unwrap_err().reason,
            "not_a_regular_file"
        );
    }
}
