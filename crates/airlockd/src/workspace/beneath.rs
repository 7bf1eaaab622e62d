//! File operations relative to a workspace's root descriptor that never leave it: `openat2`
//! beneath the root with no link followed, bounded and re-checked reads, writes renamed into
//! place (see the module above for why each step is there).

use std::io::{Read, Write};
use std::os::fd::{AsFd, OwnedFd};

use airlock::beneath::Mounts;
use rustix::fs::{Mode, OFlags};
use rustix::io::Errno;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::path::{FileError, SafePath};
use super::random_u64;

/// Resolution that never leaves `root`, follows no link and crosses no mount.
fn beneath(dir: impl AsFd, path: &str, flags: OFlags) -> Result<OwnedFd, Errno> {
    airlock::beneath::open_beneath(dir, std::path::Path::new(path), flags, Mounts::Stay)
}

pub(super) fn open_beneath(
    root: &OwnedFd,
    path: &SafePath,
    flags: OFlags,
) -> Result<OwnedFd, FileError> {
    let text = path.display();
    beneath(root, text.as_str(), flags).map_err(|e| resolve_error(&text, e))
}

fn resolve_error(path: &str, e: Errno) -> FileError {
    match e {
        Errno::NOENT => FileError::NotFound { path: path.into() },
        Errno::XDEV | Errno::LOOP | Errno::NOTDIR => FileError::Escapes { path: path.into() },
        other => io_error(path, other),
    }
}

pub(super) fn io_error(path: &str, e: impl std::fmt::Display) -> FileError {
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

pub(super) fn entry_kind(mode: u32) -> EntryKind {
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

pub(super) fn read_file_beneath(
    root: &OwnedFd,
    path: &SafePath,
    max: u64,
) -> Result<Vec<u8>, FileError> {
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

pub(super) fn list_beneath(root: &OwnedFd, path: &SafePath) -> Result<Vec<DirEntry>, FileError> {
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
        let flags = OFlags::RDONLY | OFlags::DIRECTORY;
        let opened = beneath(&dir, name.as_str(), flags);
        dir = match opened {
            Ok(fd) => fd,
            Err(Errno::NOENT) => {
                match rustix::fs::mkdirat(&dir, name.as_str(), Mode::from_raw_mode(0o755)) {
                    Ok(()) | Err(Errno::EXIST) => {}
                    Err(Errno::NOSPC) | Err(Errno::DQUOT) => return Err(FileError::Full),
                    Err(e) => return Err(io_error(&so_far, e)),
                }
                let fd =
                    beneath(&dir, name.as_str(), flags).map_err(|e| resolve_error(&so_far, e))?;
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

pub(super) fn write_file_beneath(
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

pub(super) fn remove_beneath(root: &OwnedFd, path: &SafePath) -> Result<(), FileError> {
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
