//! The daemon's init spawner: one `airlock __init spawner` process (the library's
//! [`InitSpawner`]) that forks the inits of the daemon's cold command runs, so that each costs
//! a fork of a small process instead of an exec of the airlock binary (its loader, relocations
//! and first page touches: ~1 ms of CPU per run on this machine kind). The daemon has threads,
//! so it never forks an init from itself.
//!
//! A spawner that is gone (killed, crashed) is found at the run that asks it next, whose init
//! is then executed as before (also when it dies with that run's request unanswered: the
//! library executes the init on fresh pipes); that also starts a new spawner in the
//! background, at most once per [`RESTART_EVERY`], so an init program that cannot be a
//! spawner costs one failed start per interval, not one per run.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use airlock::{InitSpawner, SandboxOptions};

/// The shortest time between two starts of the spawner.
pub const RESTART_EVERY: Duration = Duration::from_secs(5);

/// The spawner of one daemon's cold runs; none until [`ColdSpawner::start`].
#[derive(Debug, Default)]
pub struct ColdSpawner {
    state: Mutex<SpawnerState>,
}

#[derive(Debug, Default)]
struct SpawnerState {
    /// The init program's options; `None` before `start` and after `close`.
    options: Option<SandboxOptions>,
    current: Option<Arc<InitSpawner>>,
    /// When the last start began (one in flight, or one too recent to try again).
    last_start: Option<Instant>,
    starting: bool,
}

impl ColdSpawner {
    /// Starts the spawner for `options`' init program (on the calling thread: a start-up task).
    pub fn start(self: &Arc<Self>, options: &SandboxOptions) {
        {
            let mut state = self.lock();
            state.options = Some(options.clone());
            state.starting = true;
            state.last_start = Some(Instant::now());
        }
        self.start_now();
    }

    /// The spawner for the next cold run while it is usable; `None` (the init is executed)
    /// when there is none, and then a new one is started in the background when allowed.
    pub fn get(self: &Arc<Self>) -> Option<Arc<InitSpawner>> {
        let mut state = self.lock();
        if let Some(current) = state.current.as_ref().filter(|s| s.is_usable()) {
            return Some(Arc::clone(current));
        }
        if let Some(gone) = state.current.take() {
            tracing::warn!(
                pid = gone.pid(),
                "the init spawner is gone: inits are executed until a new one starts"
            );
            // Killed first (one that stopped answering may still be there: closing its
            // socket would not end it), then reaped off the run's path. Its pid is not
            // reused before this reaps it.
            if let Some(pid) = gone
                .pid()
                .and_then(|p| rustix::process::Pid::from_raw(p as i32))
            {
                let _ = rustix::process::kill_process(pid, rustix::process::Signal::KILL);
            }
            let _ = std::thread::Builder::new()
                .name("spawner reaper".into())
                .spawn(move || gone.close());
        }
        let due = state
            .last_start
            .is_none_or(|t| t.elapsed() >= RESTART_EVERY);
        if state.options.is_some() && !state.starting && due {
            state.starting = true;
            state.last_start = Some(Instant::now());
            let this = Arc::clone(self);
            let spawned = std::thread::Builder::new()
                .name("spawner start".into())
                .spawn(move || this.start_now());
            if spawned.is_err() {
                state.starting = false;
            }
        }
        None
    }

    /// Ends the spawner (inits asked for later are executed) and reaps it.
    pub fn close(&self) {
        let current = {
            let mut state = self.lock();
            state.options = None;
            state.current.take()
        };
        if let Some(current) = current {
            current.close();
        }
    }

    /// The spawner's pid, while there is one (for tests and operators).
    pub fn pid(&self) -> Option<u32> {
        self.lock().current.as_ref().and_then(|s| s.pid())
    }

    fn start_now(&self) {
        let Some(options) = self.lock().options.clone() else {
            return;
        };
        let started = InitSpawner::start_with(&options);
        let mut state = self.lock();
        state.starting = false;
        match started {
            // Closed while it started: not kept.
            Ok(spawner) if state.options.is_none() => drop(spawner),
            Ok(spawner) => {
                tracing::debug!(pid = spawner.pid(), "init spawner started");
                state.current = Some(Arc::new(spawner));
            }
            Err(e) => tracing::warn!(
                "cannot start the init spawner (inits are executed; retried in {}s): {e}",
                RESTART_EVERY.as_secs()
            ),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, SpawnerState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}
