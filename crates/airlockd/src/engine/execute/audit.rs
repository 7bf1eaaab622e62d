//! What the audit log learns of a run's end, written just before the store records it. Apart
//! from the run's record because it judges the run (refusals by the library, degradations
//! accepted, runs without isolation) rather than describing it.

use serde_json::json;

use crate::engine::{Engine, LiveRun};
use crate::store::{AuditEntry, Document, Ending};

/// What the audit reads of a run's result (a pass over its text): its warnings and its
/// isolation layers.
#[derive(serde::Deserialize)]
struct Audited {
    #[serde(default)]
    warnings: Vec<serde_json::Value>,
    #[serde(default)]
    isolation: serde_json::Value,
}

/// Records what the audit log must hold about a run's end: refusals by the library,
/// degradations accepted, and runs without isolation.
pub(super) fn audit_ending(
    engine: &Engine,
    live: &LiveRun,
    key_name: &str,
    tenant: &str,
    ending: &Ending,
) {
    let entry = |kind: &'static str, detail: serde_json::Value| AuditEntry {
        kind,
        tenant: Some(tenant.to_string()),
        key_name: Some(key_name.to_string()),
        run_id: Some(live.id.clone()),
        detail,
    };
    let mut entries = Vec::new();
    if let Some(error) = &ending.error {
        let kind = error["kind"].as_str().unwrap_or_default();
        if [
            "degraded",
            "program_not_allowed",
            "backend_unavailable",
            "unisolated_refused",
        ]
        .contains(&kind)
        {
            engine.metrics.deny(kind);
            entries.push(entry("denied", error.clone()));
        }
    }
    if let Some(result) = ending.result.as_ref().and_then(Document::read::<Audited>) {
        let degraded: Vec<_> = result
            .warnings
            .iter()
            .filter(|w| w.as_str().is_some_and(|w| w.starts_with("degraded")))
            .collect();
        if !degraded.is_empty() {
            entries.push(entry(
                "degraded_accepted",
                json!({"warnings": degraded, "isolation": result.isolation}),
            ));
        }
        if ending.backend.as_deref() == Some("none") {
            entries.push(entry(
                "unisolated_run",
                json!({"backend": "none", "isolation": result.isolation}),
            ));
        }
    }
    for entry in entries {
        engine.block_on(engine.audit.record(entry));
    }
}
