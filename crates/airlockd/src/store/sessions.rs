//! Session records.

use sqlx::any::AnyRow;
use sqlx::Row;

use super::{now_ms, Store, StoreResult};

/// A stored session.
#[derive(Debug, Clone, PartialEq)]
pub struct SessionRow {
    pub id: String,
    pub tenant: String,
    pub key_name: String,
    pub node: String,
    /// `active`, `expired`, `deleted` or `lost`.
    pub status: String,
    pub profile: String,
    pub spec: serde_json::Value,
    pub workspace: String,
    pub created_ms: i64,
    pub last_active_ms: i64,
    pub expires_ms: i64,
    pub idle_timeout_ms: i64,
    pub ended_ms: Option<i64>,
    pub end_reason: Option<String>,
}

const COLUMNS: &str = "id, tenant, key_name, node, status, profile, spec, workspace, created_ms, \
    last_active_ms, expires_ms, idle_timeout_ms, ended_ms, end_reason";

fn session_row(r: &AnyRow) -> StoreResult<SessionRow> {
    Ok(SessionRow {
        id: r.try_get(0)?,
        tenant: r.try_get(1)?,
        key_name: r.try_get(2)?,
        node: r.try_get(3)?,
        status: r.try_get(4)?,
        profile: r.try_get(5)?,
        spec: serde_json::from_str(&r.try_get::<String, _>(6)?)?,
        workspace: r.try_get(7)?,
        created_ms: r.try_get(8)?,
        last_active_ms: r.try_get(9)?,
        expires_ms: r.try_get(10)?,
        idle_timeout_ms: r.try_get(11)?,
        ended_ms: r.try_get(12)?,
        end_reason: r.try_get(13)?,
    })
}

impl Store {
    pub async fn insert_session(&self, s: &SessionRow) -> StoreResult<()> {
        sqlx::query(
            "INSERT INTO sessions (id, tenant, key_name, node, status, profile, spec, workspace, \
             created_ms, last_active_ms, expires_ms, idle_timeout_ms) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)",
        )
        .bind(&s.id)
        .bind(&s.tenant)
        .bind(&s.key_name)
        .bind(&s.node)
        .bind(&s.status)
        .bind(&s.profile)
        .bind(s.spec.to_string())
        .bind(&s.workspace)
        .bind(s.created_ms)
        .bind(s.last_active_ms)
        .bind(s.expires_ms)
        .bind(s.idle_timeout_ms)
        .execute(self.pool())
        .await?;
        Ok(())
    }

    pub async fn session(&self, id: &str) -> StoreResult<Option<SessionRow>> {
        let sql = format!("SELECT {COLUMNS} FROM sessions WHERE id = $1");
        let row = sqlx::query(&sql)
            .bind(id)
            .fetch_optional(self.pool())
            .await?;
        row.as_ref().map(session_row).transpose()
    }

    /// Active sessions, of one node or all.
    pub async fn active_sessions(&self, node: Option<&str>) -> StoreResult<Vec<SessionRow>> {
        let sql = match node {
            Some(_) => {
                format!("SELECT {COLUMNS} FROM sessions WHERE status = 'active' AND node = $1")
            }
            None => format!("SELECT {COLUMNS} FROM sessions WHERE status = 'active'"),
        };
        let mut query = sqlx::query(&sql);
        if let Some(node) = node {
            query = query.bind(node);
        }
        let rows = query.fetch_all(self.pool()).await?;
        rows.iter().map(session_row).collect()
    }

    /// Sessions visible to a tenant (`None`: all), newest first.
    pub async fn list_sessions(
        &self,
        tenant: Option<&str>,
        limit: i64,
    ) -> StoreResult<Vec<SessionRow>> {
        let limit = limit.clamp(1, 1000);
        let sql = match tenant {
            Some(_) => format!(
                "SELECT {COLUMNS} FROM sessions WHERE tenant = $1 ORDER BY id DESC LIMIT {limit}"
            ),
            None => format!("SELECT {COLUMNS} FROM sessions ORDER BY id DESC LIMIT {limit}"),
        };
        let mut query = sqlx::query(&sql);
        if let Some(tenant) = tenant {
            query = query.bind(tenant);
        }
        let rows = query.fetch_all(self.pool()).await?;
        rows.iter().map(session_row).collect()
    }

    pub async fn count_active_sessions(&self, tenant: &str) -> StoreResult<i64> {
        let row =
            sqlx::query("SELECT COUNT(*) FROM sessions WHERE tenant = $1 AND status = 'active'")
                .bind(tenant)
                .fetch_one(self.pool())
                .await?;
        Ok(row.try_get(0)?)
    }

    pub async fn touch_session(&self, id: &str, at_ms: i64) -> StoreResult<()> {
        sqlx::query("UPDATE sessions SET last_active_ms = $2 WHERE id = $1 AND status = 'active'")
            .bind(id)
            .bind(at_ms)
            .execute(self.pool())
            .await?;
        Ok(())
    }

    /// Ends an active session; false when it had already ended.
    pub async fn end_session(&self, id: &str, status: &str, reason: &str) -> StoreResult<bool> {
        let done = sqlx::query(
            "UPDATE sessions SET status = $2, end_reason = $3, ended_ms = $4 WHERE id = $1 AND status = 'active'",
        )
        .bind(id)
        .bind(status)
        .bind(reason)
        .bind(now_ms())
        .execute(self.pool())
        .await?;
        Ok(done.rows_affected() > 0)
    }

    /// Records the active sessions of a silent `node` lost; returns their ids.
    pub async fn mark_sessions_lost(&self, node: &str, reason: &str) -> StoreResult<Vec<String>> {
        let rows = sqlx::query(
            "UPDATE sessions SET status = 'lost', end_reason = $2, ended_ms = $3 \
             WHERE node = $1 AND status = 'active' RETURNING id",
        )
        .bind(node)
        .bind(reason)
        .bind(now_ms())
        .fetch_all(self.pool())
        .await?;
        Ok(rows.iter().map(|r| r.get::<String, _>(0)).collect())
    }

    pub async fn prune_sessions(&self, before_ms: i64) -> StoreResult<u64> {
        let done = sqlx::query("DELETE FROM sessions WHERE status <> 'active' AND ended_ms < $1")
            .bind(before_ms)
            .execute(self.pool())
            .await?;
        Ok(done.rows_affected())
    }
}
