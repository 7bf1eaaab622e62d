//! The isolation layers a run can have in force, and the strength levels of backends.

use serde::{Deserialize, Serialize};

/// One defence that was (or must be) in force for a run. A run's result lists only layers the
/// init actually applied, never ones that were merely requested.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum Layer {
    /// The environment was cleared and rebuilt from the allowlist.
    EnvScrub,
    /// Every inherited descriptor beyond stdin, stdout and stderr was closed.
    FdClose,
    /// The program runs in a new session without a controlling terminal.
    NewSession,
    /// Resource rlimits (address space, CPU, processes, files, file size, core) were set.
    Rlimits,
    /// A fresh private working directory was the program's cwd.
    Workdir,
    /// Root was dropped to an unprivileged uid/gid.
    UidDrop,
    /// The supervisor's own process-tree tracking (subreaper) kills every descendant.
    TreeKill,
    /// A per-run cgroup enforced memory, pids and CPU limits and accounting.
    Cgroup,
    /// A new user namespace mapping only an unprivileged uid.
    UserNs,
    /// A new mount namespace.
    MountNs,
    /// A new PID namespace with airlock's init as PID 1.
    PidNs,
    /// A new, empty network namespace.
    NetNs,
    /// The network namespace's only way out is airlock's egress gate (network `allowlist` or
    /// `report`): DNS is answered by the gate, every connection is checked against the rules,
    /// tied to its name, counted and recorded.
    EgressGate,
    /// A new IPC namespace.
    IpcNs,
    /// A new UTS namespace with a fixed hostname.
    UtsNs,
    /// A new cgroup namespace.
    CgroupNs,
    /// A root filesystem built from scratch with read-only system binds.
    Rootfs,
    /// Every writable area the sandbox creates (workdir, /tmp, /dev/shm) is a size-capped tmpfs.
    DiskQuota,
    /// The same areas cap the number of files (tmpfs `nr_inodes`).
    InodeQuota,
    /// Every git repository in the caller's writable directories (workdir, `read_write`) has
    /// its `.git` and the git directories it points to bound read-only, so the program cannot
    /// plant hooks or config that git would run on the host (`filesystem.protect_git`).
    GitReadOnly,
    /// Landlock filesystem rules.
    LandlockFs,
    /// Landlock TCP bind/connect denial.
    LandlockNet,
    /// Landlock scoping of abstract unix sockets and signals.
    LandlockScope,
    /// A seccomp-bpf syscall allowlist.
    Seccomp,
    /// `no_new_privs`: setuid binaries and file capabilities grant nothing.
    NoNewPrivs,
    /// Every capability set emptied before exec.
    CapsDropped,
}

impl Layer {
    /// The namespaces every boundary backend creates apart from the network one, which
    /// depends on whether the policy allows the network.
    pub const NAMESPACES_BUT_NET: [Layer; 6] = [
        Layer::UserNs,
        Layer::MountNs,
        Layer::PidNs,
        Layer::IpcNs,
        Layer::UtsNs,
        Layer::CgroupNs,
    ];
}

/// How strong a backend's boundary is, weakest first.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[serde(rename_all = "kebab-case")]
pub enum IsolationLevel {
    /// Tier 0 only: limits and hygiene, no boundary.
    Process,
    /// A shared kernel behind namespaces, Landlock and seccomp.
    Kernel,
    /// An OCI container runtime.
    Container,
    /// Syscalls served by a user-space kernel (gVisor).
    UserKernel,
    /// A virtual machine.
    Vm,
}

/// The snake_case names of layers, comma-separated, as in JSON.
pub(crate) fn names(layers: &[Layer]) -> String {
    let names: Vec<String> = layers.iter().map(|l| layer_name(*l)).collect();
    names.join(", ")
}

/// The snake_case name of a layer, as in JSON.
pub fn layer_name(layer: Layer) -> String {
    serde_name(&layer)
}

/// The name of an enum value as serde writes it (JSON, profiles): `user_ns`, `user-kernel`.
pub(crate) fn serde_name<T: Serialize + std::fmt::Debug>(value: &T) -> String {
    serde_json::to_value(value)
        .ok()
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_else(|| format!("{value:?}"))
}
