//! The init's watch loop: one poll over the control pipe, SIGCHLD and the setup pipe, with the
//! wall clock, the CPU budget and the grace period as deadlines.

use std::io::Read;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::time::{Duration, Instant};

use nix::fcntl::OFlag;
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::sys::signal::Signal;
use nix::sys::wait::WaitStatus;
use nix::unistd::Pid;

use super::child::SetupMessage;
use super::status::{decide_status, decode_tool_signal, Evidence};
use super::{fork_child, send_event, ExitReport, PreparedRun};
use super::{Setup, Step};
use crate::error::SetupError;
use crate::layer::Layer;
use crate::spec::{Confinement, InitEvent, InitSpec, Outcome, StopReason};

/// Why the init stopped the run before the program ended by itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum StopCause {
    Timeout,
    CpuLimit,
    Requested(StopReason),
    SupervisorGone,
}

mod ending;

pub(super) const CPU_CHECK_INTERVAL: Duration = Duration::from_millis(50);
pub(super) struct Watch<'a> {
    spec: &'a InitSpec,
    pub(super) run: &'a PreparedRun,
    /// The control pipe from the supervisor: stop requests, and EOF when it died.
    pub(super) control: &'a mut std::fs::File,
    child: Pid,
    pub(super) start: Instant,
    pub(super) main: Option<WaitStatus>,
    stop: Option<(StopCause, Instant)>,
    pub(super) setup_pipe: Option<std::fs::File>,
    pub(super) setup_buffer: Vec<u8>,
    setup_error: Option<SetupError>,
    /// The setup reported its own failure (rather than ending without a word).
    setup_failed_itself: bool,
    layers: Vec<Layer>,
    warnings: Vec<String>,
    pub(super) control_open: bool,
    pub(super) next_cpu_check: Instant,
    /// The cgroup's CPU time when the run started (a warm sandbox's preparation).
    pub(super) cpu_base: Duration,
    /// PID 1's exit report, read as it arrives (warm runs) or at the end.
    report: Option<std::fs::File>,
    report_bytes: Vec<u8>,
    report_closed: bool,
    /// A warm run's result went out as soon as PID 1 reported the program's end.
    finished_early: bool,
}

/// Watches the run to its end; `None` when a warm run's outcome was already sent.
pub(super) fn supervise(
    spec: &InitSpec,
    run: &mut PreparedRun,
    control: &mut std::fs::File,
) -> Setup<Option<Outcome>> {
    let pipe_failed = |e: nix::errno::Errno| SetupError::at(Step::Init, format!("pipe: {e}"));
    let (setup_read, setup_write) = nix::unistd::pipe2(OFlag::O_CLOEXEC).map_err(pipe_failed)?;
    let (report_read, report_write) =
        nix::unistd::pipe2(OFlag::O_CLOEXEC | OFlag::O_NONBLOCK).map_err(pipe_failed)?;
    let tool_status = super::wrapped::status_pipe(spec)?;
    let go = super::standby::inherited_go(spec)?;
    let shared_root = super::standby::inherited_shared_root(spec)?;
    let handoff = super::cgroup_handoff::channel(spec)?;
    let start = Instant::now();
    let child = fork_child(
        spec,
        run,
        &setup_write,
        &report_write,
        tool_status.as_ref().map(|(_, write)| write.as_raw_fd()),
        &super::standby::placements(go.as_ref(), &shared_root),
        handoff.as_ref().map(|(_, child_end)| child_end.as_raw_fd()),
    )?;
    drop((setup_write, report_write, go, shared_root, run.gate.take()));
    super::cgroup_handoff::make_and_hand_over(spec, run, handoff);
    let tool_status = tool_status.map(|(read, _write)| read);
    silence_stdio();
    let mut watch = Watch::new(spec, run, control, child, start, setup_read);
    watch.report = Some(std::fs::File::from(report_read));
    if spec.warm {
        watch.await_go();
    }
    watch.run_until_exit();
    watch.kill_everything();
    if let Some(error) = watch.setup_error.take() {
        // A stop (cancel, timeout) during set-up killed it: the stop's outcome, not a setup
        // failure. A failure the setup reported itself stays one.
        if watch.stop.is_none() || watch.setup_failed_itself {
            return Err(error);
        }
    }
    if watch.finished_early {
        return Ok(None);
    }
    let outcome = watch.outcome();
    super::wrapped::check_tool_ran_program(spec, tool_status, &outcome)?;
    Ok(Some(outcome))
}

