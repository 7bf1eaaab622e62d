//! `/v1/workers` (multipart inputs, outputs downloadable) and `/v1/calls` (Python tools).

use std::path::Path;
use std::sync::Arc;

use airlock::call::{CallOptions, ToolPolicy, ToolSpec};
use airlock::worker::{IngestLimits, InputFile};
use axum::extract::{Multipart, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use tokio::io::AsyncWriteExt;

use super::answer;
use super::extract::{ApiJson, Caller};
use super::prepare::{self, new_id, sandbox_owner};
use super::types::{CallPolicy, CallRequest, CallResponse, RunView, WorkerForm, WorkerRequest};
use crate::auth::Principal;
use crate::daemon::Daemon;
use crate::engine::{CallWork, Submitted, Work, WorkerWork};
use crate::error::{ApiError, ErrorBody};
use crate::resolve::{self, Resolved};
use crate::store::{now_ms, Document, NewRun};
use crate::workspace::WorkspaceSpec;

/// Runs a worker job: inputs as multipart parts, `request` as JSON; progress events in the
/// run's stream; outputs listed in the run and downloadable under `/v1/runs/{id}/outputs`.
#[utoipa::path(
    post, path = "/v1/workers", tag = "workers",
    request_body(content = WorkerForm, content_type = "multipart/form-data"),
    responses(
        (status = 200, description = "The job finished within `wait`", body = RunView),
        (status = 202, description = "The job is queued or running", body = RunView),
        (status = 400, description = "Malformed form, request or input name", body = ErrorBody),
        (status = 403, description = "Beyond the tenant's ceiling", body = ErrorBody),
        (status = 413, description = "An input or the body is too large", body = ErrorBody),
        (status = 429, description = "Queue full", body = ErrorBody),
        (status = 503, description = "No slot in time, or shutting down", body = ErrorBody),
    )
)]
pub async fn worker(
    State(daemon): State<Arc<Daemon>>,
    Caller(caller): Caller,
    headers: HeaderMap,
    multipart: Multipart,
) -> Result<Response, ApiError> {
    let id = new_id("run");
    let uploads = daemon.paths.uploads.join(&id);
    let received = receive(&daemon, multipart, &uploads).await;
    let outcome = match received {
        Ok((request, inputs)) => {
            submit_worker(&daemon, &caller, &headers, id, request, inputs, &uploads).await
        }
        Err(e) => Err(e),
    };
    if outcome.is_err() {
        let _ = std::fs::remove_dir_all(&uploads);
    }
    outcome
}

async fn submit_worker(
    daemon: &Arc<Daemon>,
    caller: &Principal,
    headers: &HeaderMap,
    id: String,
    request: WorkerRequest,
    inputs: Vec<InputFile>,
    uploads: &Path,
) -> Result<Response, ApiError> {
    if request.program.is_empty() {
        return Err(ApiError::bad_request(
            "`program` is empty",
            "give the worker program and its arguments",
        ));
    }
    let priority = prepare::priority(daemon, caller, request.priority).await?;
    let resolved =
        prepare::policy(daemon, caller, request.profile.as_deref(), &request.policy).await?;
    let idempotency = prepare::idempotency_key(headers)?;
    let config = &daemon.config.sandbox;
    let ingest = IngestLimits {
        max_total_bytes: request
            .max_output_bytes
            .map_or(config.worker_max_output_bytes.0, |b| {
                b.0.min(config.worker_max_output_bytes.0)
            }),
        max_files: request
            .max_output_files
            .map_or(config.worker_max_output_files, |n| {
                n.min(config.worker_max_output_files)
            }),
        max_file_bytes: daemon.config.sessions.max_file_bytes.0,
        ..IngestLimits::default()
    };
    let program_files = program_files(daemon, &request.program_files)?;
    let mut stored = serde_json::to_value(&request).unwrap_or_default();
    if !daemon.config.store.keep_file_contents {
        let names: Vec<_> = program_files.iter().map(|(name, _)| name).collect();
        stored["program_files"] = serde_json::json!(names);
    }
    if !daemon.config.store.keep_env_values {
        stored["env"] = serde_json::json!(request.env.keys().collect::<Vec<_>>());
    }
    stored["inputs"] = serde_json::json!(inputs.iter().map(|i| &i.name).collect::<Vec<_>>());
    let record = NewRun {
        id,
        tenant: caller.tenant.name.clone(),
        key_name: caller.key_name.clone(),
        kind: "worker".into(),
        session_id: None,
        node: daemon.node.clone(),
        priority: priority.into(),
        request_hash: idempotency.as_ref().map(|_| prepare::request_hash(&stored)),
        idempotency_key: idempotency,
        request: Document::from(stored),
        profile: Some(resolved.profile.clone()),
        policy: Document::of(&resolved.policy).ok(),
        created_ms: now_ms(),
    };
    let work = Work::Worker(WorkerWork {
        program: request.program.clone(),
        env: request.env.clone().into_iter().collect(),
        inputs,
        uploads: uploads.to_path_buf(),
        options: request.options.clone(),
        ingest,
        job: job_spec(&resolved),
        program_files,
    });
    let job = prepare::job(daemon, caller, record, priority, resolved, work);
    let wait = prepare::wait_time(daemon, request.wait);
    answer::submit(daemon, prepare::Prepared { job, wait }).await
}

