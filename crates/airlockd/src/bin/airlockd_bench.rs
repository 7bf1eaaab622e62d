//! airlockd-bench: what the daemon costs on top of the library, measured, with each target
//! printed as met / NOT met.
//!
//! 1. API overhead: the same run (`/bin/true`, profile `untrusted`) through the library in
//!    this process and through `POST /v1/runs` (wait) on the Unix socket, interleaved (the
//!    order rotates each iteration). Two targets of at most 1 ms: unpaired, what a user sees
//!    (the API's median minus the library `run()`'s median), and paired, per request (the
//!    API's time minus the library's time inside the daemon, `Server-Timing`). Also shown:
//!    the library's `run()` with its init forked by a spawner, as the daemon starts its cold
//!    runs' inits (`engine/spawner.rs`), for the comparison at equal start-up.
//! 2. Throughput with the pool saturated: runs per second through the API.
//! 3. Memory per idle session: the daemon's RSS (and the host's available memory, which
//!    includes each session's tmpfs) before and after creating many sessions.
//! 4. 1,000 runs queued at once are all drained, each with a terminal record.
//! 5. Warm start (`--only warm`, `--warm-runs`, first): `/bin/true` through a cold daemon, a daemon with
//!    `[warm]` (prepared sandboxes) and a library `WarmPool`, `/bin/true` in a session of each
//!    daemon (the warm one's session has its own prepared sandbox), and a Python snippet
//!    (`import json, re`) cold and on the daemon's zygote, interleaved; then a burst larger
//!    than the pool (runs that find no sandbox ready fall back to cold).
//!
//! Build both binaries first: `cargo build --release -p airlockd -p airlock-cli`, then run
//! `target/release/airlockd-bench` (as root, as the daemon runs in production).
//! `--only overhead` (repeatable) runs one part alone. The overhead part also prints where
//! the time goes: a do-nothing request's round trip on the same connection (HTTP on the
//! socket), and the run's time in the daemon's router beyond the library's (`Server-Timing`).

use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use clap::Parser;
use serde_json::json;

#[path = "airlockd_bench/api_overhead.rs"]
mod api_overhead;
#[path = "airlockd_bench/daemon.rs"]
mod daemon;
#[path = "airlockd_bench/warm.rs"]
mod warm;

use api_overhead::overhead;
use daemon::{start_daemon, start_daemon_with, Connection, Daemon};

#[derive(Parser, Debug)]
#[command(name = "airlockd-bench")]
struct Args {
    /// Runs per side for the overhead measurement.
    #[arg(long, default_value_t = 200)]
    overhead_runs: usize,
    /// Runs for the throughput measurement.
    #[arg(long, default_value_t = 300)]
    throughput_runs: usize,
    /// Sessions for the memory measurement.
    #[arg(long, default_value_t = 1000)]
    sessions: usize,
    /// Runs queued at once for the drain measurement.
    #[arg(long, default_value_t = 1000)]
    queued_runs: usize,
    /// Runs per side for the warm start comparison (daemon cold, daemon warm, library warm,
    /// zygote snippet).
    #[arg(long, default_value_t = 100)]
    warm_runs: usize,
    /// Only these measurements (repeatable; all when not given).
    #[arg(long, value_enum)]
    only: Vec<Part>,
}

/// One of the measurements.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
enum Part {
    Overhead,
    Throughput,
    Sessions,
    Queued,
    /// Warm start: daemon cold vs warm vs library warm, the zygote snippet, a burst.
    Warm,
}

fn percentile(samples: &mut [f64], p: f64) -> f64 {
    samples.sort_by(|a, b| a.total_cmp(b));
    samples[((samples.len() - 1) as f64 * p).round() as usize]
}

fn verdict(met: bool) -> &'static str {
    if met {
        "met"
    } else {
        "NOT met"
    }
}

/// Submits `count` runs from `clients` connections without waiting; returns their ids.
async fn submit_many(daemon: &Daemon, count: usize, clients: usize) -> anyhow::Result<Vec<String>> {
    let mut tasks = Vec::new();
    for c in 0..clients {
        let share = count / clients + usize::from(c < count % clients);
        let mut connection = Connection::open(daemon).await?;
        tasks.push(tokio::spawn(async move {
            let mut ids = Vec::new();
            for _ in 0..share {
                let (status, run) = connection
                    .call("POST", "/v1/runs", Some(json!({"command": ["/bin/true"]})))
                    .await?;
                if status != 202 && status != 200 {
                    bail!("submitting failed: {status} {run}");
                }
                ids.push(run["id"].as_str().unwrap_or_default().to_string());
            }
            Ok::<_, anyhow::Error>(ids)
        }));
    }
    let mut ids = Vec::new();
    for task in tasks {
        ids.extend(task.await??);
    }
    Ok(ids)
}

