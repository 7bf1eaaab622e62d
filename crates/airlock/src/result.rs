//! The one result type of a run, shared by the library, `--json` and the HTTP API.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::error::SetupErrorKind;
pub use crate::layer::layer_name;
use crate::layer::Layer;

/// How a run ended.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum RunStatus {
    /// The program exited on its own; see `exit_code`.
    Exited,
    /// The program was killed by a signal it did not get from a limit.
    Signaled,
    /// The wall-clock limit passed.
    Timeout,
    /// The memory limit was hit (an OOM kill in the run's cgroup).
    MemoryLimit,
    /// The CPU-time limit was hit.
    CpuLimit,
    /// Output passed its cap and the policy says to stop.
    OutputLimit,
    /// A file reached the file-size limit.
    FileSizeLimit,
    /// The run was cancelled by the caller.
    Cancelled,
    /// The sandbox could not be set up; see `error`.
    SandboxError,
}

/// Everything known about a finished run.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct RunResult {
    pub status: RunStatus,
    /// Exit code when the program exited.
    pub exit_code: Option<i32>,
    /// Signal number when the program was killed by a signal.
    pub signal: Option<i32>,
    pub wall_ms: u64,
    pub cpu_user_ms: u64,
    pub cpu_sys_ms: u64,
    /// Peak memory of the run: the cgroup's high-water mark, else the largest process's RSS.
    pub peak_memory_bytes: Option<u64>,
    /// Captured stdout (lossy UTF-8) when capture was requested.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stdout: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stderr: Option<String>,
    pub stdout_truncated: bool,
    pub stderr_truncated: bool,
    /// Bytes the program wrote to stdout, including discarded ones.
    pub stdout_bytes: u64,
    pub stderr_bytes: u64,
    /// The backend that ran the program.
    pub backend: String,
    /// The layers that were in force, as reported by the init that applied them.
    pub isolation: Vec<Layer>,
    /// Why the sandbox failed (status `sandbox_error`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// What kind of failure that was, for callers that branch on it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error_kind: Option<SetupErrorKind>,
    /// Notes for the caller: degradations, skipped optional paths, Tier-0-only warnings.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<String>,
    /// What the backend chose for this run: the container runtime, gVisor's platform, a host
    /// workaround it applied. Facts, not warnings: none of them weakens the run.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub details: Vec<String>,
    /// The working directory, when it was kept after the run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workdir: Option<PathBuf>,
    /// The egress gate's report (network `allowlist` or `report`): the mode, counters, the
    /// limits hit (`limit:bytes_out`, ...), one record per decision and, in report mode, a
    /// suggested allow list.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network: Option<airlock_egress::NetworkReport>,
}

impl RunResult {
    /// The exit code a CLI should return: the program's code, 128+N for a signal, 124 for a
    /// wall-clock timeout and 125 for a sandbox failure.
    pub fn cli_exit_code(&self) -> i32 {
        match self.status {
            RunStatus::Timeout => 124,
            RunStatus::SandboxError => 125,
            _ => match (self.exit_code, self.signal) {
                (Some(code), _) => code,
                (None, Some(sig)) => 128 + sig,
                (None, None) => 125,
            },
        }
    }

    /// True when the program exited with code 0 and no limit was hit.
    pub fn success(&self) -> bool {
        self.status == RunStatus::Exited && self.exit_code == Some(0)
    }
}
