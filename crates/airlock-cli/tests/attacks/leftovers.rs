//! What an airlock run may leave on the host: stray processes, mounts, run directories and
//! cgroups named after the CLI that started them (`run-<pid>-*`).

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::time::Duration;

use airlock_attack::host::{host_mountinfo, kill, processes_with};

use crate::support::UNPRIVILEGED_UID;

/// Everything the suite `id` (whose airlock CLIs had `cli_pids`) left behind; stray processes
/// are killed as they are found.
pub fn leftovers(id: &str, mounts_before: &[String], cli_pids: &[u32]) -> Vec<String> {
    let mut problems = Vec::new();
    for (pid, cmdline) in processes_with(id) {
        problems.push(format!("stray process {pid} outlived the suite: {cmdline}"));
        kill(pid);
    }
    let prefixes: Vec<String> = cli_pids.iter().map(|pid| format!("run-{pid}-")).collect();
    let before: HashSet<&String> = mounts_before.iter().collect();
    for line in host_mountinfo() {
        if !before.contains(&line) && is_this_suites_mount(&line, id, &prefixes) {
            problems.push(format!("mount left behind: {line}"));
        }
    }
    for path in run_entries(|name| prefixes.iter().any(|p| name.starts_with(p))) {
        problems.push(format!("left behind by a run: {}", path.display()));
    }
    problems
}

/// A new mount line this suite's runs made: one naming the suite, one inside a run directory
/// of its CLIs, or one covering a runtime directory itself (the in-memory run directory
/// escaping the init's mount namespace). Other airlock users' mounts (a daemon's session
/// workspaces, other suites running at the same time) are not this suite's leftovers.
fn is_this_suites_mount(line: &str, id: &str, run_prefixes: &[String]) -> bool {
    let mount_point = line.split(' ').nth(4).unwrap_or("");
    line.contains(id)
        || run_prefixes.iter().any(|p| line.contains(p.as_str()))
        || runtime_dirs()
            .iter()
            .any(|dir| Path::new(mount_point) == dir)
}

/// The run directories and cgroups of the runs a CLI with this pid started, removed.
pub fn remove_run_leftovers(cli_pid: u32) -> Vec<String> {
    let prefix = format!("run-{cli_pid}-");
    let mut removed = Vec::new();
    for path in run_entries(|name| name.starts_with(&prefix)) {
        let gone = if path.starts_with("/sys/fs/cgroup") {
            // rmdir of a cgroup fails while the killed processes are still being reaped.
            (0..100).any(|_| {
                std::fs::remove_dir(&path).is_ok() || {
                    std::thread::sleep(Duration::from_millis(20));
                    false
                }
            })
        } else {
            std::fs::remove_dir_all(&path).is_ok()
        };
        if gone {
            removed.push(path.display().to_string());
        }
    }
    removed
}

/// Entries of airlock's cgroup parents and runtime directories whose name `matches`.
fn run_entries(matches: impl Fn(&str) -> bool) -> Vec<PathBuf> {
    let mut places: Vec<PathBuf> = std::fs::read_dir("/sys/fs/cgroup")
        .into_iter()
        .flatten()
        .flatten()
        .map(|controller| controller.path().join("airlock"))
        .collect();
    places.extend(runtime_dirs());
    places
        .iter()
        .flat_map(|place| std::fs::read_dir(place).into_iter().flatten().flatten())
        .filter(|entry| matches(&entry.file_name().to_string_lossy()))
        .map(|entry| entry.path())
        .collect()
}

fn runtime_dirs() -> Vec<PathBuf> {
    let mut dirs = vec![
        PathBuf::from("/run/airlock"),
        PathBuf::from(format!("/tmp/airlock-{UNPRIVILEGED_UID}")),
        PathBuf::from(format!("/tmp/airlock-{}", nix::unistd::geteuid())),
    ];
    if let Some(runtime) = std::env::var_os("XDG_RUNTIME_DIR") {
        dirs.push(Path::new(&runtime).join("airlock"));
    }
    dirs
}
