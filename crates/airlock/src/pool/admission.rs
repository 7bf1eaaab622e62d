//! The admission state machine: who holds a slot, who waits, and who is admitted next.
//!
//! Everything here runs under the pool's single mutex. The invariant kept after every public
//! method returns: every queued waiter is blocked, either because all global slots are taken or
//! because its tenant holds its cap (its own `max_concurrent`, else `per_tenant_max`). Hence a
//! newcomer that finds room for itself may take it at once without overtaking anyone who could
//! have run.

use std::cmp::Reverse;
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar};

use super::{PoolConfig, PoolStats, QueueScope, TenantLimits};

/// Queue order: higher priority first, then arrival order.
pub(super) type QueueKey = (Reverse<i32>, u64);

/// One blocked `acquire` call. `granted` is only written under the pool mutex; the waiter reads
/// it under the same mutex, so a grant can neither be lost nor given twice.
pub(super) struct Waiter {
    granted: AtomicBool,
    pub(super) wakeup: Condvar,
}

impl Waiter {
    pub(super) fn new() -> Arc<Self> {
        Arc::new(Self {
            granted: AtomicBool::new(false),
            wakeup: Condvar::new(),
        })
    }

    pub(super) fn is_granted(&self) -> bool {
        self.granted.load(Ordering::Relaxed)
    }

    fn grant(&self) {
        self.granted.store(true, Ordering::Relaxed);
        self.wakeup.notify_one();
    }
}

#[derive(Default)]
struct TenantSlots {
    running: usize,
    waiting: BTreeMap<QueueKey, Arc<Waiter>>,
}

#[derive(Default)]
pub(super) struct Counters {
    pub(super) admitted_total: u64,
    pub(super) rejected_busy: u64,
    pub(super) rejected_full: u64,
    pub(super) cancelled: u64,
}

/// Why a request may not wait: the queue that is full, how many wait in it, and its bound.
pub(super) type QueueFull = (QueueScope, usize, usize);

pub(super) struct Admission {
    max_concurrent: usize,
    per_tenant_max: Option<usize>,
    max_queued: Option<usize>,
    limits: BTreeMap<String, TenantLimits>,
    running: usize,
    queued: usize,
    next_seq: u64,
    // Entries exist only while the tenant runs or waits, so the map stays as small as the load.
    tenants: HashMap<Arc<str>, TenantSlots>,
    pub(super) counters: Counters,
}

impl Admission {
    pub(super) fn new(config: &PoolConfig) -> Self {
        Self {
            max_concurrent: config.max_concurrent,
            per_tenant_max: config.per_tenant_max,
            max_queued: config.max_queued,
            limits: config.tenants.clone(),
            running: 0,
            queued: 0,
            next_seq: 0,
            tenants: HashMap::new(),
            counters: Counters::default(),
        }
    }

    pub(super) fn running(&self) -> usize {
        self.running
    }

    pub(super) fn max_concurrent(&self) -> usize {
        self.max_concurrent
    }

    /// Takes a slot for `tenant` if one is free for it right now (the queue invariant makes that
    /// fair), returning the tenant's shared name for the permit.
    pub(super) fn try_admit_now(&mut self, tenant: &str) -> Option<Arc<str>> {
        if self.running >= self.max_concurrent {
            return None;
        }
        let tenant_running = self.tenants.get(tenant).map_or(0, |slots| slots.running);
        if !self.tenant_has_room(tenant, tenant_running) {
            return None;
        }
        let name = self.tenant_entry(tenant);
        if let Some(slots) = self.tenants.get_mut(&name) {
            slots.running += 1;
        }
        self.running += 1;
        self.counters.admitted_total += 1;
        Some(name)
    }

    /// Whether a request of `tenant` may join the queue, or which bound it would pass.
    pub(super) fn room_to_wait(&self, tenant: &str) -> Result<(), QueueFull> {
        if let Some(max) = self.max_queued.filter(|max| self.queued >= *max) {
            return Err((QueueScope::Pool, self.queued, max));
        }
        let waiting = self
            .tenants
            .get(tenant)
            .map_or(0, |slots| slots.waiting.len());
        let tenant_max = self.limits.get(tenant).and_then(|l| l.max_queued);
        match tenant_max.filter(|max| waiting >= *max) {
            Some(max) => Err((QueueScope::Tenant, waiting, max)),
            None => Ok(()),
        }
    }

