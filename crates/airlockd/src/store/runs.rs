//! Run records and their events.

use sqlx::any::AnyRow;
use sqlx::Row;

use super::writer::Written;
use super::{now_ms, Bind, Conditions, Document, Store, StoreError, StoreResult};

/// A run as admitted (status `queued`).
#[derive(Debug, Clone)]
pub struct NewRun {
    pub id: String,
    pub tenant: String,
    pub key_name: String,
    pub kind: String,
    pub session_id: Option<String>,
    pub node: String,
    pub priority: i64,
    pub idempotency_key: Option<String>,
    pub request_hash: Option<String>,
    pub request: Document,
    pub profile: Option<String>,
    pub policy: Option<Document>,
    pub created_ms: i64,
}

/// A stored run.
#[derive(Debug, Clone, PartialEq)]
pub struct RunRow {
    pub id: String,
    pub tenant: String,
    pub key_name: String,
    pub kind: String,
    pub session_id: Option<String>,
    pub node: String,
    pub status: String,
    pub priority: i64,
    pub idempotency_key: Option<String>,
    pub request_hash: Option<String>,
    pub request: Document,
    pub profile: Option<String>,
    pub policy: Option<Document>,
    pub backend: Option<String>,
    pub result: Option<Document>,
    pub error: Option<serde_json::Value>,
    pub outputs: Option<serde_json::Value>,
    pub network: Option<serde_json::Value>,
    pub created_ms: i64,
    pub started_ms: Option<i64>,
    pub ended_ms: Option<i64>,
    pub queue_ms: Option<i64>,
    pub wall_ms: Option<i64>,
}

/// Statuses after which nothing about a run changes.
pub const ACTIVE_STATUSES: [&str; 2] = ["queued", "running"];

impl RunRow {
    pub fn is_terminal(&self) -> bool {
        !ACTIVE_STATUSES.contains(&self.status.as_str())
    }
}

/// One event of a finished run (in `runs.events`, a JSON array of these, or a row of
/// `run_events`).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct StoredEvent {
    pub seq: i64,
    pub at_ms: i64,
    pub kind: String,
    pub data: serde_json::Value,
}

/// Which runs to list.
#[derive(Debug, Clone, Default)]
pub struct RunFilter {
    /// Only these tenants (`None`: all, for admins).
    pub tenant: Option<String>,
    pub status: Option<String>,
    pub session_id: Option<String>,
    pub since_ms: Option<i64>,
    /// Ids sort by creation time: only runs older than this id.
    pub before_id: Option<String>,
    pub limit: i64,
}

const COLUMNS: &str = "id, tenant, key_name, kind, session_id, node, status, priority, \
    idempotency_key, request_hash, request, profile, policy, backend, result, error, outputs, \
    network, created_ms, started_ms, ended_ms, queue_ms, wall_ms";

fn json(text: Option<String>) -> StoreResult<Option<serde_json::Value>> {
    text.map(|t| serde_json::from_str(&t))
        .transpose()
        .map_err(StoreError::from)
}

fn document(text: Option<String>) -> StoreResult<Option<Document>> {
    text.map(Document::parse)
        .transpose()
        .map_err(StoreError::from)
}

fn run_row(r: &AnyRow) -> StoreResult<RunRow> {
    Ok(RunRow {
        id: r.try_get(0)?,
        tenant: r.try_get(1)?,
        key_name: r.try_get(2)?,
        kind: r.try_get(3)?,
        session_id: r.try_get(4)?,
        node: r.try_get(5)?,
        status: r.try_get(6)?,
        priority: r.try_get(7)?,
        idempotency_key: r.try_get(8)?,
        request_hash: r.try_get(9)?,
        request: Document::parse(r.try_get::<String, _>(10)?)?,
        profile: r.try_get(11)?,
        policy: document(r.try_get(12)?)?,
        backend: r.try_get(13)?,
        result: document(r.try_get(14)?)?,
        error: json(r.try_get(15)?)?,
        outputs: json(r.try_get(16)?)?,
        network: json(r.try_get(17)?)?,
        created_ms: r.try_get(18)?,
        started_ms: r.try_get(19)?,
        ended_ms: r.try_get(20)?,
        queue_ms: r.try_get(21)?,
        wall_ms: r.try_get(22)?,
    })
}

pub(super) fn text(value: &Option<serde_json::Value>) -> Option<String> {
    value.as_ref().map(|v| v.to_string())
}

/// What inserting a run did.
#[derive(Debug)]
pub enum Inserted {
    New,
    /// The tenant already sent this idempotency key: the existing run.
    Existing(Box<RunRow>),
}

