//! The one result type of a run, shared by the library, `--json` and the HTTP API.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::error::FailureKind;
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
    /// Captured stdout when capture was requested: the exact text when it is valid UTF-8,
    /// else a lossy rendering (`stdout_lossy`) with the exact bytes in `stdout_base64`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stdout: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stderr: Option<String>,
    /// The exact captured stdout, base64 (standard alphabet, padded), when it is not valid
    /// UTF-8.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stdout_base64: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stderr_base64: Option<String>,
    /// `stdout` is not the program's bytes (they were not valid UTF-8): read `stdout_base64`.
    #[serde(default, skip_serializing_if = "is_false")]
    pub stdout_lossy: bool,
    #[serde(default, skip_serializing_if = "is_false")]
    pub stderr_lossy: bool,
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
    /// What kind of failure that was, for callers that branch on it: a refusal before the
    /// run started or a set-up failure (see [`FailureKind`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error_kind: Option<FailureKind>,
    /// The signal the supervisor received that cancelled the run (status `cancelled`), e.g. 2
    /// for SIGINT (Ctrl-C) or 15 for SIGTERM.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cancel_signal: Option<i32>,
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
    /// What probably went wrong when the run failed, and the fix: e.g. the network is off,
    /// or a file the command names is not visible in the sandbox.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub hints: Vec<String>,
    /// The egress gate's report (network `allowlist` or `report`): the mode, counters, the
    /// limits hit (`limit:bytes_out`, ...), one record per decision and, in report mode, a
    /// suggested allow list.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network: Option<airlock_egress::NetworkReport>,
}

fn is_false(value: &bool) -> bool {
    !*value
}

/// One captured stream as the result carries it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct CapturedText {
    /// The text: exact when `base64` is `None`.
    pub text: String,
    /// The exact bytes, when they are not valid UTF-8.
    pub base64: Option<String>,
}

impl CapturedText {
    /// The bytes as text, and as base64 too when they are not valid UTF-8.
    pub fn from_bytes(bytes: &[u8]) -> CapturedText {
        use base64::Engine;
        match std::str::from_utf8(bytes) {
            Ok(text) => CapturedText {
                text: text.to_string(),
                base64: None,
            },
            Err(_) => CapturedText {
                text: String::from_utf8_lossy(bytes).into_owned(),
                base64: Some(base64::engine::general_purpose::STANDARD.encode(bytes)),
            },
        }
    }
}

impl RunResult {
    /// The result of a run that never started: refused (bad flags, profile, path, a missing
    /// required layer) or failed before its init ran. Status `sandbox_error`; `backend` is
    /// empty, since none was started.
    pub fn not_started(kind: impl Into<FailureKind>, message: impl Into<String>) -> RunResult {
        RunResult {
            error: Some(message.into()),
            error_kind: Some(kind.into()),
            ..RunResult::blank(String::new(), 0)
        }
    }

    /// A result with nothing known yet but the backend and the wall time: status
    /// `sandbox_error` until an outcome says otherwise.
    pub(crate) fn blank(backend: String, wall_ms: u64) -> RunResult {
        RunResult {
            status: RunStatus::SandboxError,
            exit_code: None,
            signal: None,
            wall_ms,
            cpu_user_ms: 0,
            cpu_sys_ms: 0,
            peak_memory_bytes: None,
            stdout: None,
            stderr: None,
            stdout_base64: None,
            stderr_base64: None,
            stdout_lossy: false,
            stderr_lossy: false,
            stdout_truncated: false,
            stderr_truncated: false,
            stdout_bytes: 0,
            stderr_bytes: 0,
            backend,
            isolation: Vec::new(),
            error: None,
            error_kind: None,
            cancel_signal: None,
            warnings: Vec::new(),
            details: Vec::new(),
            workdir: None,
            hints: Vec::new(),
            network: None,
        }
    }

    /// Sets the captured stdout from the bytes kept.
    pub fn set_stdout(&mut self, bytes: &[u8]) {
        let captured = CapturedText::from_bytes(bytes);
        self.stdout_lossy = captured.base64.is_some();
        (self.stdout, self.stdout_base64) = (Some(captured.text), captured.base64);
    }

    /// Sets the captured stderr from the bytes kept.
    pub fn set_stderr(&mut self, bytes: &[u8]) {
        let captured = CapturedText::from_bytes(bytes);
        self.stderr_lossy = captured.base64.is_some();
        (self.stderr, self.stderr_base64) = (Some(captured.text), captured.base64);
    }

    /// The exact bytes of the captured stdout, when it was captured.
    pub fn stdout_raw(&self) -> Option<Vec<u8>> {
        raw(self.stdout.as_deref(), self.stdout_base64.as_deref())
    }

    /// The exact bytes of the captured stderr, when it was captured.
    pub fn stderr_raw(&self) -> Option<Vec<u8>> {
        raw(self.stderr.as_deref(), self.stderr_base64.as_deref())
    }

    /// The exit code a CLI should return: the program's code, 128+N for a signal, 124 for a
    /// wall-clock timeout, 125 for a sandbox failure, and 128+N for a run cancelled because the
    /// supervisor received signal N (130 after Ctrl-C, 143 after SIGTERM), as shells do.
    pub fn cli_exit_code(&self) -> i32 {
        match (self.status, self.cancel_signal) {
            (RunStatus::Timeout, _) => 124,
            (RunStatus::SandboxError, _) => 125,
            (RunStatus::Cancelled, Some(received)) => 128 + received,
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

fn raw(text: Option<&str>, base64: Option<&str>) -> Option<Vec<u8>> {
    use base64::Engine;
    match base64 {
        Some(encoded) => base64::engine::general_purpose::STANDARD
            .decode(encoded)
            .ok(),
        None => text.map(|t| t.as_bytes().to_vec()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_that_is_not_utf8_keeps_its_exact_bytes() {
        let bytes = b"ok \xff\xfe end\n";
        let mut result = RunResult::not_started(crate::ErrorKind::Io, "x");
        result.set_stdout(bytes);
        assert!(result.stdout_lossy);
        assert_eq!(result.stdout_raw().as_deref(), Some(&bytes[..]));
        result.set_stderr("h\u{e9}llo".as_bytes());
        assert!(!result.stderr_lossy && result.stderr_base64.is_none());
        assert_eq!(result.stderr.as_deref(), Some("h\u{e9}llo"));
    }

    #[test]
    fn refusal_and_setup_kinds_serialise_as_their_names() {
        let refused = FailureKind::from(crate::ErrorKind::UsageInvalid);
        let setup = FailureKind::from(crate::SetupErrorKind::ProgramNotFound);
        assert_eq!(
            serde_json::to_string(&refused).unwrap(),
            "\"usage_invalid\""
        );
        let back: FailureKind = serde_json::from_str("\"program_not_found\"").unwrap();
        assert_eq!(back, setup);
        let back: FailureKind = serde_json::from_str("\"bad_path\"").unwrap();
        assert_eq!(back, FailureKind::Refused(crate::ErrorKind::BadPath));
    }
}
