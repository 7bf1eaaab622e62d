//! From a request to a [`Job`]: priority and policy within the ceiling, the command (or code
//! through the interpreter registry), stdin, env, files, and the record to store (without
//! secrets unless configured). Submitting the job and answering: `answer`.

use std::sync::Arc;
use std::time::Duration;

use axum::http::HeaderMap;
use base64::Engine as _;
use serde_json::json;
use sha2::{Digest, Sha256};

use super::types::{FileInput, RunRequest};
use crate::auth::Principal;
use crate::config::StoreConfig;
use crate::daemon::Daemon;
use crate::engine::{CodeWork, CommandWork, Job, OwnedWorkspace, Work};
use crate::error::ApiError;
use crate::resolve::{self, PolicyRequest, Resolved, Violation};
use crate::sessions::LiveSession;
use crate::store::{now_ms, Document, NewRun};
use crate::workspace::{FileError, SafePath, Workspace, WorkspaceSpec};

/// A new id: a millisecond time prefix (so ids sort by creation) and 64 random bits.
pub fn new_id(prefix: &str) -> String {
    format!(
        "{prefix}_{:012x}{:016x}",
        now_ms(),
        crate::workspace::random_u64()
    )
}

/// The `Idempotency-Key` header, if sent.
pub fn idempotency_key(headers: &HeaderMap) -> Result<Option<String>, ApiError> {
    let Some(value) = headers.get("idempotency-key") else {
        return Ok(None);
    };
    let key = value.to_str().ok().map(str::trim).unwrap_or_default();
    if key.is_empty() || key.len() > 255 {
        return Err(ApiError::bad_request(
            "Idempotency-Key must be 1 to 255 visible ASCII characters",
            "send a unique key per logical request, e.g. a UUID",
        ));
    }
    Ok(Some(key.to_string()))
}

/// Counts and audits a request refused for going beyond its ceiling.
async fn record_refusal(daemon: &Daemon, caller: &Principal, detail: serde_json::Value) {
    daemon.metrics.deny("ceiling");
    let entry = crate::audit::Audit::entry("ceiling_refused", caller, None, detail);
    daemon.audit.record(entry).await;
}

/// Refuses (403, audited) a request beyond its tenant's ceiling.
pub async fn refuse(daemon: &Daemon, caller: &Principal, v: &Violation) -> ApiError {
    let detail = json!({"key": v.key, "asked": v.asked, "ceiling": v.ceiling});
    record_refusal(daemon, caller, detail).await;
    resolve::refusal(caller, v)
}

/// The request's priority, within the tenant's range.
pub async fn priority(
    daemon: &Daemon,
    caller: &Principal,
    asked: Option<i32>,
) -> Result<i32, ApiError> {
    let range = caller.tenant.priority;
    let priority = asked.unwrap_or(range.default);
    if priority < range.min || priority > range.max {
        let v = Violation {
            key: "priority".into(),
            asked: priority.to_string(),
            ceiling: format!("{} to {}", range.min, range.max),
        };
        return Err(refuse(daemon, caller, &v).await);
    }
    Ok(priority)
}

/// Resolves the policy; a ceiling refusal is audited.
pub async fn policy(
    daemon: &Daemon,
    caller: &Principal,
    profile: Option<&str>,
    request: &PolicyRequest,
) -> Result<Resolved, ApiError> {
    match resolve::resolve(caller, profile, request, &daemon.sandbox_options) {
        Ok(resolved) => Ok(resolved),
        Err(e) if e.detail.kind == "ceiling" => {
            record_refusal(daemon, caller, json!({"message": e.detail.message})).await;
            Err(e)
        }
        Err(e) => Err(e),
    }
}

/// The uid and gid sandboxed programs run as under `resolved` (their workspace is theirs).
pub fn sandbox_owner(resolved: &Resolved) -> Option<(u32, u32)> {
    let user = &resolved.policy.user;
    (rustix::process::geteuid().is_root() && user.drop_root).then_some((user.uid, user.gid))
}

