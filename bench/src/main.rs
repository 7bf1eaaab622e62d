//! `airlock-bench`: wall time from spawn to reaped exit of tiny programs started bare, under
//! `unshare`, under bubblewrap and under airlock (backend none, native without and with
//! cgroups). Pairs are interleaved after a warmup, in a balanced order (`order.rs`), so that
//! machine noise and the kernel's work after each run are spread over every configuration
//! instead of landing on one.
//!
//! `cargo build --release && cargo run --release -p airlock-bench -- --runs 200 [--markdown]`

mod egress;
mod floor;
mod order;
mod report;
mod stats;
mod tools;
mod warm;
mod zygote;

use std::os::fd::AsRawFd;
use std::path::PathBuf;
use std::process::{Command, ExitCode, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Parser;
use nix::sys::resource::{getrusage, UsageWho};

use report::Row;
use tools::{Tool, Workload};

#[derive(Parser, Debug)]
#[command(about = "Start-up latency of airlock against bare exec, unshare and bubblewrap")]
struct Args {
    /// Measured runs per (tool, workload) pair.
    #[arg(long, default_value_t = 200)]
    runs: usize,
    /// Unmeasured runs per pair before measuring.
    #[arg(long, default_value_t = 10)]
    warmup: usize,
    /// The airlock binary (default: the workspace's release build).
    #[arg(long)]
    airlock: Option<PathBuf>,
    /// Another airlock build whose configurations are measured too, named `...@baseline`.
    #[arg(long)]
    baseline: Option<PathBuf>,
    /// Only these tools (comma-separated names as printed in the table).
    #[arg(long, value_delimiter = ',')]
    tools: Vec<String>,
    /// Print a markdown table (for BENCHMARKS.md) instead of plain text.
    #[arg(long)]
    markdown: bool,
    /// Rounds of the egress gate's throughput and latency measurements (0: skip them).
    #[arg(long, default_value_t = 5)]
    egress_rounds: usize,
    /// Runs of the zygote's latency measurement (0: skip the zygote).
    #[arg(long, default_value_t = 200)]
    zygote_runs: usize,
}

/// One (tool, workload) combination and its samples.
struct Pair {
    tool: Tool,
    workload: Workload,
    samples: Vec<Duration>,
    cpu: Vec<Duration>,
    failures: Vec<String>,
}

/// What one run of a pair starts.
struct Launch {
    argv: Vec<String>,
    descriptors: Vec<(i32, PathBuf)>,
    warm: Option<Arc<airlock::warm::WarmPool>>,
}

impl Pair {
    fn argv(&self) -> Vec<String> {
        self.tool.argv(&self.workload)
    }

    fn launch(&self) -> Launch {
        Launch {
            argv: self.argv(),
            descriptors: self.tool.descriptors.clone(),
            warm: self.tool.warm.clone(),
        }
    }

    fn label(&self) -> String {
        format!("{} / {}", self.tool.name, self.workload.name)
    }
}

fn main() -> ExitCode {
    let args = Args::parse();
    keep_inherited_descriptors_from_children();
    let outcome = bench(args);
    tools::remove_scratch();
    outcome
}

fn bench(args: Args) -> ExitCode {
    let mut notes = Vec::new();
    let airlock = args.airlock.clone().unwrap_or_else(default_airlock);
    let mut pairs = make_pairs(&args, &airlock, &mut notes);
    pairs.retain(|pair| match time_once(&pair.launch()) {
        Ok(_) => true,
        Err(why) => {
            notes.push(format!(
                "{}: excluded, the check run failed: {why}",
                pair.label()
            ));
            false
        }
    });
    if pairs.is_empty() {
        eprintln!("airlock-bench: nothing to measure: {}", notes.join("; "));
        return ExitCode::FAILURE;
    }
    eprintln!(
        "airlock-bench: {} pairs, {} warmup + {} measured runs each",
        pairs.len(),
        args.warmup,
        args.runs
    );
    measure(&mut pairs, args.warmup, args.runs);
    notes.extend(pairs.iter().filter(|p| !p.failures.is_empty()).map(|p| {
        format!(
            "{}: {} of {} runs failed and were left out; first: {}",
            p.label(),
            p.failures.len(),
            args.runs,
            p.failures[0]
        )
    }));
    let rows: Vec<Row> = pairs
        .iter()
        .filter_map(|p| Row::new(&p.tool.name, p.workload.name, &p.samples, &p.cpu))
        .collect();
    let table = report::with_ratios(rows);
    let mut egress_lines = Vec::new();
    if args.egress_rounds > 0 {
        eprintln!(
            "airlock-bench: the egress gate, {} rounds",
            args.egress_rounds
        );
        match egress::measure(args.egress_rounds) {
            Ok(lines) => egress_lines = lines,
            Err(why) => notes.push(why),
        }
    }
    if args.zygote_runs > 0 {
        eprintln!(
            "airlock-bench: interpreter zygotes, {} runs",
            args.zygote_runs
        );
        match zygote::measure(args.zygote_runs) {
            Ok(lines) => egress_lines.extend(lines),
            Err(why) => notes.push(format!("airlock-zygote: {why}, skipped")),
        }
    }
    if args.markdown {
        print!(
            "{}",
            report::markdown(&table, args.runs, &egress_lines, &notes)
        );
    } else {
        print!(
            "{}",
            report::plain(&table, args.runs, &egress_lines, &notes)
        );
    }
    ExitCode::SUCCESS
}

fn default_airlock() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/release/airlock")
}

