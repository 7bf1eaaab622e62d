//! One run on a zygote, the host's side: the run's cgroup and pipes, the descriptors handed
//! to the template, the request, the output, the child's report, then the result and the
//! cleanup.

use std::io::Write;
use std::os::fd::OwnedFd;
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Instant;

use super::host::{Zygote, ZygoteRun};
use super::pipes;
use super::ready::ReadyChild;
use crate::confine::cgroup::RunCgroup;
use crate::error::Error;
use crate::init::zygote::{decide_status, ChildLine};
use crate::init::ExitReport;
use crate::init::SetupMessage;
use crate::result::{RunResult, RunStatus};
use crate::supervisor::output::{Collector, Drained, OutputSink, StartGate, StreamKind};
use crate::supervisor::RunEvent;

/// What the child reported on its report socket.
#[derive(Default)]
struct Report {
    layers: Vec<crate::Layer>,
    warnings: Vec<String>,
    error: Option<crate::SetupError>,
    exit: Option<ExitReport>,
    timed_out: bool,
    /// Stopped for passing an output cap under `on_output_limit = kill`.
    output_limit: bool,
    /// Stopped by the run's cancel token.
    cancelled: bool,
}

/// `on_output_limit = kill` on a zygote run, the cold run's rule: the first stream to pass
/// its cap ends the run (PID 1 ends when its report socket closes, which ends every process
/// of the namespace; the cgroup's kill takes the rest).
#[derive(Clone)]
struct OutputStop {
    enabled: bool,
    hit: std::sync::Arc<std::sync::atomic::AtomicBool>,
    report: std::sync::Arc<UnixStream>,
    cgroup: Option<RunCgroup>,
}

impl OutputStop {
    fn new(enabled: bool, report: &UnixStream, cgroup: Option<&RunCgroup>) -> Result<Self, Error> {
        let report = report
            .try_clone()
            .map_err(|e| Error::io("cannot share the report socket", e))?;
        Ok(OutputStop {
            enabled,
            hit: Default::default(),
            report: std::sync::Arc::new(report),
            cgroup: cgroup.cloned(),
        })
    }

    fn overflowed(&self) {
        if !self.enabled || self.hit.swap(true, std::sync::atomic::Ordering::SeqCst) {
            return;
        }
        let _ = self.report.shutdown(std::net::Shutdown::Both);
        if let Some(cgroup) = &self.cgroup {
            let _ = cgroup.kill_all();
        }
    }

    fn hit(&self) -> bool {
        self.hit.load(std::sync::atomic::Ordering::SeqCst)
    }
}

pub(super) fn run(zygote: &Zygote, run: &ZygoteRun) -> Result<RunResult, Error> {
    let started = Instant::now();
    let mut child = zygote.take_child()?;
    let cgroup = child.cgroup.take();
    let warning = child.warning.take();
    // The keeper waits on it for PID 1's exit before it removes the cgroup.
    let report = child.report.try_clone().ok();
    let outcome = run_on(zygote, run, child, cgroup.as_ref(), started).map(|mut result| {
        // As for a cold run: without a cgroup the limits fall back to rlimits, and a required
        // `cgroup` layer refuses the run unless degradation was accepted.
        result.warnings.extend(warning);
        result
    });
    zygote.finished(cgroup, report);
    outcome
}

