//! Admission through the library's pool: one pool per node with the global cap and the node's
//! queue bound (`pool.max_queued`), and each tenant's concurrency share and queue bound as
//! its own limits in that pool. Runs are admitted by priority, then arrival, among those whose
//! tenant is under its share, so a tenant at its share never blocks another tenant's run.
//!
//! A run takes its place when it is submitted ([`Admission::enqueue`]): a full queue is
//! refused with 429 at once, and the run's thread waits on the ticket.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use airlock::pool::{JobRequest, Pool, PoolConfig, PoolError, PoolStats, TenantLimits, Ticket};

use crate::error::ApiError;
use crate::tenant::Tenant;

/// The node's admission state.
#[derive(Debug)]
pub struct Admission {
    pool: Pool,
    /// A moving average of run durations, for `Retry-After`.
    mean_run_ms: AtomicU64,
}

impl Admission {
    pub fn new(
        max_concurrent: usize,
        max_queued: usize,
        tenants: &[Arc<Tenant>],
    ) -> Arc<Admission> {
        let tenants = tenants
            .iter()
            .map(|t| {
                let limits = TenantLimits {
                    max_concurrent: Some(t.share.max(1)),
                    max_queued: Some(t.max_queued),
                };
                (t.name.clone(), limits)
            })
            .collect();
        let pool = Pool::new(PoolConfig {
            max_concurrent,
            max_queued: Some(max_queued),
            tenants,
            ..PoolConfig::default()
        })
        .expect("the configuration checks caps and shares to be at least 1");
        Arc::new(Admission {
            pool,
            mean_run_ms: AtomicU64::new(1000),
        })
    }

    /// Takes the run's place: a slot at once, a place in the queue (whose timeout runs from
    /// now), or 429 when the node's or the tenant's queue is full.
    pub fn enqueue(
        &self,
        tenant: &Tenant,
        priority: i32,
        queue_timeout: Duration,
    ) -> Result<Ticket, ApiError> {
        let request = JobRequest::new(tenant.name.clone())
            .with_priority(priority)
            .with_queue_timeout(queue_timeout);
        self.pool.enqueue(&request).map_err(|e| match e {
            PoolError::QueueFull { .. } => ApiError::new(
                axum::http::StatusCode::TOO_MANY_REQUESTS,
                "queue_full",
                e.to_string(),
                "retry after the time in Retry-After, lower your request rate, or have an operator raise pool.max_queued / tenants.max_queued",
            )
            .with_retry_after(self.retry_after()),
            other => ApiError::internal("cannot queue the run", other),
        })
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
        let stats = self.pool.stats();
        let mean = self.mean_run_ms.load(Ordering::Relaxed);
        let seconds =
            (stats.queued as u64 + 1) * mean / (stats.max_concurrent.max(1) as u64 * 1000);
        seconds.clamp(1, 300)
    }

    /// Running and queued runs, per tenant too.
    pub fn stats(&self) -> PoolStats {
        self.pool.stats()
    }
}
