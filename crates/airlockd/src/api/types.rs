//! The request and response documents of API v1.

use std::collections::BTreeMap;
use std::time::{Duration, UNIX_EPOCH};

use airlock::policy::units::{ByteSize, Seconds};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

pub use crate::engine::StartPath;
use crate::error::ErrorDetail;
use crate::resolve::{LimitsRequest, NetworkRequest, PolicyRequest};
use crate::store::{Document, RunRow, SessionRow};

/// A file sent with a run, written into its working directory before it starts.
#[derive(Serialize, Deserialize, ToSchema, Debug, Clone, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct FileInput {
    /// Relative path inside the working directory, e.g. `data/in.csv`.
    pub path: String,
    /// The content as text.
    pub content: Option<String>,
    /// The content as base64 (instead of `content`).
    pub content_base64: Option<String>,
}

/// A run: a command, or code in a language of the interpreter registry.
#[derive(Serialize, Deserialize, ToSchema, Debug, Clone, Default, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct RunRequest {
    /// The program and its arguments (give this or `code`).
    pub command: Option<Vec<String>>,
    /// Source code to run with `language` (give this or `command`).
    pub code: Option<String>,
    /// An interpreter name or alias, e.g. `python`, `bash`, `node`.
    pub language: Option<String>,
    /// Arguments after the code.
    #[serde(default)]
    pub args: Vec<String>,
    /// stdin as text.
    pub stdin: Option<String>,
    /// stdin as base64 (instead of `stdin`).
    pub stdin_base64: Option<String>,
    /// Environment for the program (values are not stored unless configured).
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Files for the working directory (contents are not stored unless configured).
    #[serde(default)]
    pub files: Vec<FileInput>,
    /// One of the tenant's profiles (default: its default profile).
    pub profile: Option<String>,
    #[serde(default)]
    pub policy: PolicyRequest,
    /// Within the tenant's priority range; higher runs first.
    pub priority: Option<i32>,
    /// Seconds to wait for the result (capped by the daemon): the finished run (200) if it
    /// ends in time, else the queued or running run (202).
    pub wait: Option<f64>,
}

/// Links to a run's sub-resources.
#[derive(Serialize, Deserialize, ToSchema, Debug, Clone, PartialEq)]
pub struct RunLinks {
    #[serde(rename = "self")]
    pub this: String,
    pub events: String,
}

/// A run as recorded.
#[derive(Serialize, Deserialize, ToSchema, Debug, Clone, PartialEq)]
pub struct RunView {
    pub id: String,
    /// `run`, `session_run`, `worker` or `call`.
    pub kind: String,
    pub tenant: String,
    pub session_id: Option<String>,
    /// The daemon that runs (or ran) it.
    pub node: String,
    /// `queued`, `running`, then one of `exited`, `signaled`, `timeout`, `memory_limit`,
    /// `cpu_limit`, `output_limit`, `file_size_limit`, `cancelled`, `sandbox_error`,
    /// `rejected` (never got a slot) or `lost` (the daemon died while it was in flight).
    pub status: String,
    pub priority: i64,
    pub profile: Option<String>,
    pub backend: Option<String>,
    pub created_at: String,
    pub started_at: Option<String>,
    pub ended_at: Option<String>,
    pub queue_ms: Option<i64>,
    pub wall_ms: Option<i64>,
    /// How the run's sandbox started: `cold` (set up for the run), `warm` (a sandbox the
    /// daemon prepared ahead, `[warm]`) or `zygote` (forked from an interpreter zygote). The
    /// isolation record (`result.isolation`) is the same whichever it was. Absent for worker
    /// jobs and tool calls (always cold) and for runs that never got a slot.
    pub start: Option<StartPath>,
    /// The request as stored (without secrets).
    #[schema(value_type = Object)]
    pub request: Document,
    /// The policy as resolved.
    #[schema(value_type = Option<Object>)]
    pub policy: Option<Document>,
    /// The library's result: status, exit code, limits hit, isolation layers in force,
    /// warnings, output (calls: `{"ok", "value"|"error"}`).
    #[schema(value_type = Option<Object>)]
    pub result: Option<Document>,
    /// Why the run ended without a result (`rejected`, `lost`, set-up refusals).
    pub error: Option<ErrorDetail>,
    /// A worker's outputs (ingestion report).
    #[schema(value_type = Option<Object>)]
    pub outputs: Option<serde_json::Value>,
    /// The egress gate's network report (decisions), when the run had one.
    #[schema(value_type = Option<Object>)]
    pub network: Option<serde_json::Value>,
    pub links: RunLinks,
}

