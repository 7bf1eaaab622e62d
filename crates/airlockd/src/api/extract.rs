//! Extractors: the caller's key, and JSON, query and path inputs whose rejections use the
//! API's error shape.

use std::sync::Arc;

use axum::extract::rejection::{JsonRejection, PathRejection, QueryRejection};
use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::http::request::Parts;
use axum::http::StatusCode;
use serde::de::DeserializeOwned;

use crate::auth::Principal;
use crate::daemon::Daemon;
use crate::error::ApiError;

/// The authenticated caller.
#[derive(Debug, Clone)]
pub struct Caller(pub Principal);

fn presented_key(parts: &Parts) -> Option<&str> {
    let headers = &parts.headers;
    if let Some(value) = headers.get(axum::http::header::AUTHORIZATION) {
        let text = value.to_str().ok()?;
        let (scheme, key) = text.split_once(' ')?;
        return scheme.eq_ignore_ascii_case("bearer").then_some(key.trim());
    }
    headers
        .get("x-api-key")
        .and_then(|v| v.to_str().ok())
        .map(str::trim)
}

impl FromRequestParts<Arc<Daemon>> for Caller {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, daemon: &Arc<Daemon>) -> Result<Self, ApiError> {
        let path = parts.uri.path().to_string();
        let Some(key) = presented_key(parts) else {
            daemon.metrics.deny("no_key");
            daemon.audit.auth_failed("no key", &path).await;
            return Err(ApiError::unauthorized("no API key was sent"));
        };
        match daemon.keys.recognise(key) {
            Some(principal) => {
                daemon.audit.key_used(principal).await;
                Ok(Caller(principal.clone()))
            }
            None => {
                daemon.metrics.deny("bad_key");
                daemon.audit.auth_failed("unknown key", &path).await;
                Err(ApiError::unauthorized("the API key is not valid"))
            }
        }
    }
}

/// An admin caller (sees every tenant).
#[derive(Debug, Clone)]
pub struct Admin(pub Principal);

impl FromRequestParts<Arc<Daemon>> for Admin {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, daemon: &Arc<Daemon>) -> Result<Self, ApiError> {
        let Caller(principal) = Caller::from_request_parts(parts, daemon).await?;
        if !principal.tenant.admin {
            daemon.metrics.deny("not_admin");
            return Err(ApiError::forbidden(
                format!(
                    "key {:?} of tenant {:?} is not an admin key",
                    principal.key_name, principal.tenant.name
                ),
                "use a key of a tenant with `admin = true`",
            ));
        }
        Ok(Admin(principal))
    }
}

/// A JSON body; malformed bodies get the API's error shape.
pub struct ApiJson<T>(pub T);

impl<T: DeserializeOwned, S: Send + Sync> FromRequest<S> for ApiJson<T> {
    type Rejection = ApiError;

    async fn from_request(request: Request, state: &S) -> Result<Self, ApiError> {
        match axum::Json::<T>::from_request(request, state).await {
            Ok(axum::Json(value)) => Ok(ApiJson(value)),
            Err(rejection) => Err(json_rejection(rejection)),
        }
    }
}

fn json_rejection(rejection: JsonRejection) -> ApiError {
    let message = rejection.body_text();
    match rejection.status() {
        StatusCode::PAYLOAD_TOO_LARGE => ApiError::too_large(
            message,
            "send a smaller body; the limit is server.max_body in the daemon configuration",
        ),
        StatusCode::UNSUPPORTED_MEDIA_TYPE => ApiError::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "unsupported_media_type",
            message,
            "send `Content-Type: application/json`",
        ),
        StatusCode::UNPROCESSABLE_ENTITY => ApiError::invalid(
            "invalid_request",
            message,
            "fix the field the message names; GET /v1/openapi.json describes the body",
        ),
        _ => ApiError::bad_request(message, "send a valid JSON document"),
    }
}

/// Query parameters.
pub struct ApiQuery<T>(pub T);

impl<T: DeserializeOwned, S: Send + Sync> FromRequestParts<S> for ApiQuery<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        axum::extract::Query::<T>::from_request_parts(parts, state)
            .await
            .map(|q| ApiQuery(q.0))
            .map_err(|r: QueryRejection| {
                ApiError::bad_request(r.body_text(), "fix the query parameter the message names")
            })
    }
}

/// Path parameters.
pub struct ApiPath<T>(pub T);

impl<T: DeserializeOwned + Send, S: Send + Sync> FromRequestParts<S> for ApiPath<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        axum::extract::Path::<T>::from_request_parts(parts, state)
            .await
            .map(|p| ApiPath(p.0))
            .map_err(|r: PathRejection| ApiError::bad_request(r.body_text(), "fix the path"))
    }
}
