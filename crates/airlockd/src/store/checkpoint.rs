//! The SQLite store's WAL checkpoints, on a thread of their own.
//!
//! SQLite's automatic checkpoint runs inside the commit that takes the WAL past 1,000 pages,
//! on whichever connection made it: every ~75 runs one request paid 20-40 ms there to fsync
//! the WAL and the database file. Every connection the daemon writes through turns it off
//! (`wal_autocheckpoint = 0` in `SQLITE_PRAGMAS`), and this thread checkpoints instead, on a
//! connection of its own, every [`INTERVAL`]. What is durable when does not change: with
//! `synchronous = NORMAL` a commit is in the WAL (safe from a killed daemon, which SQLite
//! recovers from the WAL) and reaches the disk at the next checkpoint's fsync.
//!
//! A PASSIVE checkpoint waits for no one: it copies the frames no reader still needs, and the
//! next writer starts the WAL over once all are copied; frames committed during a pass are
//! copied by another right after it (up to [`PASSES`]). A reader that holds an old snapshot
//! keeps the WAL growing; past [`HARD_CAP_FRAMES`] the thread tries a TRUNCATE checkpoint,
//! which waits at most the connection's short busy timeout (writers wait that long too) for
//! readers to move on, then empties the file. A PASSIVE checkpoint with nothing new to copy
//! does no I/O, so an idle store costs a lock and a read a second.

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::Duration;

use rusqlite::Connection;

use super::StoreResult;

/// How often the thread checkpoints: the WAL holds about this long of writes.
pub(crate) const INTERVAL: Duration = Duration::from_secs(1);

/// WAL frames (pages) past which a TRUNCATE checkpoint is tried: 64 MiB of 4 KiB pages.
const HARD_CAP_FRAMES: i64 = 16_384;

/// PASSIVE checkpoints at most in a row, each copying what came in during the one before.
const PASSES: usize = 8;

/// How long the TRUNCATE fallback waits for a writer or a reader (and so may hold up a writer).
const CHECKPOINTER_PRAGMAS: &str = "PRAGMA busy_timeout = 100; PRAGMA wal_autocheckpoint = 0;";

/// The checkpointing thread; stopped (after a last checkpoint) by [`Checkpointer::stop`] or
/// when dropped.
#[derive(Debug)]
pub(crate) struct Checkpointer {
    stop: Arc<StopSignal>,
    thread: Mutex<Option<JoinHandle<()>>>,
    checkpoints: Arc<AtomicU64>,
}

/// A flag the thread sleeps on between checkpoints.
#[derive(Debug, Default)]
struct StopSignal {
    stopping: Mutex<bool>,
    woken: Condvar,
}

impl StopSignal {
    /// Sleeps up to `interval`; true when asked to stop.
    fn wait(&self, interval: Duration) -> bool {
        let stopping = self.stopping.lock().unwrap_or_else(PoisonError::into_inner);
        let (stopping, _) = self
            .woken
            .wait_timeout_while(stopping, interval, |stopping| !*stopping)
            .unwrap_or_else(PoisonError::into_inner);
        *stopping
    }

    fn raise(&self) {
        *self.stopping.lock().unwrap_or_else(PoisonError::into_inner) = true;
        self.woken.notify_all();
    }
}

impl Checkpointer {
    /// Opens a connection of its own to `path` (a WAL database) and checkpoints every
    /// `interval` on a thread.
    pub(crate) fn start(path: &Path, interval: Duration) -> StoreResult<Checkpointer> {
        let connection = Connection::open(path)?;
        connection.execute_batch(CHECKPOINTER_PRAGMAS)?;
        let stop = Arc::new(StopSignal::default());
        let checkpoints = Arc::new(AtomicU64::new(0));
        let (thread_stop, thread_count) = (stop.clone(), checkpoints.clone());
        let thread = std::thread::Builder::new()
            .name("airlockd-checkpoint".into())
            .spawn(move || {
                checkpoint_until_stopped(&connection, &thread_stop, interval, &thread_count)
            })
            .map_err(|e| super::StoreError::Other(format!("cannot start the checkpointer: {e}")))?;
        Ok(Checkpointer {
            stop,
            thread: Mutex::new(Some(thread)),
            checkpoints,
        })
    }

