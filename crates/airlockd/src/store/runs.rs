//! Run records and their events.

use sqlx::any::AnyRow;
use sqlx::Row;

use super::{now_ms, AnyQuery, Bind, Conditions, Dialect, Store, StoreError, StoreResult};

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
    pub request: serde_json::Value,
    pub profile: Option<String>,
    pub policy: Option<serde_json::Value>,
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
    pub request: serde_json::Value,
    pub profile: Option<String>,
    pub policy: Option<serde_json::Value>,
    pub backend: Option<String>,
    pub result: Option<serde_json::Value>,
    pub error: Option<serde_json::Value>,
    pub outputs: Option<serde_json::Value>,
    pub network: Option<serde_json::Value>,
    pub created_ms: i64,
    pub started_ms: Option<i64>,
    pub ended_ms: Option<i64>,
    pub queue_ms: Option<i64>,
    pub wall_ms: Option<i64>,
}

/// Rows per INSERT statement: at most 7 parameters each; a run's end writes at most one
/// chunk of events and one of decisions with its 11 own (12,011), well within SQLite's 32,766
/// and PostgreSQL's 65,535.
const ROWS_PER_INSERT: usize = 1000;

/// One INSERT of `rows` rows into `table (columns)`, numbered `$n` parameters (both databases
/// read them) after the first `skip`. A row already stored (a retry after the status update
/// failed) is skipped.
fn rows_insert(table: &str, columns: &[&str], rows: usize, skip: usize) -> String {
    let width = columns.len();
    let values: Vec<String> = (0..rows)
        .map(|row| {
            let params: Vec<String> = (1..=width)
                .map(|i| format!("${}", skip + row * width + i))
                .collect();
            format!("({})", params.join(", "))
        })
        .collect();
    format!(
        "INSERT INTO {table} ({}) VALUES {} ON CONFLICT DO NOTHING",
        columns.join(", "),
        values.join(", ")
    )
}

const EVENT_COLUMNS: [&str; 5] = ["run_id", "seq", "at_ms", "kind", "data"];
const DECISION_COLUMNS: [&str; 7] = [
    "run_id", "seq", "at_ms", "decision", "reason", "host", "record",
];

/// One decision of the egress gate, as `run_network` keeps it (searchable by decision,
/// reason and name; `record` is the gate's whole record).
#[derive(Debug, Clone, PartialEq)]
struct StoredDecision {
    seq: i64,
    decision: String,
    reason: Option<String>,
    host: Option<String>,
    record: serde_json::Value,
}

/// The decisions of a network report (`NetworkReport` as JSON).
fn decisions_of(report: Option<&serde_json::Value>) -> Vec<StoredDecision> {
    let records = report
        .and_then(|r| r["decisions"].as_array())
        .map(Vec::as_slice)
        .unwrap_or_default();
    let text = |v: &serde_json::Value| v.as_str().map(str::to_string);
    records
        .iter()
        .enumerate()
        .map(|(i, record)| StoredDecision {
            seq: record["id"].as_i64().unwrap_or(i as i64),
            decision: text(&record["decision"]).unwrap_or_default(),
            reason: text(&record["reason"]),
            host: text(&record["name"]).or_else(|| text(&record["address"])),
            record: record.clone(),
        })
        .collect()
}

/// The terminal status of a run still `queued` or `running` ($1 to $11, see [`bind_ending`]).
const END_RUN: &str = "UPDATE runs SET status = $2, backend = $3, result = $4, error = $5, \
    outputs = $6, wall_ms = $7, ended_ms = $8, started_ms = COALESCE(started_ms, $9), \
    queue_ms = COALESCE(queue_ms, $10), network = $11 \
    WHERE id = $1 AND status IN ('queued', 'running')";

/// Parameters of [`END_RUN`]; the rows' parameters follow them.
const END_RUN_PARAMS: usize = 11;

