//! A run's end as the store writes it: the terminal status with the run's events and the egress
//! gate's decisions, in one transaction on the run's thread (a SQLite file) or one round trip
//! to the database (PostgreSQL).
//!
//! The events go into the run's own row (`runs.events`, a JSON array) when they fit in
//! [`INLINE_EVENTS_BYTES`]: the end of a short run is then one UPDATE of one row, two B-trees
//! (the table and the status index) where the events' rows added two more (`run_events` and
//! its primary key), each a WAL frame and a cold B-tree walk on the request's path. Longer
//! streams keep a row per event in `run_events`, as before.

use std::sync::LazyLock;

use rusqlite::types::ToSql;

use super::runs::{text, NewRun, RunRow, StoredEvent};
use super::writer::SqliteWriter;
use super::{AnyQuery, Dialect, Document, Store, StoreResult};

/// Rows per INSERT statement: at most 7 parameters each; a run's end writes at most one
/// chunk of events and one of decisions with its 12 own (12,012), well within SQLite's 32,766
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

/// Events whose JSON is at most this long are stored in the run's row: a short run's stream
/// (`started`, a little output) is a few hundred bytes; a long one (much output, many
/// chunks) keeps a row per event, so that no run's row carries megabytes of output.
pub(super) const INLINE_EVENTS_BYTES: usize = 16 * 1024;

/// The events as their JSON array, when short enough to go into the run's row.
fn inline_events(events: &[StoredEvent]) -> Option<String> {
    serde_json::to_string(events)
        .ok()
        .filter(|text| text.len() <= INLINE_EVENTS_BYTES)
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

/// The terminal status of a run still `queued` or `running`, with its events when inline
/// ($1 to $12, see [`bind_ending`]).
const END_RUN: &str = "UPDATE runs SET status = $2, backend = $3, result = $4, error = $5, \
    outputs = $6, wall_ms = $7, ended_ms = $8, started_ms = COALESCE(started_ms, $9), \
    queue_ms = COALESCE(queue_ms, $10), network = $11, events = $12 \
    WHERE id = $1 AND status IN ('queued', 'running')";

/// Parameters of [`END_RUN`]; the rows' parameters follow them.
const END_RUN_PARAMS: usize = 12;

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

fn bind_ending<'q>(
    query: AnyQuery<'q>,
    id: &str,
    ending: &Ending,
    inline: Option<String>,
) -> AnyQuery<'q> {
    query
        .bind(id.to_string())
        .bind(ending.status.clone())
        .bind(ending.backend.clone())
        .bind(ending.result.as_ref().map(|r| r.text().to_string()))
        .bind(text(&ending.error))
        .bind(text(&ending.outputs))
        .bind(ending.wall_ms)
        .bind(ending.ended_ms)
        .bind(ending.started_ms)
        .bind(ending.queue_ms)
        .bind(text(&ending.network))
        .bind(inline)
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

/// How a run ended, as the store records it.
#[derive(Debug, Clone, Default)]
pub struct Ending {
    pub status: String,
    pub backend: Option<String>,
    /// The library's result (or a call's outcome), as written once for the row and the answer.
    pub result: Option<Document>,
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
    pub fn into_row(self, run: NewRun) -> RunRow {
        RunRow {
            id: run.id,
            tenant: run.tenant,
            key_name: run.key_name,
            kind: run.kind,
            session_id: run.session_id,
            node: run.node,
            status: self.status,
            priority: run.priority,
            idempotency_key: run.idempotency_key,
            request_hash: run.request_hash,
            request: run.request,
            profile: run.profile,
            policy: run.policy,
            backend: self.backend,
            result: self.result,
            error: self.error,
            outputs: self.outputs,
            network: self.network,
            created_ms: run.created_ms,
            started_ms: self.started_ms,
            ended_ms: Some(self.ended_ms),
            queue_ms: self.queue_ms,
            wall_ms: self.wall_ms,
        }
    }
}

