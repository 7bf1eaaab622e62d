//! Sessions: an agent's workspace that outlives one command. Each session owns a workspace
//! (a capped tmpfs as root); its runs share it, each in a fresh sandbox. A session ends when
//! deleted, when idle past its idle timeout (runs in flight count as activity), or at its
//! maximum lifetime; ending cancels its runs and removes the workspace with everything in it.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use crate::engine::Engine;
use crate::error::ErrorDetail;
use crate::metrics::Metrics;
use crate::resolve::PolicyRequest;
use crate::store::{now_ms, SessionRow, Store};
use crate::workspace::{remove_workspace_dir, Workspace, WorkspaceSpec};

/// A session alive on this node.
#[derive(Debug)]
pub struct LiveSession {
    pub id: String,
    pub tenant: String,
    pub profile: String,
    /// The policy wishes the session was created with (runs may narrow them).
    pub policy: PolicyRequest,
    pub workspace: Workspace,
    pub expires_ms: i64,
    pub idle_ms: i64,
    last_active_ms: AtomicI64,
    /// The last activity written to the store (the sweep writes newer ones).
    persisted_ms: AtomicI64,
    ended: AtomicBool,
}

impl LiveSession {
    pub fn touch(&self) {
        self.last_active_ms.store(now_ms(), Ordering::Relaxed);
    }

    pub fn last_active_ms(&self) -> i64 {
        self.last_active_ms.load(Ordering::Relaxed)
    }

    pub fn is_ended(&self) -> bool {
        self.ended.load(Ordering::Relaxed)
    }
}

/// What a new session gets.
#[derive(Debug, Clone)]
pub struct NewSession {
    pub tenant: String,
    pub key_name: String,
    pub profile: String,
    pub policy: PolicyRequest,
    pub spec: WorkspaceSpec,
    pub idle: Duration,
    pub lifetime: Duration,
}

/// The sessions of this node.
#[derive(Debug)]
pub struct Sessions {
    root: PathBuf,
    store: Store,
    node: String,
    metrics: Arc<Metrics>,
    live: Mutex<HashMap<String, Arc<LiveSession>>>,
}

impl Sessions {
    pub fn new(root: PathBuf, store: Store, node: String, metrics: Arc<Metrics>) -> Sessions {
        Sessions {
            root,
            store,
            node,
            metrics,
            live: Mutex::new(HashMap::new()),
        }
    }

    pub fn get(&self, id: &str) -> Option<Arc<LiveSession>> {
        self.live
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(id)
            .cloned()
    }

    fn all(&self) -> Vec<Arc<LiveSession>> {
        self.live
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .values()
            .cloned()
            .collect()
    }

    fn insert(&self, session: Arc<LiveSession>) {
        let mut live = self.live.lock().unwrap_or_else(PoisonError::into_inner);
        live.insert(session.id.clone(), session);
        self.metrics.sessions_active.set(live.len() as i64);
    }

    fn forget(&self, id: &str) {
        let mut live = self.live.lock().unwrap_or_else(PoisonError::into_inner);
        live.remove(id);
        self.metrics.sessions_active.set(live.len() as i64);
    }

    /// Creates the workspace and the record.
    pub async fn create(
        &self,
        id: String,
        new: NewSession,
    ) -> Result<(Arc<LiveSession>, SessionRow), String> {
        let dir = self.root.join(&id);
        let workspace = Workspace::create(&dir, new.spec)
            .map_err(|e| format!("cannot create the session workspace: {e}"))?;
        let now = now_ms();
        let row = SessionRow {
            id: id.clone(),
            tenant: new.tenant.clone(),
            key_name: new.key_name,
            node: self.node.clone(),
            status: "active".into(),
            profile: new.profile.clone(),
            spec: serde_json::json!({
                "policy": new.policy,
                "disk_bytes": new.spec.bytes,
                "files": new.spec.files,
                "quota_enforced": workspace.quota.is_some(),
                "owner": new.spec.owner,
            }),
            workspace: dir.display().to_string(),
            created_ms: now,
            last_active_ms: now,
            expires_ms: now + new.lifetime.as_millis() as i64,
            idle_timeout_ms: new.idle.as_millis() as i64,
            ended_ms: None,
            end_reason: None,
        };
        if let Err(e) = self.store.insert_session(&row).await {
            let _ = workspace.remove();
            return Err(format!("cannot record the session: {e}"));
        }
        let session = Arc::new(live_session(&row, workspace, new.policy));
        self.insert(Arc::clone(&session));
        Ok((session, row))
    }

