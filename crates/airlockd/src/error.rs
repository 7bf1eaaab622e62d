//! The one error shape of the API: `{"error": {"kind", "message", "fix"}}` with the status code
//! that fits, and `Retry-After` where waiting helps.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// What went wrong, what it was about, and how to fix it.
#[derive(Serialize, Deserialize, ToSchema, Debug, Clone, PartialEq, Eq)]
pub struct ErrorDetail {
    /// A stable, machine-readable kind, e.g. `ceiling`, `queue_full`, `not_found`.
    pub kind: String,
    /// What happened, naming the values involved.
    pub message: String,
    /// What the caller (or the operator) can do about it.
    pub fix: String,
}

/// The body of every error response.
#[derive(Serialize, Deserialize, ToSchema, Debug, Clone)]
pub struct ErrorBody {
    pub error: ErrorDetail,
}

/// An error answered to a request.
#[derive(Debug, Clone)]
pub struct ApiError {
    pub status: StatusCode,
    pub detail: ErrorDetail,
    /// Seconds for `Retry-After`.
    pub retry_after: Option<u64>,
}

impl ApiError {
    pub fn new(
        status: StatusCode,
        kind: &str,
        message: impl Into<String>,
        fix: impl Into<String>,
    ) -> ApiError {
        ApiError {
            status,
            detail: ErrorDetail {
                kind: kind.into(),
                message: message.into(),
                fix: fix.into(),
            },
            retry_after: None,
        }
    }

    pub fn with_retry_after(mut self, seconds: u64) -> ApiError {
        self.retry_after = Some(seconds.max(1));
        self
    }

    pub fn unauthorized(message: impl Into<String>) -> ApiError {
        ApiError::new(
            StatusCode::UNAUTHORIZED,
            "unauthorized",
            message,
            "send a valid API key as `Authorization: Bearer <key>` (or `X-API-Key: <key>`); an operator creates keys with `airlockd new-key`",
        )
    }

    pub fn not_found(what: &str, id: &str) -> ApiError {
        ApiError::new(
            StatusCode::NOT_FOUND,
            "not_found",
            format!("no {what} {id:?} is visible to this key"),
            format!("check the {what} id; records older than the retention period are pruned"),
        )
    }

    pub fn bad_request(message: impl Into<String>, fix: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::BAD_REQUEST, "bad_request", message, fix)
    }

    pub fn invalid(kind: &str, message: impl Into<String>, fix: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::UNPROCESSABLE_ENTITY, kind, message, fix)
    }

    pub fn ceiling(message: impl Into<String>, fix: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::FORBIDDEN, "ceiling", message, fix)
    }

    pub fn forbidden(message: impl Into<String>, fix: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::FORBIDDEN, "forbidden", message, fix)
    }

    pub fn conflict(kind: &str, message: impl Into<String>, fix: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::CONFLICT, kind, message, fix)
    }

    pub fn too_large(message: impl Into<String>, fix: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::PAYLOAD_TOO_LARGE, "too_large", message, fix)
    }

    pub fn shutting_down() -> ApiError {
        ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "shutting_down",
            "this daemon is shutting down and admits no new work",
            "retry on another node, or after the daemon restarts",
        )
        .with_retry_after(5)
    }

    /// A failure of the daemon itself; the cause is logged, not sent.
    pub fn internal(context: &str, cause: impl std::fmt::Display) -> ApiError {
        tracing::error!("{context}: {cause}");
        ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal",
            format!("{context}; the daemon's log has the cause"),
            "retry; if it persists, an operator should read the daemon's log",
        )
    }

    pub fn store(cause: impl std::fmt::Display) -> ApiError {
        tracing::error!("store: {cause}");
        ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "store_unavailable",
            "the run store did not answer",
            "retry shortly; an operator should check the database",
        )
        .with_retry_after(2)
    }
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} ({}): {}",
            self.status, self.detail.kind, self.detail.message
        )
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = ErrorBody { error: self.detail };
        let mut response = (self.status, axum::Json(body)).into_response();
        if let Some(seconds) = self.retry_after {
            if let Ok(value) = HeaderValue::from_str(&seconds.to_string()) {
                response.headers_mut().insert(header::RETRY_AFTER, value);
            }
        }
        response
    }
}

/// Turns the framework's own error responses (unknown route, wrong method, unreadable body)
/// into the one error shape, so that every error a client sees is JSON with a kind and a fix.
pub async fn uniform_errors(
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let response = next.run(request).await;
    let status = response.status();
    let is_json = response
        .headers()
        .get(header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"application/json"));
    if !(status.is_client_error() || status.is_server_error()) || is_json {
        return response;
    }
    let (kind, fix) = match status {
        StatusCode::NOT_FOUND => (
            "not_found",
            "check the path; GET /v1/openapi.json lists every endpoint",
        ),
        StatusCode::METHOD_NOT_ALLOWED => (
            "method_not_allowed",
            "use a method the endpoint lists in /v1/openapi.json",
        ),
        StatusCode::PAYLOAD_TOO_LARGE => (
            "too_large",
            "send a smaller body; the limit is server.max_body in the daemon configuration",
        ),
        StatusCode::UNSUPPORTED_MEDIA_TYPE => (
            "unsupported_media_type",
            "send `Content-Type: application/json` (multipart/form-data for workers)",
        ),
        s if s.is_client_error() => (
            "bad_request",
            "fix the request; GET /v1/openapi.json describes it",
        ),
        _ => (
            "internal",
            "retry; if it persists, an operator should read the daemon's log",
        ),
    };
    let (parts, body) = response.into_parts();
    let text = axum::body::to_bytes(body, 4096).await.unwrap_or_default();
    let message = String::from_utf8_lossy(&text).trim().to_string();
    let message = if message.is_empty() {
        status.canonical_reason().unwrap_or("error").to_lowercase()
    } else {
        message
    };
    let mut rebuilt = ApiError::new(status, kind, message, fix).into_response();
    for name in [header::RETRY_AFTER, header::ALLOW] {
        if let Some(value) = parts.headers.get(&name) {
            rebuilt.headers_mut().insert(name, value.clone());
        }
    }
    rebuilt
}
