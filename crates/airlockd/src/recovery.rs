//! Recovery after the daemon was killed (SIGKILL, OOM, a crash): every run this node had in
//! flight is recorded `lost` with the reason, and what its sandbox left is removed.
//!
//! When the daemon dies, each run's init sees its control pipe close, stops the run and
//! removes its run directory and cgroup within seconds. What is left when an init died too
//! (the whole process group was killed) is swept here: the library's sweep removes abandoned
//! runs older than 30 s; the previous process's runs are known to be abandoned at once (its
//! pid is in the store and gone), so they are swept without that wait, after giving their
//! inits a few seconds to clean up themselves.

use std::time::Duration;

use airlock::SandboxOptions;
use serde_json::json;

use crate::audit::Audit;
use crate::daemon::DaemonPaths;
use crate::sessions::remove_strays;
use crate::store::{Store, StoreResult};

/// How long the previous process's inits get to clean up after themselves.
const INIT_CLEANUP_WAIT: Duration = Duration::from_secs(10);

/// The `error` of a lost run.
pub fn lost_reason(why: &str) -> serde_json::Value {
    json!({
        "kind": "lost",
        "message": format!("{why}; the run's sandbox was stopped and swept, and its result is unknown"),
        "fix": "submit the run again (with the same idempotency key only after this record: the key now names this lost run)",
    })
}

pub async fn recover(
    store: &Store,
    audit: &Audit,
    node: &str,
    paths: &DaemonPaths,
    options: &SandboxOptions,
) -> StoreResult<()> {
    let previous_pid = store.node_pid(node).await?;
    let reason = lost_reason("the daemon stopped (killed or crashed) while the run was in flight");
    let lost = store.mark_lost(node, &reason).await?;
    for id in &lost {
        audit
            .system(
                "run_lost",
                Some(id),
                json!({"node": node, "previous_pid": previous_pid}),
            )
            .await;
    }
    if !lost.is_empty() {
        tracing::warn!(
            "{} run(s) in flight when the daemon stopped are marked lost",
            lost.len()
        );
    }
    let options = options.clone();
    let swept = tokio::task::spawn_blocking(move || {
        let mut swept = 0;
        let previous = previous_pid.and_then(|p| u32::try_from(p).ok());
        if let Some(pid) = previous.filter(|p| *p != std::process::id()) {
            swept += options.sweep_runs_of_dead_supervisor(pid, INIT_CLEANUP_WAIT);
        }
        swept + options.sweep_abandoned_runs()
    })
    .await
    .unwrap_or(0);
    if swept > 0 {
        tracing::info!("swept {swept} sandbox remains of the previous daemon process");
    }
    remove_strays(&paths.work, &[]);
    remove_strays(&paths.uploads, &[]);
    Ok(())
}
