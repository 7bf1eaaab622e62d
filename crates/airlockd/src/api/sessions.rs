//! `/v1/sessions`: workspaces that outlive one command, their files, and their runs.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;

use super::answer;
use super::extract::{ApiJson, ApiPath, Caller};
use super::files::FileRead;
pub(crate) use super::files::Place;
use super::prepare::{self, new_id, sandbox_owner};
use super::proxy::{forward, Forwardable};
use super::types::{Listing, RunRequest, RunView, SessionList, SessionRequest, SessionView};
use crate::auth::Principal;
use crate::daemon::Daemon;
use crate::error::{ApiError, ErrorBody};
use crate::resolve::Violation;
use crate::sessions::{LiveSession, NewSession};
use crate::store::SessionRow;
use crate::workspace::{SafePath, WorkspaceSpec};

/// Creates a session.
#[utoipa::path(
    post, path = "/v1/sessions", tag = "sessions",
    request_body = SessionRequest,
    responses(
        (status = 201, description = "The session", body = SessionView),
        (status = 400, description = "Malformed request", body = ErrorBody),
        (status = 401, description = "No or unknown API key", body = ErrorBody),
        (status = 403, description = "Beyond the tenant's ceiling or the daemon's session limits", body = ErrorBody),
        (status = 429, description = "The tenant holds its maximum of sessions", body = ErrorBody),
    )
)]
pub async fn create(
    State(daemon): State<Arc<Daemon>>,
    Caller(caller): Caller,
    ApiJson(request): ApiJson<SessionRequest>,
) -> Result<Response, ApiError> {
    let row = open(&daemon, &caller, &request).await?;
    Ok((StatusCode::CREATED, Json(SessionView::from_row(&row))).into_response())
}

/// Creates a session of the caller's tenant within its ceiling and the daemon's caps (also
/// what the MCP tool `session_create` does).
pub(crate) async fn open(
    daemon: &Daemon,
    caller: &Principal,
    request: &SessionRequest,
) -> Result<SessionRow, ApiError> {
    if daemon.engine.is_draining() {
        return Err(ApiError::shutting_down());
    }
    let resolved =
        prepare::policy(daemon, caller, request.profile.as_deref(), &request.policy).await?;
    let new = session_terms(daemon, caller, request, &resolved).await?;
    let held = daemon
        .store
        .count_active_sessions(&caller.tenant.name)
        .await
        .map_err(ApiError::store)?;
    let max = daemon.config.sessions.max_per_tenant;
    if held >= max as i64 {
        daemon.metrics.deny("session_limit");
        return Err(ApiError::new(
            StatusCode::TOO_MANY_REQUESTS,
            "session_limit",
            format!(
                "tenant {:?} holds {held} sessions, its maximum ({max})",
                caller.tenant.name
            ),
            "delete sessions you no longer need",
        )
        .with_retry_after(60));
    }
    let (_, row) = daemon
        .sessions
        .create(new_id("ses"), new)
        .await
        .map_err(|e| ApiError::internal("cannot create the session", e))?;
    Ok(row)
}

