//! The macOS half of the seatbelt backend: runs a program under `sandbox-exec` with the
//! profile from [`super::seatbelt::sbpl_profile`], the policy's environment and the rlimit prologue.
//! Only std is used, so nothing here needs `unsafe` or a platform crate.

use std::path::{Path, PathBuf};
use std::process::Command;

use super::seatbelt::{sbpl_profile, ulimit_prologue, SeatbeltPaths};
use crate::policy::Policy;

/// The system's sandbox launcher.
pub const SANDBOX_EXEC: &str = "/usr/bin/sandbox-exec";

/// Why a seatbelt run cannot be prepared.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SeatbeltError {
    #[error("{SANDBOX_EXEC} is missing: seatbelt needs macOS with the system sandbox")]
    Missing,
    #[error("cannot resolve {path}: {source}")]
    Resolve {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("the command is empty")]
    EmptyCommand,
    /// Network `allowlist`, `report` or `unix_sockets`: macOS has no egress gate, and the run
    /// never goes ahead with all of the network or none of it instead.
    #[error("network mode \"{0}\" (or unix_sockets) needs airlock's egress gate, which Seatbelt does not have: use mode none or host on macOS")]
    NetworkUnsupported(&'static str),
}

/// Whether this Mac can run seatbelt sandboxes.
pub fn available() -> bool {
    Path::new(SANDBOX_EXEC).is_file()
}

/// A ready-to-spawn command: `/bin/sh -c '<ulimits>; exec "$0" "$@"' sandbox-exec -p
/// <profile> <argv...>`, with exactly the policy's environment and the workdir as cwd.
/// `workdir` and `tmpdir` must exist; they are resolved (macOS symlinks) before the profile
/// names them.
pub fn command(
    policy: &Policy,
    workdir: &Path,
    tmpdir: &Path,
    argv: &[String],
) -> Result<Command, SeatbeltError> {
    if !available() {
        return Err(SeatbeltError::Missing);
    }
    if argv.is_empty() {
        return Err(SeatbeltError::EmptyCommand);
    }
    let network = &policy.network;
    if network.mode.is_gated() || !network.unix_sockets.is_empty() {
        return Err(SeatbeltError::NetworkUnsupported(network.mode.name()));
    }
    let resolve = |path: &Path| {
        path.canonicalize()
            .map_err(|source| SeatbeltError::Resolve {
                path: path.to_path_buf(),
                source,
            })
    };
    let paths = SeatbeltPaths {
        workdir: resolve(workdir)?,
        tmpdir: resolve(tmpdir)?,
    };
    let profile = sbpl_profile(policy, &paths);
    let mut command = Command::new("/bin/sh");
    command
        .arg("-c")
        .arg(ulimit_prologue(policy))
        .arg(SANDBOX_EXEC)
        .arg("-p")
        .arg(profile)
        .args(argv);
    command.env_clear().current_dir(&paths.workdir);
    command
        .env("HOME", &paths.workdir)
        .env("TMPDIR", &paths.tmpdir);
    for name in &policy.env.pass {
        if let Some(value) = std::env::var_os(name) {
            command.env(name, value);
        }
    }
    command.envs(&policy.env.set);
    Ok(command)
}
