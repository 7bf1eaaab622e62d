//! The run engine: admits runs, runs each on a thread of its own through the library, streams
//! its events and records its end.
//!
//! A run is recorded (`queued`) before its id is returned to anyone, marked `running` when it
//! holds its slots, and recorded terminal, with its events, before anyone can see it ended:
//! the store commit comes first, then the log closes and waiters wake.

pub mod admission;
pub mod events;
mod execute;
mod record;
pub mod spawner;
mod timeline;
pub mod warm;
pub mod worker_lib;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use airlock::pool::{CancelToken, Ticket};
use tokio::sync::watch;

use crate::audit::Audit;
use crate::error::{ApiError, ErrorDetail};
use crate::metrics::{LatencyLabels, Metrics, RunLabels, StartLabels, TenantLabels, WarmLabels};
use crate::resolve::Resolved;
use crate::store::{now_ms, Ending, Inserted, NewRun, RunRow, Store};
use crate::tenant::Tenant;
use crate::workspace::Workspace;
use admission::Admission;
use events::EventLog;

pub use execute::{CallWork, CommandWork, WorkerWork};
pub use record::PendingInsert;
pub use timeline::{Step, Timeline};
pub use warm::{CodeWork, StartPath, WarmStarts};

/// What a run does once it has its slots.
#[derive(Debug)]
pub enum Work {
    Command(CommandWork),
    Worker(WorkerWork),
    Call(Box<CallWork>),
}

/// A run ready to be admitted.
#[derive(Debug)]
pub struct Job {
    pub record: NewRun,
    pub tenant: Arc<Tenant>,
    pub key_name: String,
    pub priority: i32,
    pub resolved: Resolved,
    pub work: Work,
    pub queue_timeout: Duration,
}