/// Idle timeout, lifetime and caps of a new session, within the daemon's maximums.
async fn session_terms(
    daemon: &Daemon,
    caller: &Principal,
    request: &SessionRequest,
    resolved: &crate::resolve::Resolved,
) -> Result<NewSession, ApiError> {
    let limits = &daemon.config.sessions;
    let idle = request
        .idle_timeout
        .map_or(limits.default_idle_timeout.0, |s| s.0);
    let lifetime = request
        .max_lifetime
        .map_or(limits.default_lifetime.0, |s| s.0);
    let bytes = request.disk.map_or(limits.default_disk.0, |b| b.0);
    let files = request.files.unwrap_or(limits.default_files);
    let checks = [
        (
            "idle_timeout",
            idle > limits.max_idle_timeout.0,
            format!("{}s", idle.as_secs()),
            format!("{}s", limits.max_idle_timeout.0.as_secs()),
        ),
        (
            "max_lifetime",
            lifetime > limits.max_lifetime.0,
            format!("{}s", lifetime.as_secs()),
            format!("{}s", limits.max_lifetime.0.as_secs()),
        ),
        (
            "disk",
            bytes > limits.max_disk.0,
            bytes.to_string(),
            limits.max_disk.0.to_string(),
        ),
        (
            "files",
            files > limits.max_files,
            files.to_string(),
            limits.max_files.to_string(),
        ),
    ];
    for (key, over, asked, ceiling) in checks {
        if over {
            let v = Violation {
                key: format!("sessions.{key}"),
                asked,
                ceiling,
            };
            return Err(prepare::refuse(daemon, caller, &v).await);
        }
    }
    if idle.is_zero() || lifetime.is_zero() || bytes < 1 << 20 || files < 16 {
        return Err(ApiError::invalid(
            "invalid_session",
            "idle_timeout and max_lifetime must be above zero, disk at least 1MiB and files at least 16",
            "raise the values",
        ));
    }
    Ok(NewSession {
        tenant: caller.tenant.name.clone(),
        key_name: caller.key_name.clone(),
        profile: resolved.profile.clone(),
        policy: request.policy.clone(),
        spec: WorkspaceSpec {
            bytes,
            files,
            owner: sandbox_owner(resolved),
            exec: resolved.policy.filesystem.exec_writable,
        },
        idle: idle.max(Duration::from_secs(1)),
        lifetime,
    })
}

/// Sessions visible to the key.
#[utoipa::path(
    get, path = "/v1/sessions", tag = "sessions",
    responses(
        (status = 200, description = "Sessions, newest first", body = SessionList),
        (status = 401, description = "No or unknown API key", body = ErrorBody),
    )
)]
pub async fn list(
    State(daemon): State<Arc<Daemon>>,
    Caller(caller): Caller,
) -> Result<Json<SessionList>, ApiError> {
    let tenant = (!caller.tenant.admin).then_some(caller.tenant.name.as_str());
    let rows = daemon
        .store
        .list_sessions(tenant, 200)
        .await
        .map_err(ApiError::store)?;
    Ok(Json(SessionList {
        sessions: rows.iter().map(SessionView::from_row).collect(),
    }))
}

async fn visible_session(
    daemon: &Daemon,
    caller: &Principal,
    id: &str,
) -> Result<SessionRow, ApiError> {
    match daemon.store.session(id).await.map_err(ApiError::store)? {
        Some(row) if caller.may_access(&row.tenant) => Ok(row),
        _ => Err(ApiError::not_found("session", id)),
    }
}

/// Where an active session lives: here, or on another node.
pub(crate) async fn active_session(
    daemon: &Daemon,
    caller: &Principal,
    id: &str,
) -> Result<Place<Arc<LiveSession>>, ApiError> {
    let row = visible_session(daemon, caller, id).await?;
    if row.status != "active" {
        return Err(ApiError::conflict(
            "session_ended",
            format!(
                "session {id} has ended ({})",
                row.end_reason.unwrap_or(row.status)
            ),
            "create a new session",
        ));
    }
    if row.node != daemon.node {
        return Ok(Place::Elsewhere(row.node));
    }
    match daemon.sessions.get(id) {
        Some(session) if !session.is_ended() => Ok(Place::Here(session)),
        _ => Err(ApiError::conflict(
            "session_ended",
            format!("session {id} is ending"),
            "create a new session",
        )),
    }
}

/// A session's record.
#[utoipa::path(
    get, path = "/v1/sessions/{id}", tag = "sessions",
    params(("id" = String, Path, description = "Session id")),
    responses(
        (status = 200, description = "The session", body = SessionView),
        (status = 404, description = "No such session visible to this key", body = ErrorBody),
    )
)]
pub async fn get(
    State(daemon): State<Arc<Daemon>>,
    Caller(caller): Caller,
    ApiPath(id): ApiPath<String>,
) -> Result<Json<SessionView>, ApiError> {
    let row = visible_session(&daemon, &caller, &id).await?;
    Ok(Json(SessionView::from_row(&row)))
}

