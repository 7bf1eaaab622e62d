//! A synchronous job scheduler: at most N jobs at once, urgent ones first, and no tenant can hold
//! every slot.
//!
//! The pool knows nothing about what a job does; it only hands out slots. [`Pool::acquire`]
//! blocks until a slot is granted (returning a [`Permit`] that gives it back on drop), the
//! [`CancelToken`] is cancelled, or the queue timeout passes. [`Pool::run`] wraps a closure in
//! that. Admission rules are described in `docs/pool.md`.
//!
//! ```
//! use airlock::pool::{CancelToken, JobRequest, Pool, PoolConfig};
//!
//! let pool = Pool::new(PoolConfig {
//!     max_concurrent: 2,
//!     per_tenant_max: Some(1),
//!     queue_timeout: None,
//! })?;
//! let request = JobRequest::new("team-a").with_priority(5);
//! let answer = pool.run(&request, &CancelToken::new(), |_cancel| 42)?;
//! assert_eq!(answer, 42);
//! assert_eq!(pool.stats().admitted_total, 1);
//! # Ok::<(), airlock::pool::PoolError>(())
//! ```

mod admission;
mod cancel;
#[cfg(test)]
mod tests;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use admission::{Admission, QueueKey, Waiter};
pub use cancel::{CancelRegistration, CancelToken};

/// Errors of the job pool.
#[derive(thiserror::Error, Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum PoolError {
    /// The queue timeout passed before a slot was granted.
    #[error(
        "busy: job of tenant {tenant:?} got no slot within {waited:?} \
         ({queued_ahead} waiters ahead of it, {running} of {max_concurrent} slots in use)"
    )]
    Busy {
        tenant: String,
        waited: Duration,
        queued_ahead: usize,
        running: usize,
        max_concurrent: usize,
    },
    /// The job's cancel token was cancelled before the job started.
    #[error("job of tenant {tenant:?} was cancelled while queued for a slot")]
    Cancelled { tenant: String },
    /// [`PoolConfig`] values the pool cannot work with.
    #[error("invalid pool config: {0}")]
    InvalidConfig(String),
}

/// Limits of a [`Pool`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolConfig {
    /// Jobs running at once, over all tenants. At least 1.
    pub max_concurrent: usize,
    /// Jobs running at once for one tenant. `None`: only the global cap applies.
    pub per_tenant_max: Option<usize>,
    /// How long a job may wait for a slot before failing with [`PoolError::Busy`]. `None`: wait
    /// forever. `Some(Duration::ZERO)`: fail at once unless a slot is free.
    pub queue_timeout: Option<Duration>,
}

impl Default for PoolConfig {
    /// One slot per CPU, no tenant cap, no queue timeout.
    fn default() -> Self {
        let cpus = std::thread::available_parallelism().map_or(1, |cpus| cpus.get());
        Self {
            max_concurrent: cpus.max(1),
            per_tenant_max: None,
            queue_timeout: None,
        }
    }
}

impl PoolConfig {
    fn validate(&self) -> Result<(), PoolError> {
        if self.max_concurrent == 0 {
            return Err(PoolError::InvalidConfig(
                "max_concurrent must be at least 1".into(),
            ));
        }
        if self.per_tenant_max == Some(0) {
            return Err(PoolError::InvalidConfig(
                "per_tenant_max must be at least 1 when set".into(),
            ));
        }
        Ok(())
    }
}

/// Who asks for a slot, and how urgently.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobRequest {
    /// Fairness key: the per-tenant cap counts slots per distinct tenant string.
    pub tenant: String,
    /// Higher runs first; equal priorities run in arrival order.
    pub priority: i32,
    /// Overrides [`PoolConfig::queue_timeout`] for this request when set.
    pub queue_timeout: Option<Duration>,
}

impl JobRequest {
    /// A priority-0 request of `tenant` using the pool's queue timeout.
    pub fn new(tenant: impl Into<String>) -> Self {
        Self {
            tenant: tenant.into(),
            priority: 0,
            queue_timeout: None,
        }
    }

