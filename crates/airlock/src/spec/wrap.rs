//! How the init starts the program through an external sandbox tool (bwrap, runc, crun,
//! podman, docker, runsc): the tool's command line, what it enforces, and an ordered list of
//! [`WrapStep`]s, each a thing the init does for the tool at one moment of the run. A new
//! tool is a plan in its backend file built from these steps; a new quirk is one new step
//! kind, applied in one place of the init (`init::wrapped`).

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::confine::seccomp::SeccompConfig;
use crate::layer::Layer;
use crate::rundir::RunFile;

/// A wrapped run: after Tier 0 the init takes the steps, then execs `wrapper_argv` followed by
/// the program's argv (unless the argv is in the tool's files).
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Default)]
pub struct WrapSpec {
    /// The tool's full argv up to (not including) the program's argv; argv[0] is absolute.
    pub wrapper_argv: Vec<String>,
    /// The program's argv is already in the tool's files (an OCI config): exec `wrapper_argv`
    /// alone.
    #[serde(default)]
    pub argv_in_files: bool,
    /// Layers the tool enforces with these arguments. Reported as in force once the tool has
    /// started; the conformance suite is what proves each claim.
    pub layers: Vec<Layer>,
    /// Gaps in this run's enforcement, reported as warnings of the run.
    #[serde(default)]
    pub notes: Vec<String>,
    /// What the backend chose for this run (the runtime, the platform, a host workaround):
    /// facts for the result's `details`, not warnings, since nothing is weaker for them.
    #[serde(default)]
    pub details: Vec<String>,
    /// What the init does for the tool, in order within each moment of the run.
    #[serde(default)]
    pub steps: Vec<WrapStep>,
}

/// One thing the init does for a wrapping tool. Grouped by when it happens.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
#[serde(rename_all = "snake_case")]
pub enum WrapStep {
    // Before the program's process is forked, in the run directory:
    /// Writes a file the tool reads (an OCI bundle's config.json, bwrap's /etc files); only
    /// ever inside the run directory.
    WriteFile(RunFile),
    /// Covers a host file the tool must see empty, in the init's own mount namespace (which
    /// only an in-memory run directory gives it; otherwise the tool's argv does it, see
    /// `backend::hide_files_with_unshare`).
    HideFile(HiddenFile),
    /// Leaves the run cgroup's pids limit unset: the tool's own helper processes would count
    /// against it (gVisor's ptrace stubs); the tool must enforce the limit another way.
    NoCgroupPidsLimit,

    // In the program's process, before the tool is executed:
    /// Keeps root instead of dropping to the policy's uid (tools that need root to set up,
    /// like rootful runc; the tool itself then runs the program unprivileged).
    KeepRoot,
    /// The tool applies the program's rlimits itself (from its config): the init lowers only
    /// RLIMIT_CORE and RLIMIT_CPU on the tool, which may need more descriptors than the
    /// program.
    RlimitsByTool,
    /// Sets no_new_privs before exec (never for setuid tools).
    NoNewPrivs,
    /// Places our seccomp filters (allowlist first) at these descriptors as raw `struct
    /// sock_filter` arrays, for tools that take `--add-seccomp-fd N`.
    SeccompFds {
        config: SeccompConfig,
        fds: Vec<i32>,
    },
    /// Sets a variable for the tool alone, on top of the program's environment. Only for
    /// tools that give the program its environment from their own files (OCI runtimes read
    /// it from config.json), so nothing set here reaches the program.
    ToolEnv { name: String, value: String },
    /// Gives the tool a status pipe at this descriptor (bwrap's `--json-status-fd`): a status
    /// without an `exit-code` document means the tool failed before the program ran, which
    /// the init reports as a setup failure instead of the program's exit.
    StatusFd(i32),
    /// Without a cgroup, caps the processes with RLIMIT_NPROC set inside a user namespace of
    /// the process's own (made here unless `EgressNamespace` made one), created before the
    /// limit is lowered. Why: RLIMIT_NPROC counts every process of the uid in the namespace
    /// where the limit applies and in those above it, up to the limit its creator had; set
    /// before the tool's namespace, it counted all of the caller's own processes on the host,
    /// so a user with more processes than `limits.processes` could not start the tool at all
    /// (bwrap: "Creating new namespace failed: Resource temporarily unavailable"). Never for a
    /// setuid tool (a setuid binary gains nothing inside a user namespace).
    ProcessCapInOwnUserNamespace,
    /// Checks, just before the tool is executed, that what protect_git found is still there
    /// (`Found::reopen`), refusing the run otherwise. Only for tools that bind by path and
    /// whose mounts the init cannot prepare (docker's daemon, a runtime without root): it
    /// narrows the race with another program sharing the workspace to the tool's own
    /// set-up, it does not close it.
    CheckFound(Vec<crate::confine::found::Found>),
    /// Moves the tool's process into a mount namespace of its own (private: nothing reaches
    /// the host) and there binds each of protect_git's objects onto `staging/N` (N its index
    /// in `binds`): each opened again below its writable root and checked to be the same
    /// object (`Found::reopen`), then bound from that descriptor. `staging` is a directory
    /// the init makes in the run directory, where no other program can swap anything, and
    /// the tool binds from there (`OciMounts::git_sources`): a path in the workspace swapped
    /// for a symlink by another program sharing it cannot redirect the source any more. A
    /// changed object refuses the run before the tool starts.
    BindFoundPrivately {
        binds: Vec<GitBind>,
        staging: PathBuf,
    },
    /// Opens what protect_git found again below its writable root, checks each is the same
    /// object (`Found::reopen`), and places them from `first` on, inheritable, for the
    /// tool to bind from (bwrap's `--bind-fd`/`--ro-bind-fd`); a changed one refuses the run.
    FoundFds {
        found: Vec<crate::confine::found::Found>,
        first: i32,
    },
    /// Makes the network namespace the tool inherits for the egress gate, configures it and
    /// sends the gate its sockets (see `InitSpec::egress`): the tool then keeps the current
    /// namespace (bwrap `--share-net`, no OCI network namespace, runsc and podman
    /// `--network=host`), which is the prepared one. With `own_user_namespace` the namespace
    /// belongs to a new user namespace mapping only the process's own ids (for a tool run
    /// without root, such as bwrap after the uid drop); without it, to the init's (a tool that
    /// keeps root: the container's user namespace, made by the tool, cannot change it).
    EgressNamespace { own_user_namespace: bool },
    /// Starts the tool with a descriptor table already large: its processes are threaded and
    /// open hundreds of descriptors (runsc's sandbox and gofer), and growing a table that
    /// threads share waits for an RCU grace period (about 10 ms here) each time (see
    /// `init::wrapped::hold_presized_fd_table`).
    PresizeFdTable,
    /// The tool daemonizes helpers that nothing ties to the init (podman's conmon and the
    /// container under it): the init's child stays behind as the tool's parent, a child
    /// subreaper that mirrors the tool's exit and, should the init die, kills every process
    /// under it (see `init::wrapped`).
    GuardToolTree,

