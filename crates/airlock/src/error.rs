//! Typed errors of the library. An `Err` means the sandbox could not be set up or was misused;
//! anything the sandboxed program does (time out, run out of memory, crash) is a `RunResult`.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::layer::Layer;

/// A policy value that cannot be used, with the key, the value and what is allowed.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("invalid value {value} for `{key}`: {allowed}")]
pub struct InvalidValue {
    /// The dotted key, e.g. `limits.processes`.
    pub key: &'static str,
    /// The offending value as written.
    pub value: String,
    /// What would be accepted.
    pub allowed: String,
}

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
    /// Layers the policy requires are missing: on this host, or because of what the run asks
    /// for (the host network). `reason` says why and how to fix it.
    #[error("backend {backend} cannot enforce {} here: {reason}; or pass --allow-degraded to run with what is available", crate::layer::names(.missing))]
    Degraded {
        backend: String,
        missing: Vec<Layer>,
        reason: String,
    },
    /// The backend cannot give the network the policy asks for (an egress-gated mode, or
    /// host Unix sockets without a filesystem boundary); never run with another network.
    #[error("backend {backend} cannot run network mode \"{mode}\"{sockets}: {reason}", sockets = if *.unix_sockets { " with unix_sockets" } else { "" })]
    NetworkUnsupported {
        backend: String,
        mode: String,
        unix_sockets: bool,
        reason: String,
    },
    /// A path the policy names does not exist or is unusable.
    #[error("{what} {path}: {reason}")]
    BadPath {
        what: &'static str,
        path: PathBuf,
        reason: String,
    },
    /// A caller's directory the program is to work in cannot be made usable by it.
    #[error("{path} belongs to uid {owner_uid} on the host and the program runs as uid {program_uid}: {reason}")]
    WorkdirUnusable {
        path: PathBuf,
        owner_uid: u32,
        program_uid: u32,
        reason: String,
    },
    /// A git repository in a caller's writable directory cannot be protected
    /// (`filesystem.protect_git`), so the run is refused rather than leaving it writable.
    #[error("cannot protect the git metadata in {path}: {reason}; give a narrower --workdir or --rw path, or set filesystem.protect_git = \"off\" (--protect-git off) for code you trust with your repositories")]
    GitUnprotectable { path: PathBuf, reason: String },
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

/// What kind of refusal or failure an [`Error`] is, for callers that branch on it (the CLI
/// prints it, a daemon maps it to a status code). Snake case in JSON.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum ErrorKind {
    /// A profile's TOML does not parse, or has an unknown key or a bad value.
    ProfileInvalid,
    /// A profile name that is neither built in nor a file.
    ProfileNotFound,
    /// A profile file cannot be read.
    ProfileUnreadable,
    /// Profiles extend each other in a loop.
    ProfileCycle,
    /// A policy value is out of range.
    ValueInvalid,
    /// Backend `none` without an opt-in.
    UnisolatedRefused,
    /// The backend cannot run on this host.
    BackendUnavailable,
    /// Required layers would be missing.
    Degraded,
    /// The backend cannot give the network the policy asks for.
    NetworkUnsupported,
    /// A path the policy names is missing or unusable.
    BadPath,
    /// The program is not in the policy's `allowed_programs`.
    ProgramNotAllowed,
    /// A caller's directory cannot be made usable by the program with this backend.
    WorkdirUnusable,
    /// The command is empty or not representable.
    CommandInvalid,
    /// The init could not be started.
    InitNotStarted,
    /// Host-side I/O around the run failed.
    Io,
    /// An interpreter name the registry does not know.
    InterpreterUnknown,
    /// An interpreter the registry does not allow.
    InterpreterNotAllowed,
    /// An interpreter whose program is not on this host.
    InterpreterNotInstalled,
    /// An interpreter registry file that cannot be read or is invalid.
    InterpreterRegistryInvalid,
    /// The command line (or a request) is invalid: an unknown flag, a missing or bad value.
    UsageInvalid,
    /// The file the result was asked to be written to cannot be written; nothing ran.
    ResultUnwritable,
}