    pub fn with_priority(mut self, priority: i32) -> Self {
        self.priority = priority;
        self
    }

    pub fn with_queue_timeout(mut self, queue_timeout: Duration) -> Self {
        self.queue_timeout = Some(queue_timeout);
        self
    }
}

/// A snapshot of the pool's load and lifetime counters.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq, Default)]
pub struct PoolStats {
    pub max_concurrent: usize,
    pub per_tenant_max: Option<usize>,
    /// Slots currently held (granted permits not yet dropped).
    pub running: usize,
    /// Held slots per tenant; tenants holding none are absent.
    pub running_per_tenant: BTreeMap<String, usize>,
    pub queued: usize,
    /// Queued waiters per tenant; tenants with none are absent.
    pub queued_per_tenant: BTreeMap<String, usize>,
    /// Slots granted since the pool was created.
    pub admitted_total: u64,
    /// Requests that failed with [`PoolError::Busy`].
    pub rejected_busy: u64,
    /// Requests that failed with [`PoolError::Cancelled`].
    pub cancelled: u64,
}

/// A cloneable handle to one shared scheduler; clones share slots and queue.
#[derive(Clone, Debug)]
pub struct Pool {
    shared: Arc<Shared>,
}

struct Shared {
    config: PoolConfig,
    admission: Mutex<Admission>,
    /// Lets tests block until the pool reaches a state, instead of sleeping.
    #[cfg(test)]
    changed: std::sync::Condvar,
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pool")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl Default for Pool {
    /// A pool with [`PoolConfig::default`].
    fn default() -> Self {
        Self::from_valid_config(PoolConfig::default())
    }
}

impl Pool {
    /// Creates a pool; fails with [`PoolError::InvalidConfig`] on a zero cap.
    pub fn new(config: PoolConfig) -> Result<Self, PoolError> {
        config.validate()?;
        Ok(Self::from_valid_config(config))
    }

    fn from_valid_config(config: PoolConfig) -> Self {
        let admission = Admission::new(config.max_concurrent, config.per_tenant_max);
        Self {
            shared: Arc::new(Shared {
                config,
                admission: Mutex::new(admission),
                #[cfg(test)]
                changed: std::sync::Condvar::new(),
            }),
        }
    }

    pub fn config(&self) -> &PoolConfig {
        &self.shared.config
    }

    /// Blocks until `request` is granted a slot, `cancel` is cancelled, or the queue timeout
    /// passes. A request whose token is already cancelled is never granted a slot.
    pub fn acquire(&self, request: &JobRequest, cancel: &CancelToken) -> Result<Permit, PoolError> {
        let started = Instant::now();
        {
            let mut admission = self.shared.lock();
            if cancel.is_cancelled() {
                admission.counters.cancelled += 1;
                return Err(cancelled_error(request));
            }
            if let Some(tenant) = admission.try_admit_now(&request.tenant) {
                drop(admission);
                self.shared.notify_observers();
                return Ok(self.permit(tenant));
            }
        }
        self.wait_in_queue(request, cancel, started)
    }

    /// Runs `job` in a slot: acquires as [`acquire`](Self::acquire) does, hands `job` the token so
    /// that it can stop when cancelled, and releases the slot when `job` returns or panics. A job
    /// whose token is cancelled by the time its slot is granted is not started.
    pub fn run<T>(
        &self,
        request: &JobRequest,
        cancel: &CancelToken,
        job: impl FnOnce(&CancelToken) -> T,
    ) -> Result<T, PoolError> {
        let permit = self.acquire(request, cancel)?;
        if cancel.is_cancelled() {
            drop(permit);
            self.shared.lock().counters.cancelled += 1;
            return Err(cancelled_error(request));
        }
        let output = job(cancel);
        drop(permit);
        Ok(output)
    }

    pub fn stats(&self) -> PoolStats {
        self.shared.lock().stats()
    }