/// [`END_RUN`] with the inserts of `events` and `decisions` rows before it, as one request.
fn finish_statement(dialect: Dialect, events: usize, decisions: usize) -> String {
    let mut inserts = Vec::new();
    if events > 0 {
        inserts.push(rows_insert(
            "run_events",
            &EVENT_COLUMNS,
            events,
            END_RUN_PARAMS,
        ));
    }
    if decisions > 0 {
        let skip = END_RUN_PARAMS + events * EVENT_COLUMNS.len();
        inserts.push(rows_insert(
            "run_network",
            &DECISION_COLUMNS,
            decisions,
            skip,
        ));
    }
    if inserts.is_empty() {
        return END_RUN.to_string();
    }
    match dialect {
        // Statements run in order, each committed: the status last.
        Dialect::Sqlite => format!("{}; {END_RUN}", inserts.join("; ")),
        // Data-modifying WITH clauses run once, in the same statement and transaction.
        Dialect::Postgres => {
            let with: Vec<String> = inserts
                .iter()
                .enumerate()
                .map(|(i, insert)| format!("rows{i} AS ({insert} RETURNING 1)"))
                .collect();
            format!("WITH {} {END_RUN}", with.join(", "))
        }
    }
}

fn bind_ending<'q>(query: AnyQuery<'q>, id: &str, ending: &Ending) -> AnyQuery<'q> {
    query
        .bind(id.to_string())
        .bind(ending.status.clone())
        .bind(ending.backend.clone())
        .bind(text(&ending.result))
        .bind(text(&ending.error))
        .bind(text(&ending.outputs))
        .bind(ending.wall_ms)
        .bind(ending.ended_ms)
        .bind(ending.started_ms)
        .bind(ending.queue_ms)
        .bind(text(&ending.network))
}

fn bind_events<'q>(mut query: AnyQuery<'q>, id: &str, events: &[StoredEvent]) -> AnyQuery<'q> {
    for event in events {
        query = query
            .bind(id.to_string())
            .bind(event.seq)
            .bind(event.at_ms)
            .bind(event.kind.clone())
            .bind(event.data.to_string());
    }
    query
}

fn bind_decisions<'q>(
    mut query: AnyQuery<'q>,
    id: &str,
    at_ms: i64,
    decisions: &[StoredDecision],
) -> AnyQuery<'q> {
    for decision in decisions {
        query = query
            .bind(id.to_string())
            .bind(decision.seq)
            .bind(at_ms)
            .bind(decision.decision.clone())
            .bind(decision.reason.clone())
            .bind(decision.host.clone())
            .bind(decision.record.to_string());
    }
    query
}

/// Statuses after which nothing about a run changes.
pub const ACTIVE_STATUSES: [&str; 2] = ["queued", "running"];

impl RunRow {
    pub fn is_terminal(&self) -> bool {
        !ACTIVE_STATUSES.contains(&self.status.as_str())
    }
}

/// One event of a finished run.
#[derive(Debug, Clone, PartialEq)]
pub struct StoredEvent {
    pub seq: i64,
    pub at_ms: i64,
    pub kind: String,
    pub data: serde_json::Value,
}

/// How a run ended, as the store records it.
#[derive(Debug, Clone, Default)]
pub struct Ending {
    pub status: String,
    pub backend: Option<String>,
    pub result: Option<serde_json::Value>,
    pub error: Option<serde_json::Value>,
    pub outputs: Option<serde_json::Value>,
    /// The egress gate's report (`NetworkReport`), for a gated run.
    pub network: Option<serde_json::Value>,
    pub wall_ms: Option<i64>,
    /// When the run got its slot, and how long it waited (none if it never started).
    pub started_ms: Option<i64>,
    pub queue_ms: Option<i64>,
    pub ended_ms: i64,
}

