//! Warm start under load and at rest, in one process:
//! `cargo run --release -p airlock-bench --bin warm-throughput -- --runs 500 --idle 1000`.
//!
//! - throughput: `/bin/true` runs per second from several threads on one pool of prepared
//!   sandboxes (profile `untrusted`): first a burst from a pool filled beforehand, then the
//!   sustained rate with the pool refilling as it is used (runs that find no sandbox ready
//!   run cold, and are counted). CPU per run is the whole process tree's, preparation and
//!   teardown included.
//! - the kernel floor of that sustained rate (root only): `bench/floor/prepared_isolation.c`
//!   from as many callers, the same cgroup, namespaces, root, Landlock, seccomp and program per
//!   run with nothing of airlock's own, whole and without its later parts.
//! - density: `--idle` sandboxes prepared and left idle, and what they cost the host:
//!   `MemAvailable` before and after, and the proportional set size of their processes.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use airlock::warm::{WarmOptions, WarmPool};
use airlock::{Sandbox, SandboxOptions};
use clap::Parser;
use nix::sys::resource::{getrusage, UsageWho};

#[path = "../floor.rs"]
mod floor;

#[derive(Parser, Debug)]
struct Args {
    /// Runs per throughput measurement.
    #[arg(long, default_value_t = 500)]
    runs: usize,
    /// Threads running commands.
    #[arg(long, default_value_t = 4)]
    threads: usize,
    /// Idle sandboxes for the density measurement (0: skip it).
    #[arg(long, default_value_t = 200)]
    idle: usize,
    /// Sandboxes each pool prepares at once (`WarmOptions::parallel`; default: the library's).
    #[arg(long)]
    parallel: Option<usize>,
    /// The airlock binary used as the init (default: the workspace's release build).
    #[arg(long)]
    airlock: Option<PathBuf>,
    /// Seconds each mode of the kernel floor runs (0: skip the floor).
    #[arg(long, default_value_t = 3)]
    floor_seconds: u64,
    /// Also measure a pool's cold fallbacks (on its shared root) against cold runs whose init
    /// a spawner forks and whose root is built whole (what fallbacks were before), alternated.
    #[arg(long)]
    fallbacks: bool,
}

fn main() {
    let args = Args::parse();
    let init = args.airlock.clone().unwrap_or_else(|| {
        PathBuf::from(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../target/release/airlock"
        ))
    });
    let options = SandboxOptions {
        init_program: Some(init),
        ..SandboxOptions::default()
    };
    let policy = airlock::policy::load_profile("untrusted").expect("profile");
    let sandbox = Sandbox::with_options(policy, options).expect("sandbox");
    burst(&sandbox, &args);
    sustained(&sandbox, &args);
    if args.fallbacks {
        fallbacks(&sandbox, &args);
    }
    if args.floor_seconds > 0 {
        kernel_floor(&args);
    }
    if args.idle > 0 {
        density(&sandbox, &args);
    }
}

fn pool(sandbox: &Sandbox, args: &Args, target: usize, refill: bool) -> WarmPool {
    let mut options = WarmOptions::new(target);
    if let Some(parallel) = args.parallel {
        options.parallel = parallel;
    }
    options.refill = refill;
    options.idle_expiry = None;
    options.ready_timeout = Duration::from_secs(120);
    sandbox.warm(options).expect("pool")
}

/// Runs from a pool holding one sandbox per run, filled first and not refilled: the rate of
/// the run path (with each used sandbox's teardown in the background).
fn burst(sandbox: &Sandbox, args: &Args) {
    let pool = pool(sandbox, args, args.runs, false);
    let fill = Instant::now();
    assert!(
        pool.wait_ready(args.runs, Duration::from_secs(600)),
        "{:?}",
        pool.stats()
    );
    let prepare_s = fill.elapsed().as_secs_f64();
    println!(
        "prepared {} sandboxes in {prepare_s:.1} s: {:.1} per second, {:.2} ms each",
        args.runs,
        args.runs as f64 / prepare_s,
        prepare_s * 1000.0 / args.runs as f64
    );
    report("burst (pool filled first)", &pool, args);
}

/// Runs from a small pool refilling as it goes: what a saturated host sustains.
fn sustained(sandbox: &Sandbox, args: &Args) {
    let pool = pool(sandbox, args, 2 * args.threads, true);
    assert!(pool.wait_ready(2 * args.threads, Duration::from_secs(120)));
    report("sustained (pool refilling)", &pool, args);
}

