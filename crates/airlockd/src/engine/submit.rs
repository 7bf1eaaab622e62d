//! Submitting a run: its admission (the store record, the place in the pool) and the choice
//! of the thread it runs on (its caller's, handed over if it outlasts the caller's wait, or
//! one of its own). Apart from the engine's other duties (draining, recording ends, gauges),
//! which do not decide where a run goes.

use std::sync::Arc;
use std::time::{Duration, Instant};

use airlock::pool::Ticket;

use super::{execute, internal_ending, record, Engine, Job, LiveRun, PendingInsert, Work};
use crate::error::ApiError;
use crate::store::{now_ms, Inserted, RunRow};

/// What submitting a run did.
#[derive(Debug)]
pub enum Submitted {
    /// A new run, now queued.
    New(Arc<LiveRun>),
    /// An earlier request with the same idempotency key made this run.
    Existing(Box<RunRow>),
}

/// What admitting a run did.
enum Admit {
    New(Box<Admitted>),
    /// An earlier request with the same idempotency key made this run.
    Existing(Box<RunRow>),
}

/// A run recorded and registered as live, holding its place in the pool.
struct Admitted {
    live: Arc<LiveRun>,
    job: Job,
    ticket: Ticket,
    /// It held its slot when admitted (and was recorded `running` then).
    granted: bool,
}

impl Admitted {
    /// Waits for the slot, runs the work and records the end, on the calling thread; a run
    /// still going at `hand_over_at` continues on a thread of its own.
    fn run(self: Box<Self>, engine: &Arc<Engine>, hand_over_at: Option<Instant>) {
        execute::run_job(
            engine,
            &self.live,
            self.job,
            self.ticket,
            self.granted,
            hand_over_at,
        );
    }
}

/// Whether a waited run may run on its caller's thread until the caller stops waiting: a
/// command the library streams (handed over to a thread of its own if still running then),
/// or one whose limits end it within `wait` (a code run may go to a zygote, which cannot be
/// handed over). Not for a short `wait`, which the sandbox's set-up alone could outlast.
fn runs_on_caller(job: &Job, wait: Duration) -> bool {
    let Work::Command(work) = &job.work else {
        return false;
    };
    wait >= MIN_WAIT_ON_CALLER && (work.code.is_none() || ends_within(job, wait))
}

/// The shortest wait for which a run starts on its caller's thread: set-up (seconds at worst,
/// on a loaded host or a heavy backend) comes before the first chance to hand it over.
const MIN_WAIT_ON_CALLER: Duration = Duration::from_secs(1);

/// A run whose wall-time limit, grace period and a margin for setting up and recording
/// fit in `wait` ends (is killed at the latest) before its caller stops waiting.
fn ends_within(job: &Job, wait: Duration) -> bool {
    let limits = &job.resolved.policy.limits;
    let longest = limits.wall_time.0 + limits.grace.0 + SETUP_AND_RECORD_MARGIN;
    longest <= wait
}

/// Time allowed beyond a run's limits for its sandbox's set-up and teardown and its record,
/// when deciding whether a run ends before its waiting caller stops waiting.
const SETUP_AND_RECORD_MARGIN: Duration = Duration::from_secs(10);

/// `block_in_place` needs a multi-thread runtime (the daemon's; a current-thread one in
/// tests takes the thread path).
fn can_block_in_place() -> bool {
    tokio::runtime::Handle::try_current()
        .is_ok_and(|h| h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread)
}

impl Engine {
    /// Records and queues a run; its own thread takes it from there.
    pub async fn submit(self: &Arc<Self>, job: Job) -> Result<Submitted, ApiError> {
        self.submit_waiting(job, Duration::ZERO).await
    }

    /// As [`Engine::submit`], for a caller that then waits up to `wait` for the run's end.
    /// A command that holds its slot at once runs on the caller's thread
    /// ([`tokio::task::block_in_place`]: the runtime moves its other tasks to another thread)
    /// until it ends or `wait` passes; one still going then is handed over to a thread of
    /// its own and the caller answers as for any run in flight. No hand-off to a run thread
    /// and no wake-up back, which were two waits for a CPU on a loaded host in every waited
    /// run. The run is recorded and registered as live first, so it can be read, streamed and
    /// cancelled as any other, before and after a hand-over.
    pub async fn submit_waiting(
        self: &Arc<Self>,
        job: Job,
        wait: Duration,
    ) -> Result<Submitted, ApiError> {
        let until = Instant::now() + wait;
        let on_caller = runs_on_caller(&job, wait) && can_block_in_place();
        // Without an idempotency key the INSERT cannot find an earlier run, so the answer
        // does not depend on it before the run ends: it may commit beside the planning.
        let insert_beside = on_caller && job.record.idempotency_key.is_none();
        let admitted = match self.admit(job, insert_beside).await? {
            Admit::Existing(row) => return Ok(Submitted::Existing(row)),
            Admit::New(admitted) => admitted,
        };
        let live = Arc::clone(&admitted.live);
        if admitted.granted && on_caller {
            tokio::task::block_in_place(|| admitted.run(self, Some(until)));
        } else {
            self.start_thread(admitted).await;
        }
        if let Some(error) = live.pending_insert().and_then(|p| p.failure()) {
            return Err(ApiError::store(error));
        }
        Ok(Submitted::New(live))
    }