    /// Queues `waiter`, then admits whoever can run (possibly `waiter` itself).
    pub(super) fn enqueue(
        &mut self,
        tenant: &str,
        priority: i32,
        waiter: Arc<Waiter>,
    ) -> (QueueKey, Arc<str>) {
        let key = (Reverse(priority), self.next_seq);
        self.next_seq += 1;
        let name = self.tenant_entry(tenant);
        if let Some(slots) = self.tenants.get_mut(&name) {
            slots.waiting.insert(key, waiter);
        }
        self.queued += 1;
        self.admit_waiters();
        (key, name)
    }

    /// Removes a waiter that gave up (timed out or cancelled). Removing a blocked waiter frees
    /// nothing, so no one else becomes admissible.
    pub(super) fn withdraw(&mut self, tenant: &str, key: QueueKey) {
        let Some(slots) = self.tenants.get_mut(tenant) else {
            return;
        };
        if slots.waiting.remove(&key).is_some() {
            self.queued -= 1;
        }
        self.forget_idle_tenant(tenant);
    }

    /// Number of queued waiters that would be admitted before the one at `key`.
    pub(super) fn queued_ahead(&self, key: QueueKey) -> usize {
        self.tenants
            .values()
            .map(|slots| slots.waiting.range(..key).count())
            .sum()
    }

    /// Returns a slot of `tenant` and hands freed capacity to the waiters that may now run.
    pub(super) fn release(&mut self, tenant: &str) {
        if let Some(slots) = self.tenants.get_mut(tenant) {
            slots.running -= 1;
            self.running -= 1;
        }
        self.forget_idle_tenant(tenant);
        self.admit_waiters();
    }

    /// Admits, best first, every waiter whose tenant is under its cap while global slots last.
    fn admit_waiters(&mut self) {
        while self.running < self.max_concurrent {
            let Some(tenant) = self.best_admissible_tenant() else {
                break;
            };
            let Some(slots) = self.tenants.get_mut(&tenant) else {
                break;
            };
            let Some((_, waiter)) = slots.waiting.pop_first() else {
                break;
            };
            slots.running += 1;
            self.running += 1;
            self.queued -= 1;
            self.counters.admitted_total += 1;
            waiter.grant();
        }
    }

    /// The tenant under its cap whose first waiter comes first in queue order. Each tenant's
    /// queue is ordered, so comparing heads is enough: O(tenants) per admission.
    fn best_admissible_tenant(&self) -> Option<Arc<str>> {
        self.tenants
            .iter()
            .filter(|(name, slots)| self.tenant_has_room(name, slots.running))
            .filter_map(|(name, slots)| slots.waiting.keys().next().map(|key| (*key, name)))
            .min_by_key(|(key, _)| *key)
            .map(|(_, name)| Arc::clone(name))
    }

    fn tenant_has_room(&self, tenant: &str, tenant_running: usize) -> bool {
        let own = self.limits.get(tenant).and_then(|l| l.max_concurrent);
        own.or(self.per_tenant_max)
            .is_none_or(|cap| tenant_running < cap)
    }

    fn tenant_entry(&mut self, tenant: &str) -> Arc<str> {
        if let Some((name, _)) = self.tenants.get_key_value(tenant) {
            return Arc::clone(name);
        }
        let name: Arc<str> = Arc::from(tenant);
        self.tenants
            .insert(Arc::clone(&name), TenantSlots::default());
        name
    }

    fn forget_idle_tenant(&mut self, tenant: &str) {
        let idle = self
            .tenants
            .get(tenant)
            .is_some_and(|slots| slots.running == 0 && slots.waiting.is_empty());
        if idle {
            self.tenants.remove(tenant);
        }
    }

    pub(super) fn stats(&self) -> PoolStats {
        let per_tenant = |count: fn(&TenantSlots) -> usize| {
            self.tenants
                .iter()
                .map(|(name, slots)| (name.to_string(), count(slots)))
                .filter(|(_, count)| *count > 0)
                .collect()
        };
        PoolStats {
            max_concurrent: self.max_concurrent,
            per_tenant_max: self.per_tenant_max,
            running: self.running,
            running_per_tenant: per_tenant(|slots| slots.running),
            queued: self.queued,
            queued_per_tenant: per_tenant(|slots| slots.waiting.len()),
            admitted_total: self.counters.admitted_total,
            rejected_busy: self.counters.rejected_busy,
            rejected_full: self.counters.rejected_full,
            cancelled: self.counters.cancelled,
        }
    }
}
