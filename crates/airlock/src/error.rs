//! Typed errors of the library. An `Err` means the sandbox could not be set up or was misused;
//! anything the sandboxed program does (time out, run out of memory, crash) is a `RunResult`.

use std::path::PathBuf;

use crate::layer::Layer;
use crate::policy::InvalidValue;

/// A profile could not be loaded.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PolicyError {
    /// The TOML did not parse or has an unknown key or a bad value (line and column included).
    #[error("profile {origin}: {message}")]
    Parse { origin: String, message: String },
    /// A profile name that is neither built in nor a path.
    #[error("unknown profile {name:?}: use a built-in profile (untrusted, trusted) or a path to a .toml file")]
    UnknownProfile { name: String },
    /// A profile file could not be read.
    #[error("cannot read profile {path}: {cause}")]
    Read {
        path: PathBuf,
        cause: std::io::Error,
    },
    /// Profiles extend each other in a loop.
    #[error("profiles extend each other in a loop: {chain}")]
    ExtendsCycle { chain: String },
    /// A value is out of range.
    #[error("profile {origin}: {problem}")]
    Invalid {
        origin: String,
        problem: InvalidValue,
    },
}

/// Why a run could not start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The policy is unusable.
    #[error(transparent)]
    Policy(#[from] PolicyError),
    /// A value given to the builder is invalid.
    #[error(transparent)]
    Invalid(#[from] InvalidValue),
    /// `backend = "none"` without an explicit opt-in.
    #[error("backend \"none\" gives no isolation beyond Tier 0; pass --dev (library: SandboxOptions::dev) or use the built-in `trusted` profile")]
    UnisolatedRefused,
    /// The requested backend cannot run on this host.
    #[error("backend {backend} is not available here: {reason}")]
    BackendUnavailable { backend: String, reason: String },
    /// Layers the policy requires are missing on this host.
    #[error("backend {backend} cannot enforce {} here: {reason}; fix the host (see `airlock doctor`), choose another backend, or pass --allow-degraded to run with what is available", crate::layer::names(.missing))]
    Degraded {
        backend: String,
        missing: Vec<Layer>,
        reason: String,
    },
    /// A path the policy names does not exist or is unusable.
    #[error("{what} {path}: {reason}")]
    BadPath {
        what: &'static str,
        path: PathBuf,
        reason: String,
    },
    /// The program is not in the profile's `allowed_programs`.
    #[error("program {program:?} is not in the profile's allowed_programs ({}); add it there or run an allowed program", .allowed.join(", "))]
    ProgramNotAllowed {
        program: String,
        allowed: Vec<String>,
    },
    /// The command is empty or not representable.
    #[error("invalid command: {0}")]
    Command(String),
    /// The init program used to set up the sandbox could not be started.
    #[error("cannot start the sandbox init {program}: {cause}")]
    Spawn {
        program: PathBuf,
        cause: std::io::Error,
    },
    /// Host-side I/O around the run failed.
    #[error("{context}: {cause}")]
    Io {
        context: String,
        cause: std::io::Error,
    },
}

impl Error {
    /// Only the Linux supervisor does I/O that fails this way.
    #[cfg(target_os = "linux")]
    pub(crate) fn io(context: impl Into<String>, source: std::io::Error) -> Self {
        Error::Io {
            context: context.into(),
            cause: source,
        }
    }
}