    // After the program's end:
    /// Counts the run's members in one hierarchy's list, as for a native run, instead of in
    /// every hierarchy's (five on v1): the tool makes no cgroup of its own and its processes
    /// cannot move themselves (bwrap: it runs as the sandbox user, the cgroup files are
    /// root's, and the sandbox has no /sys), so each stays in the run cgroup of every
    /// hierarchy. Saves four kernfs opens and member-list builds per check on the way out;
    /// a member kept in another hierarchy would still be found by the removal
    /// (`RunCgroup::members`).
    MembersStayInRunCgroup,

    // After the run:
    /// For tools without a status stream (the OCI runtimes): what shows that the tool
    /// started the program. Without it, a tool that exited before starting the program would
    /// pass its own exit code (usually 1) off as the program's.
    CheckStarted(StartEvidence),
    /// Removes a directory the tool may leave behind (e.g. its cgroups in hierarchies airlock
    /// does not use), with `rmdir` in order after the process tree is dead and accounting is
    /// read: never recursively, so only an empty one goes.
    RemoveDir(PathBuf),
}

impl WrapSpec {
    /// Whether the plan has this step (for steps without data).
    pub fn has(&self, step: &WrapStep) -> bool {
        self.steps.contains(step)
    }

    /// The files the init writes for the tool.
    pub fn files(&self) -> impl Iterator<Item = &RunFile> {
        self.steps.iter().filter_map(|step| match step {
            WrapStep::WriteFile(file) => Some(file),
            _ => None,
        })
    }

    /// The host files the init hides from the tool.
    pub fn hidden_files(&self) -> impl Iterator<Item = &HiddenFile> {
        self.steps.iter().filter_map(|step| match step {
            WrapStep::HideFile(file) => Some(file),
            _ => None,
        })
    }

    /// Our seccomp filters for the tool, and the descriptors they go to.
    pub fn seccomp_fds(&self) -> Option<(&SeccompConfig, &[i32])> {
        self.steps.iter().find_map(|step| match step {
            WrapStep::SeccompFds { config, fds } => Some((config, fds.as_slice())),
            _ => None,
        })
    }

    /// The descriptor of the tool's status pipe.
    pub fn status_fd(&self) -> Option<i32> {
        self.steps.iter().find_map(|step| match step {
            WrapStep::StatusFd(fd) => Some(*fd),
            _ => None,
        })
    }

    /// What shows that the tool started the program.
    pub fn start_evidence(&self) -> Option<&StartEvidence> {
        self.steps.iter().find_map(|step| match step {
            WrapStep::CheckStarted(evidence) => Some(evidence),
            _ => None,
        })
    }
}

/// One of protect_git's binds made by the init for the tool ([`WrapStep::BindFoundPrivately`]).
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct GitBind {
    pub found: crate::confine::found::Found,
    /// Git metadata (read-only), or a directory holding a nested repository (pinned: as
    /// writable as the path holding it, only its name is held).
    pub read_only: bool,
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
