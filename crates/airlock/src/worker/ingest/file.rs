//! One file of a worker's `out/`: reopened only if it is still the inode that was pinned,
//! copied up to a limit, and named safely in reports.

use std::ffi::CStr;
use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::OwnedFd;

use rustix::fs::{fstat, openat, FileType, Mode, OFlags, Stat};
use rustix::io::Errno;

use super::SkipReason;

/// Opens `name` for reading and checks it is still the regular file that was pinned.
pub(super) fn open_pinned_file(
    source: &OwnedFd,
    name: &CStr,
    pinned: &Stat,
) -> Result<File, (SkipReason, io::Error)> {
    // NONBLOCK: if the name now leads to a FIFO, opening it must not wait for a writer.
    let flags =
        OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::NOCTTY | OFlags::CLOEXEC;
    let fd = openat(source, name, flags, Mode::empty()).map_err(|err| {
        let reason = match err {
            Errno::ACCESS | Errno::PERM => SkipReason::Unreadable,
            _ => SkipReason::ChangedDuringCopy,
        };
        (reason, io::Error::from(err))
    })?;
    let opened = fstat(&fd).map_err(|err| (SkipReason::Unreadable, err.into()))?;
    if !same_version(pinned, &opened) {
        let detail = io::Error::other("replaced or modified after it was examined");
        return Err((SkipReason::ChangedDuringCopy, detail));
    }
    Ok(File::from(fd))
}

/// Same inode, still a single-link regular file, same size and timestamps.
pub(super) fn same_version(a: &Stat, b: &Stat) -> bool {
    FileType::from_raw_mode(b.st_mode) == FileType::RegularFile
        && b.st_nlink == 1
        && (a.st_dev, a.st_ino, a.st_size) == (b.st_dev, b.st_ino, b.st_size)
        && (a.st_mtime, a.st_mtime_nsec) == (b.st_mtime, b.st_mtime_nsec)
        && (a.st_ctime, a.st_ctime_nsec) == (b.st_ctime, b.st_ctime_nsec)
}

/// Copies up to `limit` bytes. The outer error is a write failure (the host's problem, fatal);
/// the inner one a read failure (the sandbox's file, skipped).
pub(super) fn copy_at_most(
    source: &mut File,
    dest: &mut File,
    limit: u64,
) -> io::Result<Result<u64, io::Error>> {
    let mut buffer = vec![0u8; 64 * 1024];
    let mut copied = 0u64;
    while copied < limit {
        let want =
            usize::try_from(limit - copied).map_or(buffer.len(), |left| left.min(buffer.len()));
        let read = match source.read(&mut buffer[..want]) {
            Ok(0) => break,
            Ok(read) => read,
            Err(err) if err.kind() == io::ErrorKind::Interrupted => continue,
            Err(err) => return Ok(Err(err)),
        };
        dest.write_all(&buffer[..read])?;
        copied += read as u64;
    }
    Ok(Ok(copied))
}

pub(super) fn display_name(name: &CStr) -> String {
    String::from_utf8_lossy(name.to_bytes())
        .chars()
        .map(|c| {
            if c.is_control() {
                c.escape_unicode().to_string()
            } else {
                c.to_string()
            }
        })
        .collect()
}

pub(super) fn join(prefix: &str, name: &str) -> String {
    if prefix.is_empty() {
        name.to_owned()
    } else {
        format!("{prefix}/{name}")
    }
}

pub(super) fn display_or_root(prefix: &str) -> String {
    if prefix.is_empty() {
        ".".to_owned()
    } else {
        prefix.to_owned()
    }
}
