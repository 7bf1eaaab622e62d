//! Warm start: sandboxes prepared ahead of their runs.
//!
//! A [`WarmPool`] keeps `target` sandboxes of one policy (and options) set up up to the
//! program's exec: namespaces created, root built, cgroup created and limited, Landlock,
//! no_new_privs, capabilities dropped and seccomp installed in the sandbox's PID 1, which
//! waits for a command. [`WarmPool::command`] builds an ordinary [`Command`]; running it hands
//! the argv, environment, stdin and staged files to a ready sandbox, which forks and execs the
//! program at once. Each prepared sandbox serves exactly one run, is torn down after it off
//! the caller's path (the result comes first) and is replaced in the background.
//!
//! Nothing differs from a cold run but the moment things happen: the plan, the spec, the init
//! and the sandbox's setup are a cold run's, so the result's `isolation` is the same list. The
//! run's clocks (wall time, CPU budget) start when the command arrives, and its accounting
//! (CPU time, peak memory) is the run's own (see `docs/warm.md`).
//!
//! ```no_run
//! # fn main() -> Result<(), airlock::Error> {
//! let sandbox = airlock::Sandbox::new(airlock::policy::load_profile("untrusted")?)?;
//! let pool = sandbox.warm(airlock::warm::WarmOptions::new(4))?;
//! pool.wait_ready(1, std::time::Duration::from_secs(5));
//! let result = pool.command("/usr/bin/python3").args(["-c", "print(6 * 7)"]).run()?;
//! assert_eq!(result.stdout.as_deref(), Some("42\n"));
//! # Ok(()) }
//! ```
//!
//! A pool is `Send + Sync`; share it behind an `Arc`. Dropping it (or [`WarmPool::shutdown`])
//! tears every prepared sandbox down and waits until their inits are gone. If the process
//! holding the pool dies, each init sees its control pipe close and tears its sandbox down.

mod fill;
mod interpreter;

/// The line in `RunResult::details` of a run that started on a prepared sandbox (a warm
/// command that found none ready ran cold and lacks it).
pub use crate::supervisor::WARM_DETAIL;
pub use interpreter::is_module_name;
pub use interpreter::WarmInterpreter;

use std::collections::VecDeque;
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{channel, Sender};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::error::Error;
use crate::supervisor::{InitSpawner, Prestart, SharedRoots, Standby, StandbyPlans, StandbySource};
use crate::{Command, Sandbox};

/// How a pool keeps its prepared sandboxes.
#[derive(Debug, Clone)]
pub struct WarmOptions {
    /// Prepared sandboxes to keep ready.
    pub target: usize,
    /// Sandboxes prepared at once (each preparation is about a cold run's set-up work).
    pub parallel: usize,
    /// A sandbox ready for longer than this is torn down and replaced (its root and
    /// `/etc` files are a snapshot of the host's); `None` keeps it until used.
    pub idle_expiry: Option<Duration>,
    /// A preparation that has not reported ready by then is abandoned.
    pub ready_timeout: Duration,
    /// A cap shared with other pools on the sandboxes ready or being prepared.
    pub budget: Option<WarmBudget>,
    /// Replace each sandbox used (or expired); false prepares `target` once (a one-shot
    /// caller, a burst measurement).
    pub refill: bool,
    /// Start this interpreter in each sandbox ahead too, with its modules imported; the
    /// pool then runs code ([`WarmPool::code`]).
    pub interpreter: Option<WarmInterpreter>,
}

impl WarmOptions {
    /// `target` sandboxes ready, two prepared at once, replaced after ten idle minutes.
    pub fn new(target: usize) -> WarmOptions {
        WarmOptions {
            target,
            parallel: 2,
            idle_expiry: Some(Duration::from_secs(600)),
            ready_timeout: Duration::from_secs(30),
            budget: None,
            refill: true,
            interpreter: None,
        }
    }
}

/// A cap on prepared sandboxes across pools (one pool per profile, one budget per host):
/// each sandbox ready or being prepared holds one unit.
#[derive(Debug, Clone)]
pub struct WarmBudget {
    used: Arc<AtomicUsize>,
    max: usize,
}

impl WarmBudget {
    pub fn new(max: usize) -> WarmBudget {
        WarmBudget {
            used: Arc::new(AtomicUsize::new(0)),
            max,
        }
    }

    /// Units held now.
    pub fn in_use(&self) -> usize {
        self.used.load(Ordering::SeqCst)
    }

    fn try_acquire(&self) -> bool {
        self.used
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |used| {
                (used < self.max).then_some(used + 1)
            })
            .is_ok()
    }

    fn release(&self) {
        let _ = self
            .used
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |used| {
                used.checked_sub(1)
            });
    }
}

