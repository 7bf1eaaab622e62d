//! Reading a directory the API serves (a worker's outputs, a session's workspace): one
//! extractor for the request, and one answer, from here or from the node that holds it.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;

use super::extract::{ApiPath, Caller};
use super::prepare;
use super::proxy::{forward, Forwardable};
use super::types::Listing;
use crate::auth::Principal;
use crate::daemon::Daemon;
use crate::error::ApiError;
use crate::workspace::{EntryKind, SafePath, Workspace};

/// Where something lives: on this node, or on another one (named).
pub(crate) enum Place<T> {
    Here(T),
    Elsewhere(String),
}

/// A read of a file or a listing under a run's or a session's directory.
pub struct FileRead {
    pub daemon: Arc<Daemon>,
    pub caller: Principal,
    request: Forwardable,
    /// The run's or the session's id.
    pub id: String,
    /// The path under its directory; empty for the top directory.
    path: String,
}

/// The path parameters of both routes: `{id}` and `{id}/{*path}`.
#[derive(Deserialize)]
struct FileAddress {
    id: String,
    #[serde(default)]
    path: String,
}

impl FromRequestParts<Arc<Daemon>> for FileRead {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, daemon: &Arc<Daemon>) -> Result<Self, ApiError> {
        let Caller(caller) = Caller::from_request_parts(parts, daemon).await?;
        let Ok(request) = Forwardable::from_request_parts(parts, daemon).await;
        let ApiPath(address) = ApiPath::<FileAddress>::from_request_parts(parts, daemon).await?;
        Ok(FileRead {
            daemon: Arc::clone(daemon),
            caller,
            request,
            id: address.id,
            path: address.path,
        })
    }
}

impl FileRead {
    /// The file or listing from the workspace here, or the request forwarded to its node.
    pub(crate) async fn answer(&self, place: Place<&Workspace>) -> Result<Response, ApiError> {
        match place {
            Place::Here(workspace) => serve_path(&self.daemon, workspace, &self.path),
            Place::Elsewhere(node) => {
                forward(&self.daemon, &node, &self.request, Bytes::new()).await
            }
        }
    }
}

/// A file's bytes (at most `sessions.max_file_bytes`), or a JSON listing when `path` is a
/// directory; read on this thread (the runtime lends it: `block_in_place`).
fn serve_path(daemon: &Daemon, workspace: &Workspace, path: &str) -> Result<Response, ApiError> {
    let max = daemon.config.sessions.max_file_bytes.0;
    tokio::task::block_in_place(|| read_path(workspace, path, max))
}

fn read_path(workspace: &Workspace, path: &str, max: u64) -> Result<Response, ApiError> {
    let safe = SafePath::parse(path).map_err(|e| prepare::file_error(&e))?;
    let kind = workspace.kind(&safe).map_err(|e| prepare::file_error(&e))?;
    if kind == EntryKind::Directory {
        let entries = workspace.list(&safe).map_err(|e| prepare::file_error(&e))?;
        return Ok(Json(Listing {
            path: safe.display(),
            entries,
        })
        .into_response());
    }
    let bytes = workspace
        .read_file(&safe, max)
        .map_err(|e| prepare::file_error(&e))?;
    Ok((
        StatusCode::OK,
        [(header::CONTENT_TYPE, "application/octet-stream")],
        bytes,
    )
        .into_response())
}
