//! The SQLite store's hot-path writes (a run's record at admission and at its end) on the
//! calling thread, through rusqlite.
//!
//! Why not sqlx here: sqlx's SQLite driver runs each statement on a worker thread of its own
//! and hands the answer back through a channel; on a loaded 2-core host each of those two
//! hand-offs waits for a CPU, and a run's two statements cost ~0.3 ms each of the daemon's
//! 1 ms budget. A SQLite INSERT or UPDATE in WAL mode with `synchronous = NORMAL` (no fsync
//! per commit) takes tens of microseconds, short enough to run where the caller is: the
//! request's task at admission, the run's own thread at its end. One connection behind a
//! mutex is the single writer SQLite allows anyway (a second would only wait in the busy
//! handler's sleeps). Everything else, and PostgreSQL, stays on sqlx; the schema and the
//! statements are the same (`$n` parameters are bound by their number, as sqlx does).

use std::path::Path;
use std::sync::{Mutex, PoisonError};

use rusqlite::types::ToSql;
use rusqlite::{Connection, ErrorCode};

use super::{StoreError, StoreResult};

/// One rusqlite connection to the store's file, for its hot-path writes.
#[derive(Debug)]
pub(crate) struct SqliteWriter {
    connection: Mutex<Connection>,
}

/// What a write did.
pub(crate) enum Written {
    Done,
    /// A UNIQUE constraint refused the row (an idempotency key used before).
    Duplicate,
}

impl From<rusqlite::Error> for StoreError {
    fn from(error: rusqlite::Error) -> StoreError {
        StoreError::Other(format!("database: {error}"))
    }
}

impl SqliteWriter {
    /// Opens `path` (the schema is already migrated) with the pragmas of sqlx's connections.
    pub(crate) fn open(path: &Path) -> StoreResult<SqliteWriter> {
        let connection = Connection::open(path)?;
        connection.execute_batch(super::SQLITE_PRAGMAS)?;
        Ok(SqliteWriter {
            connection: Mutex::new(connection),
        })
    }

    /// Runs one statement with `$n` parameters.
    pub(crate) fn execute(&self, sql: &str, params: &[&dyn ToSql]) -> StoreResult<Written> {
        let connection = self.lock();
        match execute_on(&connection, sql, params) {
            Err(rusqlite::Error::SqliteFailure(e, _)) if is_unique_violation(&e) => {
                Ok(Written::Duplicate)
            }
            outcome => outcome.map(|_| Written::Done).map_err(StoreError::from),
        }
    }

    /// Runs `statements` (SQL and its parameters) in one transaction: all or none. `BEGIN
    /// IMMEDIATE` and `COMMIT` are cached prepared statements too (rusqlite's `Transaction`
    /// parses both anew each time: ~10 % of a run's end record).
    pub(crate) fn transaction<'p>(
        &self,
        statements: impl IntoIterator<Item = (&'p str, Vec<&'p dyn ToSql>)>,
    ) -> StoreResult<()> {
        let connection = self.lock();
        run_cached(&connection, "BEGIN IMMEDIATE")?;
        let written = statements
            .into_iter()
            .try_for_each(|(sql, params)| execute_on(&connection, sql, &params).map(drop))
            .and_then(|()| run_cached(&connection, "COMMIT"));
        if let Err(error) = written {
            // Ends the transaction whatever failed (a failed COMMIT leaves it open).
            if !connection.is_autocommit() {
                let _ = connection.execute_batch("ROLLBACK");
            }
            return Err(error.into());
        }
        Ok(())
    }

    /// One integer a query or pragma answers, for tests that inspect the connection.
    #[cfg(test)]
    pub(crate) fn query_i64(&self, sql: &str) -> i64 {
        self.lock().query_row(sql, [], |row| row.get(0)).unwrap()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Connection> {
        self.connection
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }
}

fn is_unique_violation(error: &rusqlite::ffi::Error) -> bool {
    error.code == ErrorCode::ConstraintViolation
        && [
            rusqlite::ffi::SQLITE_CONSTRAINT_UNIQUE,
            rusqlite::ffi::SQLITE_CONSTRAINT_PRIMARYKEY,
        ]
        .contains(&error.extended_code)
}

/// Runs a statement without parameters (a cached prepared statement).
fn run_cached(connection: &Connection, sql: &str) -> rusqlite::Result<()> {
    connection.prepare_cached(sql)?.execute([]).map(drop)
}

/// Binds each `$n` of `sql` to `params[n - 1]` and runs it (a cached prepared statement).
fn execute_on(
    connection: &Connection,
    sql: &str,
    params: &[&dyn ToSql],
) -> rusqlite::Result<usize> {
    let mut statement = connection.prepare_cached(sql)?;
    for index in 1..=statement.parameter_count() {
        let number = statement
            .parameter_name(index)
            .and_then(|name| name.strip_prefix('$'))
            .and_then(|n| n.parse::<usize>().ok());
        let value = number
            .and_then(|n| params.get(n.wrapping_sub(1)))
            .ok_or(rusqlite::Error::InvalidParameterCount(index, params.len()))?;
        statement.raw_bind_parameter(index, value)?;
    }
    statement.raw_execute()
}

#[cfg(test)]
mod tests {
    use super::SqliteWriter;

    fn writer() -> (tempfile::TempDir, SqliteWriter) {
        let dir = tempfile::tempdir().unwrap();
        let writer = SqliteWriter::open(&dir.path().join("store.db")).unwrap();
        writer
            .lock()
            .execute_batch("CREATE TABLE t (n BIGINT PRIMARY KEY)")
            .unwrap();
        (dir, writer)
    }

    fn count(writer: &SqliteWriter) -> i64 {
        writer
            .lock()
            .query_row("SELECT COUNT(*) FROM t", [], |row| row.get(0))
            .unwrap()
    }

    #[test]
    fn a_transaction_is_all_or_none_and_the_connection_goes_on_after_a_failure() {
        let (_dir, writer) = writer();
        let one = 1i64;
        let insert = "INSERT INTO t (n) VALUES ($1)";
        writer.transaction([(insert, vec![&one as _])]).unwrap();
        let failed = writer.transaction([(insert, vec![&2i64 as _]), (insert, vec![&one as _])]);
        assert!(failed.is_err(), "the duplicate key fails the transaction");
        assert_eq!(count(&writer), 1, "nothing of the failed transaction stays");
        assert!(writer.lock().is_autocommit(), "no transaction left open");
        writer
            .transaction([(insert, vec![&3i64 as _]), (insert, vec![&4i64 as _])])
            .unwrap();
        assert_eq!(count(&writer), 3);
    }
}
