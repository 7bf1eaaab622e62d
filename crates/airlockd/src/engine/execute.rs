//! A run's own thread: wait for the slots, run through the library, turn what happened into
//! the run's terminal record.

use std::path::PathBuf;
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use airlock::call::{CallOptions, ToolPolicy, ToolSpec};
use airlock::pool::{Permit, PoolError, Ticket};
use airlock::warm::WarmPool;
use airlock::worker::run::{self, WorkerJob, WorkerRunError, WorkerUpdate};
use airlock::worker::{IngestLimits, InputFile, WorkerEvent};
use airlock::{RunEvent, RunHandle, RunResult, Sandbox};
use serde_json::json;

use super::events::EventBody;
use super::warm::{CodeWork, StartPath};
use super::{Engine, Job, LiveRun, OwnedWorkspace, Step, Work};
use crate::resolve::Resolved;
use crate::store::{now_ms, AuditEntry, Document, Ending};
use crate::workspace::{Workspace, WorkspaceSpec};

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

/// What streaming a run gave back.
pub(super) struct Streamed {
    pub result: RunResult,
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
}

/// Starts the program with streamed output (on one of `pool`'s prepared sandboxes when given;
/// cold when none is ready, its init forked by the daemon's spawner when it has one) and gives
/// back its handle and its events.
fn spawn_streamed(
    engine: &Engine,
    live: &LiveRun,
    policy: &airlock::Policy,
    resolved: &Resolved,
    pool: Option<&WarmPool>,
    work: &CommandWork,
) -> Result<(RunHandle, Option<Receiver<RunEvent>>), airlock::Error> {
    let (program, args) = work
        .argv
        .split_first()
        .ok_or_else(|| airlock::Error::Command("the command is empty".into()))?;
    let command = match pool {
        Some(pool) => pool.command(program.clone()),
        None => Sandbox::with_options(policy.clone(), resolved.options.clone())?
            .command(program.clone()),
    };
    let mut command = command
        .args(args.iter().cloned())
        .stream_output()
        .cancel_on(&live.cancel);
    for (key, value) in &work.env {
        command = command.env(key.clone(), value.clone());
    }
    if let Some(bytes) = &work.stdin {
        command = command.stdin(bytes.clone());
    }
    if let Some(spawner) = engine.spawner.get() {
        command = command.init_spawner(spawner);
    }
    if let Some(pending) = live.pending_insert() {
        let pending = Arc::clone(pending);
        command =
            command.before_launch(move || pending.wait_at_launch().map_err(std::io::Error::other));
    }
    let mut handle = command.spawn()?;
    let events = handle.events();
    Ok((handle, events))
}

/// A streamed run in flight: its handle, its events still to relay and what it needs until
/// its end (its own workspace; the warm pool its sandbox came from).
struct InFlight {
    handle: RunHandle,
    events: Option<Receiver<RunEvent>>,
    output: Output,
    workspace: Option<OwnedWorkspace>,
    pool: Option<Arc<WarmPool>>,
}

/// Whether a run's event stream closed (the run ended) or is still open.
enum Relayed {
    Closed,
    Open,
}

impl InFlight {
    /// Relays events until the stream closes, or until `until` passes (never when `None`).
    fn relay_until(&mut self, live: &LiveRun, until: Option<Instant>) -> Relayed {
        let Some(events) = &self.events else {
            return Relayed::Closed;
        };
        loop {
            let next = match until {
                None => events.recv().map_err(|_| RecvTimeoutError::Disconnected),
                Some(until) => events.recv_timeout(until.saturating_duration_since(Instant::now())),
            };
            match next {
                Ok(event) => self.output.relay(live, event),
                Err(RecvTimeoutError::Disconnected) => return Relayed::Closed,
                Err(RecvTimeoutError::Timeout) => return Relayed::Open,
            }
        }
    }

    /// Relays the rest of the events, waits for the result and turns it into the ending.
    fn finish(mut self, engine: &Engine, live: &LiveRun) -> Ending {
        self.relay_until(live, None);
        let outcome = self.handle.wait().map(|result| Streamed {
            result,
            stdout: self.output.stdout,
            stderr: self.output.stderr,
        });
        drop(self.workspace);
        drop(self.pool);
        let start = outcome
            .as_ref()
            .map_or(StartPath::Cold, |s| StartPath::of_run(&s.result));
        ending_of(engine, outcome, None, Some(start))
    }
}

