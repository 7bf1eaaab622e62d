//! The launchers being compared and the workloads they start.

use std::path::{Path, PathBuf};

/// A way of starting a program: the argv placed before the workload's own argv.
#[derive(Debug, Clone)]
pub struct Tool {
    /// Short name used in tables and in `--tools`.
    pub name: String,
    pub prefix: Vec<String>,
}

/// A program to start, as argv.
#[derive(Debug, Clone)]
pub struct Workload {
    pub name: &'static str,
    pub argv: Vec<String>,
}

/// The reference for "bare exec" ratios.
pub const BARE: &str = "bare";
/// The reference for "vs bubblewrap" ratios.
pub const BWRAP: &str = "bwrap";
/// The configuration the targets are about.
pub const NATIVE: &str = "airlock-native";
/// Appended to the names of the `--baseline` build's configurations.
pub const BASELINE_SUFFIX: &str = "@baseline";

/// bubblewrap flags comparable to airlock's native backend (all namespaces, no capabilities,
/// new session, read-only /usr, fresh /proc, /dev and /tmp).
const BWRAP_FLAGS: &[&str] = &[
    "--unshare-all",
    "--die-with-parent",
    "--new-session",
    "--cap-drop",
    "ALL",
    "--ro-bind",
    "/usr",
    "/usr",
    "--symlink",
    "usr/lib",
    "/lib",
    "--symlink",
    "usr/lib64",
    "/lib64",
    "--symlink",
    "usr/bin",
    "/bin",
    "--symlink",
    "usr/sbin",
    "/sbin",
    "--proc",
    "/proc",
    "--dev",
    "/dev",
    "--tmpfs",
    "/tmp",
];

fn strings(items: &[&str]) -> Vec<String> {
    items.iter().map(|s| s.to_string()).collect()
}

/// The three airlock configurations, run by `airlock`, with `suffix` appended to their names.
fn airlock_tools(airlock: &Path, suffix: &str) -> Vec<Tool> {
    let airlock = airlock.display().to_string();
    let tool = |name: &str, rest: &[&str]| {
        let mut prefix = vec![airlock.clone(), "run".to_string()];
        prefix.extend(strings(rest));
        prefix.push("--".to_string());
        Tool {
            name: format!("{name}{suffix}"),
            prefix,
        }
    };
    vec![
        tool("airlock-none", &["--dev", "--backend", "none"]),
        tool("airlock-native-nocg", &["--no-cgroup"]),
        tool(NATIVE, &[]),
        tool("airlock-bwrap", &["--backend", "bwrap"]),
        tool("airlock-container", &["--backend", "container"]),
        tool("airlock-gvisor", &["--backend", "gvisor"]),
    ]
}

/// Every tool, in table order, plus the airlock configurations of `baseline` (another build,
/// for before/after comparisons); those whose binary is missing are left out with a note.
pub fn all_tools(airlock: &Path, baseline: Option<&Path>, notes: &mut Vec<String>) -> Vec<Tool> {
    let mut bwrap = vec!["bwrap".to_string()];
    bwrap.extend(strings(BWRAP_FLAGS));
    bwrap.push("--".to_string());
    let mut candidates = vec![
        Tool {
            name: BARE.to_string(),
            prefix: Vec::new(),
        },
        Tool {
            name: "unshare".to_string(),
            prefix: strings(&["unshare", "-Urnpf", "--mount-proc", "--"]),
        },
        Tool {
            name: BWRAP.to_string(),
            prefix: bwrap,
        },
        Tool {
            name: "runsc-do".to_string(),
            prefix: strings(&["runsc", "--network=none", "--platform=ptrace", "do"]),
        },
    ];
    if let Some(baseline) = baseline {
        candidates.extend(airlock_tools(baseline, BASELINE_SUFFIX));
    }
    candidates.extend(airlock_tools(airlock, ""));
    candidates
        .into_iter()
        .filter(|tool| match tool.prefix.first() {
            Some(program) if find_program(program).is_none() => {
                notes.push(format!("{}: {program} not found, skipped", tool.name));
                false
            }
            _ => true,
        })
        .collect()
}

/// The two workloads of the issue: the cheapest exec there is, and an interpreter start.
pub fn all_workloads() -> Vec<Workload> {
    vec![
        Workload {
            name: "/bin/true",
            argv: strings(&["/bin/true"]),
        },
        Workload {
            name: "python3 -c pass",
            argv: strings(&["/usr/bin/python3", "-c", "pass"]),
        },
    ]
}

/// `program` itself when it has a slash, else its first match on PATH.
fn find_program(program: &str) -> Option<PathBuf> {
    if program.contains('/') {
        return Path::new(program).is_file().then(|| PathBuf::from(program));
    }
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(program))
        .find(|candidate| candidate.is_file())
}