/// Ends a session: cancels its runs and removes its workspace with everything in it.
#[utoipa::path(
    delete, path = "/v1/sessions/{id}", tag = "sessions",
    params(("id" = String, Path, description = "Session id")),
    responses(
        (status = 200, description = "The session, ended", body = SessionView),
        (status = 404, description = "No such session visible to this key", body = ErrorBody),
        (status = 409, description = "The session had already ended", body = ErrorBody),
    )
)]
pub async fn delete(
    State(daemon): State<Arc<Daemon>>,
    Caller(caller): Caller,
    request: Forwardable,
    ApiPath(id): ApiPath<String>,
) -> Result<Response, ApiError> {
    match active_session(&daemon, &caller, &id).await? {
        Place::Elsewhere(node) => forward(&daemon, &node, &request, Bytes::new()).await,
        Place::Here(session) => {
            daemon
                .sessions
                .end(&session, &daemon.engine, "deleted", "deleted by its owner")
                .await;
            let row = visible_session(&daemon, &caller, &id).await?;
            Ok(Json(SessionView::from_row(&row)).into_response())
        }
    }
}

/// Lists the workspace's top directory.
#[utoipa::path(
    get, path = "/v1/sessions/{id}/files", tag = "sessions",
    params(("id" = String, Path, description = "Session id")),
    responses(
        (status = 200, description = "The listing", body = Listing),
        (status = 404, description = "No such session visible to this key", body = ErrorBody),
    )
)]
pub async fn list_files(read: FileRead) -> Result<Response, ApiError> {
    read_at(read).await
}

/// Reads a file (bytes) or lists a directory (JSON) of the workspace.
#[utoipa::path(
    get, path = "/v1/sessions/{id}/files/{path}", tag = "sessions",
    params(("id" = String, Path, description = "Session id"), ("path" = String, Path, description = "Relative path; no `..`, links are never followed")),
    responses(
        (status = 200, description = "The file's bytes, or a listing for a directory", content((Listing = "application/json"), (String = "application/octet-stream"))),
        (status = 400, description = "Bad path", body = ErrorBody),
        (status = 403, description = "A link out of the workspace, or a hardlinked file", body = ErrorBody),
        (status = 404, description = "No such session or file", body = ErrorBody),
        (status = 409, description = "Not a regular file, or changed while being read", body = ErrorBody),
        (status = 413, description = "Larger than the daemon's file limit", body = ErrorBody),
    )
)]
pub async fn read_file(read: FileRead) -> Result<Response, ApiError> {
    read_at(read).await
}

async fn read_at(read: FileRead) -> Result<Response, ApiError> {
    match active_session(&read.daemon, &read.caller, &read.id).await? {
        Place::Elsewhere(node) => read.answer(Place::Elsewhere(node)).await,
        Place::Here(session) => {
            session.touch();
            read.answer(Place::Here(&session.workspace)).await
        }
    }
}