/// A run as admitted: `$14` is its status, `$15` and `$16` its start and queue time when it
/// holds its slot already.
const INSERT_RUN: &str = "INSERT INTO runs (id, tenant, key_name, kind, session_id, node, status, \
    priority, idempotency_key, request_hash, request, profile, policy, created_ms, started_ms, \
    queue_ms) VALUES ($1, $2, $3, $4, $5, $6, $14, $7, $8, $9, $10, $11, $12, $13, $15, $16)";

impl Store {
    /// Records an admitted run, or returns the run an earlier request with the same
    /// idempotency key created.
    pub async fn insert_run(&self, run: &NewRun) -> StoreResult<Inserted> {
        self.insert_run_as(run, None).await
    }

    /// As [`Store::insert_run`], for a run that holds its slot already: recorded `running`
    /// from `started_ms`, in the same statement (no separate `mark_running`).
    pub async fn insert_running(&self, run: &NewRun, started_ms: i64) -> StoreResult<Inserted> {
        self.insert_run_as(run, Some(started_ms)).await
    }

    async fn insert_run_as(&self, run: &NewRun, started_ms: Option<i64>) -> StoreResult<Inserted> {
        let status = if started_ms.is_some() {
            "running"
        } else {
            "queued"
        };
        let request = run.request.text();
        let policy = run.policy.as_ref().map(Document::text);
        let queue_ms = started_ms.map(|_| 0i64);
        let written = match self.writer() {
            Some(writer) => writer.execute(
                INSERT_RUN,
                &[
                    &run.id,
                    &run.tenant,
                    &run.key_name,
                    &run.kind,
                    &run.session_id,
                    &run.node,
                    &run.priority,
                    &run.idempotency_key,
                    &run.request_hash,
                    &request,
                    &run.profile,
                    &policy,
                    &run.created_ms,
                    &status,
                    &started_ms,
                    &queue_ms,
                ],
            )?,
            None => {
                self.insert_run_sqlx(run, status, started_ms, request, policy)
                    .await?
            }
        };
        match (written, run.idempotency_key.as_deref()) {
            (Written::Done, _) => Ok(Inserted::New),
            (Written::Duplicate, Some(key)) => {
                match self.run_by_idempotency(&run.tenant, key).await? {
                    Some(existing) => Ok(Inserted::Existing(Box::new(existing))),
                    None => Err(StoreError::Other(format!(
                        "run {} conflicts with a stored run, but no run holds its idempotency key",
                        run.id
                    ))),
                }
            }
            (Written::Duplicate, None) => Err(StoreError::Other(format!(
                "run {} is stored already",
                run.id
            ))),
        }
    }

    async fn insert_run_sqlx(
        &self,
        run: &NewRun,
        status: &str,
        started_ms: Option<i64>,
        request: &str,
        policy: Option<&str>,
    ) -> StoreResult<Written> {
        let outcome = sqlx::query(INSERT_RUN)
            .bind(&run.id)
            .bind(&run.tenant)
            .bind(&run.key_name)
            .bind(&run.kind)
            .bind(run.session_id.clone())
            .bind(&run.node)
            .bind(run.priority)
            .bind(run.idempotency_key.clone())
            .bind(run.request_hash.clone())
            .bind(request.to_string())
            .bind(run.profile.clone())
            .bind(policy.map(str::to_string))
            .bind(run.created_ms)
            .bind(status)
            .bind(started_ms)
            .bind(started_ms.map(|_| 0i64))
            .execute(self.pool())
            .await;
        match outcome {
            Ok(_) => Ok(Written::Done),
            Err(e) if is_unique_violation(&e) => Ok(Written::Duplicate),
            Err(e) => Err(e.into()),
        }
    }

    pub async fn run_by_idempotency(&self, tenant: &str, key: &str) -> StoreResult<Option<RunRow>> {
        let sql = format!("SELECT {COLUMNS} FROM runs WHERE tenant = $1 AND idempotency_key = $2");
        let row = sqlx::query(&sql)
            .bind(tenant)
            .bind(key)
            .fetch_optional(self.pool())
            .await?;
        row.as_ref().map(run_row).transpose()
    }

    pub async fn run(&self, id: &str) -> StoreResult<Option<RunRow>> {
        let sql = format!("SELECT {COLUMNS} FROM runs WHERE id = $1");
        let row = sqlx::query(&sql)
            .bind(id)
            .fetch_optional(self.pool())
            .await?;
        row.as_ref().map(run_row).transpose()
    }

    /// The run got its slot and its sandbox is being set up.
    pub async fn mark_running(&self, id: &str, started_ms: i64, queue_ms: i64) -> StoreResult<()> {
        sqlx::query(
            "UPDATE runs SET status = 'running', started_ms = $2, queue_ms = $3 \
             WHERE id = $1 AND status = 'queued'",
        )
        .bind(id)
        .bind(started_ms)
        .bind(queue_ms)
        .execute(self.pool())
        .await?;
        Ok(())
    }

