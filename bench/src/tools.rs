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

/// bubblewrap started with the argv airlock's bwrap backend builds, for the wrapper's overhead.
pub const BWRAP_SAME_ARGS: &str = "bwrap-airlock-argv";

/// bubblewrap with exactly the argv airlock's `bwrap` backend builds for the untrusted profile,
/// minus the descriptors only airlock's init can hand over (the seccomp filters and the status
/// pipe): `airlock-bwrap` against this is the cost of airlock's wrapper alone. Runs as the
/// caller (airlock runs bwrap as uid 65534 when root; measured here, that makes no difference).
fn bwrap_as_airlock_drives_it() -> Result<Tool, String> {
    use airlock::backend::{
        bwrap_args, parse_version, resolve_system_entries, BwrapInstall, HostLayout, PlanContext,
    };
    let policy = airlock::policy::builtin("untrusted").ok_or("no untrusted profile")?;
    let path = find_program("bwrap").ok_or("bwrap not found")?;
    let run_dir = scratch_dir().join("bwrap-run");
    let etc = run_dir.join("bwrap-etc");
    std::fs::create_dir_all(&etc).map_err(|e| format!("cannot create {}: {e}", etc.display()))?;
    let mut identity = Vec::new();
    for name in ["passwd", "group", "hosts", "hostname"] {
        let file = etc.join(name);
        std::fs::write(&file, "airlock-bench\n")
            .map_err(|e| format!("cannot write {}: {e}", file.display()))?;
        identity.push((file, Path::new("/etc").join(name)));
    }
    let workdir = run_dir.join("work");
    let ctx = PlanContext {
        policy: &policy,
        workdir: &workdir,
        run_dir: &run_dir,
        fresh_workdir: true,
        keep: false,
        tty: false,
        run_id: "bench",
        argv: &[],
        env: &[],
        cgroup: None,
    };
    let layout = HostLayout {
        system: resolve_system_entries(&airlock::sandbox::rootfs::default_system_ro()),
        etc: airlock::sandbox::rootfs::default_etc_files(),
        identity,
    };
    let version = std::process::Command::new(&path)
        .arg("--version")
        .output()
        .ok()
        .and_then(|out| parse_version(&String::from_utf8_lossy(&out.stdout)))
        .ok_or("cannot read bwrap's version")?;
    let install = BwrapInstall {
        path,
        version,
        setuid: false,
    };
    let argv = bwrap_args(&ctx, &install, &layout);
    Ok(Tool {
        name: BWRAP_SAME_ARGS.to_string(),
        prefix: without_descriptor_flags(argv),
    })
}

/// Files the tools need while they are measured (this process's own directory).
fn scratch_dir() -> PathBuf {
    std::env::temp_dir().join(format!("airlock-bench-{}", std::process::id()))
}

/// Removes [`scratch_dir`]; call once measuring is over.
pub fn remove_scratch() {
    let _ = std::fs::remove_dir_all(scratch_dir());
}

/// Drops `--add-seccomp-fd N` and `--json-status-fd N`: those descriptors exist only in
/// airlock's init.
fn without_descriptor_flags(argv: Vec<String>) -> Vec<String> {
    let mut kept = Vec::with_capacity(argv.len());
    let mut skip_value = false;
    for arg in argv {
        if skip_value {
            skip_value = false;
        } else if arg == "--add-seccomp-fd" || arg == "--json-status-fd" {
            skip_value = true;
        } else {
            kept.push(arg);
        }
    }
    kept
}

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
        // bwrap and gVisor cannot cap inodes, which the untrusted profile refuses by default.
        tool("airlock-bwrap", &["--backend", "bwrap", "--allow-degraded"]),
        tool("airlock-container", &["--backend", "container"]),
        tool(
            "airlock-gvisor",
            &["--backend", "gvisor", "--allow-degraded"],
        ),
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
    match bwrap_as_airlock_drives_it() {
        Ok(tool) => candidates.push(tool),
        Err(why) => notes.push(format!("{BWRAP_SAME_ARGS}: {why}, skipped")),
    }
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
