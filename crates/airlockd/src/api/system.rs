//! Health, metrics, capabilities, the queue, the audit log.

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::json;

use super::extract::{Admin, ApiQuery, Caller};
use super::types::{parse_time, AuditPage, AuditQuery, Health, QueueView};
use crate::daemon::Daemon;
use crate::error::{ApiError, ErrorBody};
use crate::store::{AuditFilter, ChainCheck};

/// Liveness and readiness: 200 while serving, 503 while draining or when the store is down.
#[utoipa::path(
    get, path = "/healthz", tag = "system",
    responses(
        (status = 200, description = "Serving", body = Health),
        (status = 503, description = "Draining, or the store does not answer", body = Health),
    )
)]
pub async fn healthz(State(daemon): State<Arc<Daemon>>) -> Response {
    let store = daemon.store.ping().await.is_ok();
    let draining = daemon.engine.is_draining();
    let health = Health {
        status: if draining {
            "draining"
        } else if store {
            "ok"
        } else {
            "store_unavailable"
        }
        .into(),
        node: daemon.node.clone(),
        store,
        version: env!("CARGO_PKG_VERSION").into(),
    };
    let status = if store && !draining {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (status, Json(health)).into_response()
}

/// Prometheus metrics (admin keys).
#[utoipa::path(
    get, path = "/metrics", tag = "system",
    responses(
        (status = 200, description = "The text exposition format", body = String, content_type = "text/plain"),
        (status = 401, description = "No or unknown API key", body = ErrorBody),
        (status = 403, description = "Not an admin key", body = ErrorBody),
    )
)]
pub async fn metrics(State(daemon): State<Arc<Daemon>>, _admin: Admin) -> Response {
    daemon.engine.refresh_gauges();
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        daemon.metrics.encode(),
    )
        .into_response()
}

/// What this node can do (`airlock doctor` as JSON), and what this key may ask for.
#[utoipa::path(
    get, path = "/v1/capabilities", tag = "system",
    responses(
        (status = 200, description = "Backends, layers, network modes, interpreters, the caller's ceiling", body = Object),
        (status = 401, description = "No or unknown API key", body = ErrorBody),
    )
)]
pub async fn capabilities(
    State(daemon): State<Arc<Daemon>>,
    Caller(caller): Caller,
) -> Json<serde_json::Value> {
    let tenant = &caller.tenant;
    let ceiling = &tenant.ceiling;
    let toolsets: Vec<&String> = tenant.toolsets.iter().collect();
    Json(json!({
        "version": env!("CARGO_PKG_VERSION"),
        "node": daemon.node,
        "host": daemon.doctor,
        "network_modes": {
            "none": {"available": true},
            "host": {"available": true},
            "allowlist": {"available": true, "note": "through the egress gate (docs/network.md); a backend that cannot carry the gate refuses the run, naming why"},
            "report": {"available": true, "note": "any public address, every decision recorded: for trusted code"},
        },
        "interpreters": daemon.interpreters.allowed(),
        "limits": {
            "max_wait_s": daemon.config.server.max_wait.0.as_secs_f64(),
            "max_body_bytes": daemon.config.server.max_body.0,
            "max_queued": daemon.config.pool.max_queued,
            "max_concurrent": daemon.config.max_concurrent(),
            "queue_timeout_s": daemon.config.pool.queue_timeout.0.as_secs_f64(),
            "session_max_lifetime_s": daemon.config.sessions.max_lifetime.0.as_secs_f64(),
            "session_max_disk_bytes": daemon.config.sessions.max_disk.0,
            "max_file_bytes": daemon.config.sessions.max_file_bytes.0,
        },
        "tenant": {
            "name": tenant.name,
            "key": caller.key_name,
            "admin": tenant.admin,
            "profiles": tenant.policies.keys().collect::<Vec<_>>(),
            "default_profile": tenant.default_profile,
            "share": tenant.share,
            "max_queued": tenant.max_queued,
            "priority": {"min": tenant.priority.min, "max": tenant.priority.max, "default": tenant.priority.default},
            "toolsets": toolsets,
            "ceiling": {
                "network": ceiling.network,
                "allowlist": ceiling.allowlist,
                "min_isolation": ceiling.min_isolation,
                "allow_degraded": ceiling.allow_degraded,
                "limits": tenant.default_policy().limits,
            },
        },
    }))
}

/// The queue of this node.
#[utoipa::path(
    get, path = "/v1/queue", tag = "system",
    responses(
        (status = 200, description = "Running and queued runs (per tenant: all for admins, own otherwise)", body = QueueView),
        (status = 401, description = "No or unknown API key", body = ErrorBody),
    )
)]
pub async fn queue(State(daemon): State<Arc<Daemon>>, Caller(caller): Caller) -> Json<QueueView> {
    let stats = daemon.engine.admission.stats();
    let visible = |map: BTreeMap<String, usize>| -> BTreeMap<String, usize> {
        map.into_iter()
            .filter(|(t, _)| caller.may_access(t))
            .collect()
    };
    Json(QueueView {
        node: daemon.node.clone(),
        max_concurrent: stats.max_concurrent,
        running: stats.running,
        queued: stats.queued,
        running_per_tenant: visible(stats.running_per_tenant),
        queued_per_tenant: visible(stats.queued_per_tenant),
        draining: daemon.engine.is_draining(),
    })
}

/// Audit records, newest first (a tenant key sees its own tenant's).
#[utoipa::path(
    get, path = "/v1/audit", tag = "system",
    params(AuditQuery),
    responses(
        (status = 200, description = "Records", body = AuditPage),
        (status = 400, description = "Bad filter", body = ErrorBody),
        (status = 401, description = "No or unknown API key", body = ErrorBody),
    )
)]
pub async fn audit(
    State(daemon): State<Arc<Daemon>>,
    Caller(caller): Caller,
    ApiQuery(query): ApiQuery<AuditQuery>,
) -> Result<Json<AuditPage>, ApiError> {
    let since_ms = match &query.since {
        Some(text) => Some(parse_time(text).ok_or_else(|| {
            ApiError::bad_request(
                format!("since = {text:?} is not a time"),
                "give RFC 3339 or Unix milliseconds",
            )
        })?),
        None => None,
    };
    let filter = AuditFilter {
        tenant: (!caller.tenant.admin).then(|| caller.tenant.name.clone()),
        kind: query.kind.clone(),
        since_ms,
        before_id: query.before,
        limit: query.limit.unwrap_or(100),
    };
    let records = daemon
        .store
        .list_audit(&filter)
        .await
        .map_err(ApiError::store)?;
    Ok(Json(AuditPage { records }))
}

/// Recomputes the audit log's hash chain (admin keys).
#[utoipa::path(
    get, path = "/v1/audit/verify", tag = "system",
    responses(
        (status = 200, description = "Whether the chain is intact", body = ChainCheck),
        (status = 401, description = "No or unknown API key", body = ErrorBody),
        (status = 403, description = "Not an admin key", body = ErrorBody),
    )
)]
pub async fn verify_audit(
    State(daemon): State<Arc<Daemon>>,
    _admin: Admin,
) -> Result<Json<ChainCheck>, ApiError> {
    daemon
        .store
        .verify_audit()
        .await
        .map(Json)
        .map_err(ApiError::store)
}
