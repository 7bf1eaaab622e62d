//! A waited run's admission record, committed while the library plans its sandbox.
//!
//! A run that holds its slot at once and runs on its caller's thread used to wait for its
//! INSERT before anything else: ~0.15-0.2 ms of every waited request on a loaded 2-core host.
//! The library's planning of the sandbox (backend, layers, the init's spec: several times
//! that) does not depend on the record, so the INSERT is offered to a runtime worker (the one
//! that takes over the request thread's scheduler when the run enters `block_in_place`) and
//! the library launches nothing before it has committed (`Command::before_launch`). Whoever
//! gets to the INSERT first runs it: when the run's own thread reaches the launch before the
//! worker has started it (a worker woken on an idle or busy CPU can take longer to come than
//! the planning), the run's thread runs it itself instead of waiting for that wake-up. The
//! promise is unchanged: no sandbox starts before its run is recorded, and its end is
//! recorded only after that record.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Condvar, Mutex, PoisonError};
use std::time::{Duration, Instant};

/// The admission INSERT, not started yet: its outcome is `Ok` once committed, else the
/// store's error as text.
pub(super) type InsertWork = Pin<Box<dyn Future<Output = Result<(), String>> + Send>>;

/// The outcome of an admission INSERT running elsewhere, for the threads that must not go on
/// before it is known.
#[derive(Default)]
pub struct PendingInsert {
    outcome: Mutex<Option<Result<(), String>>>,
    settled: Condvar,
    /// How long the run's thread waited for it or ran it (at the library's launch, or before
    /// a zygote takes the run): the daemon's time, not the library's (taken out of
    /// `Server-Timing: sandbox`).
    held: Mutex<Duration>,
    /// When the library's launch began to wait for it (for the run's timeline).
    launch_at: Mutex<Option<Instant>>,
    /// The INSERT until one of those who may run it takes it ([`PendingInsert::claim`]).
    work: Mutex<Option<InsertWork>>,
    /// Where the INSERT runs when a blocking thread takes it (its store may be async).
    runtime: Option<tokio::runtime::Handle>,
    /// When its outcome came (for the run's timeline).
    settled_at: Mutex<Option<Instant>>,
}

impl std::fmt::Debug for PendingInsert {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PendingInsert")
            .field("outcome", &*self.lock())
            .field("held", &self.held())
            .finish_non_exhaustive()
    }
}

impl PendingInsert {
    /// Records the INSERT's outcome (the store's error, as text) and wakes those waiting.
    pub(super) fn settle(&self, outcome: Result<(), String>) {
        *self
            .settled_at
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(Instant::now());
        *self.lock() = Some(outcome);
        self.settled.notify_all();
    }

    /// An INSERT to run, with the runtime that a thread taking it runs it on.
    pub(super) fn new(work: InsertWork, runtime: tokio::runtime::Handle) -> PendingInsert {
        PendingInsert {
            work: Mutex::new(Some(work)),
            runtime: Some(runtime),
            ..PendingInsert::default()
        }
    }

    /// Takes the INSERT to run it: `None` when another has taken it already.
    pub(super) fn claim(&self) -> Option<InsertWork> {
        self.work
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
    }

    /// Waits until the INSERT has committed (`Ok`) or failed (the store's error), running it
    /// on this (blocking) thread when no one has started it yet. The time this takes is the
    /// daemon's, not the library's: it is added to [`PendingInsert::held`].
    pub fn wait(&self) -> Result<(), String> {
        let waited = Instant::now();
        let outcome = self.run_or_wait();
        *self.held.lock().unwrap_or_else(PoisonError::into_inner) += waited.elapsed();
        outcome
    }

    /// [`PendingInsert::wait`] at the library's launch (noted for the run's timeline).
    pub fn wait_at_launch(&self) -> Result<(), String> {
        *self
            .launch_at
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(Instant::now());
        self.wait()
    }

    fn run_or_wait(&self) -> Result<(), String> {
        if let Some((work, runtime)) = self.claim().zip(self.runtime.as_ref()) {
            let settler = self.settle_on_drop();
            settler.settle(runtime.block_on(work));
        }
        let mut outcome = self.lock();
        loop {
            if let Some(known) = outcome.as_ref() {
                return known.clone();
            }
            outcome = self
                .settled
                .wait(outcome)
                .unwrap_or_else(PoisonError::into_inner);
        }
    }

