//! Writing the audit log: what is recorded, and how often.
//!
//! Every refusal, degradation, Tier-0 run and lost run is recorded. Key use is recorded once
//! per key per hour per node (every request would drown the log; metrics count them all).
//! Failed authentications are recorded at most once per 10 seconds with the count of those
//! folded into it, so a flood of bad keys cannot flood the store.

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};

use serde_json::json;

use crate::auth::Principal;
use crate::store::{now_ms, AuditEntry, Store};

/// The audit log of this node.
#[derive(Debug)]
pub struct Audit {
    store: Store,
    node: String,
    key_use: Mutex<HashMap<String, i64>>,
    auth_failures: Mutex<(i64, u64)>,
}

const HOUR_MS: i64 = 3_600_000;
const AUTH_FAILURE_WINDOW_MS: i64 = 10_000;

impl Audit {
    pub fn new(store: Store, node: String) -> Audit {
        Audit {
            store,
            node,
            key_use: Mutex::new(HashMap::new()),
            auth_failures: Mutex::new((0, 0)),
        }
    }

    /// Appends a record; a store failure is logged, never returned (auditing must not turn a
    /// refusal into a 500, and the refusal is in the daemon's log too).
    pub async fn record(&self, entry: AuditEntry) {
        if let Err(e) = self.store.append_audit(&self.node, &entry).await {
            tracing::error!(kind = entry.kind, "cannot append to the audit log: {e}");
        }
    }

    /// A record about what `caller` did.
    pub fn entry(
        kind: &'static str,
        caller: &Principal,
        run_id: Option<&str>,
        detail: serde_json::Value,
    ) -> AuditEntry {
        AuditEntry {
            kind,
            tenant: Some(caller.tenant.name.clone()),
            key_name: Some(caller.key_name.clone()),
            run_id: run_id.map(str::to_string),
            detail,
        }
    }

    pub async fn key_used(&self, caller: &Principal) {
        let hour = now_ms() / HOUR_MS;
        let id = format!("{}/{}", caller.tenant.name, caller.key_name);
        let first_this_hour = {
            let mut seen = self.key_use.lock().unwrap_or_else(PoisonError::into_inner);
            seen.insert(id, hour) != Some(hour)
        };
        if first_this_hour {
            self.record(Audit::entry(
                "key_used",
                caller,
                None,
                json!({"hour_ms": hour * HOUR_MS}),
            ))
            .await;
        }
    }

    pub async fn auth_failed(&self, reason: &str, path: &str) {
        let now = now_ms();
        let folded = {
            let mut state = self
                .auth_failures
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            if now - state.0 < AUTH_FAILURE_WINDOW_MS {
                state.1 += 1;
                return;
            }
            let folded = state.1;
            *state = (now, 0);
            folded
        };
        let detail =
            json!({"reason": reason, "path": path, "earlier_failures_not_recorded": folded});
        self.record(AuditEntry {
            kind: "auth_failed",
            tenant: None,
            key_name: None,
            run_id: None,
            detail,
        })
        .await;
    }

    /// A record made by the daemon itself (start, stop, lost runs).
    pub async fn system(
        &self,
        kind: &'static str,
        run_id: Option<&str>,
        detail: serde_json::Value,
    ) {
        self.record(AuditEntry {
            kind,
            tenant: None,
            key_name: None,
            run_id: run_id.map(str::to_string),
            detail,
        })
        .await;
    }
}
