//! A synchronous job scheduler: at most N jobs at once, urgent ones first, and no tenant can hold
//! every slot.
//!
//! The pool knows nothing about what a job does; it only hands out slots. [`Pool::acquire`]
//! blocks until a slot is granted (returning a [`Permit`] that gives it back on drop), the
//! [`CancelToken`] is cancelled, or the queue timeout passes. [`Pool::run`] wraps a closure in
//! that. [`Pool::enqueue`] takes the place in line without blocking and returns a [`Ticket`]
//! to wait on later (a server answers "queued" or "queue full" at once, then waits on another
//! thread). Caps may differ per tenant ([`TenantLimits`]), and the queue may be bounded, over
//! all tenants and per tenant. Admission rules are described in `docs/pool.md`.
//!
//! ```
//! use airlock::pool::{CancelToken, JobRequest, Pool, PoolConfig};
//!
//! let pool = Pool::new(PoolConfig {
//!     max_concurrent: 2,
//!     per_tenant_max: Some(1),
//!     ..PoolConfig::default()
//! })?;
//! let request = JobRequest::new("team-a").with_priority(5);
//! let answer = pool.run(&request, &CancelToken::new(), |_cancel| 42)?;
//! assert_eq!(answer, 42);
//! assert_eq!(pool.stats().admitted_total, 1);
//! # Ok::<(), airlock::pool::PoolError>(())
//! ```

mod admission;
#[cfg(test)]
mod tests;
mod ticket;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use serde::{Deserialize, Serialize};

pub use crate::cancel::{CancelRegistration, CancelToken};
use admission::Admission;
pub use ticket::Ticket;

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
    /// No slot was free and the queue the job would join is at its bound: refused at once.
    #[error(
        "queue full: job of tenant {tenant:?} cannot wait, {queued} jobs already wait {scope} \
         (at most {max_queued}); retry later"
    )]
    QueueFull {
        tenant: String,
        scope: QueueScope,
        queued: usize,
        max_queued: usize,
    },
    /// [`PoolConfig`] values the pool cannot work with.
    #[error("invalid pool config: {0}")]
    InvalidConfig(String),
}

/// Which queue a [`PoolError::QueueFull`] refusal is about.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum QueueScope {
    /// The pool's queue over all tenants ([`PoolConfig::max_queued`]).
    Pool,
    /// The tenant's own queue ([`TenantLimits::max_queued`]).
    Tenant,
}

impl std::fmt::Display for QueueScope {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            QueueScope::Pool => "in the pool",
            QueueScope::Tenant => "for this tenant",
        })
    }
}

/// One tenant's own limits (a daemon's tenants have different shares).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct TenantLimits {
    /// Jobs of this tenant running at once, instead of [`PoolConfig::per_tenant_max`]. At
    /// least 1 when set.
    pub max_concurrent: Option<usize>,
    /// Jobs of this tenant waiting at once; one more is refused with
    /// [`PoolError::QueueFull`]. `None`: only the pool's bound applies.
    pub max_queued: Option<usize>,
}

/// Limits of a [`Pool`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolConfig {
    /// Jobs running at once, over all tenants. At least 1.
    pub max_concurrent: usize,
    /// Jobs running at once for one tenant (unless [`tenants`](Self::tenants) says otherwise
    /// for it). `None`: only the global cap applies.
    pub per_tenant_max: Option<usize>,
    /// How long a job may wait for a slot before failing with [`PoolError::Busy`]. `None`: wait
    /// forever. `Some(Duration::ZERO)`: fail at once unless a slot is free.
    pub queue_timeout: Option<Duration>,
    /// Jobs waiting at once over all tenants; a job that would wait beyond it is refused at
    /// once with [`PoolError::QueueFull`]. `None`: unbounded.
    pub max_queued: Option<usize>,
    /// Limits of named tenants; a tenant not named here has `per_tenant_max` and no queue
    /// bound of its own.
    pub tenants: BTreeMap<String, TenantLimits>,
}

impl Default for PoolConfig {
    /// One slot per CPU, no tenant cap, no queue timeout, no queue bound.
    fn default() -> Self {
        let cpus = std::thread::available_parallelism().map_or(1, |cpus| cpus.get());
        Self {
            max_concurrent: cpus.max(1),
            per_tenant_max: None,
            queue_timeout: None,
            max_queued: None,
            tenants: BTreeMap::new(),
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
        let zero_cap = self
            .tenants
            .iter()
            .find(|(_, l)| l.max_concurrent == Some(0));
        if let Some((tenant, _)) = zero_cap {
            return Err(PoolError::InvalidConfig(format!(
                "tenants[{tenant:?}].max_concurrent must be at least 1 when set"
            )));
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
    /// Requests refused with [`PoolError::QueueFull`].
    pub rejected_full: u64,
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
        let admission = Admission::new(&config);
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
    /// passes. A request whose token is already cancelled is never granted a slot; one that
    /// would have to wait in a full queue is refused at once ([`PoolError::QueueFull`]).
    pub fn acquire(&self, request: &JobRequest, cancel: &CancelToken) -> Result<Permit, PoolError> {
        if cancel.is_cancelled() {
            self.shared.lock().counters.cancelled += 1;
            return Err(cancelled_error(request));
        }
        self.enqueue(request)?.wait(cancel)
    }

    /// Takes `request`'s place without blocking: a slot at once when one is free for its
    /// tenant, else a place in the queue (its queue timeout runs from now), else, when that
    /// queue is at its bound, [`PoolError::QueueFull`]. Wait on the [`Ticket`] for the slot;
    /// dropping it leaves the queue (or gives back a slot already granted).
    pub fn enqueue(&self, request: &JobRequest) -> Result<Ticket, PoolError> {
        Ticket::take(self, request)
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