/// The output relayed so far.
#[derive(Default)]
struct Output {
    stdout: Vec<u8>,
    stderr: Vec<u8>,
}

impl Output {
    /// Pushes `event` into the run's log, keeping its output.
    fn relay(&mut self, live: &LiveRun, event: RunEvent) {
        match event {
            RunEvent::Started { layers } => live.log.push(EventBody::started(&layers)),
            RunEvent::Stdout(chunk) => {
                live.log.push(EventBody::output(false, &chunk));
                self.stdout.extend_from_slice(&chunk);
            }
            RunEvent::Stderr(chunk) => {
                live.log.push(EventBody::output(true, &chunk));
                self.stderr.extend_from_slice(&chunk);
            }
            RunEvent::Network(event) => live.log.push(EventBody::network(&event)),
            _ => {}
        }
    }
}

/// Relays a run's events into its log until the library closes the stream (`started` always
/// comes first), and gives back the output relayed.
pub(super) fn relay(
    live: &LiveRun,
    events: impl IntoIterator<Item = RunEvent>,
) -> (Vec<u8>, Vec<u8>) {
    let mut output = Output::default();
    for event in events {
        output.relay(live, event);
    }
    (output.stdout, output.stderr)
}

/// The terminal record of a streamed run, or of a sandbox that could not be set up; a
/// command's result records how its sandbox started (`start`).
fn ending_of(
    engine: &Engine,
    outcome: Result<Streamed, airlock::Error>,
    outputs: Option<serde_json::Value>,
    start: Option<StartPath>,
) -> Ending {
    match outcome {
        Ok(streamed) => {
            let mut result = streamed.result;
            if engine.keep_output {
                result.stdout = Some(String::from_utf8_lossy(&streamed.stdout).into_owned());
                result.stderr = Some(String::from_utf8_lossy(&streamed.stderr).into_owned());
            }
            let error = init_setup_error(&result);
            if let Some(error) = &error {
                count_setup_failure(engine, error["kind"].as_str().unwrap_or("init_failed"));
            }
            let network = result.network.as_ref();
            count_network_denials(engine, network);
            Ending {
                status: status_name(&result),
                backend: Some(result.backend.clone()),
                network: network.and_then(|report| serde_json::to_value(report).ok()),
                wall_ms: Some(result.wall_ms as i64),
                result: result_document(&result, start),
                error,
                outputs,
                ..Ending::default()
            }
        }
        Err(e) => setup_error(engine, &e, start),
    }
}

/// The library's result as the record keeps it, with the start path when it has one.
fn result_document(result: &RunResult, start: Option<StartPath>) -> Option<Document> {
    match start {
        Some(start) => start.record(result),
        None => Document::of(result).ok(),
    }
}

fn status_name(result: &RunResult) -> String {
    serde_json::to_value(result.status)
        .ok()
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_else(|| "sandbox_error".into())
}

/// A sandbox the library refused or failed to set up: the record's `result` is the library's
/// own for a run that never started (`RunResult::not_started`, its typed `error_kind`), as the
/// CLI's `--json` prints it.
fn setup_error(engine: &Engine, error: &airlock::Error, start: Option<StartPath>) -> Ending {
    let kind = error.kind().name();
    count_setup_failure(engine, kind);
    let result = RunResult::not_started(error.kind(), error.to_string());
    Ending {
        status: "sandbox_error".into(),
        result: result_document(&result, start),
        error: Some(json!({
            "kind": kind,
            "message": error.to_string(),
            "fix": "read the message; GET /v1/capabilities shows what this host supports",
        })),
        ..Ending::default()
    }
}

