//! The audit log: security-relevant events, append-only and hash-chained.
//!
//! No API changes or deletes a record; the database refuses updates and the deletion of
//! records younger than a day (triggers), and each record's hash covers the previous one's, so
//! a record edited or removed behind the daemon's back breaks the chain that
//! `GET /v1/audit/verify` recomputes. Appends are serialised (an in-process lock, plus a
//! transaction-scoped advisory lock on PostgreSQL for a fleet) so the chain stays linear.

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use sqlx::any::AnyRow;
use sqlx::Row;
use utoipa::ToSchema;

use super::{now_ms, Bind, Conditions, Dialect, Store, StoreResult};

/// The chain's starting point.
const GENESIS: &str = "0000000000000000000000000000000000000000000000000000000000000000";

/// An arbitrary constant naming airlockd's audit lock among PostgreSQL advisory locks.
const AUDIT_LOCK: i64 = 0x6169_726c_6f63_6b02;

/// Something to record.
#[derive(Debug, Clone)]
pub struct AuditEntry {
    pub kind: &'static str,
    pub tenant: Option<String>,
    pub key_name: Option<String>,
    pub run_id: Option<String>,
    pub detail: serde_json::Value,
}

/// A recorded event.
#[derive(Serialize, Deserialize, ToSchema, Debug, Clone, PartialEq)]
pub struct AuditRecord {
    pub id: i64,
    pub at_ms: i64,
    pub node: String,
    pub tenant: Option<String>,
    pub key_name: Option<String>,
    /// `auth_failed`, `key_used`, `ceiling_refused`, `denied`, `degraded_accepted`,
    /// `unisolated_run`, `run_lost`, `daemon_started`, `daemon_stopped`, `session_lost`.
    pub kind: String,
    pub run_id: Option<String>,
    #[schema(value_type = Object)]
    pub detail: serde_json::Value,
    pub prev_hash: String,
    pub hash: String,
}

/// The outcome of recomputing the chain.
#[derive(Serialize, Deserialize, ToSchema, Debug, Clone, PartialEq)]
pub struct ChainCheck {
    pub records: u64,
    pub intact: bool,
    /// The first record whose hash or link does not match.
    pub first_broken_id: Option<i64>,
}

fn record_hash(prev: &str, r: &AuditRecord) -> String {
    let canonical =
        serde_json::json!([r.at_ms, r.node, r.tenant, r.key_name, r.kind, r.run_id, r.detail]);
    let mut hasher = Sha256::new();
    hasher.update(prev.as_bytes());
    hasher.update(b"\n");
    hasher.update(canonical.to_string().as_bytes());
    crate::auth::hex(&hasher.finalize())
}

fn audit_row(r: &AnyRow) -> StoreResult<AuditRecord> {
    Ok(AuditRecord {
        id: r.try_get(0)?,
        at_ms: r.try_get(1)?,
        node: r.try_get(2)?,
        tenant: r.try_get(3)?,
        key_name: r.try_get(4)?,
        kind: r.try_get(5)?,
        run_id: r.try_get(6)?,
        detail: serde_json::from_str(&r.try_get::<String, _>(7)?)?,
        prev_hash: r.try_get(8)?,
        hash: r.try_get(9)?,
    })
}

const COLUMNS: &str = "id, at_ms, node, tenant, key_name, kind, run_id, detail, prev_hash, hash";

/// Which audit records to list.
#[derive(Debug, Clone, Default)]
pub struct AuditFilter {
    pub tenant: Option<String>,
    pub kind: Option<String>,
    pub since_ms: Option<i64>,
    pub before_id: Option<i64>,
    pub limit: i64,
}

