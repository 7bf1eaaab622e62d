//! What the supervisor hands the init (`airlock __init`) over a pipe, and what the init
//! reports back. Plain data: the policy has been resolved and checked on the host side.

use std::os::fd::RawFd;
use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::confine::Credentials;
use crate::error::{SetupError, SetupStep};
use crate::layer::Layer;
use crate::result::RunStatus;
use crate::rundir::{MemoryScratch, RunFile};

/// The control pipe's descriptor in the init: the spec (when the init was executed rather than
/// forked with it in memory), then one [`StopReason`] per line; EOF means the supervisor died.
pub const CONTROL_FD: RawFd = 3;
/// The event pipe's descriptor in the init: one [`InitEvent`] per line.
pub const EVENTS_FD: RawFd = 4;

/// What every run without a boundary (backend `none`) warns about.
pub const TIER0_WARNING: &str =
    "backend none: Tier 0 only, the program can read the host filesystem and use the network";

/// Everything the init needs to start and watch one run.
#[derive(Serialize, Deserialize, Debug, Clone)]
pub struct InitSpec {
    /// argv of the program; argv[0] is resolved against the `PATH` in `env` inside the sandbox.
    pub argv: Vec<String>,
    /// The complete environment of the program.
    pub env: Vec<(String, String)>,
    /// The per-run directory the init creates and removes (unless `keep`).
    pub run_dir: PathBuf,
    /// The program's working directory (the same path inside and outside the sandbox).
    pub workdir: PathBuf,
    /// The workdir is the caller's own directory: never create or remove it.
    pub workdir_is_callers: bool,
    /// Keep the run directory after the run.
    pub keep: bool,
    /// Limits enforced by rlimits and the init's clocks.
    pub limits: SpecLimits,
    /// Drop root to this uid/gid.
    pub credentials: Option<Credentials>,
    /// The per-run cgroup to create, if any.
    #[cfg(target_os = "linux")]
    pub cgroup: Option<CgroupRequest>,
    /// The boundary the backend asks for.
    pub confinement: Confinement,
    /// Layers that must be in force before exec; the init refuses to exec otherwise.
    pub require: Vec<Layer>,
    /// Run anyway when a required layer is missing.
    pub allow_degraded: bool,
    /// Required layers the supervisor already found missing and reported with the reason
    /// (the degradation the caller accepted); the init warns only about others.
    #[serde(default)]
    pub accepted_missing: Vec<Layer>,
    /// Give the program the caller's terminal as its controlling terminal.
    pub tty: bool,
    /// Keep the run directory in memory, in the init's own mount namespace (see
    /// [`MemoryScratch`]); `None` puts it on the host's runtime directory.
    #[serde(default)]
    pub scratch: Option<MemoryScratch>,
}

/// Limits the init enforces itself.
#[derive(Serialize, Deserialize, Debug, Clone)]
pub struct SpecLimits {
    pub memory_bytes: u64,
    pub cpu_time: Duration,
    pub wall_time: Duration,
    pub grace: Duration,
    pub processes: u64,
    pub open_files: u64,
    pub file_size_bytes: u64,
    pub disk_bytes: u64,
    pub files: u64,
    pub cpus: f64,
}

/// Where and with which limits to create the run's cgroup.
#[cfg(target_os = "linux")]
#[derive(Serialize, Deserialize, Debug, Clone)]
pub struct CgroupRequest {
    pub config: crate::confine::cgroup::CgroupConfig,
    pub run_id: String,
    pub limits: crate::confine::cgroup::CgroupLimits,
}

/// The boundary around the program, chosen by the backend.
#[derive(Serialize, Deserialize, Debug, Clone)]
#[allow(clippy::large_enum_variant)]
pub enum Confinement {
    /// Tier 0 only.
    Tier0,
    /// The native Linux sandbox.
    #[cfg(target_os = "linux")]
    Native(NativeSpec),
    /// An external sandbox tool (bwrap, runsc, runc, ...) wraps the program.
    Wrapped(WrapSpec),
}