fn make_pairs(args: &Args, airlock: &std::path::Path, notes: &mut Vec<String>) -> Vec<Pair> {
    let mut tools = tools::all_tools(airlock, args.baseline.as_deref(), notes);
    let wanted = |name: &str| args.tools.is_empty() || args.tools.iter().any(|t| t == name);
    // Before any pool opens its pipes, which could otherwise take these numbers.
    reserve_descriptor_numbers(&tools);
    if wanted(warm::WARM) {
        tools.extend(warm::tools(airlock, notes));
    }
    if !args.tools.is_empty() {
        tools.retain(|tool| args.tools.contains(&tool.name));
    }
    let workloads = tools::all_workloads();
    workloads
        .iter()
        .flat_map(|workload| {
            tools
                .iter()
                .filter(|tool| {
                    tool.per_workload.is_empty()
                        || tool.per_workload.iter().any(|(w, _)| *w == workload.name)
                })
                .map(|tool| Pair {
                    tool: tool.clone(),
                    workload: workload.clone(),
                    samples: Vec::new(),
                    cpu: Vec::new(),
                    failures: Vec::new(),
                })
        })
        .collect()
}

/// Warmup, then `runs` rounds; each round runs every pair once, in the order of
/// [`order::round_order`], so that every pair follows every other equally often. A failed run
/// (the host is shared: e.g. a per-user process limit hit by someone else's jobs) is recorded,
/// not timed.
fn measure(pairs: &mut [Pair], warmup: usize, runs: usize) {
    let launches: Vec<Launch> = pairs.iter().map(Pair::launch).collect();
    let pools: Vec<&airlock::warm::WarmPool> =
        launches.iter().filter_map(|l| l.warm.as_deref()).collect();
    for _ in 0..warmup {
        for launch in &launches {
            warm::settle(&pools);
            let _ = time_once(launch);
        }
    }
    for round in 0..runs {
        for index in order::round_order(round, pairs.len()) {
            warm::settle(&pools);
            match time_once(&launches[index]) {
                Ok((elapsed, cpu)) => {
                    pairs[index].samples.push(elapsed);
                    pairs[index].cpu.push(cpu);
                }
                Err(why) => pairs[index].failures.push(why),
            }
        }
    }
}

