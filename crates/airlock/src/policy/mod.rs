//! The policy model: what a run may see, touch and consume. A [`Policy`] is fully resolved
//! (every value concrete); profiles on disk are partial and layer on top of a base policy.

mod builtin;
mod git;
mod network;
mod overrides;
mod profile;
pub mod units;

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

pub use builtin::{builtin, builtin_names, tier, tier_names};
pub use git::GitProtection;
pub use network::{NetworkLimits, NetworkMode, NetworkPolicy};
pub use overrides::Overrides;
pub use profile::{load_profile, parse_profile, ContainerSection, LimitsSection, ProfileFile};

pub use crate::error::InvalidValue;
use crate::layer::{IsolationLevel, Layer};
use units::{ByteSize, Seconds};

/// Which backend runs the program.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[serde(rename_all = "snake_case")]
pub enum BackendChoice {
    /// The strongest backend available on this host.
    Auto,
    /// airlock's own Linux sandbox: namespaces, Landlock, seccomp, cgroups.
    Native,
    /// The distro's bubblewrap, with airlock's seccomp filters, Tier 0 and cgroup.
    Bwrap,
    /// Tier 0 only. Needs `--dev` or the built-in `trusted` profile.
    None,
    /// gVisor's user-space kernel (`runsc`) around an OCI bundle.
    Gvisor,
    /// An OCI container run by runc or crun.
    Container,
}

/// The program that starts containers for the `container` backend.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[serde(rename_all = "snake_case")]
pub enum ContainerRuntime {
    /// The first one installed of runc, crun, podman, docker.
    #[default]
    Auto,
    /// runc driven directly with an OCI bundle.
    Runc,
    /// crun driven directly with an OCI bundle.
    Crun,
    /// `podman run --rootfs`, with per-run storage.
    Podman,
    /// `docker run` against a running Docker engine.
    Docker,
}

impl BackendChoice {
    /// How strong the named backend's boundary is; `None` for `auto`, which picks the
    /// fastest available backend at or above the policy's `min_isolation`. A caller that
    /// enforces a floor (a daemon's tenant ceiling) compares this with it.
    pub fn level(self) -> Option<IsolationLevel> {
        match self {
            BackendChoice::Auto => None,
            BackendChoice::Native | BackendChoice::Bwrap => Some(IsolationLevel::Kernel),
            BackendChoice::Container => Some(IsolationLevel::Container),
            BackendChoice::Gvisor => Some(IsolationLevel::UserKernel),
            BackendChoice::None => Some(IsolationLevel::Process),
        }
    }
}

impl ContainerRuntime {
    /// Every choice, in the order `auto` tries the concrete ones.
    pub const ALL: [ContainerRuntime; 5] = [
        ContainerRuntime::Auto,
        ContainerRuntime::Runc,
        ContainerRuntime::Crun,
        ContainerRuntime::Podman,
        ContainerRuntime::Docker,
    ];

    /// The name as written in profiles and on the command line.
    pub fn name(self) -> &'static str {
        match self {
            ContainerRuntime::Auto => "auto",
            ContainerRuntime::Runc => "runc",
            ContainerRuntime::Crun => "crun",
            ContainerRuntime::Podman => "podman",
            ContainerRuntime::Docker => "docker",
        }
    }
}

impl std::str::FromStr for ContainerRuntime {
    type Err = InvalidValue;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        ContainerRuntime::ALL
            .into_iter()
            .find(|r| r.name() == text)
            .ok_or_else(|| InvalidValue {
                key: "container.runtime",
                value: text.to_string(),
                allowed: "one of auto, runc, crun, podman, docker".into(),
            })
    }
}

/// Settings of the `container` backend.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Default)]
#[serde(deny_unknown_fields)]
pub struct ContainerPolicy {
    /// Which program starts the container.
    pub runtime: ContainerRuntime,
}

/// What happens when the program writes more than its output cap.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum OutputLimitAction {
    /// Stop the run with status `output_limit`.
    Kill,
    /// Keep running, discard the excess and flag the stream as truncated.
    Truncate,
}

/// Where a policy came from. It decides what the policy may ask for without the caller's
/// explicit opt-in: only the built-in `trusted` profile may use backend `none`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum PolicyOrigin {
    /// A built-in profile, by name (`untrusted`, `trusted`).
    Builtin(String),
    /// A profile file, by the path it was read from.
    File(PathBuf),
    /// Built or deserialized by the caller.
    #[default]
    Custom,
}

impl PolicyOrigin {
    /// Whether a policy of this origin may run without a boundary (backend `none`) without
    /// `SandboxOptions::dev`: only the built-in `trusted` profile, which exists for that.
    pub fn allows_no_boundary(&self) -> bool {
        matches!(self, PolicyOrigin::Builtin(name) if name == "trusted")
    }
}