/// Hands the request to a child waiting for it, then feeds, collects and reads its report.
fn run_on(
    zygote: &Zygote,
    run: &ZygoteRun,
    child: ReadyChild,
    cgroup: Option<&RunCgroup>,
    started: Instant,
) -> Result<RunResult, Error> {
    let ReadyChild {
        report,
        request,
        stdin,
        stdout,
        stderr,
        ..
    } = child;
    // A child that failed its setup has no program reading: its report says why.
    let _ = send_request(request, &zygote.request(run));
    let stdin = feed(stdin, &run.stdin);
    let (stdout_cap, stderr_cap) = zygote.output_caps();
    let stop = OutputStop::new(zygote.kill_on_output_limit(), &report, cgroup)?;
    let cancelled = Arc::new(AtomicBool::new(false));
    let _registration = run
        .cancel
        .as_ref()
        .map(|token| on_cancel(token, &report, cgroup, &cancelled))
        .transpose()?;
    let stream = Stream::of(run);
    let sinks = [stream.sink(), stream.sink()];
    let on_overflow = || stop.overflowed();
    let outputs = [
        (stdout, StreamKind::Stdout, stdout_cap, &sinks[0]),
        (stderr, StreamKind::Stderr, stderr_cap, &sinks[1]),
    ]
    .map(|(pipe, kind, cap, sink)| pipes::Output {
        pipe: std::fs::File::from(pipe),
        collector: Collector::new(kind, sink, cap),
        on_overflow: &on_overflow,
    });
    let deadline = started + zygote.plan.spec.limits.wall_time;
    let mut reader = ReportLines {
        report: Report::default(),
        cgroup,
        stream: &stream,
    };
    let [stdout, stderr] = pipes::serve(&report, outputs, deadline, &mut reader);
    let mut report = reader.report;
    if let Some(stdin) = stdin {
        let _ = stdin.join();
    }
    report.output_limit = stop.hit();
    report.cancelled = cancelled.load(Ordering::SeqCst);
    Ok(assemble(zygote, report, cgroup, started, stdout, stderr))
}

/// A cancelled run ends as one at its wall limit does: PID 1 ends when its report socket
/// closes (and with it the namespace), the cgroup's kill takes the rest.
fn on_cancel(
    token: &crate::CancelToken,
    report: &UnixStream,
    cgroup: Option<&RunCgroup>,
    cancelled: &Arc<AtomicBool>,
) -> Result<crate::CancelRegistration, Error> {
    let report = report
        .try_clone()
        .map_err(|e| Error::io("cannot share the report socket", e))?;
    let (cgroup, cancelled) = (cgroup.cloned(), Arc::clone(cancelled));
    Ok(token.on_cancel(move || {
        cancelled.store(true, Ordering::SeqCst);
        let _ = report.shutdown(std::net::Shutdown::Both);
        if let Some(cgroup) = &cgroup {
            let _ = cgroup.kill_all();
        }
    }))
}

/// Writes the request (JSON) on the program's pipe and closes it: the program reads it to
/// its end.
fn send_request(pipe: OwnedFd, request: &super::wire::RunRequest) -> Result<(), Error> {
    let body = serde_json::to_vec(request)
        .map_err(|e| Error::io("cannot encode the request", std::io::Error::other(e)))?;
    std::fs::File::from(pipe)
        .write_all(&body)
        .map_err(|e| Error::io("cannot send the run's request", e))
}

/// Writes the run's stdin in a thread of its own (none for an empty one: the pipe just
/// closes).
fn feed(pipe: OwnedFd, bytes: &[u8]) -> Option<JoinHandle<()>> {
    if bytes.is_empty() {
        return None;
    }
    let bytes = bytes.to_vec();
    Some(std::thread::spawn(move || {
        let _ = std::fs::File::from(pipe).write_all(&bytes);
    }))
}

/// Where a run's output goes: kept for the result only, or streamed as well (held until
/// `Started` went out, so that it always leads, as on a cold run).
enum Stream {
    Collect,
    Events(std::sync::mpsc::Sender<RunEvent>, Arc<StartGate>),
}

impl Stream {
    fn of(run: &ZygoteRun) -> Stream {
        match &run.events {
            Some(events) => Stream::Events(events.clone(), Arc::default()),
            None => Stream::Collect,
        }
    }

    /// Sends `Started` with the layers the child reported, and lets the output through.
    fn started(&self, layers: &[crate::Layer]) {
        if let Stream::Events(events, gate) = self {
            let _ = events.send(RunEvent::Started {
                layers: layers.to_vec(),
            });
            gate.open();
        }
    }

    /// Lets held output through (a child that never reported its layers).
    fn open(&self) {
        if let Stream::Events(_, gate) = self {
            gate.open();
        }
    }

    /// Where one stream's bytes go: kept for the result, and streamed too when asked.
    fn sink(&self) -> OutputSink {
        match self {
            Stream::Events(events, gate) => {
                OutputSink::KeepAndStream(events.clone(), Arc::clone(gate))
            }
            Stream::Collect => OutputSink::Capture,
        }
    }
}

/// The report's lines as they arrive: `Started` streamed with the layers, and at the
/// wall-clock deadline every process of the run killed, with a cgroup or without one.
struct ReportLines<'a> {
    report: Report,
    cgroup: Option<&'a RunCgroup>,
    stream: &'a Stream,
}