/// One page of runs, newest first.
#[derive(Serialize, Deserialize, ToSchema, Debug, Clone, PartialEq)]
pub struct RunPage {
    pub runs: Vec<RunView>,
    /// Pass as `cursor` for the next page; absent on the last page.
    pub next_cursor: Option<String>,
}

/// Filters of `GET /v1/runs`.
#[derive(Deserialize, ToSchema, utoipa::IntoParams, Debug, Clone, Default)]
#[into_params(parameter_in = Query)]
pub struct RunQuery {
    /// Only runs with this status.
    pub status: Option<String>,
    /// Only this tenant's runs (admin keys; other keys see their own tenant only).
    pub tenant: Option<String>,
    /// Only runs created at or after this time (RFC 3339 or Unix milliseconds).
    pub since: Option<String>,
    /// Only runs of this session.
    pub session: Option<String>,
    /// The `next_cursor` of the previous page.
    pub cursor: Option<String>,
    /// Page size, 1 to 1000 (default 50).
    pub limit: Option<i64>,
}

/// Options of an event stream.
#[derive(Deserialize, ToSchema, utoipa::IntoParams, Debug, Clone, Default)]
#[into_params(parameter_in = Query)]
pub struct EventQuery {
    /// `sse` or `ndjson` (default: from `Accept`, else NDJSON).
    pub format: Option<String>,
    /// Start at this event position (default 0; SSE clients may send `Last-Event-ID`).
    pub from: Option<u64>,
}

/// A session: a workspace that outlives one command.
#[derive(Serialize, Deserialize, ToSchema, Debug, Clone, Default, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct SessionRequest {
    /// The profile its runs start from.
    pub profile: Option<String>,
    /// Policy wishes for its runs (each run may narrow them further).
    #[serde(default)]
    pub policy: PolicyRequest,
    /// Idle time after which the session ends (default and maximum set by the daemon).
    #[schema(value_type = Option<String>, example = "15m")]
    pub idle_timeout: Option<Seconds>,
    /// Time after which the session ends whatever happens.
    #[schema(value_type = Option<String>, example = "1h")]
    pub max_lifetime: Option<Seconds>,
    /// Bytes of the workspace.
    #[schema(value_type = Option<String>, example = "256MiB")]
    pub disk: Option<ByteSize>,
    /// Files of the workspace.
    pub files: Option<u64>,
}

/// A session as recorded.
#[derive(Serialize, Deserialize, ToSchema, Debug, Clone, PartialEq)]
pub struct SessionView {
    pub id: String,
    pub tenant: String,
    pub node: String,
    /// `active`, `expired`, `deleted` or `lost`.
    pub status: String,
    pub profile: String,
    pub created_at: String,
    pub last_active_at: String,
    pub expires_at: String,
    pub idle_timeout_ms: i64,
    pub ended_at: Option<String>,
    pub end_reason: Option<String>,
    /// The workspace's caps and whether a tmpfs enforces them for the programs too.
    #[schema(value_type = Object)]
    pub workspace: serde_json::Value,
}

/// Sessions visible to the key, newest first.
#[derive(Serialize, Deserialize, ToSchema, Debug, Clone, PartialEq)]
pub struct SessionList {
    pub sessions: Vec<SessionView>,
}