impl Ending {
    /// The stored row of `run` once this ending is recorded.
    pub fn row(&self, run: &NewRun) -> RunRow {
        RunRow {
            id: run.id.clone(),
            tenant: run.tenant.clone(),
            key_name: run.key_name.clone(),
            kind: run.kind.clone(),
            session_id: run.session_id.clone(),
            node: run.node.clone(),
            status: self.status.clone(),
            priority: run.priority,
            idempotency_key: run.idempotency_key.clone(),
            request_hash: run.request_hash.clone(),
            request: run.request.clone(),
            profile: run.profile.clone(),
            policy: run.policy.clone(),
            backend: self.backend.clone(),
            result: self.result.clone(),
            error: self.error.clone(),
            outputs: self.outputs.clone(),
            network: self.network.clone(),
            created_ms: run.created_ms,
            started_ms: self.started_ms,
            ended_ms: Some(self.ended_ms),
            queue_ms: self.queue_ms,
            wall_ms: self.wall_ms,
        }
    }
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
        request: serde_json::from_str(&r.try_get::<String, _>(10)?)?,
        profile: r.try_get(11)?,
        policy: json(r.try_get(12)?)?,
        backend: r.try_get(13)?,
        result: json(r.try_get(14)?)?,
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

fn text(value: &Option<serde_json::Value>) -> Option<String> {
    value.as_ref().map(|v| v.to_string())
}

/// What inserting a run did.
#[derive(Debug)]
pub enum Inserted {
    New,
    /// The tenant already sent this idempotency key: the existing run.
    Existing(Box<RunRow>),
}

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
        let outcome = sqlx::query(
            "INSERT INTO runs (id, tenant, key_name, kind, session_id, node, status, priority, \
             idempotency_key, request_hash, request, profile, policy, created_ms, started_ms, queue_ms) \
             VALUES ($1, $2, $3, $4, $5, $6, $14, $7, $8, $9, $10, $11, $12, $13, $15, $16)",
        )
        .bind(&run.id)
        .bind(&run.tenant)
        .bind(&run.key_name)
        .bind(&run.kind)
        .bind(run.session_id.clone())
        .bind(&run.node)
        .bind(run.priority)
        .bind(run.idempotency_key.clone())
        .bind(run.request_hash.clone())
        .bind(run.request.to_string())
        .bind(run.profile.clone())
        .bind(text(&run.policy))
        .bind(run.created_ms)
        .bind(status)
        .bind(started_ms)
        .bind(started_ms.map(|_| 0i64))
        .execute(self.pool())
        .await;
        match outcome {
            Ok(_) => Ok(Inserted::New),
            Err(e) if is_unique_violation(&e) && run.idempotency_key.is_some() => {
                let key = run.idempotency_key.as_deref().unwrap_or_default();
                match self.run_by_idempotency(&run.tenant, key).await? {
                    Some(existing) => Ok(Inserted::Existing(Box::new(existing))),
                    None => Err(e.into()),
                }
            }
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

    /// Records how a run ended, with its events (and a gated run's network decisions), in one
    /// round trip to the database: on SQLite one request of two or three statements (events,
    /// decisions, then the terminal status, each its own commit: a crash between them leaves a
    /// `running` record, which recovery marks lost, never a terminal record without its
    /// events); on PostgreSQL one statement whose `WITH` inserts commit with the status. A
    /// run already marked terminal (lost by another node's verdict) is left as it is. A run
    /// with more rows than one INSERT holds writes them in chunks first.
    pub async fn finish_run(
        &self,
        id: &str,
        ending: &Ending,
        events: &[StoredEvent],
    ) -> StoreResult<()> {
        let decisions = decisions_of(ending.network.as_ref());
        if events.len() > ROWS_PER_INSERT || decisions.len() > ROWS_PER_INSERT {
            self.insert_events(id, events).await?;
            self.insert_decisions(id, ending.ended_ms, &decisions)
                .await?;
            return self.end_run(id, ending).await;
        }
        let sql = finish_statement(self.dialect(), events.len(), decisions.len());
        let query = bind_ending(sqlx::query(&sql), id, ending);
        let query = bind_events(query, id, events);
        let query = bind_decisions(query, id, ending.ended_ms, &decisions);
        query.execute(self.pool()).await?;
        Ok(())
    }

    /// The terminal status alone.
    async fn end_run(&self, id: &str, ending: &Ending) -> StoreResult<()> {
        bind_ending(sqlx::query(END_RUN), id, ending)
            .execute(self.pool())
            .await?;
        Ok(())
    }

    async fn insert_events(&self, id: &str, events: &[StoredEvent]) -> StoreResult<()> {
        for chunk in events.chunks(ROWS_PER_INSERT) {
            let sql = rows_insert("run_events", &EVENT_COLUMNS, chunk.len(), 0);
            bind_events(sqlx::query(&sql), id, chunk)
                .execute(self.pool())
                .await?;
        }
        Ok(())
    }

    /// The gate's decisions, one row each.
    async fn insert_decisions(
        &self,
        id: &str,
        at_ms: i64,
        decisions: &[StoredDecision],
    ) -> StoreResult<()> {
        for chunk in decisions.chunks(ROWS_PER_INSERT) {
            let sql = rows_insert("run_network", &DECISION_COLUMNS, chunk.len(), 0);
            bind_decisions(sqlx::query(&sql), id, at_ms, chunk)
                .execute(self.pool())
                .await?;
        }
        Ok(())
    }

    pub async fn events(&self, id: &str) -> StoreResult<Vec<StoredEvent>> {
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
        let mut tx = self.pool().begin().await?;
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
