//! A run's live state, shared by its thread and whoever reads, streams, waits for or stops
//! it while it runs. Apart from the engine: this is what one run carries from admission to
//! its recorded end; the engine holds the table of them.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use airlock::pool::CancelToken;
use tokio::sync::watch;

use super::events::EventLog;
use super::{Job, PendingInsert, Step, Timeline};
use crate::error::ErrorDetail;
use crate::store::RunRow;

/// A run this node is serving.
#[derive(Debug)]
pub struct LiveRun {
    pub id: String,
    pub tenant: String,
    pub session_id: Option<String>,
    pub log: EventLog,
    pub cancel: CancelToken,
    pub(super) state: Mutex<LiveState>,
    pub(super) done: watch::Sender<bool>,
    /// The run's record as stored at its end, so the caller that waited for it gets it
    /// without reading it back (unset when the store did not take it; taken once).
    pub(super) recorded: Mutex<Option<RunRow>>,
    /// Its admission record while that commits beside the sandbox's planning (see
    /// [`super::record`]); none when it was committed before the run was admitted.
    pending_insert: Option<Arc<PendingInsert>>,
}

/// Stops a run when dropped: held by a caller waiting for the run, so that a caller that
/// goes away (a closed connection, a cancelled MCP request) stops it instead of leaving it to
/// its limits. [`StopOnDrop::disarm`] once the run has ended.
pub struct StopOnDrop(Option<Arc<LiveRun>>);

impl StopOnDrop {
    pub fn new(live: &Arc<LiveRun>) -> StopOnDrop {
        StopOnDrop(Some(Arc::clone(live)))
    }

    pub fn disarm(mut self) {
        self.0 = None;
    }
}

impl Drop for StopOnDrop {
    fn drop(&mut self) {
        if let Some(live) = self.0.take() {
            live.stop(None);
        }
    }
}

#[derive(Debug, Default)]
pub(super) struct LiveState {
    running: bool,
    /// When it got its slot, and how long it had waited for it.
    pub(super) started: Option<(i64, i64)>,
    /// How long the library took to run it (set up, run, tear down).
    sandbox_time: Option<Duration>,
    /// Why the run is being stopped, when the daemon (not the caller) stops it.
    stop_reason: Option<ErrorDetail>,
    /// When each step of the run's way through the daemon happened (for the debug log).
    timeline: Timeline,
}

impl LiveRun {
    /// The live state of `job`, submitted at `submitted`: recorded just now, or being recorded
    /// (`pending_insert`).
    pub(super) fn new(
        job: &Job,
        submitted: Instant,
        pending_insert: Option<Arc<PendingInsert>>,
    ) -> LiveRun {
        let inserted = pending_insert.is_none().then(Instant::now);
        LiveRun {
            id: job.record.id.clone(),
            tenant: job.tenant.name.clone(),
            session_id: job.record.session_id.clone(),
            log: EventLog::default(),
            cancel: CancelToken::new(),
            state: Mutex::new(LiveState {
                timeline: Timeline {
                    submitted: Some(submitted),
                    inserted,
                    ..Timeline::default()
                },
                ..LiveState::default()
            }),
            done: watch::channel(false).0,
            recorded: Mutex::new(None),
            pending_insert,
        }
    }

    /// The admission record's INSERT while it may still be committing.
    pub fn pending_insert(&self) -> Option<&Arc<PendingInsert>> {
        self.pending_insert.as_ref()
    }

    /// Waits for the admission record: `Err` with the store's error when it was not stored
    /// (then nothing of the run started and nothing more of it may be recorded).
    pub fn wait_for_record(&self) -> Result<(), String> {
        self.pending_insert.as_ref().map_or(Ok(()), |p| p.wait())
    }

    /// Waits until the run's terminal record is in the store, at most `timeout`.
    pub async fn wait_done(&self, timeout: Duration) -> bool {
        let mut done = self.done.subscribe();
        let finished = tokio::time::timeout(timeout, done.wait_for(|d| *d))
            .await
            .is_ok();
        finished
    }

    pub fn is_running(&self) -> bool {
        self.state
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .running
    }

    /// The terminal record, once stored, for the caller that waited for the run: the first
    /// to ask takes it (its documents move into the answer); a later one reads the store.
    pub fn take_recorded(&self) -> Option<RunRow> {
        self.recorded
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
    }

    /// How long the library took to run it, once it ran.
    pub fn sandbox_time(&self) -> Option<Duration> {
        self.state
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .sandbox_time
    }

    pub(super) fn set_sandbox_time(&self, time: Duration) {
        self.state
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .sandbox_time = Some(time);
    }

    /// Notes when the run reached `step`.
    pub fn mark(&self, step: Step) {
        self.state
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .timeline
            .mark(step);
    }

    pub fn timeline(&self) -> Timeline {
        let mut timeline = self
            .state
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .timeline;
        if let Some(pending) = &self.pending_insert {
            timeline.inserted = pending.settled_at();
            timeline.launch = pending.launch_at();
            timeline.held = Some(pending.held());
        }
        timeline
    }

    /// Marks the run started now, after waiting `queue_ms` for its slot.
    pub(super) fn mark_started(&self, started_ms: i64, queue_ms: i64) {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        state.running = true;
        state.started = Some((started_ms, queue_ms));
    }

    /// Cancels the run, recording why when the daemon decided it.
    pub fn stop(&self, reason: Option<ErrorDetail>) {
        if let Some(reason) = reason {
            self.state
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .stop_reason
                .get_or_insert(reason);
        }
        self.cancel.cancel();
    }

    pub(super) fn stop_reason(&self) -> Option<ErrorDetail> {
        self.state
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .stop_reason
            .clone()
    }
}