impl pipes::ReportReader for ReportLines<'_> {
    fn line(&mut self, line: &str) -> bool {
        let had_layers = !self.report.layers.is_empty();
        let exited = apply_line(&mut self.report, line);
        if !had_layers && !self.report.layers.is_empty() {
            self.stream.started(&self.report.layers);
        }
        exited
    }

    fn timed_out(&mut self, socket: &UnixStream) {
        self.report.timed_out = true;
        // PID 1 ends (and with it the namespace) when its report socket closes; the
        // cgroup's kill also takes what a run without a new PID namespace would leave.
        let _ = socket.shutdown(std::net::Shutdown::Both);
        if let Some(cgroup) = self.cgroup {
            let _ = cgroup.kill_all();
        }
    }

    /// Output follows the layers (the program is forked after PID 1 sent them); from a
    /// child whose report ended without them, it goes out without them.
    fn output_may_flow(&mut self, report_done: bool) -> bool {
        let Stream::Events(..) = self.stream else {
            return true;
        };
        if report_done {
            self.stream.open();
        }
        report_done || !self.report.layers.is_empty()
    }
}

/// Records one line; true at the exit report.
fn apply_line(report: &mut Report, line: &str) -> bool {
    match serde_json::from_str::<ChildLine>(line.trim_end()) {
        Ok(ChildLine::Setup(SetupMessage::Layers(layers))) => report.layers = layers,
        Ok(ChildLine::Setup(SetupMessage::Warning(warning))) => report.warnings.push(warning),
        Ok(ChildLine::Setup(SetupMessage::Error(error))) => report.error = Some(error),
        Ok(ChildLine::Setup(SetupMessage::Ready)) | Err(_) => {}
        Ok(ChildLine::Exit { exit }) => {
            report.exit = Some(exit);
            return true;
        }
    }
    false
}

fn assemble(
    zygote: &Zygote,
    report: Report,
    cgroup: Option<&RunCgroup>,
    started: Instant,
    stdout: Drained,
    stderr: Drained,
) -> RunResult {
    let wall_ms = started.elapsed().as_millis() as u64;
    let mut result = RunResult::blank(zygote.plan.backend.clone(), wall_ms);
    result.isolation = report.layers;
    result.warnings = zygote.plan.warnings.clone();
    result.warnings.extend(report.warnings);
    result.warnings.extend(zygote.plan.planted_git_warnings());
    result.details = zygote.plan.details.clone();
    result
        .details
        .push("forked from an interpreter zygote".into());
    result.workdir = Some(zygote.plan.spec.workdir.clone());
    result.set_stdout(&stdout.kept);
    result.set_stderr(&stderr.kept);
    (result.stdout_truncated, result.stdout_bytes) = (stdout.truncated, stdout.total);
    (result.stderr_truncated, result.stderr_bytes) = (stderr.truncated, stderr.total);
    if let Some(error) = report.error {
        result.error = Some(error.message.clone());
        result.error_kind = Some(error.kind.into());
        return result;
    }
    let usage = cgroup.map(|c| c.usage()).unwrap_or_default();
    let stopped = report.timed_out || report.output_limit || report.cancelled;
    let Some(exit) = report.exit.or(stopped.then(ExitReport::default)) else {
        result.error = Some("the zygote's child ended without a report".into());
        result.error_kind = Some(crate::SetupErrorKind::InitFailed.into());
        return result;
    };
    result.status = decide_status(
        report.timed_out,
        report.output_limit,
        exit,
        &usage,
        zygote.plan.spec.limits.cpu_time,
    );
    if report.cancelled {
        result.status = RunStatus::Cancelled;
    }
    result.exit_code = exit.exit_code;
    result.signal = exit.signal;
    let children = exit.children_usage.unwrap_or_default();
    result.cpu_user_ms = children.user_ms;
    result.cpu_sys_ms = children.sys_ms;
    result.peak_memory_bytes = usage.peak_memory_bytes.or(Some(children.max_rss_bytes));
    if usage.pids_limit_hits > 0 {
        result.warnings.push(format!(
            "the process limit ({}) was reached {} times",
            zygote.plan.spec.limits.processes, usage.pids_limit_hits
        ));
    }
    if result.status == RunStatus::SandboxError {
        result.error = Some("the run ended without a status".into());
    }
    result
}
