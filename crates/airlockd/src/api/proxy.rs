//! Requests about a run or session that another node owns go to that node: the store says
//! which node and where it listens (`node.advertise`); [`crate::peers`] says how it is
//! reached (TLS verified against the fleet's CA, or plain HTTP on a trusted network). The caller's key travels with the
//! request (every node knows every key); a forwarded request is marked so that it is never
//! forwarded again.

use axum::body::{Body, Bytes};
use axum::http::{header, HeaderMap, HeaderName, HeaderValue, Method, StatusCode, Uri};
use axum::response::Response;
use http_body_util::Full;

use crate::daemon::Daemon;
use crate::error::ApiError;

/// Marks a request one node forwarded to another.
pub const FORWARDED: &str = "x-airlockd-forwarded-by";

const PASSED_REQUEST_HEADERS: [HeaderName; 5] = [
    header::AUTHORIZATION,
    header::CONTENT_TYPE,
    header::ACCEPT,
    HeaderName::from_static("x-api-key"),
    HeaderName::from_static("last-event-id"),
];

const PASSED_RESPONSE_HEADERS: [HeaderName; 5] = [
    header::CONTENT_TYPE,
    header::CACHE_CONTROL,
    header::RETRY_AFTER,
    header::LOCATION,
    header::CONTENT_DISPOSITION,
];

/// What a handler needs to forward its request.
#[derive(Debug, Clone)]
pub struct Forwardable {
    pub method: Method,
    pub uri: Uri,
    pub headers: HeaderMap,
}

impl<S: Send + Sync> axum::extract::FromRequestParts<S> for Forwardable {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        _: &S,
    ) -> Result<Self, Self::Rejection> {
        Ok(Forwardable {
            method: parts.method.clone(),
            uri: parts.uri.clone(),
            headers: parts.headers.clone(),
        })
    }
}

fn unreachable(node: &str, why: &str) -> ApiError {
    ApiError::new(
        StatusCode::BAD_GATEWAY,
        "node_unreachable",
        format!("node {node:?}, which owns this resource, cannot be reached: {why}"),
        "retry; if the node is gone for good, its runs are marked lost once its heartbeat stops",
    )
    .with_retry_after(2)
}

/// Sends the request to `node` and relays its answer (streamed).
pub async fn forward(
    daemon: &Daemon,
    node: &str,
    request: &Forwardable,
    body: Bytes,
) -> Result<Response, ApiError> {
    if request.headers.contains_key(FORWARDED) {
        return Err(unreachable(node, "the request was already forwarded once"));
    }
    let advertise = daemon
        .store
        .node(node)
        .await
        .map_err(ApiError::store)?
        .and_then(|(advertise, _)| advertise)
        .ok_or_else(|| unreachable(node, "it advertises no address (node.advertise)"))?;
    let path = request
        .uri
        .path_and_query()
        .map(|p| p.as_str())
        .unwrap_or("/");
    let mut outgoing = hyper::Request::builder()
        .method(request.method.clone())
        .uri(path);
    for name in PASSED_REQUEST_HEADERS {
        if let Some(value) = request.headers.get(&name) {
            outgoing = outgoing.header(name, value);
        }
    }
    let outgoing = outgoing
        .header(
            FORWARDED,
            HeaderValue::from_str(&daemon.node).unwrap_or(HeaderValue::from_static("node")),
        )
        .body(Full::new(body))
        .map_err(|e| unreachable(node, &e.to_string()))?;
    let answer = daemon
        .peers
        .send(&advertise, outgoing)
        .await
        .map_err(|e| unreachable(node, &e))?;
    let (parts, incoming) = answer.into_parts();
    let mut response = Response::new(Body::new(incoming));
    *response.status_mut() = parts.status;
    for name in PASSED_RESPONSE_HEADERS {
        if let Some(value) = parts.headers.get(&name) {
            response.headers_mut().insert(name, value.clone());
        }
    }
    Ok(response)
}
