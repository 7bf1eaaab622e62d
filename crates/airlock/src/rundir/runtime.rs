//! Where per-run directories live, and unique run ids.

use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use crate::error::Error;

/// The runtime directory: `/run/airlock` for root, `$XDG_RUNTIME_DIR/airlock` or
/// `/tmp/airlock-<uid>` otherwise. Created 0711 and checked to be ours and not a symlink, so
/// another user cannot pre-create it to watch or redirect our runs.
pub fn runtime_dir(configured: Option<&Path>) -> Result<PathBuf, Error> {
    let dir = match configured {
        Some(dir) => dir.to_path_buf(),
        None => default_runtime_dir(),
    };
    if !dir.exists() {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o711)
            .create(&dir)
            .map_err(|e| {
                Error::io(
                    format!("cannot create the runtime directory {}", dir.display()),
                    e,
                )
            })?;
        let _ = std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o711));
    }
    let meta = std::fs::symlink_metadata(&dir)
        .map_err(|e| Error::io(format!("cannot inspect {}", dir.display()), e))?;
    let uid = nix::unistd::geteuid().as_raw();
    if !meta.is_dir() || meta.uid() != uid || meta.mode() & 0o022 != 0 {
        return Err(Error::BadPath {
            what: "runtime directory",
            path: dir,
            reason: format!("must be a directory owned by uid {uid} and not group/world-writable; remove it or set another runtime dir"),
        });
    }
    Ok(dir)
}

/// The runtime directory without creating it, for plans that must leave no trace: the
/// configured or default path, checked like [`runtime_dir`] when it exists.
pub fn existing_runtime_dir(configured: Option<&Path>) -> Result<PathBuf, Error> {
    let dir = configured
        .map(Path::to_path_buf)
        .unwrap_or_else(default_runtime_dir);
    if dir.exists() {
        return runtime_dir(Some(&dir));
    }
    Ok(dir)
}

/// Where [`runtime_dir`] puts run directories when none is configured (not created here).
pub fn default_runtime_dir() -> PathBuf {
    let uid = nix::unistd::geteuid();
    if uid.is_root() {
        return PathBuf::from("/run/airlock");
    }
    match std::env::var_os("XDG_RUNTIME_DIR") {
        Some(xdg) if Path::new(&xdg).is_dir() => Path::new(&xdg).join("airlock"),
        _ => PathBuf::from(format!("/tmp/airlock-{uid}")),
    }
}

/// A run id unique across processes and time: pid, clock and a counter.
pub fn new_run_id() -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    let count = COUNTER.fetch_add(1, Ordering::Relaxed);
    format!(
        "run-{}-{:x}-{count}",
        std::process::id(),
        nanos & 0xffff_ffff_ffff
    )
}
