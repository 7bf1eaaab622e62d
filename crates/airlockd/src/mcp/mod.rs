//! The MCP server over streamable HTTP at `/mcp`: airlock-mcp's tools (the same
//! [`airlock_mcp::AirlockMcp`] that `airlock-mcp` serves over stdio) over a
//! [`DaemonExecutor`], behind the API's keys.
//!
//! Every request needs a key, like every other endpoint. Each key gets an MCP service of its
//! own (with its own `Mcp-Session-Id`s), so an MCP session belongs to the key that opened
//! it: another key presenting that id is served by another service, which does not know it
//! (404). The tools act as that key, within its tenant's ceiling. A request carrying an
//! `Origin` (a browser) is refused with 403 unless `mcp.allowed_origins` lists it, as
//! the MCP specification asks of servers to stop DNS-rebinding pages; `Host` is not checked
//! (the key is what authorizes a request, and the daemon may be served under any name).
//! Errors the transport answers itself (406, 415, an unknown session's 404) get the API's
//! error shape from [`crate::error::uniform_errors`]; JSON-RPC errors stay JSON-RPC.
//!
//! Bounds: a key holds at most `mcp.max_sessions_per_key` MCP sessions at once (one more
//! `initialize` is 429), and each MCP session has an executor of its own, so the daemon
//! sessions it opened with `session_create` end with it: on DELETE, or when no request used
//! it for `mcp.session_idle_timeout` (otherwise an agent that went away would hold its
//! tenant's session slots until their own idle timeout).

