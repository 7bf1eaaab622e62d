//! A spawned run: a thread per pipe, so the caller of `Command::spawn` stays free to stream
//! and cancel, and a [`RunHandle`] to wait on.

use std::io::Write;
use std::os::fd::OwnedFd;
use std::sync::mpsc::{Receiver, Sender};

use airlock_egress::EventSink;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use super::builder::{Command, RunEvent, Sink};
use super::finish::Ending;
use super::launch::Started;
use super::output::{self, Drained, OutputSink, StartGate, StreamKind};
use super::serve;
use crate::cancel::CancelRegistration;
use crate::error::Error;
use crate::policy::OutputLimitAction;
use crate::result::RunResult;
use crate::spec::{InitEvent, StopReason};

/// A running program.
#[derive(Debug)]
pub struct RunHandle {
    ending: Ending,
    control: Arc<Mutex<std::fs::File>>,
    events_reader: JoinHandle<Vec<InitEvent>>,
    stdout_reader: Option<JoinHandle<Drained>>,
    stderr_reader: Option<JoinHandle<Drained>>,
    stdin_writer: Option<JoinHandle<()>>,
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

/// Starts a thread for each pipe of a started run; `channel` carries the run's events.
pub(super) fn serve_from_threads(
    command: &Command,
    started: Started,
    ending: Ending,
    channel: (Sender<RunEvent>, Receiver<RunEvent>),
    start: Arc<StartGate>,
    network: Option<NetworkSender>,
) -> RunHandle {
    let policy = &command.sandbox.policy;
    let control = Arc::new(Mutex::new(started.control));
    let pipes = started.pipes;
    // A spawned run feeds its input bytes; relaying the caller's terminal is `run`'s.
    let stdin_writer = pipes.stdin.map(|source| {
        let (fd, bytes) = source.into_fd_and_bytes();
        std::thread::spawn(move || {
            let _ = std::fs::File::from(fd).write_all(&bytes);
        })
    });
    let (event_tx, event_rx) = channel;
    let kill_on_overflow = policy.limits.on_output_limit == OutputLimitAction::Kill;
    let reader = |pipe: Option<OwnedFd>, sink: Sink, kind: StreamKind, cap: u64| {
        pipe.map(|fd| {
            let sink = match sink {
                Sink::Stream => OutputSink::Stream(event_tx.clone(), Arc::clone(&start)),
                other => other.blocking_sink(),
            };
            let control = Arc::clone(&control);
            std::thread::spawn(move || {
                output::drain(std::fs::File::from(fd), kind, &sink, cap, || {
                    if kill_on_overflow {
                        send_stop(&control, StopReason::OutputLimit);
                    }
                })
            })
        })
    };
    let stdout_reader = reader(
        pipes.stdout,
        command.stdout,
        StreamKind::Stdout,
        policy.limits.stdout.0,
    );
    let stderr_reader = reader(
        pipes.stderr,
        command.stderr,
        StreamKind::Stderr,
        policy.limits.stderr.0,
    );
    let events_reader = spawn_event_reader(
        pipes.events,
        pipes.end_at_finished,
        event_tx,
        start,
        network,
    );
    RunHandle {
        ending,
        cancel: super::finish::stop_when_cancelled(command, &control),
        control,
        events_reader,
        stdout_reader,
        stderr_reader,
        stdin_writer,
        events: Some(event_rx),
    }
}

/// Reads the init's events; the first one (the start, or a setup failure) opens the gate of
/// the output streams, as does the end of the events.
fn spawn_event_reader(
    events: OwnedFd,
    end_at_finished: bool,
    tx: Sender<RunEvent>,
    start: Arc<StartGate>,
    network: Option<NetworkSender>,
) -> JoinHandle<Vec<InitEvent>> {
    std::thread::spawn(move || {
        let mut log = serve::EventLog::default();
        let mut pipe = std::fs::File::from(events);
        let mut buffer = vec![0u8; 4096];
        while let Some(chunk) = output::read_chunk(&mut pipe, &mut buffer) {
            for event in log.feed(chunk) {
                if let InitEvent::Started { layers, .. } = event {
                    let _ = tx.send(RunEvent::Started {
                        layers: layers.clone(),
                    });
                }
                start.open();
            }
            if end_at_finished && log.has_finished() {
                break;
            }
        }
        start.open();
        if let Some(network) = network {
            network.lock().unwrap_or_else(|e| e.into_inner()).take();
        }
        log.finish()
    })
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
        let join =
            |h: Option<JoinHandle<Drained>>| h.and_then(|h| h.join().ok()).unwrap_or_default();
        let stdout = join(self.stdout_reader.take());
        let stderr = join(self.stderr_reader.take());
        let events = self.events_reader.join().unwrap_or_default();
        if let Some(writer) = self.stdin_writer.take() {
            let _ = writer.join();
        }
        let result = self.ending.conclude(serve::Served {
            stdout,
            stderr,
            events,
            cancel_signal: None,
        });
        drop(self.cancel.take());
        result
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write;
    use std::sync::mpsc::channel;
    use std::time::Duration;

    use super::*;
    use crate::layer::Layer;

    /// The program's output arrives before the init's start report (it writes at once, the
    /// init is slow to report): the stream still begins with `Started`.
    #[test]
    fn started_leads_the_stream_even_when_output_comes_first() {
        let (out_read, out_write) = super::super::launch::pipe().unwrap();
        let (events_read, events_write) = super::super::launch::pipe().unwrap();
        let (tx, rx) = channel();
        let start = Arc::new(StartGate::default());
        let sink = OutputSink::Stream(tx.clone(), Arc::clone(&start));
        let stdout = std::thread::spawn(move || {
            output::drain(
                std::fs::File::from(out_read),
                StreamKind::Stdout,
                &sink,
                1 << 20,
                || {},
            )
        });
        let events = spawn_event_reader(events_read, false, tx, start, None);
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
        stdout.join().unwrap();
        events.join().unwrap();
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
}
