//! The launchers being compared and the workloads they start.

use std::path::{Path, PathBuf};

use airlock::policy::{BackendChoice, ContainerRuntime};
use airlock::{CgroupConfig, Sandbox, SandboxOptions, StandaloneWrapper};

/// A way of starting a program: the argv placed before the workload's own argv.
#[derive(Debug, Clone)]
pub struct Tool {
    /// Short name used in tables and in `--tools`.
    pub name: String,
    pub prefix: Vec<String>,
    /// Whole command lines for tools whose config carries the program (an OCI bundle per
    /// workload), by workload name; these win over `prefix`.
    pub per_workload: Vec<(&'static str, Vec<String>)>,
    /// Files each run gets open at these descriptor numbers (e.g. bwrap's seccomp filters).
    pub descriptors: Vec<(i32, PathBuf)>,
    /// The run directory of each workload's planned run, for tools that set it up.
    pub run_dirs: Vec<(&'static str, PathBuf)>,
    /// A warm configuration: runs go to this pool's prepared sandboxes, in this process.
    pub warm: Option<std::sync::Arc<airlock::warm::WarmPool>>,
}

impl Tool {
    pub fn prefixed(name: &str, prefix: Vec<String>) -> Tool {
        Tool {
            name: name.to_string(),
            prefix,
            per_workload: Vec::new(),
            descriptors: Vec::new(),
            run_dirs: Vec::new(),
            warm: None,
        }
    }

    /// The command line that starts `workload` with this tool.
    pub fn argv(&self, workload: &Workload) -> Vec<String> {
        if let Some((_, argv)) = self.per_workload.iter().find(|(w, _)| *w == workload.name) {
            return argv.clone();
        }
        self.prefix.iter().chain(&workload.argv).cloned().collect()
    }
}

/// A program to start, as argv.
#[derive(Debug, Clone)]
pub struct Workload {
    pub name: &'static str,
    pub argv: Vec<String>,
}

/// A Python snippet whose modules a warm interpreter imports ahead.
pub const SNIPPET: &str = "python3 -c 'import json, re'";
/// The reference for "bare exec" ratios.
pub const BARE: &str = "bare";
/// The reference for "vs bubblewrap" ratios.
pub const BWRAP: &str = "bwrap";
/// The configuration the targets are about.
pub const NATIVE: &str = "airlock-native";
/// The same with the egress gate (`--allow-net`), whose start-up cost is a target.
pub const NATIVE_ALLOWLIST: &str = "airlock-native-allowlist";
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
/// including the seccomp filters it loads (`--add-seccomp-fd`, from files opened at the same
/// descriptors for every run), minus only the status pipe that airlock's init reads:
/// `airlock-bwrap` against this is the cost of airlock's wrapper alone. Planned by the library
/// (`Command::standalone_wrapper`) for each workload. Runs as the caller (airlock runs bwrap
/// as uid 65534 when root; measured here, that makes no difference).
fn bwrap_as_airlock_drives_it() -> Result<Tool, String> {
    let mut tool = Tool::prefixed(BWRAP_SAME_ARGS, Vec::new());
    for workload in all_workloads() {
        let wrapper = planned(
            BackendChoice::Bwrap,
            ContainerRuntime::Auto,
            false,
            &workload,
        )?;
        wrapper.create_run_dir().map_err(|e| e.to_string())?;
        // This bwrap runs as root (airlock's as uid 65534), which owns nothing in its user
        // namespace: it may use the program's directories all the same.
        let run_dir = &wrapper.run_dir;
        for dir in [
            wrapper.workdir.clone(),
            run_dir.join("tmp"),
            run_dir.join("shm"),
        ] {
            std::fs::set_permissions(&dir, std::os::unix::fs::PermissionsExt::from_mode(0o777))
                .map_err(|e| format!("chmod {}: {e}", dir.display()))?;
        }
        tool.descriptors = descriptor_files(&wrapper)?;
        tool.per_workload
            .push((workload.name, wrapper.argv.clone()));
        tool.run_dirs.push((workload.name, wrapper.run_dir.clone()));
    }
    Ok(tool)
}

/// A wrapper's descriptors written to files, to be opened at their numbers for every run.
fn descriptor_files(wrapper: &StandaloneWrapper) -> Result<Vec<(i32, PathBuf)>, String> {
    wrapper
        .descriptors
        .iter()
        .map(|(fd, bytes)| {
            let path = wrapper.run_dir.join(format!("fd-{fd}"));
            std::fs::write(&path, bytes)
                .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
            Ok((*fd, path))
        })
        .collect()
}

/// The library's plan of `workload` under the untrusted profile with `backend`, as a
/// standalone command; `cgroup` gives it a run cgroup under [`BENCH_CGROUP_PARENT`] (which
/// only runsc needs to apply the bundle's limits).
fn planned(
    backend: BackendChoice,
    runtime: ContainerRuntime,
    cgroup: bool,
    workload: &Workload,
) -> Result<StandaloneWrapper, String> {
    std::fs::create_dir_all(scratch_dir())
        .map_err(|e| format!("cannot create the scratch directory: {e}"))?;
    let mut policy = airlock::policy::builtin("untrusted").ok_or("no untrusted profile")?;
    policy.backend = backend;
    policy.container.runtime = runtime;
    let options = SandboxOptions {
        runtime_dir: Some(scratch_dir()),
        no_cgroup: !cgroup,
        cgroup: cgroup.then(|| CgroupConfig {
            parent: BENCH_CGROUP_PARENT.into(),
            ..Default::default()
        }),
        ..SandboxOptions::default()
    };
    let sandbox = Sandbox::with_options(policy, options).map_err(|e| e.to_string())?;
    let (program, args) = workload.argv.split_first().ok_or("empty workload")?;
    let command = sandbox.command(program.clone()).args(args.iter().cloned());
    command.standalone_wrapper().map_err(|e| e.to_string())
}

/// The same-argv bwrap under `bench/floor/limited_exec.c`: the least any wrapper must do to
/// keep airlock's per-run promises around bwrap (a limited cgroup in five hierarchies, capped
/// in-memory scratch mounts, rlimits, the uid drop, waiting until the cgroup is empty and
/// removing it), written in C with nothing else, as the floor for `airlock-bwrap`.
pub const BWRAP_FLOOR: &str = "bwrap-airlock-argv-floor";

fn bwrap_under_floor_wrapper(same_argv: &Tool) -> Result<Tool, String> {
    if !nix::unistd::geteuid().is_root() {
        return Err("needs root (cgroups and mounts)".into());
    }
    let binary = compile_floor("limited_exec")?;
    let mut tool = Tool::prefixed(BWRAP_FLOOR, Vec::new());
    for (workload, argv) in &same_argv.per_workload {
        let (_, run_dir) = same_argv
            .run_dirs
            .iter()
            .find(|(w, _)| w == workload)
            .ok_or("no run directory")?;
        let mut line = vec![binary.display().to_string(), run_dir.display().to_string()];
        line.extend(argv.iter().cloned());
        tool.per_workload.push((workload, line));
    }
    tool.descriptors = same_argv.descriptors.clone();
    Ok(tool)
}

/// `bench/floor/NAME.c` compiled into the scratch directory.
pub fn compile_floor(name: &str) -> Result<PathBuf, String> {
    crate::floor::compile(name, &scratch_dir())
}

/// The parent cgroup of the OCI peers' containers.
const BENCH_CGROUP_PARENT: &str = "airlock-bench";

/// podman's parent cgroup, which a bare podman run leaves behind (with `conmon` in it).
const PODMAN_CGROUP_PARENT: &str = "libpod_parent";

/// Whether podman's parent cgroup was there before the peers ran (then it is not ours).
static PODMAN_PARENT_PREEXISTED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();

fn note_podman_parent() {
    PODMAN_PARENT_PREEXISTED.get_or_init(|| {
        Path::new("/sys/fs/cgroup/pids")
            .join(PODMAN_CGROUP_PARENT)
            .exists()
    });
}

/// Removes the (empty) cgroups the peers leave: the floor wrapper's parent, the OCI peers'
/// parent with whatever a runtime left beneath it, and podman's parent if the bare podman
/// peer made it, in every hierarchy.
pub fn remove_peer_cgroups() {
    let Ok(hierarchies) = std::fs::read_dir("/sys/fs/cgroup") else {
        return;
    };
    let mut parents = vec!["airlock-floor", BENCH_CGROUP_PARENT];
    if PODMAN_PARENT_PREEXISTED.get() == Some(&false) {
        parents.push(PODMAN_CGROUP_PARENT);
    }
    for hierarchy in hierarchies.flatten() {
        for parent in &parents {
            let parent = hierarchy.path().join(parent);
            for child in std::fs::read_dir(&parent).into_iter().flatten().flatten() {
                if child.path().is_dir() {
                    let _ = std::fs::remove_dir(child.path());
                }
            }
            let _ = std::fs::remove_dir(&parent);
        }
    }
}

pub const RUNC_SAME_BUNDLE: &str = "runc-airlock-bundle";
pub const CRUN_SAME_BUNDLE: &str = "crun-airlock-bundle";
pub const PODMAN_SAME_ARGV: &str = "podman-airlock-argv";
pub const RUNSC_SAME_BUNDLE: &str = "runsc-airlock-bundle";
/// [`RUNSC_SAME_BUNDLE`] started with airlock's presized descriptor table ([`presized`]).
pub const RUNSC_SAME_BUNDLE_PRESIZED: &str = "runsc-airlock-bundle-presized";

/// The peers that run airlock's generated OCI bundle (or podman argv) directly: the same tool
/// with the same config, minus airlock's supervisor, init, cgroup and Tier 0.
const SAME_CONFIG_PEERS: &[(&str, BackendChoice, ContainerRuntime)] = {
    use BackendChoice::{Container, Gvisor};
    use ContainerRuntime::{Auto, Crun, Podman, Runc};
    &[
        (RUNC_SAME_BUNDLE, Container, Runc),
        (CRUN_SAME_BUNDLE, Container, Crun),
        (PODMAN_SAME_ARGV, Container, Podman),
        (RUNSC_SAME_BUNDLE, Gvisor, Auto),
    ]
};

/// Each same-config peer, planned by the library for every workload and written to the
/// scratch directory once, as airlock's init would write it for a run. The program runs as
/// the tool's config says (uid 65534 in a user namespace where the backend maps one); what the
/// tool needs from a run's cgroup it creates itself (no run cgroup is passed).
fn same_config_peers(notes: &mut Vec<String>) -> Vec<Tool> {
    let mut peers = Vec::new();
    for (name, backend, runtime) in SAME_CONFIG_PEERS {
        let mut tool = Tool::prefixed(name, Vec::new());
        for workload in all_workloads() {
            match planned_command(*backend, *runtime, &workload) {
                Ok(argv) => tool.per_workload.push((workload.name, argv)),
                Err(why) => notes.push(format!("{name} / {}: {why}, skipped", workload.name)),
            }
        }
        if !tool.per_workload.is_empty() {
            peers.push(tool);
        }
    }
    if let Some(runsc) = peers.iter().find(|p| p.name == RUNSC_SAME_BUNDLE) {
        peers.push(presized(runsc));
    }
    peers
}

/// The same peer started with a descriptor open at 1023, as airlock's gvisor backend starts
/// runsc (`WrapSpec::presize_fd_table`): the peer with airlock's one start-up advantage, so
/// that the comparison isolates what the wrapper costs.
fn presized(peer: &Tool) -> Tool {
    let mut tool = peer.clone();
    tool.name = RUNSC_SAME_BUNDLE_PRESIZED.to_string();
    tool.descriptors.push((1023, PathBuf::from("/dev/null")));
    tool
}

/// runsc applies the bundle's memory and CPU limits only to a container with a `cgroupsPath`,
/// which airlock's run gives it; runc and crun make a cgroup with those limits without one
/// (under airlock, crun skips that: the init's run cgroup holds it). The writable areas are as
/// airlock's root run plans them: gVisor and podman bind the run directory's workdir, /tmp and
/// /dev/shm (capped tmpfs mounts under airlock, plain directories here) instead of making
/// their own; runc and crun cap their own tmpfs.
fn planned_command(
    backend: BackendChoice,
    runtime: ContainerRuntime,
    workload: &Workload,
) -> Result<Vec<String>, String> {
    let wrapper = planned(backend, runtime, backend == BackendChoice::Gvisor, workload)?;
    wrapper.create_run_dir().map_err(|e| e.to_string())?;
    // runc's `--keep` leaves the stopped container for airlock's init to inspect; a bare
    // runc must delete it, or the next run with the same id is refused.
    Ok(wrapper
        .argv
        .into_iter()
        .filter(|arg| arg != "--keep")
        .collect())
}

/// Files the tools need while they are measured (this process's own directory, the runtime
/// directory of the peers' planned runs). Not under `/tmp`: bwrap binds a directory of it
/// over `/tmp` and must still find the workdir beside it (airlock's own run directories live
/// in `/run/airlock` for the same reason). Short: podman refuses a runroot path (inside a run
/// directory) over 50 characters.
fn scratch_dir() -> PathBuf {
    let base = if nix::unistd::geteuid().is_root() {
        PathBuf::from("/run")
    } else {
        std::env::temp_dir()
    };
    base.join(format!("alb-{}", std::process::id()))
}

/// Removes [`scratch_dir`] and the peers' cgroups; call once measuring is over.
pub fn remove_scratch() {
    let _ = std::fs::remove_dir_all(scratch_dir());
    remove_peer_cgroups();
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
        Tool::prefixed(&format!("{name}{suffix}"), prefix)
    };
    let disk = ["--disk-run-dir", "--allow-degraded"];
    vec![
        tool("airlock-none", &["--dev", "--backend", "none"]),
        tool("airlock-native-nocg", &["--no-cgroup"]),
        tool(NATIVE, &[]),
        // A gated run that makes no connection: the start-up cost of the egress gate.
        tool(NATIVE_ALLOWLIST, &["--allow-net", "api.example.com"]),
        tool("airlock-native-disk", &disk),
        tool("airlock-bwrap", &["--backend", "bwrap"]),
        // On disk, bwrap, podman and gVisor cannot cap inodes: a gap the profile refuses by
        // default, accepted here to measure what the in-memory run directory costs.
        tool(
            "airlock-bwrap-disk",
            &["--backend", "bwrap", disk[0], disk[1]],
        ),
        tool("airlock-container", &["--backend", "container"]),
        tool(
            "airlock-crun",
            &["--backend", "container", "--container-runtime", "crun"],
        ),
        tool(
            "airlock-crun-disk",
            &[
                "--backend",
                "container",
                "--container-runtime",
                "crun",
                disk[0],
                disk[1],
            ],
        ),
        tool(
            "airlock-podman",
            &["--backend", "container", "--container-runtime", "podman"],
        ),
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
        Tool::prefixed(BARE, Vec::new()),
        Tool::prefixed(
            "unshare",
            strings(&["unshare", "-Urnpf", "--mount-proc", "--"]),
        ),
        Tool::prefixed(BWRAP, bwrap),
        Tool::prefixed(
            "runsc-do",
            strings(&["runsc", "--network=none", "--platform=ptrace", "do"]),
        ),
    ];
    match bwrap_as_airlock_drives_it() {
        Ok(tool) => {
            match bwrap_under_floor_wrapper(&tool) {
                Ok(floor) => candidates.push(floor),
                Err(why) => notes.push(format!("{BWRAP_FLOOR}: {why}, skipped")),
            }
            candidates.push(tool);
        }
        Err(why) => notes.push(format!("{BWRAP_SAME_ARGS}: {why}, skipped")),
    }
    if nix::unistd::geteuid().is_root() {
        note_podman_parent();
        candidates.extend(same_config_peers(notes));
    } else {
        notes.push("same-config runc/crun/podman/runsc peers: need root, skipped".into());
    }
    if let Some(baseline) = baseline {
        candidates.extend(airlock_tools(baseline, BASELINE_SUFFIX));
    }
    candidates.extend(airlock_tools(airlock, ""));
    candidates
        .into_iter()
        .filter(|tool| {
            match tool
                .prefix
                .first()
                .or(tool.per_workload.first().and_then(|(_, argv)| argv.first()))
            {
                Some(program) if find_program(program).is_none() => {
                    notes.push(format!("{}: {program} not found, skipped", tool.name));
                    false
                }
                _ => true,
            }
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
        Workload {
            name: SNIPPET,
            argv: strings(&["/usr/bin/python3", "-c", "import json, re"]),
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
