//! Scheduler tests. Synchronisation is by channels and `Pool::wait_for_stats` (a condvar
//! notified on every state change), never by sleeping; the only real timeouts are the queue
//! timeouts under test, whose assertions hold however late the waiter is scheduled.

use std::collections::HashMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};
use std::thread::{self, JoinHandle};
use std::time::Duration;

use super::*;

fn pool(max_concurrent: usize, per_tenant_max: Option<usize>) -> Pool {
    Pool::new(PoolConfig {
        max_concurrent,
        per_tenant_max,
        ..PoolConfig::default()
    })
    .expect("valid test config")
}

/// Receives the next event, failing the test instead of hanging if a wakeup was lost.
fn next<T>(events: &mpsc::Receiver<T>) -> T {
    events
        .recv_timeout(Duration::from_secs(10))
        .expect("event within 10 s (lost wakeup otherwise)")
}

fn hold(pool: &Pool, tenant: &str) -> Permit {
    let request = JobRequest::new(tenant).with_queue_timeout(Duration::ZERO);
    pool.acquire(&request, &CancelToken::new())
        .expect("a free slot for the test's holder")
}

/// A thread that queues for a slot, reports its label once admitted, and keeps the slot until
/// told to release it.
struct Holder {
    release: mpsc::Sender<()>,
    thread: JoinHandle<Result<(), PoolError>>,
}

impl Holder {
    fn spawn(
        pool: &Pool,
        request: JobRequest,
        label: &'static str,
        admitted: &mpsc::Sender<&'static str>,
    ) -> Self {
        let (release, released) = mpsc::channel::<()>();
        let (pool, admitted) = (pool.clone(), admitted.clone());
        let thread = thread::spawn(move || {
            let _permit = pool.acquire(&request, &CancelToken::new())?;
            admitted.send(label).expect("test still listening");
            let _ = released.recv();
            Ok(())
        });
        Self { release, thread }
    }

    fn release_and_join(self) {
        let _ = self.release.send(());
        self.thread
            .join()
            .expect("holder thread did not panic")
            .expect("holder was admitted");
    }
}