    /// When the INSERT's outcome came, once it has.
    pub fn settled_at(&self) -> Option<Instant> {
        *self
            .settled_at
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// When the library's launch began to wait for it, once it has.
    pub fn launch_at(&self) -> Option<Instant> {
        *self
            .launch_at
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// How long the run's thread waited for the INSERT (or ran it).
    pub fn held(&self) -> Duration {
        *self.held.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Settles `self` with an error unless it is settled first: for the task running the
    /// INSERT, so that a task that panics or is dropped with its runtime never leaves a
    /// run waiting for its record forever.
    pub(super) fn settle_on_drop(&self) -> SettleOnDrop<'_> {
        SettleOnDrop(self)
    }

    /// The store's error, once the INSERT is known to have failed.
    pub fn failure(&self) -> Option<String> {
        self.lock()
            .as_ref()
            .and_then(|outcome| outcome.clone().err())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<Result<(), String>>> {
        self.outcome.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Settles its [`PendingInsert`] with an error when dropped unsettled.
pub(super) struct SettleOnDrop<'a>(&'a PendingInsert);

impl SettleOnDrop<'_> {
    pub(super) fn settle(self, outcome: Result<(), String>) {
        self.0.settle(outcome);
    }
}

impl Drop for SettleOnDrop<'_> {
    fn drop(&mut self) {
        self.0.settle_unless_settled();
    }
}

impl PendingInsert {
    /// An INSERT that ended without an outcome (a panic, a task dropped with its runtime)
    /// failed: no run waits for its record forever.
    fn settle_unless_settled(&self) {
        let mut outcome = self.lock();
        if outcome.is_none() {
            *outcome = Some(Err(
                "the admission record's task ended without an outcome".into()
            ));
            drop(outcome);
            self.settled.notify_all();
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use super::PendingInsert;

    #[test]
    fn waiters_get_the_outcome_once_it_is_settled() {
        let pending = Arc::new(PendingInsert::default());
        assert_eq!(pending.failure(), None);
        let waiter = {
            let pending = Arc::clone(&pending);
            std::thread::spawn(move || pending.wait())
        };
        std::thread::sleep(Duration::from_millis(20));
        let at_launch = {
            let pending = Arc::clone(&pending);
            std::thread::spawn(move || pending.wait_at_launch())
        };
        std::thread::sleep(Duration::from_millis(20));
        pending.settle(Err("disk full".into()));
        assert_eq!(at_launch.join().unwrap(), Err("disk full".into()));
        assert!(
            pending.held() >= Duration::from_millis(15),
            "{:?}",
            pending.held()
        );
        assert_eq!(waiter.join().unwrap(), Err("disk full".into()));
        assert_eq!(pending.wait(), Err("disk full".into()));
        assert_eq!(pending.failure(), Some("disk full".into()));
    }

    #[test]
    fn a_task_dropped_without_an_outcome_fails_the_record() {
        let pending = Arc::new(PendingInsert::default());
        drop(pending.settle_on_drop());
        assert!(pending.wait().is_err());
        let settled = Arc::new(PendingInsert::default());
        settled.settle_on_drop().settle(Ok(()));
        assert_eq!(settled.wait(), Ok(()));
    }

    #[test]
    fn a_waiter_runs_an_insert_that_no_one_has_started() {
        let runtime = tokio::runtime::Runtime::new().unwrap();
        let ran_on = Arc::new(std::sync::Mutex::new(None));
        let noted = Arc::clone(&ran_on);
        let work: super::InsertWork = Box::pin(async move {
            *noted.lock().unwrap() = Some(std::thread::current().id());
            Ok(())
        });
        let pending = PendingInsert::new(work, runtime.handle().clone());
        assert_eq!(pending.wait_at_launch(), Ok(()));
        assert_eq!(*ran_on.lock().unwrap(), Some(std::thread::current().id()));
        assert!(pending.claim().is_none(), "run once, by the waiter");
        assert!(pending.settled_at().is_some() && pending.launch_at().is_some());
    }

    #[test]
    fn a_waiter_waits_for_an_insert_another_has_started() {
        let runtime = tokio::runtime::Runtime::new().unwrap();
        let work: super::InsertWork = Box::pin(async { Err("not this one".to_string()) });
        let pending = Arc::new(PendingInsert::new(work, runtime.handle().clone()));
        let started = pending.claim().expect("the INSERT, unclaimed");
        let waiter = {
            let pending = Arc::clone(&pending);
            std::thread::spawn(move || pending.wait_at_launch())
        };
        std::thread::sleep(Duration::from_millis(20));
        drop(started);
        pending.settle(Ok(()));
        assert_eq!(waiter.join().unwrap(), Ok(()));
        assert!(pending.held() >= Duration::from_millis(15));
    }

    #[test]
    fn a_committed_insert_lets_every_waiter_go_on() {
        let pending = PendingInsert::default();
        pending.settle(Ok(()));
        assert_eq!(pending.wait_at_launch(), Ok(()));
        assert_eq!(pending.failure(), None);
        assert!(pending.held() < Duration::from_millis(100));
    }
}
