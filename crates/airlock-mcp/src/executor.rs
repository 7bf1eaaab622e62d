//! The seam between the MCP tools and whatever runs the sandboxes: this process through the
//! library ([`crate::local::LocalExecutor`]) or the daemon's queue.

use std::future::Future;
use std::pin::Pin;

use serde::Serialize;
use serde_json::Value;

/// A boxed future, so that [`Executor`] can be used as `Arc<dyn Executor>`.
pub type ExecFuture<'a, T> = Pin<Box<dyn Future<Output = Result<T, Failure>> + Send + 'a>>;

/// What to run.
#[derive(Debug, Clone, PartialEq)]
pub enum Program {
    /// A command line: the program and its arguments.
    Command(Vec<String>),
    /// Code for an interpreter of the registry (`python`, `bash`, `node`, ...).
    Code { language: String, code: String },
}

/// One run, optionally in a session's workspace.
#[derive(Debug, Clone, PartialEq)]
pub struct RunRequest {
    pub program: Program,
    /// Bytes for the program's stdin (empty when absent).
    pub stdin: Option<Vec<u8>>,
    /// Run in this session's workspace instead of a fresh directory.
    pub session: Option<String>,
}

/// Why a request was not carried out. A run that happened, however it ended, is never a
/// `Failure`: it is a report with the run's status.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{kind}: {message}")]
pub struct Failure {
    pub kind: FailureKind,
    /// A machine-readable reason, e.g. `symlink`, `interpreter_not_allowed`.
    pub reason: String,
    pub message: String,
    /// What the caller can do about it, when something can be done.
    pub fix: Option<String>,
}

/// The kinds of [`Failure`], as the `status` the tools answer with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FailureKind {
    /// The policy refuses it (an interpreter or program not allowed, a path out of the
    /// workspace): asking again the same way will not work.
    Denied,
    /// The request itself is malformed (empty argv, a bad path, code too long).
    Invalid,
    /// No such session or file.
    NotFound,
    /// Too many sessions or runs at once; try again after closing one.
    Busy,
    /// The sandbox could not be set up on this host.
    SandboxError,
    /// The client cancelled the request; its run was stopped.
    Cancelled,
}

impl std::fmt::Display for FailureKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let name = serde_json::to_value(self).ok();
        f.write_str(name.as_ref().and_then(Value::as_str).unwrap_or("error"))
    }
}

impl Failure {
    pub fn new(kind: FailureKind, message: impl Into<String>) -> Failure {
        Failure {
            kind,
            reason: kind.to_string(),
            message: message.into(),
            fix: None,
        }
    }

    pub fn with_reason(mut self, reason: &str) -> Failure {
        self.reason = reason.into();
        self
    }

    pub fn with_fix(mut self, fix: impl Into<String>) -> Failure {
        self.fix = Some(fix.into());
        self
    }

    /// The JSON a tool answers with: `{"status": kind, "denial"|"error": {...}}`.
    pub fn to_json(&self) -> Value {
        let detail = serde_json::json!({
            "reason": self.reason,
            "message": self.message,
            "fix": self.fix,
        });
        let key = if self.kind == FailureKind::Denied {
            "denial"
        } else {
            "error"
        };
        serde_json::json!({ "status": self.kind, key: detail })
    }
}

/// A session: a workspace that outlives one run.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SessionInfo {
    /// Unguessable id (128 random bits, hex).
    pub session_id: String,
    /// The workspace's path inside the sandbox (the runs' working directory).
    pub workdir: String,
    /// Largest file `file_read`/`file_write` accept.
    pub max_file_bytes: u64,
}

/// Runs sandboxes and keeps sessions for the MCP tools. Implementations decide the policy;
/// nothing in a request can widen it.
pub trait Executor: Send + Sync + 'static {
    /// What runs may do (network, limits, isolation), for `describe_policy`.
    fn describe_policy(&self) -> Value;
    /// Runs one program to completion; the report is the run's JSON (see [`crate::report`]).
    fn run(&self, request: RunRequest) -> ExecFuture<'_, Value>;
    /// Creates a session with an empty workspace.
    fn create_session(&self) -> ExecFuture<'_, SessionInfo>;
    /// Ends a session and removes its workspace with everything in it.
    fn close_session(&self, session: String) -> ExecFuture<'_, ()>;
    /// Reads a file of a session's workspace.
    fn read_file(&self, session: String, path: String) -> ExecFuture<'_, Vec<u8>>;
    /// Writes (creates or replaces) a file in a session's workspace; returns its size.
    fn write_file(&self, session: String, path: String, data: Vec<u8>) -> ExecFuture<'_, u64>;
}