/// How to start the program through an external sandbox tool. The init applies Tier 0, writes
/// `files`, optionally hands the tool our seccomp filters as descriptors, then execs
/// `tool_argv` followed by the program's argv.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Default)]
pub struct WrapSpec {
    /// The tool's full argv up to (not including) the program's argv; argv[0] is absolute.
    pub tool_argv: Vec<String>,
    /// Files the init writes before the run (absolute paths inside the run directory), e.g.
    /// an OCI bundle's config.json.
    pub files: Vec<RunFile>,
    /// Descriptor numbers at which the init places our seccomp filters (allowlist first), as
    /// raw `struct sock_filter` arrays, for tools that take `--add-seccomp-fd N`.
    pub seccomp_fds: Vec<i32>,
    /// The seccomp configuration for those filters.
    pub seccomp: Option<crate::confine::seccomp::SeccompConfig>,
    /// Keep root instead of dropping to the policy's uid (tools that need root to set up,
    /// like rootful runc; the tool itself then runs the program unprivileged).
    pub keep_root: bool,
    /// Set no_new_privs before exec (must be false for setuid tools).
    pub no_new_privs: bool,
    /// Layers the tool enforces with these arguments. Reported as in force once the tool has
    /// started; the conformance suite is what proves each claim.
    pub layers: Vec<crate::layer::Layer>,
    /// The program's argv is already in `files` (an OCI config): exec `tool_argv` alone.
    #[serde(default)]
    pub argv_in_files: bool,
    /// The tool applies the program's rlimits itself (from its config); the init lowers only
    /// RLIMIT_CORE and RLIMIT_CPU on the tool, which may need more descriptors than the program.
    #[serde(default)]
    pub rlimits_by_tool: bool,
    /// Leave the run cgroup's pids limit unset: the tool's own helper processes would count
    /// against it (gVisor's ptrace stubs); the tool must enforce the limit another way.
    #[serde(default)]
    pub no_cgroup_pids_limit: bool,
    /// Gaps in this run's enforcement, reported as warnings of the run.
    #[serde(default)]
    pub notes: Vec<String>,
    /// What the backend chose for this run (the runtime, the platform, a host workaround):
    /// facts for the result's `details`, not warnings, since nothing is weaker for them.
    #[serde(default)]
    pub details: Vec<String>,
    /// Directories the tool may leave behind (e.g. its cgroups in hierarchies airlock does not
    /// use, when it was killed or kept its container), removed with `rmdir` in order after the
    /// process tree is dead and accounting is read: never recursively, so only empty ones go.
    #[serde(default)]
    pub cleanup_dirs: Vec<PathBuf>,
    /// The descriptor at which the tool writes its JSON status (bwrap's `--json-status-fd`).
    /// A status without an `exit-code` document means the tool failed before the program ran,
    /// which the init reports as a setup failure instead of the program's exit.
    #[serde(default)]
    pub status_fd: Option<i32>,
    /// For tools without a status stream (the OCI runtimes): what shows that the tool started
    /// the program. Without it, a tool that exited before starting the program would pass
    /// its own exit code (usually 1) off as the program's.
    #[serde(default)]
    pub start_evidence: Option<StartEvidence>,
    /// The tool daemonizes helpers that nothing ties to the init (podman's conmon and the
    /// container under it): the init's child stays behind as the tool's parent, a child
    /// subreaper that mirrors the tool's exit and, should the init die, kills every process
    /// under it (see `init::wrapped`).
    #[serde(default)]
    pub guard_tool_tree: bool,
    /// The tool's processes are threaded and open hundreds of descriptors (runsc's sandbox and
    /// gofer): start them with a descriptor table already that large (see
    /// `init::wrapped::hold_presized_fd_table`), because growing a table that threads share waits
    /// for an RCU grace period (about 10 ms here) each time.
    #[serde(default)]
    pub presize_fd_table: bool,
    /// Host files the tool must see empty. The init covers each in its own mount namespace
    /// before starting the tool; planned only for an in-memory run directory, which gives the
    /// init that namespace (otherwise the tool's argv does it, see
    /// `backend::hide_files_with_unshare`).
    #[serde(default)]
    pub hidden_files: Vec<HiddenFile>,
}

/// A host file covered, read-only, by an empty file the init wrote in the run directory: crun
/// 1.8 refuses a hybrid cgroup layout whose v2 mount lists controllers, and runs like runc when
/// `cgroup.controllers` reads empty.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct HiddenFile {
    pub target: PathBuf,
    /// An empty file inside the run directory.
    pub empty: PathBuf,
}

/// How the init tells a program that exited from a tool that failed before starting it.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct StartEvidence {
    /// The tool's name, for the error.
    pub tool: String,
    /// The `--pid-file` the tool writes once the container's process exists: runc and crun
    /// write it after the program was exec'd, runsc once the sandbox is created (before it
    /// loads the program). No file after the tool exited means the program never ran.
    pub pid_file: PathBuf,
    /// A log the tool reports its own failures in, and the text that marks one: runsc fails
    /// after writing its pid file when the sandbox cannot start the program (e.g. it does not
    /// exist), and says so only there and on stderr.
    pub failure_log: Option<(PathBuf, String)>,
}

/// The native backend's plan: namespaces, root filesystem, Landlock and seccomp.
#[cfg(target_os = "linux")]
#[derive(Serialize, Deserialize, Debug, Clone)]
pub struct NativeSpec {
    pub new_net: bool,
    pub hostname: String,
    pub rootfs: crate::confine::rootfs::RootfsPlan,
    pub landlock: crate::confine::landlock::LandlockRules,
    pub seccomp: crate::confine::seccomp::SeccompConfig,
}

/// A message from the init to the supervisor, one JSON object per line.
#[derive(Serialize, Deserialize, Debug, Clone)]
#[serde(tag = "event", rename_all = "snake_case")]
pub enum InitEvent {
    /// The program was exec'd with these layers in force.
    Started {
        layers: Vec<Layer>,
        warnings: Vec<String>,
        workdir: PathBuf,
    },
    /// Setup failed before the program ran.
    SetupFailed {
        #[serde(deserialize_with = "setup_error_or_text")]
        error: SetupError,
    },
    /// The run is over and everything it left behind is gone.
    Finished(Outcome),
}

/// How the run ended, as the init saw it.
#[derive(Serialize, Deserialize, Debug, Clone)]
pub struct Outcome {
    pub status: RunStatus,
    pub exit_code: Option<i32>,
    pub signal: Option<i32>,
    pub cpu_user_ms: u64,
    pub cpu_sys_ms: u64,
    pub peak_memory_bytes: Option<u64>,
    pub warnings: Vec<String>,
}

/// A command from the supervisor to the init, one per line on the control pipe.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum StopReason {
    /// The caller cancelled the run.
    Cancelled,
    /// Output passed its cap.
    OutputLimit,
}

/// A setup error, or the plain text an init from before typed errors sends (an `AIRLOCK_INIT`
/// binary of another version), read as a failure of the init's own.
fn setup_error_or_text<'de, D: serde::Deserializer<'de>>(
    deserializer: D,
) -> Result<SetupError, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Wire {
        Typed(SetupError),
        Text(String),
    }
    Ok(match Wire::deserialize(deserializer)? {
        Wire::Typed(error) => error,
        Wire::Text(message) => SetupError::at(SetupStep::Init, message),
    })
}