    fn wait_in_queue(
        &self,
        request: &JobRequest,
        cancel: &CancelToken,
        started: Instant,
    ) -> Result<Permit, PoolError> {
        let waiter = Waiter::new();
        // Registered before queueing, and the callback takes the pool lock before notifying, so
        // a cancel racing with the checks below is always seen (flag) or heard (notify).
        let _cancel_wakeup = cancel.on_cancel({
            let shared = Arc::clone(&self.shared);
            let waiter = Arc::clone(&waiter);
            move || {
                let _admission = shared.lock();
                waiter.wakeup.notify_one();
            }
        });
        let deadline = request
            .queue_timeout
            .or(self.shared.config.queue_timeout)
            .and_then(|timeout| started.checked_add(timeout));

        let mut admission = self.shared.lock();
        let (key, tenant) =
            admission.enqueue(&request.tenant, request.priority, Arc::clone(&waiter));
        self.shared.notify_observers();
        loop {
            if waiter.is_granted() {
                return Ok(self.permit(tenant));
            }
            if cancel.is_cancelled() {
                admission.withdraw(&tenant, key);
                admission.counters.cancelled += 1;
                self.shared.notify_observers();
                return Err(cancelled_error(request));
            }
            admission = match deadline {
                None => waiter
                    .wakeup
                    .wait(admission)
                    .unwrap_or_else(PoisonError::into_inner),
                Some(deadline) => {
                    let now = Instant::now();
                    if now >= deadline {
                        let error = busy_error(&mut admission, request, key, started);
                        admission.withdraw(&tenant, key);
                        self.shared.notify_observers();
                        return Err(error);
                    }
                    waiter
                        .wakeup
                        .wait_timeout(admission, deadline - now)
                        .unwrap_or_else(PoisonError::into_inner)
                        .0
                }
            };
        }
    }

    fn permit(&self, tenant: Arc<str>) -> Permit {
        Permit {
            shared: Arc::clone(&self.shared),
            tenant,
        }
    }

    /// Blocks until `ready` holds for the pool's stats; panics after 10 s so a broken test fails
    /// instead of hanging.
    #[cfg(test)]
    fn wait_for_stats(&self, ready: impl Fn(&PoolStats) -> bool) -> PoolStats {
        let admission = self.shared.lock();
        let (admission, timeout) = self
            .shared
            .changed
            .wait_timeout_while(admission, Duration::from_secs(10), |admission| {
                !ready(&admission.stats())
            })
            .unwrap_or_else(PoisonError::into_inner);
        assert!(
            !timeout.timed_out(),
            "pool never reached the awaited state: {:?}",
            admission.stats()
        );
        admission.stats()
    }
}

fn cancelled_error(request: &JobRequest) -> PoolError {
    PoolError::Cancelled {
        tenant: request.tenant.clone(),
    }
}

fn busy_error(
    admission: &mut Admission,
    request: &JobRequest,
    key: QueueKey,
    started: Instant,
) -> PoolError {
    admission.counters.rejected_busy += 1;
    PoolError::Busy {
        tenant: request.tenant.clone(),
        waited: started.elapsed(),
        queued_ahead: admission.queued_ahead(key),
        running: admission.running(),
        max_concurrent: admission.max_concurrent(),
    }
}

impl Shared {
    // A poisoned lock only means some thread panicked elsewhere while holding it; the admission
    // state is updated in single steps that cannot panic halfway, so it is still consistent, and
    // permits dropped during unwinding must still give their slot back.
    fn lock(&self) -> MutexGuard<'_, Admission> {
        self.admission
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    #[cfg(test)]
    fn notify_observers(&self) {
        self.changed.notify_all();
    }

    #[cfg(not(test))]
    fn notify_observers(&self) {}
}

/// A granted slot. Dropping it (also while unwinding from a panic) returns the slot and admits
/// the next waiter(s).
#[must_use = "the slot is released as soon as the permit is dropped"]
#[derive(Debug)]
pub struct Permit {
    shared: Arc<Shared>,
    tenant: Arc<str>,
}

impl Permit {
    pub fn tenant(&self) -> &str {
        &self.tenant
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        self.shared.lock().release(&self.tenant);
        self.shared.notify_observers();
    }
}