/// The request's program files, decoded: plain file names, each within the file limit.
fn program_files(
    daemon: &Daemon,
    files: &[super::types::FileInput],
) -> Result<Vec<(String, Vec<u8>)>, ApiError> {
    let max = daemon.config.sessions.max_file_bytes.0;
    let mut decoded: Vec<(String, Vec<u8>)> = Vec::new();
    for file in files {
        airlock::worker::validate_input_name(&file.path).map_err(|e| {
            ApiError::bad_request(
                e.to_string(),
                "name each program file with a plain file name",
            )
        })?;
        if decoded.iter().any(|(name, _)| *name == file.path) {
            return Err(ApiError::bad_request(
                format!("program file {:?} is sent twice", file.path),
                "give each program file a distinct name",
            ));
        }
        let bytes = prepare::file_bytes(file)?;
        if bytes.len() as u64 > max {
            return Err(ApiError::too_large(
                format!("program file {:?} is over {max} bytes", file.path),
                "send smaller files; the limit is sessions.max_file_bytes",
            ));
        }
        decoded.push((file.path.clone(), bytes));
    }
    Ok(decoded)
}

fn job_spec(resolved: &Resolved) -> WorkspaceSpec {
    WorkspaceSpec {
        bytes: resolved.policy.limits.disk.0,
        files: resolved.policy.limits.files,
        owner: sandbox_owner(resolved),
        exec: resolved.policy.filesystem.exec_writable,
    }
}

