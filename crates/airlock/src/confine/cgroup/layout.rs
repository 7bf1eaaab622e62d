//! Which cgroup hierarchies a root holds: the v2 mount and the v1 hierarchies by controller,
//! from mountinfo or, for a fixture tree, from its directories.

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, TryLockError};

use super::control::{is_cgroupfs, read_small};
use super::parse::{self, cgroup_mounts, controllers_from_dir_name, parse_mountinfo, CgroupMount};
use super::{CgroupVersion, RUN_CONTROLLERS};

/// The cgroup hierarchies found under a root.
#[derive(Debug, Clone, Default)]
pub(super) struct Layout {
    pub(super) root: PathBuf,
    pub(super) v2: Option<V2Mount>,
    pub(super) v1: Vec<V1Hierarchy>,
    /// Read from mountinfo (the host's mounts), not inferred from a fixture's directories.
    from_mountinfo: bool,
}

/// Layouts read from mountinfo, by root, kept for the process's life: a long-lived caller (a
/// pool, the zygote's keeper, the daemon) creates a cgroup per run, and reading and parsing
/// mountinfo every time costs ~0.1 ms of each. A fixture tree's layout is never kept: tests
/// reshape their trees.
static REMEMBERED: Mutex<Vec<Layout>> = Mutex::new(Vec::new());

#[derive(Debug, Clone)]
pub(super) struct V2Mount {
    pub(super) path: PathBuf,
    /// Controllers listed in the mount root's `cgroup.controllers`.
    pub(super) available: Vec<String>,
}

#[derive(Debug, Clone)]
pub(super) struct V1Hierarchy {
    pub(super) path: PathBuf,
    pub(super) controllers: Vec<String>,
}

impl Layout {
    /// Uses mountinfo when it lists cgroup mounts under `root`; otherwise (a fake tree, or no
    /// /proc) infers the layout from the directories.
    pub(super) fn detect(root: &Path) -> Layout {
        let mounts: Vec<CgroupMount> = read_small(Path::new("/proc/self/mountinfo"))
            .map(|text| cgroup_mounts(&parse_mountinfo(&text)))
            .unwrap_or_default()
            .into_iter()
            .filter(|mount| mount_path(mount).starts_with(root))
            .collect();
        if mounts.is_empty() {
            Layout::scan(root)
        } else {
            Layout {
                from_mountinfo: true,
                ..Layout::from_mounts(root, mounts)
            }
        }
    }

    /// The layout of `root` as this process last read it from mountinfo, if it has and every
    /// hierarchy in it is still a cgroup filesystem: one `statfs` each, where a run directory
    /// made in an unmounted hierarchy's place would be a plain directory enforcing nothing.
    pub(super) fn remembered(root: &Path) -> Option<Layout> {
        let layout =
            with_remembered(|kept| kept.iter().find(|layout| layout.root == root).cloned())??;
        layout.hierarchies_mounted().then_some(layout)
    }

    fn hierarchies_mounted(&self) -> bool {
        let v2 = self.v2.iter().map(|v2| &v2.path);
        let v1 = self.v1.iter().map(|hierarchy| &hierarchy.path);
        v2.chain(v1).all(|path| is_cgroupfs(path))
    }

    /// Remembers `layout` as `root`'s (for the tests: a host's changed mounts).
    #[cfg(test)]
    pub(super) fn remember_as_read_from_mountinfo(mut self) {
        self.from_mountinfo = true;
        self.remember();
    }

    /// Reads the layout afresh ([`Layout::detect`]) and remembers it when it is the host's.
    pub(super) fn detect_and_remember(root: &Path) -> Layout {
        let layout = Layout::detect(root);
        if layout.from_mountinfo {
            layout.clone().remember();
        }
        layout
    }

    /// Keeps this layout as its root's, in place of an earlier one.
    fn remember(self) {
        with_remembered(|kept| {
            kept.retain(|old| old.root != self.root);
            kept.push(self);
        });
    }

    pub(super) fn from_mounts(root: &Path, mounts: Vec<CgroupMount>) -> Layout {
        let mut layout = Layout {
            root: root.to_path_buf(),
            ..Layout::default()
        };
        for mount in mounts {
            match mount {
                CgroupMount::V2 { path } => {
                    let replaces = layout.v2.as_ref().is_none_or(|_| path == root);
                    if replaces {
                        layout.v2 = Some(V2Mount::read(path));
                    }
                }
                CgroupMount::V1 { path, controllers } => layout.add_v1(path, controllers),
            }
        }
        layout
    }

