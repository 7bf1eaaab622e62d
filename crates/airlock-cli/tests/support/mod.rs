//! Helpers shared by the CLI integration tests (each test file includes this module): run the
//! real `airlock` binary, parse its results, find processes, make files the sandbox can read.
//! [`api`] holds every library item the tests use, so that library paths change in one place.
#![allow(dead_code)]

pub mod oci;

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;

use serde_json::Value;

/// The library API the tests reach, imported in one place (each test binary uses a part).
#[allow(unused_imports)]
pub mod api {
    pub use airlock::call::{call, CallOptions, ToolError, ToolPolicy, ToolSpec};
    pub use airlock::internals::{KEPT_MARKER, SWEEP_STAMP};
    pub use airlock::interp::InterpreterRegistry;
    pub use airlock::network::{Decision, GateEvent};
    pub use airlock::policy::units::{ByteSize, Seconds};
    pub use airlock::policy::NetworkMode;
    pub use airlock::policy::{load_profile, LimitsSection, OutputLimitAction, Overrides};
    pub use airlock::warm::{WarmBudget, WarmInterpreter, WarmOptions, WarmPool, WarmStats};
    pub use airlock::worker::run::{run_worker, WorkerJob, WorkerUpdate};
    pub use airlock::worker::{InputFile, WorkerEvent};
    pub use airlock::{
        CancelToken, ErrorKind, Input, Policy, RunEvent, RunStatus, Sandbox, SandboxOptions,
    };
}

/// Debian's interpreter: the one the tests expose to sandboxes.
pub const PYTHON: &str = "/usr/bin/python3";

/// The uid tests run the CLI as when they need an unprivileged caller and run as root
/// (through setpriv): a uid nothing else on the host uses, because without cgroups the
/// process cap is RLIMIT_NPROC, which counts every process of the uid on the host.
pub const UNPRIVILEGED_UID: u32 = 64123;

/// The `airlock` binary under test.
pub fn airlock_bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_airlock"))
}

/// `airlock-zygote` next to the CLI under test, rebuilt first: it is another package, so
/// `cargo test -p airlock-cli` alone would run the zygote tests against a stale binary.
/// Building is a no-op when it is up to date (as after `cargo build --workspace` in CI).
pub fn fresh_zygote_bin() -> PathBuf {
    static BUILT: OnceLock<()> = OnceLock::new();
    BUILT.get_or_init(|| {
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let status = Command::new(cargo)
            .args(["build", "-p", "airlock-zygote"])
            .status()
            .expect("cargo runs");
        assert!(status.success(), "cannot build airlock-zygote");
    });
    airlock_bin().with_file_name("airlock-zygote")
}

/// A command for the binary under test.
pub fn airlock_command() -> Command {
    Command::new(airlock_bin())
}

/// Runs the binary with `args`.
pub fn airlock(args: &[&str]) -> Output {
    airlock_command()
        .args(args)
        .output()
        .expect("failed to start the airlock binary")
}

/// Runs `airlock run --json FLAGS -- PROGRAM...` and parses the result object.
pub fn run_json(flags: &[&str], program: &[&str]) -> Value {
    let mut args = vec!["run", "--json"];
    args.extend_from_slice(flags);
    args.push("--");
    args.extend_from_slice(program);
    let out = airlock(&args);
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

pub fn status(result: &Value) -> &str {
    result["status"].as_str().unwrap_or("?")
}

/// Sandbox options for library calls from tests: the init is the airlock binary.
pub fn sandbox_options() -> api::SandboxOptions {
    api::SandboxOptions {
        init_program: Some(airlock_bin()),
        ..api::SandboxOptions::default()
    }
}

/// `chown -R uid:gid path`.
pub fn chown_tree(path: &Path, uid: u32, gid: u32) {
    let status = Command::new("chown")
        .args(["-R", &format!("{uid}:{gid}")])
        .arg(path)
        .status()
        .unwrap();
    assert!(status.success());
}

pub fn is_root() -> bool {
    nix::unistd::geteuid().is_root()
}

/// Whether the `untrusted` profile can run here (all its required layers are available).
pub fn sandbox_available() -> bool {
    static AVAILABLE: OnceLock<bool> = OnceLock::new();
    *AVAILABLE.get_or_init(|| airlock(&["run", "--", "/bin/true"]).status.success())
}

/// Prints why a test is skipped; use as `return skip("...")`.
pub fn skip(reason: &str) {
    eprintln!("skipped: {reason}");
}

/// A temporary directory the sandbox user (uid 65534 when we are root) can traverse.
pub fn shared_tempdir() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    set_mode(dir.path(), 0o755);
    dir
}

pub fn set_mode(path: &Path, mode: u32) {
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

/// Writes a world-readable file.
pub fn write_file(dir: &Path, name: &str, content: impl AsRef<[u8]>) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, content).unwrap();
    set_mode(&path, 0o644);
    path
}

/// The repository's `python/` directory (the worker helper lives there).
pub fn repo_python_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../python")
}

pub fn stdout_text(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

pub fn stderr_text(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

/// A name no other test uses: `prefix`, this process's pid and the clock.
pub fn unique(prefix: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    format!("{prefix}{}x{nanos}", std::process::id())
}

/// Text of a started interpreter's command line (its shim, `crates/airlock/src/warm/shim.py`),
/// the interpreter's and its address-space holder's alike.
pub const SHIM_TEXT: &str = "def hold_address_space";

/// Text of an interpreter zygote's command line (its template's program, `airlock-zygote`):
/// the template's and every process of its runs alike, whose code carries no marker of its
/// own in its command line.
pub const ZYGOTE_TEXT: &str = "airlock-zygote";

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

/// The command lines of live processes (zombies included) that contain `needle`.
pub fn command_lines_with(needle: &str) -> Vec<String> {
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter(|p| p.file_name().to_string_lossy().parse::<u32>().is_ok())
        .filter_map(|p| std::fs::read(p.path().join("cmdline")).ok())
        .map(|cmdline| String::from_utf8_lossy(&cmdline).replace('\0', " "))
        .filter(|cmdline| cmdline.contains(needle))
        .collect()
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

/// Whether the native backend can run here (user namespaces etc.).
pub fn native_available() -> bool {
    sandbox_available()
}

/// The run directories and cgroups named after supervisor `pid` (`run-<pid>-...`) in the
/// default runtime directories and cgroup parents: what its runs left, if anything.
pub fn runs_of_supervisor(pid: u32) -> Vec<PathBuf> {
    let prefix = format!("run-{pid}-");
    let uid = nix::unistd::geteuid();
    let mut parents = vec![
        PathBuf::from("/run/airlock"),
        PathBuf::from(format!("/tmp/airlock-{uid}")),
    ];
    parents.extend(std::env::var_os("XDG_RUNTIME_DIR").map(|d| Path::new(&d).join("airlock")));
    for hierarchy in std::fs::read_dir("/sys/fs/cgroup")
        .into_iter()
        .flatten()
        .flatten()
    {
        parents.push(hierarchy.path().join("airlock"));
    }
    parents
        .iter()
        .flat_map(|dir| std::fs::read_dir(dir).into_iter().flatten().flatten())
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with(&prefix))
        })
        .collect()
}
