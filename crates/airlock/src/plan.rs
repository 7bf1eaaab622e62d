//! What a run will be, decided before anything starts: the answer of [`Command::plan`]
//! (`airlock run --dry-run`), and the first half of every real run, which executes exactly
//! this plan. Planning creates nothing: no run directory, no cgroup, no process.
//!
//! [`Command::plan`]: crate::Command::plan

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::error::Error;
use crate::layer::{IsolationLevel, Layer};
use crate::policy::{Limits, NetworkMode};

/// The plan of one run.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct Plan {
    /// The backend that will run the program.
    pub backend: String,
    /// Why that backend: named by the policy, or what `auto` picked and passed over.
    pub backend_reason: String,
    /// How strong that backend's boundary is.
    pub isolation_level: IsolationLevel,
    /// The program and its arguments.
    pub argv: Vec<String>,
    /// The layers that will be in force, as this host was probed; the result lists the ones
    /// the init actually applied. The cgroup depends on the host at start: see `cgroup`.
    pub layers: Vec<Layer>,
    /// The layers this run must have (the profile's list, grown by what its limits promise
    /// and narrowed by explicit choices such as the host network).
    pub required: Vec<Layer>,
    /// Required layers this run will not have.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub missing: Vec<Layer>,
    /// Why they are missing, with the fix.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub missing_reason: Option<String>,
    /// Whether the run goes ahead.
    pub verdict: Verdict,
    /// The network the program gets.
    pub network: NetworkMode,
    /// The egress gate, for network `allowlist` or `report`: its rules, resolver and limits,
    /// and what the sandbox gets (the captured ports, the DNS stub, the proxy endpoint).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub egress: Option<PlannedEgress>,
    /// The host Unix sockets the program sees (`network.unix_sockets`, expanded), each at the
    /// same path; no other host socket is reachable.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unix_sockets: Vec<PathBuf>,
    /// The program's working directory (the same path inside and outside).
    pub workdir: PathBuf,
    /// Whose that directory is.
    pub workdir_kind: WorkdirKind,
    /// The run's own directory (see `airlock::rundir`).
    pub run_dir: PathBuf,
    /// The run directory lives in memory, in the init's own mount namespace: every writable
    /// area is a capped tmpfs and nothing reaches the host's disk.
    pub run_dir_in_memory: bool,
    /// What the program sees of the filesystem, besides `/proc`, `/dev` and the generated
    /// `/etc` files. Empty for backend `none`, where it sees the host's.
    pub mounts: Vec<PlannedMount>,
    /// The limits of the run.
    pub limits: Limits,
    /// The run's cgroup (`<parent>/<run id>`), made by the init at start; `None` when cgroups
    /// are off. Where none can be made, rlimits stand in and the result says so.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cgroup: Option<String>,
    /// The names of the variables in the program's environment (values are left out: they
    /// may be secrets).
    pub env: Vec<String>,
    /// What the run will warn about (weaker than the profile asks, degradations accepted).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<String>,
    /// What the backend chose (a container runtime, gVisor's platform, a host workaround).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub details: Vec<String>,
    /// The command line of the sandbox tool that wraps the program (bwrap, runc, runsc, ...),
    /// for wrapping backends.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wrapper_argv: Option<Vec<String>>,
}

/// The egress gate of a planned run.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct PlannedEgress {
    /// Allowlist or report.
    pub mode: airlock_egress::GateMode,
    /// The allow rules, as written.
    pub allow: Vec<String>,
    /// The deny rules, as written; they win over allow rules.
    pub deny: Vec<String>,
    /// Where the gate resolves allowed names (on the host).
    pub resolver: airlock_egress::Resolver,
    /// The per-run caps.
    pub limits: airlock_egress::Limits,
    /// TCP ports captured inside the sandbox: a connection to an allowed name (its placeholder
    /// address from the DNS stub) or an allowed range on these ports reaches the gate.
    pub capture_ports: Vec<u16>,
    /// Allowed address ranges, routed to the gate inside the sandbox.
    pub local_ranges: Vec<String>,
    /// The gate's DNS stub inside the sandbox (`/etc/resolv.conf`).
    pub dns: String,
    /// The proxy endpoint inside the sandbox (HTTP CONNECT, absolute-form HTTP, SOCKS5), named
    /// by the proxy variables in the program's environment.
    pub proxy: String,
}

/// Whether a planned run goes ahead.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    /// Every required layer will be in force.
    Runs,
    /// Some required layers will be missing and the caller accepted it (`allow_degraded`):
    /// the run goes ahead and its result warns.
    RunsDegraded,
    /// Some required layers will be missing: the run is refused (see `missing_reason`).
    Refused,
}

/// Whose working directory the program gets.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum WorkdirKind {
    /// A fresh directory of the run's own, removed with it.
    Fresh,
    /// A fresh directory the caller keeps after the run.
    Kept,
    /// The caller's own directory (`filesystem.workdir`), bound read-write.
    Callers,
}

/// One path the program sees.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct PlannedMount {
    /// Where the program sees it.
    pub target: PathBuf,
    /// The host path shown there; `None` for a fresh tmpfs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<PathBuf>,
    pub writable: bool,
    /// The size cap of a fresh tmpfs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size_bytes: Option<u64>,
    /// Its file (inode) cap; `None` where the tool cannot cap files.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_files: Option<u64>,
}

impl Plan {
    /// True when the run will start (possibly degraded).
    pub fn runs(&self) -> bool {
        self.verdict != Verdict::Refused
    }

    /// The error a run of this plan is refused with, if it is.
    pub fn refusal(&self) -> Option<Error> {
        (self.verdict == Verdict::Refused).then(|| Error::Degraded {
            backend: self.backend.clone(),
            missing: self.missing.clone(),
            reason: self.missing_reason.clone().unwrap_or_default(),
        })
    }
}

/// The one rule for required layers, used by the supervisor on a plan's layers and by the init
/// on the layers it actually applied: all in force, the run goes ahead; some missing, it is
/// refused unless the caller accepted degradation (then it goes ahead and says what is missing).
/// Returns the missing layers and the verdict.
#[cfg(target_os = "linux")]
pub(crate) fn judge(
    require: &[Layer],
    in_force: &[Layer],
    allow_degraded: bool,
) -> (Vec<Layer>, Verdict) {
    let missing: Vec<Layer> = require
        .iter()
        .copied()
        .filter(|l| !in_force.contains(l))
        .collect();
    let verdict = match (missing.is_empty(), allow_degraded) {
        (true, _) => Verdict::Runs,
        (false, true) => Verdict::RunsDegraded,
        (false, false) => Verdict::Refused,
    };
    (missing, verdict)
}