/// Writes a file (parents are created; an existing file is replaced).
#[utoipa::path(
    put, path = "/v1/sessions/{id}/files/{path}", tag = "sessions",
    params(("id" = String, Path, description = "Session id"), ("path" = String, Path, description = "Relative path")),
    request_body(content = Vec<u8>, content_type = "application/octet-stream"),
    responses(
        (status = 204, description = "Written"),
        (status = 400, description = "Bad path", body = ErrorBody),
        (status = 403, description = "The path goes through a link", body = ErrorBody),
        (status = 404, description = "No such session", body = ErrorBody),
        (status = 409, description = "A directory is in the way", body = ErrorBody),
        (status = 413, description = "Larger than the daemon's file limit, or the workspace's disk or file cap is reached", body = ErrorBody),
    )
)]
pub async fn write_file(
    State(daemon): State<Arc<Daemon>>,
    Caller(caller): Caller,
    request: Forwardable,
    ApiPath((id, path)): ApiPath<(String, String)>,
    body: Bytes,
) -> Result<Response, ApiError> {
    match active_session(&daemon, &caller, &id).await? {
        Place::Elsewhere(node) => forward(&daemon, &node, &request, body).await,
        Place::Here(session) => {
            session.touch();
            let safe = SafePath::parse(&path).map_err(|e| prepare::file_error(&e))?;
            tokio::task::block_in_place(|| session.workspace.write_file(&safe, &body))
                .map_err(|e| prepare::file_error(&e))?;
            Ok(StatusCode::NO_CONTENT.into_response())
        }
    }
}

/// Removes a file or an empty directory.
#[utoipa::path(
    delete, path = "/v1/sessions/{id}/files/{path}", tag = "sessions",
    params(("id" = String, Path, description = "Session id"), ("path" = String, Path, description = "Relative path")),
    responses(
        (status = 204, description = "Removed"),
        (status = 400, description = "Bad path", body = ErrorBody),
        (status = 404, description = "No such session or file", body = ErrorBody),
        (status = 409, description = "A directory that is not empty", body = ErrorBody),
    )
)]
pub async fn delete_file(
    State(daemon): State<Arc<Daemon>>,
    Caller(caller): Caller,
    request: Forwardable,
    ApiPath((id, path)): ApiPath<(String, String)>,
) -> Result<Response, ApiError> {
    match active_session(&daemon, &caller, &id).await? {
        Place::Elsewhere(node) => forward(&daemon, &node, &request, Bytes::new()).await,
        Place::Here(session) => {
            session.touch();
            let safe = SafePath::parse(&path).map_err(|e| prepare::file_error(&e))?;
            session
                .workspace
                .remove_entry(&safe)
                .map_err(|e| prepare::file_error(&e))?;
            Ok(StatusCode::NO_CONTENT.into_response())
        }
    }
}

/// Runs a command in the session's workspace, in a fresh sandbox.
#[utoipa::path(
    post, path = "/v1/sessions/{id}/runs", tag = "sessions",
    params(("id" = String, Path, description = "Session id"),
           ("Idempotency-Key" = Option<String>, Header, description = "Makes retries safe")),
    request_body = RunRequest,
    responses(
        (status = 200, description = "The run finished within `wait`", body = RunView),
        (status = 202, description = "The run is queued or running", body = RunView),
        (status = 400, description = "Malformed request", body = ErrorBody),
        (status = 403, description = "Beyond the tenant's ceiling", body = ErrorBody),
        (status = 404, description = "No such session", body = ErrorBody),
        (status = 409, description = "The session has ended", body = ErrorBody),
        (status = 429, description = "Queue full", body = ErrorBody),
        (status = 503, description = "No slot in time, or shutting down", body = ErrorBody),
    )
)]
pub async fn run(
    State(daemon): State<Arc<Daemon>>,
    Caller(caller): Caller,
    request: Forwardable,
    headers: HeaderMap,
    ApiPath(id): ApiPath<String>,
    body: Bytes,
) -> Result<Response, ApiError> {
    let session = match active_session(&daemon, &caller, &id).await? {
        Place::Elsewhere(node) => return forward(&daemon, &node, &request, body).await,
        Place::Here(session) => session,
    };
    let run_request: RunRequest = serde_json::from_slice(&body).map_err(|e| {
        ApiError::invalid(
            "invalid_request",
            e.to_string(),
            "send a run request as in POST /v1/runs",
        )
    })?;
    session.touch();
    let idempotency = prepare::idempotency_key(&headers)?;
    let prepared = prepare::run(&daemon, &caller, run_request, Some(&session), idempotency).await?;
    let response = answer::submit(&daemon, prepared).await;
    session.touch();
    response
}