    /// Ends a session: cancels its runs, waits for them, removes the workspace, records why.
    pub async fn end(&self, session: &LiveSession, engine: &Engine, status: &str, reason: &str) {
        if session.ended.swap(true, Ordering::Relaxed) {
            return;
        }
        let runs: Vec<_> = engine
            .live_runs()
            .into_iter()
            .filter(|r| r.session_id.as_deref() == Some(session.id.as_str()))
            .collect();
        for run in &runs {
            run.stop(Some(ErrorDetail {
                kind: "session_ended".into(),
                message: format!("the session ended ({reason})"),
                fix: "create a new session".into(),
            }));
        }
        for run in &runs {
            if !run.wait_done(Duration::from_secs(60)).await {
                tracing::warn!(run = %run.id, "a run of an ending session did not stop within 60s");
            }
        }
        // The session's prepared sandbox holds its workspace: gone first.
        if let Some(prepared) = engine.warm.forget_session(&session.id) {
            let _ = tokio::task::spawn_blocking(move || drop(prepared)).await;
        }
        if let Err(e) = session.workspace.remove() {
            tracing::warn!(session = %session.id, "cannot remove the workspace: {e}");
        }
        if let Err(e) = self.store.end_session(&session.id, status, reason).await {
            tracing::error!(session = %session.id, "cannot record the session's end: {e}");
        }
        self.forget(&session.id);
    }

    /// Ends the sessions past their lifetime or idle timeout.
    pub async fn sweep(&self, engine: &Engine) {
        let now = now_ms();
        for session in self.all() {
            let busy = engine
                .live_runs()
                .iter()
                .any(|r| r.session_id.as_deref() == Some(session.id.as_str()));
            let last = session.last_active_ms();
            if session.persisted_ms.swap(last, Ordering::Relaxed) != last {
                // Kept in the store so that a restart does not expire a busy session early.
                if let Err(e) = self.store.touch_session(&session.id, last).await {
                    tracing::warn!(session = %session.id, "cannot record activity: {e}");
                }
            }
            if now >= session.expires_ms {
                self.end(&session, engine, "expired", "its maximum lifetime passed")
                    .await;
            } else if !busy && now - session.last_active_ms() >= session.idle_ms {
                self.end(
                    &session,
                    engine,
                    "expired",
                    "it was idle past its idle timeout",
                )
                .await;
            }
        }
    }

    /// Ends (here) the live sessions whose record is no longer active: another node recorded
    /// them lost while this one was silent.
    pub async fn drop_ended_elsewhere(&self, engine: &Engine) {
        let live = self.all();
        if live.is_empty() {
            return;
        }
        let Ok(rows) = self.store.active_sessions(Some(&self.node)).await else {
            return;
        };
        for session in live {
            if !rows.iter().any(|row| row.id == session.id) {
                self.end(&session, engine, "lost", "the fleet recorded it lost")
                    .await;
            }
        }
    }

    /// After a restart: adopts the sessions whose workspace survived (their tmpfs is still
    /// mounted), records the others lost, and removes workspaces nobody owns.
    pub async fn recover(&self) -> Result<(), crate::store::StoreError> {
        let rows = self.store.active_sessions(Some(&self.node)).await?;
        let mut kept = Vec::new();
        for row in rows {
            let dir = PathBuf::from(&row.workspace);
            let quota = row.spec["quota_enforced"].as_bool().unwrap_or(false);
            let intact = dir.is_dir() && (!quota || is_mount_point(&dir));
            if intact {
                let workspace = Workspace::adopt(&dir, quota.then_some((0, 0)), owner_of(&row));
                let policy = serde_json::from_value(row.spec["policy"].clone()).unwrap_or_default();
                self.insert(Arc::new(live_session(&row, workspace, policy)));
                kept.push(dir);
            } else {
                self.store
                    .end_session(&row.id, "lost", "its workspace did not survive a restart")
                    .await?;
            }
        }
        remove_strays(&self.root, &kept);
        Ok(())
    }
}

fn owner_of(row: &SessionRow) -> Option<(u32, u32)> {
    serde_json::from_value(row.spec["owner"].clone())
        .ok()
        .flatten()
}

fn live_session(row: &SessionRow, workspace: Workspace, policy: PolicyRequest) -> LiveSession {
    LiveSession {
        id: row.id.clone(),
        tenant: row.tenant.clone(),
        profile: row.profile.clone(),
        policy,
        workspace,
        expires_ms: row.expires_ms,
        idle_ms: row.idle_timeout_ms,
        last_active_ms: AtomicI64::new(row.last_active_ms),
        persisted_ms: AtomicI64::new(row.last_active_ms),
        ended: AtomicBool::new(false),
    }
}

/// Whether `dir` is the root of a mount (its device differs from its parent's).
pub fn is_mount_point(dir: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    let parent = dir.parent().unwrap_or(Path::new("/"));
    match (std::fs::symlink_metadata(dir), std::fs::metadata(parent)) {
        (Ok(own), Ok(up)) => own.is_dir() && own.dev() != up.dev(),
        _ => false,
    }
}

/// Removes (unmounting first) every entry of `root` not in `keep`.
pub fn remove_strays(root: &Path, keep: &[PathBuf]) {
    for entry in std::fs::read_dir(root).into_iter().flatten().flatten() {
        let path = entry.path();
        if !keep.contains(&path) {
            if let Err(e) = remove_workspace_dir(&path) {
                tracing::warn!("cannot remove stray workspace {}: {e}", path.display());
            }
        }
    }
}