/// A fully resolved policy.
#[derive(Serialize, Deserialize, Debug, Clone)]
#[serde(deny_unknown_fields)]
pub struct Policy {
    /// The backend to use.
    pub backend: BackendChoice,
    /// Layers that must be in force, or the run is refused (unless degradation is accepted).
    pub require: Vec<Layer>,
    /// The weakest backend level `auto` may pick.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_isolation: Option<IsolationLevel>,
    /// Filesystem rules.
    pub filesystem: FsPolicy,
    /// Network rules.
    pub network: NetworkPolicy,
    /// Environment allowlist and fixed values.
    pub env: EnvPolicy,
    /// Resource limits.
    pub limits: Limits,
    /// Identity the program runs as.
    pub user: UserPolicy,
    /// When set, only these programs may be run (matched against the command's program as
    /// given or its file name, e.g. `python3` or `/usr/bin/python3`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allowed_programs: Option<Vec<String>>,
    /// Settings of the `container` backend (absent from older profiles: all defaults).
    #[serde(default)]
    pub container: ContainerPolicy,
    /// Where the policy came from; not part of a profile.
    #[serde(skip)]
    origin: PolicyOrigin,
}

/// Two policies are equal when they allow the same things, wherever they came from.
impl PartialEq for Policy {
    fn eq(&self, other: &Policy) -> bool {
        let Policy {
            backend,
            require,
            min_isolation,
            filesystem,
            network,
            env,
            limits,
            user,
            allowed_programs,
            container,
            origin: _,
        } = self;
        *backend == other.backend
            && *require == other.require
            && *min_isolation == other.min_isolation
            && *filesystem == other.filesystem
            && *network == other.network
            && *env == other.env
            && *limits == other.limits
            && *user == other.user
            && *allowed_programs == other.allowed_programs
            && *container == other.container
    }
}

/// Filesystem rules.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct FsPolicy {
    /// Host paths visible read-only at the same path.
    pub read_only: Vec<PathBuf>,
    /// Host paths visible read-write at the same path.
    pub read_write: Vec<PathBuf>,
    /// A host directory to use as the working directory; a fresh one per run when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workdir: Option<PathBuf>,
    /// The program may read `workdir` but not write it (e.g. `--cwd`: the caller's current
    /// directory, to run a script from it).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub workdir_read_only: bool,
    /// Allow executing files from writable places (workdir, /tmp).
    pub exec_writable: bool,
    /// The caller's own directories (a `workdir` given, `read_write`) are a workspace the
    /// program fully uses: programs in them may be executed whatever `exec_writable` says,
    /// and as root their owner is shown to the program as its own user (an idmapped mount),
    /// so that what it creates belongs on the host to that owner. Off, they are mounted like
    /// scratch: for a directory airlock prepared for the sandbox user itself (a worker's job).
    #[serde(default = "workspace_by_default", skip_serializing_if = "is_true")]
    pub workspace: bool,
    /// Git metadata in the caller's writable directories (see [`GitProtection`]).
    #[serde(default, skip_serializing_if = "GitProtection::is_default")]
    pub protect_git: GitProtection,
}

fn workspace_by_default() -> bool {
    true
}

fn is_true(value: &bool) -> bool {
    *value
}

impl Default for FsPolicy {
    fn default() -> Self {
        FsPolicy {
            read_only: Vec::new(),
            read_write: Vec::new(),
            workdir: None,
            workdir_read_only: false,
            exec_writable: false,
            workspace: true,
            protect_git: GitProtection::ReadOnly,
        }
    }
}

/// Environment rules: nothing from the caller passes unless named here.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Default)]
#[serde(deny_unknown_fields)]
pub struct EnvPolicy {
    /// Names copied from the caller's environment when present.
    pub pass: Vec<String>,
    /// Fixed values; they win over `pass`.
    pub set: BTreeMap<String, String>,
}

/// Resource limits. Every run has all of them.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Limits {
    /// Memory of the whole run (cgroup), or address space per process (rlimit fallback).
    pub memory: ByteSize,
    /// CPU time of the whole run.
    pub cpu_time: Seconds,
    /// Wall-clock time from start to kill.
    pub wall_time: Seconds,
    /// Time between SIGTERM and SIGKILL when a run is stopped.
    pub grace: Seconds,
    /// Processes and threads alive at once.
    pub processes: u64,
    /// Open file descriptors per process.
    pub open_files: u64,
    /// Largest file a process may write.
    pub file_size: ByteSize,
    /// Bytes of the writable areas (workdir and /tmp) where they are sandbox-owned tmpfs.
    pub disk: ByteSize,
    /// Files the run may create in its writable areas.
    pub files: u64,
    /// Bytes of stdout kept.
    pub stdout: ByteSize,
    /// Bytes of stderr kept.
    pub stderr: ByteSize,
    /// What to do when output passes its cap.
    pub on_output_limit: OutputLimitAction,
    /// CPU cores of quota (0 = no quota).
    pub cpus: f64,
}

/// The identity of the program.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct UserPolicy {
    /// When airlock runs as root, run the program as `uid`/`gid` instead.
    pub drop_root: bool,
    /// The unprivileged uid used when dropping root.
    pub uid: u32,
    /// The unprivileged gid used when dropping root.
    pub gid: u32,
}

