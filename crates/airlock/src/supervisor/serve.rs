//! Serving a run's pipes: one poll loop feeds stdin and drains stdout, stderr and the init's
//! events. `Command::run` runs it in the calling thread; [`super::RunHandle`] runs it in one
//! thread of its own, so that its caller stays free to stream and cancel. One loop, not a
//! thread per pipe: starting and joining three threads cost about half a millisecond per run
//! (a trivial program with three pipe readers took 1.6-1.9 ms against 0.95-1.4 ms reading the
//! same pipes from one loop).

use std::os::fd::{AsFd, OwnedFd};
use std::sync::mpsc::Sender;

use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::sys::signal::Signal;

use super::builder::RunEvent;
pub(super) use super::input::StdinSource;
use super::input::{Feeding, Want};
use super::output::{Collector, Drained, ReadBuffer, StartGate};
use super::signals::{self, BlockedSignals};
use crate::spec::InitEvent;

/// The supervisor's ends of a run's pipes.
pub(super) struct Pipes {
    /// What feeds the program's input, if anything.
    pub stdin: Option<StdinSource>,
    pub stdout: Option<OwnedFd>,
    pub stderr: Option<OwnedFd>,
    pub events: OwnedFd,
    /// Stop reading events at `Finished` (a warm run's init sends it before its teardown and
    /// keeps the pipe until it exits).
    pub end_at_finished: bool,
}

/// Where each output stream goes and how much of it is kept.
pub(super) struct Outputs<'a> {
    pub stdout: Collector<'a>,
    pub stderr: Collector<'a>,
}

/// Everything the pipes carried, once every writer is gone.
#[derive(Default)]
pub(super) struct Served {
    pub stdout: Drained,
    pub stderr: Drained,
    pub events: Vec<InitEvent>,
    /// The first cancel signal the supervisor received during the run.
    pub cancel_signal: Option<i32>,
}

/// What the serve loop reacts to besides the pipes.
pub(super) struct Reactions<'a, O: FnMut(), C: FnMut()> {
    /// Runs when an output cap is first passed.
    pub on_overflow: O,
    /// The signals the run reacts to (see [`BlockedSignals`]): the cancel signals, and
    /// SIGWINCH for a run with a terminal of its own.
    pub signals: Option<&'a BlockedSignals>,
    /// Runs when the first cancel signal arrives.
    pub on_cancel: C,
    /// A spawned run's event stream, which `Started` leads.
    pub announce: Option<Announce<'a>>,
}

/// A spawned run's event stream: the init's start report becomes [`RunEvent::Started`], and
/// the output pipes are read only once the init's first event (or the end of its events)
/// opened `start`, so that output the program wrote at once (the init is slower to report)
/// comes after it. The gate also holds the egress gate's decisions, sent from its own thread.
pub(super) struct Announce<'a> {
    pub events: &'a Sender<RunEvent>,
    pub start: &'a StartGate,
}

impl Announce<'_> {
    fn heard(&self, events: &[InitEvent]) {
        for event in events {
            if let InitEvent::Started { layers, .. } = event {
                let _ = self.events.send(RunEvent::Started {
                    layers: layers.clone(),
                });
            }
            self.start.open();
        }
    }
}

