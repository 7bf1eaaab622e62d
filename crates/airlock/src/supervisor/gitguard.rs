//! Git metadata in the caller's writable directories, kept read-only (`filesystem.protect_git`).
//!
//! git runs code its repository names: hooks, and in `config` `core.fsmonitor`,
//! `core.hooksPath`, `core.sshCommand`, filter and diff drivers; a `commondir` file or a
//! `gitdir:` file moves all of that elsewhere, and a submodule registered in the index makes
//! `git status` run git inside another repository. A program that writes any of it gets code
//! run on the host at the user's next `git status`. Protecting only hooks and config would
//! leave `commondir`, `config.worktree`, `modules/*/config` and the index (a planted gitlink)
//! open, so the whole `.git` is read-only. A bind mount also pins its name: `mv .git .git2`
//! and `rm -r .git` fail with EBUSY, so no new `.git` can take its place. A nested repository
//! could still be moved away with its parent (`mv sub sub2 && mkdir -p sub/.git`: for a
//! submodule, the host's `git status` then runs git in the planted one), so every directory
//! between a writable path and a nested `.git` is pinned too: bound onto itself, writable,
//! which only makes renaming or removing it fail.
//!
//! Decided here, on the host, for every backend: a bounded walk of each writable caller path
//! finds every `.git` (directory or `gitdir:` file), every directory shaped like a bare
//! repository and, for a `gitdir:` file, the git directory it points to when that lies in a
//! writable path too. Every backend binds the list read-only over its writable mounts. When
//! the walk hits its bound the run is refused: a nested repository left writable would be a
//! silent hole. A repository the program creates where none was cannot be refused by a mount
//! (it needs a file on the host), so [`PlantWatch`] looks again after the run and moves each
//! new one out of git's way.

use std::fs;
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

use super::prepare::Workdir;
use crate::confine::found::Found;
use crate::error::Error;
use crate::layer::Layer;
use crate::linux::beneath::{open_beneath, open_dir_path, Mounts};
use crate::policy::{GitProtection, Policy};

/// Directories below a writable path the walk looks into (the path itself is depth 0).
pub const MAX_DEPTH: usize = 12;
/// Directory entries the walk reads over all writable paths of a run.
pub const MAX_ENTRIES: usize = 200_000;

/// The caller's writable directories: the workdir given (unless read-only) and `read_write`.
pub(super) fn writable_roots(policy: &Policy, workdir: &Workdir) -> Vec<PathBuf> {
    let fs = &policy.filesystem;
    let workdir = (!workdir.fresh && !fs.workdir_read_only).then(|| workdir.path.clone());
    workdir
        .into_iter()
        .chain(fs.read_write.iter().cloned())
        .collect()
}

/// What the backends bind over the caller's writable paths.
#[derive(Debug, Default, PartialEq)]
pub(super) struct GitMounts {
    /// Git metadata, bound read-only; parents before children.
    pub read_only: Vec<PathBuf>,
    /// The directories between a writable path and a nested git directory, bound onto
    /// themselves writable so that they cannot be renamed or removed; parents first.
    pub pinned: Vec<PathBuf>,
    /// Which object each of the above is, opened below its writable root with no symlink
    /// followed: the backends bind that object, never whatever the path names later.
    pub found: Vec<Found>,
}

/// The mounts that protect the git metadata; none when the policy says `off`.
pub(super) fn protected_paths(policy: &Policy, workdir: &Workdir) -> Result<GitMounts, Error> {
    if policy.filesystem.protect_git == GitProtection::Off {
        return Ok(GitMounts::default());
    }
    let roots = writable_roots(policy, workdir);
    let walk = Walk::of(&roots)?;
    if let Some(path) = walk.unpinnable.first() {
        return Err(unprotectable(
            path,
            "it is a symlink or special file, which a read-only bind cannot pin".into(),
        ));
    }
    let read_only = parents_first(walk.markers.into_iter().chain(walk.targets).collect());
    let pinned = ancestors_below_roots(&read_only, &roots);
    let found = identify(read_only.iter().chain(&pinned), &roots)?;
    Ok(GitMounts {
        read_only,
        pinned,
        found,
    })
}

/// Each path opened below the writable root that holds it, never through a symlink: another
/// program sharing the workspace may have swapped a directory on the way since the walk.
fn identify<'a>(
    paths: impl Iterator<Item = &'a PathBuf>,
    roots: &[PathBuf],
) -> Result<Vec<Found>, Error> {
    let mut opened: Vec<(&PathBuf, OwnedFd)> = Vec::new();
    let mut found = Vec::new();
    for path in paths {
        let Some(root) = roots.iter().find(|root| path.starts_with(root)) else {
            continue;
        };
        if !opened.iter().any(|(r, _)| *r == root) {
            let fd = open_root(root).map_err(|e| unprotectable(root, format!("{e}")))?;
            opened.push((root, fd));
        }
        let root_fd = &opened.iter().find(|(r, _)| *r == root).expect("opened").1;
        let (one, _) = Found::open(root_fd, root, path).map_err(|e| {
            unprotectable(
                path,
                format!("it changed while it was searched (a symlink on its way?): {e}"),
            )
        })?;
        found.push(one);
    }
    Ok(found)
}

