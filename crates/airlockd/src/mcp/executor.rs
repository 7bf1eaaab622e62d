//! The daemon's [`Executor`] for the MCP tools: each request goes through the same path as
//! the HTTP API's (the tenant's ceiling, admission, the store, the audit log), as the key that
//! opened the MCP session. Tool arguments carry no policy: every run gets the tenant's default
//! profile, so no tool can widen what the ceiling allows.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use airlock_mcp::executor::{ExecFuture, SessionInfo};
use airlock_mcp::{Executor, Failure, FailureKind, Program, RunRequest};
use axum::http::StatusCode;
use serde_json::{json, Value};

use crate::api::prepare;
use crate::api::sessions::{active_session, open, Place};
use crate::api::types::{RunRequest as ApiRunRequest, SessionRequest};
use crate::auth::Principal;
use crate::daemon::Daemon;
use crate::engine::events::EventBody;
use crate::engine::{LiveRun, StopOnDrop, Submitted};
use crate::error::ApiError;
use crate::resolve::PolicyRequest;
use crate::sessions::LiveSession;
use crate::store::Document;
use crate::workspace::{FileError, SafePath};

/// Runs the MCP tools' requests of one MCP session, as the key that opened it (and so its
/// tenant). Dropped when the MCP session ends, which ends the sessions it created.
pub struct DaemonExecutor {
    daemon: Arc<Daemon>,
    caller: Principal,
    /// The key's count of open MCP sessions: this one counts in it while it lives.
    open: Arc<AtomicUsize>,
    /// Sessions this MCP session created and has not closed.
    created: Mutex<Vec<String>>,
}

impl DaemonExecutor {
    pub fn new(daemon: Arc<Daemon>, caller: Principal, open: Arc<AtomicUsize>) -> DaemonExecutor {
        open.fetch_add(1, Ordering::AcqRel);
        DaemonExecutor {
            daemon,
            caller,
            open,
            created: Mutex::new(Vec::new()),
        }
    }