/// [`Store::finish_run`] on a SQLite file, on the calling thread (the run's own): the
/// terminal status with the events inline is one statement; rows of events too long to be
/// inline, and the gate's decisions, go before it in the same transaction, all or none.
fn finish_on(
    writer: &SqliteWriter,
    id: &str,
    ending: &Ending,
    events: &[StoredEvent],
    decisions: &[StoredDecision],
) -> StoreResult<()> {
    static INSERT_EVENT: LazyLock<String> =
        LazyLock::new(|| rows_insert("run_events", &EVENT_COLUMNS, 1, 0));
    static INSERT_DECISION: LazyLock<String> =
        LazyLock::new(|| rows_insert("run_network", &DECISION_COLUMNS, 1, 0));
    let inline = inline_events(events);
    let rows = if inline.is_some() { &[][..] } else { events };
    let data: Vec<String> = rows.iter().map(|e| e.data.to_string()).collect();
    let records: Vec<String> = decisions.iter().map(|d| d.record.to_string()).collect();
    let mut statements: Vec<(&str, Vec<&dyn ToSql>)> = Vec::new();
    for (event, data) in rows.iter().zip(&data) {
        let row: Vec<&dyn ToSql> = vec![&id, &event.seq, &event.at_ms, &event.kind, data];
        statements.push((&INSERT_EVENT, row));
    }
    for (decision, record) in decisions.iter().zip(&records) {
        let row: Vec<&dyn ToSql> = vec![
            &id,
            &decision.seq,
            &ending.ended_ms,
            &decision.decision,
            &decision.reason,
            &decision.host,
            record,
        ];
        statements.push((&INSERT_DECISION, row));
    }
    let result = ending.result.as_ref().map(Document::text);
    let documents = [
        text(&ending.error),
        text(&ending.outputs),
        text(&ending.network),
    ];
    let [error, outputs, network] = &documents;
    let end: Vec<&dyn ToSql> = vec![
        &id,
        &ending.status,
        &ending.backend,
        &result,
        error,
        outputs,
        &ending.wall_ms,
        &ending.ended_ms,
        &ending.started_ms,
        &ending.queue_ms,
        network,
        &inline,
    ];
    if statements.is_empty() {
        // One statement is all or none by itself: no BEGIN and COMMIT to run.
        return writer.execute(END_RUN, &end).map(drop);
    }
    statements.push((END_RUN, end));
    writer.transaction(statements)
}

impl Store {
    /// Records how a run ended, with its events (in its row when they fit in
    /// [`INLINE_EVENTS_BYTES`], else a row each) and a gated run's network decisions: on a
    /// SQLite file on the calling thread ([`finish_on`]); otherwise in one round trip to the
    /// database: on SQLite in memory one request of up to three statements (event rows,
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
        if let Some(writer) = self.writer() {
            return finish_on(writer, id, ending, events, &decisions);
        }
        let inline = inline_events(events);
        let rows = if inline.is_some() { &[][..] } else { events };
        if rows.len() > ROWS_PER_INSERT || decisions.len() > ROWS_PER_INSERT {
            self.insert_events(id, rows).await?;
            self.insert_decisions(id, ending.ended_ms, &decisions)
                .await?;
            return self.end_run(id, ending, inline).await;
        }
        let sql = finish_statement(self.dialect(), rows.len(), decisions.len());
        let query = bind_ending(sqlx::query(&sql), id, ending, inline);
        let query = bind_events(query, id, rows);
        let query = bind_decisions(query, id, ending.ended_ms, &decisions);
        query.execute(self.pool()).await?;
        Ok(())
    }

    /// The terminal status, with the events when inline (else in rows already).
    async fn end_run(&self, id: &str, ending: &Ending, inline: Option<String>) -> StoreResult<()> {
        bind_ending(sqlx::query(END_RUN), id, ending, inline)
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
}