/// Wall time from spawn until the launcher has exited and been reaped, and the CPU time (user +
/// system) of the launcher and every descendant reaped under it, which a loaded host does not
/// inflate the way it inflates wall time. A non-zero exit is an error, so a broken
/// configuration cannot pass for a fast one.
fn time_once(launch: &Launch) -> Result<(Duration, Duration), String> {
    let argv = &launch.argv;
    if let Some(pool) = &launch.warm {
        return warm::time_once(pool, argv);
    }
    let (program, rest) = argv.split_first().ok_or("empty argv")?;
    let mut command = Command::new(program);
    command
        .args(rest)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let placed = place_descriptors(&launch.descriptors)?;
    let cpu_before = children_cpu();
    let start = Instant::now();
    let output = command.output();
    let elapsed = start.elapsed();
    let cpu = children_cpu().saturating_sub(cpu_before);
    for fd in placed {
        park_at(fd);
    }
    let output = output.map_err(|e| format!("cannot start {program}: {e}"))?;
    if !output.status.success() {
        let stderr = String::from_utf8_lossy(&output.stderr);
        return Err(format!(
            "{} exited with {}: {}",
            argv.join(" "),
            output.status,
            stderr.trim()
        ));
    }
    Ok((elapsed, cpu))
}

/// Marks every descriptor this process inherited (beyond stdio) close-on-exec, so each
/// measured command starts with stdio and its own descriptors only, whatever launched the
/// bench. Why: a descriptor left open at a high number (a shell's or a CI runner's) makes every
/// child's descriptor table that large from the start, which spares a threaded tool (runsc,
/// runc, podman) the RCU grace period each growth of its table costs: 25-30 ms of a gVisor run
/// here, enough to decide a comparison.
fn keep_inherited_descriptors_from_children() {
    let Ok(entries) = std::fs::read_dir("/proc/self/fd") else {
        return;
    };
    let fds: Vec<i32> = entries
        .filter_map(|entry| entry.ok()?.file_name().to_str()?.parse().ok())
        .filter(|fd| *fd > 2)
        .collect();
    for fd in fds {
        let _ = nix::fcntl::fcntl(
            fd,
            nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::FD_CLOEXEC),
        );
    }
}

/// Holds every number a tool's descriptor is placed at with /dev/null (close-on-exec), so
/// that nothing of this process's own (a warm pool's pipes) is ever opened there and then
/// replaced by a placement.
fn reserve_descriptor_numbers(tools: &[tools::Tool]) {
    for tool in tools {
        for (target, _) in &tool.descriptors {
            park_at(*target);
        }
    }
}

/// Puts /dev/null (close-on-exec) at `fd`, replacing what was placed there for a run.
fn park_at(fd: i32) {
    if let Ok(null) = std::fs::File::open("/dev/null") {
        let _ = nix::unistd::dup3(null.as_raw_fd(), fd, nix::fcntl::OFlag::O_CLOEXEC);
    }
}

/// Opens each file at its descriptor number (reserved by [`reserve_descriptor_numbers`]),
/// inheritable, so the next child starts with it there and reads it from the start; the
/// caller parks the numbers again.
fn place_descriptors(descriptors: &[(i32, PathBuf)]) -> Result<Vec<i32>, String> {
    descriptors
        .iter()
        .map(|(target, path)| {
            let file = std::fs::File::open(path)
                .map_err(|e| format!("cannot open {}: {e}", path.display()))?;
            nix::unistd::dup2(file.as_raw_fd(), *target)
                .map_err(|e| format!("cannot place {} at {target}: {e}", path.display()))
        })
        .collect()
}

/// User + system time of all reaped children so far.
fn children_cpu() -> Duration {
    let Ok(usage) = getrusage(UsageWho::RUSAGE_CHILDREN) else {
        return Duration::ZERO;
    };
    let micros = |tv: nix::sys::time::TimeVal| tv.tv_sec() as u64 * 1_000_000 + tv.tv_usec() as u64;
    Duration::from_micros(micros(usage.user_time()) + micros(usage.system_time()))
}
