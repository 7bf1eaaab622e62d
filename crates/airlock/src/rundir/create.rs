//! Creating a run directory and the files a wrapping tool reads in it (the init's side).

use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::confine::Credentials;

/// What creating a run directory failed at. Each message names the path.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RunDirError {
    #[error("cannot create {}: {source}", path.display())]
    Create {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("chmod {}: {source}", path.display())]
    Chmod {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot hand {} to uid {uid}: {source}", path.display())]
    Chown {
        path: PathBuf,
        uid: u32,
        source: nix::errno::Errno,
    },
    #[error("cannot write {}: {source}", path.display())]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{what} {} is outside the run directory", path.display())]
    Outside { what: &'static str, path: PathBuf },
}

/// A run directory to create.
#[derive(Debug, Clone, Copy)]
pub struct NewRunDir<'a> {
    pub run_dir: &'a Path,
    /// The workdir to create in it; `None` when the program works in the caller's directory.
    pub fresh_workdir: Option<&'a Path>,
    /// The sandbox user, owner of the program's directories (`None`: the init's own ids).
    pub owner: Option<Credentials>,
    /// The caller keeps the fresh workdir: mark the directory so the sweep leaves it.
    pub keep_workdir: bool,
}

impl NewRunDir<'_> {
    /// Creates the run directory, the workdir and `tmp`, and the keep marker.
    pub fn create(&self) -> Result<(), RunDirError> {
        // 0711: the sandbox user may traverse to its own directories but not list the run dir.
        make_dir(self.run_dir, 0o711, None)?;
        if let Some(workdir) = self.fresh_workdir {
            make_dir(workdir, 0o700, self.owner)?;
        }
        if self.keep_workdir && self.fresh_workdir.is_some() {
            let marker = super::kept_marker(self.run_dir);
            std::fs::write(&marker, "").map_err(|source| RunDirError::Create {
                path: marker,
                source,
            })?;
        }
        make_dir(&super::tmp_dir(self.run_dir), 0o700, self.owner)
    }

    /// Creates one more directory of the program's in it (0700, the sandbox user's).
    pub fn create_dir(&self, path: &Path) -> Result<(), RunDirError> {
        self.check_inside(path, "directory")?;
        make_dir(path, 0o700, self.owner)
    }

    /// Refuses a path the init would create outside the run directory.
    pub fn check_inside(&self, path: &Path, what: &'static str) -> Result<(), RunDirError> {
        if super::is_inside(self.run_dir, path) {
            return Ok(());
        }
        Err(RunDirError::Outside {
            what,
            path: path.to_path_buf(),
        })
    }
}

/// A file in the run directory that a wrapping tool reads (an OCI bundle's config.json, bwrap's
/// /etc files); a path ending in `/` is a directory.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct RunFile {
    pub path: PathBuf,
    pub contents: Vec<u8>,
    pub mode: u32,
}

/// Writes one file (or, for a path ending in `/`, makes one directory) with its mode, making
/// its parent directories; the caller checks where it goes.
pub fn write_file(file: &RunFile) -> Result<(), RunDirError> {
    let path = &file.path;
    let make_dirs = |dir: &Path| {
        std::fs::create_dir_all(dir).map_err(|source| RunDirError::Create {
            path: dir.to_path_buf(),
            source,
        })
    };
    if path.as_os_str().as_encoded_bytes().ends_with(b"/") {
        make_dirs(path)?;
        return chmod(path, file.mode);
    }
    // The parent is made only when the write finds it missing: a wrapper's files share one
    // directory, and making it before each one cost a `mkdir` and a `statx` per file.
    let written = match std::fs::write(path, &file.contents) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            path.parent().map(make_dirs).transpose()?;
            std::fs::write(path, &file.contents)
        }
        other => other,
    };
    written.map_err(|source| RunDirError::Write {
        path: path.clone(),
        source,
    })?;
    chmod(path, file.mode)
}

fn make_dir(path: &Path, mode: u32, owner: Option<Credentials>) -> Result<(), RunDirError> {
    std::fs::DirBuilder::new()
        .mode(mode)
        .create(path)
        .map_err(|source| RunDirError::Create {
            path: path.to_path_buf(),
            source,
        })?;
    chmod(path, mode)?;
    if let Some(owner) = owner {
        nix::unistd::chown(path, Some(owner.uid.into()), Some(owner.gid.into())).map_err(
            |source| RunDirError::Chown {
                path: path.to_path_buf(),
                uid: owner.uid,
                source,
            },
        )?;
    }
    Ok(())
}

fn chmod(path: &Path, mode: u32) -> Result<(), RunDirError> {
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).map_err(|source| {
        RunDirError::Chmod {
            path: path.to_path_buf(),
            source,
        }
    })
}
