//! A run's own thread: wait for the slots, run through the library, turn what happened into
//! the run's terminal record.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use airlock::call::{CallOptions, ToolPolicy, ToolSpec};
use airlock::pool::{PoolError, Ticket};
use airlock::warm::WarmPool;
use airlock::worker::run::{self, WorkerJob, WorkerRunError, WorkerUpdate};
use airlock::worker::{IngestLimits, InputFile, WorkerEvent};
use airlock::{RunEvent, RunResult, Sandbox};
use serde_json::json;

use super::events::EventBody;
use super::warm::{CodeWork, StartPath};
use super::{Engine, Job, LiveRun, OwnedWorkspace, Step, Work};
use crate::resolve::Resolved;
use crate::store::{now_ms, AuditEntry, Ending};
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
/// `running` then.
pub(super) fn run_job(
    engine: &Arc<Engine>,
    live: &Arc<LiveRun>,
    job: Job,
    ticket: Ticket,
    admitted_running: bool,
) {
    live.mark(Step::Thread);
    let waited = Instant::now();
    let slots = ticket.wait(&live.cancel);
    let queue = waited.elapsed();
    engine
        .metrics
        .queue_wait_seconds
        .observe(queue.as_secs_f64());
    let tenant = job.tenant.name.clone();
    let (ending, wall) = match slots {
        Ok(slots) => {
            let (started_ms, queue_ms) = (now_ms(), queue.as_millis() as i64);
            if !admitted_running {
                live.mark_started(started_ms, queue_ms);
            }
            live.mark(Step::Slot);
            let started = Instant::now();
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
            let ending = execute(engine, live, &job.resolved, job.work);
            live.set_sandbox_time(started.elapsed());
            live.mark(Step::SandboxDone);
            drop(slots);
            (ending, Some(started.elapsed()))
        }
        Err(PoolError::Busy { .. }) | Err(PoolError::Cancelled { .. })
            if live.cancel.is_cancelled() =>
        {
            (cancelled_while_queued(), None)
        }
        Err(busy @ PoolError::Busy { .. }) => {
            engine.metrics.deny("queue_timeout");
            (
                rejected(&busy.to_string(), engine.admission.retry_after()),
                None,
            )
        }
        Err(other) => (super::internal_ending(&other.to_string()), None),
    };
    audit_ending(engine, live, &job.key_name, &tenant, &ending);
    let recording = Instant::now();
    engine.block_on(engine.finish(live, ending, &tenant, wall, Some(job.record)));
    tracing::debug!(
        run = %live.id,
        queue_us = queue.as_micros() as u64,
        run_us = wall.map_or(0, |w| w.as_micros() as u64),
        record_us = recording.elapsed().as_micros() as u64,
        "run ended"
    );
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

/// Runs the work with the run's cancel token: the library stops it whenever the token fires,
/// also during the sandbox's set-up (status `cancelled`).
fn execute(engine: &Engine, live: &LiveRun, resolved: &Resolved, work: Work) -> Ending {
    match work {
        Work::Command(work) => run_command(engine, live, resolved, work),
        Work::Worker(work) => run_worker(engine, live, resolved, work),
        Work::Call(work) => run_call(engine, live, *work),
    }
}

fn run_command(engine: &Engine, live: &LiveRun, resolved: &Resolved, work: CommandWork) -> Ending {
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
    if let Some(streamed) = warm.and_then(|w| w.run_on_zygote(live, &policy, resolved, &work)) {
        return recorded(ending_of(engine, Ok(streamed), None), StartPath::Zygote);
    }
    let pool = match (&work.shared_workdir, &live.session_id) {
        (Some(_), Some(session)) => engine.warm.session_pool(session, &policy, resolved),
        _ => warm.and_then(|w| w.pool_for(&policy, &resolved.options)),
    };
    let outcome = stream_run(
        live,
        &policy,
        resolved,
        pool.as_deref(),
        &work.argv,
        &work.env,
        work.stdin,
    );
    drop(work.workspace);
    let start = outcome
        .as_ref()
        .map_or(StartPath::Cold, |s| StartPath::of_run(&s.result));
    recorded(ending_of(engine, outcome, None), start)
}

fn recorded(mut ending: Ending, start: StartPath) -> Ending {
    start.record(&mut ending);
    ending
}

/// What streaming a run gave back.
pub(super) struct Streamed {
    pub result: RunResult,
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
}

/// Starts the program with streamed output, relays every event into the run's log, and
/// waits for the result.
/// On one of `pool`'s prepared sandboxes when given (cold when none is ready).
fn stream_run(
    live: &LiveRun,
    policy: &airlock::Policy,
    resolved: &Resolved,
    pool: Option<&WarmPool>,
    argv: &[String],
    env: &[(String, String)],
    stdin: Option<Vec<u8>>,
) -> Result<Streamed, airlock::Error> {
    let (program, args) = argv
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
    for (key, value) in env {
        command = command.env(key.clone(), value.clone());
    }
    if let Some(bytes) = stdin {
        command = command.stdin(bytes);
    }
    let mut handle = command.spawn()?;
    let (stdout, stderr) = match handle.events() {
        Some(events) => relay(live, events),
        None => Default::default(),
    };
    let result = handle.wait()?;
    Ok(Streamed {
        result,
        stdout,
        stderr,
    })
}

/// Relays a run's events into its log until the library closes the stream (`started` always
/// comes first), and gives back the output relayed.
pub(super) fn relay(
    live: &LiveRun,
    events: impl IntoIterator<Item = RunEvent>,
) -> (Vec<u8>, Vec<u8>) {
    let (mut stdout, mut stderr) = (Vec::new(), Vec::new());
    for event in events {
        match event {
            RunEvent::Started { layers } => live.log.push(EventBody::started(&layers)),
            RunEvent::Stdout(chunk) => {
                live.log.push(EventBody::output(false, &chunk));
                stdout.extend_from_slice(&chunk);
            }
            RunEvent::Stderr(chunk) => {
                live.log.push(EventBody::output(true, &chunk));
                stderr.extend_from_slice(&chunk);
            }
            RunEvent::Network(event) => live.log.push(EventBody::network(&event)),
            _ => {}
        }
    }
    (stdout, stderr)
}

/// The terminal record of a streamed run, or of a sandbox that could not be set up.
fn ending_of(
    engine: &Engine,
    outcome: Result<Streamed, airlock::Error>,
    outputs: Option<serde_json::Value>,
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
                result: serde_json::to_value(&result).ok(),
                error,
                outputs,
                ..Ending::default()
            }
        }
        Err(e) => setup_error(engine, &e),
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
fn setup_error(engine: &Engine, error: &airlock::Error) -> Ending {
    let kind = error.kind().name();
    count_setup_failure(engine, kind);
    let result = RunResult::not_started(error.kind(), error.to_string());
    Ending {
        status: "sandbox_error".into(),
        result: serde_json::to_value(&result).ok(),
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
            ending_of(engine, Ok(streamed), Some(outputs))
        }
        Err(WorkerRunError::Sandbox(e)) => setup_error(engine, &e),
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
        result: Some(result),
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
    if let Some(result) = &ending.result {
        let warnings = result["warnings"].as_array().cloned().unwrap_or_default();
        let degraded: Vec<_> = warnings
            .iter()
            .filter(|w| w.as_str().is_some_and(|w| w.starts_with("degraded")))
            .collect();
        if !degraded.is_empty() {
            entries.push(entry(
                "degraded_accepted",
                json!({"warnings": degraded, "isolation": result["isolation"]}),
            ));
        }
        if ending.backend.as_deref() == Some("none") {
            entries.push(entry(
                "unisolated_run",
                json!({"backend": "none", "isolation": result["isolation"]}),
            ));
        }
    }
    for entry in entries {
        engine.block_on(engine.audit.record(entry));
    }
}
