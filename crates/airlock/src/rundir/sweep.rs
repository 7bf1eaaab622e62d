//! Removing what runs left behind when both their supervisor and their init were killed
//! (SIGKILL leaves nobody to clean up): run directories, cgroups and any processes still in
//! those cgroups. Only entries named `run-<pid>-…` whose supervisor pid is gone are touched:
//! by the periodic [`sweep`] once they are old enough that an init still cleaning up would be
//! done, and by [`sweep_supervisor`] at once, for a caller that knows the supervisor died.
//!
//! Many runs start at once and each may find a sweep due: one of them sweeps (it holds an
//! exclusive `flock` on the stamp while it checks, stamps and sweeps), the others go ahead
//! without waiting, and an entry another sweep removed first counts as removed.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime};

use nix::errno::Errno;
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

use super::{remove_tree, KEPT_MARKER};
use crate::confine::cgroup::CgroupConfig;

/// An init whose supervisor died stops the run at once and removes everything within seconds;
/// anything older than this with a dead supervisor is abandoned.
const ABANDONED_AFTER: Duration = Duration::from_secs(30);

/// Runs sweep at most this often: a sweep reads the runtime directory and every cgroup
/// hierarchy (about 0.5 ms), and nothing is abandoned before [`ABANDONED_AFTER`] anyway.
const SWEEP_EVERY: Duration = Duration::from_secs(10);

/// The file in the runtime directory whose modification time is the last sweep.
pub const SWEEP_STAMP: &str = ".last-sweep";

/// The supervisor pid encoded in a run id (`run-<pid>-<time>-<n>`).
fn supervisor_pid(run_id: &str) -> Option<i32> {
    run_id.strip_prefix("run-")?.split('-').next()?.parse().ok()
}

fn is_gone(pid: i32) -> bool {
    pid > 0 && kill(Pid::from_raw(pid), None) == Err(Errno::ESRCH)
}

/// Which entries a sweep takes: those of any dead supervisor once old, or those of one
/// supervisor known to be dead whatever their age.
#[derive(Debug, Clone, Copy)]
enum Abandoned {
    Old,
    OfSupervisor(i32),
}

impl Abandoned {
    fn takes(self, path: &Path, name: &str) -> bool {
        let Some(pid) = supervisor_pid(name) else {
            return false;
        };
        if path.join(KEPT_MARKER).exists() || !is_gone(pid) {
            return false;
        }
        match self {
            Abandoned::OfSupervisor(dead) => pid == dead,
            Abandoned::Old => std::fs::symlink_metadata(path)
                .and_then(|m| m.modified())
                .map(|t| SystemTime::now().duration_since(t).unwrap_or_default() > ABANDONED_AFTER)
                .unwrap_or(false),
        }
    }

    fn entries(self, dir: &Path) -> Vec<PathBuf> {
        std::fs::read_dir(dir)
            .into_iter()
            .flatten()
            .flatten()
            .filter(|e| self.takes(&e.path(), &e.file_name().to_string_lossy()))
            .map(|e| e.path())
            .collect()
    }

    /// The run directories and cgroups this sweep would take.
    fn leftovers(self, runtime_dir: &Path, cgroup_parents: &[PathBuf]) -> Vec<PathBuf> {
        let mut found = self.entries(runtime_dir);
        for parent in cgroup_parents {
            found.extend(self.entries(parent));
        }
        found
    }
}

/// Sweeps abandoned run directories and cgroups. Best effort: failures are left for the next
/// sweep and never stop a new run.
pub fn sweep(runtime_dir: &Path, cgroup: Option<&CgroupConfig>) -> usize {
    remove_abandoned(Abandoned::Old, runtime_dir, cgroup)
}

/// Sweeps every run of supervisor `pid`, which the caller knows died (a daemon restarting
/// after its predecessor was killed), without waiting for the runs to be old: their inits get
/// up to `grace` to finish their own clean-up first. Nothing is touched while `pid` lives.
pub fn sweep_supervisor(
    runtime_dir: &Path,
    cgroup: Option<&CgroupConfig>,
    pid: u32,
    grace: Duration,
) -> usize {
    let Ok(pid) = i32::try_from(pid) else {
        return 0;
    };
    let abandoned = Abandoned::OfSupervisor(pid);
    let parents = cgroup.map(cgroup_parents).unwrap_or_default();
    let deadline = Instant::now() + grace;
    while !abandoned.leftovers(runtime_dir, &parents).is_empty() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    remove_abandoned(abandoned, runtime_dir, cgroup)
}