/// argv and stdin from `command` or `code` + `language`.
fn command_line(
    daemon: &Daemon,
    req: &RunRequest,
) -> Result<(Vec<String>, Option<Vec<u8>>), ApiError> {
    let stdin = stdin_bytes(req)?;
    match (&req.command, &req.code) {
        (Some(argv), None) => {
            if argv.is_empty() || argv[0].is_empty() {
                return Err(ApiError::bad_request(
                    "`command` is empty",
                    "give the program and its arguments, e.g. [\"python3\", \"-c\", \"print(1)\"]",
                ));
            }
            let mut argv = argv.clone();
            argv.extend(req.args.iter().cloned());
            Ok((argv, stdin))
        }
        (None, Some(code)) => {
            let language = req.language.as_deref().ok_or_else(|| {
                ApiError::bad_request(
                    "`code` needs `language`",
                    "name an interpreter, e.g. \"python\"",
                )
            })?;
            let invocation = daemon
                .interpreters
                .invocation(language, code, &req.args)
                .map_err(|e| {
                    ApiError::invalid(
                        e.kind().name(),
                        e.to_string(),
                        "use a language listed by GET /v1/capabilities",
                    )
                })?;
            if invocation.stdin.is_some() && stdin.is_some() {
                return Err(ApiError::bad_request(
                    format!("interpreter {language:?} reads the code on stdin, so the run cannot have stdin too"),
                    "write the input to a file instead (`files`)",
                ));
            }
            Ok((invocation.argv, invocation.stdin.or(stdin)))
        }
        _ => Err(ApiError::bad_request(
            "give exactly one of `command` and `code`",
            "send {\"command\": [...]} or {\"code\": \"...\", \"language\": \"python\"}",
        )),
    }
}

/// The code of a code run whose interpreter takes it as an argument (not on stdin), for a
/// zygote of that interpreter.
fn code_work(req: &RunRequest, argv: &[String]) -> Option<CodeWork> {
    let (code, language) = (req.code.as_ref()?, req.language.as_ref()?);
    argv.contains(code).then(|| CodeWork {
        language: language.clone(),
        code: code.clone(),
        args: req.args.clone(),
    })
}

fn stdin_bytes(req: &RunRequest) -> Result<Option<Vec<u8>>, ApiError> {
    match (&req.stdin, &req.stdin_base64) {
        (Some(_), Some(_)) => Err(ApiError::bad_request(
            "give `stdin` or `stdin_base64`, not both",
            "drop one of them",
        )),
        (Some(text), None) => Ok(Some(text.as_bytes().to_vec())),
        (None, Some(b64)) => decode_base64(b64, "stdin_base64").map(Some),
        (None, None) => Ok(None),
    }
}

fn decode_base64(text: &str, field: &str) -> Result<Vec<u8>, ApiError> {
    base64::engine::general_purpose::STANDARD
        .decode(text)
        .map_err(|e| {
            ApiError::bad_request(
                format!("`{field}` is not valid base64: {e}"),
                "encode the bytes with standard base64",
            )
        })
}

fn check_env(env: &std::collections::BTreeMap<String, String>) -> Result<(), ApiError> {
    for (name, value) in env {
        if name.is_empty() || name.contains('=') || name.contains('\0') || value.contains('\0') {
            return Err(ApiError::bad_request(
                format!("environment variable {name:?} is not valid"),
                "names must be non-empty without '=' or NUL; values without NUL",
            ));
        }
    }
    Ok(())
}

/// Writes the files of a request into `workspace`.
pub fn write_files(workspace: &Workspace, files: &[FileInput]) -> Result<(), ApiError> {
    for file in files {
        let path = SafePath::parse(&file.path).map_err(|e| file_error(&e))?;
        let bytes = file_bytes(file)?;
        workspace
            .write_file(&path, &bytes)
            .map_err(|e| file_error(&e))?;
    }
    Ok(())
}

/// A sent file's bytes, from `content` or `content_base64`.
pub fn file_bytes(file: &FileInput) -> Result<Vec<u8>, ApiError> {
    match (&file.content, &file.content_base64) {
        (Some(text), None) => Ok(text.as_bytes().to_vec()),
        (None, Some(b64)) => decode_base64(b64, "files[].content_base64"),
        _ => Err(ApiError::bad_request(
            format!(
                "file {:?} needs exactly one of `content` and `content_base64`",
                file.path
            ),
            "give the content as text or as base64",
        )),
    }
}