/// Serves the pipes until stdout, stderr and the event pipe reach EOF (the init and every
/// process of the run have closed them).
pub(super) fn serve<O: FnMut(), C: FnMut()>(
    pipes: Pipes,
    mut outputs: Outputs,
    mut react: Reactions<O, C>,
) -> Served {
    let mut feed = pipes.stdin.and_then(Feeding::start);
    let mut readers: Vec<(std::fs::File, Target)> = [
        (pipes.stdout, Target::Stdout),
        (pipes.stderr, Target::Stderr),
        (Some(pipes.events), Target::Events),
    ]
    .into_iter()
    .filter_map(|(fd, target)| fd.map(|fd| (std::fs::File::from(fd), target)))
    .collect();
    let mut events = EventLog::default();
    let end_at_finished = pipes.end_at_finished;
    let mut buffer = ReadBuffer::default();
    let mut cancel_signal = None;
    // Output waits for the run's start only when there is a stream for it to follow.
    let mut output_open = react.announce.is_none();
    while !readers.is_empty() {
        let ready = wait_ready(
            &readers,
            output_open,
            feed.as_ref().and_then(Feeding::wants),
            react.signals,
        );
        if let Some(source_ready) = ready.feed {
            if feed
                .as_mut()
                .is_some_and(|f| !f.ready(source_ready, buffer.full()))
            {
                feed = None;
            }
        }
        for signal in ready
            .signal
            .then(|| react.signals.map(BlockedSignals::received))
            .flatten()
            .unwrap_or_default()
        {
            if signal == Signal::SIGWINCH as i32 {
                if let Some(terminal) = feed.as_ref().and_then(Feeding::terminal) {
                    super::terminal::copy_size(terminal);
                }
            } else if signals::cancels(signal) && cancel_signal.is_none() {
                cancel_signal = Some(signal);
                (react.on_cancel)();
            }
        }
        let mut closed = Vec::new();
        for (index, (file, target)) in readers.iter_mut().enumerate() {
            if !ready.readers[index] {
                continue;
            }
            let Some(chunk) = buffer.read_from(file) else {
                if matches!(target, Target::Events) {
                    output_open = true;
                    if let Some(announce) = &react.announce {
                        announce.start.open();
                    }
                }
                closed.push(index);
                continue;
            };
            let overflow = match target {
                Target::Stdout => outputs.stdout.take(chunk),
                Target::Stderr => outputs.stderr.take(chunk),
                Target::Events => {
                    let heard = events.feed(chunk);
                    output_open |= !heard.is_empty();
                    if let Some(announce) = &react.announce {
                        announce.heard(heard);
                    }
                    if end_at_finished && events.has_finished() {
                        closed.push(index);
                    }
                    false
                }
            };
            if overflow {
                (react.on_overflow)();
            }
        }
        // After the pass: removing during it would shift the readiness flags onto other pipes.
        for index in closed.into_iter().rev() {
            readers.remove(index);
        }
    }
    Served {
        stdout: outputs.stdout.finish(),
        stderr: outputs.stderr.finish(),
        events: events.finish(),
        cancel_signal,
    }
}

#[derive(Clone, Copy)]
enum Target {
    Stdout,
    Stderr,
    Events,
}

struct Ready {
    /// The feed's descriptor is ready: `Some(true)` for the caller's stdin, `Some(false)`
    /// for the program's side.
    feed: Option<bool>,
    signal: bool,
    readers: Vec<bool>,
}

/// Blocks until a pipe can be read (or has hung up), the feed can go on or a signal arrived.
/// The output pipes are left out (not even their hang-up wakes the loop) until `output_open`.
fn wait_ready(
    readers: &[(std::fs::File, Target)],
    output_open: bool,
    feed: Option<Want>,
    signals: Option<&BlockedSignals>,
) -> Ready {
    let polled: Vec<usize> = (0..readers.len())
        .filter(|&i| output_open || matches!(readers[i].1, Target::Events))
        .collect();
    let mut fds: Vec<PollFd> = polled
        .iter()
        .map(|&i| PollFd::new(readers[i].0.as_fd(), PollFlags::POLLIN))
        .collect();
    let feed_source = feed.as_ref().map(|want| want.is_source);
    if let Some(want) = feed {
        fds.push(PollFd::new(want.fd, want.flags));
    }
    if let Some(signals) = signals {
        fds.push(PollFd::new(signals.as_fd(), PollFlags::POLLIN));
    }
    if poll(&mut fds, PollTimeout::NONE).is_err() {
        // EINTR: nothing is ready yet.
        return Ready {
            feed: None,
            signal: false,
            readers: vec![false; readers.len()],
        };
    }
    let flagged: Vec<bool> = fds
        .iter()
        .map(|fd| fd.revents().is_some_and(|r| !r.is_empty()))
        .collect();
    let feed_ready = feed_source.filter(|_| flagged[polled.len()]);
    let mut ready_readers = vec![false; readers.len()];
    for (slot, &index) in polled.iter().enumerate() {
        ready_readers[index] = flagged[slot];
    }
    Ready {
        feed: feed_ready,
        signal: signals.is_some() && flagged.last() == Some(&true),
        readers: ready_readers,
    }
}