/// The program's output pipes must close once its process tree is gone, so the init keeps
/// no copy of them.
fn silence_stdio() {
    if let Ok(null) = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/null")
    {
        for fd in 0..=2 {
            let _ = nix::unistd::dup2(null.as_raw_fd(), fd);
        }
    }
}

impl<'a> Watch<'a> {
    fn new(
        spec: &'a InitSpec,
        run: &'a PreparedRun,
        control: &'a mut std::fs::File,
        child: Pid,
        start: Instant,
        setup: OwnedFd,
    ) -> Watch<'a> {
        let mut warnings: Vec<String> = run.cgroup_warning.iter().cloned().collect();
        if matches!(spec.confinement, Confinement::Tier0) {
            warnings.push(crate::spec::TIER0_WARNING.into());
        }
        Watch {
            spec,
            run,
            control,
            child,
            start,
            main: None,
            stop: None,
            setup_pipe: Some(std::fs::File::from(setup)),
            setup_buffer: Vec::new(),
            setup_error: None,
            setup_failed_itself: false,
            layers: Vec::new(),
            warnings,
            control_open: true,
            next_cpu_check: start + CPU_CHECK_INTERVAL,
            cpu_base: Duration::ZERO,
            report: None,
            report_bytes: Vec::new(),
            report_closed: false,
            finished_early: false,
        }
    }

    fn run_until_exit(&mut self) {
        while self.main.is_none() || self.setup_pipe.is_some() {
            self.poll_once();
            self.check_clocks();
        }
    }

    fn poll_once(&mut self) {
        let mut fds = vec![PollFd::new(self.run.signals.as_fd(), PollFlags::POLLIN)];
        if self.control_open {
            fds.push(PollFd::new(self.control.as_fd(), PollFlags::POLLIN));
        }
        let setup_index = fds.len();
        if let Some(pipe) = &self.setup_pipe {
            fds.push(PollFd::new(pipe.as_fd(), PollFlags::POLLIN));
        }
        let report_index = fds.len();
        let report = self.report.as_ref().filter(|_| self.watches_report());
        if let Some(pipe) = report {
            fds.push(PollFd::new(pipe.as_fd(), PollFlags::POLLIN));
        }
        let timeout = PollTimeout::try_from(self.next_deadline_ms()).unwrap_or(PollTimeout::MAX);
        if poll(&mut fds, timeout).unwrap_or(0) <= 0 {
            return;
        }
        let ready = |fd: &PollFd| fd.revents().is_some_and(|r| !r.is_empty());
        let (signals_ready, control_ready) = (ready(&fds[0]), self.control_open && ready(&fds[1]));
        let setup_ready = self.setup_pipe.is_some() && ready(&fds[setup_index]);
        let report_ready = fds.len() > report_index && ready(&fds[report_index]);
        drop(fds);
        if signals_ready {
            self.drain_signals();
            self.reap_all();
        }
        if control_ready {
            self.read_control();
        }
        if setup_ready {
            self.read_setup();
        }
        if report_ready {
            self.read_report_early();
        }
    }

    /// A warm run sends its outcome when PID 1 reports the program's end, before the
    /// sandbox's teardown: the namespaces and the cgroup go after, off the caller's path.
    fn watches_report(&self) -> bool {
        self.spec.warm && !self.finished_early && !self.report_closed && self.setup_pipe.is_none()
    }

    fn read_report_early(&mut self) {
        let mut chunk = [0u8; 1024];
        match self.report.as_mut().map(|pipe| pipe.read(&mut chunk)) {
            Some(Ok(0)) | None => self.report_closed = true,
            Some(Ok(n)) => self.report_bytes.extend_from_slice(&chunk[..n]),
            Some(Err(_)) => {}
        }
        let complete = serde_json::from_slice::<ExitReport>(&self.report_bytes).is_ok();
        if complete && self.setup_error.is_none() && self.stop.is_none() {
            self.finished_early = true;
            send_event(&InitEvent::Finished(self.outcome()));
        }
    }

    fn next_deadline_ms(&self) -> u64 {
        let now = Instant::now();
        let mut deadline = self.start + self.spec.limits.wall_time;
        if let Some((_, kill_at)) = self.stop {
            deadline = deadline.min(kill_at);
        }
        if self.run.cgroup.is_some() {
            deadline = deadline.min(self.next_cpu_check);
        }
        if self.stop.is_some() && self.main.is_none() && Instant::now() >= deadline {
            // Already past the kill time: poll briefly while the tree dies.
            return 10;
        }
        deadline
            .saturating_duration_since(now)
            .as_millis()
            .min(60_000) as u64
            + 1
    }

    fn read_control(&mut self) {
        let mut buffer = [0u8; 256];
        match self.control.read(&mut buffer) {
            Ok(0) | Err(_) => {
                self.control_open = false;
                // A warm run's supervisor closes the pipe as soon as it has the outcome: no
                // death, and no stop round (a walk of every process in /proc, 15 % of a
                // prepared sandbox's CPU at load 8); the teardown below ends what is left.
                if !self.finished_early {
                    self.begin_stop(StopCause::SupervisorGone);
                }
            }
            Ok(n) => {
                for line in buffer[..n].split(|b| *b == b'\n').filter(|l| !l.is_empty()) {
                    if let Ok(reason) = serde_json::from_slice::<StopReason>(line) {
                        self.begin_stop(StopCause::Requested(reason));
                    }
                }
            }
        }
    }

    pub(super) fn read_setup(&mut self) {
        let Some(pipe) = self.setup_pipe.as_mut() else {
            return;
        };
        let mut chunk = [0u8; 4096];
        match pipe.read(&mut chunk) {
            Ok(0) | Err(_) => {
                self.setup_pipe = None;
                self.parse_setup_lines();
                if self.setup_error.is_none() {
                    self.announce_start();
                }
            }
            Ok(n) => self.setup_buffer.extend_from_slice(&chunk[..n]),
        }
    }

    fn parse_setup_lines(&mut self) {
        let buffer = std::mem::take(&mut self.setup_buffer);
        for line in buffer.split(|b| *b == b'\n').filter(|l| !l.is_empty()) {
            match serde_json::from_slice::<SetupMessage>(line) {
                Ok(SetupMessage::Layers(layers)) => self.layers.extend(layers),
                Ok(SetupMessage::Warning(warning)) => self.warnings.push(warning),
                Ok(SetupMessage::Error(error)) => {
                    self.setup_failed_itself = true;
                    self.setup_error = Some(error);
                }
                Ok(SetupMessage::Ready) => {}
                Err(_) => {
                    self.setup_error = Some(SetupError::at(
                        Step::Watch,
                        "the sandbox setup sent a malformed message",
                    ))
                }
            }
        }
        if self.layers.is_empty() && self.setup_error.is_none() {
            self.setup_error = Some(SetupError::at(
                Step::Watch,
                "the sandbox setup ended without starting the program",
            ));
        }
    }

    fn announce_start(&mut self) {
        self.layers.sort();
        self.layers.dedup();
        let workdir = self.spec.workdir.clone();
        send_event(&InitEvent::Started {
            layers: self.layers.clone(),
            warnings: self.warnings.clone(),
            workdir,
        });
    }

    fn check_clocks(&mut self) {
        let now = Instant::now();
        if self.main.is_none() && now >= self.start + self.spec.limits.wall_time {
            self.begin_stop(StopCause::Timeout);
        }
        if now >= self.next_cpu_check {
            self.next_cpu_check = now + CPU_CHECK_INTERVAL;
            if self.cpu_used() >= Some(self.spec.limits.cpu_time) {
                self.begin_stop(StopCause::CpuLimit);
            }
        }
        if let Some((_, kill_at)) = self.stop {
            if now >= kill_at && self.main.is_none() {
                self.signal_tree(Signal::SIGKILL);
            }
        }
    }

    fn cpu_used(&self) -> Option<Duration> {
        let ns = self.run.cgroup.as_ref()?.cpu_usage_ns()?;
        Some(Duration::from_nanos(ns).saturating_sub(self.cpu_base))
    }

    pub(super) fn stop_cause(&self) -> Option<StopCause> {
        self.stop.map(|(cause, _)| cause)
    }

    pub(super) fn begin_stop(&mut self, cause: StopCause) {
        if self.stop.is_some() || self.main.is_some() {
            return;
        }
        let grace = if cause == StopCause::SupervisorGone {
            Duration::ZERO
        } else {
            self.spec.limits.grace
        };
        self.stop = Some((cause, Instant::now() + grace));
        self.signal_tree(Signal::SIGTERM);
    }

    /// Reads every pending signal: SIGCHLD (the caller reaps), SIGTERM (someone asks the init
    /// itself to stop the run: it does, as if cancelled) and the terminal's SIGINT, SIGHUP
    /// and SIGQUIT, which the init ignores: they reach the whole foreground process group, and
    /// the supervisor, which got them too, decides (it cancels, or it dies and the control
    /// pipe's EOF stops the run).
    pub(super) fn drain_signals(&mut self) {
        while let Ok(Some(info)) = self.run.signals.read_signal() {
            if info.ssi_signo == Signal::SIGTERM as u32 {
                self.begin_stop(StopCause::Requested(StopReason::Cancelled));
            }
        }
    }

    /// Reaps every child that has ended; true when the init has no children at all.
    pub(super) fn reap_all(&mut self) -> bool {
        let child = self.child;
        let main = &mut self.main;
        super::reap_ended_children(|status| {
            if status.pid() == Some(child) {
                *main = Some(status);
            }
        })
    }

    fn outcome(&mut self) -> Outcome {
        let usage = self
            .run
            .cgroup
            .as_ref()
            .map(|c| c.usage())
            .unwrap_or_default();
        let exit = self.program_exit();
        // A warm sandbox's own processes did its preparation: count only what PID 1 reaped.
        let children = match (self.spec.warm, exit.children_usage) {
            (true, Some(usage)) => Some(usage),
            _ => super::ChildrenUsage::now(),
        };
        let cpu_user_ms = children.map(|u| u.user_ms).unwrap_or(0);
        let cpu_sys_ms = children.map(|u| u.sys_ms).unwrap_or(0);
        let max_rss = children.map(|u| u.max_rss_bytes);
        let cpu_used = usage
            .cpu_usage_ns
            .map(|ns| Duration::from_nanos(ns).saturating_sub(self.cpu_base))
            .unwrap_or(Duration::from_millis(cpu_user_ms + cpu_sys_ms));
        let evidence = Evidence {
            stop: self.stop.map(|(c, _)| c),
            exit,
            oom_kills: usage.oom_kills,
            cpu_used,
            cpu_limit: self.spec.limits.cpu_time,
        };
        Outcome {
            status: decide_status(&evidence),
            exit_code: exit.exit_code,
            signal: exit.signal,
            cpu_user_ms,
            cpu_sys_ms,
            peak_memory_bytes: usage.peak_memory_bytes.or(max_rss),
            warnings: Vec::new(),
        }
    }

    /// The native sandbox's PID 1 reports the program's own status; in Tier 0 the child is the
    /// program.
    fn program_exit(&mut self) -> ExitReport {
        if let Some(pipe) = self.report.take() {
            let _ = crate::linux::read_to_end_unsized(pipe, &mut self.report_bytes);
        }
        let bytes = &self.report_bytes;
        // Only the native PID 1 writes a report; parsing nothing would just build an error
        // (and probe the CPU with `cpuid`, see `EventLog::parse`).
        if !bytes.is_empty() {
            if let Ok(report) = serde_json::from_slice::<ExitReport>(bytes) {
                return report;
            }
        }
        let hit = super::file_size_hit_outside(self.spec, self.main.as_ref());
        let report = self
            .main
            .map(|status| ExitReport::from_status(status, hit))
            .unwrap_or_default();
        match self.spec.confinement {
            Confinement::Wrapped(_) => decode_tool_signal(report),
            _ => report,
        }
    }
}
