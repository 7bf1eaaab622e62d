//! Removing a run directory (the init after the run, a wrapped tool's guard, the sweep).

use std::os::unix::fs::PermissionsExt;
use std::path::Path;

/// Removes the run directory, or, when the caller keeps the run's own workdir (`kept_workdir`),
/// everything in it but that workdir and the keep marker. Returns a warning when the directory
/// could not be removed.
pub fn remove(run_dir: &Path, kept_workdir: Option<&Path>) -> Option<String> {
    let Some(workdir) = kept_workdir else {
        remove_tree(run_dir);
        return run_dir
            .exists()
            .then(|| format!("cannot remove the run directory {}", run_dir.display()));
    };
    let marker = super::kept_marker(run_dir);
    let entries = std::fs::read_dir(run_dir).into_iter().flatten().flatten();
    for entry in entries.map(|e| e.path()) {
        if entry != workdir && entry != marker {
            remove_tree(&entry);
        }
    }
    None
}

/// Removes a directory tree the sandbox wrote into, even where it removed its own permissions.
pub fn remove_tree(path: &Path) {
    if std::fs::remove_dir_all(path).is_ok() || !path.exists() {
        return;
    }
    grant_owner_access(path, 0);
    let _ = std::fs::remove_dir_all(path);
}

fn grant_owner_access(path: &Path, depth: u32) {
    let Ok(meta) = std::fs::symlink_metadata(path) else {
        return;
    };
    if !meta.is_dir() || depth > 64 {
        return;
    }
    let _ = std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o700));
    for entry in std::fs::read_dir(path).into_iter().flatten().flatten() {
        grant_owner_access(&entry.path(), depth + 1);
    }
}