    /// Runs a last checkpoint and waits for the thread to end (its connection closes with it).
    pub(crate) fn stop(&self) {
        self.stop.raise();
        let thread = self
            .thread
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        if let Some(thread) = thread {
            let _ = thread.join();
            let checkpoints = self.checkpoints.load(Ordering::Acquire);
            tracing::debug!("WAL checkpointer stopped after {checkpoints} checkpoints");
        }
    }

    /// Checkpoints done so far.
    #[cfg(test)]
    pub(crate) fn checkpoints(&self) -> u64 {
        self.checkpoints.load(Ordering::Acquire)
    }
}

impl Drop for Checkpointer {
    fn drop(&mut self) {
        self.stop();
    }
}

fn checkpoint_until_stopped(
    connection: &Connection,
    stop: &StopSignal,
    interval: Duration,
    checkpoints: &AtomicU64,
) {
    loop {
        let stopping = stop.wait(interval);
        if let Err(error) = checkpoint(connection) {
            tracing::warn!("WAL checkpoint failed: {error}");
        }
        checkpoints.fetch_add(1, Ordering::Release);
        if stopping {
            return;
        }
    }
}

/// PASSIVE checkpoints until one copies every frame (or [`PASSES`]), a TRUNCATE one when
/// the WAL is past its cap ([`HARD_CAP_FRAMES`]). A pass leaves the frames committed while
/// it ran, and the next writer starts the WAL over only once a pass has copied them all:
/// under steady load one pass a second never gets there and the WAL grew by every second's
/// writes.
fn checkpoint(connection: &Connection) -> rusqlite::Result<()> {
    checkpoint_capped(connection, HARD_CAP_FRAMES)
}

/// [`checkpoint`] with the cap as a parameter (tests use a small one).
fn checkpoint_capped(connection: &Connection, cap_frames: i64) -> rusqlite::Result<()> {
    for _ in 0..PASSES {
        let (frames, copied) = run_checkpoint(connection, "PASSIVE")?;
        if copied >= frames {
            return Ok(());
        }
        if frames > cap_frames {
            let (frames, copied) = run_checkpoint(connection, "TRUNCATE")?;
            tracing::debug!("WAL past its cap: TRUNCATE checkpoint, {copied} of {frames} frames");
            return Ok(());
        }
    }
    Ok(())
}

/// `PRAGMA wal_checkpoint(mode)`: the WAL's frames and how many of them are in the database.
fn run_checkpoint(connection: &Connection, mode: &str) -> rusqlite::Result<(i64, i64)> {
    connection.query_row(&format!("PRAGMA wal_checkpoint({mode})"), [], |row| {
        Ok((row.get(1)?, row.get(2)?))
    })
}

#[cfg(test)]
mod tests {
    use std::path::{Path, PathBuf};
    use std::time::{Duration, Instant};

    use rusqlite::Connection;

    use super::{checkpoint_capped, Checkpointer, CHECKPOINTER_PRAGMAS};
    use crate::store::writer::SqliteWriter;

    const BATCHES: usize = 6;
    const COMMITS_PER_BATCH: usize = 400;