    /// Takes the run's place in the pool and records it (`running` when it holds its slot
    /// already), before anything of it runs.
    /// With `insert_beside`, a run that holds its slot at once is recorded on a runtime worker
    /// while its sandbox is planned (see [`record`]); its live state carries the INSERT.
    async fn admit(self: &Arc<Self>, job: Job, insert_beside: bool) -> Result<Admit, ApiError> {
        if self.is_draining() {
            return Err(ApiError::shutting_down());
        }
        let submitted = Instant::now();
        let ticket = self
            .admission
            .enqueue(&job.tenant, job.priority, job.queue_timeout)
            .inspect_err(|_| self.metrics.deny("queue_full"))?;
        let granted = ticket.is_granted();
        // A run that holds its slot already is recorded `running` at once (one statement
        // instead of an insert and a later update); a queued one is marked when it starts.
        let started_ms = now_ms();
        if granted && insert_beside {
            let live = self.insert_beside(&job, submitted, started_ms);
            return Ok(Admit::New(Box::new(Admitted {
                live,
                job,
                ticket,
                granted,
            })));
        }
        let inserted = if granted {
            self.store.insert_running(&job.record, started_ms).await
        } else {
            self.store.insert_run(&job.record).await
        };
        match inserted.map_err(ApiError::store)? {
            Inserted::Existing(row) => return Ok(Admit::Existing(row)),
            Inserted::New => {}
        }
        let live = self.register(LiveRun::new(&job, submitted, None));
        if granted {
            // As recorded: started when admitted, after no wait.
            live.mark_started(started_ms, 0);
        }
        Ok(Admit::New(Box::new(Admitted {
            live,
            job,
            ticket,
            granted,
        })))
    }

    /// Registers a run admitted with its slot, whose `running` record is inserted by a task
    /// on the runtime while the caller goes on (see [`record`]).
    fn insert_beside(
        self: &Arc<Self>,
        job: &Job,
        submitted: Instant,
        started_ms: i64,
    ) -> Arc<LiveRun> {
        let (store, record) = (self.store.clone(), job.record.clone());
        let work: record::InsertWork = Box::pin(async move {
            match store.insert_running(&record, started_ms).await {
                Ok(Inserted::New) => Ok(()),
                Ok(Inserted::Existing(row)) => Err(format!("run {} is recorded already", row.id)),
                Err(e) => Err(e.to_string()),
            }
        });
        let pending = Arc::new(PendingInsert::new(work, self.runtime.clone()));
        let live = self.register(LiveRun::new(job, submitted, Some(Arc::clone(&pending))));
        live.mark_started(started_ms, 0);
        // Offered to a runtime worker; the run's thread takes it at the launch if no worker
        // has started it by then (see `record`).
        self.runtime.spawn(async move {
            if let Some(work) = pending.claim() {
                let settler = pending.settle_on_drop();
                settler.settle(work.await);
            }
        });
        live
    }

    /// Runs an admitted run on a thread of its own. One with its slot already goes to the
    /// runtime's pool of blocking threads (no thread to create); a queued one waits on a
    /// thread of its own, so waiting runs never take all of the pool's threads from the runs
    /// that hold slots.
    async fn start_thread(self: &Arc<Self>, admitted: Box<Admitted>) {
        let engine = Arc::clone(self);
        let live = Arc::clone(&admitted.live);
        let spawned = if admitted.granted {
            self.runtime
                .spawn_blocking(move || admitted.run(&engine, None));
            Ok(())
        } else {
            std::thread::Builder::new()
                .name(format!("run {}", live.id))
                .spawn(move || admitted.run(&engine, None))
                .map(drop)
        };
        if let Err(e) = spawned {
            let ending = internal_ending(&format!("cannot start a thread for the run: {e}"));
            self.finish(&live, ending, "none", None, None).await;
        }
    }
}
