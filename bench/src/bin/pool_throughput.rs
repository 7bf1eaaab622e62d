//! Sandboxed `/bin/true` runs per second with airlock's pool saturated, and the pool's own
//! scheduling cost per job, measured in one process:
//! `cargo run --release -p airlock-bench --bin pool-throughput -- --jobs 300`.

use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use airlock::pool::{CancelToken, JobRequest, Pool, PoolConfig};
use airlock::{RunStatus, Sandbox, SandboxOptions};
use clap::Parser;

#[derive(Parser, Debug)]
struct Args {
    /// Sandboxed runs per configuration.
    #[arg(long, default_value_t = 300)]
    jobs: usize,
    /// Submitting threads (more than the pool's slots, so it stays saturated).
    #[arg(long, default_value_t = 8)]
    threads: usize,
    /// The airlock binary used as the init (default: the workspace's release build).
    #[arg(long)]
    airlock: Option<PathBuf>,
}

fn main() {
    let args = Args::parse();
    let init = args.airlock.clone().unwrap_or_else(|| {
        PathBuf::from(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../target/release/airlock"
        ))
    });
    let pool = Pool::new(PoolConfig::default()).expect("pool");
    println!(
        "pool: {} slots (CPUs), {} submitting threads, {} jobs per row",
        pool.config().max_concurrent,
        args.threads,
        args.jobs
    );
    println!(
        "{:<28} {:>10} {:>12} {:>8}",
        "configuration", "runs/s", "ms per run", "failed"
    );
    for (name, profile, no_cgroup) in [
        ("none (Tier 0)", "trusted", false),
        ("native untrusted", "untrusted", false),
        ("native --no-cgroup", "untrusted", true),
    ] {
        let options = SandboxOptions {
            init_program: Some(init.clone()),
            no_cgroup,
            ..SandboxOptions::default()
        };
        let sandbox = Arc::new(
            Sandbox::with_options(
                airlock::policy::load_profile(profile).expect("profile"),
                options,
            )
            .expect("sandbox"),
        );
        let (elapsed, failed) = saturate(&pool, args.threads, args.jobs, move || {
            let result = sandbox.command("/bin/true").discard_output().run();
            result
                .map(|r| r.status == RunStatus::Exited && r.exit_code == Some(0))
                .unwrap_or(false)
        });
        let rate = args.jobs as f64 / elapsed.as_secs_f64();
        println!(
            "{name:<28} {rate:>10.1} {:>12.2} {failed:>8}",
            1000.0 / rate
        );
    }
    let noop_jobs = 200_000;
    let (elapsed, _) = saturate(&pool, args.threads, noop_jobs, || true);
    println!(
        "pool scheduling overhead (no-op jobs, {} threads): {:.0} ns per job",
        args.threads,
        elapsed.as_nanos() as f64 / noop_jobs as f64
    );
}

/// Runs `jobs` jobs through the pool from `threads` threads; returns the wall time and how
/// many jobs reported failure.
fn saturate(
    pool: &Pool,
    threads: usize,
    jobs: usize,
    job: impl Fn() -> bool + Send + Sync + 'static,
) -> (Duration, usize) {
    let job = Arc::new(job);
    let next = Arc::new(AtomicUsize::new(0));
    let failed = Arc::new(AtomicUsize::new(0));
    let start = Instant::now();
    let workers: Vec<_> = (0..threads)
        .map(|t| {
            let (pool, job, next, failed) = (
                pool.clone(),
                Arc::clone(&job),
                Arc::clone(&next),
                Arc::clone(&failed),
            );
            std::thread::spawn(move || {
                let request = JobRequest::new(format!("tenant-{}", t % 3));
                let cancel = CancelToken::new();
                while next.fetch_add(1, Ordering::Relaxed) < jobs {
                    if !pool.run(&request, &cancel, |_| job()).unwrap_or(false) {
                        failed.fetch_add(1, Ordering::Relaxed);
                    }
                }
            })
        })
        .collect();
    for worker in workers {
        worker.join().expect("worker");
    }
    (start.elapsed(), failed.load(Ordering::Relaxed))
}
