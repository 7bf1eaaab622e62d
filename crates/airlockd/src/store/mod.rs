//! The run store: SQLite (WAL) on one node, PostgreSQL for a fleet, one schema and one set of
//! migrations for both (sqlx's `Any` driver; every query uses `$n` parameters, which both
//! drivers accept, and only BIGINT and TEXT columns).
//!
//! Durability: SQLite runs in WAL mode with `synchronous = NORMAL`, so a committed transaction
//! survives the daemon being killed (it is in the WAL file) though not a power cut before the
//! next checkpoint; PostgreSQL commits are durable. A run's terminal record is committed
//! before any client can learn the run ended.

mod audit;
mod checkpoint;
mod document;
mod ending;
mod migrate;
mod runs;
mod sessions;
mod writer;

use std::time::{SystemTime, UNIX_EPOCH};

use sqlx::any::{AnyPoolOptions, AnyRow};
use sqlx::{AnyPool, Row};

pub use audit::{AuditEntry, AuditFilter, AuditRecord, ChainCheck};
pub use document::Document;
pub use ending::Ending;
pub use runs::{Inserted, NewRun, RunFilter, RunRow, StoredEvent};
pub use sessions::SessionRow;

/// Which database is behind the store, for the few statements that differ.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dialect {
    Sqlite,
    Postgres,
}

