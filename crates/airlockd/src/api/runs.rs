//! `/v1/runs`: create, read, list, stream, cancel; worker outputs.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::Response;
use axum::Json;

use super::extract::{ApiJson, ApiPath, ApiQuery, Caller};
use super::files::{FileRead, Place};
use super::proxy::{forward, Forwardable};
use super::stream::{self, Format, Source};
use super::types::{EventQuery, Listing, RunPage, RunQuery, RunRequest, RunView};
use super::{answer, prepare};
use crate::auth::Principal;
use crate::daemon::Daemon;
use crate::error::{ApiError, ErrorBody};
use crate::store::{RunFilter, RunRow};
use crate::workspace::Workspace;

/// Starts a run.
#[utoipa::path(
    post, path = "/v1/runs", tag = "runs",
    request_body = RunRequest,
    params(("Idempotency-Key" = Option<String>, Header, description = "Makes retries safe: the same key and body return the same run")),
    responses(
        (status = 200, description = "The run finished within `wait`", body = RunView),
        (status = 202, description = "The run is queued or running (see `Location`)", body = RunView),
        (status = 400, description = "Malformed request", body = ErrorBody),
        (status = 401, description = "No or unknown API key", body = ErrorBody),
        (status = 403, description = "Beyond the tenant's ceiling", body = ErrorBody),
        (status = 409, description = "Idempotency key reused for another request", body = ErrorBody),
        (status = 413, description = "Body too large", body = ErrorBody),
        (status = 422, description = "Invalid policy or interpreter", body = ErrorBody),
        (status = 429, description = "Queue full (see `Retry-After`)", body = ErrorBody),
        (status = 503, description = "No slot within the queue timeout, or shutting down (see `Retry-After`)", body = ErrorBody),
    )
)]
pub async fn create(
    State(daemon): State<Arc<Daemon>>,
    Caller(caller): Caller,
    headers: HeaderMap,
    ApiJson(request): ApiJson<RunRequest>,
) -> Result<Response, ApiError> {
    let entered = std::time::Instant::now();
    let idempotency = prepare::idempotency_key(&headers)?;
    let prepared = prepare::run(&daemon, &caller, request, None, idempotency).await?;
    tracing::debug!(
        prepare_us = entered.elapsed().as_micros() as u64,
        "prepared"
    );
    answer::submit(&daemon, prepared).await
}

/// The run with `id`, if the caller may see it (another tenant's run is "not found").
pub async fn visible_run(
    daemon: &Daemon,
    caller: &Principal,
    id: &str,
) -> Result<RunRow, ApiError> {
    match daemon.store.run(id).await.map_err(ApiError::store)? {
        Some(row) if caller.may_access(&row.tenant) => Ok(row),
        _ => Err(ApiError::not_found("run", id)),
    }
}

/// A run's record.
#[utoipa::path(
    get, path = "/v1/runs/{id}", tag = "runs",
    params(("id" = String, Path, description = "Run id")),
    responses(
        (status = 200, description = "The run", body = RunView),
        (status = 401, description = "No or unknown API key", body = ErrorBody),
        (status = 404, description = "No such run visible to this key", body = ErrorBody),
    )
)]
pub async fn get(
    State(daemon): State<Arc<Daemon>>,
    Caller(caller): Caller,
    ApiPath(id): ApiPath<String>,
) -> Result<Json<RunView>, ApiError> {
    let row = visible_run(&daemon, &caller, &id).await?;
    Ok(Json(RunView::from_row(&row)))
}

/// Cancels a run: a queued run leaves the queue; a running one is stopped (SIGTERM, then
/// SIGKILL after its grace period). A finished run is returned as it is.
#[utoipa::path(
    delete, path = "/v1/runs/{id}", tag = "runs",
    params(("id" = String, Path, description = "Run id")),
    responses(
        (status = 200, description = "The run has ended", body = RunView),
        (status = 202, description = "Cancellation asked; the run is stopping", body = RunView),
        (status = 401, description = "No or unknown API key", body = ErrorBody),
        (status = 404, description = "No such run visible to this key", body = ErrorBody),
        (status = 502, description = "The node running it cannot be reached", body = ErrorBody),
    )
)]
pub async fn cancel(
    State(daemon): State<Arc<Daemon>>,
    Caller(caller): Caller,
    request: Forwardable,
    ApiPath(id): ApiPath<String>,
) -> Result<Response, ApiError> {
    let row = visible_run(&daemon, &caller, &id).await?;
    if row.is_terminal() {
        return Ok(answer::run_response(row, false));
    }
    if row.node != daemon.node {
        return forward(&daemon, &row.node, &request, Bytes::new()).await;
    }
    if let Some(live) = daemon.engine.live(&id) {
        live.stop(None);
        live.wait_done(Duration::from_secs(5)).await;
    }
    let row = visible_run(&daemon, &caller, &id).await?;
    Ok(answer::run_response(row, false))
}