/// The record's `error` for a sandbox the init could not set up, from the result's typed
/// setup error (`program_not_found`, `mount_failed`, ...).
fn init_setup_error(result: &RunResult) -> Option<serde_json::Value> {
    if result.status != airlock::RunStatus::SandboxError {
        return None;
    }
    let kind = result.error_kind.map_or(json!("init_failed"), |k| json!(k));
    Some(json!({
        "kind": kind,
        "message": result.error.clone().unwrap_or_default(),
        "fix": "read the message; GET /v1/capabilities shows what this host supports",
    }))
}

/// Each connection or name the gate refused counts as a denial (`network:<reason>`).
fn count_network_denials(engine: &Engine, report: Option<&airlock_egress::NetworkReport>) {
    let denied = report
        .map(|r| r.decisions.as_slice())
        .unwrap_or_default()
        .iter()
        .filter(|d| d.decision == airlock_egress::report::Decision::Deny);
    for decision in denied {
        let reason = serde_json::to_value(decision.reason).unwrap_or_default();
        let reason = reason.as_str().unwrap_or("other");
        engine.metrics.deny(&format!("network:{reason}"));
    }
}

fn count_setup_failure(engine: &Engine, reason: &str) {
    engine
        .metrics
        .setup_failures
        .get_or_create(&crate::metrics::ReasonLabels {
            reason: reason.into(),
        })
        .inc();
}

/// A worker job through the library's `run_worker`, its job directory in a workspace of its
/// own (capped like the policy's disk), its progress and log events relayed into the log.
fn run_worker(engine: &Engine, live: &LiveRun, resolved: &Resolved, work: WorkerWork) -> Ending {
    let dir = engine.paths.work.join(format!("job-{}", live.id));
    let workspace = Workspace::create(&dir, work.job).map(OwnedWorkspace);
    let lib = workspace.and_then(|workspace| {
        let lib = super::worker_lib::install(&workspace.0.dir, &work.program_files)?;
        Ok((workspace, lib))
    });
    let ending = match lib {
        Ok((workspace, lib)) => {
            let mut job = WorkerJob::new(work.program, engine.paths.outputs.join(&live.id));
            job.inputs = work.inputs;
            job.options = work.options;
            job.env = work.env;
            super::worker_lib::python_path(&lib, &mut job.env);
            job.ingest_limits = work.ingest;
            job.jobs_root = Some(workspace.0.dir.clone());
            job.cancel = Some(live.cancel.clone());
            let mut resolved = resolved.clone();
            resolved.policy.filesystem.read_only.push(lib);
            worker_ending(engine, live, &resolved, &job)
        }
        Err(e) => worker_failure(
            "worker_stage",
            format!("cannot create the job workspace: {e}"),
        ),
    };
    let _ = std::fs::remove_dir_all(&work.uploads);
    ending
}

fn worker_ending(engine: &Engine, live: &LiveRun, resolved: &Resolved, job: &WorkerJob) -> Ending {
    let mut stderr = Vec::new();
    let outcome = run::run_worker(
        &resolved.policy,
        &resolved.options,
        job,
        |update| match update {
            WorkerUpdate::Started(layers) => live.log.push(EventBody::started(layers)),
            WorkerUpdate::Stderr(chunk) => {
                live.log.push(EventBody::output(true, chunk));
                stderr.extend_from_slice(chunk);
            }
            WorkerUpdate::Event(event) => {
                if let Some(body) = worker_event(event) {
                    live.log.push(body);
                }
            }
            WorkerUpdate::Network(event) => live.log.push(EventBody::network(event)),
            _ => {}
        },
    );
    match outcome {
        Ok(outcome) => {
            let outputs = json!({
                "success": outcome.success,
                "done_seen": outcome.done_seen,
                "events": outcome.events,
                "ingest": outcome.ingest,
                "warnings": outcome.warnings,
            });
            let streamed = Streamed {
                result: outcome.result,
                stdout: Vec::new(),
                stderr,
            };
            ending_of(engine, Ok(streamed), Some(outputs), None)
        }
        Err(WorkerRunError::Sandbox(e)) => setup_error(engine, &e, None),
        Err(e @ WorkerRunError::Ingest(_)) => worker_failure("worker_ingest", e.to_string()),
        Err(e) => worker_failure("worker_stage", e.to_string()),
    }
}