fn remove_abandoned(
    abandoned: Abandoned,
    runtime_dir: &Path,
    cgroup: Option<&CgroupConfig>,
) -> usize {
    let mut swept = 0;
    for run_dir in abandoned.entries(runtime_dir) {
        remove_tree(&run_dir);
        swept += usize::from(!run_dir.exists());
    }
    if let Some(cgroup) = cgroup {
        for parent in cgroup_parents(cgroup) {
            for run in abandoned.entries(&parent) {
                swept += usize::from(remove_cgroup(&run));
            }
        }
    }
    swept
}

/// Sweeps unless another run did within [`SWEEP_EVERY`] or is sweeping now.
pub fn sweep_if_due(runtime_dir: &Path, cgroup: Option<&CgroupConfig>) {
    let path = runtime_dir.join(SWEEP_STAMP);
    // The common case, decided by one stat: another run swept a moment ago.
    let swept_before = match std::fs::metadata(&path) {
        Ok(meta) if recent(&meta) => return,
        Ok(_) => true,
        // A stamp this run creates has the current time but no sweep behind it.
        Err(_) => false,
    };
    let Ok(stamp) = std::fs::File::options()
        .write(true)
        .create(true)
        .truncate(false)
        .open(&path)
    else {
        return;
    };
    // Held until the sweep is done (closing the file releases it): a run that finds it taken
    // goes ahead, since the sweep under way covers what it would sweep.
    if rustix::fs::flock(&stamp, rustix::fs::FlockOperation::NonBlockingLockExclusive).is_err() {
        return;
    }
    // Checked again under the lock: a run that held it may have just swept.
    if swept_before && stamp.metadata().is_ok_and(|m| recent(&m)) {
        return;
    }
    if stamp.set_modified(SystemTime::now()).is_ok() {
        sweep(runtime_dir, cgroup);
    }
}

/// Whether a stamp says a sweep ran within [`SWEEP_EVERY`].
fn recent(stamp: &std::fs::Metadata) -> bool {
    stamp
        .modified()
        .is_ok_and(|t| SystemTime::now().duration_since(t).unwrap_or_default() < SWEEP_EVERY)
}

/// `<root>/<parent>` for a v2 root and `<root>/<controller>/<parent>` for each v1 hierarchy.
fn cgroup_parents(cgroup: &CgroupConfig) -> Vec<PathBuf> {
    let mut parents = vec![cgroup.root.join(&cgroup.parent)];
    for hierarchy in std::fs::read_dir(&cgroup.root)
        .into_iter()
        .flatten()
        .flatten()
    {
        parents.push(hierarchy.path().join(&cgroup.parent));
    }
    parents.into_iter().filter(|p| p.is_dir()).collect()
}