fn report(label: &str, pool: &WarmPool, args: &Args) {
    let before = pool.stats();
    let Timed {
        elapsed,
        cpu,
        failed,
    } = timed(|| pool.command("/bin/true"), args);
    let after = pool.stats();
    let warm = after.served - before.served;
    println!(
        "{label}: {} runs in {elapsed:.2} s = {:.0} runs/s ({warm} warm, {} cold of which {} on the shared root, {failed} failed), {:.2} ms of CPU per run so far",
        args.runs,
        args.runs as f64 / elapsed,
        after.cold_fallbacks - before.cold_fallbacks,
        after.cold_on_shared_root - before.cold_on_shared_root,
        cpu * 1000.0 / args.runs as f64,
    );
}

/// A pool whose one sandbox is used and not replaced, so that every later command of it runs
/// cold (on the pool's shared root), against cold commands of the same sandbox with their init
/// forked by a spawner of their own, in rounds alternated A/B/B/A.
fn fallbacks(sandbox: &Sandbox, args: &Args) {
    let pool = pool(sandbox, args, 1, false);
    assert!(pool.wait_ready(1, Duration::from_secs(120)));
    let first = pool.command("/bin/true").discard_output().run();
    assert!(first.is_ok_and(|r| r.success()));
    let spawner = Arc::new(airlock::InitSpawner::start(sandbox).expect("spawner"));
    for on_shared_root in [true, false, false, true] {
        let before = pool.stats();
        let Timed {
            elapsed,
            cpu,
            failed,
        } = match on_shared_root {
            true => timed(|| pool.command("/bin/true"), args),
            false => timed(
                || {
                    sandbox
                        .command("/bin/true")
                        .init_spawner(Arc::clone(&spawner))
                },
                args,
            ),
        };
        let after = pool.stats();
        let label = match on_shared_root {
            true => "a pool's cold fallbacks",
            false => "cold runs, init forked by a spawner",
        };
        println!(
            "{label}: {} runs in {elapsed:.2} s = {:.0} runs/s ({} on the shared root, {failed} failed), {:.2} ms of CPU per run",
            args.runs,
            args.runs as f64 / elapsed,
            after.cold_on_shared_root - before.cold_on_shared_root,
            cpu * 1000.0 / args.runs as f64,
        );
    }
    spawner.close();
}

/// `args.runs` commands from `args.threads` threads: wall seconds, the process tree's CPU
/// seconds, and how many failed.
struct Timed {
    elapsed: f64,
    cpu: f64,
    failed: usize,
}

fn timed(command: impl Fn() -> airlock::Command + Sync, args: &Args) -> Timed {
    let cpu_before = tree_cpu();
    let start = Instant::now();
    let failed = commands_from_threads(command, args.runs, args.threads);
    Timed {
        elapsed: start.elapsed().as_secs_f64(),
        cpu: (tree_cpu() - cpu_before).as_secs_f64(),
        failed,
    }
}

fn commands_from_threads(
    command: impl Fn() -> airlock::Command + Sync,
    runs: usize,
    threads: usize,
) -> usize {
    let next = AtomicUsize::new(0);
    let failed = AtomicUsize::new(0);
    std::thread::scope(|scope| {
        for _ in 0..threads {
            scope.spawn(|| {
                while next.fetch_add(1, Ordering::SeqCst) < runs {
                    let result = command().discard_output().run();
                    if !result.is_ok_and(|r| r.success()) {
                        failed.fetch_add(1, Ordering::SeqCst);
                    }
                }
            });
        }
    });
    failed.load(Ordering::SeqCst)
}

/// `prepared_isolation`'s modes, each with the parts before it, and what its line says.
const FLOOR_MODES: [(&str, &str); 4] = [
    ("program", "every layer and /bin/true"),
    ("confine", "no program"),
    (
        "root",
        "no program, no Landlock, seccomp or capability drop",
    ),
    (
        "ns",
        "no program, no confinement, no root (the cgroup and namespaces only)",
    ),
];

