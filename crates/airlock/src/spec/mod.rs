//! What the supervisor hands the init (`airlock __init`) over a pipe, and what the init
//! reports back. Plain data: the policy has been resolved and checked on the host side.

use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::confine::Credentials;
use crate::error::{SetupError, SetupStep};
use crate::layer::Layer;
use crate::result::RunStatus;
use crate::rundir::MemoryScratch;

pub mod fds;
pub mod shared_root;
mod wrap;

pub use wrap::{GitBind, HiddenFile, StartEvidence, WrapSpec, WrapStep};

pub use fds::{CONTROL_FD, EVENTS_FD, GATE_FD, GO_FD};

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
    /// Files to write into the fresh workdir before the program starts (native backend).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub files: Vec<StagedFile>,
    /// A prepared (warm) sandbox: everything is set up, then PID 1 waits for a [`WarmGo`]
    /// (the command, relayed by the init from the control pipe) instead of using `argv`.
    #[serde(default)]
    pub warm: bool,
    /// A warm sandbox whose program (`argv`: an interpreter with what it preloads) starts
    /// ahead too, and then waits on its stdin for the code to run.
    #[serde(default)]
    pub warm_prestart: bool,
    /// A warm native sandbox whose root is a copy of its pool's shared root: the init holds
    /// that root's user and mount namespaces at [`fds::SHARED_ROOT_FDS`], its child enters
    /// them before it makes the sandbox's own, and PID 1 mounts only what is the run's own
    /// (`rootfs::enter_shared`).
    #[serde(default)]
    pub shared_root: bool,
    /// The caller's paths (workdir, read-write paths) whose owner the program is shown as,
    /// through idmapped mounts the init makes in its own mount namespace.
    #[serde(default)]
    pub mapped: Vec<crate::confine::idmap::MappedPath>,
    /// What the sandbox's network namespace holds for the egress gate (network `allowlist`
    /// or `report`): the setup configures it and sends the gate's sockets on [`GATE_FD`].
    #[serde(default)]
    pub egress: Option<airlock_egress::SandboxPlan>,
}

/// A file the sandbox's PID 1 writes into the workdir before the program starts.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct StagedFile {
    /// Relative to the workdir, without `..`; parent directories are created.
    pub path: PathBuf,
    pub contents: Vec<u8>,
    /// Permission bits (e.g. `0o644`).
    pub mode: u32,
}

impl StagedFile {
    /// A relative path of plain components: it cannot leave the workdir.
    pub fn has_plain_path(&self) -> bool {
        use std::path::Component;
        let mut parts = self.path.components().peekable();
        parts.peek().is_some() && parts.all(|c| matches!(c, Component::Normal(_)))
    }
}

/// The control line with which the supervisor tells a warm init that its run has started
/// (the command went to PID 1, or the code to the started interpreter).
pub const WARM_STARTED_LINE: &[u8] = b"\"started\"\n";

/// The argument after `__init` that makes the airlock binary a warm pool's init spawner (it
/// forks the pool's inits instead of the pool executing one each: `init::spawner`).
pub const SPAWNER_ARG: &str = "spawner";

/// The argument after `__init` that makes the airlock binary build a warm pool's shared root
/// (`init::shared_root`) and hand its namespaces back.
pub const SHARED_ROOT_ARG: &str = "shared-root";

/// Refuses staged files whose paths could leave the workdir.
pub fn check_staged_files(files: &[StagedFile]) -> Result<(), crate::error::Error> {
    match files.iter().find(|file| !file.has_plain_path()) {
        Some(file) => Err(crate::error::Error::Command(format!(
            "staged file {} must be a relative path without `..`",
            file.path.display()
        ))),
        None => Ok(()),
    }
}

/// The part of a run a prepared sandbox learns last: written by the supervisor, once the init
/// reported [`InitEvent::Ready`], into the command pipe that the sandbox's PID 1 reads.
#[derive(Serialize, Deserialize, Debug, Clone, Default)]
pub struct WarmGo {
    pub argv: Vec<String>,
    pub env: Vec<(String, String)>,
    #[serde(default)]
    pub files: Vec<StagedFile>,
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

impl Confinement {
    /// Whether every process of the run stays in the run cgroup of each hierarchy, so that
    /// one hierarchy's list holds them all: the native sandbox's (which sees no cgroup file)
    /// and a tool's with [`WrapStep::MembersStayInRunCgroup`].
    pub fn members_stay_in_run_cgroup(&self) -> bool {
        match self {
            #[cfg(target_os = "linux")]
            Confinement::Native(_) => true,
            Confinement::Wrapped(wrap) => wrap.has(&WrapStep::MembersStayInRunCgroup),
            Confinement::Tier0 => false,
        }
    }
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
    /// The run is over and everything it left behind is gone (a warm run: the program and
    /// every process of the run have ended; the init tears the sandbox down after sending it).
    Finished(Outcome),
    /// A prepared sandbox is set up and waits for its [`WarmGo`].
    Ready,
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