fn worker_failure(kind: &str, message: String) -> Ending {
    Ending {
        status: "sandbox_error".into(),
        error: Some(
            json!({"kind": kind, "message": message, "fix": "check the inputs' names and sizes, and the daemon's disk"}),
        ),
        ..Ending::default()
    }
}

fn worker_event(event: &WorkerEvent) -> Option<EventBody> {
    match event {
        WorkerEvent::Progress { fraction, message } => Some(EventBody::Progress {
            fraction: *fraction,
            message: message.clone(),
        }),
        WorkerEvent::Log { message } => Some(EventBody::Log {
            message: message.clone(),
        }),
        WorkerEvent::Error { line, reason } => Some(EventBody::Log {
            message: format!("not a worker event ({reason}): {line}"),
        }),
        _ => None,
    }
}

fn run_call(engine: &Engine, live: &LiveRun, mut work: CallWork) -> Ending {
    let started = Instant::now();
    work.options.cancel = Some(live.cancel.clone());
    let outcome = airlock::call::call_with_run(&work.tool, &work.args, work.policy, &work.options);
    let wall_ms = started.elapsed().as_millis() as i64;
    let (status, result) = match &outcome.value {
        Ok(value) => ("exited".to_string(), json!({"ok": true, "value": value})),
        Err(error) => (call_status(error), json!({"ok": false, "error": error})),
    };
    let run = outcome.run.as_ref();
    let network = run.and_then(|r| r.network.as_ref());
    count_network_denials(engine, network);
    Ending {
        status,
        backend: Some(match (run, work.policy) {
            (Some(run), _) => run.backend.clone(),
            (None, ToolPolicy::Subprocess) => "none".into(),
            (None, ToolPolicy::Sandboxed) => "auto".into(),
        }),
        result: Some(Document::from(result)),
        network: network.and_then(|report| serde_json::to_value(report).ok()),
        wall_ms: Some(wall_ms),
        ..Ending::default()
    }
}

/// The run status that matches a tool call's typed error.
fn call_status(error: &airlock::call::ToolError) -> String {
    let kind = error.kind();
    match kind.as_str() {
        "timeout" | "cpu_limit" | "memory_limit" | "output_limit" | "file_size_limit"
        | "cancelled" | "sandbox_error" => kind,
        _ => "exited".into(),
    }
}

/// What the audit reads of a run's result (a pass over its text): its warnings and its
/// isolation layers.
#[derive(serde::Deserialize)]
struct Audited {
    #[serde(default)]
    warnings: Vec<serde_json::Value>,
    #[serde(default)]
    isolation: serde_json::Value,
}

/// Records what the audit log must hold about a run's end: refusals by the library,
/// degradations accepted, and runs without isolation.
fn audit_ending(engine: &Engine, live: &LiveRun, key_name: &str, tenant: &str, ending: &Ending) {
    let entry = |kind: &'static str, detail: serde_json::Value| AuditEntry {
        kind,
        tenant: Some(tenant.to_string()),
        key_name: Some(key_name.to_string()),
        run_id: Some(live.id.clone()),
        detail,
    };
    let mut entries = Vec::new();
    if let Some(error) = &ending.error {
        let kind = error["kind"].as_str().unwrap_or_default();
        if [
            "degraded",
            "program_not_allowed",
            "backend_unavailable",
            "unisolated_refused",
        ]
        .contains(&kind)
        {
            engine.metrics.deny(kind);
            entries.push(entry("denied", error.clone()));
        }
    }
    if let Some(result) = ending.result.as_ref().and_then(Document::read::<Audited>) {
        let degraded: Vec<_> = result
            .warnings
            .iter()
            .filter(|w| w.as_str().is_some_and(|w| w.starts_with("degraded")))
            .collect();
        if !degraded.is_empty() {
            entries.push(entry(
                "degraded_accepted",
                json!({"warnings": degraded, "isolation": result.isolation}),
            ));
        }
        if ending.backend.as_deref() == Some("none") {
            entries.push(entry(
                "unisolated_run",
                json!({"backend": "none", "isolation": result.isolation}),
            ));
        }
    }
    for entry in entries {
        engine.block_on(engine.audit.record(entry));
    }
}