/// The init's events: one JSON object per line. A line that does not parse is skipped.
#[derive(Default)]
pub(super) struct EventLog {
    partial: Vec<u8>,
    seen: Vec<InitEvent>,
}

impl EventLog {
    /// Takes a chunk of the pipe; returns the events its complete lines carried.
    pub fn feed(&mut self, chunk: &[u8]) -> &[InitEvent] {
        let before = self.seen.len();
        self.partial.extend_from_slice(chunk);
        while let Some(end) = self.partial.iter().position(|b| *b == b'\n') {
            let line: Vec<u8> = self.partial.drain(..=end).collect();
            self.parse(&line[..end]);
        }
        &self.seen[before..]
    }

    /// Whether the run's outcome has arrived.
    pub fn has_finished(&self) -> bool {
        self.seen
            .iter()
            .any(|event| matches!(event, InitEvent::Finished(_)))
    }

    /// The events so far; the text after the last newline counts as a line.
    pub fn finish(mut self) -> Vec<InitEvent> {
        let rest = std::mem::take(&mut self.partial);
        self.parse(&rest);
        self.seen
    }

    fn parse(&mut self, line: &[u8]) {
        // An empty line (the usual rest at EOF) would only build an error, and serde_json's
        // error position search probes the CPU's features with `cpuid` on first use: ~0.1 ms
        // on a VM, where every `cpuid` traps to the hypervisor.
        if line.trim_ascii().is_empty() {
            return;
        }
        if let Ok(event) = serde_json::from_slice::<InitEvent>(line) {
            self.seen.push(event);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use nix::fcntl::OFlag;
    use std::io::Write;

    #[test]
    fn events_are_split_on_newlines_across_chunks() {
        let mut log = EventLog::default();
        let line = br#"{"event":"setup_failed","error":"x"}"#;
        log.feed(&line[..5]);
        log.feed(&line[5..]);
        log.feed(b"\nnot json\n");
        log.feed(line);
        let events = log.finish();
        assert_eq!(events.len(), 2, "{events:?}");
    }

    /// A pipe that closes must not shift the readiness of the ones after it: the loop would
    /// then block reading the idle event pipe while the program fills stderr, for good.
    #[test]
    fn a_closed_pipe_does_not_make_an_idle_one_look_ready() {
        use super::super::output::{OutputSink, StreamKind};
        let pipe = || nix::unistd::pipe2(OFlag::O_CLOEXEC).unwrap();
        let (stdout_read, stdout_write) = pipe();
        let (stderr_read, stderr_write) = pipe();
        let (events_read, events_write) = pipe();
        drop(stdout_write);
        let mut stderr = std::fs::File::from(stderr_write);
        stderr.write_all(b"x").unwrap();
        let writer = std::thread::spawn(move || {
            let _ = stderr.write_all(&vec![b'e'; 1 << 20]);
            drop(stderr);
            drop(events_write);
        });
        let (done_tx, done_rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let sink = OutputSink::Discard;
            let outputs = Outputs {
                stdout: Collector::new(StreamKind::Stdout, &sink, 1024),
                stderr: Collector::new(StreamKind::Stderr, &sink, 1024),
            };
            let pipes = Pipes {
                stdin: None,
                stdout: Some(stdout_read),
                stderr: Some(stderr_read),
                events: events_read,
                end_at_finished: false,
            };
            let react = Reactions {
                on_overflow: || {},
                signals: None,
                on_cancel: || {},
                announce: None,
            };
            let _ = done_tx.send(serve(pipes, outputs, react).stderr.total);
        });
        let total = done_rx.recv_timeout(std::time::Duration::from_secs(10));
        assert_eq!(total, Ok((1 << 20) + 1), "the loop blocked on an idle pipe");
        writer.join().unwrap();
    }
}
