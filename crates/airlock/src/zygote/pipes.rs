//! A zygote run's report socket and output pipes, served from the caller's thread with one
//! `poll`: the child's report lines (its layers, warnings, setup error, exit) and both output
//! streams, until the exit report and the streams' end. A run starts no thread for its
//! output (it started two, one a stream: their creation, stacks and wake-ups cost ~0.1 ms of
//! CPU a run, on the run's path).

use std::io::Read;
use std::os::fd::AsFd;
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use nix::poll::{poll, PollFd, PollFlags, PollTimeout};

use crate::supervisor::output::{Collector, Drained, ReadBuffer};

/// What the report socket says, as it says it.
pub(super) trait ReportReader {
    /// Takes one line of the report; true at the exit report (the last line read).
    fn line(&mut self, line: &str) -> bool;
    /// The wall-clock deadline passed: the run is stopped (the socket shut, the cgroup
    /// killed); the report gets a last grace period to arrive.
    fn timed_out(&mut self, socket: &UnixStream);
    /// Whether output may be read now: not before what must lead it (the `Started` event)
    /// has gone out, unless the report is complete (`report_done`) without it.
    fn output_may_flow(&mut self, report_done: bool) -> bool;
}

/// A run's output stream and what it has drained so far.
pub(super) struct Output<'a> {
    pub pipe: std::fs::File,
    pub collector: Collector<'a>,
    /// Called when this stream first passes its cap.
    pub on_overflow: &'a dyn Fn(),
}

/// How long the report may take once the run has been stopped at its deadline.
const GRACE: Duration = Duration::from_secs(5);

/// Serves the socket and both streams until the report is complete (its exit line, its end,
/// or the grace after the deadline) and both streams have ended; returns what each drained.
pub(super) fn serve(
    socket: &UnixStream,
    mut outputs: [Output<'_>; 2],
    deadline: Instant,
    reader: &mut dyn ReportReader,
) -> [Drained; 2] {
    let mut report = ReportState::new(deadline);
    let mut buffers = [ReadBuffer::default(), ReadBuffer::default()];
    let mut open = [true, true];
    while !report.done || open.iter().any(|o| *o) {
        // Output waits for its `Started` (the program is forked after PID 1 sent the layers,
        // so they are in the socket first): only the socket is watched until then.
        let may_flow = reader.output_may_flow(report.done);
        let watched: Vec<usize> = (0..2).filter(|&i| open[i] && may_flow).collect();
        let mut fds = Vec::with_capacity(3);
        if !report.done {
            fds.push(PollFd::new(socket.as_fd(), PollFlags::POLLIN));
        }
        for &i in &watched {
            fds.push(PollFd::new(outputs[i].pipe.as_fd(), PollFlags::POLLIN));
        }
        match poll(&mut fds, report.timeout()) {
            Ok(_) => {}
            Err(nix::errno::Errno::EINTR) => continue,
            Err(_) => break,
        }
        let readable: Vec<bool> = fds
            .iter()
            .map(|fd| fd.revents().is_some_and(|r| !r.is_empty()))
            .collect();
        drop(fds);
        let mut readable = readable.into_iter();
        if !report.done {
            // Checked on every round, not only when poll times out: a program writing
            // without pause keeps its pipes readable and poll from ever timing out.
            report.check_deadline(socket, reader);
            if readable.next() == Some(true) {
                report.read(socket, reader);
            }
        }
        for (i, readable) in watched.into_iter().zip(readable) {
            if readable {
                open[i] = drain_once(&mut outputs[i], &mut buffers[i]);
            }
        }
    }
    outputs.map(|output| output.collector.finish())
}

/// One read from a stream that poll found readable; false at its end.
fn drain_once(output: &mut Output<'_>, buffer: &mut ReadBuffer) -> bool {
    match buffer.read_from(&mut output.pipe) {
        None => false,
        Some(chunk) => {
            if output.collector.take(chunk) {
                (output.on_overflow)();
            }
            true
        }
    }
}

/// The report socket's side: its partial line, its deadline, whether it is complete.
struct ReportState {
    pending: Vec<u8>,
    deadline: Instant,
    timed_out: bool,
    done: bool,
}

impl ReportState {
    fn new(deadline: Instant) -> ReportState {
        ReportState {
            pending: Vec::new(),
            deadline,
            timed_out: false,
            done: false,
        }
    }

    /// Until the deadline while the report is incomplete (at least a millisecond, rounded
    /// up); no timeout once it is (the streams end when the run's last process does).
    fn timeout(&self) -> PollTimeout {
        if self.done {
            return PollTimeout::NONE;
        }
        let left = self.deadline.saturating_duration_since(Instant::now());
        let millis = left.as_micros().div_ceil(1000).max(1);
        PollTimeout::try_from(millis.min(i32::MAX as u128) as i32).unwrap_or(PollTimeout::MAX)
    }

    fn check_deadline(&mut self, socket: &UnixStream, reader: &mut dyn ReportReader) {
        if Instant::now() < self.deadline {
            return;
        }
        if self.timed_out {
            self.done = true;
            return;
        }
        self.timed_out = true;
        self.deadline = Instant::now() + GRACE;
        reader.timed_out(socket);
    }

    /// One read: every whole line goes to the reader; the end of the socket (or an error)
    /// completes the report, as does its exit line.
    fn read(&mut self, mut socket: &UnixStream, reader: &mut dyn ReportReader) {
        let mut chunk = [0u8; 4096];
        let n = match socket.read(&mut chunk) {
            Ok(0) | Err(_) => {
                self.done = true;
                return;
            }
            Ok(n) => n,
        };
        self.pending.extend_from_slice(&chunk[..n]);
        while let Some(end) = self.pending.iter().position(|b| *b == b'\n') {
            let line: Vec<u8> = self.pending.drain(..=end).collect();
            if reader.line(&String::from_utf8_lossy(&line)) {
                self.done = true;
                return;
            }
        }
    }
}
