//! Where each mount's source is on the host, found before the first pivot (an absolute host
//! symlink would resolve against the staging root after it).

use std::fs;
use std::io;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};

use super::by_fd;
use super::execute::io_error;
use super::plan::MountOp;
use super::RootfsError;
use crate::confine::found::Found;

/// A host path as found before the first pivot.
pub(super) enum HostEntry {
    Absent,
    /// A directory or file protect_git found, opened again below its root and checked.
    Found(OwnedFd, Found),
    Symlink(PathBuf),
    /// Symlink-free path, and whether it is a directory.
    Real(PathBuf, bool),
}

pub(super) fn resolve_source(
    op: &MountOp,
    found: &[Found],
) -> Result<Option<HostEntry>, RootfsError> {
    match op {
        MountOp::MirrorReadOnly { path } => resolve_optional(path).map(Some),
        MountOp::Bind { path, .. } => match found.iter().find(|f| f.path == *path) {
            Some(found) => by_fd::reopen(found).map(Some),
            None => resolve_real(path).map(Some),
        },
        _ => Ok(None),
    }
}

fn resolve_optional(path: &Path) -> Result<HostEntry, RootfsError> {
    match fs::symlink_metadata(path) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(HostEntry::Absent),
        Err(e) => Err(io_error("inspect", path, e)),
        Ok(meta) if meta.file_type().is_symlink() => fs::read_link(path)
            .map(HostEntry::Symlink)
            .map_err(|e| io_error("read the symlink", path, e)),
        Ok(_) => resolve_real(path),
    }
}

pub(super) fn resolve_real(path: &Path) -> Result<HostEntry, RootfsError> {
    let real = fs::canonicalize(path).map_err(|e| io_error("resolve", path, e))?;
    let is_dir = real.is_dir();
    Ok(HostEntry::Real(real, is_dir))
}
