//! A run's timeline through the daemon (submitted, inserted, on its thread, slot, sandbox
//! done, recorded): the debug log's account of where the API's own time goes.

use std::time::Instant;

/// Instants along a run's way through the daemon: where the API's own time goes.
#[derive(Debug, Default, Clone, Copy)]
pub struct Timeline {
    pub submitted: Option<Instant>,
    pub inserted: Option<Instant>,
    pub thread: Option<Instant>,
    pub slot: Option<Instant>,
    pub sandbox_done: Option<Instant>,
    pub recorded: Option<Instant>,
    /// When the library's launch began to wait for an INSERT running beside the planning,
    /// and how long it waited (`plan` and `held` in [`Timeline::deltas`]).
    pub launch: Option<Instant>,
    pub held: Option<std::time::Duration>,
}

/// A step of [`Timeline`].
#[derive(Debug, Clone, Copy)]
pub enum Step {
    Submitted,
    Thread,
    Slot,
    SandboxDone,
    Recorded,
}

impl Timeline {
    pub(super) fn mark(&mut self, step: Step) {
        let slot = match step {
            Step::Submitted => &mut self.submitted,
            Step::Thread => &mut self.thread,
            Step::Slot => &mut self.slot,
            Step::SandboxDone => &mut self.sandbox_done,
            Step::Recorded => &mut self.recorded,
        };
        *slot = Some(Instant::now());
    }

    /// Microseconds between consecutive steps, as `name=us` pairs.
    pub fn deltas(&self, answered: Instant) -> String {
        let steps = [
            ("insert", self.inserted),
            ("to_thread", self.thread),
            ("slot", self.slot),
            ("sandbox", self.sandbox_done),
            ("record", self.recorded),
            ("wake", Some(answered)),
        ];
        let mut last = self.submitted;
        let mut parts = Vec::new();
        for (name, at) in steps {
            if let (Some(from), Some(to)) = (last, at) {
                parts.push(format!(
                    "{name}={}",
                    to.saturating_duration_since(from).as_micros()
                ));
                last = Some(to);
            }
        }
        if let (Some(slot), Some(launch)) = (self.slot, self.launch) {
            let plan = launch.saturating_duration_since(slot).as_micros();
            parts.push(format!("plan={plan}"));
        }
        if let Some(held) = self.held {
            parts.push(format!("held={}", held.as_micros()));
        }
        parts.join(" ")
    }
}