/// The API error for a workspace file problem.
pub fn file_error(error: &FileError) -> ApiError {
    use axum::http::StatusCode;
    let message = error.to_string();
    match error {
        FileError::BadPath { .. } => ApiError::bad_request(
            message,
            "use a relative path of plain names, without `..`, `.` or empty components",
        ),
        FileError::NotFound { .. } => ApiError::new(
            StatusCode::NOT_FOUND,
            "not_found",
            message,
            "list the directory to see what exists",
        ),
        FileError::Escapes { .. } => {
            ApiError::forbidden(message, "name the file itself; links are never followed")
        }
        FileError::Hardlinked { .. } => {
            ApiError::forbidden(message, "copy the file instead of linking it")
        }
        FileError::NotRegular { .. } => ApiError::conflict(
            "not_a_file",
            message,
            "list directories with a GET on the directory; only regular files are read",
        ),
        FileError::TooLarge { .. } => ApiError::too_large(
            message,
            "read a smaller file; the limit is sessions.max_file_bytes",
        ),
        FileError::Changed { .. } => ApiError::conflict(
            "changed_during_read",
            message,
            "retry once the program stops writing it",
        ),
        // The caller's own quota is spent: a client error (413), not a server failure.
        FileError::Full => ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "workspace_full",
            message,
            "remove files, or create the session with a larger `disk` / `files`",
        ),
        FileError::NotEmpty { .. } => {
            ApiError::conflict("not_empty", message, "remove the files inside first")
        }
        FileError::Io { .. } => ApiError::internal("workspace I/O failed", message),
    }
}

/// The request as stored: env values, stdin and file contents only when configured.
fn stored_request(keep: &StoreConfig, req: &RunRequest) -> Document {
    let nothing_to_leave_out = req.env.is_empty()
        && req.stdin.is_none()
        && req.stdin_base64.is_none()
        && req.files.is_empty();
    if nothing_to_leave_out {
        // The same document as below, written from the request without a tree between.
        if let Ok(document) = Document::of(req) {
            return document;
        }
    }
    let mut value = serde_json::to_value(req).unwrap_or_default();
    if !keep.keep_env_values {
        let names: serde_json::Map<_, _> = req
            .env
            .keys()
            .map(|k| (k.clone(), json!("<redacted>")))
            .collect();
        value["env"] = serde_json::Value::Object(names);
    }
    if !keep.keep_file_contents {
        let stdin_bytes = req
            .stdin
            .as_ref()
            .map(String::len)
            .or(req.stdin_base64.as_ref().map(|b| b.len() * 3 / 4));
        value["stdin"] = json!(stdin_bytes.map(|n| format!("<{n} bytes, not stored>")));
        value["stdin_base64"] = serde_json::Value::Null;
        let files: Vec<_> = req.files.iter().map(|f| json!({"path": f.path})).collect();
        value["files"] = json!(files);
    }
    Document::from(value)
}

/// A hash of the whole request, to tell a retry from a different request reusing a key.
pub fn request_hash(value: &impl serde::Serialize) -> String {
    let text = serde_json::to_string(value).unwrap_or_default();
    crate::auth::hex(&Sha256::digest(text.as_bytes()))
}

/// A run request turned into a job, with how long the caller wants to wait.
pub struct Prepared {
    pub job: Job,
    pub wait: Duration,
}

/// The seconds a request asks to wait, capped by the daemon.
pub fn wait_time(daemon: &Daemon, asked: Option<f64>) -> Duration {
    let asked = asked.filter(|w| w.is_finite() && *w > 0.0).unwrap_or(0.0);
    Duration::from_secs_f64(asked.min(daemon.config.server.max_wait.0.as_secs_f64()))
}