impl ErrorKind {
    /// The snake_case name, as in JSON.
    pub fn name(self) -> &'static str {
        match self {
            ErrorKind::ProfileInvalid => "profile_invalid",
            ErrorKind::ProfileNotFound => "profile_not_found",
            ErrorKind::ProfileUnreadable => "profile_unreadable",
            ErrorKind::ProfileCycle => "profile_cycle",
            ErrorKind::ValueInvalid => "value_invalid",
            ErrorKind::UnisolatedRefused => "unisolated_refused",
            ErrorKind::BackendUnavailable => "backend_unavailable",
            ErrorKind::Degraded => "degraded",
            ErrorKind::NetworkUnsupported => "network_unsupported",
            ErrorKind::BadPath => "bad_path",
            ErrorKind::ProgramNotAllowed => "program_not_allowed",
            ErrorKind::WorkdirUnusable => "workdir_unusable",
            ErrorKind::CommandInvalid => "command_invalid",
            ErrorKind::InitNotStarted => "init_not_started",
            ErrorKind::Io => "io",
            ErrorKind::InterpreterUnknown => "interpreter_unknown",
            ErrorKind::InterpreterNotAllowed => "interpreter_not_allowed",
            ErrorKind::InterpreterNotInstalled => "interpreter_not_installed",
            ErrorKind::InterpreterRegistryInvalid => "interpreter_registry_invalid",
            ErrorKind::UsageInvalid => "usage_invalid",
            ErrorKind::ResultUnwritable => "result_unwritable",
        }
    }
}

impl PolicyError {
    /// What kind of error this is.
    pub fn kind(&self) -> ErrorKind {
        match self {
            PolicyError::Parse { .. } => ErrorKind::ProfileInvalid,
            PolicyError::UnknownProfile { .. } => ErrorKind::ProfileNotFound,
            PolicyError::Read { .. } => ErrorKind::ProfileUnreadable,
            PolicyError::ExtendsCycle { .. } => ErrorKind::ProfileCycle,
            PolicyError::Invalid { .. } => ErrorKind::ValueInvalid,
        }
    }
}

impl Error {
    /// What kind of error this is.
    pub fn kind(&self) -> ErrorKind {
        match self {
            Error::Policy(policy) => policy.kind(),
            Error::Invalid(_) => ErrorKind::ValueInvalid,
            Error::UnisolatedRefused => ErrorKind::UnisolatedRefused,
            Error::BackendUnavailable { .. } => ErrorKind::BackendUnavailable,
            Error::Degraded { .. } => ErrorKind::Degraded,
            Error::NetworkUnsupported { .. } => ErrorKind::NetworkUnsupported,
            Error::BadPath { .. } => ErrorKind::BadPath,
            Error::ProgramNotAllowed { .. } => ErrorKind::ProgramNotAllowed,
            Error::WorkdirUnusable { .. } | Error::GitUnprotectable { .. } => {
                ErrorKind::WorkdirUnusable
            }
            Error::Command(_) => ErrorKind::CommandInvalid,
            Error::Spawn { .. } => ErrorKind::InitNotStarted,
            Error::Io { .. } => ErrorKind::Io,
        }
    }

    /// Only the Linux supervisor does I/O that fails this way.
    #[cfg(target_os = "linux")]
    pub(crate) fn io(context: impl Into<String>, source: std::io::Error) -> Self {
        Error::Io {
            context: context.into(),
            cause: source,
        }
    }
}

/// The kind of a failed run's error, as the result's `error_kind`: a refusal before the run
/// started ([`ErrorKind`]) or a set-up failure reported by the init ([`SetupErrorKind`]). Either
/// serialises as its snake_case name; the two sets of names are disjoint, so a caller can
/// branch on the name alone.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[serde(untagged)]
pub enum FailureKind {
    /// The run was refused or failed before its init started.
    Refused(ErrorKind),
    /// The init could not set the sandbox up.
    Setup(SetupErrorKind),
}

impl From<ErrorKind> for FailureKind {
    fn from(kind: ErrorKind) -> Self {
        FailureKind::Refused(kind)
    }
}

impl From<SetupErrorKind> for FailureKind {
    fn from(kind: SetupErrorKind) -> Self {
        FailureKind::Setup(kind)
    }
}

/// Why the init could not set up the sandbox (a run with status `sandbox_error`): sent by the
/// init over its event pipe and reported as the result's `error` (the message) and
/// `error_kind`.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct SetupError {
    /// The setup step that failed.
    pub step: SetupStep,
    /// What went wrong, for callers that branch on it.
    pub kind: SetupErrorKind,
    /// What went wrong, for people: the object, the cause and, where known, the fix.
    pub message: String,
    /// How to fix it, where known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fix: Option<String>,
}