/// What a pool has done so far.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WarmStats {
    /// Sandboxes ready now.
    pub ready: usize,
    /// Sandboxes being prepared now.
    pub preparing: usize,
    /// Used or retired sandboxes whose init is still tearing them down.
    pub tearing_down: usize,
    /// Runs served by a prepared sandbox.
    pub served: u64,
    /// Warm commands that found no sandbox ready and ran cold.
    pub cold_fallbacks: u64,
    /// Those of them that ran on the pool's shared root (its PID 1 added only the run's own
    /// mounts); the others built their whole root.
    pub cold_on_shared_root: u64,
    /// Sandboxes torn down unused after `idle_expiry`.
    pub expired: u64,
    /// Preparations that failed or timed out.
    pub failed: u64,
    /// The last preparation failure.
    pub last_error: Option<String>,
    /// Shared roots built (the read-only part of the sandboxes' root: once per plan and
    /// `/etc` snapshot).
    pub shared_roots: u64,
    /// Why the pool's plan has no shared root, when it could not be built (its sandboxes
    /// then build their own root).
    pub shared_root_error: Option<String>,
    /// Plans made for the sandboxes: one serves every sandbox prepared within a second of it
    /// (`supervisor::standby_plan`), but a plan that reads the caller's writable paths is
    /// made for each.
    pub plans: u64,
}

/// Sandboxes of one policy prepared ahead of their runs (see the module documentation).
#[derive(Debug)]
pub struct WarmPool {
    shared: Arc<Shared>,
    filler: Option<JoinHandle<()>>,
    reaper: Option<JoinHandle<()>>,
}

#[derive(Debug)]
struct Shared {
    sandbox: Sandbox,
    options: WarmOptions,
    prestart: Option<Prestart>,
    /// Forks the sandboxes' inits, and the inits of the pool's commands that find no
    /// sandbox ready and run cold (`None` when it could not start: they are executed).
    spawner: Option<Arc<InitSpawner>>,
    /// The read-only part of the sandboxes' root, built once per plan and `/etc` snapshot
    /// (`supervisor::shared_root`).
    roots: SharedRoots,
    /// The sandboxes' plan, made once and filled in for each (`supervisor::standby_plan`).
    plans: StandbyPlans,
    state: Mutex<State>,
    changed: Condvar,
    /// A byte here wakes the filler (a sandbox was taken, or the pool shuts down).
    wake: (OwnedFd, OwnedFd),
    reap: Mutex<Option<Sender<u32>>>,
    /// Inits retired and not yet reaped.
    tearing_down: Arc<AtomicUsize>,
}

#[derive(Debug, Default)]
struct State {
    ready: VecDeque<(Standby, Instant)>,
    shutdown: bool,
    stats: WarmStats,
    /// Preparations started so far (without refill, at most `target`).
    started: usize,
}

impl Sandbox {
    /// A pool keeping `options.target` sandboxes of this policy prepared (see [`crate::warm`]).
    /// Refuses what a cold run of this sandbox would refuse, and backends other than native.
    pub fn warm(&self, options: WarmOptions) -> Result<WarmPool, Error> {
        WarmPool::new(self.clone(), options)
    }
}