/// Waits until every run is terminal; returns how many ended `exited`.
async fn drain(daemon: &Daemon, ids: &[String], timeout: Duration) -> anyhow::Result<usize> {
    let mut connection = Connection::open(daemon).await?;
    let deadline = Instant::now() + timeout;
    let mut exited = 0;
    for id in ids {
        loop {
            let (status, run) = connection
                .call("GET", &format!("/v1/runs/{id}"), None)
                .await?;
            if status != 200 {
                bail!("run {id} has no record: {status} {run}");
            }
            match run["status"].as_str() {
                Some("queued") | Some("running") => {
                    if Instant::now() > deadline {
                        bail!("run {id} still in flight after {timeout:?}");
                    }
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                Some("exited") => {
                    exited += 1;
                    break;
                }
                _ => break,
            }
        }
    }
    Ok(exited)
}

async fn throughput(daemon: &Daemon, runs: usize) -> anyhow::Result<()> {
    let started = Instant::now();
    let ids = submit_many(daemon, runs, 8).await?;
    let exited = drain(daemon, &ids, Duration::from_secs(600)).await?;
    let elapsed = started.elapsed().as_secs_f64();
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    println!("throughput (pool saturated, {cpus} slots): {runs} runs in {elapsed:.2} s = {:.1} runs/s ({exited} exited)", runs as f64 / elapsed);
    Ok(())
}

fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

fn available_kib() -> u64 {
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    meminfo
        .lines()
        .find_map(|l| l.strip_prefix("MemAvailable:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

async fn session_memory(daemon: &Daemon, sessions: usize) -> anyhow::Result<()> {
    let mut connection = Connection::open(daemon).await?;
    // Warm the allocator and the store first.
    connection
        .call("POST", "/v1/sessions", Some(json!({})))
        .await?;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (rss_before, available_before) =
        (rss_kib(daemon.child.id()) as i64, available_kib() as i64);
    for _ in 0..sessions {
        let (status, session) = connection
            .call("POST", "/v1/sessions", Some(json!({})))
            .await?;
        if status != 201 {
            bail!("creating a session failed: {status} {session}");
        }
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (rss_after, available_after) = (rss_kib(daemon.child.id()) as i64, available_kib() as i64);
    let per_rss = (rss_after - rss_before) as f64 / sessions as f64;
    let per_host = (available_before - available_after) as f64 / sessions as f64;
    println!("memory per idle session: daemon RSS {per_rss:.1} KiB, host (daemon + empty tmpfs + store) {per_host:.1} KiB ({sessions} sessions)");
    println!(
        "  target: daemon RSS <= 64 KiB per idle session: {}",
        verdict(per_rss <= 64.0)
    );
    Ok(())
}

async fn queued_drain(daemon: &Daemon, runs: usize) -> anyhow::Result<()> {
    let started = Instant::now();
    let ids = submit_many(daemon, runs, 16).await?;
    let submitted = started.elapsed().as_secs_f64();
    let exited = drain(daemon, &ids, Duration::from_secs(1200)).await?;
    let elapsed = started.elapsed().as_secs_f64();
    let mut unique = ids.clone();
    unique.sort();
    unique.dedup();
    let lost = runs - exited;
    println!("{runs} queued runs: submitted in {submitted:.2} s, drained in {elapsed:.2} s; {exited} exited, {lost} without an `exited` record, {} distinct ids", unique.len());
    println!(
        "  target: {runs} queued runs drained, no record lost: {}",
        verdict(lost == 0 && unique.len() == runs)
    );
    Ok(())
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    // The client is one thread, as a client's own event loop is: its requests and their
    // connections' tasks on the same thread, so that no hand-off between the client's own
    // threads is counted as the daemon's time. The library's runs go to blocking threads.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let daemon = start_daemon().context("cannot start airlockd")?;
    println!(
        "airlockd-bench: {} CPUs, daemon pid {}",
        std::thread::available_parallelism().map_or(1, |n| n.get()),
        daemon.child.id()
    );
    let wanted = |part: Part| args.only.is_empty() || args.only.contains(&part);
    if wanted(Part::Warm) {
        runtime.block_on(warm::compare(&daemon, args.warm_runs))?;
    }
    runtime.block_on(async {
        if wanted(Part::Overhead) {
            overhead(&daemon, args.overhead_runs).await?;
        }
        if wanted(Part::Throughput) {
            throughput(&daemon, args.throughput_runs).await?;
        }
        if wanted(Part::Sessions) {
            session_memory(&daemon, args.sessions).await?;
        }
        if wanted(Part::Queued) {
            queued_drain(&daemon, args.queued_runs).await?;
        }
        Ok::<_, anyhow::Error>(())
    })?;
    if let Ok(path) = std::env::var("AIRLOCKD_BENCH_KEEP_LOG") {
        let _ = std::fs::copy(daemon.dir.path().join("daemon.log"), path);
    }
    drop(daemon);
    Ok(())
}