/// Every directory strictly between a root and a protected path, parents first.
fn ancestors_below_roots(protected: &[PathBuf], roots: &[PathBuf]) -> Vec<PathBuf> {
    let mut pinned: Vec<PathBuf> = Vec::new();
    for path in protected {
        let Some(root) = roots.iter().find(|root| path.starts_with(root)) else {
            continue;
        };
        let below = path
            .ancestors()
            .skip(1)
            .take_while(|a| a.starts_with(root) && *a != root.as_path());
        pinned.extend(below.map(Path::to_path_buf));
    }
    let mut pinned = parents_first(pinned);
    // One inside a read-only git directory is pinned by it already, and a writable bind
    // there would undo the protection.
    pinned.retain(|p| !protected.iter().any(|git| p.starts_with(git)));
    pinned
}

/// Without duplicates, parents before children (mount order).
fn parents_first(mut paths: Vec<PathBuf>) -> Vec<PathBuf> {
    paths.sort();
    paths.dedup();
    paths.sort_by_key(|p| p.components().count());
    paths
}

struct Walk {
    /// The writable roots as given (the paths the sandbox sees) and symlink-free, to tell
    /// whether a `gitdir:` target is writable and where the sandbox sees it.
    roots: Vec<(PathBuf, PathBuf)>,
    entries: usize,
    /// What makes git treat a directory as a repository: every `.git` (directory or file)
    /// and every directory shaped like a bare repository (`HEAD`, `objects/`, `refs/`).
    markers: Vec<PathBuf>,
    /// The git directories `gitdir:` files point to, and their common directories.
    targets: Vec<PathBuf>,
    /// `.git` entries that are neither directories nor files (symlinks).
    unpinnable: Vec<PathBuf>,
}

impl Walk {
    fn of(roots: &[PathBuf]) -> Result<Walk, Error> {
        let mut walk = Walk {
            roots: roots
                .iter()
                .filter_map(|r| Some((r.clone(), fs::canonicalize(r).ok()?)))
                .collect(),
            entries: 0,
            markers: Vec::new(),
            targets: Vec::new(),
            unpinnable: Vec::new(),
        };
        for root in roots {
            walk.directory_tree(root)?;
        }
        Ok(walk)
    }

    /// Reads each directory through a descriptor opened below the root with no symlink
    /// followed (a directory swapped for a link meanwhile refuses the run), and tells kinds
    /// apart by the listing's `d_type`: no `stat` per entry, no path built for a file.
    fn directory_tree(&mut self, root: &Path) -> Result<(), Error> {
        use rustix::fs::{Mode, OFlags};
        let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC;
        let Ok(root_fd) = rustix::fs::open(root, flags, Mode::empty()) else {
            return Ok(());
        };
        let mut pending = vec![(root.to_path_buf(), 0usize)];
        while let Some((dir, depth)) = pending.pop() {
            let relative = dir.strip_prefix(root).unwrap_or(Path::new(""));
            let fd = open_beneath(
                &root_fd,
                relative,
                OFlags::RDONLY | OFlags::DIRECTORY,
                Mounts::Cross,
            )
            .map_err(|e| {
                unprotectable(
                    &dir,
                    format!("it changed while it was searched (a symlink on its way?): {e}"),
                )
            })?;
            let listing = self.read_dir(&dir, &fd)?;
            // git takes such a directory for a repository when it works in it.
            if listing.bare_shaped && is_bare_repository(&dir) {
                self.markers.push(dir);
                continue;
            }
            for (name, kind) in listing.children {
                let path = dir.join(name);
                match kind {
                    Kind::Git(git) => self.protect(&path, git),
                    Kind::Dir if depth + 1 > MAX_DEPTH => {
                        return Err(unprotectable(&path, format!(
                            "it lies more than {MAX_DEPTH} directories deep, where the search for nested repositories stops"
                        )));
                    }
                    Kind::Dir => pending.push((path, depth + 1)),
                }
            }
        }
        Ok(())
    }

