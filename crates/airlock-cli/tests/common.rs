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
