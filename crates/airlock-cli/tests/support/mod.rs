//! Helpers shared by the CLI integration tests (each test file includes this module).
#![allow(dead_code)]

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;

use airlock::SandboxOptions;

/// The `airlock` binary under test.
pub fn airlock_bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_airlock"))
}

/// Runs the binary with `args`.
pub fn airlock(args: &[&str]) -> Output {
    Command::new(airlock_bin())
        .args(args)
        .output()
        .expect("failed to start the airlock binary")
}

/// Sandbox options for library calls from tests: the init is the airlock binary.
pub fn sandbox_options() -> SandboxOptions {
    SandboxOptions {
        init_program: Some(airlock_bin()),
        ..SandboxOptions::default()
    }
}

pub fn is_root() -> bool {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|line| line.strip_prefix("Uid:"))
        .and_then(|ids| ids.split_whitespace().nth(1))
        == Some("0")
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
