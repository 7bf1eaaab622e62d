//! A spawned run: its pipes served from one thread of its own, so the caller of
//! `Command::spawn` stays free to stream and cancel, and a [`RunHandle`] to wait on.

use std::io::Write;
use std::sync::mpsc::{Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use airlock_egress::EventSink;

use super::builder::{Command, RunEvent, Sink};
use super::finish::{self, Ending, OutputLimits};
use super::input::StdinSource;
use super::launch::Started;
use super::output::{OutputSink, StartGate};
use super::serve::{self, Served};
use crate::cancel::CancelRegistration;
use crate::error::Error;
use crate::result::RunResult;
use crate::spec::StopReason;

/// A running program.
#[derive(Debug)]
pub struct RunHandle {
    ending: Ending,
    control: Arc<Mutex<std::fs::File>>,
    /// The thread serving the run's pipes, until they close.
    server: JoinHandle<Served>,
    events: Option<Receiver<RunEvent>>,
    /// The command's cancel token stops the run until it ended.
    cancel: Option<CancelRegistration>,
}

/// A cloneable way to cancel a run from another thread.
#[derive(Debug, Clone)]
pub struct Canceller {
    control: Arc<Mutex<std::fs::File>>,
}

impl Canceller {
    /// Asks the init to stop the run (SIGTERM, then SIGKILL after the grace period).
    pub fn cancel(&self) {
        send_stop(&self.control, StopReason::Cancelled);
    }
}

/// Asks the init, on its control pipe, to stop the run for `reason`.
pub(super) fn send_stop(control: &Mutex<std::fs::File>, reason: StopReason) {
    if let (Ok(mut pipe), Ok(mut line)) = (control.lock(), serde_json::to_vec(&reason)) {
        line.push(b'\n');
        let _ = pipe.write_all(&line);
    }
}

/// The egress gate's sender of [`RunEvent::Network`]s, taken away when the init is gone (the
/// gate itself lives until `wait`): the event channel then closes with the run, as a caller
/// reading it to the end before waiting expects. Later events are in the result's report.
pub(super) type NetworkSender = Arc<Mutex<Option<(Sender<RunEvent>, Arc<StartGate>)>>>;

/// The egress gate's decisions as [`RunEvent::Network`]s on the handle's event channel, after
/// the run's start (`Started` leads the events, as for output).
pub(super) fn network_events(
    events: Sender<RunEvent>,
    start: Arc<StartGate>,
) -> (EventSink, NetworkSender) {
    let (sink, sender) = network_slot();
    *sender.lock().unwrap_or_else(|e| e.into_inner()) = Some((events, start));
    (sink, sender)
}

/// A sink for the gate's decisions whose channel (and the run's start gate) is set later: a
/// warm sandbox's gate starts while the sandbox is prepared, before any run has a handle.
/// Decisions made while the slot is empty are only in the result's report.
pub(super) fn network_slot() -> (EventSink, NetworkSender) {
    let sender: NetworkSender = Arc::new(Mutex::new(None));
    let slot = Arc::clone(&sender);
    let sink: EventSink = Box::new(move |event| {
        // Not waiting with the slot locked: the event reader takes it at the run's end.
        let target = slot.lock().unwrap_or_else(|e| e.into_inner()).clone();
        if let Some((events, start)) = target {
            start.wait();
            let _ = events.send(RunEvent::Network(event.clone()));
        }
    });
    (sink, sender)
}

/// Serves a started run's pipes from one thread of its own, with the loop `run` serves them
/// with in the calling thread; `channel` carries the run's events.
pub(super) fn serve_in_background(
    command: &Command,
    started: Started,
    ending: Ending,
    channel: (Sender<RunEvent>, Receiver<RunEvent>),
    start: Arc<StartGate>,
    network: Option<NetworkSender>,
) -> RunHandle {
    let (events, receiver) = channel;
    let control = Arc::new(Mutex::new(started.control));
    let limits = OutputLimits::of(command);
    let sink = |sink: Sink| match sink {
        Sink::Stream => OutputSink::Stream(events.clone(), Arc::clone(&start)),
        other => other.blocking_sink(),
    };
    let sinks = (sink(command.stdout), sink(command.stderr));
    let mut pipes = started.pipes;
    // A spawned run feeds its input bytes; relaying the caller's terminal is `run`'s.
    pipes.stdin = pipes.stdin.map(StdinSource::without_relay);
    let serving = Arc::clone(&control);
    let server = std::thread::spawn(move || {
        let announce = serve::Announce {
            events: &events,
            start: &start,
        };
        let served = finish::serve_pipes(pipes, &sinks, limits, &serving, None, Some(announce));
        if let Some(network) = network {
            network.lock().unwrap_or_else(|e| e.into_inner()).take();
        }
        served
    });
    RunHandle {
        ending,
        cancel: finish::stop_when_cancelled(command, &control),
        control,
        server,
        events: Some(receiver),
    }
}

impl RunHandle {
    /// The stream of [`RunEvent`]s (once; later calls return `None`).
    pub fn events(&mut self) -> Option<Receiver<RunEvent>> {
        self.events.take()
    }

    /// Asks the init to stop the run; `wait` then returns status `cancelled`.
    pub fn cancel(&self) {
        send_stop(&self.control, StopReason::Cancelled);
    }

    /// A cancel handle that can move to another thread.
    pub fn canceller(&self) -> Canceller {
        Canceller {
            control: Arc::clone(&self.control),
        }
    }

    /// The pid of the init process watching this run.
    pub fn init_pid(&self) -> u32 {
        self.ending.init.id()
    }

    /// Waits for the run to end and everything it started to be gone.
    pub fn wait(mut self) -> Result<RunResult, Error> {
        let served = self.server.join().unwrap_or_default();
        let result = self.ending.conclude(served);
        drop(self.cancel.take());
        result
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write;
    use std::os::fd::OwnedFd;
    use std::sync::mpsc::{channel, Receiver};
    use std::time::Duration;

    use super::*;
    use crate::layer::Layer;
    use crate::spec::InitEvent;
    use crate::supervisor::output::{Collector, StreamKind};

    /// Serves a spawned run's stdout and events (no stdin, no stderr) in a thread of its own, as
    /// `spawn`'s one loop does: the stream it sends, and the stdout bytes it took once served.
    fn serve_streamed(stdout: OwnedFd, events: OwnedFd) -> (Receiver<RunEvent>, Receiver<u64>) {
        let (tx, rx) = channel();
        let (done_tx, done_rx) = channel();
        let start = Arc::new(StartGate::default());
        let sink = OutputSink::Stream(tx.clone(), Arc::clone(&start));
        std::thread::spawn(move || {
            let pipes = serve::Pipes {
                stdin: None,
                stdout: Some(stdout),
                stderr: None,
                events,
                end_at_finished: false,
            };
            let outputs = serve::Outputs {
                stdout: Collector::new(StreamKind::Stdout, &sink, 1 << 20),
                stderr: Collector::new(StreamKind::Stderr, &sink, 1 << 20),
            };
            let react = serve::Reactions {
                on_overflow: || {},
                signals: None,
                on_cancel: || {},
                announce: Some(serve::Announce {
                    events: &tx,
                    start: &start,
                }),
            };
            let _ = done_tx.send(serve::serve(pipes, outputs, react).stdout.total);
        });
        (rx, done_rx)
    }

    /// The program's output arrives before the init's start report (it writes at once, the
    /// init is slow to report): the stream a spawned run's one loop sends still begins with
    /// `Started`, and the output follows.
    #[test]
    fn started_leads_the_stream_even_when_output_comes_first() {
        let (out_read, out_write) = super::super::launch::pipe().unwrap();
        let (events_read, events_write) = super::super::launch::pipe().unwrap();
        let (rx, done) = serve_streamed(out_read, events_read);
        let mut out = std::fs::File::from(out_write);
        out.write_all(b"early output").unwrap();
        drop(out);
        std::thread::sleep(Duration::from_millis(100));
        let started = InitEvent::Started {
            layers: vec![Layer::Seccomp],
            warnings: Vec::new(),
            workdir: "/work".into(),
        };
        let mut line = serde_json::to_vec(&started).unwrap();
        line.push(b'\n');
        std::fs::File::from(events_write).write_all(&line).unwrap();
        assert_eq!(done.recv_timeout(Duration::from_secs(10)), Ok(12));
        let received: Vec<RunEvent> = rx.try_iter().collect();
        assert_eq!(
            received,
            vec![
                RunEvent::Started {
                    layers: vec![Layer::Seccomp]
                },
                RunEvent::Stdout(b"early output".to_vec()),
            ]
        );
    }

    /// An init that dies before its first event (no start report): the output held for the
    /// start is read once the events end (no `Started` leads it then), not held for good.
    #[test]
    fn held_output_is_read_when_the_events_end_without_a_start() {
        let (out_read, out_write) = super::super::launch::pipe().unwrap();
        let (events_read, events_write) = super::super::launch::pipe().unwrap();
        let mut out = std::fs::File::from(out_write);
        out.write_all(b"orphaned output").unwrap();
        drop((out, events_write));
        let (rx, done) = serve_streamed(out_read, events_read);
        assert_eq!(done.recv_timeout(Duration::from_secs(10)), Ok(15));
        let received: Vec<RunEvent> = rx.try_iter().collect();
        assert_eq!(
            received,
            vec![RunEvent::Stdout(b"orphaned output".to_vec())]
        );
    }
}