/// A directory listing of a session's workspace or a worker's outputs.
#[derive(Serialize, Deserialize, ToSchema, Debug, Clone, PartialEq)]
pub struct Listing {
    pub path: String,
    pub entries: Vec<crate::workspace::DirEntry>,
}

/// The JSON part (`request`) of `POST /v1/workers`; every other part is an input file named
/// by its part name.
#[derive(Serialize, Deserialize, ToSchema, Debug, Clone, Default, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct WorkerRequest {
    /// The worker program and its arguments; its working directory is the job directory
    /// (`in/`, `options.json`, `out/`), also in `AIRLOCK_JOB_DIR`.
    pub program: Vec<String>,
    /// Written to `options.json`.
    #[serde(default)]
    #[schema(value_type = Object)]
    pub options: serde_json::Value,
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    pub profile: Option<String>,
    #[serde(default)]
    pub policy: PolicyRequest,
    pub priority: Option<i32>,
    pub wait: Option<f64>,
    /// Caps on the outputs brought back (within the daemon's).
    #[schema(value_type = Option<String>)]
    pub max_output_bytes: Option<ByteSize>,
    pub max_output_files: Option<u64>,
    /// Files written read-only into the directory on the program's `PYTHONPATH` that also
    /// holds the worker helper `airlock_worker` (every worker gets it): e.g. the worker
    /// module, run as `["python3", "-m", "NAME"]`. `path` is a plain file name.
    #[serde(default)]
    pub program_files: Vec<FileInput>,
}

/// The multipart form of `POST /v1/workers` (for the OpenAPI document).
#[derive(ToSchema)]
#[allow(dead_code)]
pub struct WorkerForm {
    /// A [`WorkerRequest`] as JSON.
    pub request: String,
    /// Input files: any other part, named by its part name.
    #[schema(value_type = Option<String>, format = Binary)]
    pub input: Option<Vec<u8>>,
}

/// How strongly a tool call is isolated.
#[derive(Serialize, Deserialize, ToSchema, Debug, Clone, Copy, PartialEq, Eq, Default)]
#[serde(rename_all = "snake_case")]
pub enum CallPolicy {
    /// The strongest isolation available (profile `untrusted`).
    #[default]
    Sandboxed,
    /// Tier 0 only (profile `trusted`): needs a ceiling of isolation `process`.
    Subprocess,
}

/// A Python tool call.
#[derive(Serialize, Deserialize, ToSchema, Debug, Clone, Default, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct CallRequest {
    /// A toolset the tenant may use (configured by the operator).
    pub toolset: String,
    /// `module:function` inside the toolset.
    pub target: String,
    /// An object (keyword arguments), an array (positional) or one value.
    #[serde(default)]
    #[schema(value_type = Object)]
    pub args: serde_json::Value,
    #[serde(default)]
    pub policy: CallPolicy,
    /// Only `wall_time`, `cpu_time`, `memory`, `processes` and `stderr` apply.
    #[serde(default)]
    pub limits: LimitsRequest,
    /// The tool's network, as a run's (`policy.network`): mode and allow/deny rules of the
    /// egress gate, within the tenant's ceiling; its decisions are in the call's run record.
    #[serde(default)]
    pub network: Option<NetworkRequest>,
    pub priority: Option<i32>,
}

/// A tool call's outcome: a value, or a typed error as a result.
#[derive(Serialize, Deserialize, ToSchema, Debug, Clone, PartialEq)]
pub struct CallResponse {
    pub run_id: String,
    pub ok: bool,
    #[schema(value_type = Option<Object>)]
    pub value: Option<serde_json::Value>,
    /// `{"error": "<kind>", ...}`: timeout, cpu_limit, memory_limit, output_limit, crashed,
    /// raised, bad_output, bad_tool, sandbox_error...
    #[schema(value_type = Option<Object>)]
    pub error: Option<serde_json::Value>,
}