/// The steps of setting up a run, in the order the init takes them.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum SetupStep {
    /// The init's own start: its pipes, signals and process attributes.
    Init,
    /// Reading and checking the run's spec.
    Spec,
    /// Creating the run directory and the files in it.
    RunDir,
    /// Mapping the owner of the caller's directories to the program's user.
    Workspace,
    /// Creating or joining the run's cgroup.
    Cgroup,
    /// A new session and the terminal.
    Session,
    /// Resource limits.
    Rlimits,
    /// Dropping root to the sandbox user.
    Credentials,
    /// Creating namespaces and mapping ids.
    Namespaces,
    /// Preparing the sandbox's network for the egress gate and handing it its sockets.
    Network,
    /// Building the root filesystem.
    Rootfs,
    /// Setting the hostname.
    Hostname,
    /// Landlock rules.
    Landlock,
    /// `no_new_privs` and dropping capabilities.
    Privileges,
    /// The seccomp filter.
    Seccomp,
    /// Starting the wrapping tool (bwrap, runc, runsc, ...).
    Wrapper,
    /// Executing the program.
    Exec,
    /// Watching the run.
    Watch,
}

/// What kind of setup failure a [`SetupError`] is.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum SetupErrorKind {
    /// The spec could not be read, or names something it may not (a path outside the run
    /// directory).
    SpecInvalid,
    /// The program does not exist inside the sandbox.
    ProgramNotFound,
    /// The program exists but may not be executed (permissions, `noexec`).
    PermissionDeniedExec,
    /// Executing the program failed otherwise (not an executable, arguments too long).
    ExecFailed,
    /// The kernel refused the user namespace or its id maps.
    UserNamespacesRefused,
    /// A mount of the sandbox's filesystem failed.
    MountFailed,
    /// The run's cgroup could not be joined.
    CgroupFailed,
    /// Landlock could not be applied.
    LandlockFailed,
    /// The seccomp filter could not be built or installed.
    SeccompFailed,
    /// `no_new_privs` or dropping capabilities failed.
    PrivilegesFailed,
    /// Dropping root to the sandbox user failed.
    CredentialsFailed,
    /// A resource limit could not be set.
    RlimitFailed,
    /// The run directory could not be made.
    RunDirFailed,
    /// A caller's directory cannot be shown to the program as its own: this kernel or that
    /// filesystem has no idmapped mounts.
    WorkdirNotMappable,
    /// Layers the policy requires were not in force at exec, and degradation was not
    /// accepted.
    LayersMissing,
    /// The wrapping tool failed before it started the program.
    ToolFailedToStart,
    /// The init itself failed (a pipe, a fork, a signal) or ended without a report.
    InitFailed,
    /// The sandbox's network could not be prepared for the egress gate, or the gate could not
    /// start.
    NetworkFailed,
}

impl SetupError {
    /// A failure at `step`, of the kind that step's failures usually are.
    pub fn at(step: SetupStep, message: impl Into<String>) -> SetupError {
        SetupError {
            step,
            kind: step.usual_kind(),
            message: message.into(),
            fix: None,
        }
    }

    /// The same failure, of another kind.
    pub fn of_kind(mut self, kind: SetupErrorKind) -> SetupError {
        self.kind = kind;
        self
    }

    /// The same failure, with its fix.
    pub fn with_fix(mut self, fix: impl Into<String>) -> SetupError {
        self.fix = Some(fix.into());
        self
    }
}

impl SetupStep {
    fn usual_kind(self) -> SetupErrorKind {
        match self {
            SetupStep::Init | SetupStep::Session | SetupStep::Hostname | SetupStep::Watch => {
                SetupErrorKind::InitFailed
            }
            SetupStep::Spec => SetupErrorKind::SpecInvalid,
            SetupStep::RunDir => SetupErrorKind::RunDirFailed,
            SetupStep::Workspace => SetupErrorKind::WorkdirNotMappable,
            SetupStep::Cgroup => SetupErrorKind::CgroupFailed,
            SetupStep::Rlimits => SetupErrorKind::RlimitFailed,
            SetupStep::Credentials => SetupErrorKind::CredentialsFailed,
            SetupStep::Namespaces => SetupErrorKind::UserNamespacesRefused,
            SetupStep::Network => SetupErrorKind::NetworkFailed,
            SetupStep::Rootfs => SetupErrorKind::MountFailed,
            SetupStep::Landlock => SetupErrorKind::LandlockFailed,
            SetupStep::Privileges => SetupErrorKind::PrivilegesFailed,
            SetupStep::Seccomp => SetupErrorKind::SeccompFailed,
            SetupStep::Wrapper => SetupErrorKind::ToolFailedToStart,
            SetupStep::Exec => SetupErrorKind::ExecFailed,
        }
    }
}
