//! A waited run's admission record, committed while the library plans its sandbox.
//!
//! A run that holds its slot at once and runs on its caller's thread used to wait for its
//! INSERT before anything else: ~0.15-0.2 ms of every waited request on a loaded 2-core host.
//! The library's planning of the sandbox (backend, layers, the init's spec: several times
//! that) does not depend on the record, so the INSERT goes to a runtime worker (the one that
//! takes over the request thread's scheduler when the run enters `block_in_place`) and the
//! library launches nothing before it has committed (`Command::before_launch`). The promise
//! is unchanged: no sandbox starts before its run is recorded, and its end is recorded only
//! after that record.

use std::sync::{Condvar, Mutex, PoisonError};
use std::time::{Duration, Instant};

/// The outcome of an admission INSERT running elsewhere, for the threads that must not go on
/// before it is known.
#[derive(Debug, Default)]
pub struct PendingInsert {
    outcome: Mutex<Option<Result<(), String>>>,
    settled: Condvar,
    /// How long the library's launch was held for it: the daemon's time, not the library's
    /// (taken out of `Server-Timing: sandbox`).
    held: Mutex<Duration>,
}

impl PendingInsert {
    /// Records the INSERT's outcome (the store's error, as text) and wakes those waiting.
    pub(super) fn settle(&self, outcome: Result<(), String>) {
        *self.lock() = Some(outcome);
        self.settled.notify_all();
    }

    /// Waits until the INSERT has committed (`Ok`) or failed (the store's error).
    pub fn wait(&self) -> Result<(), String> {
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

    /// [`PendingInsert::wait`] at the library's launch, noting how long it held the launch.
    pub fn wait_at_launch(&self) -> Result<(), String> {
        let waited = Instant::now();
        let outcome = self.wait();
        *self.held.lock().unwrap_or_else(PoisonError::into_inner) += waited.elapsed();
        outcome
    }

    /// How long the library's launch waited for the INSERT.
    pub fn held(&self) -> Duration {
        *self.held.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Settles `self` with an error unless it is settled first: for the task running the
    /// INSERT, so that a task that panics or is dropped with its runtime never leaves a
    /// run waiting for its record forever.
    pub(super) fn settle_on_drop(self: &std::sync::Arc<Self>) -> SettleOnDrop {
        SettleOnDrop(std::sync::Arc::clone(self))
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
pub(super) struct SettleOnDrop(std::sync::Arc<PendingInsert>);

impl SettleOnDrop {
    pub(super) fn settle(self, outcome: Result<(), String>) {
        self.0.settle(outcome);
    }
}

impl Drop for SettleOnDrop {
    fn drop(&mut self) {
        let mut outcome = self.0.lock();
        if outcome.is_none() {
            *outcome = Some(Err(
                "the admission record's task ended without an outcome".into()
            ));
            drop(outcome);
            self.0.settled.notify_all();
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
    fn a_committed_insert_lets_every_waiter_go_on() {
        let pending = PendingInsert::default();
        pending.settle(Ok(()));
        assert_eq!(pending.wait_at_launch(), Ok(()));
        assert_eq!(pending.failure(), None);
        assert!(pending.held() < Duration::from_millis(100));
    }
}