/// Reads the form: the `request` part, and every other part streamed to `uploads/<name>`.
async fn receive(
    daemon: &Daemon,
    mut multipart: Multipart,
    uploads: &Path,
) -> Result<(WorkerRequest, Vec<InputFile>), ApiError> {
    let bad_form = |e: axum::extract::multipart::MultipartError| {
        let message = e.body_text();
        if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
            ApiError::too_large(message, "send smaller inputs; the limit is server.max_body")
        } else {
            ApiError::bad_request(message, "send multipart/form-data with a `request` part")
        }
    };
    let max_input = daemon.config.sessions.max_file_bytes.0;
    let mut request = None;
    let mut inputs: Vec<InputFile> = Vec::new();
    while let Some(mut field) = multipart.next_field().await.map_err(bad_form)? {
        let name = field.name().unwrap_or_default().to_string();
        if name == "request" {
            let bytes = field.bytes().await.map_err(bad_form)?;
            let parsed: WorkerRequest = serde_json::from_slice(&bytes).map_err(|e| {
                ApiError::invalid(
                    "invalid_request",
                    format!("the `request` part: {e}"),
                    "send a WorkerRequest as JSON",
                )
            })?;
            request = Some(parsed);
            continue;
        }
        airlock::worker::validate_input_name(&name).map_err(|e| {
            ApiError::bad_request(e.to_string(), "name each input part with a plain file name")
        })?;
        if inputs.iter().any(|i| i.name == name) {
            return Err(ApiError::bad_request(
                format!("input {name:?} is sent twice"),
                "give each input a distinct part name",
            ));
        }
        tokio::fs::create_dir_all(uploads)
            .await
            .map_err(|e| ApiError::internal("cannot store the inputs", e))?;
        let path = uploads.join(&name);
        let mut file = tokio::fs::File::create(&path)
            .await
            .map_err(|e| ApiError::internal("cannot store an input", e))?;
        let mut size = 0u64;
        while let Some(chunk) = field.chunk().await.map_err(bad_form)? {
            size += chunk.len() as u64;
            if size > max_input {
                return Err(ApiError::too_large(
                    format!("input {name:?} is over {max_input} bytes"),
                    "send smaller inputs; the limit is sessions.max_file_bytes",
                ));
            }
            file.write_all(&chunk)
                .await
                .map_err(|e| ApiError::internal("cannot store an input", e))?;
        }
        file.flush()
            .await
            .map_err(|e| ApiError::internal("cannot store an input", e))?;
        inputs.push(InputFile::new(name, path));
    }
    let request = request.ok_or_else(|| {
        ApiError::bad_request(
            "the form has no `request` part",
            "add a part named `request` holding the WorkerRequest JSON",
        )
    })?;
    Ok((request, inputs))
}

/// Calls a Python tool of a toolset the tenant may use; typed errors come back as results.
#[utoipa::path(
    post, path = "/v1/calls", tag = "calls",
    request_body = CallRequest,
    responses(
        (status = 200, description = "The call ended: a value or a typed error", body = CallResponse),
        (status = 202, description = "Still running after the daemon's maximum wait (see the run)", body = RunView),
        (status = 400, description = "Malformed request", body = ErrorBody),
        (status = 403, description = "Toolset not allowed, or beyond the ceiling", body = ErrorBody),
        (status = 429, description = "Queue full", body = ErrorBody),
        (status = 503, description = "No slot in time, or shutting down", body = ErrorBody),
    )
)]
pub async fn call(
    State(daemon): State<Arc<Daemon>>,
    Caller(caller): Caller,
    ApiJson(request): ApiJson<CallRequest>,
) -> Result<Response, ApiError> {
    let toolset = toolset_dir(&daemon, &caller, &request.toolset).await?;
    let priority = prepare::priority(&daemon, &caller, request.priority).await?;
    let policy = match request.policy {
        CallPolicy::Sandboxed => ToolPolicy::Sandboxed,
        CallPolicy::Subprocess => ToolPolicy::Subprocess,
    };
    // The result comes back on stdout: the tenant's stdout ceiling bounds its size.
    let tenant = &caller.tenant;
    let stdout_cap = tenant
        .ceiling
        .stdout
        .unwrap_or(tenant.default_policy().limits.stdout)
        .0;
    let mut options = CallOptions {
        python: daemon.config.sandbox.python.clone(),
        sandbox: daemon.sandbox_options.clone(),
        max_result_bytes: stdout_cap
            .saturating_sub(4096)
            .min(CallOptions::default().max_result_bytes),
        ..CallOptions::default()
    };
    options.overrides.limits = resolve::limits_section(&request.limits);
    call_network(&mut options, &request, tenant);
    let tool_policy = airlock::call::tool_policy(&toolset, policy, &options).map_err(|e| {
        ApiError::invalid(
            "invalid_policy",
            e.to_string(),
            "check the limits and the network rules",
        )
    })?;
    if let Err(v) = resolve::within_ceiling(
        &tool_policy,
        &options.overrides.allow_net,
        false,
        &tenant.ceiling,
        tenant.default_policy(),
    ) {
        return Err(prepare::refuse(&daemon, &caller, &v).await);
    }
    let resolved = Resolved {
        profile: if policy == ToolPolicy::Subprocess {
            "trusted"
        } else {
            "untrusted"
        }
        .into(),
        policy: tool_policy,
        options: options.sandbox.clone(),
    };
    let record = NewRun {
        id: new_id("run"),
        tenant: tenant.name.clone(),
        key_name: caller.key_name.clone(),
        kind: "call".into(),
        session_id: None,
        node: daemon.node.clone(),
        priority: priority.into(),
        idempotency_key: None,
        request_hash: None,
        request: Document::of(&request).unwrap_or_else(|_| serde_json::Value::Null.into()),
        profile: Some(resolved.profile.clone()),
        policy: Document::of(&resolved.policy).ok(),
        created_ms: now_ms(),
    };
    let work = Work::Call(Box::new(CallWork {
        tool: ToolSpec::new(toolset, request.target.clone()),
        // No arguments given means none, not one `null`.
        args: match &request.args {
            serde_json::Value::Null => serde_json::json!({}),
            args => args.clone(),
        },
        policy,
        options,
    }));
    let job = prepare::job(&daemon, &caller, record, priority, resolved, work);
    call_response(&daemon, job).await
}

