//! A cloneable cancellation flag that queued waiters, running jobs and runs can all observe:
//! the pool's queue ([`crate::pool::Pool::acquire`]), a run (`Command::cancel_on`), a worker
//! job and a tool call take one, so one token cancels a request wherever it is.

use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

type Callback = Box<dyn FnOnce() + Send>;

/// Shared cancellation signal. Clones observe and trigger the same signal.
///
/// A queued [`Pool::acquire`](crate::pool::Pool::acquire) returns
/// [`PoolError::Cancelled`](crate::pool::PoolError::Cancelled) as soon as its token is
/// cancelled; a run given the token with `Command::cancel_on` is stopped (status
/// `cancelled`, also when the token fires during the sandbox's set-up or before it).
/// A running job is handed the token and is expected to stop when told: poll
/// [`is_cancelled`](Self::is_cancelled), block in [`wait_cancelled`](Self::wait_cancelled), or
/// register a callback with [`on_cancel`](Self::on_cancel) (e.g. one that kills the sandboxed
/// child).
#[derive(Clone, Default)]
pub struct CancelToken {
    inner: Arc<CancelInner>,
}

#[derive(Default)]
struct CancelInner {
    // Mirrors `state.is_cancelled` so that polling from a hot loop takes no lock.
    cancelled_flag: AtomicBool,
    state: Mutex<CancelState>,
    cancelled: Condvar,
}

#[derive(Default)]
struct CancelState {
    is_cancelled: bool,
    next_callback_id: u64,
    callbacks: Vec<(u64, Callback)>,
}

impl CancelToken {
    /// A token that is not cancelled yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Cancels the token: wakes every waiter and runs every registered callback once, on the
    /// calling thread. Later calls do nothing.
    pub fn cancel(&self) {
        let callbacks = {
            let mut state = self.inner.lock();
            if state.is_cancelled {
                return;
            }
            state.is_cancelled = true;
            self.inner.cancelled_flag.store(true, Ordering::Release);
            std::mem::take(&mut state.callbacks)
        };
        self.inner.cancelled.notify_all();
        // Callbacks run without the token's lock so that they may take other locks (the pool's)
        // while another thread holding those locks unregisters a callback.
        for (_, callback) in callbacks {
            callback();
        }
    }

    /// Whether [`cancel`](Self::cancel) has been called on this token or a clone of it.
    pub fn is_cancelled(&self) -> bool {
        self.inner.cancelled_flag.load(Ordering::Acquire)
    }

    /// Blocks until the token is cancelled.
    pub fn wait_cancelled(&self) {
        let state = self.inner.lock();
        let _cancelled = self
            .inner
            .cancelled
            .wait_while(state, |state| !state.is_cancelled)
            .unwrap_or_else(PoisonError::into_inner);
    }

    /// Blocks until the token is cancelled or `timeout` has passed; returns whether it was
    /// cancelled.
    pub fn wait_cancelled_for(&self, timeout: Duration) -> bool {
        let state = self.inner.lock();
        let (state, _) = self
            .inner
            .cancelled
            .wait_timeout_while(state, timeout, |state| !state.is_cancelled)
            .unwrap_or_else(PoisonError::into_inner);
        state.is_cancelled
    }

    /// Runs `callback` once when the token is cancelled, on the thread calling
    /// [`cancel`](Self::cancel); runs it immediately, on this thread, if the token already is.
    ///
    /// The callback is unregistered when the returned registration is dropped, unless
    /// [`CancelRegistration::detach`] was called. It must not panic and should be quick: it delays
    /// the canceller and the callbacks registered after it.
    pub fn on_cancel(&self, callback: impl FnOnce() + Send + 'static) -> CancelRegistration {
        let mut state = self.inner.lock();
        if state.is_cancelled {
            drop(state);
            callback();
            return CancelRegistration { registered: None };
        }
        let id = state.next_callback_id;
        state.next_callback_id += 1;
        state.callbacks.push((id, Box::new(callback)));
        CancelRegistration {
            registered: Some((Arc::clone(&self.inner), id)),
        }
    }
}

impl fmt::Debug for CancelToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CancelToken")
            .field("cancelled", &self.is_cancelled())
            .finish_non_exhaustive()
    }
}

impl CancelInner {
    fn lock(&self) -> MutexGuard<'_, CancelState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Keeps a callback registered with [`CancelToken::on_cancel`]; dropping it unregisters the
/// callback (a callback already running is not interrupted).
#[must_use = "dropping the registration unregisters the callback at once; call detach() to keep it"]
pub struct CancelRegistration {
    registered: Option<(Arc<CancelInner>, u64)>,
}

impl CancelRegistration {
    /// Keeps the callback registered for the token's whole life.
    pub fn detach(mut self) {
        self.registered = None;
    }
}

impl Drop for CancelRegistration {
    fn drop(&mut self) {
        if let Some((inner, id)) = self.registered.take() {
            inner
                .lock()
                .callbacks
                .retain(|(callback_id, _)| *callback_id != id);
        }
    }
}

impl fmt::Debug for CancelRegistration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CancelRegistration")
            .field("registered", &self.registered.is_some())
            .finish()
    }
}