    pub(super) fn scan(root: &Path) -> Layout {
        let mut layout = Layout {
            root: root.to_path_buf(),
            ..Layout::default()
        };
        if root.join("cgroup.controllers").is_file() {
            layout.v2 = Some(V2Mount::read(root.to_path_buf()));
            return layout;
        }
        let unified = root.join("unified");
        if unified.join("cgroup.controllers").is_file() {
            layout.v2 = Some(V2Mount::read(unified));
        }
        let mut entries: Vec<PathBuf> = fs::read_dir(root)
            .into_iter()
            .flatten()
            .flatten()
            .filter(|entry| entry.file_type().is_ok_and(|kind| kind.is_dir()))
            .map(|entry| entry.path())
            .collect();
        entries.sort();
        for path in entries {
            let name = path.file_name().unwrap_or_default().to_string_lossy();
            let controllers = controllers_from_dir_name(&name);
            layout.add_v1(path, controllers);
        }
        layout
    }

    /// Keeps the first hierarchy per controller, so a bind-mounted duplicate is ignored.
    pub(super) fn add_v1(&mut self, path: PathBuf, controllers: Vec<String>) {
        let fresh: Vec<String> = controllers
            .into_iter()
            .filter(|name| self.v1_hierarchy(name).is_none())
            .collect();
        if !fresh.is_empty() {
            self.v1.push(V1Hierarchy {
                path,
                controllers: fresh,
            });
        }
    }

    pub(super) fn v1_hierarchy(&self, controller: &str) -> Option<&V1Hierarchy> {
        self.v1
            .iter()
            .find(|hierarchy| hierarchy.controllers.iter().any(|c| c == controller))
    }

    pub(super) fn v2_offers(&self, controller: &str) -> bool {
        self.v2
            .as_ref()
            .is_some_and(|v2| v2.available.iter().any(|c| c == controller))
    }

    /// v2 when it offers memory and pids; else v1 when it has any run controller; else a v2
    /// mounted at the root itself (a pure v2 host with controllers disabled still kills and
    /// accounts cpu).
    pub(super) fn preferred_version(&self) -> Option<CgroupVersion> {
        if self.v2_offers("memory") && self.v2_offers("pids") {
            return Some(CgroupVersion::V2);
        }
        if RUN_CONTROLLERS
            .iter()
            .any(|name| self.v1_hierarchy(name).is_some())
        {
            return Some(CgroupVersion::V1);
        }
        match &self.v2 {
            Some(v2) if v2.path == self.root => Some(CgroupVersion::V2),
            _ => None,
        }
    }

    pub(super) fn nothing_usable_reason(&self) -> String {
        format!(
            "no cgroup2 filesystem and no cgroup v1 controller hierarchy (memory, pids, cpu) is mounted there; \
             mount cgroup2 with `mount -t cgroup2 none {root}` (or run on a host/container that exposes /sys/fs/cgroup)",
            root = self.root.display()
        )
    }
}

impl V2Mount {
    pub(super) fn read(path: PathBuf) -> V2Mount {
        let available = read_small(&path.join("cgroup.controllers"))
            .map(|text| parse::parse_controller_list(&text))
            .unwrap_or_default();
        V2Mount { path, available }
    }
}

/// Runs `use_kept` on the remembered layouts unless another thread holds them. Never waits:
/// a process forked while a thread held the lock (a threaded caller's fork) would wait forever,
/// so it reads mountinfo instead.
fn with_remembered<T>(use_kept: impl FnOnce(&mut Vec<Layout>) -> T) -> Option<T> {
    match REMEMBERED.try_lock() {
        Ok(mut kept) => Some(use_kept(&mut kept)),
        Err(TryLockError::Poisoned(poisoned)) => Some(use_kept(&mut poisoned.into_inner())),
        Err(TryLockError::WouldBlock) => None,
    }
}

pub(super) fn mount_path(mount: &CgroupMount) -> &Path {
    match mount {
        CgroupMount::V2 { path } | CgroupMount::V1 { path, .. } => path,
    }
}