/// What the kernel alone needs for the runs `sustained` measured, from as many callers: the
/// least kernel work each run's sandbox needs with airlock's guarantees (its cgroup, its
/// namespaces, the root built from scratch, Landlock, seccomp and the capability drop, the
/// program's start; `bench/floor/prepared_isolation.c`), then without the later parts.
fn kernel_floor(args: &Args) {
    let label = "kernel floor of a prepared sandbox's run (bench/floor/prepared_isolation.c)";
    let seccomp = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../crates/airlock/src/confine/seccomp/prebuilt")
        .join(std::env::consts::ARCH);
    let skipped = if !nix::unistd::geteuid().is_root() {
        Some("needs root (cgroups)".to_string())
    } else if !seccomp.join("table.bpf").is_file() {
        Some(format!(
            "no prebuilt seccomp filters in {}",
            seccomp.display()
        ))
    } else {
        None
    };
    if let Some(why) = skipped {
        return println!("{label}: not measured ({why})");
    }
    let scratch = std::env::temp_dir().join(format!("airlock-floor-{}", std::process::id()));
    let binary = floor::compile("prepared_isolation", &scratch);
    println!("{label}, {} callers:", args.threads);
    for (mode, what) in FLOOR_MODES {
        let measured = binary.as_ref().map_err(String::clone).and_then(|binary| {
            let line = [
                args.threads.to_string(),
                args.floor_seconds.to_string(),
                "20000".to_string(),
                mode.to_string(),
                seccomp.display().to_string(),
            ];
            floor::run(binary, &line)
        });
        match measured {
            Ok(fields) if fields.len() >= 3 && fields[0] > 0.0 => println!(
                "  {what}: {:.0} runs/s, {:.2} ms of CPU per run",
                fields[0] / fields[1],
                fields[2] * 1000.0 / fields[0]
            ),
            Ok(fields) => println!("  {what}: not measured (it printed {fields:?})"),
            Err(why) => println!("  {what}: not measured ({why})"),
        }
    }
    let _ = std::fs::remove_dir_all(&scratch);
    // The floor's parent cgroups, if nothing else uses them.
    for hierarchy in ["memory", "pids", "cpu", "cpuacct", "freezer"] {
        let _ = std::fs::remove_dir(
            Path::new("/sys/fs/cgroup")
                .join(hierarchy)
                .join("airlock-floor"),
        );
    }
}

/// User + system time of this process and every child it reaped.
fn tree_cpu() -> Duration {
    let time = |who| {
        getrusage(who).map_or(Duration::ZERO, |u| {
            let us =
                |tv: nix::sys::time::TimeVal| tv.tv_sec() as u64 * 1_000_000 + tv.tv_usec() as u64;
            Duration::from_micros(us(u.user_time()) + us(u.system_time()))
        })
    };
    time(UsageWho::RUSAGE_SELF) + time(UsageWho::RUSAGE_CHILDREN)
}

/// What `count` idle prepared sandboxes cost the host.
fn density(sandbox: &Sandbox, args: &Args) {
    let count = args.idle;
    let before = meminfo_kib("MemAvailable");
    let slab_before = meminfo_kib("Slab");
    let pool = Arc::new(pool(sandbox, args, count, false));
    let start = Instant::now();
    let ready = pool.wait_ready(count, Duration::from_secs(1200));
    let took = start.elapsed().as_secs_f64();
    std::thread::sleep(Duration::from_secs(2));
    let after = meminfo_kib("MemAvailable");
    let slab_after = meminfo_kib("Slab");
    let pss = tree_pss_kib(std::process::id());
    let held = pool.stats().ready;
    let per = |kib: i64| kib as f64 / held.max(1) as f64 / 1024.0;
    println!(
        "density: {held} idle sandboxes ready (all: {ready}) in {took:.1} s; MemAvailable fell {:.0} MiB = {:.2} MiB each; kernel slab +{:.2} MiB each; processes' PSS {:.2} MiB each",
        (before - after) as f64 / 1024.0,
        per(before - after),
        per(slab_after - slab_before),
        per(pss),
    );
    drop(pool);
    let freed = meminfo_kib("MemAvailable");
    println!(
        "density: after shutdown MemAvailable is {:.0} MiB above the loaded level",
        (freed - after) as f64 / 1024.0
    );
}

fn meminfo_kib(field: &str) -> i64 {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|text| {
            text.lines()
                .find(|l| l.starts_with(&format!("{field}:")))
                .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        })
        .unwrap_or(0)
}

/// The proportional set size of every descendant of `root` (the pool's inits and their
/// sandboxes), in KiB.
fn tree_pss_kib(root: u32) -> i64 {
    let mut parents = std::collections::HashMap::<u32, Vec<u32>>::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
            continue;
        };
        let Some(ppid) = stat
            .rsplit(')')
            .next()
            .and_then(|r| r.split_whitespace().nth(1)?.parse().ok())
        else {
            continue;
        };
        parents.entry(ppid).or_default().push(pid);
    }
    let mut total = 0;
    let mut stack = parents.get(&root).cloned().unwrap_or_default();
    while let Some(pid) = stack.pop() {
        total += std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup"))
            .ok()
            .and_then(|t| {
                t.lines()
                    .find(|l| l.starts_with("Pss:"))
                    .and_then(|l| l.split_whitespace().nth(1)?.parse::<i64>().ok())
            })
            .unwrap_or(0);
        stack.extend(parents.get(&pid).cloned().unwrap_or_default());
    }
    total
}