/// Errors of the store.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("database: {0}")]
    Db(#[from] sqlx::Error),
    #[error("a stored document is not valid JSON: {0}")]
    Json(#[from] serde_json::Error),
    #[error("{0}")]
    Other(String),
}

pub type StoreResult<T> = Result<T, StoreError>;

/// A connection pool to the store.
#[derive(Debug, Clone)]
pub struct Store {
    pool: AnyPool,
    dialect: Dialect,
    audit_lock: std::sync::Arc<tokio::sync::Mutex<()>>,
    /// SQLite in a file: the hot-path writes, on the calling thread (see [`writer`]).
    writer: Option<std::sync::Arc<writer::SqliteWriter>>,
    /// SQLite in a file: the WAL's checkpoints, off the writers' commits (see [`checkpoint`]).
    checkpointer: Option<std::sync::Arc<checkpoint::Checkpointer>>,
}

/// Milliseconds since the Unix epoch.
pub fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

impl Store {
    /// Connects and brings the schema up to date.
    pub async fn open(url: &str, max_connections: u32) -> StoreResult<Store> {
        sqlx::any::install_default_drivers();
        let dialect = if url.starts_with("sqlite:") {
            Dialect::Sqlite
        } else {
            Dialect::Postgres
        };
        let (url, file) = match dialect {
            Dialect::Sqlite => sqlite_url(url)?,
            Dialect::Postgres => (url.to_string(), None),
        };
        let pool = AnyPoolOptions::new()
            .max_connections(max_connections.max(1))
            .acquire_timeout(std::time::Duration::from_secs(10))
            // Pinging each connection before use finds a PostgreSQL server that hung up; a
            // SQLite connection is a file in this process and cannot, and there the ping is
            // a round trip to sqlx's worker thread that doubled the cost of every statement.
            .test_before_acquire(dialect == Dialect::Postgres)
            .after_connect(move |conn, _| {
                Box::pin(async move {
                    if dialect == Dialect::Sqlite {
                        sqlx::Executor::execute(conn, SQLITE_PRAGMAS).await?;
                    }
                    Ok(())
                })
            })
            .connect(&url)
            .await?;
        let mut store = Store {
            pool,
            dialect,
            audit_lock: Default::default(),
            writer: None,
            checkpointer: None,
        };
        migrate::run(&store).await?;
        // An in-memory database is one per connection: it keeps every write on sqlx.
        if let Some(file) = file {
            store.writer = Some(std::sync::Arc::new(writer::SqliteWriter::open(&file)?));
            let checkpointer = checkpoint::Checkpointer::start(&file, checkpoint::INTERVAL)?;
            store.checkpointer = Some(std::sync::Arc::new(checkpointer));
        }
        Ok(store)
    }

    pub fn dialect(&self) -> Dialect {
        self.dialect
    }

    pub(crate) fn pool(&self) -> &AnyPool {
        &self.pool
    }

    /// A transaction that holds the write lock from its start. On SQLite a deferred one that
    /// reads before it writes fails at once (SQLITE_BUSY_SNAPSHOT, no busy wait) when another
    /// connection committed in between; `BEGIN IMMEDIATE` waits its turn instead.
    pub(crate) async fn begin_write(&self) -> StoreResult<sqlx::Transaction<'static, sqlx::Any>> {
        Ok(match self.dialect {
            Dialect::Sqlite => self.pool.begin_with("BEGIN IMMEDIATE").await?,
            Dialect::Postgres => self.pool.begin().await?,
        })
    }

    /// The hot-path writer, for a SQLite store in a file.
    pub(crate) fn writer(&self) -> Option<&writer::SqliteWriter> {
        self.writer.as_deref()
    }

    /// The connection pool itself, for operators' tools and tests that inspect the database.
    pub fn raw_pool(&self) -> &AnyPool {
        &self.pool
    }

    /// Records that `node` is alive and where to reach it.
    pub async fn heartbeat(
        &self,
        node: &str,
        advertise: Option<&str>,
        started_ms: i64,
    ) -> StoreResult<()> {
        sqlx::query(
            "INSERT INTO nodes (id, advertise, pid, started_ms, heartbeat_ms) VALUES ($1, $2, $3, $4, $5) \
             ON CONFLICT (id) DO UPDATE SET advertise = excluded.advertise, pid = excluded.pid, \
             started_ms = excluded.started_ms, heartbeat_ms = excluded.heartbeat_ms",
        )
        .bind(node)
        .bind(advertise.map(str::to_string))
        .bind(i64::from(std::process::id()))
        .bind(started_ms)
        .bind(now_ms())
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    /// Where another node can be reached, and when it last said it was alive.
    pub async fn node(&self, node: &str) -> StoreResult<Option<(Option<String>, i64)>> {
        let row: Option<AnyRow> =
            sqlx::query("SELECT advertise, heartbeat_ms FROM nodes WHERE id = $1")
                .bind(node)
                .fetch_optional(&self.pool)
                .await?;
        Ok(row.map(|r| (r.get::<Option<String>, _>(0), r.get::<i64, _>(1))))
    }

    /// The pid the node last ran as.
    pub async fn node_pid(&self, node: &str) -> StoreResult<Option<i64>> {
        let row: Option<AnyRow> = sqlx::query("SELECT pid FROM nodes WHERE id = $1")
            .bind(node)
            .fetch_optional(&self.pool)
            .await?;
        Ok(row.map(|r| r.get::<i64, _>(0)))
    }

    /// Nodes other than `me` silent since `before_ms`.
    pub async fn silent_nodes(&self, me: &str, before_ms: i64) -> StoreResult<Vec<String>> {
        let rows = sqlx::query("SELECT id FROM nodes WHERE id <> $1 AND heartbeat_ms < $2")
            .bind(me)
            .bind(before_ms)
            .fetch_all(&self.pool)
            .await?;
        Ok(rows.iter().map(|r| r.get::<String, _>(0)).collect())
    }

    /// A trivial query: is the store reachable?
    pub async fn ping(&self) -> StoreResult<()> {
        sqlx::query("SELECT 1").execute(&self.pool).await?;
        Ok(())
    }

    /// Closes the pool, after a last WAL checkpoint on SQLite (a short wait on its thread).
    pub async fn close(&self) {
        if let Some(checkpointer) = &self.checkpointer {
            checkpointer.stop();
        }
        self.pool.close().await;
    }
}

/// WAL lets readers run while one writer commits; `NORMAL` skips the fsync per commit (a
/// committed transaction still survives a killed process); foreign keys are not used. No
/// connection that writes checkpoints in its commits: a thread does ([`checkpoint`]), and a
/// WAL that readers let grow past 64 MiB is cut back to that when it starts over.
const SQLITE_PRAGMAS: &str = "PRAGMA journal_mode = WAL; PRAGMA synchronous = NORMAL; \
    PRAGMA busy_timeout = 10000; PRAGMA wal_autocheckpoint = 0; \
    PRAGMA journal_size_limit = 67108864;";

/// Creates the database file (and its directory) when missing; the URL for sqlx and the
/// file's path (none for `:memory:`).
fn sqlite_url(url: &str) -> StoreResult<(String, Option<std::path::PathBuf>)> {
    let path = url
        .trim_start_matches("sqlite://")
        .trim_start_matches("sqlite:");
    let path = path.split('?').next().unwrap_or(path);
    if path != ":memory:" {
        if let Some(parent) = std::path::Path::new(path).parent() {
            std::fs::create_dir_all(parent).map_err(|e| {
                StoreError::Other(format!("cannot create {}: {e}", parent.display()))
            })?;
        }
    }
    let url = if url.contains('?') {
        url.to_string()
    } else {
        format!("sqlite://{path}?mode=rwc")
    };
    let file = (path != ":memory:" && !url.contains("mode=memory")).then(|| path.into());
    Ok((url, file))
}

/// A value bound to a `$n` parameter.
pub(crate) enum Bind {
    Text(String),
    Int(i64),
}

/// A `WHERE` clause built from optional filters, numbering parameters as they are added.
#[derive(Default)]
pub(crate) struct Conditions {
    parts: Vec<String>,
    binds: Vec<Bind>,
}

pub(crate) type AnyQuery<'q> = sqlx::query::Query<'q, sqlx::Any, sqlx::any::AnyArguments<'q>>;

impl Conditions {
    /// Adds `condition`, whose one `?` stands for `bind`.
    pub(crate) fn add(&mut self, condition: &str, bind: Bind) {
        self.binds.push(bind);
        self.parts
            .push(condition.replace('?', &format!("${}", self.binds.len())));
    }

    pub(crate) fn where_clause(&self) -> String {
        if self.parts.is_empty() {
            String::new()
        } else {
            format!("WHERE {}", self.parts.join(" AND "))
        }
    }

    pub(crate) fn bind_all(self, mut query: AnyQuery<'_>) -> AnyQuery<'_> {
        for bind in self.binds {
            query = match bind {
                Bind::Text(text) => query.bind(text),
                Bind::Int(value) => query.bind(value),
            };
        }
        query
    }
}