    /// Waits until the thread has begun and finished a checkpoint after this call.
    fn wait_for_a_checkpoint(checkpointer: &Checkpointer) {
        let target = checkpointer.checkpoints() + 2;
        let deadline = Instant::now() + Duration::from_secs(10);
        while checkpointer.checkpoints() < target {
            assert!(Instant::now() < deadline, "no checkpoint in 10 s");
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    #[test]
    fn the_wal_stays_bounded_though_the_writer_never_checkpoints() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("store.db");
        let writer = SqliteWriter::open(&path).unwrap();
        assert_eq!(
            writer.query_i64("PRAGMA wal_autocheckpoint"),
            0,
            "the writer never checkpoints"
        );
        writer
            .execute(
                "CREATE TABLE filler (n INTEGER PRIMARY KEY, body TEXT)",
                &[],
            )
            .unwrap();
        let checkpointer = Checkpointer::start(&path, Duration::from_millis(10)).unwrap();
        let body = "x".repeat(3000);
        let wal = path.with_extension("db-wal");
        let mut sizes = Vec::new();
        for _ in 0..BATCHES {
            for _ in 0..COMMITS_PER_BATCH {
                let insert = "INSERT INTO filler (body) VALUES ($1)";
                writer.transaction([(insert, vec![&body as _])]).unwrap();
            }
            sizes.push(std::fs::metadata(&wal).unwrap().len());
            wait_for_a_checkpoint(&checkpointer);
        }
        // A WAL nobody checkpoints grows by a batch each time; a checkpointed one starts over.
        let (first, largest) = (sizes[0], sizes.iter().copied().max().unwrap());
        assert!(
            largest < first * 2,
            "the WAL grew batch after batch ({sizes:?} bytes): not checkpointed"
        );
        checkpointer.stop();
        let rows = writer.query_i64("SELECT COUNT(*) FROM filler");
        assert_eq!(rows, (BATCHES * COMMITS_PER_BATCH) as i64);
    }

    /// A store file with a `filler` table, its writer (which never checkpoints), and `commits`
    /// commits of one 3,000-byte row each (a WAL frame or more each).
    fn filled_store(dir: &Path, commits: usize) -> (PathBuf, SqliteWriter) {
        let path = dir.join("store.db");
        let writer = SqliteWriter::open(&path).unwrap();
        let create = "CREATE TABLE filler (n INTEGER PRIMARY KEY, body TEXT)";
        writer.execute(create, &[]).unwrap();
        fill(&writer, commits);
        (path, writer)
    }

    fn fill(writer: &SqliteWriter, commits: usize) {
        let body = "x".repeat(3000);
        for _ in 0..commits {
            let insert = "INSERT INTO filler (body) VALUES ($1)";
            writer.transaction([(insert, vec![&body as _])]).unwrap();
        }
    }

    /// The rows of `filler` in the database file alone, without its WAL (none when the
    /// table itself is only in the WAL).
    fn rows_in_the_file_alone(path: &Path) -> i64 {
        let alone = path.with_file_name("alone.db");
        std::fs::copy(path, &alone).unwrap();
        let copy = Connection::open(&alone).unwrap();
        let rows = copy.query_row("SELECT COUNT(*) FROM filler", [], |row| row.get(0));
        drop(copy);
        let _ = std::fs::remove_file(&alone);
        rows.unwrap_or(0)
    }

    #[test]
    fn past_its_cap_a_wal_an_old_reader_held_is_emptied_once_the_reader_moves_on() {
        let dir = tempfile::tempdir().unwrap();
        let (path, writer) = filled_store(dir.path(), 0);
        // A reader whose snapshot predates every row: no PASSIVE pass may copy past it.
        let reader = Connection::open(&path).unwrap();
        reader.execute_batch("BEGIN").unwrap();
        let seen: i64 = reader
            .query_row("SELECT COUNT(*) FROM filler", [], |row| row.get(0))
            .unwrap();
        assert_eq!(seen, 0);
        fill(&writer, 100);
        let connection = Connection::open(&path).unwrap();
        connection.execute_batch(CHECKPOINTER_PRAGMAS).unwrap();
        // The reader moves on within the TRUNCATE checkpoint's busy timeout (100 ms).
        let moves_on = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(30));
            reader.execute_batch("COMMIT").unwrap();
        });
        checkpoint_capped(&connection, 50).unwrap();
        moves_on.join().unwrap();
        let wal = std::fs::metadata(path.with_extension("db-wal"))
            .unwrap()
            .len();
        assert_eq!(wal, 0, "the WAL past its cap was not truncated");
        assert_eq!(rows_in_the_file_alone(&path), 100, "every row copied first");
    }

    #[test]
    fn stopping_checkpoints_what_the_wal_still_holds_into_the_database_file() {
        let dir = tempfile::tempdir().unwrap();
        let (path, writer) = filled_store(dir.path(), 40);
        // No checkpoint comes within the interval: only the last one, at stop.
        let checkpointer = Checkpointer::start(&path, Duration::from_secs(3600)).unwrap();
        assert_eq!(rows_in_the_file_alone(&path), 0, "all in the WAL so far");
        checkpointer.stop();
        assert_eq!(checkpointer.checkpoints(), 1);
        assert_eq!(
            rows_in_the_file_alone(&path),
            40,
            "the rows are in the database file itself, the writer still open"
        );
        drop(writer);
    }
}