impl Policy {
    /// Checks every value for sanity; the error names the key, the value and the fix.
    pub fn validate(&self) -> Result<(), InvalidValue> {
        let l = &self.limits;
        check(
            l.memory.0 >= 16 << 20,
            "limits.memory",
            &l.memory,
            "at least 16MiB: interpreters need that much to start",
        )?;
        check(
            !l.wall_time.0.is_zero(),
            "limits.wall_time",
            &l.wall_time,
            "a duration above zero, e.g. 30s",
        )?;
        check(
            !l.cpu_time.0.is_zero(),
            "limits.cpu_time",
            &l.cpu_time,
            "a duration above zero, e.g. 10s",
        )?;
        check(
            l.processes >= MIN_PROCESSES,
            "limits.processes",
            &l.processes,
            "at least 3: the sandbox itself needs processes under this limit (the native \
             sandbox's namespace holder and its PID 1 besides the program)",
        )?;
        check(
            l.open_files >= 16,
            "limits.open_files",
            &l.open_files,
            "at least 16: stdio and an interpreter need that many",
        )?;
        check(
            l.file_size.0 >= MIN_FILE_SIZE,
            "limits.file_size",
            &l.file_size,
            "at least 64KiB: the sandbox writes its own set-up files under this limit \
             (/etc/passwd, /etc/hosts, a wrapping tool's bundle and status)",
        )?;
        for (key, value) in [
            ("limits.wall_time", l.wall_time),
            ("limits.cpu_time", l.cpu_time),
        ] {
            check(
                value.0 <= MAX_DURATION,
                key,
                &value,
                "at most 365d: longer is a mistake of units (ms for s?), not a limit",
            )?;
        }
        check(
            l.grace.0 <= MAX_GRACE,
            "limits.grace",
            &l.grace,
            "at most 1h between SIGTERM and SIGKILL",
        )?;
        check(l.files >= 16, "limits.files", &l.files, "at least 16")?;
        check(l.disk.0 >= 1 << 20, "limits.disk", &l.disk, "at least 1MiB")?;
        check(
            l.cpus >= 0.0 && l.cpus.is_finite(),
            "limits.cpus",
            &l.cpus,
            "a number of cores >= 0, e.g. 0.5 (0 = no quota)",
        )?;
        for path in self
            .filesystem
            .read_only
            .iter()
            .chain(&self.filesystem.read_write)
        {
            check(
                path.is_absolute(),
                "filesystem paths",
                &path.display(),
                "absolute paths (start with /)",
            )?;
        }
        for name in self.env.pass.iter().chain(self.env.set.keys()) {
            check(
                valid_env_name(name),
                "env",
                name,
                "a variable name without '=' or NUL",
            )?;
        }
        self.network.validate()
    }

    /// Where the policy came from.
    pub fn origin(&self) -> &PolicyOrigin {
        &self.origin
    }

    /// The same policy, marked as coming from `origin`.
    pub(crate) fn with_origin(mut self, origin: PolicyOrigin) -> Policy {
        self.origin = origin;
        self
    }

    /// True when the program gets the host's network, unfiltered (`network.mode = "host"`).
    /// An allowlist or report run keeps a network namespace of its own: see
    /// [`NetworkMode::is_gated`].
    pub fn has_network(&self) -> bool {
        self.network.mode == NetworkMode::Host
    }

    /// Whether the policy lets `program` (`argv[0]` as given) run.
    pub fn allows_program(&self, program: &str) -> bool {
        let Some(allowed) = &self.allowed_programs else {
            return true;
        };
        let file_name = std::path::Path::new(program)
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or(program);
        allowed
            .iter()
            .any(|entry| entry == program || entry == file_name)
    }

    /// Serialises the policy as a complete TOML profile.
    pub fn to_toml(&self) -> String {
        toml::to_string(self).unwrap_or_else(|e| format!("# cannot render policy: {e}\n"))
    }
}

impl Limits {
    /// The size and file caps of `/dev/shm`: a smaller share of the disk and file limits,
    /// since shared memory is for buffers, not files.
    pub fn shm_caps(&self) -> (u64, u64) {
        (self.disk.0.min(64 << 20), self.files.min(1024))
    }
}

/// The fewest processes a run can work with: the native sandbox's namespace holder, its PID 1
/// and the program (a wrapping tool may need more, see its backend).
pub const MIN_PROCESSES: u64 = 3;
/// The smallest file-size limit the sandbox's own set-up files fit under.
pub const MIN_FILE_SIZE: u64 = 64 << 10;
/// The longest wall-clock or CPU-time limit.
pub const MAX_DURATION: std::time::Duration = std::time::Duration::from_secs(365 * 24 * 3600);
/// The longest grace period.
pub const MAX_GRACE: std::time::Duration = std::time::Duration::from_secs(3600);

fn valid_env_name(name: &str) -> bool {
    !name.is_empty() && !name.contains('=') && !name.contains('\0')
}

fn check(
    ok: bool,
    key: &'static str,
    value: &dyn std::fmt::Display,
    allowed: &str,
) -> Result<(), InvalidValue> {
    if ok {
        return Ok(());
    }
    Err(InvalidValue {
        key,
        value: value.to_string(),
        allowed: allowed.to_string(),
    })
}