/// The call's network, as a run's: the request's mode and rules (judged against the ceiling
/// with the resolved policy), resolved where the tenant's default profile says.
fn call_network(options: &mut CallOptions, request: &CallRequest, tenant: &crate::tenant::Tenant) {
    let asked = resolve::overrides(&resolve::PolicyRequest {
        network: request.network.clone(),
        ..resolve::PolicyRequest::default()
    });
    options.overrides.network = asked.network;
    options.overrides.allow_net = asked.allow_net;
    options.overrides.deny_net = asked.deny_net;
    options.overrides.resolver = tenant.default_policy().network.resolver.clone();
}

async fn toolset_dir(
    daemon: &Daemon,
    caller: &Principal,
    name: &str,
) -> Result<std::path::PathBuf, ApiError> {
    let configured = daemon.config.toolsets.get(name);
    match configured {
        Some(toolset) if caller.tenant.toolsets.iter().any(|t| t == name) => {
            Ok(toolset.path.clone())
        }
        _ => {
            let v = resolve::Violation {
                key: "toolset".into(),
                asked: name.into(),
                ceiling: format!("one of [{}]", caller.tenant.toolsets.join(", ")),
            };
            Err(prepare::refuse(daemon, caller, &v).await)
        }
    }
}

async fn call_response(
    daemon: &Arc<Daemon>,
    job: crate::engine::Job,
) -> Result<Response, ApiError> {
    let wait = daemon.config.server.max_wait.0;
    let live = match daemon.engine.submit(job).await? {
        Submitted::New(live) => live,
        Submitted::Existing(row) => return Ok(answer::run_response(*row, false)),
    };
    // A caller that goes away while the daemon holds its request (a cancelled task, a
    // closed connection) has no run id to cancel: its call stops with the request.
    let guard = crate::engine::StopOnDrop::new(&live);
    live.wait_done(wait).await;
    guard.disarm();
    let row = daemon
        .store
        .run(&live.id)
        .await
        .map_err(ApiError::store)?
        .ok_or_else(|| ApiError::internal("the call's record vanished", &live.id))?;
    if !row.is_terminal() {
        return Ok(answer::run_response(row, false));
    }
    if row.status == "rejected" {
        return Err(answer::busy(daemon, &row));
    }
    let result = row.result.as_ref().map(Document::value).unwrap_or_default();
    let error = row.error.clone().or_else(|| result.get("error").cloned());
    let response = CallResponse {
        run_id: row.id.clone(),
        ok: result["ok"].as_bool().unwrap_or(false),
        value: result.get("value").cloned(),
        error: if result["ok"].as_bool() == Some(true) {
            None
        } else {
            error
        },
    };
    Ok(Json(response).into_response())
}
