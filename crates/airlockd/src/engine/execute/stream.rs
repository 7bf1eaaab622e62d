//! The library's streamed run, relayed event by event into the run's log. A run in flight is
//! its own value (`InFlight`) so that a caller's thread can give it to a thread of its own
//! halfway, when the caller stops waiting (see `hand_over`).

use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::sync::Arc;
use std::time::Instant;

use airlock::warm::WarmPool;
use airlock::{RunEvent, RunHandle, RunResult, Sandbox};

use super::ending::ending_of;
use super::CommandWork;
use crate::engine::events::EventBody;
use crate::engine::warm::StartPath;
use crate::engine::{Engine, LiveRun, OwnedWorkspace};
use crate::resolve::Resolved;
use crate::store::Ending;

/// What streaming a run gave back.
pub(in crate::engine) struct Streamed {
    pub result: RunResult,
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
}

/// Starts the program with streamed output (on one of `pool`'s prepared sandboxes when given;
/// cold when none is ready, its init forked by the daemon's spawner when it has one) and gives
/// back its handle and its events.
pub(super) fn spawn_streamed(
    engine: &Engine,
    live: &LiveRun,
    policy: &airlock::Policy,
    resolved: &Resolved,
    pool: Option<&WarmPool>,
    work: &CommandWork,
) -> Result<(RunHandle, Option<Receiver<RunEvent>>), airlock::Error> {
    let (program, args) = work
        .argv
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
    for (key, value) in &work.env {
        command = command.env(key.clone(), value.clone());
    }
    if let Some(bytes) = &work.stdin {
        command = command.stdin(bytes.clone());
    }
    if let Some(spawner) = engine.spawner.get() {
        command = command.init_spawner(spawner);
    }
    if let Some(pending) = live.pending_insert() {
        let pending = Arc::clone(pending);
        command =
            command.before_launch(move || pending.wait_at_launch().map_err(std::io::Error::other));
    }
    let mut handle = command.spawn()?;
    let events = handle.events();
    Ok((handle, events))
}

/// A streamed run in flight: its handle, its events still to relay and what it needs until
/// its end (its own workspace; the warm pool its sandbox came from).
pub(super) struct InFlight {
    pub(super) handle: RunHandle,
    pub(super) events: Option<Receiver<RunEvent>>,
    pub(super) output: Output,
    pub(super) workspace: Option<OwnedWorkspace>,
    pub(super) pool: Option<Arc<WarmPool>>,
}

/// Whether a run's event stream closed (the run ended) or is still open.
pub(super) enum Relayed {
    Closed,
    Open,
}

impl InFlight {
    /// Relays events until the stream closes, or until `until` passes (never when `None`).
    pub(super) fn relay_until(&mut self, live: &LiveRun, until: Option<Instant>) -> Relayed {
        let Some(events) = &self.events else {
            return Relayed::Closed;
        };
        loop {
            let next = match until {
                None => events.recv().map_err(|_| RecvTimeoutError::Disconnected),
                Some(until) => events.recv_timeout(until.saturating_duration_since(Instant::now())),
            };
            match next {
                Ok(event) => self.output.relay(live, event),
                Err(RecvTimeoutError::Disconnected) => return Relayed::Closed,
                Err(RecvTimeoutError::Timeout) => return Relayed::Open,
            }
        }
    }

    /// Relays the rest of the events, waits for the result and turns it into the ending.
    pub(super) fn finish(mut self, engine: &Engine, live: &LiveRun) -> Ending {
        self.relay_until(live, None);
        let outcome = self.handle.wait().map(|result| Streamed {
            result,
            stdout: self.output.stdout,
            stderr: self.output.stderr,
        });
        drop(self.workspace);
        drop(self.pool);
        let start = outcome
            .as_ref()
            .map_or(StartPath::Cold, |s| StartPath::of_run(&s.result));
        ending_of(engine, outcome, None, Some(start))
    }
}

/// The output relayed so far.
#[derive(Default)]
pub(super) struct Output {
    stdout: Vec<u8>,
    stderr: Vec<u8>,
}

impl Output {
    /// Pushes `event` into the run's log, keeping its output.
    fn relay(&mut self, live: &LiveRun, event: RunEvent) {
        match event {
            RunEvent::Started { layers } => live.log.push(EventBody::started(&layers)),
            RunEvent::Stdout(chunk) => {
                live.log.push(EventBody::output(false, &chunk));
                self.stdout.extend_from_slice(&chunk);
            }
            RunEvent::Stderr(chunk) => {
                live.log.push(EventBody::output(true, &chunk));
                self.stderr.extend_from_slice(&chunk);
            }
            RunEvent::Network(event) => live.log.push(EventBody::network(&event)),
            _ => {}
        }
    }
}

/// Relays a run's events into its log until the library closes the stream (`started` always
/// comes first), and gives back the output relayed.
pub(in crate::engine) fn relay(
    live: &LiveRun,
    events: impl IntoIterator<Item = RunEvent>,
) -> (Vec<u8>, Vec<u8>) {
    let mut output = Output::default();
    for event in events {
        output.relay(live, event);
    }
    (output.stdout, output.stderr)
}