/// The queue of this node (admin keys see every tenant; others their own).
#[derive(Serialize, Deserialize, ToSchema, Debug, Clone, PartialEq)]
pub struct QueueView {
    pub node: String,
    pub max_concurrent: usize,
    pub running: usize,
    pub queued: usize,
    pub running_per_tenant: BTreeMap<String, usize>,
    pub queued_per_tenant: BTreeMap<String, usize>,
    pub draining: bool,
}

/// Filters of `GET /v1/audit`.
#[derive(Deserialize, ToSchema, utoipa::IntoParams, Debug, Clone, Default)]
#[into_params(parameter_in = Query)]
pub struct AuditQuery {
    pub kind: Option<String>,
    /// RFC 3339 or Unix milliseconds.
    pub since: Option<String>,
    /// Records with ids below this one (paging).
    pub before: Option<i64>,
    pub limit: Option<i64>,
}

/// Audit records, newest first.
#[derive(Serialize, Deserialize, ToSchema, Debug, Clone, PartialEq)]
pub struct AuditPage {
    pub records: Vec<crate::store::AuditRecord>,
}

/// `GET /healthz`.
#[derive(Serialize, Deserialize, ToSchema, Debug, Clone, PartialEq)]
pub struct Health {
    /// `ok`, or `draining` while shutting down.
    pub status: String,
    pub node: String,
    pub store: bool,
    pub version: String,
}

/// RFC 3339 with milliseconds, UTC.
pub fn time_text(ms: i64) -> String {
    let at = UNIX_EPOCH + Duration::from_millis(ms.max(0) as u64);
    humantime::format_rfc3339_millis(at).to_string()
}

/// Parses RFC 3339 or Unix milliseconds.
pub fn parse_time(text: &str) -> Option<i64> {
    if let Ok(ms) = text.parse::<i64>() {
        return Some(ms);
    }
    humantime::parse_rfc3339_weak(text)
        .ok()
        .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
        .map(|d| d.as_millis() as i64)
}

impl RunView {
    pub fn from_row(row: &RunRow) -> RunView {
        RunView::from(row.clone())
    }
}

/// The row's documents (request, policy, result: most of it) move into the view: a waited
/// run's answer is built from the record its end stored, which nothing needs after.
impl From<RunRow> for RunView {
    fn from(row: RunRow) -> RunView {
        let links = RunLinks {
            this: format!("/v1/runs/{}", row.id),
            events: format!("/v1/runs/{}/events", row.id),
        };
        RunView {
            start: row.result.as_ref().and_then(StartPath::of_result),
            created_at: time_text(row.created_ms),
            started_at: row.started_ms.map(time_text),
            ended_at: row.ended_ms.map(time_text),
            error: row.error.and_then(|e| serde_json::from_value(e).ok()),
            id: row.id,
            kind: row.kind,
            tenant: row.tenant,
            session_id: row.session_id,
            node: row.node,
            status: row.status,
            priority: row.priority,
            profile: row.profile,
            backend: row.backend,
            queue_ms: row.queue_ms,
            wall_ms: row.wall_ms,
            request: row.request,
            policy: row.policy,
            result: row.result,
            outputs: row.outputs,
            network: row.network,
            links,
        }
    }
}

impl SessionView {
    pub fn from_row(row: &SessionRow) -> SessionView {
        SessionView {
            id: row.id.clone(),
            tenant: row.tenant.clone(),
            node: row.node.clone(),
            status: row.status.clone(),
            profile: row.profile.clone(),
            created_at: time_text(row.created_ms),
            last_active_at: time_text(row.last_active_ms),
            expires_at: time_text(row.expires_ms),
            idle_timeout_ms: row.idle_timeout_ms,
            ended_at: row.ended_ms.map(time_text),
            end_reason: row.end_reason.clone(),
            workspace: serde_json::json!({
                "disk_bytes": row.spec["disk_bytes"],
                "files": row.spec["files"],
                "quota_enforced": row.spec["quota_enforced"],
            }),
        }
    }
}
