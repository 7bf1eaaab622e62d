//! A run's own thread: wait for the slots, run through the library, turn what happened into
//! the run's terminal record.

mod audit;
mod call;
mod ending;
mod stream;
mod worker;

use std::path::PathBuf;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use airlock::call::{CallOptions, ToolPolicy, ToolSpec};
use airlock::pool::{Permit, PoolError, Ticket};
use airlock::worker::{IngestLimits, InputFile};
use serde_json::json;

use super::warm::{CodeWork, StartPath};
use super::{Engine, Job, LiveRun, OwnedWorkspace, Step, Work};
use crate::resolve::Resolved;
use crate::store::{now_ms, Ending};
use crate::workspace::WorkspaceSpec;
use audit::audit_ending;
use call::run_call;
use ending::ending_of;
use stream::{spawn_streamed, InFlight, Output, Relayed};
use worker::run_worker;

pub(super) use stream::{relay, Streamed};

/// A program (or code through the interpreter registry) to run.
#[derive(Debug)]
pub struct CommandWork {
    pub argv: Vec<String>,
    pub env: Vec<(String, String)>,
    pub stdin: Option<Vec<u8>>,
    /// The run's own workspace holding the files it was sent (removed after the run).
    pub workspace: Option<OwnedWorkspace>,
    /// A session's workspace, shared with the session's other runs.
    pub shared_workdir: Option<PathBuf>,
    /// The code and its interpreter, for a code run whose code is an argument (a zygote
    /// of that interpreter may run it).
    pub code: Option<CodeWork>,
}

/// A worker job: inputs uploaded to `uploads`, staged into a fresh job workspace.
#[derive(Debug)]
pub struct WorkerWork {
    pub program: Vec<String>,
    pub env: Vec<(String, String)>,
    pub inputs: Vec<InputFile>,
    /// The directory holding the uploaded inputs (removed after the run).
    pub uploads: PathBuf,
    pub options: serde_json::Value,
    pub ingest: IngestLimits,
    pub job: WorkspaceSpec,
    /// Files for the worker's `PYTHONPATH` directory, beside the helper (see `worker_lib`).
    pub program_files: Vec<(String, Vec<u8>)>,
}

/// A Python tool call.
#[derive(Debug)]
pub struct CallWork {
    pub tool: ToolSpec,
    pub args: serde_json::Value,
    pub policy: ToolPolicy,
    pub options: CallOptions,
}

/// `admitted_running`: the run held its slot when it was submitted, and was recorded
/// `running` then. `hand_over_at`: when the calling thread must be free again (a request's
/// thread that answers its caller then); a run still going then continues on a thread of its
/// own, where it is recorded as any other.
pub(super) fn run_job(
    engine: &Arc<Engine>,
    live: &Arc<LiveRun>,
    job: Job,
    ticket: Ticket,
    admitted_running: bool,
    hand_over_at: Option<Instant>,
) {
    live.mark(Step::Thread);
    let waited = Instant::now();
    let slots = ticket.wait(&live.cancel);
    let queue = waited.elapsed();
    engine
        .metrics
        .queue_wait_seconds
        .observe(queue.as_secs_f64());
    let end = JobEnd {
        record: job.record,
        key_name: job.key_name,
        tenant: job.tenant.name.clone(),
        queue,
    };
    let slots = match slots {
        Ok(slots) => slots,
        Err(refused) => {
            return end.record(engine, live, refused_ending(engine, live, refused), None)
        }
    };
    let (started_ms, queue_ms) = (now_ms(), queue.as_millis() as i64);
    if !admitted_running {
        live.mark_started(started_ms, queue_ms);
    }
    live.mark(Step::Slot);
    let ran = Ran {
        started: Instant::now(),
        slots,
    };
    // A run that waited is marked running without waiting: its start is not delayed
    // by a store write, and the terminal write that follows only applies to a
    // `queued` or `running` row. (One admitted at once was inserted `running`.)
    if !admitted_running {
        let (store, id) = (engine.store.clone(), live.id.clone());
        engine.runtime.spawn(async move {
            if let Err(e) = store.mark_running(&id, started_ms, queue_ms).await {
                tracing::error!(run = %id, "cannot mark the run running: {e}");
            }
        });
    }
    match execute(engine, live, &job.resolved, job.work, hand_over_at) {
        Executed::Ended(ending) => end.ran(engine, live, ending, ran),
        Executed::Running(in_flight) => hand_over(engine, live, in_flight, end, ran),
    }
}

