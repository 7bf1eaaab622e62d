//! Ending a run: reaping the init (every process of the run is gone by then) and turning what
//! the pipes carried into the [`RunResult`].

use std::sync::{Arc, Mutex};
use std::time::Instant;

use super::builder::Command;
use super::handle::send_stop;
use super::hints::HintFacts;
use super::launch::{InitProcess, Started};
use super::output::{Collector, OutputSink, StreamKind};
use super::serve;
use super::signals::BlockedSignals;
use crate::cancel::CancelRegistration;
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
    /// What a failed run's hints are judged from.
    pub hints: HintFacts,
    /// Git metadata the program may have planted in the caller's paths, checked once every
    /// process of the run is gone.
    pub git_watch: Option<super::gitguard::PlantWatch>,
}

/// Serves a started run's pipes from the calling thread until they close, then ends it.
pub(super) fn serve_in_this_thread(
    command: &Command,
    started: Started,
    mut ending: Ending,
    signals: Option<&BlockedSignals>,
) -> Result<RunResult, Error> {
    let sinks = (
        command.stdout.blocking_sink(),
        command.stderr.blocking_sink(),
    );
    let control = Arc::new(Mutex::new(started.control));
    let cancel = stop_when_cancelled(command, &control);
    let limits = OutputLimits::of(command);
    let served = serve_pipes(started.pipes, &sinks, limits, &control, signals, None);
    let result = ending.conclude(served);
    // Open until the init is gone: its end reading EOF means the supervisor died.
    drop((cancel, control));
    result
}

/// What bounds a run's output, from its command.
#[derive(Debug, Clone, Copy)]
pub(super) struct OutputLimits {
    stdout: u64,
    stderr: u64,
    kill_on_overflow: bool,
}

impl OutputLimits {
    pub(super) fn of(command: &Command) -> OutputLimits {
        let limits = &command.sandbox.policy.limits;
        OutputLimits {
            // A terminal's output is for the person at it: no cap.
            stdout: match command.tty {
                true => u64::MAX,
                false => limits.stdout.0,
            },
            stderr: limits.stderr.0,
            kill_on_overflow: limits.on_output_limit == OutputLimitAction::Kill,
        }
    }
}

/// Serves a run's pipes until they close (`run`'s in the calling thread, `spawn`'s in a
/// thread of its own): output to `sinks` under `limits`, the init asked on `control` to stop
/// the run past a cap (when the policy says so) or on a cancel signal among `signals`, and a
/// spawned run's stream `announce`d.
pub(super) fn serve_pipes(
    pipes: serve::Pipes,
    sinks: &(OutputSink, OutputSink),
    limits: OutputLimits,
    control: &Mutex<std::fs::File>,
    signals: Option<&BlockedSignals>,
    announce: Option<serve::Announce>,
) -> serve::Served {
    let outputs = serve::Outputs {
        stdout: Collector::new(StreamKind::Stdout, &sinks.0, limits.stdout),
        stderr: Collector::new(StreamKind::Stderr, &sinks.1, limits.stderr),
    };
    let react = serve::Reactions {
        on_overflow: || {
            if limits.kill_on_overflow {
                send_stop(control, StopReason::OutputLimit);
            }
        },
        signals,
        on_cancel: || send_stop(control, StopReason::Cancelled),
        announce,
    };
    serve::serve(pipes, outputs, react)
}

/// Sends the init a stop when the command's cancel token fires (at once if it already did).
/// The registration holds a handle on the control pipe: drop it with the pipe's other end.
pub(super) fn stop_when_cancelled(
    command: &Command,
    control: &Arc<Mutex<std::fs::File>>,
) -> Option<CancelRegistration> {
    let token = command.cancel.as_ref()?;
    let control = Arc::clone(control);
    Some(token.on_cancel(move || send_stop(&control, StopReason::Cancelled)))
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
        if let Some(watch) = &self.git_watch {
            result.warnings.extend(watch.quarantine());
        }
        result.details = self.details.clone();
        if !self.keep {
            result.workdir = None;
        }
        if result.status == RunStatus::Cancelled {
            result.cancel_signal = served.cancel_signal;
        }
        let (stdout, stderr) = (&served.stdout, &served.stderr);
        if self.capture.0 {
            result.set_stdout(&stdout.kept);
        }
        if self.capture.1 {
            result.set_stderr(&stderr.kept);
        }
        (result.stdout_truncated, result.stdout_bytes) = (stdout.truncated, stdout.total);
        (result.stderr_truncated, result.stderr_bytes) = (stderr.truncated, stderr.total);
        self.hints.apply(&mut result);
        Ok(result)
    }
}

fn assemble(
    events: &[InitEvent],
    init_status: std::process::ExitStatus,
    backend: &str,
    wall_ms: u64,
) -> RunResult {
    let mut result = RunResult::blank(backend.to_string(), wall_ms);
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
                    result.error_kind = Some(error.kind.into());
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
        result.error_kind = Some(SetupErrorKind::InitFailed.into());
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
