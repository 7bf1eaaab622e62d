//! Measures the job pool's scheduling overhead: acquire + release of no-op jobs.
//!
//! Wall time per job is what a caller sees; CPU time per job (user + system time of the whole
//! process, all threads) is what the scheduling costs, and stays meaningful on a loaded machine.
//!
//! Run with `cargo run --release -p airlock --example pool_overhead [jobs_per_scenario]`.

use std::thread;
use std::time::{Duration, Instant};

use airlock::pool::{CancelToken, JobRequest, Pool, PoolConfig};

const TENANTS: usize = 4;

struct Scenario {
    name: &'static str,
    threads: usize,
    config: PoolConfig,
}

fn main() {
    let jobs: usize = std::env::args()
        .nth(1)
        .map(|arg| arg.parse().expect("jobs_per_scenario must be a number"))
        .unwrap_or(400_000);
    let cpus = thread::available_parallelism().map_or(1, |n| n.get());
    println!("pool scheduling overhead, {jobs} no-op jobs per scenario, {cpus} CPUs");
    println!(
        "{:<42} {:>7} {:>10} {:>11} {:>10}",
        "scenario", "threads", "jobs/s", "wall ns/job", "cpu ns/job"
    );
    for scenario in scenarios(cpus) {
        let cpu_before = process_cpu_time();
        let elapsed = run_scenario(&scenario, jobs);
        let cpu = process_cpu_time().saturating_sub(cpu_before);
        let per_job = |time: Duration| time.as_nanos() as f64 / jobs as f64;
        println!(
            "{:<42} {:>7} {:>10.0} {:>11.0} {:>10.0}",
            scenario.name,
            scenario.threads,
            jobs as f64 / elapsed.as_secs_f64(),
            per_job(elapsed),
            per_job(cpu)
        );
    }
}

fn scenarios(cpus: usize) -> Vec<Scenario> {
    let config = |per_tenant_max| PoolConfig {
        max_concurrent: cpus,
        per_tenant_max,
        ..PoolConfig::default()
    };
    vec![
        Scenario {
            name: "1 thread, cap = CPUs",
            threads: 1,
            config: config(None),
        },
        Scenario {
            name: "threads = cap (never queues)",
            threads: cpus,
            config: config(None),
        },
        Scenario {
            name: "16 threads, cap = CPUs (queues)",
            threads: 16,
            config: config(None),
        },
        Scenario {
            name: "16 threads, cap = CPUs, tenant cap 1",
            threads: 16,
            config: config(Some(1)),
        },
    ]
}

/// Runs `jobs` no-op jobs spread over the scenario's threads with varied priorities and tenants,
/// returning the wall time.
fn run_scenario(scenario: &Scenario, jobs: usize) -> Duration {
    let pool = Pool::new(scenario.config.clone()).expect("valid benchmark config");
    let requests: Vec<JobRequest> = (0..TENANTS * 3)
        .map(|i| {
            JobRequest::new(format!("tenant-{}", i % TENANTS)).with_priority((i / TENANTS) as i32)
        })
        .collect();
    let started = Instant::now();
    thread::scope(|scope| {
        for worker in 0..scenario.threads {
            let (pool, requests) = (&pool, &requests);
            scope.spawn(move || {
                let cancel = CancelToken::new();
                for job in (worker..jobs).step_by(scenario.threads) {
                    let request = &requests[job % requests.len()];
                    pool.run(request, &cancel, |_| ())
                        .expect("no timeout, no cancel");
                }
            });
        }
    });
    let elapsed = started.elapsed();
    assert_eq!(pool.stats().admitted_total, jobs as u64);
    elapsed
}

#[cfg(target_os = "linux")]
fn process_cpu_time() -> Duration {
    use nix::sys::resource::{getrusage, UsageWho};
    let usage = getrusage(UsageWho::RUSAGE_SELF).expect("getrusage of this process");
    let to_duration = |time: nix::sys::time::TimeVal| {
        Duration::new(time.tv_sec() as u64, time.tv_usec() as u32 * 1000)
    };
    to_duration(usage.user_time()) + to_duration(usage.system_time())
}

#[cfg(not(target_os = "linux"))]
fn process_cpu_time() -> Duration {
    Duration::ZERO
}