/// Kills whatever is still in an abandoned cgroup (orphans of a killed Tier-0 run), then
/// removes it, nested cgroups (a container runtime's own) first. Gone already (another sweep
/// was first) counts as removed; a cgroup this user may not remove is left at once, not retried.
fn remove_cgroup(path: &Path) -> bool {
    for _ in 0..50 {
        let members = std::fs::read_to_string(path.join("cgroup.procs")).unwrap_or_default();
        let pids: Vec<i32> = members
            .lines()
            .filter_map(|l| l.trim().parse().ok())
            .filter(|p| *p > 0)
            .collect();
        for pid in &pids {
            let _ = kill(Pid::from_raw(*pid), Signal::SIGKILL);
        }
        for child in std::fs::read_dir(path).into_iter().flatten().flatten() {
            if child.file_type().is_ok_and(|t| t.is_dir()) {
                remove_cgroup(&child.path());
            }
        }
        match std::fs::remove_dir(path) {
            Ok(()) => return true,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return true,
            // Members still exiting: wait for them.
            Err(e) if e.raw_os_error() == Some(Errno::EBUSY as i32) => {}
            Err(_) => return false,
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A runtime directory holding one old run directory of a supervisor that is gone.
    fn abandoned_run() -> (tempfile::TempDir, PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let dead = dir.path().join("run-999999999-1-0");
        std::fs::create_dir(&dead).unwrap();
        let old = SystemTime::now() - Duration::from_secs(120);
        std::fs::File::open(&dead)
            .unwrap()
            .set_modified(old)
            .unwrap();
        (dir, dead)
    }

    #[test]
    fn the_supervisor_pid_is_read_from_the_run_id() {
        assert_eq!(supervisor_pid("run-4242-283b6ab63dc2-0"), Some(4242));
        assert_eq!(supervisor_pid("airlock"), None);
        assert_eq!(supervisor_pid("run-x-1"), None);
    }

    #[test]
    fn a_sweep_is_skipped_while_the_last_one_is_recent() {
        let (dir, dead) = abandoned_run();
        let old = SystemTime::now() - Duration::from_secs(120);
        std::fs::File::create(dir.path().join(SWEEP_STAMP)).unwrap();
        sweep_if_due(dir.path(), None);
        assert!(dead.exists(), "swept although the last sweep was just now");
        let stamp = std::fs::File::open(dir.path().join(SWEEP_STAMP)).unwrap();
        stamp.set_modified(old).unwrap();
        sweep_if_due(dir.path(), None);
        assert!(
            !dead.exists(),
            "not swept although the last sweep was long ago"
        );
    }

    #[test]
    fn a_sweep_under_way_is_not_repeated() {
        let (dir, dead) = abandoned_run();
        let old = SystemTime::now() - Duration::from_secs(120);
        // Another run holds the lock: this one goes ahead without sweeping.
        let stamp = std::fs::File::create(dir.path().join(SWEEP_STAMP)).unwrap();
        rustix::fs::flock(&stamp, rustix::fs::FlockOperation::LockExclusive).unwrap();
        stamp.set_modified(old).unwrap();
        sweep_if_due(dir.path(), None);
        assert!(dead.exists(), "swept while another sweep held the lock");
        drop(stamp);
        sweep_if_due(dir.path(), None);
        assert!(!dead.exists(), "not swept once the lock was free");
    }

    #[test]
    fn the_first_run_of_a_runtime_directory_sweeps() {
        let (dir, dead) = abandoned_run();
        sweep_if_due(dir.path(), None);
        assert!(
            !dead.exists(),
            "the stamp this run created skipped the sweep"
        );
    }

    #[test]
    fn an_entry_already_removed_counts_as_removed_at_once() {
        let started = std::time::Instant::now();
        assert!(remove_cgroup(Path::new("/nonexistent/run-1-1-0")));
        assert!(started.elapsed() < Duration::from_millis(100));
    }

    #[test]
    fn only_old_runs_of_dead_supervisors_are_swept() {
        let dir = tempfile::tempdir().unwrap();
        let dead = dir.path().join("run-999999999-1-0");
        let live = dir.path().join(format!("run-{}-1-0", std::process::id()));
        let other = dir.path().join("not-a-run");
        for path in [&dead, &live, &other] {
            std::fs::create_dir(path).unwrap();
        }
        assert_eq!(sweep(dir.path(), None), 0, "fresh entries are left alone");
        let old = SystemTime::now() - Duration::from_secs(120);
        for path in [&dead, &live, &other] {
            std::fs::File::open(path)
                .unwrap()
                .set_modified(old)
                .unwrap();
        }
        assert_eq!(sweep(dir.path(), None), 1);
        assert!(!dead.exists() && live.exists() && other.exists());
    }

    /// A restarted daemon knows its predecessor died: its runs go at once, fresh or not,
    /// with their nested cgroups, and no other supervisor's runs are touched.
    #[test]
    fn a_dead_supervisors_runs_are_swept_at_once() {
        let runtime = tempfile::tempdir().unwrap();
        let cgroups = tempfile::tempdir().unwrap();
        let config = CgroupConfig {
            root: cgroups.path().to_owned(),
            parent: "airlock".into(),
            keep_parent: true,
        };
        let dead_run = runtime.path().join("run-999999999-1-0");
        let other_dead = runtime.path().join("run-999999998-1-0");
        let live = runtime
            .path()
            .join(format!("run-{}-1-0", std::process::id()));
        let cgroup = cgroups.path().join("memory/airlock/run-999999999-1-0");
        let nested = cgroup.join("runc-own");
        for path in [&dead_run, &other_dead, &live, &nested] {
            std::fs::create_dir_all(path).unwrap();
        }
        assert_eq!(sweep(runtime.path(), Some(&config)), 0, "all fresh");
        let own = std::process::id();
        let swept = sweep_supervisor(runtime.path(), Some(&config), own, Duration::ZERO);
        assert_eq!(swept, 0, "a living supervisor's runs are never swept");
        let swept = sweep_supervisor(runtime.path(), Some(&config), 999999999, Duration::ZERO);
        assert_eq!(swept, 2, "its run directory and its cgroup");
        assert!(!dead_run.exists() && !cgroup.exists());
        assert!(other_dead.exists() && live.exists());
    }
}
