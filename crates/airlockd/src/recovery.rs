//! Recovery after the daemon was killed (SIGKILL, OOM, a crash): every run this node had in
//! flight is recorded `lost` with the reason, and what its sandbox left is removed.
//!
//! When the daemon dies, each run's init sees its control pipe close, stops the run and
//! removes its run directory and cgroup within seconds. What is left when an init died too
//! (the whole process group was killed) is swept here: the library's sweep removes abandoned
//! runs older than 30 s; the previous process's runs are known to be abandoned at once (its
//! pid is in the store and gone), so they are swept without that wait, after giving their
//! inits a few seconds to clean up themselves.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use airlock::SandboxOptions;
use serde_json::json;

use crate::audit::Audit;
use crate::daemon::DaemonPaths;
use crate::sessions::remove_strays;
use crate::store::{Store, StoreResult};

/// How long the previous process's inits get to clean up after themselves.
const INIT_CLEANUP_WAIT: Duration = Duration::from_secs(10);

/// The `error` of a lost run.
pub fn lost_reason(why: &str) -> serde_json::Value {
    json!({
        "kind": "lost",
        "message": format!("{why}; the run's sandbox was stopped and swept, and its result is unknown"),
        "fix": "submit the run again (with the same idempotency key only after this record: the key now names this lost run)",
    })
}

pub async fn recover(
    store: &Store,
    audit: &Audit,
    node: &str,
    paths: &DaemonPaths,
    options: &SandboxOptions,
) -> StoreResult<()> {
    let previous_pid = store.node_pid(node).await?;
    let reason = lost_reason("the daemon stopped (killed or crashed) while the run was in flight");
    let lost = store.mark_lost(node, &reason).await?;
    for id in &lost {
        audit
            .system(
                "run_lost",
                Some(id),
                json!({"node": node, "previous_pid": previous_pid}),
            )
            .await;
    }
    if !lost.is_empty() {
        tracing::warn!(
            "{} run(s) in flight when the daemon stopped are marked lost",
            lost.len()
        );
    }
    let options = options.clone();
    let runs = paths.runs.clone();
    let swept = tokio::task::spawn_blocking(move || {
        let mut swept = 0;
        if let Some(pid) = previous_pid.filter(|p| *p != std::process::id() as i64) {
            swept += sweep_dead_supervisor(&runs, &options, pid as i32);
        }
        swept + sweep_runtime(&options)
    })
    .await
    .unwrap_or(0);
    if swept > 0 {
        tracing::info!("swept {swept} sandbox remains of the previous daemon process");
    }
    remove_strays(&paths.work, &[]);
    remove_strays(&paths.uploads, &[]);
    Ok(())
}

/// The library's sweep of abandoned runs in this daemon's runtime directory and cgroups.
pub fn sweep_runtime(options: &SandboxOptions) -> usize {
    let Some(runs) = &options.runtime_dir else {
        return 0;
    };
    let cgroup = (!options.no_cgroup).then(|| options.cgroup.clone().unwrap_or_default());
    airlock::supervisor::sweep_abandoned_runs(runs, cgroup.as_ref())
}

/// Removes the runs of a supervisor known to be dead: waits for their inits to finish, then
/// kills what is left in their cgroups and removes their cgroups and run directories.
fn sweep_dead_supervisor(runs: &Path, options: &SandboxOptions, pid: i32) -> usize {
    let alive = rustix::process::Pid::from_raw(pid)
        .is_some_and(|p| rustix::process::test_kill_process(p).is_ok());
    if alive {
        return 0;
    }
    let prefix = format!("run-{pid}-");
    let cgroup_parents = if options.no_cgroup {
        Vec::new()
    } else {
        cgroup_parents(&options.cgroup.clone().unwrap_or_default())
    };
    let leftovers = || {
        let mut found = entries_with_prefix(runs, &prefix);
        for parent in &cgroup_parents {
            found.extend(entries_with_prefix(parent, &prefix));
        }
        found
    };
    let deadline = Instant::now() + INIT_CLEANUP_WAIT;
    while !leftovers().is_empty() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
    }
    let mut swept = 0;
    for parent in &cgroup_parents {
        for cgroup in entries_with_prefix(parent, &prefix) {
            swept += usize::from(kill_and_remove_cgroup(&cgroup));
        }
    }
    for dir in entries_with_prefix(runs, &prefix) {
        swept += usize::from(crate::workspace::remove_workspace_dir(&dir).is_ok());
    }
    swept
}

fn entries_with_prefix(dir: &Path, prefix: &str) -> Vec<PathBuf> {
    std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with(prefix))
        .map(|e| e.path())
        .collect()
}

/// `<root>/<parent>` (cgroup v2) and `<root>/<controller>/<parent>` (each v1 hierarchy).
fn cgroup_parents(config: &airlock::sandbox::cgroup::CgroupConfig) -> Vec<PathBuf> {
    let mut parents = vec![config.root.join(&config.parent)];
    for hierarchy in std::fs::read_dir(&config.root)
        .into_iter()
        .flatten()
        .flatten()
    {
        parents.push(hierarchy.path().join(&config.parent));
    }
    parents.into_iter().filter(|p| p.is_dir()).collect()
}

fn kill_and_remove_cgroup(cgroup: &Path) -> bool {
    for _ in 0..100 {
        let procs = std::fs::read_to_string(cgroup.join("cgroup.procs")).unwrap_or_default();
        for pid in procs.lines().filter_map(|l| l.trim().parse::<i32>().ok()) {
            if let Some(pid) = rustix::process::Pid::from_raw(pid) {
                let _ = rustix::process::kill_process(pid, rustix::process::Signal::KILL);
            }
        }
        // Nested cgroups (a backend's own) go first.
        for child in std::fs::read_dir(cgroup).into_iter().flatten().flatten() {
            if child.path().is_dir() {
                kill_and_remove_cgroup(&child.path());
            }
        }
        if std::fs::remove_dir(cgroup).is_ok() || !cgroup.exists() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    false
}