    /// The `.git` entries and subdirectories of `dir`, and whether it has the names of a bare
    /// repository (checked by path then, following links as git does).
    fn read_dir(&mut self, dir: &Path, fd: &OwnedFd) -> Result<Listing, Error> {
        let failed = |e: rustix::io::Errno| unprotectable(dir, format!("{e}"));
        let mut reader = rustix::fs::Dir::read_from(fd).map_err(failed)?;
        let mut listing = Listing::default();
        let mut bare_names = 0;
        while let Some(entry) = reader.read() {
            let entry = entry.map_err(failed)?;
            let name = entry.file_name().to_bytes();
            if name == b"." || name == b".." {
                continue;
            }
            self.entries += 1;
            if self.entries > MAX_ENTRIES {
                return Err(unprotectable(dir, format!(
                    "the writable paths hold more than {MAX_ENTRIES} entries, where the search for nested repositories stops"
                )));
            }
            bare_names += usize::from(matches!(name, b"HEAD" | b"objects" | b"refs"));
            let kind = match entry.file_type() {
                rustix::fs::FileType::Unknown => file_type_at(fd, entry.file_name()),
                known => Some(known),
            };
            if let Some(kind) = classify(name, kind) {
                listing
                    .children
                    .push((std::ffi::OsStr::from_bytes(name).to_owned(), kind));
            }
        }
        listing.bare_shaped = bare_names == 3;
        Ok(listing)
    }

    fn protect(&mut self, path: &Path, git: GitEntry) {
        match git {
            GitEntry::Dir => self.markers.push(path.to_path_buf()),
            GitEntry::File => {
                self.markers.push(path.to_path_buf());
                if let Some(gitdir) = self.writable_gitdir(path) {
                    self.protect_gitdir(&gitdir);
                }
            }
            // A symlink's name cannot be pinned by a mount over its target: the program could
            // replace it with a `.git` of its own.
            GitEntry::Other => self.unpinnable.push(path.to_path_buf()),
        }
    }

    /// The git directory a `gitdir:` file points to, when it lies in a writable path.
    fn writable_gitdir(&self, file: &Path) -> Option<PathBuf> {
        let contents = fs::read_to_string(file).ok()?;
        let target = contents.lines().next()?.strip_prefix("gitdir:")?.trim();
        let base = file.parent()?;
        self.inside_roots(&base.join(target))
    }

    /// A git directory and the common directory it names (a linked worktree's
    /// `commondir`), each when writable.
    fn protect_gitdir(&mut self, gitdir: &Path) {
        if let Ok(common) = fs::read_to_string(gitdir.join("commondir")) {
            // Relative to the git directory, as git reads it.
            if let Some(common) = self.inside_roots(&gitdir.join(common.trim())) {
                self.targets.push(common);
            }
        }
        self.targets.push(gitdir.to_path_buf());
    }

    /// `path` as the sandbox sees it, when it lies in a writable root.
    fn inside_roots(&self, path: &Path) -> Option<PathBuf> {
        let real = fs::canonicalize(path).ok()?;
        self.roots.iter().find_map(|(given, canonical)| {
            let rest = real.strip_prefix(canonical).ok()?;
            Some(given.join(rest))
        })
    }
}

/// git's own test (`is_git_directory`), by shape: `HEAD`, `objects/` and `refs/`.
fn is_bare_repository(dir: &Path) -> bool {
    dir.join("HEAD").is_file() && dir.join("objects").is_dir() && dir.join("refs").is_dir()
}

enum Kind {
    Git(GitEntry),
    Dir,
}

#[derive(Default)]
struct Listing {
    children: Vec<(std::ffi::OsString, Kind)>,
    bare_shaped: bool,
}

/// What the walk does with an entry: protect a `.git`, descend into a directory, or nothing.
fn classify(name: &[u8], kind: Option<rustix::fs::FileType>) -> Option<Kind> {
    use rustix::fs::FileType;
    match (name == b".git", kind) {
        (true, Some(FileType::Directory)) => Some(Kind::Git(GitEntry::Dir)),
        (true, Some(FileType::RegularFile)) => Some(Kind::Git(GitEntry::File)),
        (true, _) => Some(Kind::Git(GitEntry::Other)),
        (false, Some(FileType::Directory)) => Some(Kind::Dir),
        _ => None,
    }
}

/// For a file system whose listing leaves the type out: `fstatat` without following.
fn file_type_at(dir: &OwnedFd, name: &std::ffi::CStr) -> Option<rustix::fs::FileType> {
    let stat = rustix::fs::statat(dir, name, rustix::fs::AtFlags::SYMLINK_NOFOLLOW).ok()?;
    Some(rustix::fs::FileType::from_raw_mode(stat.st_mode))
}

#[derive(Clone, Copy)]
enum GitEntry {
    Dir,
    File,
    Other,
}

fn unprotectable(path: &Path, reason: String) -> Error {
    Error::GitUnprotectable {
        path: path.to_path_buf(),
        reason,
    }
}