/// A run this node is serving.
#[derive(Debug)]
pub struct LiveRun {
    pub id: String,
    pub tenant: String,
    pub session_id: Option<String>,
    pub log: EventLog,
    pub cancel: CancelToken,
    state: Mutex<LiveState>,
    done: watch::Sender<bool>,
    /// The run's record as stored at its end, so the caller that waited for it gets it
    /// without reading it back (unset when the store did not take it; taken once).
    recorded: Mutex<Option<RunRow>>,
    /// Its admission record while that commits beside the sandbox's planning (see
    /// [`record`]); none when it was committed before the run was admitted.
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
struct LiveState {
    running: bool,
    /// When it got its slot, and how long it had waited for it.
    started: Option<(i64, i64)>,
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
    fn new(job: &Job, submitted: Instant, pending_insert: Option<Arc<PendingInsert>>) -> LiveRun {
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

    fn set_sandbox_time(&self, time: Duration) {
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
    fn mark_started(&self, started_ms: i64, queue_ms: i64) {
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

    fn stop_reason(&self) -> Option<ErrorDetail> {
        self.state
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .stop_reason
            .clone()
    }
}

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

/// Where runs keep files on this node.
#[derive(Debug, Clone)]
pub struct EnginePaths {
    /// Workspaces of runs that were sent files, and worker jobs.
    pub work: PathBuf,
    /// Worker outputs, one directory per run.
    pub outputs: PathBuf,
}

/// The engine of one node.
#[derive(Debug)]
pub struct Engine {
    pub store: Store,
    pub node: String,
    pub admission: Arc<Admission>,
    pub metrics: Arc<Metrics>,
    pub audit: Arc<Audit>,
    pub paths: EnginePaths,
    pub python: String,
    pub keep_output: bool,
    /// Prepared sandboxes and zygotes (`[warm]`), filled in the background at start-up.
    pub warm: WarmStarts,
    /// Forks the inits of cold command runs (started with the daemon).
    pub spawner: Arc<spawner::ColdSpawner>,
    live: Mutex<HashMap<String, Arc<LiveRun>>>,
    pub(crate) runtime: tokio::runtime::Handle,
    draining: AtomicBool,
}

impl Engine {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        store: Store,
        node: String,
        admission: Arc<Admission>,
        metrics: Arc<Metrics>,
        audit: Arc<Audit>,
        paths: EnginePaths,
        python: String,
        keep_output: bool,
    ) -> Engine {
        Engine {
            store,
            node,
            admission,
            metrics,
            audit,
            paths,
            python,
            keep_output,
            warm: WarmStarts::default(),
            spawner: Arc::default(),
            live: Mutex::new(HashMap::new()),
            runtime: tokio::runtime::Handle::current(),
            draining: AtomicBool::new(false),
        }
    }

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

    /// Adds `live` to the runs this node serves.
    fn register(&self, live: LiveRun) -> Arc<LiveRun> {
        let live = Arc::new(live);
        self.live
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(live.id.clone(), Arc::clone(&live));
        live
    }

    /// Lets go of a live run: it leaves the table of live runs, its event log closes and its
    /// waiters wake. After its end (recorded or not), or for a run whose admission record the
    /// store did not take (nothing of it started; its caller answers with the store's error).
    fn let_go(&self, live: &LiveRun) {
        self.live
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&live.id);
        live.log.close();
        live.done.send_replace(true);
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

    pub fn live(&self, id: &str) -> Option<Arc<LiveRun>> {
        self.live
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(id)
            .cloned()
    }

    pub fn live_runs(&self) -> Vec<Arc<LiveRun>> {
        self.live
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .values()
            .cloned()
            .collect()
    }

    pub fn is_draining(&self) -> bool {
        self.draining.load(Ordering::Relaxed)
    }

    /// SIGTERM: admit nothing more; cancel queued runs now; let running ones finish within
    /// `grace`, then cancel them; return once every run has its terminal record.
    pub async fn drain(&self, grace: Duration) {
        self.draining.store(true, Ordering::Relaxed);
        let shutting_down = || ErrorDetail {
            kind: "shutting_down".into(),
            message: "the daemon shut down before the run could start".into(),
            fix: "submit the run again".into(),
        };
        for run in self.live_runs().iter().filter(|r| !r.is_running()) {
            run.stop(Some(shutting_down()));
        }
        let deadline = tokio::time::Instant::now() + grace;
        while !self.live_runs().is_empty() && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        for run in self.live_runs() {
            run.stop(Some(ErrorDetail {
                kind: "shutting_down".into(),
                message: format!(
                    "the daemon shut down and its {}s grace period for running runs passed",
                    grace.as_secs()
                ),
                fix: "submit the run again".into(),
            }));
        }
        while !self.live_runs().is_empty() {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Records a run's end (the store first), updates metrics and the audit log, then lets
    /// subscribers and waiters know.
    async fn finish(
        &self,
        live: &LiveRun,
        mut ending: Ending,
        tenant: &str,
        wall: Option<Duration>,
        record: Option<NewRun>,
    ) {
        if ending.status == "cancelled" && ending.error.is_none() {
            ending.error = live
                .stop_reason()
                .map(|r| serde_json::to_value(r).unwrap_or_default());
        }
        let started = live
            .state
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .started;
        (ending.started_ms, ending.queue_ms) = started.unzip();
        ending.ended_ms = crate::store::now_ms();
        let events = live.log.snapshot();
        let mut stored = false;
        for attempt in 0..5u64 {
            match self.store.finish_run(&live.id, &ending, &events).await {
                Ok(()) => {
                    stored = true;
                    break;
                }
                Err(e) => {
                    tracing::error!(run = %live.id, "cannot record the run's end (attempt {}): {e}", attempt + 1);
                    tokio::time::sleep(Duration::from_millis(200 * (attempt + 1))).await;
                }
            }
        }
        live.mark(Step::Recorded);
        self.count(&ending, tenant, wall);
        match record {
            // Moved, not copied: the request, policy and result documents are the answer's
            // largest parts.
            Some(record) if stored => {
                *live.recorded.lock().unwrap_or_else(PoisonError::into_inner) =
                    Some(ending.into_row(record));
            }
            _ if !stored => {
                tracing::error!(run = %live.id, "the run's end is not recorded; a restart marks it lost");
            }
            _ => {}
        }
        self.let_go(live);
    }

    fn count(&self, ending: &Ending, tenant: &str, wall: Option<Duration>) {
        let backend = ending.backend.clone().unwrap_or_else(|| "none".into());
        self.metrics
            .runs
            .get_or_create(&RunLabels {
                status: ending.status.clone(),
                backend: backend.clone(),
                tenant: tenant.into(),
            })
            .inc();
        if let Some(start) = warm::start_of(ending) {
            self.metrics
                .runs_by_start
                .get_or_create(&StartLabels {
                    start: start.name().into(),
                    tenant: tenant.into(),
                })
                .inc();
        }
        if let Some(wall) = wall {
            self.admission.observe_run(wall);
            self.metrics
                .run_seconds
                .get_or_create(&LatencyLabels {
                    backend,
                    tenant: tenant.into(),
                })
                .observe(wall.as_secs_f64());
        }
    }

    /// Refreshes the queue gauges (called when metrics are scraped).
    pub fn refresh_gauges(&self) {
        let stats = self.admission.stats();
        self.metrics.queue_depth.clear();
        for (tenant, count) in stats.queued_per_tenant {
            self.metrics
                .queue_depth
                .get_or_create(&TenantLabels { tenant })
                .set(count as i64);
        }
        self.metrics.warm_ready.clear();
        for ((kind, profile), count) in self.warm.ready() {
            self.metrics
                .warm_ready
                .get_or_create(&WarmLabels { kind, profile })
                .set(count as i64);
        }
        self.metrics.running.clear();
        for (tenant, count) in stats.running_per_tenant {
            self.metrics
                .running
                .get_or_create(&TenantLabels { tenant })
                .set(count as i64);
        }
    }

    fn block_on<F: std::future::Future>(&self, future: F) -> F::Output {
        self.runtime.block_on(future)
    }
}

fn internal_ending(message: &str) -> Ending {
    Ending {
        status: "sandbox_error".into(),
        error: Some(serde_json::json!({
            "kind": "internal",
            "message": message,
            "fix": "retry; an operator should read the daemon's log",
        })),
        ..Ending::default()
    }
}

/// Keeps a workspace until dropped, then removes it (a run's own files, a worker's job).
#[derive(Debug)]
pub struct OwnedWorkspace(pub Workspace);

impl Drop for OwnedWorkspace {
    fn drop(&mut self) {
        if let Err(e) = self.0.remove() {
            tracing::warn!("cannot remove workspace {}: {e}", self.0.dir.display());
        }
    }
}
