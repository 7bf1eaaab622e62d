//! A tool call on the run's thread: the library's `call` with the run's cancel token, its
//! typed error turned into a run status. Apart from commands: its record is the tool's answer.

use std::time::Instant;

use airlock::call::ToolPolicy;
use serde_json::json;

use super::ending::count_network_denials;
use super::CallWork;
use crate::engine::{Engine, LiveRun};
use crate::store::{Document, Ending};

pub(super) fn run_call(engine: &Engine, live: &LiveRun, mut work: CallWork) -> Ending {
    let started = Instant::now();
    work.options.cancel = Some(live.cancel.clone());
    let outcome = airlock::call::call_with_run(&work.tool, &work.args, work.policy, &work.options);
    let wall_ms = started.elapsed().as_millis() as i64;
    let (status, result) = match &outcome.value {
        Ok(value) => ("exited".to_string(), json!({"ok": true, "value": value})),
        Err(error) => (call_status(error), json!({"ok": false, "error": error})),
    };
    let run = outcome.run.as_ref();
    let network = run.and_then(|r| r.network.as_ref());
    count_network_denials(engine, network);
    Ending {
        status,
        backend: Some(match (run, work.policy) {
            (Some(run), _) => run.backend.clone(),
            (None, ToolPolicy::Subprocess) => "none".into(),
            (None, ToolPolicy::Sandboxed) => "auto".into(),
        }),
        result: Some(Document::from(result)),
        network: network.and_then(|report| serde_json::to_value(report).ok()),
        wall_ms: Some(wall_ms),
        ..Ending::default()
    }
}

/// The run status that matches a tool call's typed error.
fn call_status(error: &airlock::call::ToolError) -> String {
    let kind = error.kind();
    match kind.as_str() {
        "timeout" | "cpu_limit" | "memory_limit" | "output_limit" | "file_size_limit"
        | "cancelled" | "sandbox_error" => kind,
        _ => "exited".into(),
    }
}