/// Lists runs, newest first, a page at a time.
#[utoipa::path(
    get, path = "/v1/runs", tag = "runs",
    params(RunQuery),
    responses(
        (status = 200, description = "One page of runs", body = RunPage),
        (status = 400, description = "Bad filter", body = ErrorBody),
        (status = 401, description = "No or unknown API key", body = ErrorBody),
        (status = 403, description = "A tenant key asked for another tenant", body = ErrorBody),
    )
)]
pub async fn list(
    State(daemon): State<Arc<Daemon>>,
    Caller(caller): Caller,
    ApiQuery(query): ApiQuery<RunQuery>,
) -> Result<Json<RunPage>, ApiError> {
    let tenant = tenant_filter(&caller, query.tenant.as_deref())?;
    let since_ms = match &query.since {
        Some(text) => Some(super::types::parse_time(text).ok_or_else(|| {
            ApiError::bad_request(
                format!("since = {text:?} is not a time"),
                "give RFC 3339 (2026-01-02T03:04:05Z) or Unix milliseconds",
            )
        })?),
        None => None,
    };
    let limit = query.limit.unwrap_or(50).clamp(1, 1000);
    let filter = RunFilter {
        tenant,
        status: query.status.clone(),
        session_id: query.session.clone(),
        since_ms,
        before_id: query.cursor.clone(),
        limit,
    };
    let rows = daemon
        .store
        .list_runs(&filter)
        .await
        .map_err(ApiError::store)?;
    let next_cursor = (rows.len() as i64 == limit)
        .then(|| rows.last().map(|r| r.id.clone()))
        .flatten();
    Ok(Json(RunPage {
        runs: rows.iter().map(RunView::from_row).collect(),
        next_cursor,
    }))
}

/// The tenant a listing is limited to: a tenant key sees its own, an admin key any or all.
pub fn tenant_filter(caller: &Principal, asked: Option<&str>) -> Result<Option<String>, ApiError> {
    match asked {
        Some(tenant) if !caller.may_access(tenant) => Err(ApiError::forbidden(
            format!(
                "key {:?} of tenant {:?} may not list tenant {tenant:?}",
                caller.key_name, caller.tenant.name
            ),
            "leave out `tenant`, or use an admin key",
        )),
        Some(tenant) => Ok(Some(tenant.to_string())),
        None if caller.tenant.admin => Ok(None),
        None => Ok(Some(caller.tenant.name.clone())),
    }
}

/// The run's events as a stream: `started`, `stdout`, `stderr`, `progress`, `log`,
/// `network`, then `ended` with the full record.
#[utoipa::path(
    get, path = "/v1/runs/{id}/events", tag = "runs",
    params(("id" = String, Path, description = "Run id"), EventQuery,
           ("Last-Event-ID" = Option<String>, Header, description = "SSE resume: the last `seq` received")),
    responses(
        (status = 200, description = "The stream (SSE or NDJSON; one `RunEventWire` per event)", content((crate::engine::events::RunEventWire = "application/x-ndjson"), (String = "text/event-stream"))),
        (status = 400, description = "Unknown format", body = ErrorBody),
        (status = 401, description = "No or unknown API key", body = ErrorBody),
        (status = 404, description = "No such run visible to this key", body = ErrorBody),
        (status = 502, description = "The node running it cannot be reached", body = ErrorBody),
    )
)]
pub async fn events(
    State(daemon): State<Arc<Daemon>>,
    Caller(caller): Caller,
    request: Forwardable,
    ApiPath(id): ApiPath<String>,
    ApiQuery(query): ApiQuery<EventQuery>,
) -> Result<Response, ApiError> {
    let format = Format::choose(query.format.as_deref(), &request.headers).ok_or_else(|| {
        ApiError::bad_request(
            "format must be `sse` or `ndjson`",
            "leave it out to choose by Accept",
        )
    })?;
    let resume = request
        .headers
        .get("last-event-id")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok())
        .map(|last| last + 1);
    let from = query.from.or(resume).unwrap_or(0).min(u32::MAX as u64) as usize;
    let row = visible_run(&daemon, &caller, &id).await?;
    if !row.is_terminal() && row.node != daemon.node {
        return forward(&daemon, &row.node, &request, Bytes::new()).await;
    }
    let source = match daemon.engine.live(&id) {
        Some(live) => Source::Live(live),
        None => Source::Stored(daemon.store.events(&id).await.map_err(ApiError::store)?),
    };
    Ok(stream::respond(
        Arc::clone(&daemon),
        id,
        source,
        from,
        format,
    ))
}

/// A worker's outputs: the listing of its `out/` as ingested.
#[utoipa::path(
    get, path = "/v1/runs/{id}/outputs", tag = "workers",
    params(("id" = String, Path, description = "Run id of a worker")),
    responses(
        (status = 200, description = "Listing of the outputs' top directory", body = Listing),
        (status = 404, description = "No such run, or it has no outputs", body = ErrorBody),
    )
)]
pub async fn outputs_root(read: FileRead) -> Result<Response, ApiError> {
    outputs(read).await
}

/// A file (or directory listing) of a worker's outputs.
#[utoipa::path(
    get, path = "/v1/runs/{id}/outputs/{path}", tag = "workers",
    params(("id" = String, Path, description = "Run id of a worker"), ("path" = String, Path, description = "Relative path")),
    responses(
        (status = 200, description = "The file's bytes, or a listing for a directory", content((Listing = "application/json"), (String = "application/octet-stream"))),
        (status = 400, description = "Bad path", body = ErrorBody),
        (status = 404, description = "No such run or file", body = ErrorBody),
    )
)]
pub async fn outputs_file(read: FileRead) -> Result<Response, ApiError> {
    outputs(read).await
}

/// A worker's outputs, from here or from the node that ran it.
async fn outputs(read: FileRead) -> Result<Response, ApiError> {
    let row = visible_run(&read.daemon, &read.caller, &read.id).await?;
    if row.node != read.daemon.node {
        return read.answer(Place::Elsewhere(row.node)).await;
    }
    let dir = read.daemon.paths.outputs.join(&row.id);
    if row.kind != "worker" || !dir.is_dir() {
        return Err(ApiError::not_found("output directory of run", &read.id));
    }
    read.answer(Place::Here(&Workspace::adopt(&dir, None, None)))
        .await
}
