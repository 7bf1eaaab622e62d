//! Where each mount's source is on the host, found before the first pivot (an absolute host
//! symlink would resolve against the staging root after it).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fs;
use std::io;
use std::os::fd::OwnedFd;
use std::path::{Component, Path, PathBuf};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, SystemTime};

use nix::fcntl::OFlag;

use super::by_fd;
use super::execute::io_error;
use super::plan::MountOp;
use super::RootfsError;
use crate::confine::found::Found;

/// The `python3*` entries of the host's `etc`, sorted, read again only when `etc` changed: a
/// pool plans many sandboxes a second, and reading `/etc` (a hashed directory of a few
/// hundred entries) for each was ~0.6 % of a refilling pool's CPU. A directory's modification
/// time changes with every entry made, removed or renamed in it; a listing is kept only when
/// that time was already a second old before the listing was read, so that a change made
/// during the read cannot carry the same (coarse) time.
pub(super) fn python_etc_entries(etc: &Path) -> Vec<PathBuf> {
    // By directory: `/etc` alone outside the tests.
    static KEPT: Mutex<BTreeMap<PathBuf, (SystemTime, Vec<PathBuf>)>> = Mutex::new(BTreeMap::new());
    let checked = SystemTime::now();
    let Ok(modified) = fs::metadata(etc).and_then(|meta| meta.modified()) else {
        return Vec::new();
    };
    let mut kept = KEPT.lock().unwrap_or_else(PoisonError::into_inner);
    if let Some((at, entries)) = kept.get(etc) {
        if *at == modified {
            return entries.clone();
        }
    }
    // nix's directory iterator lends each entry's name: only the few `python3*` ones are
    // copied (copying and converting all ~150 first cost ~70,000 instructions, callgrind).
    // A cold `airlock run` is a process of its own and always gets here once.
    let flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC;
    let Ok(mut listing) = nix::dir::Dir::open(etc, flags, nix::sys::stat::Mode::empty()) else {
        return Vec::new();
    };
    let names: BTreeSet<String> = listing
        .iter()
        .filter_map(|entry| entry.ok())
        .filter(|entry| entry.file_name().to_bytes().starts_with(b"python3"))
        .map(|entry| entry.file_name().to_string_lossy().into_owned())
        .collect();
    let entries: Vec<PathBuf> = names.into_iter().map(|name| etc.join(name)).collect();
    let settled = checked
        .duration_since(modified)
        .is_ok_and(|age| age >= Duration::from_secs(1));
    match settled {
        true => kept.insert(etc.to_path_buf(), (modified, entries.clone())),
        false => kept.remove(etc),
    };
    entries
}

/// A host path as found before the first pivot.
pub(super) enum HostEntry {
    Absent,
    /// A directory or file protect_git found, opened again below its root and checked.
    Found(OwnedFd, Found),
    Symlink(PathBuf),
    /// Symlink-free path, and whether it is a directory.
    Real(PathBuf, bool),
}

/// Resolves each bind source once, before the first pivot. A source's directory is resolved
/// once for all its entries (the twenty `/etc` files share one): the symlink-free form of a
/// path whose last component is no symlink is its directory's symlink-free form joined with
/// that name, so one `lstat` per entry answers what `realpath` (a `readlink` per component)
/// and a `stat` answered before.
#[derive(Default)]
pub(super) struct Resolver {
    dirs: HashMap<PathBuf, PathBuf>,
}

impl Resolver {
    pub(super) fn resolve_source(
        &mut self,
        op: &MountOp,
        found: &[Found],
    ) -> Result<Option<HostEntry>, RootfsError> {
        match op {
            MountOp::MirrorReadOnly { path } => self.resolve_optional(path).map(Some),
            MountOp::Bind { path, .. } => match found.iter().find(|f| f.path == *path) {
                Some(found) => by_fd::reopen(found).map(Some),
                None => self.resolve_real(path).map(Some),
            },
            _ => Ok(None),
        }
    }

    fn resolve_optional(&mut self, path: &Path) -> Result<HostEntry, RootfsError> {
        match fs::symlink_metadata(path) {
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(HostEntry::Absent),
            Err(e) => Err(io_error("inspect", path, e)),
            Ok(meta) if meta.file_type().is_symlink() => fs::read_link(path)
                .map(HostEntry::Symlink)
                .map_err(|e| io_error("read the symlink", path, e)),
            Ok(meta) => self.real_entry(path, meta.is_dir()),
        }
    }

    pub(super) fn resolve_real(&mut self, path: &Path) -> Result<HostEntry, RootfsError> {
        match fs::symlink_metadata(path) {
            Ok(meta) if !meta.file_type().is_symlink() => self.real_entry(path, meta.is_dir()),
            // A symlink (or an error, which `canonicalize` reports with its own words).
            _ => resolve_fully(path),
        }
    }

    /// `path`, which is no symlink itself, with its directory resolved (once per directory).
    fn real_entry(&mut self, path: &Path, is_dir: bool) -> Result<HostEntry, RootfsError> {
        let (Some(dir), Some(Component::Normal(name))) =
            (path.parent(), path.components().next_back())
        else {
            return resolve_fully(path);
        };
        let real_dir = match self.dirs.get(dir) {
            Some(real) => real.clone(),
            None => {
                let real = fs::canonicalize(dir).map_err(|e| io_error("resolve", path, e))?;
                self.dirs.insert(dir.to_path_buf(), real.clone());
                real
            }
        };
        Ok(HostEntry::Real(real_dir.join(name), is_dir))
    }
}

fn resolve_fully(path: &Path) -> Result<HostEntry, RootfsError> {
    let real = fs::canonicalize(path).map_err(|e| io_error("resolve", path, e))?;
    let is_dir = real.is_dir();
    Ok(HostEntry::Real(real, is_dir))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn real(entry: HostEntry) -> (PathBuf, bool) {
        match entry {
            HostEntry::Real(path, is_dir) => (path, is_dir),
            _ => panic!("expected a resolved host path"),
        }
    }

    /// The once-per-directory shortcut gives what `realpath` gives: through a symlinked
    /// directory, for files and directories, and a symlink named last is still followed.
    #[test]
    fn resolution_matches_realpath_through_symlinked_directories() {
        let dir = tempfile::tempdir().unwrap();
        let root = fs::canonicalize(dir.path()).unwrap();
        fs::create_dir_all(root.join("real/sub")).unwrap();
        fs::write(root.join("real/file"), "x").unwrap();
        std::os::unix::fs::symlink(root.join("real"), root.join("link")).unwrap();
        std::os::unix::fs::symlink("file", root.join("real/last")).unwrap();
        let mut resolver = Resolver::default();
        for (name, is_dir) in [
            ("link/file", false),
            ("link/sub", true),
            ("link/last", false),
            ("link", true),
        ] {
            let path = root.join(name);
            let expected = fs::canonicalize(&path).unwrap();
            assert_eq!(
                real(resolver.resolve_real(&path).unwrap()),
                (expected, is_dir),
                "{name}"
            );
        }
        let missing = resolver
            .resolve_optional(&root.join("link/absent"))
            .unwrap();
        assert!(matches!(missing, HostEntry::Absent));
        let named = resolver.resolve_optional(&root.join("link/last")).unwrap();
        assert!(matches!(named, HostEntry::Symlink(target) if target == Path::new("file")));
    }
}