    fn created(&self) -> std::sync::MutexGuard<'_, Vec<String>> {
        self.created.lock().unwrap_or_else(PoisonError::into_inner)
    }

    async fn run_request(&self, request: RunRequest) -> Result<Value, Failure> {
        let session = match &request.session {
            Some(id) => Some(self.session(id).await?),
            None => None,
        };
        let body = api_request(request)?;
        let prepared = prepare::run(&self.daemon, &self.caller, body, session.as_deref(), None)
            .await
            .map_err(|e| failure(&e))?;
        let policy = prepared.job.resolved.policy.clone();
        let live = match self.daemon.engine.submit(prepared.job).await {
            Ok(Submitted::New(live)) => live,
            // MCP runs carry no idempotency key, so none can match an earlier run.
            Ok(Submitted::Existing(_)) => return Err(internal("an earlier run was returned")),
            Err(e) => return Err(failure(&e)),
        };
        // A request the client abandons (a cancelled tool call, a closed MCP session) stops
        // its run instead of leaving it to its wall limit.
        let guard = StopOnDrop::new(&live);
        while !live.wait_done(Duration::from_secs(3600)).await {}
        guard.disarm();
        if let Some(session) = &session {
            session.touch();
        }
        self.report(&live, &policy).await
    }

    /// The run's report as airlock-mcp gives it locally, from the stored record and the
    /// output streamed into the run's events (exact whether or not the store keeps output).
    async fn report(&self, live: &LiveRun, policy: &airlock::Policy) -> Result<Value, Failure> {
        let row = match live.take_recorded() {
            Some(row) => row,
            None => self
                .daemon
                .store
                .run(&live.id)
                .await
                .map_err(|e| failure(&ApiError::store(e)))?
                .ok_or_else(|| internal("the run's record vanished"))?,
        };
        if row.status == "rejected" {
            let message = row.error.as_ref().and_then(|e| e["message"].as_str());
            return Err(Failure::new(
                FailureKind::Busy,
                message.unwrap_or("no slot was free in time"),
            )
            .with_reason("queue_timeout")
            .with_fix("try again later; the daemon is at its concurrency limit"));
        }
        let (stdout, stderr) = output(live);
        let mut report = match row
            .result
            .as_ref()
            .and_then(Document::read::<airlock::RunResult>)
        {
            Some(mut result) => {
                result.stdout = Some(stdout);
                result.stderr = Some(stderr);
                airlock_mcp::report::run_report(&result, policy)
            }
            None => json!({ "status": row.status, "error": row.error, "limits_hit": [] }),
        };
        if let Value::Object(fields) = &mut report {
            fields.insert("run_id".into(), json!(row.id));
            if let Some(network) = row.network {
                fields.insert("network".into(), network);
            }
        }
        Ok(report)
    }

    /// An active session of this tenant on this node. Another tenant's session is "not found",
    /// even for an admin key: through MCP a key works in its own tenant only.
    async fn session(&self, id: &str) -> Result<Arc<LiveSession>, Failure> {
        let not_found = || {
            Failure::new(FailureKind::NotFound, format!("no session {id:?}"))
                .with_fix("create one with session_create")
        };
        match active_session(&self.daemon, &self.caller, id).await {
            Ok(Place::Here(session)) if session.tenant == self.caller.tenant.name => Ok(session),
            Ok(Place::Here(_)) => Err(not_found()),
            Ok(Place::Elsewhere(node)) => Err(Failure::new(
                FailureKind::SandboxError,
                format!("session {id:?} lives on node {node:?}"),
            )
            .with_reason("other_node")
            .with_fix("connect to that node's /mcp")),
            // A closed session is gone, as it is for airlock-mcp over stdio.
            Err(e) if e.status == StatusCode::NOT_FOUND || e.detail.kind == "session_ended" => {
                Err(not_found())
            }
            Err(e) => Err(failure(&e)),
        }
    }

    async fn create(&self) -> Result<SessionInfo, Failure> {
        let row = open(&self.daemon, &self.caller, &SessionRequest::default())
            .await
            .map_err(|e| failure(&e))?;
        self.created().push(row.id.clone());
        let workdir = match self.daemon.sessions.get(&row.id) {
            Some(session) => session.workspace.dir.display().to_string(),
            None => String::new(),
        };
        Ok(SessionInfo {
            session_id: row.id,
            workdir,
            max_file_bytes: self.daemon.config.sessions.max_file_bytes.0,
        })
    }

    async fn close(&self, id: &str) -> Result<(), Failure> {
        let session = self.session(id).await?;
        let daemon = &self.daemon;
        daemon
            .sessions
            .end(&session, &daemon.engine, "deleted", "closed through MCP")
            .await;
        self.created().retain(|created| created != id);
        Ok(())
    }

    async fn read(&self, id: &str, path: &str) -> Result<Vec<u8>, Failure> {
        let session = self.session(id).await?;
        session.touch();
        let safe = safe_path(path)?;
        let max = self.daemon.config.sessions.max_file_bytes.0;
        tokio::task::block_in_place(|| session.workspace.read_file(&safe, max))
            .map_err(|e| file_failure(&e))
    }

    async fn write(&self, id: &str, path: &str, data: &[u8]) -> Result<u64, Failure> {
        let session = self.session(id).await?;
        session.touch();
        let safe = safe_path(path)?;
        let max = self.daemon.config.sessions.max_file_bytes.0;
        if data.len() as u64 > max {
            return Err(Failure::new(
                FailureKind::Invalid,
                format!(
                    "{} bytes is more than the daemon's file limit ({max})",
                    data.len()
                ),
            )
            .with_reason("too_large")
            .with_fix("write a smaller file; the limit is sessions.max_file_bytes"));
        }
        tokio::task::block_in_place(|| session.workspace.write_file(&safe, data))
            .map_err(|e| file_failure(&e))?;
        Ok(data.len() as u64)
    }

    fn policy(&self) -> Value {
        let caller = &self.caller;
        let tenant = &caller.tenant;
        let resolved = crate::resolve::resolve(
            caller,
            None,
            &PolicyRequest::default(),
            &self.daemon.sandbox_options,
        );
        let Ok(resolved) = resolved else {
            return json!({ "tenant": tenant.name, "error": "the tenant's default profile does not resolve" });
        };
        let policy = &resolved.policy;
        let (backend, isolation) =
            airlock_mcp::local::expected_isolation(policy, &resolved.options);
        let sessions = &self.daemon.config.sessions;
        json!({
            "tenant": tenant.name,
            "profile": resolved.profile,
            "backend": backend,
            "isolation": isolation,
            "network": policy.network,
            "limits": policy.limits,
            "filesystem": {
                "read_only": policy.filesystem.read_only,
                "read_write": policy.filesystem.read_write,
                "workdir": "a fresh, empty directory per run; a session's workspace for runs in a session",
            },
            "allowed_programs": policy.allowed_programs,
            "interpreters": self.daemon.interpreters.allowed(),
            "sessions": {
                "max": sessions.max_per_tenant,
                "max_file_bytes": sessions.max_file_bytes.0,
                "idle_timeout_s": sessions.default_idle_timeout.0.as_secs(),
            },
            "ceiling": {
                "network": tenant.ceiling.network,
                "allowlist": tenant.ceiling.allowlist,
                "min_isolation": tenant.ceiling.min_isolation,
            },
            "widening": "none: the tenant's ceiling and default profile decide this policy and no tool can change it",
        })
    }
}

impl Drop for DaemonExecutor {
    /// The MCP session ended (DELETE, its idle timeout, the daemon stopping): so do the
    /// sessions it created, their runs cancelled and their workspaces removed.
    fn drop(&mut self) {
        self.open.fetch_sub(1, Ordering::AcqRel);
        let created = std::mem::take(&mut *self.created());
        if created.is_empty() {
            return;
        }
        let daemon = Arc::clone(&self.daemon);
        self.daemon.engine.runtime.spawn(async move {
            for id in created {
                if let Some(session) = daemon.sessions.get(&id) {
                    let reason = "the MCP session that created it ended";
                    daemon
                        .sessions
                        .end(&session, &daemon.engine, "deleted", reason)
                        .await;
                }
            }
        });
    }
}

