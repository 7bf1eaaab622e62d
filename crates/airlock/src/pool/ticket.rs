//! A place in a pool's line, taken without blocking ([`Pool::enqueue`]) and waited on later
//! ([`Ticket::wait`]), so a server can answer "queued" or "queue full" at once and block for
//! the slot on another thread. [`Pool::acquire`] is the two in one call.

use std::sync::{Arc, PoisonError};
use std::time::Instant;

use super::admission::{Admission, QueueKey, Waiter};
use super::{CancelToken, JobRequest, Permit, Pool, PoolError, Shared};

/// A request's place in a [`Pool`]: a slot granted at once, or a place in the queue. Dropping
/// it leaves the queue, or gives back a slot granted meanwhile.
#[must_use = "dropping the ticket leaves the queue at once"]
pub struct Ticket {
    shared: Arc<Shared>,
    tenant: Arc<str>,
    /// `None` once the ticket became a permit or gave up its place.
    place: Option<Place>,
    started: Instant,
    deadline: Option<Instant>,
}

enum Place {
    Granted,
    /// Queued; the waiter's flag says when a slot was granted to it.
    Queued {
        key: QueueKey,
        waiter: Arc<Waiter>,
    },
}

impl Ticket {
    pub(super) fn take(pool: &Pool, request: &JobRequest) -> Result<Ticket, PoolError> {
        let started = Instant::now();
        let shared = Arc::clone(&pool.shared);
        let deadline = request
            .queue_timeout
            .or(shared.config.queue_timeout)
            .and_then(|timeout| started.checked_add(timeout));
        let mut admission = shared.lock();
        let (tenant, place) = match admission.try_admit_now(&request.tenant) {
            Some(tenant) => (tenant, Place::Granted),
            None => {
                if let Err((scope, queued, max_queued)) = admission.room_to_wait(&request.tenant) {
                    admission.counters.rejected_full += 1;
                    return Err(PoolError::QueueFull {
                        tenant: request.tenant.clone(),
                        scope,
                        queued,
                        max_queued,
                    });
                }
                let waiter = Waiter::new();
                let (key, tenant) =
                    admission.enqueue(&request.tenant, request.priority, Arc::clone(&waiter));
                (tenant, Place::Queued { key, waiter })
            }
        };
        drop(admission);
        shared.notify_observers();
        Ok(Ticket {
            shared,
            tenant,
            place: Some(place),
            started,
            deadline,
        })
    }

    /// Whether a slot is already granted (`wait` then returns at once).
    pub fn is_granted(&self) -> bool {
        match &self.place {
            Some(Place::Granted) => true,
            Some(Place::Queued { waiter, .. }) => {
                let _admission = self.shared.lock();
                waiter.is_granted()
            }
            None => false,
        }
    }

    /// Blocks until the slot is granted, `cancel` is cancelled ([`PoolError::Cancelled`]; a
    /// grant racing with the cancel wins), or the queue timeout, counted from
    /// [`Pool::enqueue`], passes ([`PoolError::Busy`]).
    pub fn wait(mut self, cancel: &CancelToken) -> Result<Permit, PoolError> {
        let (key, waiter) = match self.place.take() {
            Some(Place::Queued { key, waiter }) => (key, waiter),
            _ => return Ok(self.permit()),
        };
        // Registered before the checks below, and the callback takes the pool lock before
        // notifying, so a cancel racing with them is always seen (flag) or heard (notify).
        let _cancel_wakeup = cancel.on_cancel({
            let shared = Arc::clone(&self.shared);
            let waiter = Arc::clone(&waiter);
            move || {
                let _admission = shared.lock();
                waiter.wakeup.notify_one();
            }
        });
        let mut admission = self.shared.lock();
        loop {
            if waiter.is_granted() {
                drop(admission);
                return Ok(self.permit());
            }
            if cancel.is_cancelled() {
                admission.withdraw(&self.tenant, key);
                admission.counters.cancelled += 1;
                drop(admission);
                self.shared.notify_observers();
                return Err(PoolError::Cancelled {
                    tenant: self.tenant.to_string(),
                });
            }
            admission = match self.deadline {
                None => waiter
                    .wakeup
                    .wait(admission)
                    .unwrap_or_else(PoisonError::into_inner),
                Some(deadline) => {
                    let now = Instant::now();
                    if now >= deadline {
                        let error = self.busy_error(&mut admission, key);
                        admission.withdraw(&self.tenant, key);
                        drop(admission);
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

    fn permit(&self) -> Permit {
        Permit {
            shared: Arc::clone(&self.shared),
            tenant: Arc::clone(&self.tenant),
        }
    }

    fn busy_error(&self, admission: &mut Admission, key: QueueKey) -> PoolError {
        admission.counters.rejected_busy += 1;
        PoolError::Busy {
            tenant: self.tenant.to_string(),
            waited: self.started.elapsed(),
            queued_ahead: admission.queued_ahead(key),
            running: admission.running(),
            max_concurrent: admission.max_concurrent(),
        }
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        let Some(place) = self.place.take() else {
            return;
        };
        let mut admission = self.shared.lock();
        match place {
            Place::Queued { key, waiter } if !waiter.is_granted() => {
                admission.withdraw(&self.tenant, key);
            }
            _ => admission.release(&self.tenant),
        }
        drop(admission);
        self.shared.notify_observers();
    }
}

impl std::fmt::Debug for Ticket {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ticket")
            .field("tenant", &self.tenant)
            .field("queued", &matches!(self.place, Some(Place::Queued { .. })))
            .finish_non_exhaustive()
    }
}