/// What a run that got its slots holds until its end.
struct Ran {
    started: Instant,
    slots: Permit,
}

/// What recording a run's end needs of its job.
struct JobEnd {
    record: crate::store::NewRun,
    key_name: String,
    tenant: String,
    queue: Duration,
}

impl JobEnd {
    /// Notes the library's time, frees the slots and records the end.
    fn ran(self, engine: &Engine, live: &LiveRun, ending: Ending, ran: Ran) {
        let wall = ran.started.elapsed();
        // The launch held for the run's record is the daemon's time, not the library's.
        let held = live.pending_insert().map_or(Duration::ZERO, |p| p.held());
        live.set_sandbox_time(wall.saturating_sub(held));
        live.mark(Step::SandboxDone);
        drop(ran.slots);
        self.record(engine, live, ending, Some(wall));
    }

    /// The audit log, then the store, then waiters; nothing of a run whose admission record
    /// the store did not take (its caller answers with the store's error).
    fn record(self, engine: &Engine, live: &LiveRun, ending: Ending, wall: Option<Duration>) {
        if live.wait_for_record().is_err() {
            return engine.let_go(live);
        }
        audit_ending(engine, live, &self.key_name, &self.tenant, &ending);
        let recording = Instant::now();
        engine.block_on(engine.finish(live, ending, &self.tenant, wall, Some(self.record)));
        tracing::debug!(
            run = %live.id,
            queue_us = self.queue.as_micros() as u64,
            run_us = wall.map_or(0, |w| w.as_micros() as u64),
            record_us = recording.elapsed().as_micros() as u64,
            "run ended"
        );
    }
}

/// The ending of a run that got no slot: cancelled while queued, refused after the queue
/// timeout, or the pool's own failure.
fn refused_ending(engine: &Engine, live: &LiveRun, refused: PoolError) -> Ending {
    match refused {
        PoolError::Busy { .. } | PoolError::Cancelled { .. } if live.cancel.is_cancelled() => {
            cancelled_while_queued()
        }
        busy @ PoolError::Busy { .. } => {
            engine.metrics.deny("queue_timeout");
            rejected(&busy.to_string(), engine.admission.retry_after())
        }
        other => super::internal_ending(&other.to_string()),
    }
}

/// Moves a run still going at its hand-over time to a thread of its own, which streams the
/// rest of it and records its end; the calling thread returns at once. The run stays live
/// (readable, streamed, cancellable) throughout: only the thread waiting for it changes.
fn hand_over(
    engine: &Arc<Engine>,
    live: &Arc<LiveRun>,
    in_flight: Box<InFlight>,
    end: JobEnd,
    ran: Ran,
) {
    tracing::debug!(run = %live.id, "still running when its caller's wait ended: handed over to a thread of its own");
    engine.metrics.runs_handed_over.inc();
    let (owner_engine, owner_live) = (Arc::clone(engine), Arc::clone(live));
    let rest = move || {
        let ending = in_flight.finish(&owner_engine, &owner_live);
        end.ran(&owner_engine, &owner_live, ending, ran);
    };
    // Kept here too, so that it still runs when no thread can be started for it.
    let rest = Arc::new(Mutex::new(Some(rest)));
    let on_thread = Arc::clone(&rest);
    let spawned = std::thread::Builder::new()
        .name(format!("run {}", live.id))
        .spawn(move || take(&on_thread).map(|rest| rest()));
    if let Err(e) = spawned {
        // No thread to hand it to: the caller's thread sees it to its end (its answer is late,
        // the run and its record are whole).
        tracing::warn!(run = %live.id, "cannot hand the run over to a thread of its own: {e}");
        if let Some(rest) = take(&rest) {
            rest();
        }
    }
}

fn take<T>(slot: &Mutex<Option<T>>) -> Option<T> {
    slot.lock().unwrap_or_else(PoisonError::into_inner).take()
}