/// Fills a one-slot pool, queues `waiters` in the given order, then frees the slot one job at a
/// time and returns the labels in admission order.
fn admission_order(waiters: &[(&'static str, i32)]) -> Vec<&'static str> {
    let pool = pool(1, None);
    let blocker = hold(&pool, "blocker");
    let (admitted_tx, admitted) = mpsc::channel();
    let mut holders = HashMap::new();
    for (queued, (label, priority)) in waiters.iter().enumerate() {
        let request = JobRequest::new("t").with_priority(*priority);
        holders.insert(*label, Holder::spawn(&pool, request, label, &admitted_tx));
        pool.wait_for_stats(|stats| stats.queued == queued + 1);
    }
    drop(blocker);
    let mut order = Vec::new();
    for _ in waiters {
        let label = next(&admitted);
        assert_eq!(pool.stats().running, 1, "one-slot pool ran two jobs");
        order.push(label);
        let holder = holders.remove(label).expect("each waiter admitted once");
        holder.release_and_join();
    }
    order
}

#[test]
fn rejects_zero_caps() {
    let zero_global = PoolConfig {
        max_concurrent: 0,
        ..PoolConfig::default()
    };
    let zero_tenant = PoolConfig {
        per_tenant_max: Some(0),
        ..PoolConfig::default()
    };
    let zero_named_tenant = PoolConfig {
        tenants: [(
            "a".to_string(),
            TenantLimits {
                max_concurrent: Some(0),
                max_queued: None,
            },
        )]
        .into(),
        ..PoolConfig::default()
    };
    for config in [zero_global, zero_tenant, zero_named_tenant] {
        let error = Pool::new(config).expect_err("zero cap must be refused");
        assert!(matches!(error, PoolError::InvalidConfig(_)), "{error:?}");
        assert!(error.to_string().starts_with("invalid pool config: "));
    }
}

#[test]
fn default_config_has_one_slot_per_cpu() {
    let cpus = thread::available_parallelism().map_or(1, |n| n.get());
    let config = PoolConfig::default();
    assert_eq!(config.max_concurrent, cpus);
    assert_eq!(config.per_tenant_max, None);
    assert_eq!(config.queue_timeout, None);
    assert_eq!(Pool::default().stats().max_concurrent, cpus);
}

#[test]
fn global_cap_is_never_exceeded() {
    let pool = pool(2, None);
    let first = hold(&pool, "a");
    let _second = hold(&pool, "b");
    let try_now = JobRequest::new("c").with_queue_timeout(Duration::ZERO);
    let error = pool
        .acquire(&try_now, &CancelToken::new())
        .expect_err("third job over a cap of 2");
    assert!(
        matches!(error, PoolError::Busy { running: 2, .. }),
        "{error:?}"
    );
    assert_eq!(pool.stats().running, 2);

    drop(first);
    let third = pool.acquire(&try_now, &CancelToken::new());
    assert!(third.is_ok(), "a released slot is reusable: {third:?}");
}

#[test]
fn admits_highest_priority_first_fifo_within_priority() {
    let order = admission_order(&[("p1", 1), ("p5-first", 5), ("p3", 3), ("p5-second", 5)]);
    assert_eq!(order, ["p5-first", "p5-second", "p3", "p1"]);
}

#[test]
fn equal_priorities_are_admitted_in_arrival_order() {
    let order = admission_order(&[("w1", 0), ("w2", 0), ("w3", 0), ("w4", 0)]);
    assert_eq!(order, ["w1", "w2", "w3", "w4"]);
}

#[test]
fn tenant_at_its_cap_does_not_block_other_tenants_while_slots_are_free() {
    let pool = pool(2, Some(1));
    let a_running = hold(&pool, "a");
    let (admitted_tx, admitted) = mpsc::channel();
    let a_urgent = Holder::spawn(
        &pool,
        JobRequest::new("a").with_priority(10),
        "a",
        &admitted_tx,
    );
    pool.wait_for_stats(|stats| stats.queued == 1);

    let b_try_now = JobRequest::new("b").with_queue_timeout(Duration::ZERO);
    let b_permit = pool.acquire(&b_try_now, &CancelToken::new());
    assert!(
        b_permit.is_ok(),
        "tenant b blocked by tenant a's waiter: {b_permit:?}"
    );
    let stats = pool.stats();
    assert_eq!(
        stats.running_per_tenant,
        [("a".into(), 1), ("b".into(), 1)].into()
    );
    assert_eq!(stats.queued_per_tenant, [("a".into(), 1)].into());

    drop(b_permit);
    drop(a_running);
    assert_eq!(next(&admitted), "a");
    a_urgent.release_and_join();
}

#[test]
fn freed_slot_goes_to_best_waiter_whose_tenant_is_under_its_cap() {
    let pool = pool(2, Some(1));
    let a_running = hold(&pool, "a");
    let b_running = hold(&pool, "b");
    let (admitted_tx, admitted) = mpsc::channel();
    let a_urgent = Holder::spawn(
        &pool,
        JobRequest::new("a").with_priority(10),
        "a",
        &admitted_tx,
    );
    pool.wait_for_stats(|stats| stats.queued == 1);
    let c_lazy = Holder::spawn(
        &pool,
        JobRequest::new("c").with_priority(1),
        "c",
        &admitted_tx,
    );
    pool.wait_for_stats(|stats| stats.queued == 2);

    drop(b_running);
    assert_eq!(next(&admitted), "c", "a is at its cap, c must get b's slot");
    assert_eq!(pool.stats().queued_per_tenant, [("a".into(), 1)].into());

    drop(a_running);
    assert_eq!(next(&admitted), "a");
    a_urgent.release_and_join();
    c_lazy.release_and_join();
    assert_eq!(pool.stats().running, 0);
}

#[test]
fn queue_timeout_fails_with_busy() {
    let pool = pool(1, None);
    let _blocker = hold(&pool, "blocker");
    let timeout = Duration::from_millis(30);
    let request = JobRequest::new("late").with_queue_timeout(timeout);

    let error = pool
        .acquire(&request, &CancelToken::new())
        .expect_err("the only slot is never freed");
    let PoolError::Busy {
        tenant,
        waited,
        queued_ahead,
        running,
        max_concurrent,
    } = &error
    else {
        panic!("expected busy, got {error:?}");
    };
    assert_eq!(tenant, "late");
    assert!(*waited >= timeout, "gave up early after {waited:?}");
    assert_eq!((*queued_ahead, *running, *max_concurrent), (0, 1, 1));
    let message = error.to_string();
    assert!(
        message.starts_with("busy: job of tenant \"late\" got no slot within"),
        "{message}"
    );
    assert!(
        message.contains("(0 waiters ahead of it, 1 of 1 slots in use)"),
        "{message}"
    );

    let stats = pool.stats();
    assert_eq!((stats.rejected_busy, stats.queued), (1, 0));
}

#[test]
fn busy_reports_waiters_ahead_in_queue_order() {
    let pool = pool(1, None);
    let blocker = hold(&pool, "blocker");
    let (admitted_tx, admitted) = mpsc::channel();
    let ahead = Holder::spawn(
        &pool,
        JobRequest::new("x").with_priority(5),
        "x",
        &admitted_tx,
    );
    pool.wait_for_stats(|stats| stats.queued == 1);

    let queued_ahead = |priority| {
        let request = JobRequest::new("y")
            .with_priority(priority)
            .with_queue_timeout(Duration::from_millis(5));
        match pool.acquire(&request, &CancelToken::new()) {
            Err(PoolError::Busy { queued_ahead, .. }) => queued_ahead,
            other => panic!("expected busy, got {other:?}"),
        }
    };
    assert_eq!(queued_ahead(1), 1, "behind the priority-5 waiter");
    assert_eq!(queued_ahead(5), 1, "behind the earlier priority-5 waiter");
    assert_eq!(queued_ahead(9), 0, "ahead of the priority-5 waiter");

    drop(blocker);
    assert_eq!(next(&admitted), "x");
    ahead.release_and_join();
}

#[test]
fn request_timeout_overrides_pool_timeout() {
    let pool = Pool::new(PoolConfig {
        max_concurrent: 1,
        queue_timeout: Some(Duration::ZERO),
        ..PoolConfig::default()
    })
    .expect("valid config");
    let blocker = hold(&pool, "blocker");
    let pool_default = pool.acquire(&JobRequest::new("t"), &CancelToken::new());
    assert!(
        matches!(pool_default, Err(PoolError::Busy { .. })),
        "{pool_default:?}"
    );

    let (admitted_tx, admitted) = mpsc::channel();
    let patient = JobRequest::new("t").with_queue_timeout(Duration::from_secs(3600));
    let holder = Holder::spawn(&pool, patient, "patient", &admitted_tx);
    pool.wait_for_stats(|stats| stats.queued == 1);
    drop(blocker);
    assert_eq!(next(&admitted), "patient");
    holder.release_and_join();
}

#[test]
fn cancelling_a_queued_waiter_fails_it_and_frees_its_place() {
    let pool = pool(1, None);
    let blocker = hold(&pool, "blocker");
    let cancel = CancelToken::new();
    let cancelled_waiter = {
        let (pool, cancel) = (pool.clone(), cancel.clone());
        thread::spawn(move || {
            pool.acquire(&JobRequest::new("x").with_priority(5), &cancel)
                .map(drop)
        })
    };
    pool.wait_for_stats(|stats| stats.queued == 1);
    let (admitted_tx, admitted) = mpsc::channel();
    let behind = Holder::spawn(
        &pool,
        JobRequest::new("y").with_priority(1),
        "y",
        &admitted_tx,
    );
    pool.wait_for_stats(|stats| stats.queued == 2);

    cancel.cancel();
    let result = cancelled_waiter.join().expect("waiter did not panic");
    assert_eq!(result, Err(PoolError::Cancelled { tenant: "x".into() }));
    let stats = pool.stats();
    assert_eq!((stats.queued, stats.cancelled, stats.running), (1, 1, 1));

    drop(blocker);
    assert_eq!(next(&admitted), "y", "the cancelled waiter kept its place");
    behind.release_and_join();
}

#[test]
fn cancelled_token_is_never_admitted_even_with_free_slots() {
    let pool = pool(2, None);
    let cancel = CancelToken::new();
    cancel.cancel();
    let ran = pool.run(&JobRequest::new("t"), &cancel, |_| ());
    assert_eq!(ran, Err(PoolError::Cancelled { tenant: "t".into() }));
    assert_eq!(pool.stats().running, 0);
    assert!(PoolError::Cancelled { tenant: "t".into() }
        .to_string()
        .contains("cancelled while queued"));
}

#[test]
fn running_job_observes_cancellation_through_its_token() {
    let pool = pool(1, None);
    let cancel = CancelToken::new();
    let (started_tx, started) = mpsc::channel();
    let (killed_tx, killed) = mpsc::channel();
    let job = {
        let (pool, cancel) = (pool.clone(), cancel.clone());
        thread::spawn(move || {
            pool.run(&JobRequest::new("t"), &cancel, |token| {
                // Stands in for killing the sandboxed child.
                let _kill = token.on_cancel(move || killed_tx.send("killed").expect("listening"));
                started_tx.send(()).expect("listening");
                token.wait_cancelled();
                "stopped"
            })
        })
    };
    next(&started);
    assert!(
        killed.try_recv().is_err(),
        "kill callback ran before cancel"
    );
    cancel.cancel();
    assert_eq!(next(&killed), "killed");
    assert_eq!(job.join().expect("job did not panic"), Ok("stopped"));
    assert_eq!(pool.stats().running, 0);
}

#[test]
fn panicking_job_releases_its_slot() {
    let pool = pool(1, None);
    let outcome = catch_unwind(AssertUnwindSafe(|| {
        pool.run(&JobRequest::new("t"), &CancelToken::new(), |_| {
            panic!("job blew up")
        })
    }));
    assert!(outcome.is_err(), "the panic propagates to the caller");
    assert_eq!(pool.stats().running, 0);
    let _next = hold(&pool, "t");
}

#[test]
fn cancel_callbacks_run_once_and_only_while_registered() {
    let token = CancelToken::new();
    let calls = Arc::new(AtomicUsize::new(0));
    let counting = |calls: &Arc<AtomicUsize>| {
        let calls = Arc::clone(calls);
        move || {
            calls.fetch_add(1, Ordering::SeqCst);
        }
    };
    let kept = token.on_cancel(counting(&calls));
    drop(token.on_cancel(counting(&calls)));
    token.on_cancel(counting(&calls)).detach();
    assert!(!token.is_cancelled());

    token.clone().cancel();
    token.cancel();
    assert!(token.is_cancelled());
    assert_eq!(
        calls.load(Ordering::SeqCst),
        2,
        "kept + detached, each once"
    );

    let late = token.on_cancel(counting(&calls));
    assert_eq!(
        calls.load(Ordering::SeqCst),
        3,
        "runs at once on a cancelled token"
    );
    drop((kept, late));
}

#[test]
fn wait_cancelled_for_reports_whether_cancelled() {
    let token = CancelToken::new();
    assert!(!token.wait_cancelled_for(Duration::from_millis(1)));
    let canceller = {
        let token = token.clone();
        thread::spawn(move || token.cancel())
    };
    assert!(token.wait_cancelled_for(Duration::from_secs(10)));
    canceller.join().expect("canceller did not panic");
}

/// xorshift64*: deterministic, dependency-free randomness for the stress test.
struct Rng(u64);

impl Rng {
    fn below(&mut self, bound: u64) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) % bound
    }
}

struct ConcurrencyGauge {
    current: AtomicUsize,
    peak: AtomicUsize,
}

impl ConcurrencyGauge {
    fn new() -> Self {
        Self {
            current: AtomicUsize::new(0),
            peak: AtomicUsize::new(0),
        }
    }

    fn enter(&self) {
        let now = self.current.fetch_add(1, Ordering::SeqCst) + 1;
        self.peak.fetch_max(now, Ordering::SeqCst);
    }

    fn leave(&self) {
        self.current.fetch_sub(1, Ordering::SeqCst);
    }
}

#[test]
fn stress_many_threads_random_priorities_and_tenants() {
    const THREADS: usize = 16;
    const JOBS: usize = 10_000;
    const TENANTS: usize = 5;
    const MAX_CONCURRENT: usize = 4;
    const PER_TENANT_MAX: usize = 2;

    let pool = pool(MAX_CONCURRENT, Some(PER_TENANT_MAX));
    let runs: Arc<Vec<AtomicU8>> = Arc::new((0..JOBS).map(|_| AtomicU8::new(0)).collect());
    let global = Arc::new(ConcurrencyGauge::new());
    let tenants: Arc<Vec<ConcurrencyGauge>> =
        Arc::new((0..TENANTS).map(|_| ConcurrencyGauge::new()).collect());

    let (done_tx, done) = mpsc::channel();
    {
        let (pool, runs, global, tenants) =
            (pool.clone(), runs.clone(), global.clone(), tenants.clone());
        thread::spawn(move || {
            thread::scope(|scope| {
                for worker in 0..THREADS {
                    let (pool, runs, global, tenants) = (&pool, &runs, &global, &tenants);
                    scope.spawn(move || {
                        let mut rng = Rng(0x9e37_79b9_7f4a_7c15 ^ (worker as u64 + 1));
                        for job in (worker..JOBS).step_by(THREADS) {
                            let tenant = rng.below(TENANTS as u64) as usize;
                            let priority = rng.below(7) as i32 - 3;
                            let request =
                                JobRequest::new(format!("tenant-{tenant}")).with_priority(priority);
                            pool.run(&request, &CancelToken::new(), |_| {
                                global.enter();
                                tenants[tenant].enter();
                                runs[job].fetch_add(1, Ordering::SeqCst);
                                thread::yield_now();
                                tenants[tenant].leave();
                                global.leave();
                            })
                            .expect("no timeout, no cancel: every job runs");
                        }
                    });
                }
            });
            let _ = done_tx.send(());
        });
    }
    done.recv_timeout(Duration::from_secs(10))
        .expect("all jobs finish within 10 s (deadlock or lost wakeup otherwise)");

    let runs_per_job: Vec<u8> = runs
        .iter()
        .map(|runs| runs.load(Ordering::SeqCst))
        .collect();
    assert!(
        runs_per_job.iter().all(|&runs| runs == 1),
        "a job ran 0 or 2+ times"
    );
    let global_peak = global.peak.load(Ordering::SeqCst);
    assert!(
        global_peak <= MAX_CONCURRENT,
        "global cap exceeded: {global_peak}"
    );
    for (tenant, gauge) in tenants.iter().enumerate() {
        let peak = gauge.peak.load(Ordering::SeqCst);
        assert!(
            peak <= PER_TENANT_MAX,
            "tenant {tenant} cap exceeded: {peak}"
        );
    }
    let stats = pool.stats();
    assert_eq!((stats.running, stats.queued), (0, 0));
    assert_eq!(stats.admitted_total, JOBS as u64);
    assert!(stats.running_per_tenant.is_empty() && stats.queued_per_tenant.is_empty());
}

fn with_tenants(
    max_concurrent: usize,
    max_queued: Option<usize>,
    tenants: &[(&str, TenantLimits)],
) -> Pool {
    Pool::new(PoolConfig {
        max_concurrent,
        max_queued,
        tenants: tenants
            .iter()
            .map(|(name, limits)| (name.to_string(), *limits))
            .collect(),
        ..PoolConfig::default()
    })
    .expect("valid test config")
}

fn limits(max_concurrent: Option<usize>, max_queued: Option<usize>) -> TenantLimits {
    TenantLimits {
        max_concurrent,
        max_queued,
    }
}

/// Tenants with different shares in one pool: each runs up to its own cap, the others take
/// the free slots, and a tenant without its own limits has the pool's (none here).
#[test]
fn each_tenant_runs_up_to_its_own_cap() {
    let pool = with_tenants(
        4,
        None,
        &[
            ("small", limits(Some(1), None)),
            ("big", limits(Some(2), None)),
        ],
    );
    let _small = hold(&pool, "small");
    let blocked = pool.enqueue(&JobRequest::new("small")).expect("may queue");
    assert!(!blocked.is_granted(), "small is at its cap of 1");
    let _big = [hold(&pool, "big"), hold(&pool, "big")];
    let third_big = pool.enqueue(&JobRequest::new("big")).expect("may queue");
    assert!(!third_big.is_granted(), "big is at its cap of 2");
    let _other = hold(&pool, "other");
    let stats = pool.stats();
    assert_eq!((stats.running, stats.queued), (4, 2), "{stats:?}");
}

/// A bounded queue refuses at once, naming which bound; a free slot is still taken.
#[test]
fn a_full_queue_refuses_at_once() {
    let pool = with_tenants(1, Some(2), &[("a", limits(None, Some(1)))]);
    let _running = hold(&pool, "b");
    let _a = pool
        .enqueue(&JobRequest::new("a"))
        .expect("a's first waiter");
    let refused = pool
        .enqueue(&JobRequest::new("a"))
        .expect_err("a's queue holds 1");
    assert!(
        matches!(
            refused,
            PoolError::QueueFull {
                scope: QueueScope::Tenant,
                queued: 1,
                max_queued: 1,
                ..
            }
        ),
        "{refused:?}"
    );
    let _b = pool
        .enqueue(&JobRequest::new("b"))
        .expect("the pool's queue has room for 2");
    let refused = pool
        .acquire(&JobRequest::new("c"), &CancelToken::new())
        .expect_err("full");
    assert!(
        matches!(
            refused,
            PoolError::QueueFull {
                scope: QueueScope::Pool,
                queued: 2,
                max_queued: 2,
                ..
            }
        ),
        "{refused:?}"
    );
    assert!(refused.to_string().contains("queue full"), "{refused}");
    let stats = pool.stats();
    assert_eq!((stats.queued, stats.rejected_full), (2, 2), "{stats:?}");
}

/// A ticket keeps its place from `enqueue` (arrival order is the enqueue's), is waited on
/// from another thread, and gives its place or its slot back when dropped.
#[test]
fn a_ticket_waits_later_and_gives_back_what_it_holds() {
    let pool = pool(1, None);
    let blocker = hold(&pool, "t");
    let first = pool.enqueue(&JobRequest::new("t")).expect("queued");
    let second = pool.enqueue(&JobRequest::new("t")).expect("queued");
    drop(first);
    assert_eq!(pool.stats().queued, 1, "a dropped ticket leaves the queue");
    let waiting = thread::spawn(move || {
        second
            .wait(&CancelToken::new())
            .map(|p| p.tenant().to_string())
    });
    pool.wait_for_stats(|stats| stats.queued == 1);
    drop(blocker);
    assert_eq!(waiting.join().expect("no panic").expect("admitted"), "t");
    let granted = pool.enqueue(&JobRequest::new("t")).expect("a free slot");
    assert!(granted.is_granted());
    assert_eq!(pool.stats().running, 1);
    drop(granted);
    assert_eq!(
        pool.stats().running,
        0,
        "a dropped granted ticket gives its slot back"
    );
    let queued = {
        let _holder = hold(&pool, "t");
        let queued = pool.enqueue(&JobRequest::new("t")).expect("queued");
        assert!(!queued.is_granted());
        queued
    };
    assert!(queued.is_granted(), "granted when the holder left");
    drop(queued);
    let stats = pool.stats();
    assert_eq!((stats.running, stats.queued), (0, 0), "{stats:?}");
}

/// The queue timeout of a ticket runs from `enqueue`, not from `wait`.
#[test]
fn a_tickets_queue_timeout_runs_from_enqueue() {
    let pool = pool(1, None);
    let _blocker = hold(&pool, "t");
    let ticket = pool
        .enqueue(&JobRequest::new("t").with_queue_timeout(Duration::from_millis(50)))
        .expect("queued");
    thread::sleep(Duration::from_millis(60));
    let started = std::time::Instant::now();
    let error = ticket
        .wait(&CancelToken::new())
        .expect_err("timed out already");
    assert!(matches!(error, PoolError::Busy { .. }), "{error:?}");
    assert!(
        started.elapsed() < Duration::from_millis(40),
        "waited again"
    );
}