/// After the run, the git metadata the program created: a `.git` where none was (git walks
/// up from the user's directory and trusts the first it finds) or a bare repository's shape.
/// No mount can stop that without a file on the host, so the supervisor looks once every
/// process of the run is gone, and moves each out of git's way.
#[derive(Debug, Clone)]
pub(crate) struct PlantWatch {
    roots: Vec<PathBuf>,
    known: Vec<PathBuf>,
    suffix: String,
}

impl PlantWatch {
    /// The watch for a run with [`Layer::GitReadOnly`] in force and writable caller paths
    /// (Tier 0, which lets the program write wherever its uid may, has neither).
    pub(super) fn of(
        policy: &Policy,
        workdir: &Workdir,
        mounts: &GitMounts,
        run_id: &str,
        layers: &[Layer],
    ) -> Option<PlantWatch> {
        let roots = writable_roots(policy, workdir);
        let in_force = layers.contains(&Layer::GitReadOnly);
        (in_force && !roots.is_empty()).then(|| PlantWatch {
            roots,
            known: mounts.read_only.clone(),
            suffix: format!("airlock-planted-{run_id}"),
        })
    }

    /// Moves what the program planted out of git's way; a warning for each (or for a check
    /// that could not be made).
    pub(crate) fn quarantine(&self) -> Vec<String> {
        let walk = match Walk::of(&self.roots) {
            Ok(walk) => walk,
            Err(e) => return vec![format!("protect_git: could not check the workspace for git metadata the program created: {e}")],
        };
        let planted = walk.markers.into_iter().chain(walk.unpinnable);
        planted
            .filter(|path| !self.known.contains(path))
            .map(|path| self.move_aside(&path))
            .collect()
    }

    /// Renames `from` to `to` (siblings) without following a symlink anywhere below the
    /// writable root that holds them: another run sharing the workspace may still be running
    /// and could swap a directory on the way for a link to the host's files, which would make
    /// a plain `rename` move a `.git` or `HEAD` that is not the workspace's.
    fn rename_beneath(&self, from: &Path, to: &Path) -> std::io::Result<()> {
        let escaped = || std::io::Error::other("not below a writable path");
        let root = self
            .roots
            .iter()
            .find(|r| from.starts_with(r))
            .ok_or_else(escaped)?;
        let parent = from
            .parent()
            .ok_or_else(escaped)?
            .strip_prefix(root)
            .map_err(|_| escaped())?;
        let (Some(old), Some(new)) = (from.file_name(), to.file_name()) else {
            return Err(escaped());
        };
        let parent = open_dir_path(&open_root(root)?, parent, Mounts::Cross)?;
        rustix::fs::renameat(&parent, old, &parent, new)?;
        Ok(())
    }

    fn move_aside(&self, planted: &Path) -> String {
        // A bare repository stops being one without its HEAD; a `.git` is renamed.
        let (from, what) = match planted.file_name().is_some_and(|n| n == ".git") {
            true => (planted.to_path_buf(), "a .git"),
            false => (planted.join("HEAD"), "a bare repository"),
        };
        // One watch serves every run of a zygote: a counter keeps each name new.
        static MOVED: AtomicUsize = AtomicUsize::new(0);
        let mut to = from.clone().into_os_string();
        let n = MOVED.fetch_add(1, Ordering::Relaxed);
        to.push(format!(".{}-{n}", self.suffix));
        let to = PathBuf::from(to);
        match self.rename_beneath(&from, &to) {
            Ok(()) => format!(
                "protect_git: the program created {what} at {}, which git on the host would trust (its hooks and config run code): moved {} to {}; inspect it before moving it back",
                planted.display(),
                from.display(),
                to.display()
            ),
            Err(e) => format!(
                "protect_git: the program created {what} at {}, which git on the host would trust (its hooks and config run code), and it could not be moved aside ({e}): do not run git there before inspecting it",
                planted.display()
            ),
        }
    }
}

/// A writable root, as an `O_PATH` descriptor to resolve below. The root is the caller's own
/// choice of path; only what lies below it is not.
fn open_root(root: &Path) -> std::io::Result<OwnedFd> {
    use rustix::fs::{Mode, OFlags};
    let flags = OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC;
    Ok(rustix::fs::open(root, flags, Mode::empty())?)
}

/// What the plan and the result say about the protection.
pub(super) fn details(mounts: &GitMounts) -> Vec<String> {
    let read_only = mounts
        .read_only
        .iter()
        .map(|p| format!("{}: git metadata, read-only (protect_git)", p.display()));
    let pinned = mounts.pinned.iter().map(|p| {
        format!(
            "{}: holds a nested repository, cannot be renamed or removed (protect_git)",
            p.display()
        )
    });
    read_only.chain(pinned).collect()
}

#[cfg(test)]
mod tests;