/// Prepares a run, in a session when `session` is given.
pub async fn run(
    daemon: &Arc<Daemon>,
    caller: &Principal,
    req: RunRequest,
    session: Option<&LiveSession>,
    idempotency: Option<String>,
) -> Result<Prepared, ApiError> {
    let priority = priority(daemon, caller, req.priority).await?;
    let profile = req
        .profile
        .as_deref()
        .or(session.map(|s| s.profile.as_str()));
    let resolved = policy(daemon, caller, profile, &req.policy).await?;
    let (argv, stdin) = command_line(daemon, &req)?;
    check_env(&req.env)?;
    let workspace = match (session, req.files.is_empty()) {
        (Some(session), _) => {
            write_files(&session.workspace, &req.files)?;
            None
        }
        (None, true) => None,
        (None, false) => Some(run_workspace(daemon, &resolved, &req.files)?),
    };
    let record = NewRun {
        id: new_id("run"),
        tenant: caller.tenant.name.clone(),
        key_name: caller.key_name.clone(),
        kind: if session.is_some() {
            "session_run"
        } else {
            "run"
        }
        .into(),
        session_id: session.map(|s| s.id.clone()),
        node: daemon.node.clone(),
        priority: priority.into(),
        request_hash: idempotency.as_ref().map(|_| request_hash(&req)),
        idempotency_key: idempotency,
        request: stored_request(&daemon.config.store, &req),
        profile: Some(resolved.profile.clone()),
        policy: Document::of(&resolved.policy).ok(),
        created_ms: now_ms(),
    };
    let work = Work::Command(CommandWork {
        env: req.env.clone().into_iter().collect(),
        stdin,
        workspace,
        shared_workdir: session.map(|s| s.workspace.dir.clone()),
        code: code_work(&req, &argv),
        argv,
    });
    Ok(Prepared {
        wait: wait_time(daemon, req.wait),
        job: job(daemon, caller, record, priority, resolved, work),
    })
}

/// Assembles a job.
pub fn job(
    daemon: &Daemon,
    caller: &Principal,
    record: NewRun,
    priority: i32,
    resolved: Resolved,
    work: Work,
) -> Job {
    Job {
        record,
        tenant: Arc::clone(&caller.tenant),
        key_name: caller.key_name.clone(),
        priority,
        resolved,
        work,
        queue_timeout: daemon.config.pool.queue_timeout.0,
    }
}

/// A fresh workspace for a run that was sent files, capped like the sandbox's own workdir.
fn run_workspace(
    daemon: &Daemon,
    resolved: &Resolved,
    files: &[FileInput],
) -> Result<OwnedWorkspace, ApiError> {
    let limits = &resolved.policy.limits;
    let spec = WorkspaceSpec {
        bytes: limits.disk.0,
        files: limits.files,
        owner: sandbox_owner(resolved),
        exec: resolved.policy.filesystem.exec_writable,
    };
    let dir = daemon.paths.work.join(new_id("files"));
    let workspace = Workspace::create(&dir, spec)
        .map(OwnedWorkspace)
        .map_err(|e| ApiError::internal("cannot create the run's workspace", e))?;
    write_files(&workspace.0, files)?;
    Ok(workspace)
}

#[cfg(test)]
mod tests {
    use super::{stored_request, StoreConfig};
    use crate::api::types::{FileInput, RunRequest};

    #[test]
    fn a_request_with_nothing_to_leave_out_is_stored_as_sent() {
        let plain = RunRequest {
            command: Some(vec!["/bin/true".into()]),
            wait: Some(60.0),
            ..RunRequest::default()
        };
        let stored = stored_request(&StoreConfig::default(), &plain);
        assert_eq!(stored.value(), serde_json::to_value(&plain).unwrap());
    }

    #[test]
    fn env_values_stdin_and_file_contents_are_left_out_unless_kept() {
        let secret = RunRequest {
            command: Some(vec!["/bin/true".into()]),
            env: [("TOKEN".to_string(), "s3cret".to_string())].into(),
            stdin: Some("hidden".into()),
            files: vec![FileInput {
                path: "a.txt".into(),
                content: Some("private".into()),
                content_base64: None,
            }],
            ..RunRequest::default()
        };
        let stored = stored_request(&StoreConfig::default(), &secret);
        for kept in ["s3cret", "hidden", "private"] {
            assert!(
                !stored.text().contains(kept),
                "{kept} stored: {}",
                stored.text()
            );
        }
        let value = stored.value();
        assert_eq!(value["env"]["TOKEN"], "<redacted>");
        assert_eq!(value["stdin"], "<6 bytes, not stored>");
        assert_eq!(value["files"], serde_json::json!([{"path": "a.txt"}]));
    }
}
