//! Helpers shared by the CLI integration tests: run the real `airlock` binary.

#![allow(dead_code)]

use std::process::{Command, Output};

use serde_json::Value;

pub const PYTHON: &str = "/usr/bin/python3";

pub fn airlock() -> Command {
    Command::new(env!("CARGO_BIN_EXE_airlock"))
}

/// Runs `airlock ARGS` and returns the raw output.
pub fn run(args: &[&str]) -> Output {
    airlock().args(args).output().expect("airlock runs")
}

/// Runs `airlock run --json PREFIX -- PROGRAM...` and parses the result object.
pub fn run_json(flags: &[&str], program: &[&str]) -> Value {
    let mut args = vec!["run", "--json"];
    args.extend_from_slice(flags);
    args.push("--");
    args.extend_from_slice(program);
    let out = run(&args);
    let stdout = String::from_utf8_lossy(&out.stdout);
    serde_json::from_str(&stdout).unwrap_or_else(|e| {
        panic!(
            "no JSON result ({e}); stdout: {stdout}\nstderr: {}",
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

/// Tier 0 only (what issue "Tier 0" promises hold without any namespace).
pub const TIER0: &[&str] = &["--dev", "--backend", "none"];
/// The default profile.
pub const NATIVE: &[&str] = &[];

pub fn flags<'a>(base: &[&'a str], extra: &[&'a str]) -> Vec<&'a str> {
    base.iter().chain(extra).copied().collect()
}

pub fn is_root() -> bool {
    nix::unistd::geteuid().is_root()
}

/// Whether the native backend can run here (user namespaces etc.).
pub fn native_available() -> bool {
    let out = run(&["run", "--", "/bin/true"]);
    out.status.success()
}

/// Pids of live processes whose command line contains `marker`, not counting airlock's own
/// processes (the CLI's command line holds the program's, marker included).
pub fn processes_with(marker: &str) -> Vec<u32> {
    all_processes_with(marker)
        .into_iter()
        .filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/comm"))
                .map_or(true, |c| c.trim() != "airlock")
        })
        .collect()
}

/// Pids of live processes whose command line contains `marker`, airlock's included.
pub fn all_processes_with(marker: &str) -> Vec<u32> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        let is_zombie = std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .map(|s| s.contains(") Z "))
            .unwrap_or(true);
        if !is_zombie && String::from_utf8_lossy(&cmdline).contains(marker) {
            found.push(pid);
        }
    }
    found
}

pub fn unique(prefix: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    format!("{prefix}{}x{nanos}", std::process::id())
}

pub fn status(result: &Value) -> &str {
    result["status"].as_str().unwrap_or("?")
}

/// A runtime directory and a cgroup parent of this test's own, so that its runs and their
/// sweeps touch nothing of other runs on the host (and no other run's sweep touches theirs).
pub struct PrivateRuns {
    pub runtime: tempfile::TempDir,
    pub cgroup_parent: String,
}

impl Default for PrivateRuns {
    fn default() -> Self {
        Self::new()
    }
}

impl PrivateRuns {
    pub fn new() -> PrivateRuns {
        PrivateRuns {
            runtime: tempfile::Builder::new()
                .prefix("airlock-runs-")
                .tempdir()
                .unwrap(),
            cgroup_parent: unique("airlock-test-"),
        }
    }

    /// The flags that put a run here.
    pub fn flags(&self) -> Vec<String> {
        vec![
            "--runtime-dir".into(),
            self.runtime.path().display().to_string(),
            "--cgroup-parent".into(),
            self.cgroup_parent.clone(),
        ]
    }

    /// The cgroup parent in every hierarchy that has it.
    pub fn cgroup_parents(&self) -> Vec<std::path::PathBuf> {
        let mut parents = vec![std::path::Path::new("/sys/fs/cgroup").join(&self.cgroup_parent)];
        for hierarchy in std::fs::read_dir("/sys/fs/cgroup")
            .into_iter()
            .flatten()
            .flatten()
        {
            parents.push(hierarchy.path().join(&self.cgroup_parent));
        }
        parents.retain(|p| p.is_dir());
        parents
    }

    /// Entries named `prefix*` in the runtime directory and the cgroup parents.
    pub fn entries_named(&self, prefix: &str) -> Vec<std::path::PathBuf> {
        let mut dirs = vec![self.runtime.path().to_path_buf()];
        dirs.extend(self.cgroup_parents());
        dirs.iter()
            .flat_map(|dir| std::fs::read_dir(dir).into_iter().flatten().flatten())
            .map(|e| e.path())
            .filter(|p| {
                p.file_name()
                    .is_some_and(|n| n.to_string_lossy().starts_with(prefix))
            })
            .collect()
    }
}

impl Drop for PrivateRuns {
    /// The emptied cgroup parents stay after runs (to save their creation); remove them.
    fn drop(&mut self) {
        for parent in self.cgroup_parents() {
            let _ = std::fs::remove_dir(parent);
        }
    }
}

/// Sets a path's modification time two minutes back, so the sweep treats it as abandoned
/// (and a sweep stamp as long past).
pub fn age(path: &std::path::Path) {
    let old = std::time::SystemTime::now() - std::time::Duration::from_secs(120);
    std::fs::File::open(path)
        .unwrap()
        .set_modified(old)
        .unwrap();
}