    /// A finished run's events: from its row (`runs.events`), or a row each in `run_events`
    /// (a stream too long to be inline, or a run recorded before the column existed).
    pub async fn events(&self, id: &str) -> StoreResult<Vec<StoredEvent>> {
        let row = sqlx::query("SELECT events FROM runs WHERE id = $1")
            .bind(id)
            .fetch_optional(self.pool())
            .await?;
        let inline: Option<String> = match row {
            Some(row) => row.try_get(0)?,
            None => None,
        };
        if let Some(text) = inline {
            return Ok(serde_json::from_str(&text)?);
        }
        let rows = sqlx::query(
            "SELECT seq, at_ms, kind, data FROM run_events WHERE run_id = $1 ORDER BY seq",
        )
        .bind(id)
        .fetch_all(self.pool())
        .await?;
        rows.iter()
            .map(|r| {
                Ok(StoredEvent {
                    seq: r.try_get(0)?,
                    at_ms: r.try_get(1)?,
                    kind: r.try_get(2)?,
                    data: serde_json::from_str(&r.try_get::<String, _>(3)?)?,
                })
            })
            .collect()
    }

    pub async fn list_runs(&self, filter: &RunFilter) -> StoreResult<Vec<RunRow>> {
        let mut conditions = Conditions::default();
        if let Some(tenant) = &filter.tenant {
            conditions.add("tenant = ?", Bind::Text(tenant.clone()));
        }
        if let Some(status) = &filter.status {
            conditions.add("status = ?", Bind::Text(status.clone()));
        }
        if let Some(session) = &filter.session_id {
            conditions.add("session_id = ?", Bind::Text(session.clone()));
        }
        if let Some(since) = filter.since_ms {
            conditions.add("created_ms >= ?", Bind::Int(since));
        }
        if let Some(before) = &filter.before_id {
            conditions.add("id < ?", Bind::Text(before.clone()));
        }
        let sql = format!(
            "SELECT {COLUMNS} FROM runs {} ORDER BY id DESC LIMIT {}",
            conditions.where_clause(),
            filter.limit.clamp(1, 1000)
        );
        let query = conditions.bind_all(sqlx::query(&sql));
        let rows = query.fetch_all(self.pool()).await?;
        rows.iter().map(run_row).collect()
    }

    /// Marks every in-flight run of `node` lost, with `reason`; returns their ids.
    pub async fn mark_lost(
        &self,
        node: &str,
        reason: &serde_json::Value,
    ) -> StoreResult<Vec<String>> {
        let rows = sqlx::query(
            "UPDATE runs SET status = 'lost', error = $2, ended_ms = $3 \
             WHERE node = $1 AND status IN ('queued', 'running') RETURNING id",
        )
        .bind(node)
        .bind(reason.to_string())
        .bind(now_ms())
        .fetch_all(self.pool())
        .await?;
        Ok(rows.iter().map(|r| r.get::<String, _>(0)).collect())
    }

    /// Deletes finished runs created before `before_ms`, with their events; returns their ids
    /// (so that the files they left, such as worker outputs, can go too).
    pub async fn prune_runs(&self, before_ms: i64) -> StoreResult<Vec<String>> {
        let mut tx = self.begin_write().await?;
        let rows = sqlx::query(
            "DELETE FROM runs WHERE created_ms < $1 AND status NOT IN ('queued', 'running') RETURNING id",
        )
        .bind(before_ms)
        .fetch_all(&mut *tx)
        .await?;
        let ids: Vec<String> = rows.iter().map(|r| r.get::<String, _>(0)).collect();
        for table in ["run_events", "run_network"] {
            let sql = format!("DELETE FROM {table} WHERE run_id NOT IN (SELECT id FROM runs)");
            sqlx::query(&sql).execute(&mut *tx).await?;
        }
        tx.commit().await?;
        Ok(ids)
    }

    /// Counts of runs by status (for the dashboard and metrics after a restart).
    pub async fn count_active(&self, node: &str) -> StoreResult<i64> {
        let row = sqlx::query(
            "SELECT COUNT(*) FROM runs WHERE node = $1 AND status IN ('queued', 'running')",
        )
        .bind(node)
        .fetch_one(self.pool())
        .await?;
        Ok(row.try_get(0)?)
    }
}

fn is_unique_violation(error: &sqlx::Error) -> bool {
    error
        .as_database_error()
        .is_some_and(|e| e.is_unique_violation() || e.message().contains("UNIQUE"))
}
