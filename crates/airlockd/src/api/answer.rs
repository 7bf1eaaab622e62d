//! A prepared run submitted and answered: 200 with the finished record, 202 while it is in
//! flight, 503 when it got no slot; the `Server-Timing` that tells the daemon's time from the
//! library's.

use std::sync::Arc;
use std::time::Duration;

use super::prepare::Prepared;
use crate::daemon::Daemon;
use crate::engine::Submitted;
use crate::error::ApiError;
use crate::store::RunRow;

/// Submits a prepared job and answers: 200 with the finished run, 202 with the queued or
/// running one, 503 when it was refused a slot while the caller waited.
pub async fn submit(
    daemon: &Arc<Daemon>,
    prepared: Prepared,
) -> Result<axum::response::Response, ApiError> {
    let hash = prepared.job.record.request_hash.clone();
    // One deadline for the whole wait: a run on this request's thread until the wait ends
    // (the engine's deadline, from just after this one) leaves none of it to wait for after.
    let until = std::time::Instant::now() + prepared.wait;
    match daemon
        .engine
        .submit_waiting(prepared.job, prepared.wait)
        .await?
    {
        Submitted::Existing(row) => {
            if row.request_hash != hash {
                return Err(ApiError::conflict(
                    "idempotency_key_reused",
                    format!(
                        "the Idempotency-Key was already used for run {} with a different request",
                        row.id
                    ),
                    "use a new key for a different request",
                ));
            }
            Ok(run_response(*row, false))
        }
        Submitted::New(live) => {
            let waited = !prepared.wait.is_zero();
            if waited {
                let left = until.saturating_duration_since(std::time::Instant::now());
                live.wait_done(left).await;
            }
            // The record the run's end stored, as it stored it (read back only while the run
            // is still in flight).
            let row = match live.take_recorded() {
                Some(row) => row,
                None => stored_run(daemon, &live.id).await?,
            };
            if waited && row.status == "rejected" {
                return Err(busy(daemon, &row));
            }
            let sandbox_time = live.sandbox_time().filter(|_| row.is_terminal());
            let mut response = run_response(row, false);
            if let Some(time) = sandbox_time {
                add_server_timing(&mut response, time);
            }
            tracing::debug!(run = %live.id, timeline = %live.timeline().deltas(std::time::Instant::now()), "answered");
            Ok(response)
        }
    }
}

async fn stored_run(daemon: &Daemon, id: &str) -> Result<RunRow, ApiError> {
    daemon
        .store
        .run(id)
        .await
        .map_err(ApiError::store)?
        .ok_or_else(|| ApiError::internal("the run's record vanished", id))
}

pub fn busy(daemon: &Daemon, row: &RunRow) -> ApiError {
    let message = row
        .error
        .as_ref()
        .and_then(|e| e["message"].as_str())
        .unwrap_or("no slot was free in time")
        .to_string();
    ApiError::new(
        axum::http::StatusCode::SERVICE_UNAVAILABLE,
        "busy",
        format!("run {} got no slot: {message}", row.id),
        "retry after the time in Retry-After",
    )
    .with_retry_after(daemon.engine.admission.retry_after())
}

/// `Server-Timing: sandbox;dur=<ms>`: how much of the answer's time the library's run took,
/// so a client can tell the daemon's own cost from the sandbox's.
fn add_server_timing(response: &mut axum::response::Response, sandbox: Duration) {
    let value = format!("sandbox;dur={:.3}", sandbox.as_secs_f64() * 1000.0);
    if let Ok(value) = axum::http::HeaderValue::from_str(&value) {
        response.headers_mut().insert("server-timing", value);
    }
}

/// Bytes reserved for a run's answer: a finished `/bin/true` run's is ~2.2 KB.
const RUN_ANSWER_CAPACITY: usize = 4096;

/// 200 for a finished run (201 when `created`), 202 with `Location` while it is in flight.
pub fn run_response(row: RunRow, created: bool) -> axum::response::Response {
    use axum::http::{header, StatusCode};
    use axum::response::IntoResponse;
    let status = match (row.is_terminal(), created) {
        (true, true) => StatusCode::CREATED,
        (true, false) => StatusCode::OK,
        (false, _) => StatusCode::ACCEPTED,
    };
    let location = header::HeaderValue::from_str(&format!("/v1/runs/{}", row.id));
    let view = super::types::RunView::from(row);
    // Written into one buffer of a record's usual size: axum's `Json` starts at 128 bytes and
    // doubles, and each copy past 1 KiB has glibc's malloc consolidate its free lists.
    let mut body = Vec::with_capacity(RUN_ANSWER_CAPACITY);
    let mut response = match serde_json::to_writer(&mut body, &view) {
        Ok(()) => {
            let json = header::HeaderValue::from_static("application/json");
            (status, [(header::CONTENT_TYPE, json)], body).into_response()
        }
        Err(_) => (status, axum::Json(view)).into_response(),
    };
    if let Ok(location) = location {
        response.headers_mut().insert(header::LOCATION, location);
    }
    response
}
