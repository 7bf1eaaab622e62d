//! Ending a run: reaping the init (every process of the run is gone by then) and turning what
//! the pipes carried into the [`RunResult`].

use std::sync::Mutex;
use std::time::Instant;

use super::builder::Command;
use super::handle::send_stop;
use super::launch::{InitProcess, Started};
use super::output::{Collector, Drained, StreamKind};
use super::serve;
use crate::error::{Error, SetupErrorKind};
use crate::net::RunGate;
use crate::policy::OutputLimitAction;
use crate::result::{RunResult, RunStatus};
use crate::spec::{InitEvent, Outcome, StopReason};

/// What turns a served run into its result: the init to reap and the facts the result
/// carries besides what the pipes said.
#[derive(Debug)]
pub(super) struct Ending {
    pub init: InitProcess,
    /// The egress gate serving a gated run, finished once the init is reaped.
    pub gate: Option<RunGate>,
    pub backend: String,
    /// Warnings of the supervisor's own (an accepted degradation), before the init's.
    pub warnings: Vec<String>,
    pub details: Vec<String>,
    pub start: Instant,
    pub capture: (bool, bool),
    pub keep: bool,
    /// A warm run's standby source, which reaps the init once the outcome is in (the init
    /// tears the sandbox down after sending it).
    pub retire: Option<std::sync::Arc<dyn super::standby::StandbySource>>,
}

/// Serves a started run's pipes from the calling thread until they close, then ends it.
pub(super) fn serve_in_this_thread(
    command: &Command,
    started: Started,
    mut ending: Ending,
) -> Result<RunResult, Error> {
    let policy = &command.sandbox.policy;
    let sinks = (
        command.stdout.blocking_sink(),
        command.stderr.blocking_sink(),
    );
    let outputs = serve::Outputs {
        stdout: Collector::new(StreamKind::Stdout, &sinks.0, policy.limits.stdout.0),
        stderr: Collector::new(StreamKind::Stderr, &sinks.1, policy.limits.stderr.0),
    };
    let kill_on_overflow = policy.limits.on_output_limit == OutputLimitAction::Kill;
    let control = Mutex::new(started.control);
    let served = serve::serve(started.pipes, outputs, || {
        if kill_on_overflow {
            send_stop(&control, StopReason::OutputLimit);
        }
    });
    let result = ending.conclude(served);
    // Open until the init is gone: its end reading EOF means the supervisor died.
    drop(control);
    result
}

impl Ending {
    /// Reaps the init (every process of the run is gone by then) and builds the result.
    pub(super) fn conclude(&mut self, served: serve::Served) -> Result<RunResult, Error> {
        let finished = served
            .events
            .iter()
            .any(|event| matches!(event, InitEvent::Finished(_)));
        let init_status = match (&self.retire, finished) {
            (Some(source), true) => {
                source.retire(self.init.id());
                std::process::ExitStatus::default()
            }
            _ => self
                .init
                .wait()
                .map_err(|e| Error::io("cannot wait for the init", e))?,
        };
        let wall_ms = self.start.elapsed().as_millis() as u64;
        let mut result = assemble(&served.events, init_status, &self.backend, wall_ms);
        // Every process of the run is gone: whatever the gate still holds open is closed now.
        result.network = self.gate.take().map(RunGate::finish);
        result.warnings.splice(0..0, self.warnings.clone());
        result.details = self.details.clone();
        if !self.keep {
            result.workdir = None;
        }
        let (stdout, stderr) = (&served.stdout, &served.stderr);
        let text = |d: &Drained| String::from_utf8_lossy(&d.kept).into_owned();
        result.stdout = self.capture.0.then(|| text(stdout));
        result.stderr = self.capture.1.then(|| text(stderr));
        (result.stdout_truncated, result.stdout_bytes) = (stdout.truncated, stdout.total);
        (result.stderr_truncated, result.stderr_bytes) = (stderr.truncated, stderr.total);
        Ok(result)
    }
}

fn assemble(
    events: &[InitEvent],
    init_status: std::process::ExitStatus,
    backend: &str,
    wall_ms: u64,
) -> RunResult {
    let mut result = RunResult {
        status: RunStatus::SandboxError,
        exit_code: None,
        signal: None,
        wall_ms,
        cpu_user_ms: 0,
        cpu_sys_ms: 0,
        peak_memory_bytes: None,
        stdout: None,
        stderr: None,
        stdout_truncated: false,
        stderr_truncated: false,
        stdout_bytes: 0,
        stderr_bytes: 0,
        backend: backend.to_string(),
        isolation: Vec::new(),
        error: None,
        error_kind: None,
        warnings: Vec::new(),
        details: Vec::new(),
        workdir: None,
        network: None,
    };
    for event in events {
        match event {
            InitEvent::Started {
                layers,
                warnings,
                workdir,
            } => {
                result.isolation = layers.clone();
                result.warnings.extend(warnings.iter().cloned());
                result.workdir = Some(workdir.clone());
            }
            InitEvent::SetupFailed { error } => {
                if result.error.is_none() {
                    result.error = Some(error.message.clone());
                    result.error_kind = Some(error.kind);
                }
            }
            InitEvent::Finished(outcome) => apply_outcome(&mut result, outcome),
            InitEvent::Ready => {}
        }
    }
    if result.status == RunStatus::SandboxError && result.error.is_none() {
        result.error = Some(format!(
            "the airlock init ended without a report ({init_status})"
        ));
        result.error_kind = Some(SetupErrorKind::InitFailed);
    }
    result
}

fn apply_outcome(result: &mut RunResult, outcome: &Outcome) {
    if result.error.is_some() {
        return;
    }
    result.status = outcome.status;
    result.exit_code = outcome.exit_code;
    result.signal = outcome.signal;
    result.cpu_user_ms = outcome.cpu_user_ms;
    result.cpu_sys_ms = outcome.cpu_sys_ms;
    result.peak_memory_bytes = outcome.peak_memory_bytes;
    result.warnings.extend(outcome.warnings.iter().cloned());
}
