//! `airlock serve ARGS`: executes the daemon, `airlockd`, with the same arguments. The daemon
//! is a binary of its own so that this one, which every run executes as its init, does not
//! carry an HTTP server, TLS and database drivers.

use std::ffi::OsString;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;

/// `airlockd` next to this executable, else on PATH.
fn daemon_binary() -> PathBuf {
    let sibling = std::env::current_exe()
        .ok()
        .and_then(|exe| exe.parent().map(|dir| dir.join("airlockd")));
    match sibling {
        Some(path) if path.is_file() => path,
        _ => PathBuf::from("airlockd"),
    }
}

/// Replaces this process with `airlockd ARGS`; returns only when that fails.
pub fn serve(args: Vec<OsString>) -> anyhow::Result<u8> {
    let daemon = daemon_binary();
    let error = std::process::Command::new(&daemon).args(&args).exec();
    anyhow::bail!(
        "cannot run {}: {error}; install airlockd next to airlock or on PATH",
        daemon.display()
    )
}
