//! A worker job on the run's thread: the library's worker run in a job directory of its own,
//! its progress relayed. Apart from commands: its record is the job's outputs, not a process's.

use airlock::worker::run::{self, WorkerJob, WorkerRunError, WorkerUpdate};
use airlock::worker::WorkerEvent;
use serde_json::json;

use super::ending::{ending_of, setup_error};
use super::stream::Streamed;
use super::WorkerWork;
use crate::engine::events::EventBody;
use crate::engine::{Engine, LiveRun, OwnedWorkspace};
use crate::resolve::Resolved;
use crate::store::Ending;
use crate::workspace::Workspace;

/// A worker job through the library's `run_worker`, its job directory in a workspace of its
/// own (capped like the policy's disk), its progress and log events relayed into the log.
pub(super) fn run_worker(
    engine: &Engine,
    live: &LiveRun,
    resolved: &Resolved,
    work: WorkerWork,
) -> Ending {
    let dir = engine.paths.work.join(format!("job-{}", live.id));
    let workspace = Workspace::create(&dir, work.job).map(OwnedWorkspace);
    let lib = workspace.and_then(|workspace| {
        let lib = crate::engine::worker_lib::install(&workspace.0.dir, &work.program_files)?;
        Ok((workspace, lib))
    });
    let ending = match lib {
        Ok((workspace, lib)) => {
            let mut job = WorkerJob::new(work.program, engine.paths.outputs.join(&live.id));
            job.inputs = work.inputs;
            job.options = work.options;
            job.env = work.env;
            crate::engine::worker_lib::python_path(&lib, &mut job.env);
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