mod executor;

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use axum::body::Body;
use axum::extract::{FromRequestParts, Request, State};
use axum::http::{header, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Router;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use tokio_util::sync::CancellationToken;
use tower::ServiceExt;

use crate::api::extract::Caller;
use crate::auth::Principal;
use crate::config::McpConfig;
use crate::daemon::Daemon;
use crate::error::ApiError;
use airlock_mcp::AirlockMcp;
pub use executor::DaemonExecutor;

type McpService = StreamableHttpService<AirlockMcp, LocalSessionManager>;

/// The `/mcp` endpoint's state: one MCP service per key, made on the key's first request.
pub struct McpHttp {
    daemon: Arc<Daemon>,
    services: Mutex<HashMap<(String, String), KeyService>>,
    config: McpConfig,
    stop: CancellationToken,
}

/// A key's MCP service and its count of open MCP sessions.
#[derive(Clone)]
struct KeyService {
    service: McpService,
    /// MCP sessions open (each holds one executor, which counts itself here).
    open: Arc<AtomicUsize>,
    /// Taken by an `initialize` from the count's check until its session exists, so two at
    /// once cannot both take the last place.
    opening: Arc<tokio::sync::Mutex<()>>,
}

impl McpHttp {
    pub fn new(daemon: Arc<Daemon>, config: McpConfig) -> Arc<McpHttp> {
        Arc::new(McpHttp {
            daemon,
            services: Mutex::new(HashMap::new()),
            config,
            stop: CancellationToken::new(),
        })
    }

    /// The router to nest at `/mcp` (see [`crate::api::router`]).
    pub fn router(self: &Arc<Self>) -> Router {
        Router::new().fallback(serve).with_state(Arc::clone(self))
    }

    /// Ends every MCP session and its open streams (the daemon is stopping).
    pub fn shutdown(&self) {
        self.stop.cancel();
    }

    fn service_for(&self, caller: &Principal) -> KeyService {
        let key = (caller.tenant.name.clone(), caller.key_name.clone());
        let mut services = self.services.lock().unwrap_or_else(PoisonError::into_inner);
        services
            .entry(key)
            .or_insert_with(|| self.new_service(caller))
            .clone()
    }

    fn new_service(&self, caller: &Principal) -> KeyService {
        let open = Arc::new(AtomicUsize::new(0));
        let (daemon, caller, count) = (Arc::clone(&self.daemon), caller.clone(), open.clone());
        // Called once per MCP session (at its `initialize`): each gets its own executor.
        let each_session = move || {
            let executor = DaemonExecutor::new(daemon.clone(), caller.clone(), count.clone());
            Ok(AirlockMcp::new(Arc::new(executor)))
        };
        let mut config = StreamableHttpServerConfig::default()
            .disable_allowed_hosts()
            .with_allowed_origins(self.config.allowed_origins.clone())
            .enforce_origin_validation()
            .with_cancellation_token(self.stop.child_token());
        config.max_request_body_bytes = self.daemon.config.server.max_body.0 as usize;
        let mut sessions = LocalSessionManager::default();
        sessions.session_config.keep_alive = Some(self.config.session_idle_timeout.0);
        KeyService {
            service: StreamableHttpService::new(each_session, Arc::new(sessions), config),
            open,
            opening: Default::default(),
        }
    }

    fn origin_allowed(&self, request: &Request) -> bool {
        let Some(origin) = request.headers().get(header::ORIGIN) else {
            return true;
        };
        let origin = origin.to_str().unwrap_or_default();
        self.config
            .allowed_origins
            .iter()
            .any(|allowed| allowed == origin)
    }

    /// 429 when the key holds its maximum of MCP sessions.
    fn check_room(&self, keyed: &KeyService, caller: &Principal) -> Result<(), ApiError> {
        let max = self.config.max_sessions_per_key;
        if keyed.open.load(Ordering::Acquire) < max {
            return Ok(());
        }
        self.daemon.metrics.deny("mcp_sessions");
        Err(ApiError::new(
            StatusCode::TOO_MANY_REQUESTS,
            "mcp_sessions",
            format!(
                "key {:?} holds {max} MCP sessions, its maximum (mcp.max_sessions_per_key)",
                caller.key_name
            ),
            "end an MCP session first (DELETE /mcp with its Mcp-Session-Id), or let one idle out",
        ))
    }
}

async fn serve(State(mcp): State<Arc<McpHttp>>, request: Request) -> Response {
    if !mcp.origin_allowed(&request) {
        mcp.daemon.metrics.deny("mcp_origin");
        return ApiError::forbidden(
            "requests from a browser origin are refused at /mcp",
            "call /mcp from a program (no Origin header), or list the origin in mcp.allowed_origins of the daemon's configuration",
        )
        .into_response();
    }
    let (mut parts, body) = request.into_parts();
    let caller = match Caller::from_request_parts(&mut parts, &mcp.daemon).await {
        Ok(Caller(principal)) => principal,
        Err(error) => return error.into_response(),
    };
    let keyed = mcp.service_for(&caller);
    let ending = parts.method == Method::DELETE;
    // A POST without a session id opens one (an `initialize`; rmcp refuses anything else).
    let opening = parts.method == Method::POST && !parts.headers.contains_key("mcp-session-id");
    let _opening = if opening {
        let turn = keyed.opening.lock().await;
        if let Err(error) = mcp.check_room(&keyed, &caller) {
            return error.into_response();
        }
        Some(turn)
    } else {
        None
    };
    let request = Request::from_parts(parts, body);
    let mut response = match keyed.service.oneshot(request).await {
        Ok(response) => response.map(Body::new),
        Err(never) => match never {},
    };
    // The session is ended when the DELETE is answered: say so with 200, which clients
    // (the official SDK among them) expect, rather than rmcp's 202.
    if ending && response.status() == StatusCode::ACCEPTED {
        *response.status_mut() = StatusCode::OK;
    }
    response
}

/// The OpenAPI description of `/mcp` (the transport itself is rmcp's; these functions only
/// carry the documentation).
pub mod doc {
    #![allow(dead_code)]

    use crate::error::ErrorBody;

    /// Sends one JSON-RPC message of the Model Context Protocol (streamable HTTP transport).
    /// `initialize` opens an MCP session (its id comes back in `Mcp-Session-Id`, to send with
    /// every later request); tools: run_code, run_command, session_create, session_close,
    /// file_read, file_write, describe_policy. The key's tenant ceiling decides what runs may
    /// do. Send `Accept: application/json, text/event-stream`.
    #[utoipa::path(
        post, path = "/mcp", tag = "mcp",
        request_body(content = Object, description = "A JSON-RPC 2.0 request or notification", content_type = "application/json"),
        params(("Mcp-Session-Id" = Option<String>, Header, description = "The MCP session, from the answer to `initialize`")),
        responses(
            (status = 200, description = "The JSON-RPC answer, as JSON or as an SSE stream", content((Object = "application/json"), (String = "text/event-stream"))),
            (status = 202, description = "A notification or response was accepted"),
            (status = 400, description = "Not a JSON-RPC message, or no session id where one is needed", body = ErrorBody),
            (status = 401, description = "No or unknown API key", body = ErrorBody),
            (status = 403, description = "A browser Origin that the configuration does not allow", body = ErrorBody),
            (status = 404, description = "No such MCP session for this key", body = ErrorBody),
            (status = 406, description = "Accept does not list application/json and text/event-stream", body = ErrorBody),
            (status = 413, description = "Body too large", body = ErrorBody),
            (status = 415, description = "Not `Content-Type: application/json`", body = ErrorBody),
            (status = 429, description = "An `initialize` beyond the key's MCP sessions (`mcp.max_sessions_per_key`)", body = ErrorBody),
        )
    )]
    pub fn post() {}

    /// Opens the MCP session's SSE stream of server messages (`Accept: text/event-stream`).
    #[utoipa::path(
        get, path = "/mcp", tag = "mcp",
        params(("Mcp-Session-Id" = String, Header, description = "The MCP session")),
        responses(
            (status = 200, description = "Server messages", content_type = "text/event-stream", body = String),
            (status = 400, description = "No session id", body = ErrorBody),
            (status = 401, description = "No or unknown API key", body = ErrorBody),
            (status = 403, description = "A browser Origin that the configuration does not allow", body = ErrorBody),
            (status = 404, description = "No such MCP session for this key", body = ErrorBody),
            (status = 406, description = "Accept does not list text/event-stream", body = ErrorBody),
        )
    )]
    pub fn get() {}

    /// Ends the MCP session: runs in flight are cancelled, and the sessions it made with
    /// session_create are ended with it (as is an MCP session idle for
    /// `mcp.session_idle_timeout`).
    #[utoipa::path(
        delete, path = "/mcp", tag = "mcp",
        params(("Mcp-Session-Id" = String, Header, description = "The MCP session")),
        responses(
            (status = 200, description = "Ended"),
            (status = 400, description = "No session id", body = ErrorBody),
            (status = 401, description = "No or unknown API key", body = ErrorBody),
            (status = 404, description = "No such MCP session for this key", body = ErrorBody),
        )
    )]
    pub fn delete() {}
}