impl WarmPool {
    /// Starts the pool's filler, which prepares sandboxes in the background.
    pub fn new(sandbox: Sandbox, options: WarmOptions) -> Result<WarmPool, Error> {
        // Refused here what every preparation would refuse, not in the filler.
        Standby::check(&sandbox)?;
        let wake = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC | nix::fcntl::OFlag::O_NONBLOCK)
            .map_err(|e| Error::io("cannot create a pipe", e.into()))?;
        let (reap_tx, reap_rx) = channel::<u32>();
        let tearing_down = Arc::new(AtomicUsize::new(0));
        let reaped = Arc::clone(&tearing_down);
        let prestart = match &options.interpreter {
            Some(interpreter) => Some(interpreter.prestart()?),
            None => None,
        };
        let spawner = InitSpawner::start(&sandbox).ok().map(Arc::new);
        // Renewed at half the idle expiry, so that a sandbox prepared on it still has a useful
        // part of the expiry (counted from the root's build) to wait in.
        let roots = SharedRoots::new(options.idle_expiry.map(|expiry| expiry / 2));
        let shared = Arc::new(Shared {
            sandbox,
            options,
            prestart,
            spawner,
            roots,
            plans: StandbyPlans::default(),
            state: Mutex::new(State::default()),
            changed: Condvar::new(),
            wake,
            reap: Mutex::new(Some(reap_tx)),
            tearing_down,
        });
        let reaper = std::thread::spawn(move || {
            for pid in reap_rx {
                reap(pid);
                reaped.fetch_sub(1, Ordering::SeqCst);
            }
        });
        let filler_shared = Arc::clone(&shared);
        let filler = std::thread::spawn(move || fill::run(&filler_shared));
        Ok(WarmPool {
            shared,
            filler: Some(filler),
            reaper: Some(reaper),
        })
    }

    /// A command that runs on a prepared sandbox (or cold when none is ready). It cannot have
    /// a terminal, keep its workdir or inherit the caller's stdin: those are refused. Run
    /// cold, its init is forked by the pool's spawner, as a prepared sandbox's is: an executed
    /// init's start-up (the binary's loader, relocations, first page touches and the C
    /// library's CPU probe, about 1 ms of CPU) would make the cold fallbacks of a saturated
    /// pool the dearest runs; and it runs on the pool's shared root when that serves its plan
    /// (see [`WarmStats::cold_on_shared_root`]).
    pub fn command(&self, program: impl Into<String>) -> Command {
        let source: Arc<dyn StandbySource> = self.shared.clone();
        let command = self.shared.sandbox.command(program).with_standby(source);
        match &self.shared.spawner {
            Some(spawner) => command.init_spawner(Arc::clone(spawner)),
            None => command,
        }
    }

    /// A command running `code` with the pool's started interpreter (as its `-c` would); the
    /// program's arguments follow with [`Command::args`]. Refused for a pool without one.
    pub fn code(&self, code: impl Into<String>) -> Result<Command, Error> {
        let Some(interpreter) = &self.shared.options.interpreter else {
            return Err(Error::Command(
                "this warm pool starts no interpreter; set WarmOptions::interpreter".into(),
            ));
        };
        let program = interpreter.program.display().to_string();
        Ok(self.command(program).args(["-c".to_string(), code.into()]))
    }

    /// The pool's counters now.
    pub fn stats(&self) -> WarmStats {
        let state = self.shared.lock();
        let (shared_roots, shared_root_error) = self.shared.roots.stats();
        WarmStats {
            ready: state.ready.len(),
            tearing_down: self.shared.tearing_down.load(Ordering::SeqCst),
            shared_roots,
            shared_root_error,
            cold_on_shared_root: self.shared.roots.lent_to_cold(),
            plans: self.shared.plans.made(),
            ..state.stats.clone()
        }
    }

    /// Waits until the pool is at rest: `target` sandboxes ready, none being prepared and
    /// none being torn down (for benchmarks and tests that must not overlap with it); true
    /// when it is.
    pub fn wait_settled(&self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        loop {
            let stats = self.stats();
            let target = self.shared.options.target;
            if stats.ready >= target && stats.preparing == 0 && stats.tearing_down == 0 {
                return true;
            }
            if Instant::now() >= deadline {
                return false;
            }
            std::thread::sleep(Duration::from_micros(200));
        }
    }

    /// Waits until at least `n` sandboxes are ready or `timeout` passes; true when they are.
    pub fn wait_ready(&self, n: usize, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        let mut state = self.shared.lock();
        while state.ready.len() < n {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            state = match self.shared.changed.wait_timeout(state, left) {
                Ok((state, _)) => state,
                Err(poisoned) => poisoned.into_inner().0,
            };
        }
        true
    }

    /// Tears every prepared sandbox down and waits until their inits are gone. Runs already
    /// started finish normally; later runs of this pool's commands run cold.
    pub fn shutdown(mut self) {
        self.stop();
    }

    fn stop(&mut self) {
        self.shared.lock().shutdown = true;
        self.shared.wake_filler();
        if let Some(filler) = self.filler.take() {
            let _ = filler.join();
        }
        let ready: Vec<(Standby, Instant)> = self.shared.lock().ready.drain(..).collect();
        for (standby, _) in ready {
            self.shared.release_budget();
            self.shared.retire_standby(standby);
        }
        if let Some(spawner) = &self.shared.spawner {
            spawner.close();
        }
        self.shared.roots.clear();
        self.shared.reap.lock().map(|mut tx| tx.take()).ok();
        if let Some(reaper) = self.reaper.take() {
            let _ = reaper.join();
        }
    }
}

impl Drop for WarmPool {
    fn drop(&mut self) {
        self.stop();
    }
}

impl Shared {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn wake_filler(&self) {
        let _ = nix::unistd::write(&self.wake.1, b"w");
    }

    fn release_budget(&self) {
        if let Some(budget) = &self.options.budget {
            budget.release();
        }
    }
}

impl StandbySource for Shared {
    fn take(&self) -> Option<Standby> {
        let mut state = self.lock();
        let taken = state.ready.pop_front().map(|(standby, _)| standby);
        match taken {
            Some(_) => state.stats.served += 1,
            None => state.stats.cold_fallbacks += 1,
        }
        drop(state);
        if taken.is_some() {
            self.release_budget();
        }
        taken
    }

    /// Also where a used sandbox is replaced: after its run, not while it runs, so that the
    /// preparation does not compete with the run it replaces for the CPU.
    fn retire(&self, init_pid: u32) {
        self.tearing_down.fetch_add(1, Ordering::SeqCst);
        self.wake_filler();
        let sender = self.reap.lock().ok().and_then(|tx| tx.clone());
        if sender.is_some_and(|tx| tx.send(init_pid).is_ok()) {
            return;
        }
        // The pool is shut down: reap on a thread of its own.
        let reaped = Arc::clone(&self.tearing_down);
        std::thread::spawn(move || {
            reap(init_pid);
            reaped.fetch_sub(1, Ordering::SeqCst);
        });
    }

    fn shared_roots(&self) -> &SharedRoots {
        &self.roots
    }
}

/// Waits for a retired init, which exits once its sandbox is torn down.
fn reap(pid: u32) {
    let pid = nix::unistd::Pid::from_raw(pid as i32);
    while let Err(nix::errno::Errno::EINTR) = nix::sys::wait::waitpid(pid, None) {}
}