fn cancelled_while_queued() -> Ending {
    Ending {
        status: "cancelled".into(),
        ..Ending::default()
    }
}

fn rejected(message: &str, retry_after: u64) -> Ending {
    Ending {
        status: "rejected".into(),
        error: Some(json!({
            "kind": "busy",
            "message": message,
            "fix": format!("submit it again in about {retry_after}s, or ask for a longer queue timeout from an operator (pool.queue_timeout)"),
        })),
        ..Ending::default()
    }
}

/// What running the work came to.
// Made once per run and taken apart at once: boxing the ending would allocate for every run
// to save one move of 232 bytes.
#[allow(clippy::large_enum_variant)]
enum Executed {
    Ended(Ending),
    /// Still running at the hand-over time.
    Running(Box<InFlight>),
}

/// Runs the work with the run's cancel token: the library stops it whenever the token fires,
/// also during the sandbox's set-up (status `cancelled`). A command streamed through the
/// library comes back still running when `hand_over_at` passes first.
fn execute(
    engine: &Engine,
    live: &LiveRun,
    resolved: &Resolved,
    work: Work,
    hand_over_at: Option<Instant>,
) -> Executed {
    match work {
        Work::Command(work) => run_command(engine, live, resolved, work, hand_over_at),
        Work::Worker(work) => Executed::Ended(run_worker(engine, live, resolved, work)),
        Work::Call(work) => Executed::Ended(run_call(engine, live, *work)),
    }
}

fn run_command(
    engine: &Engine,
    live: &LiveRun,
    resolved: &Resolved,
    work: CommandWork,
    hand_over_at: Option<Instant>,
) -> Executed {
    let mut policy = resolved.policy.clone();
    let workdir = work
        .workspace
        .as_ref()
        .map(|w| w.0.dir.clone())
        .or(work.shared_workdir.clone());
    if let Some(dir) = workdir {
        policy.filesystem.workdir = Some(dir);
        // The daemon's own workspaces are never a host user's checkout: no git runs on the
        // host in them, so their repositories need no read-only binds, and a session's
        // repository must stay usable from one run to the next (clone, then commit).
        policy.filesystem.protect_git = airlock::policy::GitProtection::Off;
    }
    let warm = engine.warm.for_run(&work);
    if let Some(zygote) = warm.and_then(|w| w.zygote_for(&policy, resolved, &work)) {
        // A zygote run is not the library's launch: its record must be in before it starts.
        // Only then: a cold run's launch waits for it while the library plans the sandbox.
        if live.wait_for_record().is_err() {
            return Executed::Ended(unrecorded());
        }
        if let Some(streamed) = zygote.run(live, &work) {
            let ending = ending_of(engine, Ok(streamed), None, Some(StartPath::Zygote));
            return Executed::Ended(ending);
        }
    }
    let pool = match (&work.shared_workdir, &live.session_id) {
        (Some(_), Some(session)) => engine.warm.session_pool(session, &policy, resolved),
        _ => warm.and_then(|w| w.pool_for(&policy, &resolved.options)),
    };
    let spawned = spawn_streamed(engine, live, &policy, resolved, pool.as_deref(), &work);
    let mut in_flight = match spawned {
        Ok((handle, events)) => InFlight {
            handle,
            events,
            output: Output::default(),
            workspace: work.workspace,
            pool,
        },
        // Stopped at the launch because the run's record is not in: nothing to count.
        Err(_) if live.wait_for_record().is_err() => return Executed::Ended(unrecorded()),
        Err(e) => return Executed::Ended(ending_of(engine, Err(e), None, Some(StartPath::Cold))),
    };
    match in_flight.relay_until(live, hand_over_at) {
        Relayed::Closed => Executed::Ended(in_flight.finish(engine, live)),
        Relayed::Open => Executed::Running(Box::new(in_flight)),
    }
}

/// The ending of a run whose admission record the store did not take: never recorded (see
/// [`JobEnd::record`]).
fn unrecorded() -> Ending {
    Ending {
        status: "sandbox_error".into(),
        ..Ending::default()
    }
}
