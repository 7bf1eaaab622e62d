//! Admission through the library's pool: a run first takes a slot of its tenant's own pool
//! (its concurrency share, in priority order among that tenant's runs), then a slot of the
//! node's pool (the global cap, in priority order across tenants). A run waiting for its
//! tenant's share is not in the global queue, so it never blocks another tenant's run.
//!
//! The pool has no bound on its queue, so the daemon counts waiting runs itself: beyond
//! `pool.max_queued` (or the tenant's `max_queued`) a request is refused with 429 at once.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use airlock::pool::{CancelToken, JobRequest, Permit, Pool, PoolConfig, PoolError, PoolStats};

use crate::error::ApiError;
use crate::tenant::Tenant;

/// The node's admission state.
#[derive(Debug)]
pub struct Admission {
    global: Pool,
    tenants: Mutex<HashMap<String, Pool>>,
    waiting: AtomicUsize,
    waiting_per_tenant: Mutex<HashMap<String, usize>>,
    max_queued: usize,
    /// A moving average of run durations, for `Retry-After`.
    mean_run_ms: AtomicU64,
}

/// A place in the queue; gives it back when dropped.
#[derive(Debug)]
pub struct QueueTicket {
    admission: Arc<Admission>,
    tenant: String,
}

/// Both slots a running run holds.
#[derive(Debug)]
pub struct Slots {
    _tenant: Permit,
    _global: Permit,
}

impl Admission {
    pub fn new(max_concurrent: usize, max_queued: usize) -> Arc<Admission> {
        let global = Pool::new(PoolConfig {
            max_concurrent,
            per_tenant_max: None,
            queue_timeout: None,
        })
        .expect("max_concurrent is checked to be at least 1");
        Arc::new(Admission {
            global,
            tenants: Mutex::new(HashMap::new()),
            waiting: AtomicUsize::new(0),
            waiting_per_tenant: Mutex::new(HashMap::new()),
            max_queued,
            mean_run_ms: AtomicU64::new(1000),
        })
    }

    /// Takes a place in the queue, or refuses with 429 when the node's or the tenant's queue
    /// is full.
    pub fn reserve(self: &Arc<Self>, tenant: &Tenant) -> Result<QueueTicket, ApiError> {
        let mut per_tenant = self
            .waiting_per_tenant
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let mine = per_tenant.get(&tenant.name).copied().unwrap_or(0);
        let total = self.waiting.load(Ordering::Relaxed);
        if total >= self.max_queued || mine >= tenant.max_queued {
            let (scope, limit) = if mine >= tenant.max_queued {
                (format!("tenant {:?}", tenant.name), tenant.max_queued)
            } else {
                ("this node".to_string(), self.max_queued)
            };
            return Err(ApiError::new(
                axum::http::StatusCode::TOO_MANY_REQUESTS,
                "queue_full",
                format!("the queue of {scope} is full ({limit} runs waiting)"),
                "retry after the time in Retry-After, lower your request rate, or have an operator raise pool.max_queued / tenants.max_queued",
            )
            .with_retry_after(self.retry_after()));
        }
        per_tenant.insert(tenant.name.clone(), mine + 1);
        self.waiting.fetch_add(1, Ordering::Relaxed);
        Ok(QueueTicket {
            admission: Arc::clone(self),
            tenant: tenant.name.clone(),
        })
    }

    /// Blocks until the run holds both slots, is cancelled, or `timeout` passes.
    pub fn acquire(
        &self,
        ticket: QueueTicket,
        tenant: &Tenant,
        priority: i32,
        cancel: &CancelToken,
        timeout: Duration,
    ) -> Result<Slots, PoolError> {
        let started = Instant::now();
        let tenant_pool = self.tenant_pool(tenant);
        let request = JobRequest::new(tenant.name.clone())
            .with_priority(priority)
            .with_queue_timeout(timeout);
        let tenant_permit = tenant_pool.acquire(&request, cancel)?;
        let left = timeout.saturating_sub(started.elapsed());
        let global_permit = self
            .global
            .acquire(&request.clone().with_queue_timeout(left), cancel)?;
        drop(ticket);
        Ok(Slots {
            _tenant: tenant_permit,
            _global: global_permit,
        })
    }

    fn tenant_pool(&self, tenant: &Tenant) -> Pool {
        let mut pools = self.tenants.lock().unwrap_or_else(PoisonError::into_inner);
        pools
            .entry(tenant.name.clone())
            .or_insert_with(|| {
                Pool::new(PoolConfig {
                    max_concurrent: tenant.share.max(1),
                    per_tenant_max: None,
                    queue_timeout: None,
                })
                .expect("a share is at least 1")
            })
            .clone()
    }

    /// Counts a finished run's duration into the average behind `Retry-After`.
    pub fn observe_run(&self, wall: Duration) {
        let sample = wall.as_millis() as u64;
        let old = self.mean_run_ms.load(Ordering::Relaxed);
        self.mean_run_ms
            .store((old * 7 + sample) / 8, Ordering::Relaxed);
    }

    /// Seconds until a slot is likely free: the queue ahead, served at the cap's pace.
    pub fn retry_after(&self) -> u64 {
        let stats = self.global.stats();
        let waiting = self.waiting.load(Ordering::Relaxed) as u64;
        let mean = self.mean_run_ms.load(Ordering::Relaxed);
        let seconds = (waiting + 1) * mean / (stats.max_concurrent.max(1) as u64 * 1000);
        seconds.clamp(1, 300)
    }

    /// Runs waiting for a slot on this node.
    pub fn waiting(&self) -> usize {
        self.waiting.load(Ordering::Relaxed)
    }

    pub fn waiting_per_tenant(&self) -> HashMap<String, usize> {
        self.waiting_per_tenant
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    pub fn global_stats(&self) -> PoolStats {
        self.global.stats()
    }
}

impl Drop for QueueTicket {
    fn drop(&mut self) {
        let mut per_tenant = self
            .admission
            .waiting_per_tenant
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(count) = per_tenant.get_mut(&self.tenant) {
            *count -= 1;
            if *count == 0 {
                per_tenant.remove(&self.tenant);
            }
        }
        self.admission.waiting.fetch_sub(1, Ordering::Relaxed);
    }
}
