//! API v1: the router, the OpenAPI document generated from the handlers, and the middleware
//! every request passes (body limit, uniform errors, HTTP metrics).

mod answer;
mod dashboard;
pub mod extract;
mod files;
mod jobs;
pub(crate) mod prepare;
mod proxy;
mod runs;
pub(crate) mod sessions;
mod stream;
mod system;
pub mod types;

use std::sync::Arc;
use std::time::Instant;

use axum::extract::{DefaultBodyLimit, MatchedPath, Request, State};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use utoipa::openapi::security::{ApiKey, ApiKeyValue, HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::OpenApi;

use crate::daemon::Daemon;
use crate::metrics::{HttpLabels, ReasonLabels};

pub use proxy::FORWARDED;

/// The OpenAPI 3.1 document of API v1.
#[derive(OpenApi)]
#[openapi(
    info(
        title = "airlockd",
        description = "airlock's daemon: run untrusted code behind an OS-enforced boundary, as a service. Every endpoint but /healthz, /v1/openapi.json and /dashboard needs an API key (`Authorization: Bearer <key>` or `X-API-Key`). Errors are `{\"error\": {\"kind\", \"message\", \"fix\"}}`.",
        license(name = "Apache-2.0"),
    ),
    paths(
        runs::create, runs::list, runs::get, runs::cancel, runs::events,
        runs::outputs_root, runs::outputs_file,
        sessions::create, sessions::list, sessions::get, sessions::delete,
        sessions::list_files, sessions::read_file, sessions::write_file, sessions::delete_file,
        sessions::run,
        jobs::worker, jobs::call,
        system::capabilities, system::queue, system::audit, system::verify_audit,
        system::healthz, system::metrics,
        crate::mcp::doc::post, crate::mcp::doc::get, crate::mcp::doc::delete,
    ),
    modifiers(&Security),
    security(("bearer" = []), ("api_key" = [])),
    tags(
        (name = "runs", description = "Run a command or code and get its result, events and record"),
        (name = "sessions", description = "Workspaces that outlive one command: files and runs"),
        (name = "workers", description = "Worker jobs with input and output files"),
        (name = "calls", description = "Python tool calls with typed errors as results"),
        (name = "system", description = "Capabilities, queue, audit, health, metrics"),
        (name = "mcp", description = "The Model Context Protocol over streamable HTTP: airlock's tools for agents"),
    )
)]
pub struct ApiDoc;

struct Security;

impl utoipa::Modify for Security {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(HttpBuilder::new().scheme(HttpAuthScheme::Bearer).build()),
        );
        components.add_security_scheme(
            "api_key",
            SecurityScheme::ApiKey(ApiKey::Header(ApiKeyValue::new("X-API-Key"))),
        );
        // The health check needs no key.
        if let Some(path) = openapi.paths.paths.get_mut("/healthz") {
            if let Some(op) = path.get.as_mut() {
                op.security = Some(vec![
                    utoipa::openapi::security::SecurityRequirement::default(),
                ]);
            }
        }
    }
}

/// The OpenAPI document as pretty JSON (served, and checked in as `openapi.json`).
pub fn openapi_json() -> String {
    let mut text = ApiDoc::openapi().to_pretty_json().unwrap_or_default();
    text.push('\n');
    text
}

async fn openapi() -> Response {
    (
        [(axum::http::header::CONTENT_TYPE, "application/json")],
        openapi_json(),
    )
        .into_response()
}

/// The whole router. `extra` is nested as is (the seam for the MCP server at `/mcp`).
pub fn router(daemon: Arc<Daemon>, extra: Option<(&str, Router)>) -> Router {
    let max_body = daemon.config.server.max_body.0 as usize;
    let max_file = daemon.config.sessions.max_file_bytes.0 as usize;
    let files = get(sessions::read_file)
        .put(sessions::write_file)
        .delete(sessions::delete_file)
        .layer(DefaultBodyLimit::max(max_file));
    let mut api = Router::new()
        .route("/v1/runs", post(runs::create).get(runs::list))
        .route("/v1/runs/{id}", get(runs::get).delete(runs::cancel))
        .route("/v1/runs/{id}/events", get(runs::events))
        .route("/v1/runs/{id}/outputs", get(runs::outputs_root))
        .route("/v1/runs/{id}/outputs/{*path}", get(runs::outputs_file))
        .route("/v1/sessions", post(sessions::create).get(sessions::list))
        .route(
            "/v1/sessions/{id}",
            get(sessions::get).delete(sessions::delete),
        )
        .route("/v1/sessions/{id}/files", get(sessions::list_files))
        .route("/v1/sessions/{id}/files/{*path}", files)
        .route("/v1/sessions/{id}/runs", post(sessions::run))
        .route("/v1/workers", post(jobs::worker))
        .route("/v1/calls", post(jobs::call))
        .route("/v1/capabilities", get(system::capabilities))
        .route("/v1/queue", get(system::queue))
        .route("/v1/audit", get(system::audit))
        .route("/v1/audit/verify", get(system::verify_audit))
        .route("/v1/openapi.json", get(openapi))
        .route("/healthz", get(system::healthz))
        .route("/metrics", get(system::metrics))
        .route("/dashboard", get(dashboard::page))
        .fallback(fallback);
    if let Some((path, router)) = extra {
        api = api.nest_service(path, router);
    }
    api.layer(DefaultBodyLimit::max(max_body))
        .layer(middleware::from_fn_with_state(
            Arc::clone(&daemon),
            count_requests,
        ))
        .layer(middleware::from_fn(crate::error::uniform_errors))
        .with_state(daemon)
}

async fn fallback(uri: axum::http::Uri) -> crate::error::ApiError {
    crate::error::ApiError::new(
        axum::http::StatusCode::NOT_FOUND,
        "not_found",
        format!("no endpoint at {}", uri.path()),
        "check the path; GET /v1/openapi.json lists every endpoint",
    )
}

async fn count_requests(
    State(daemon): State<Arc<Daemon>>,
    request: Request,
    next: Next,
) -> Response {
    let started = Instant::now();
    let route = request
        .extensions()
        .get::<MatchedPath>()
        .map_or_else(|| "unmatched".to_string(), |p| p.as_str().to_string());
    let method = request.method().to_string();
    let mut response = next.run(request).await;
    add_daemon_timing(&mut response, started);
    let labels = HttpLabels {
        route: route.clone(),
        method,
        status: response.status().as_u16().to_string(),
    };
    daemon.metrics.http_requests.get_or_create(&labels).inc();
    daemon
        .metrics
        .http_seconds
        .get_or_create(&ReasonLabels { reason: route })
        .observe(started.elapsed().as_secs_f64());
    response
}

/// Adds `daemon;dur=<ms>` (the request's time in the router, from the request's headers to
/// its response) to an answer that reports the library's share in `Server-Timing`, so a client
/// can tell the daemon's own work from HTTP on the socket and from the sandbox.
fn add_daemon_timing(response: &mut Response, started: Instant) {
    let Some(sandbox) = response.headers().get(SERVER_TIMING) else {
        return;
    };
    let ms = started.elapsed().as_secs_f64() * 1000.0;
    let value = format!(
        "{}, daemon;dur={ms:.3}",
        sandbox.to_str().unwrap_or_default()
    );
    if let Ok(value) = axum::http::HeaderValue::from_str(&value) {
        response.headers_mut().insert(SERVER_TIMING, value);
    }
}

const SERVER_TIMING: &str = "server-timing";

/// For tests and tools: the document as a value.
pub fn openapi_value() -> serde_json::Value {
    serde_json::to_value(ApiDoc::openapi()).unwrap_or_default()
}
