//! How what the library gave back becomes a command's terminal record: a result, or a sandbox
//! that could not be set up. Apart from the streaming, which only moves events; here the
//! outcome is judged (status, error kind, the set-up and network-denial metrics).

use airlock::RunResult;
use serde_json::json;

use super::stream::Streamed;
use crate::engine::warm::StartPath;
use crate::engine::Engine;
use crate::store::{Document, Ending};

/// The terminal record of a streamed run, or of a sandbox that could not be set up; a
/// command's result records how its sandbox started (`start`).
pub(super) fn ending_of(
    engine: &Engine,
    outcome: Result<Streamed, airlock::Error>,
    outputs: Option<serde_json::Value>,
    start: Option<StartPath>,
) -> Ending {
    match outcome {
        Ok(streamed) => {
            let mut result = streamed.result;
            if engine.keep_output {
                result.stdout = Some(String::from_utf8_lossy(&streamed.stdout).into_owned());
                result.stderr = Some(String::from_utf8_lossy(&streamed.stderr).into_owned());
            }
            let error = init_setup_error(&result);
            if let Some(error) = &error {
                count_setup_failure(engine, error["kind"].as_str().unwrap_or("init_failed"));
            }
            let network = result.network.as_ref();
            count_network_denials(engine, network);
            Ending {
                status: status_name(&result),
                backend: Some(result.backend.clone()),
                network: network.and_then(|report| serde_json::to_value(report).ok()),
                wall_ms: Some(result.wall_ms as i64),
                result: result_document(&result, start),
                error,
                outputs,
                ..Ending::default()
            }
        }
        Err(e) => setup_error(engine, &e, start),
    }
}

/// The library's result as the record keeps it, with the start path when it has one.
fn result_document(result: &RunResult, start: Option<StartPath>) -> Option<Document> {
    match start {
        Some(start) => start.record(result),
        None => Document::of(result).ok(),
    }
}

fn status_name(result: &RunResult) -> String {
    serde_json::to_value(result.status)
        .ok()
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_else(|| "sandbox_error".into())
}

/// A sandbox the library refused or failed to set up: the record's `result` is the library's
/// own for a run that never started (`RunResult::not_started`, its typed `error_kind`), as the
/// CLI's `--json` prints it.
pub(super) fn setup_error(
    engine: &Engine,
    error: &airlock::Error,
    start: Option<StartPath>,
) -> Ending {
    let kind = error.kind().name();
    count_setup_failure(engine, kind);
    let result = RunResult::not_started(error.kind(), error.to_string());
    Ending {
        status: "sandbox_error".into(),
        result: result_document(&result, start),
        error: Some(json!({
            "kind": kind,
            "message": error.to_string(),
            "fix": "read the message; GET /v1/capabilities shows what this host supports",
        })),
        ..Ending::default()
    }
}

/// The record's `error` for a sandbox the init could not set up, from the result's typed
/// setup error (`program_not_found`, `mount_failed`, ...).
fn init_setup_error(result: &RunResult) -> Option<serde_json::Value> {
    if result.status != airlock::RunStatus::SandboxError {
        return None;
    }
    let kind = result.error_kind.map_or(json!("init_failed"), |k| json!(k));
    Some(json!({
        "kind": kind,
        "message": result.error.clone().unwrap_or_default(),
        "fix": "read the message; GET /v1/capabilities shows what this host supports",
    }))
}

/// Each connection or name the gate refused counts as a denial (`network:<reason>`).
pub(super) fn count_network_denials(
    engine: &Engine,
    report: Option<&airlock_egress::NetworkReport>,
) {
    let denied = report
        .map(|r| r.decisions.as_slice())
        .unwrap_or_default()
        .iter()
        .filter(|d| d.decision == airlock_egress::report::Decision::Deny);
    for decision in denied {
        let reason = serde_json::to_value(decision.reason).unwrap_or_default();
        let reason = reason.as_str().unwrap_or("other");
        engine.metrics.deny(&format!("network:{reason}"));
    }
}

fn count_setup_failure(engine: &Engine, reason: &str) {
    engine
        .metrics
        .setup_failures
        .get_or_create(&crate::metrics::ReasonLabels {
            reason: reason.into(),
        })
        .inc();
}