impl Store {
    /// Appends one record to the chain.
    pub async fn append_audit(&self, node: &str, entry: &AuditEntry) -> StoreResult<()> {
        let _turn = self.audit_lock.lock().await;
        let mut tx = self.begin_write().await?;
        if self.dialect() == Dialect::Postgres {
            sqlx::query("SELECT pg_advisory_xact_lock($1)")
                .bind(AUDIT_LOCK)
                .execute(&mut *tx)
                .await?;
        }
        let prev: Option<String> = sqlx::query("SELECT hash FROM audit ORDER BY id DESC LIMIT 1")
            .fetch_optional(&mut *tx)
            .await?
            .map(|r| r.get::<String, _>(0));
        let prev = prev.unwrap_or_else(|| GENESIS.to_string());
        let mut record = AuditRecord {
            id: 0,
            at_ms: now_ms(),
            node: node.to_string(),
            tenant: entry.tenant.clone(),
            key_name: entry.key_name.clone(),
            kind: entry.kind.to_string(),
            run_id: entry.run_id.clone(),
            detail: entry.detail.clone(),
            prev_hash: prev.clone(),
            hash: String::new(),
        };
        record.hash = record_hash(&prev, &record);
        sqlx::query(
            "INSERT INTO audit (at_ms, node, tenant, key_name, kind, run_id, detail, prev_hash, hash) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)",
        )
        .bind(record.at_ms)
        .bind(&record.node)
        .bind(record.tenant.clone())
        .bind(record.key_name.clone())
        .bind(&record.kind)
        .bind(record.run_id.clone())
        .bind(record.detail.to_string())
        .bind(&record.prev_hash)
        .bind(&record.hash)
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(())
    }

    pub async fn list_audit(&self, filter: &AuditFilter) -> StoreResult<Vec<AuditRecord>> {
        let mut conditions = Conditions::default();
        if let Some(tenant) = &filter.tenant {
            conditions.add("tenant = ?", Bind::Text(tenant.clone()));
        }
        if let Some(kind) = &filter.kind {
            conditions.add("kind = ?", Bind::Text(kind.clone()));
        }
        if let Some(since) = filter.since_ms {
            conditions.add("at_ms >= ?", Bind::Int(since));
        }
        if let Some(before) = filter.before_id {
            conditions.add("id < ?", Bind::Int(before));
        }
        let sql = format!(
            "SELECT {COLUMNS} FROM audit {} ORDER BY id DESC LIMIT {}",
            conditions.where_clause(),
            filter.limit.clamp(1, 5000)
        );
        let query = conditions.bind_all(sqlx::query(&sql));
        let rows = query.fetch_all(self.pool()).await?;
        rows.iter().map(audit_row).collect()
    }

    /// Recomputes the chain from the oldest kept record.
    pub async fn verify_audit(&self) -> StoreResult<ChainCheck> {
        let sql = format!("SELECT {COLUMNS} FROM audit ORDER BY id");
        let rows = sqlx::query(&sql).fetch_all(self.pool()).await?;
        let mut prev: Option<String> = None;
        let mut check = ChainCheck {
            records: 0,
            intact: true,
            first_broken_id: None,
        };
        for row in &rows {
            let record = audit_row(row)?;
            check.records += 1;
            let linked = prev.as_ref().is_none_or(|p| *p == record.prev_hash);
            if check.intact && (!linked || record_hash(&record.prev_hash, &record) != record.hash) {
                check.intact = false;
                check.first_broken_id = Some(record.id);
            }
            prev = Some(record.hash);
        }
        Ok(check)
    }

    /// Deletes audit records older than `before_ms` (the database refuses anything younger
    /// than a day).
    pub async fn prune_audit(&self, before_ms: i64) -> StoreResult<u64> {
        let done = sqlx::query("DELETE FROM audit WHERE at_ms < $1")
            .bind(before_ms)
            .execute(self.pool())
            .await?;
        Ok(done.rows_affected())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every append lands while other writers commit: on SQLite a deferred transaction that
    /// read the chain's head could not take the write lock once another connection had
    /// committed (SQLITE_BUSY without waiting), and the record was lost.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn appends_land_while_other_writers_commit() {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite://{}", dir.path().join("store.db").display());
        let store = Store::open(&url, 4).await.unwrap();
        let writer = {
            let store = store.clone();
            tokio::spawn(async move {
                for tick in 0..400 {
                    store.heartbeat("other", None, tick).await.unwrap();
                }
            })
        };
        let entry = AuditEntry {
            kind: "ceiling_refused",
            tenant: Some("t".into()),
            key_name: Some("k".into()),
            run_id: None,
            detail: serde_json::json!({}),
        };
        for _ in 0..200 {
            store.append_audit("me", &entry).await.unwrap();
        }
        writer.await.unwrap();
        let check = store.verify_audit().await.unwrap();
        assert_eq!((check.records, check.intact), (200, true));
    }
}