impl Executor for DaemonExecutor {
    fn describe_policy(&self) -> Value {
        self.policy()
    }

    fn run(&self, request: RunRequest) -> ExecFuture<'_, Value> {
        Box::pin(self.run_request(request))
    }

    fn create_session(&self) -> ExecFuture<'_, SessionInfo> {
        Box::pin(self.create())
    }

    fn close_session(&self, session: String) -> ExecFuture<'_, ()> {
        Box::pin(async move { self.close(&session).await })
    }

    fn read_file(&self, session: String, path: String) -> ExecFuture<'_, Vec<u8>> {
        Box::pin(async move { self.read(&session, &path).await })
    }

    fn write_file(&self, session: String, path: String, data: Vec<u8>) -> ExecFuture<'_, u64> {
        Box::pin(async move { self.write(&session, &path, &data).await })
    }
}

/// The API's run request for a tool's run: the program and stdin, nothing else.
fn api_request(request: RunRequest) -> Result<ApiRunRequest, Failure> {
    use base64::Engine as _;
    let stdin = request
        .stdin
        .map(|bytes| base64::engine::general_purpose::STANDARD.encode(bytes));
    let body = match request.program {
        Program::Command(argv) => json!({ "command": argv, "stdin_base64": stdin }),
        Program::Code { language, code } => {
            json!({ "code": code, "language": language, "stdin_base64": stdin })
        }
    };
    serde_json::from_value(body)
        .map_err(|e| Failure::new(FailureKind::Invalid, format!("bad run request: {e}")))
}

fn safe_path(path: &str) -> Result<SafePath, Failure> {
    SafePath::parse(path).map_err(|e| file_failure(&e))
}

/// The output of a finished run, from its events.
fn output(live: &LiveRun) -> (String, String) {
    let (mut stdout, mut stderr) = (Vec::new(), Vec::new());
    for event in live.log.read_from(0).0 {
        let (into, text, base64) = match &event.body {
            EventBody::Stdout { text, base64 } => (&mut stdout, text, base64),
            EventBody::Stderr { text, base64 } => (&mut stderr, text, base64),
            _ => continue,
        };
        match base64.as_deref().and_then(decode) {
            Some(bytes) => into.extend_from_slice(&bytes),
            None => into.extend_from_slice(text.as_bytes()),
        }
    }
    (
        String::from_utf8_lossy(&stdout).into_owned(),
        String::from_utf8_lossy(&stderr).into_owned(),
    )
}

/// A workspace refusal with the reasons `airlock-mcp` gives locally (`symlink`, `hardlink`,
/// `outside_workspace`, ...), and the API's message and fix.
fn file_failure(error: &FileError) -> Failure {
    let (kind, reason) = match error {
        FileError::BadPath { .. } => (FailureKind::Denied, "outside_workspace"),
        FileError::Escapes { .. } => (FailureKind::Denied, "symlink"),
        FileError::Hardlinked { .. } => (FailureKind::Denied, "hardlink"),
        FileError::NotRegular { .. } => (FailureKind::Denied, "not_a_regular_file"),
        FileError::NotFound { .. } => (FailureKind::NotFound, "not_found"),
        FileError::TooLarge { .. } => (FailureKind::Invalid, "too_large"),
        FileError::Changed { .. } => (FailureKind::Busy, "changed_during_read"),
        FileError::Full => (FailureKind::Busy, "workspace_full"),
        FileError::NotEmpty { .. } => (FailureKind::Invalid, "not_empty"),
        FileError::Io { .. } => (FailureKind::SandboxError, "io"),
    };
    let api = prepare::file_error(error);
    Failure::new(kind, api.detail.message)
        .with_reason(reason)
        .with_fix(api.detail.fix)
}

fn decode(text: &str) -> Option<Vec<u8>> {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.decode(text).ok()
}

fn internal(message: &str) -> Failure {
    Failure::new(FailureKind::SandboxError, message).with_reason("internal")
}

/// The tool's refusal for an API error: its kind as the reason, its message and fix.
fn failure(error: &ApiError) -> Failure {
    let kind = match error.status {
        StatusCode::FORBIDDEN => FailureKind::Denied,
        StatusCode::NOT_FOUND => FailureKind::NotFound,
        StatusCode::TOO_MANY_REQUESTS | StatusCode::SERVICE_UNAVAILABLE => FailureKind::Busy,
        s if s.is_client_error() => FailureKind::Invalid,
        _ => FailureKind::SandboxError,
    };
    let detail = &error.detail;
    Failure::new(kind, detail.message.clone())
        .with_reason(&detail.kind)
        .with_fix(detail.fix.clone())
}
